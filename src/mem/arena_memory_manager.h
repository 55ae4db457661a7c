// ArenaMemoryManager: the MemoryManager of memory_manager.h over one arena from a
// device::MemoryProvider. It applies the decisions of its AdmissionRule (mem/admission.h) and
// keeps the physical layout safe. Three files:
//   arena_memory_manager.cc  admission, release and paging: the accounting;
//   arena_placement.cc       lanes' physical places, iterations, blocks waiting for space;
//   arena_views.cc           statistics, the memory map and the invariants.
// docs/memory.md draws the picture.
#pragma once

#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "mem/admission.h"
#include "mem/lane_allocator.h"
#include "mem/memory_manager.h"
#include "mem/persistent_region.h"

namespace salus::mem {

// "[offset, offset + size)", for messages.
std::string ArenaRange(uint64_t offset, uint64_t size);

class ArenaMemoryManager final : public MemoryManager {
 public:
  // Takes the arena from options.provider. InvalidArgument for a missing provider or a
  // capacity that is zero or not a multiple of kArenaAlignment; the provider's error (naming
  // the size) when the arena cannot be had.
  static StatusOr<std::unique_ptr<ArenaMemoryManager>> Create(Options options);
  ~ArenaMemoryManager() override;

  StatusOr<std::optional<Grant>> Admit(SessionId session, Requirement req,
                                       std::optional<Nanos> timeout = std::nullopt) override
      EXCLUDES(mu_);
  StatusOr<AdmissionEvents> Release(SessionId session) override EXCLUDES(mu_);
  AdmissionEvents CancelWaiting(SessionId session) override EXCLUDES(mu_);
  AdmissionEvents ExpireWaiting() override EXCLUDES(mu_);

  StatusOr<PersistentBlock> Persistent(SessionId session) const override EXCLUDES(mu_);
  StatusOr<LaneIteration> BeginIteration(LaneId lane) override EXCLUDES(mu_);
  StatusOr<LaneIteration> BeginIteration(LaneId lane, SessionId session) override EXCLUDES(mu_);
  Status EndIteration(LaneId lane) override EXCLUDES(mu_);

  uint64_t capacity() const override { return capacity_; }
  std::vector<LaneInfo> Lanes() const override EXCLUDES(mu_);
  size_t WaitingCount() const override EXCLUDES(mu_);
  uint64_t CommittedBytes() const override EXCLUDES(mu_);
  nlohmann::json Stats() const override EXCLUDES(mu_);
  nlohmann::json MemoryMap() const override EXCLUDES(mu_);
  MemoryStatsSnapshot StatsSnapshot() const override EXCLUDES(mu_);
  Status CheckInvariants() const override EXCLUDES(mu_);

  StatusOr<PageInResult> PageIn(SessionId session, std::span<const SessionId> candidates) override
      EXCLUDES(mu_);
  std::vector<Transfer> TakeTransfers() override EXCLUDES(mu_);
  StatusOr<AdmissionEvents> FinishTransfer(uint64_t transfer,
                                           const Status& copy = OkStatus()) override EXCLUDES(mu_);
  StatusOr<Residence> ResidenceOf(SessionId session) const override EXCLUDES(mu_);
  ArenaSnapshot Snapshot() const override EXCLUDES(mu_);
  AdmissionPreview Preview(const Requirement& req,
                           std::span<const SessionId> page_out = {}) const override EXCLUDES(mu_);
  StatusOr<AdmissionEvents> PageOut(SessionId session, std::optional<PeerCopy> to) override
      EXCLUDES(mu_);
  StatusOr<Emigrant> Emigrate(SessionId session) override EXCLUDES(mu_);
  StatusOr<Emigrant> Prospect(SessionId session) const override EXCLUDES(mu_);
  StatusOr<std::optional<Grant>> Immigrate(const Emigrant& emigrant, bool incoming) override
      EXCLUDES(mu_);
  std::optional<PeerCopy> Incoming(SessionId session) const override EXCLUDES(mu_);
  device::MemoryProvider& provider() const override { return *options_.provider; }
  double overcommit() const override { return options_.overcommit; }

 private:
  struct Session {
    SessionId id = 0;
    Requirement req;       // rounded
    Requirement declared;  // as asked
    Residence residence = Residence::kResident;
    LaneId lane = 0;            // 0 unless resident or paging in
    uint64_t block_offset = 0;  // meaningful when in the region and req.persistent_bytes > 0
    bool block_pending = false;
    bool fresh = false;         // admitted paged out and never resident: nothing to copy in
    bool leaving = false;       // paged out straight into another manager's block: no host copy
    std::byte* host = nullptr;  // its state in host memory (paging out, paged out, paging in)
    MemoryStats persistent;
    MemoryStats ephemeral;
  };

