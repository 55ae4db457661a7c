// FAIR: weighted fair sharing of each lane's device time.
//
// Assumptions: admission is Algorithm 1 (the pack rule), or one shared lane with the option
// {"single_lane": true} (the single-lane rule). Algorithm: within a lane, pick the runnable session
// with the least service (device time attained since the lane's membership last changed)
// divided by its priority weight (PriorityWeight); ties go to the earlier admitted. Paging
// (overcommit) takes out the session with the most weighted device time attained first. Resetting
// service when membership changes keeps a newcomer from monopolising the lane to "catch up"
// with sessions that ran alone before it came.
#pragma once

#include "sched/policy.h"

namespace salus::sched {

class FairPolicy final : public Policy {
 public:
  struct Options {
    bool single_lane = false;
  };
  static StatusOr<std::unique_ptr<Policy>> Create(const nlohmann::json& options);
  explicit FairPolicy(Options options) : options_(options) {}
  std::string_view name() const override { return "fair"; }
  std::shared_ptr<const mem::AdmissionRule> admission_rule() const override {
    return options_.single_lane ? SingleLaneRule() : PackRule();
  }
  Decision Pick(const LaneSnapshot& snapshot) const override;
  // The most served (weighted) first.
  void OrderPageOut(std::span<SessionView> candidates) const override;

 private:
  Options options_;
};

}  // namespace salus::sched
