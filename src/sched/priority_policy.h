// PRIORITY: strict priority between levels, shortest remaining time first within a level.
//
// Assumptions: as SRTF, all sessions of a latency class share one lane (admission mode
// the single-lane rule), so a higher-priority session's iteration always runs before a lower one's
// of the same class; interactive sessions get a lane of their own and never wait behind a batch
// session's iteration. Algorithm: at each boundary pick the runnable session with the highest
// priority; within a level, the least estimated remaining time (Note [Remaining time]); then
// the least device time attained (jobs of undeclared length share the lane instead of the
// first admitted keeping it); then the earlier admitted. Lower levels run only when no higher
// session is runnable or expected back within its hold window (Note [Anticipation]), so a
// synchronous high-priority client is not overtaken while it turns its reply around. Options:
// {"max_hold_ms": 2, "min_hold_ms": 0}; max_hold_ms 0 turns anticipation off.
#pragma once

#include "sched/policy.h"

namespace salus::sched {

class PriorityPolicy final : public AnticipatingPolicy {
 public:
  static StatusOr<std::unique_ptr<Policy>> Create(const nlohmann::json& options) {
    return AnticipatingPolicy::Create<PriorityPolicy>("priority", options);
  }
  using AnticipatingPolicy::AnticipatingPolicy;
  std::string_view name() const override { return "priority"; }
  Decision Pick(const LaneSnapshot& snapshot) const override;
  // The least important first (lowest priority, then longest remaining).
  void OrderPageOut(std::span<SessionView> candidates) const override;
};

}  // namespace salus::sched