  // A block's copy between the arena and host memory; its device range is in use until the
  // copy ends.
  struct Moving {
    uint64_t id = 0;
    SessionId session = 0;
    bool to_host = true;
    uint64_t offset = 0;
    uint64_t size = 0;
    std::byte* host = nullptr;
    bool ready = false;     // may run: (page-in) its block is placed
    bool issued = false;    // handed out by TakeTransfers
    bool released = false;  // its session was released meanwhile
    // A page-in whose copy another manager runs (Immigrate incoming): never handed out here;
    // issued once its block is placed.
    bool incoming = false;
    std::optional<PeerCopy> peer;  // a page-out straight into another manager's block
  };

  struct Lane {
    LaneId id = 0;
    LaneClass lane_class = LaneClass::kBatch;
    uint64_t size = 0;  // the layout size: max E of the sessions, counted in ΣL
    std::vector<SessionId> sessions;
    std::multiset<uint64_t> ephemeral;  // E of each session
    bool in_iteration = false;
    bool closed = false;  // closed during its iteration: drains at EndIteration
    // Where the lane sits during its iteration (or sat during its last one).
    bool placed = false;
    uint64_t placed_offset = 0;
    uint64_t placed_size = 0;
    std::optional<SessionId> iteration_session;
    MemoryStats counters_at_begin;
    std::unique_ptr<LaneAllocator> allocator;
  };

  struct Waiting {
    SessionId id = 0;
    Requirement req;
    Requirement declared;
    std::optional<Nanos> deadline;
  };

  // A released session's block that its lane's running iteration may still use.
  struct Retiring {
    uint64_t offset = 0;
    uint64_t size = 0;
    LaneId lane = 0;
  };

  using Step = AdmissionDecision::Step;
  // What admission does for one request: apply a decision, admit it paged out, or wait.
  struct Outcome {
    AdmissionDecision decision;
    uint64_t ephemeral_bytes = 0;  // the E granted: the asked one or a smaller alternative
    bool paged = false;            // admitted paged out (overcommit)
  };

  ArenaMemoryManager(Options options, std::byte* base);

  // The ArenaView rules decide over: this manager's state, read in place. Used only while the
  // manager's lock is held (the analysis cannot see that through a view).
  class LiveView final : public ArenaView {
   public:
    explicit LiveView(const ArenaMemoryManager& m) : m_(m) {}
    uint64_t capacity() const override { return m_.capacity_; }
    uint64_t lane_bytes() const override NO_THREAD_SAFETY_ANALYSIS { return m_.lane_bytes_; }
    size_t resident_sessions() const override NO_THREAD_SAFETY_ANALYSIS;
    void ResidentJobs(std::vector<uint64_t>* out) const override NO_THREAD_SAFETY_ANALYSIS;
    uint64_t FootprintWith(uint64_t p) const override NO_THREAD_SAFETY_ANALYSIS {
      return m_.region_.ExtentWith(p);
    }
    std::optional<LaneView> SmallestLane(LaneClass cls, uint64_t at_least) const override
        NO_THREAD_SAFETY_ANALYSIS;
    std::optional<LaneView> FindLane(LaneId id) const override NO_THREAD_SAFETY_ANALYSIS;
    size_t LaneCount(LaneClass cls) const override NO_THREAD_SAFETY_ANALYSIS;
    size_t LaneCount() const override NO_THREAD_SAFETY_ANALYSIS { return m_.lanes_.size(); }
    ArenaSnapshot Materialize() const override NO_THREAD_SAFETY_ANALYSIS {
      return m_.SnapshotArenaLocked();
    }

   private:
    const ArenaMemoryManager& m_;
  };

