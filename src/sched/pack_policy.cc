#include "sched/pack_policy.h"

#include <tuple>

namespace salus::sched {

StatusOr<std::unique_ptr<Policy>> PackPolicy::Create(const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(internal::CheckPolicyOptions("pack", options, {}));
  return std::unique_ptr<Policy>(new PackPolicy());
}

Decision PackPolicy::Pick(const LaneSnapshot& s) const {
  return internal::PickMinBy(s, [](const SessionView& v) {
    return std::tuple(v.requested_at.count(), -v.priority, v.admit_seq);
  });
}

}  // namespace salus::sched
