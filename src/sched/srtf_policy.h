// SRTF: shortest remaining time first, preemptive at iteration boundaries.
//
// Assumptions: all sessions share one lane grown to the largest E (admission mode
// kSingleLane: admitted if ΣP + P + max(L, E) ≤ C), so exactly one iteration runs at a time.
// Algorithm: at each boundary pick the runnable session with the least estimated remaining
// time (remaining iterations × moving-average iteration time, or the declared remaining
// duration); ties go to the higher priority, then the earlier admitted. A shorter arrival
// therefore takes over at the next boundary, and the preempted job's state stays resident.
#pragma once

#include "sched/policy.h"

namespace salus::sched {

class SrtfPolicy final : public Policy {
 public:
  static StatusOr<std::unique_ptr<Policy>> Create(const nlohmann::json& options);
  std::string_view name() const override { return "srtf"; }
  mem::AdmissionMode admission_mode() const override { return mem::AdmissionMode::kSingleLane; }
  Decision Pick(const LaneSnapshot& snapshot) const override;
};

}  // namespace salus::sched