  ArenaSnapshot SnapshotArenaLocked() const REQUIRES(mu_);
  // The rule's answer for a waiting request, checked, or admission paged out.
  Outcome DecideLocked(const Requirement& req) const REQUIRES(mu_);
  // P, E and the smaller lanes rounded to kArenaAlignment (smaller lanes kept only below E);
  // OK, or RESOURCE_EXHAUSTED when even the smallest lane never fits beside P.
  StatusOr<Requirement> Aligned(SessionId session, const Requirement& req) const;
  // INTERNAL when applying `d` to `arena` would break the safety condition or names a lane
  // that is not there: a rule that broke its contract.
  Status CheckDecisionLocked(const ArenaView& arena, const Requirement& req,
                             const AdmissionDecision& d) const REQUIRES(mu_);
  Grant Apply(const Waiting& w, const Outcome& o) REQUIRES(mu_);
  Grant AdmitPaged(const Waiting& w) REQUIRES(mu_);
  // Places `s`'s block and puts it in a lane as `d` says (admission or page-in).
  void Enter(Session& s, const AdmissionDecision& d) REQUIRES(mu_);
  // Begins paging resident `s` out (its lane left, its block copied to `host`).
  void BeginPageOut(Session& s, std::byte* host, std::optional<PeerCopy> peer = std::nullopt)
      REQUIRES(mu_);
  // Makes `s`, just placed in the region and a lane, resident: at once when it has nothing to
  // copy in, else paging in from s.host (or, `incoming`, by another manager's peer copy).
  void BeginPageIn(Session& s, bool incoming = false) REQUIRES(mu_);
  bool Pageable(const Session& s) const REQUIRES(mu_);
  // Takes `s`'s block out of the region; its range stays in use while `busy_until_lane` (a
  // lane mid-iteration) or a copy needs it.
  void RemoveBlock(Session& s) REQUIRES(mu_);
  // Host memory for paged state, from the pool (Options::host_pool_bytes) or the provider.
  StatusOr<std::byte*> AllocateHost(uint64_t bytes) REQUIRES(mu_);
  void FreeHost(std::byte* host, uint64_t bytes) REQUIRES(mu_);
  void LeaveLane(const Session& s) REQUIRES(mu_);
  void ResizeLane(Lane& lane, uint64_t size) REQUIRES(mu_);
  uint64_t LayoutOffset(LaneId lane) const REQUIRES(mu_);
  Lane* FindLane(LaneId lane) REQUIRES(mu_);
  // What occupies [offset, offset + size) physically right now (lanes mid-iteration other
  // than `except`, retiring blocks); nullopt when nothing does.
  std::optional<std::string> Hazard(uint64_t offset, uint64_t size, LaneId except,
                                    SessionId except_session = 0) const REQUIRES(mu_);
  void PlacePendingBlocks() REQUIRES(mu_);
  // OK when `s` may run an iteration now; UNAVAILABLE (paging in, block in use) or
  // FAILED_PRECONDITION (paged out) naming why not.
  Status ResidentLocked(const Session& s) const REQUIRES(mu_);
  std::vector<Grant> RetryQueue() REQUIRES(mu_);
  StatusOr<LaneIteration> Begin(LaneId lane, std::optional<SessionId> session) EXCLUDES(mu_);
  MemoryStatsSnapshot SnapshotLocked() const REQUIRES(mu_);
  Status CheckInvariantsLocked() const REQUIRES(mu_);
  void DcheckInvariants() const REQUIRES(mu_);

  const Options options_;
  const uint64_t capacity_;
  std::byte* const base_;
  const Clock* const clock_;

  mutable Mutex mu_;
  PersistentRegion region_ GUARDED_BY(mu_);
  std::map<SessionId, Session> sessions_ GUARDED_BY(mu_);
  std::map<LaneId, Lane> lanes_ GUARDED_BY(mu_);     // open lanes, by id: the layout order
  std::map<LaneId, Lane> draining_ GUARDED_BY(mu_);  // closed mid-iteration
  // (class, size, id) of every open lane: Algorithm 1's searches stay within one class.
  std::set<std::tuple<LaneClass, uint64_t, LaneId>> lanes_by_size_ GUARDED_BY(mu_);
  std::set<LaneId> in_flight_ GUARDED_BY(mu_);  // open or draining lanes mid-iteration
  std::list<Waiting> waiting_ GUARDED_BY(mu_);
  std::vector<Retiring> retiring_ GUARDED_BY(mu_);
  std::vector<SessionId> pending_blocks_ GUARDED_BY(mu_);
  std::map<uint64_t, Moving> moving_ GUARDED_BY(mu_);  // by transfer id
  uint64_t next_transfer_ GUARDED_BY(mu_) = 1;
  std::multimap<uint64_t, std::byte*> host_pool_ GUARDED_BY(mu_);  // size -> free host memory
  // Host memory of sessions that arrived from another manager (Immigrate), with the provider
  // that allocated it and frees it.
  std::map<std::byte*, device::MemoryProvider*> foreign_host_ GUARDED_BY(mu_);
  uint64_t host_pool_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t persistent_bytes_ GUARDED_BY(mu_) = 0;  // ΣP of sessions in the region
  uint64_t paged_bytes_ GUARDED_BY(mu_) = 0;       // ΣP of the others
  size_t paged_sessions_ GUARDED_BY(mu_) = 0;
  uint64_t page_outs_ GUARDED_BY(mu_) = 0, page_ins_ GUARDED_BY(mu_) = 0;
  uint64_t paged_out_bytes_ GUARDED_BY(mu_) = 0, paged_in_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t lane_bytes_ GUARDED_BY(mu_) = 0;  // ΣL
  LaneId next_lane_ GUARDED_BY(mu_);
  MemoryStats persistent_stats_ GUARDED_BY(mu_);
  MemoryStats closed_lane_stats_ GUARDED_BY(mu_);  // lanes that have closed
  mutable uint64_t ephemeral_peak_ GUARDED_BY(mu_) = 0;
};

}  // namespace salus::mem
