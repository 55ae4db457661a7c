// SRTF: shortest remaining time first, preemptive at iteration boundaries.
//
// Assumptions: all sessions of a latency class share one lane grown to their largest E
// (the single-lane admission rule: admitted if ΣP + P + max(L, E) ≤ C), so one iteration of a
// class runs at a time. Algorithm: at each boundary pick the runnable session with the least
// estimated remaining time (remaining iterations × moving-average iteration time, or the
// declared remaining duration); ties go to the higher priority, then the least device time
// attained (so jobs of undeclared length share the lane), then the earlier admitted. A
// shorter arrival therefore takes over at the next boundary, and the preempted job's state
// stays resident. Anticipation (Note [Anticipation]): when a session that would win has just
// finished an iteration and is expected back within its hold window, the lane waits for it
// instead of handing a whole iteration to a longer job. Paging (overcommit) takes out the
// session with the longest remaining time first.
// Options: {"max_hold_ms": 2, "min_hold_ms": 0}; max_hold_ms 0 turns anticipation off.
#pragma once

#include "sched/policy.h"

namespace salus::sched {

class SrtfPolicy final : public AnticipatingPolicy {
 public:
  static StatusOr<std::unique_ptr<Policy>> Create(const nlohmann::json& options) {
    return AnticipatingPolicy::Create<SrtfPolicy>("srtf", options);
  }
  using AnticipatingPolicy::AnticipatingPolicy;
  std::string_view name() const override { return "srtf"; }
  Decision Pick(const LaneSnapshot& snapshot) const override;
  // The longest remaining first.
  void OrderPageOut(std::span<SessionView> candidates) const override;
};

}  // namespace salus::sched
