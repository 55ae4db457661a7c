// ArenaMemoryManager: the MemoryManager of memory_manager.h over one arena from a
// device::MemoryProvider. Algorithm 1, the lane layout and the notes that explain them are in
// arena_memory_manager.cc; docs/memory.md draws the picture.
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
#include "mem/lane_allocator.h"
#include "mem/memory_manager.h"
#include "mem/persistent_region.h"

namespace salus::mem {

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
  Status Release(SessionId session) override EXCLUDES(mu_);
  void CancelWaiting(SessionId session) override EXCLUDES(mu_);
  void ExpireWaiting() override EXCLUDES(mu_);

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

 private:
  struct Session {
    SessionId id = 0;
    Requirement req;       // rounded
    Requirement declared;  // as asked
    LaneId lane = 0;
    uint64_t block_offset = 0;  // meaningful when req.persistent_bytes > 0
    bool block_pending = false;
    MemoryStats persistent;
    MemoryStats ephemeral;
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

  enum class Step { kNewLane, kJoin, kGrow, kWait };
  struct Decision {
    Step step = Step::kWait;
    LaneId lane = 0;
  };

  ArenaMemoryManager(Options options, std::byte* base);

  Decision Decide(const Requirement& req) const REQUIRES(mu_);
  Grant Apply(const Waiting& w, const Decision& d) REQUIRES(mu_);
  void LeaveLane(const Session& s) REQUIRES(mu_);
  void ResizeLane(Lane& lane, uint64_t size) REQUIRES(mu_);
  uint64_t LayoutOffset(LaneId lane) const REQUIRES(mu_);
  Lane* FindLane(LaneId lane) REQUIRES(mu_);
  // What occupies [offset, offset + size) physically right now (lanes mid-iteration other
  // than `except`, retiring blocks); nullopt when nothing does.
  std::optional<std::string> Hazard(uint64_t offset, uint64_t size, LaneId except) const
      REQUIRES(mu_);
  void PlacePendingBlocks() REQUIRES(mu_);
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
  uint64_t persistent_bytes_ GUARDED_BY(mu_) = 0;  // ΣP
  uint64_t lane_bytes_ GUARDED_BY(mu_) = 0;        // ΣL
  LaneId next_lane_ GUARDED_BY(mu_) = 1;
  MemoryStats persistent_stats_ GUARDED_BY(mu_);
  MemoryStats closed_lane_stats_ GUARDED_BY(mu_);  // lanes that have closed
  mutable uint64_t ephemeral_peak_ GUARDED_BY(mu_) = 0;
};

}  // namespace salus::mem
