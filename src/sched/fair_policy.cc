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

namespace {

auto Key(const SessionView& v) {
  // Note [Ordered bits]: weighted service is never negative.
  return std::pair(internal::OrderedBits(static_cast<double>(v.service.count()) *
                                         InversePriorityWeight(v.priority)),
                   v.admit_seq);
}

}  // namespace

Decision FairPolicy::Pick(const LaneSnapshot& s) const { return internal::PickMinBy(s, Key); }

void FairPolicy::OrderPageOut(std::span<SessionView> candidates) const {
  internal::LastPickedFirst(candidates, Key);
}

}  // namespace salus::sched
