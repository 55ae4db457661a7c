// FIFO: the no-sharing baseline.
//
// Assumptions: admission is exclusive (one session on the device at a time), so the lane
// holds one session and the pick is trivial; should several ever be runnable, the earliest
// admitted runs (a job runs all its iterations before the next starts).
#pragma once

#include "sched/policy.h"

namespace salus::sched {

class FifoPolicy final : public Policy {
 public:
  static StatusOr<std::unique_ptr<Policy>> Create(const nlohmann::json& options);
  std::string_view name() const override { return "fifo"; }
  std::shared_ptr<const mem::AdmissionRule> admission_rule() const override {
    return ExclusiveRule();
  }
  Decision Pick(const LaneSnapshot& snapshot) const override;
};

}  // namespace salus::sched
