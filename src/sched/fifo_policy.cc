#include "sched/fifo_policy.h"

namespace salus::sched {

StatusOr<std::unique_ptr<Policy>> FifoPolicy::Create(const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(internal::CheckPolicyOptions("fifo", options, {}));
  return std::unique_ptr<Policy>(new FifoPolicy());
}

Decision FifoPolicy::Pick(const LaneSnapshot& s) const {
  return internal::PickMinBy(s, [](const SessionView& v) { return v.admit_seq; });
}

}  // namespace salus::sched
