// MemoryManager: the arena, the persistent region, lanes, paging and the admission queue.
//
// CONTRACT (the scheduler and the server code against this; the implementation may add to it
// but keeps these signatures and semantics):
//
// - The arena [0, C) is taken once at Create() from a device::MemoryProvider. The persistent
//   region grows down from C, the ephemeral region grows up from 0 and is cut into lanes.
// - Admit(session, {P, E}) asks the configured AdmissionRule (mem/admission.h; the rules are
//   the policies', src/sched/admission_rules.h) where the session goes and applies the answer:
//   a new lane, joining or growing a lane of the session's LaneClass, or waiting in the
//   admission queue. It returns the Grant when admitted now, std::nullopt when the session
//   waits (it is admitted later, by the call that makes room, which returns its Grant), or
//   RESOURCE_EXHAUSTED at once when it can never fit (P + E > C), with P, E and C in human
//   units in the message. Invariant 1 (resident ΣP + ΣL ≤ C) holds after every call.
// - Overcommit (Options::overcommit > 1): when the rule says wait, a session is still admitted
//   while the ΣP of every admitted session, resident or not, stays within overcommit × C; it is
//   admitted *paged out* (Grant::resident false, no lane) and becomes resident through PageIn.
// - PageIn(session, candidates) makes a paged-out session resident, paging out the prefix of
//   `candidates` (resident sessions, in the policy's order) the rule asks for. Paging moves
//   persistent blocks between the arena and host memory from the provider (AllocateHost);
//   the copies are Transfers the caller runs (TakeTransfers, then FinishTransfer), so they
//   overlap other lanes' work. A session is *resident* when its block is in the arena and it
//   is in a lane; only a resident session's iterations may begin.
// - Release(session) frees its persistent block (or its paged state) and its lane membership
//   (the lane shrinks to the largest remaining E, or closes), then re-tries the admission
//   queue in order. Every call that can admit or fail waiting sessions (Release, PageIn,
//   FinishTransfer, CancelWaiting, ExpireWaiting) returns what it did as AdmissionEvents;
//   the manager calls nobody back.
// - CancelWaiting / ExpireWaiting remove queued sessions (the latter those whose timeout has
//   passed on the injected clock), each failed with CANCELLED or DEADLINE_EXCEEDED.
// - BeginIteration(lane) resolves the lane's current base address (applying a pending grow,
//   shrink or relocation, which is legal only now because lanes are empty between
//   iterations) and returns a LaneIteration whose allocator serves this iteration.
//   It returns UNAVAILABLE when the lane cannot be placed yet because lanes that are
//   mid-iteration occupy the range it needs; the caller retries after any EndIteration.
//   EndIteration(lane) releases everything the iteration allocated.
// - Every method is thread-safe.
//
// IMPLEMENTATION NOTES (arena_memory_manager.cc; docs/memory.md). The contract holds as stated,
// with these refinements where the physical layout demands more than the accounting:
// - P and E are rounded up to kArenaAlignment before anything is counted, so every lane base and
//   block offset is aligned; ΣP, ΣL, "never fits" and the statistics use the rounded sizes
//   (messages quote the declared ones).
// - Persistent blocks never move while resident, so holes between them can make the persistent
//   region's footprint F (C minus its lowest block) larger than ΣP; the rules evaluate the
//   footprint the region would have after placing P (Note [Persistent footprint]).
// - The queue is re-tried in order, and every waiting request that fits is admitted (a large
//   request does not block smaller ones behind it). A request whose timeout has passed is not
//   admitted by a re-try; ExpireWaiting reports it.
// - Release of a session that is still waiting cancels it (a CANCELLED failure in its events).
// - Persistent(session) returns UNAVAILABLE, for a session admitted into space that a lane
//   mid-iteration still occupies at its old place (or a released or paging block still in
//   use), until that iteration or copy ends: the block is placed at the first EndIteration or
//   FinishTransfer that clears it (Note [Lane placement]); also while its page-in copy runs.
//   BeginIteration(lane, session) says the same. Release during a lane's iteration keeps the
//   released block and a closed lane's range in use until that iteration ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "mem/memory_stats.h"
#include "salus/status.h"

namespace salus::device {
class MemoryProvider;
}

