#include "sched/priority_policy.h"

#include <tuple>

namespace salus::sched {

StatusOr<std::unique_ptr<Policy>> PriorityPolicy::Create(const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(
      internal::CheckPolicyOptions("priority", options, {"max_hold_ms", "min_hold_ms"}));
  SALUS_ASSIGN_OR_RETURN(AnticipationOptions a, internal::ParseAnticipation("priority", options));
  return std::unique_ptr<Policy>(new PriorityPolicy(a));
}

Decision PriorityPolicy::Pick(const LaneSnapshot& s) const {
  return internal::PickOrHold(s, [](const SessionView& v) {
    // Note [Ordered bits]: remaining time is never negative (+infinity when undeclared).
    return std::tuple(-v.priority, internal::OrderedBits(v.remaining_seconds),
                      v.total_service.count(), v.admit_seq);
  });
}

}  // namespace salus::sched
