#include "sched/srtf_policy.h"

namespace salus::sched {

StatusOr<std::unique_ptr<Policy>> SrtfPolicy::Create(const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(internal::CheckPolicyOptions("srtf", options, {}));
  return std::unique_ptr<Policy>(new SrtfPolicy());
}

Decision SrtfPolicy::Pick(const LaneSnapshot& s) const {
  return internal::PickMin(s, [](const SessionView& a, const SessionView& b) {
    if (a.remaining_seconds != b.remaining_seconds) {
      return a.remaining_seconds < b.remaining_seconds;
    }
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.admit_seq < b.admit_seq;
  });
}

}  // namespace salus::sched