namespace salus::mem {

struct ArenaSnapshot;

using SessionId = uint64_t;
using LaneId = uint64_t;

// P, E, lane bases and persistent blocks are multiples of this (bytes): what device kernels
// expect of a buffer's alignment.
inline constexpr uint64_t kArenaAlignment = 256;

// Sessions of different classes never share a lane. Interactive (latency-sensitive) sessions
// are never packed with batch ones, so an interactive request never waits behind a batch
// iteration; their lanes may run at a higher priority (a high-priority stream, a worker at a
// higher OS priority).
enum class LaneClass : uint8_t { kBatch = 0, kInteractive = 1 };
inline constexpr int kLaneClasses = 2;
std::string_view LaneClassName(LaneClass c);  // "batch", "interactive"

struct Requirement {
  uint64_t persistent_bytes = 0;  // P
  uint64_t ephemeral_bytes = 0;   // E
  LaneClass lane_class = LaneClass::kBatch;
  // Smaller lanes the session can also run in, largest first (a training executable's swap
  // points, exec/swap_planner.h: slower, less memory). Admission grants the first of E and
  // these that its rule admits now; the admitted session's E is the one granted.
  std::vector<uint64_t> smaller_ephemeral = {};
  // The job it belongs to (Note [Jobs] in src/sched/admission_rules.cc): sessions of one job
  // are one tenant of the device to an exclusive rule. 0: a job of its own.
  uint64_t job = 0;
};

class AdmissionRule;      // mem/admission.h
struct AdmissionPreview;  // mem/admission.h

struct Grant {
  SessionId session = 0;
  LaneId lane = 0;               // 0 when admitted paged out
  bool resident = true;          // false: admitted paged out (overcommit); PageIn makes it resident
  uint64_t ephemeral_bytes = 0;  // the E granted (rounded): the asked one or a smaller lane
};

// Where a session's persistent state is. Paging moves it between the arena and host memory,
// only between the session's iterations.
enum class Residence : uint8_t {
  kResident,   // its block is in the arena and it is in a lane
  kPagingOut,  // its block is being copied to host memory; no longer counted as resident
  kPagedOut,   // its state is in host memory (or it never ran: admitted paged out)
  kPagingIn,   // its block is placed and in its lane, the copy back has not finished
};
std::string_view ResidenceName(Residence r);  // "resident", "paging out", ...

// One copy of a persistent block between the arena and host memory, for the caller to run
// (device::MemoryProvider::CopyToHost / CopyToDevice) and report with FinishTransfer.
// A move's copy goes straight into the target's block instead (`peer` set: one copy, run with
// device::MemoryProvider::CopyToPeer, Note [Migration] in src/sched/engine.cc).
struct Transfer {
  uint64_t id = 0;  // unique within its manager
  SessionId session = 0;
  bool to_host = true;  // page-out; false: page-in
  std::byte* device = nullptr;
  std::byte* host = nullptr;  // null for a peer copy
  uint64_t bytes = 0;
  size_t device_index = 0;  // its manager's index among an engine's devices (set by the engine)
  // A peer copy (to_host): the block it fills in device `peer_device`'s arena, whose manager
  // finishes its incoming transfer `peer_transfer` when this copy ends.
  std::byte* peer = nullptr;
  size_t peer_device = 0;
  uint64_t peer_transfer = 0;
};

// Where a session arriving by a peer copy lands (MemoryManager::Incoming): its block's
// address and the transfer id its manager finishes when the copy ends.
struct PeerCopy {
  std::byte* address = nullptr;
  size_t device = 0;  // the engine's index of that manager (set by the engine)
  uint64_t transfer = 0;
};

// What one call did to sessions waiting for admission: those it admitted, in queue order,
// and those it ended with an error (CANCELLED, DEADLINE_EXCEEDED, or INTERNAL for a session
// whose state a failed copy lost). The caller reports them.
struct AdmissionEvents {
  std::vector<Grant> admitted;
  std::vector<std::pair<SessionId, Status>> failed;
  bool empty() const { return admitted.empty() && failed.empty(); }
  void Append(AdmissionEvents&& other);
};

// A session's state leaving one manager for another (Emigrate, then Immigrate): its host copy
// (allocated by the leaving manager's provider; the receiving one frees it) and requirement.
struct Emigrant {
  SessionId session = 0;
  Requirement req;            // rounded, with the E it was granted
  Requirement declared;       // as asked
  std::byte* host = nullptr;  // null when P is 0 or it never ran (nothing to copy in)
  // The provider that allocated `host`, and frees it: the receiving manager gives it back
  // there instead of keeping it in its own pool.
  device::MemoryProvider* host_provider = nullptr;
  AdmissionEvents events;  // waiting sessions admitted once it left
};

// The result of a PageIn.
struct PageInResult {
  bool resident = false;             // false: it does not fit even with the candidates gone
  LaneId lane = 0;                   // its lane when resident
  std::vector<SessionId> paged_out;  // candidates paged out to make room, in order
  AdmissionEvents events;            // waiting sessions admitted after the page-in
};

// One iteration's view of its lane. Valid between BeginIteration and EndIteration.
struct LaneIteration {
  LaneId lane = 0;
  LaneClass lane_class = LaneClass::kBatch;
  uint64_t base = 0;             // arena offset of the lane
  uint64_t size = 0;             // lane size in bytes
  std::byte* address = nullptr;  // provider address of the lane base (not dereferenceable on
                                 // the fake provider)
  class LaneAllocator* allocator = nullptr;
};

struct PersistentBlock {
  uint64_t offset = 0;  // arena offset
  uint64_t size = 0;
  std::byte* address = nullptr;
};

struct LaneInfo {
  LaneId id = 0;
  LaneClass lane_class = LaneClass::kBatch;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::vector<SessionId> sessions;
  bool in_iteration = false;
};

struct LaneStats {
  LaneId lane = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  MemoryStats ephemeral;  // every allocation in the lane, over its life
};

struct SessionStats {
  SessionId session = 0;
  LaneId lane = 0;  // 0 while paged out
  Residence residence = Residence::kResident;
  Requirement requirement;  // rounded to kArenaAlignment
  MemoryStats persistent;   // its block
  MemoryStats ephemeral;    // allocations of iterations begun with BeginIteration(lane, session)
};

struct MemoryStatsSnapshot {
  uint64_t capacity = 0;
  uint64_t persistent_committed_bytes = 0;  // ΣP
  uint64_t ephemeral_committed_bytes = 0;   // ΣL
  uint64_t persistent_footprint_bytes = 0;  // C minus the persistent region's floor
  size_t admitted_sessions = 0;             // resident or paged out
  size_t waiting_sessions = 0;
  uint64_t paged_bytes = 0;  // ΣP of sessions not resident
  size_t paged_sessions = 0;
  uint64_t page_outs = 0, page_ins = 0;  // copies finished, since creation
  uint64_t paged_out_bytes = 0, paged_in_bytes = 0;
  uint64_t host_pool_bytes = 0;  // freed host memory kept for reuse
  // Regions: "persistent" counts blocks, "ephemeral" counts allocations in lanes (including
  // closed ones). The ephemeral peak is sampled at iteration ends and snapshots.
  MemoryStats persistent;
  MemoryStats ephemeral;
  std::vector<LaneStats> lanes;        // open lanes, by id
  std::vector<SessionStats> sessions;  // admitted sessions, by id
};

class MemoryManager {
 public:
  struct Options {
    device::MemoryProvider* provider = nullptr;  // not owned; outlives the manager
    uint64_t capacity = 0;                       // C
    std::shared_ptr<const AdmissionRule> rule;   // required
    // Admission admits paged out while the ΣP of all admitted sessions ≤ overcommit × C;
    // 1 (the default): never, every admitted session is resident.
    double overcommit = 1.0;
    // Host memory freed by paging that the manager keeps for the next page-out (a pool of
    // exact sizes: sessions page out the same blocks again), so a page-out does not pay for
    // fresh memory (page faults and zeroing, or pinning) each time. 0: none kept.
    uint64_t host_pool_bytes = 0;
    const Clock* clock = nullptr;  // for admission timeouts; SteadyClock when null
    // Lane ids are first_lane, first_lane + lane_stride, ...: managers of one engine take
    // first lanes 1..n and stride n, so that their lane ids never collide.
    LaneId first_lane = 1;
    LaneId lane_stride = 1;
  };

