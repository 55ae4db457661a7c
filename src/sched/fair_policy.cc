#include "sched/fair_policy.h"

namespace salus::sched {

StatusOr<std::unique_ptr<Policy>> FairPolicy::Create(const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(internal::CheckPolicyOptions("fair", options, {"single_lane"}));
  Options o;
  if (options.is_object() && options.contains("single_lane")) {
    if (!options["single_lane"].is_boolean()) {
      return InvalidArgumentError("policy 'fair': option 'single_lane' must be true or false");
    }
    o.single_lane = options["single_lane"].get<bool>();
  }
  return std::unique_ptr<Policy>(new FairPolicy(o));
}

Decision FairPolicy::Pick(const LaneSnapshot& s) const {
  return internal::PickMin(s, [](const SessionView& a, const SessionView& b) {
    const double sa = static_cast<double>(a.service.count()) / PriorityWeight(a.priority);
    const double sb = static_cast<double>(b.service.count()) / PriorityWeight(b.priority);
    if (sa != sb) return sa < sb;
    return a.admit_seq < b.admit_seq;
  });
}

}  // namespace salus::sched
