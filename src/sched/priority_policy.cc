#include "sched/priority_policy.h"

#include <tuple>

namespace salus::sched {

namespace {

auto Key(const SessionView& v) {
  // Note [Ordered bits]: remaining time is never negative (+infinity when undeclared).
  return std::tuple(-v.priority, internal::OrderedBits(v.remaining_seconds),
                    v.total_service.count(), v.admit_seq);
}

}  // namespace

Decision PriorityPolicy::Pick(const LaneSnapshot& s) const { return internal::PickOrHold(s, Key); }

void PriorityPolicy::OrderPageOut(std::span<SessionView> candidates) const {
  internal::LastPickedFirst(candidates, Key);
}

}  // namespace salus::sched