  static StatusOr<std::unique_ptr<MemoryManager>> Create(Options options);
  virtual ~MemoryManager() = default;

  virtual StatusOr<std::optional<Grant>> Admit(SessionId session, Requirement req,
                                               std::optional<Nanos> timeout = std::nullopt) = 0;
  virtual StatusOr<AdmissionEvents> Release(SessionId session) = 0;
  virtual AdmissionEvents CancelWaiting(SessionId session) = 0;
  virtual AdmissionEvents ExpireWaiting() = 0;

  virtual StatusOr<PersistentBlock> Persistent(SessionId session) const = 0;
  virtual StatusOr<LaneIteration> BeginIteration(LaneId lane) = 0;
  virtual Status EndIteration(LaneId lane) = 0;

  virtual uint64_t capacity() const = 0;
  virtual std::vector<LaneInfo> Lanes() const = 0;
  virtual size_t WaitingCount() const = 0;
  // ΣP + ΣL: what the safety condition bounds by C.
  virtual uint64_t CommittedBytes() const = 0;
  // Statistics per region, lane and session, and the memory map (see docs/memory.md).
  virtual nlohmann::json Stats() const = 0;
  virtual nlohmann::json MemoryMap() const = 0;

  // Additions to the contract.

  // BeginIteration(lane), with the iteration's allocations also counted in `session`'s
  // statistics. InvalidArgument when the session is not in the lane.
  virtual StatusOr<LaneIteration> BeginIteration(LaneId lane, SessionId session) = 0;
  // What Stats() renders, as data.
  virtual MemoryStatsSnapshot StatsSnapshot() const = 0;
  // Checks invariants 1-4 and the bookkeeping behind them; INTERNAL naming the first broken
  // one. Debug builds check this after every change; tests call it directly.
  virtual Status CheckInvariants() const = 0;

