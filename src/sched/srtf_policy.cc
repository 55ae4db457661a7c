#include "sched/srtf_policy.h"

#include <tuple>

namespace salus::sched {

namespace {

auto Key(const SessionView& v) {
  // Note [Ordered bits]: remaining time is never negative (+infinity when undeclared).
  // Equal remaining time (two jobs of undeclared length, both +infinity): the least served
  // first, so neither starves the other.
  return std::tuple(internal::OrderedBits(v.remaining_seconds), -v.priority,
                    v.total_service.count(), v.admit_seq);
}

}  // namespace

Decision SrtfPolicy::Pick(const LaneSnapshot& s) const { return internal::PickOrHold(s, Key); }

void SrtfPolicy::OrderPageOut(std::span<SessionView> candidates) const {
  internal::LastPickedFirst(candidates, Key);
}

}  // namespace salus::sched
