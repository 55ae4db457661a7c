// What an admission rule sees and answers. The memory manager applies decisions; it does not
// make them (docs/architecture.md, rule 6, extended to memory): at every admission, re-try and
// page-in it builds an ArenaSnapshot, asks its AdmissionRule where the session goes, and applies
// the answer. The rules themselves (Algorithm 1, one lane per class, one session at a time) live
// with the scheduling policies, in src/sched/admission_rules.h, because who shares the device
// is part of the policy.
//
// A decision may page sessions out first ("page out X, then open a lane"): the caller of a
// page-in passes the sessions it may page out, in the order the policy prefers, and the rule
// answers how many of them (a prefix) must go. The snapshot can be asked what the arena would
// look like once a session is paged out (PageOut on a Materialize()d copy), so the rule
// decides over what would be. The view the manager hands a rule reads its live state under
// its lock, without copying: an admission decision costs what its searches cost, not the
// size of the arena.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "mem/memory_manager.h"
#include "mem/persistent_region.h"

namespace salus::mem {

struct ArenaSnapshot;

// One lane as admission sees it.
struct LaneView {
  LaneId id = 0;
  LaneClass lane_class = LaneClass::kBatch;
  uint64_t size = 0;  // the largest E of its members
};

// The arena as admission sees it. Read-only; valid for the call it is handed to.
class ArenaView {
 public:
  virtual ~ArenaView() = default;
  virtual uint64_t capacity() const = 0;    // C
  virtual uint64_t lane_bytes() const = 0;  // ΣL
  virtual size_t resident_sessions() const = 0;
  // Appends the job of each resident session (Requirement::job; 0 for one of no job).
  virtual void ResidentJobs(std::vector<uint64_t>* out) const = 0;
  // Resident sessions not of `job` (every one, for job 0).
  size_t ResidentOutside(uint64_t job) const;
  // Jobs with a resident session, each session of no job counting as a job of its own.
  size_t ResidentJobCount() const;
  // The persistent footprint once a block of `p` bytes is placed (Note [Persistent
  // footprint] in arena_memory_manager.cc).
  virtual uint64_t FootprintWith(uint64_t p) const = 0;
  // The smallest lane of `cls` whose size is at least `at_least` (ties: the lowest id).
  virtual std::optional<LaneView> SmallestLane(LaneClass cls, uint64_t at_least) const = 0;
  virtual std::optional<LaneView> FindLane(LaneId id) const = 0;
  virtual size_t LaneCount(LaneClass cls) const = 0;
  virtual size_t LaneCount() const = 0;
  // A copy to change (PageOut) for what-ifs.
  virtual ArenaSnapshot Materialize() const = 0;
};

// The arena as a plain value: resident persistent blocks, lanes and their members.
struct ArenaSnapshot final : ArenaView {
  struct Lane {
    LaneId id = 0;
    LaneClass lane_class = LaneClass::kBatch;
    uint64_t size = 0;                // the largest E of its members
    std::multiset<uint64_t> members;  // E of each resident member
  };
  struct Resident {
    LaneId lane = 0;
    uint64_t persistent_bytes = 0;  // rounded
    uint64_t ephemeral_bytes = 0;   // rounded
    uint64_t block_offset = 0;
    uint64_t job = 0;
  };

  uint64_t capacity_bytes = 0;  // C
  uint64_t lane_total = 0;      // ΣL
  PersistentRegion region{0};
  std::map<LaneId, Lane> lanes;
  std::map<SessionId, Resident> resident;

  uint64_t capacity() const override { return capacity_bytes; }
  uint64_t lane_bytes() const override { return lane_total; }
  size_t resident_sessions() const override { return resident.size(); }
  void ResidentJobs(std::vector<uint64_t>* out) const override;
  uint64_t FootprintWith(uint64_t p) const override { return region.ExtentWith(p); }
  std::optional<LaneView> SmallestLane(LaneClass cls, uint64_t at_least) const override;
  std::optional<LaneView> FindLane(LaneId id) const override;
  size_t LaneCount(LaneClass cls) const override;
  size_t LaneCount() const override { return lanes.size(); }
  ArenaSnapshot Materialize() const override { return *this; }
  // This arena once resident `session` is paged out: its block leaves the region and its lane
  // shrinks to its other members' largest E, or closes. False when it is not resident.
  bool PageOut(SessionId session);
};

struct AdmissionDecision {
  enum class Step { kNewLane, kJoin, kGrow, kWait };
  Step step = Step::kWait;
  LaneId lane = 0;  // kJoin, kGrow: the lane
  // Sessions to page out before the step applies: a prefix of the candidates offered.
  std::vector<SessionId> page_out;

  static AdmissionDecision Wait() { return {}; }
};

std::string_view StepName(AdmissionDecision::Step step);

class AdmissionRule {
 public:
  virtual ~AdmissionRule() = default;
  virtual std::string_view name() const = 0;
  // Where a session needing `req` (rounded to kArenaAlignment) goes in `arena`. `page_out`:
  // resident sessions the rule may page out first, in the order to take them. kWait leaves
  // the arena as it is. The answer's lane, for kJoin and kGrow, is a lane of the arena as it
  // is once the chosen prefix is paged out.
  virtual AdmissionDecision Decide(const ArenaView& arena, const Requirement& req,
                                   std::span<const SessionId> page_out = {}) const = 0;
  // INTERNAL naming what is wrong when the arena's shape breaks the rule's own promise (one
  // lane per class, one session at a time); the memory manager checks it with its invariants.
  virtual Status CheckShape(const ArenaView& arena) const {
    (void)arena;
    return OkStatus();
  }
};

// What Admit would do for a requirement now, without doing it (placement across devices).
struct AdmissionPreview {
  bool never = false;  // it can never fit this device (P + E > C)
  bool now = false;    // it would be admitted now (resident, or paged out with overcommit)
  bool resident = false;
  AdmissionDecision::Step step = AdmissionDecision::Step::kWait;  // when resident
  uint64_t ephemeral_bytes = 0;     // the E it would be granted (rounded)
  uint64_t free_after = 0;          // C - (F + ΣL) once admitted resident: what is left unused
  std::vector<SessionId> page_out;  // the prefix of the candidates it pages out first
};

}  // namespace salus::mem