  // Paging (see the contract above).
  // NOT_FOUND for a session not admitted; FAILED_PRECONDITION when it is not paged out (or
  // its page-out copy has not finished). Candidates that are not resident, or mid-iteration,
  // are skipped.
  virtual StatusOr<PageInResult> PageIn(SessionId session,
                                        std::span<const SessionId> candidates) = 0;
  // Copies ready to run (each handed out once).
  virtual std::vector<Transfer> TakeTransfers() = 0;
  // The transfer's copy ended with `copy` (OK or the copy's error). Frees the range or host
  // memory it held and places blocks waiting for it. A failed copy loses the session's state:
  // the session is released and failed with INTERNAL in the events. NOT_FOUND for an unknown
  // transfer.
  virtual StatusOr<AdmissionEvents> FinishTransfer(uint64_t transfer,
                                                   const Status& copy = OkStatus()) = 0;
  virtual StatusOr<Residence> ResidenceOf(SessionId session) const = 0;
  // A snapshot of the arena for admission rules.
  virtual ArenaSnapshot Snapshot() const = 0;
  // What Admit(req) would do now, changing nothing. A requirement that can never fit, or
  // that would queue behind earlier requests, is not admitted now.
  // `page_out`: resident sessions (in the caller's order) that may be paged out first; the
  // preview then names the prefix it would take (AdmissionPreview::page_out).
  virtual AdmissionPreview Preview(const Requirement& req,
                                   std::span<const SessionId> page_out = {}) const = 0;

  // Migration between managers (Note [Migration] in src/sched/engine.cc).
  // Starts paging a resident session out with no session paged in (between its iterations;
  // FAILED_PRECONDITION otherwise, NOT_FOUND for a session not admitted); its copy is a
  // Transfer. Waiting sessions admitted into the room it leaves are in the events.
  // With `to`, the copy goes straight into another manager's block (a peer Transfer, no host
  // memory): the session's state arrives there as it leaves here.
  virtual StatusOr<AdmissionEvents> PageOut(SessionId session,
                                            std::optional<PeerCopy> to = std::nullopt) = 0;
  // A paged-out session (its copy out finished) leaves this manager with its host memory.
  virtual StatusOr<Emigrant> Emigrate(SessionId session) = 0;
  // What Emigrate would hand on for a resident session (its requirements; no host memory),
  // changing nothing: what a peer move Immigrates with. NOT_FOUND for a session not admitted.
  virtual StatusOr<Emigrant> Prospect(SessionId session) const = 0;
  // Admits a session that left another manager, resident now, and queues the copy of its
  // state in (a Transfer; until it ends the session is kPagingIn). nullopt, and nothing
  // changes, when the rule does not admit it now; ALREADY_EXISTS for a live id. `incoming`:
  // its state arrives by a peer copy the other manager runs (Incoming says where) instead.
  virtual StatusOr<std::optional<Grant>> Immigrate(const Emigrant& emigrant,
                                                   bool incoming = false) = 0;
  // An incoming session's block and transfer, once its block is placed (nullopt while it
  // waits for its range, or for a session not incoming). Its FinishTransfer ends the copy.
  virtual std::optional<PeerCopy> Incoming(SessionId session) const = 0;
  virtual device::MemoryProvider& provider() const = 0;
  virtual double overcommit() const = 0;
};

}  // namespace salus::mem
