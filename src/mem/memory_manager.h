// MemoryManager: the arena, the persistent region, lanes, Algorithm 1 and the admission queue.
//
// CONTRACT (the scheduler and the server code against this; the implementation may add to it
// but keeps these signatures and semantics):
//
// - The arena [0, C) is taken once at Create() from a device::MemoryProvider. The persistent
//   region grows down from C, the ephemeral region grows up from 0 and is cut into lanes.
// - Admit(session, {P, E}) runs the admission rule of the configured mode:
//     kPack        Algorithm 1 of DESIGN.md (new lane / best-match join / grow / queue);
//     kSingleLane  one shared lane per lane class grown to the largest E; admitted if
//                  ΣP + P + ΣL - L + max(L, E) ≤ C (L: the class's lane, 0 when it has none);
//     kExclusive   one session on the device at a time (admitted iff none is admitted).
//   Every mode except kExclusive admits a session only into a lane of its own LaneClass.
//   It returns the Grant when admitted now, std::nullopt when the session waits in the
//   admission queue (it is admitted later and reported through Options::on_admitted), or
//   RESOURCE_EXHAUSTED at once when it can never fit (P + E > C), with P, E and C in human
//   units in the message. Invariant 1 (ΣP + ΣL ≤ C) holds after every call.
// - Release(session) frees its persistent block and its lane membership (the lane shrinks to
//   the largest remaining E, or closes), then re-tries the admission queue in order; each
//   session admitted by that is reported through on_admitted (called without internal locks
//   held, on the caller's thread).
// - CancelWaiting / ExpireWaiting remove queued sessions (the latter those whose timeout has
//   passed on the injected clock); each is reported through on_admission_failed with
//   CANCELLED or DEADLINE_EXCEEDED.
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
// - Step 2 of Algorithm 1 (join) also requires ΣP + P + ΣL ≤ C: joining adds P, and invariant 1
//   must hold after every call.
// - Persistent blocks never move, so holes between them can make the persistent region's
//   footprint F (C minus its lowest block) larger than ΣP. Admission uses the footprint the
//   region would have after placing P where Algorithm 1 says ΣP + P (Note [Persistent
//   footprint]); without holes the two are equal and the rule is exactly DESIGN.md's.
// - The queue is re-tried in order, and every waiting request that fits is admitted (a large
//   request does not block smaller ones behind it). A request whose timeout has passed is not
//   admitted by a re-try; ExpireWaiting reports it.
// - Release of a session that is still waiting cancels it (on_admission_failed, CANCELLED).
// - Persistent(session) returns UNAVAILABLE, for a session admitted into space that a lane
//   mid-iteration still occupies at its old place (or a released session's block its lane's
//   iteration may still use), until that iteration ends: the block is placed at the first
//   EndIteration that clears it (Note [Lane placement]). BeginIteration(lane, session) says
//   the same. Release during a lane's iteration keeps the released block and a closed lane's
//   range in use until that iteration ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "mem/memory_stats.h"
#include "salus/status.h"

namespace salus::device {
class MemoryProvider;
}

namespace salus::mem {

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
};

enum class AdmissionMode {
  kPack,        // PACK, FAIR: Algorithm 1, as many lanes as the safety condition allows
  kSingleLane,  // SRTF, FAIR's single-lane option
  kExclusive,   // FIFO: no sharing
};

struct Grant {
  SessionId session = 0;
  LaneId lane = 0;
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
  LaneId lane = 0;
  Requirement requirement;  // rounded to kArenaAlignment
  MemoryStats persistent;   // its block
  MemoryStats ephemeral;    // allocations of iterations begun with BeginIteration(lane, session)
};

struct MemoryStatsSnapshot {
  uint64_t capacity = 0;
  uint64_t persistent_committed_bytes = 0;  // ΣP
  uint64_t ephemeral_committed_bytes = 0;   // ΣL
  uint64_t persistent_footprint_bytes = 0;  // C minus the persistent region's floor
  size_t admitted_sessions = 0;
  size_t waiting_sessions = 0;
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
    AdmissionMode mode = AdmissionMode::kPack;
    const Clock* clock = nullptr;  // for admission timeouts; SteadyClock when null
    std::function<void(const Grant&)> on_admitted;
    std::function<void(SessionId, const Status&)> on_admission_failed;
  };

  static StatusOr<std::unique_ptr<MemoryManager>> Create(Options options);
  virtual ~MemoryManager() = default;

  virtual StatusOr<std::optional<Grant>> Admit(SessionId session, Requirement req,
                                               std::optional<Nanos> timeout = std::nullopt) = 0;
  virtual Status Release(SessionId session) = 0;
  virtual void CancelWaiting(SessionId session) = 0;
  virtual void ExpireWaiting() = 0;

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
};

}  // namespace salus::mem
