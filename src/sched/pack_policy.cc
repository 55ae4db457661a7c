#include "sched/pack_policy.h"

namespace salus::sched {

StatusOr<std::unique_ptr<Policy>> PackPolicy::Create(const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(internal::CheckPolicyOptions("pack", options, {}));
  return std::unique_ptr<Policy>(new PackPolicy());
}

Decision PackPolicy::Pick(const LaneSnapshot& s) const {
  return internal::PickMin(s, [](const SessionView& a, const SessionView& b) {
    if (a.requested_at != b.requested_at) return a.requested_at < b.requested_at;
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.admit_seq < b.admit_seq;
  });
}

}  // namespace salus::sched
