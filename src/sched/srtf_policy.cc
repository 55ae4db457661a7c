#include "sched/srtf_policy.h"

#include <tuple>

namespace salus::sched {

StatusOr<std::unique_ptr<Policy>> SrtfPolicy::Create(const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(
      internal::CheckPolicyOptions("srtf", options, {"max_hold_ms", "min_hold_ms"}));
  SALUS_ASSIGN_OR_RETURN(AnticipationOptions a, internal::ParseAnticipation("srtf", options));
  return std::unique_ptr<Policy>(new SrtfPolicy(a));
}

Decision SrtfPolicy::Pick(const LaneSnapshot& s) const {
  return internal::PickOrHold(s, [](const SessionView& v) {
    // Note [Ordered bits]: remaining time is never negative (+infinity when undeclared).
    // Equal remaining time (two jobs of undeclared length, both +infinity): the least served
    // first, so neither starves the other.
    return std::tuple(internal::OrderedBits(v.remaining_seconds), -v.priority,
                      v.total_service.count(), v.admit_seq);
  });
}

}  // namespace salus::sched
