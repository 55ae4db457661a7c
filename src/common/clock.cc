#include "common/clock.h"

namespace salus {

Nanos SteadyClock::Now() const {
  return std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch());
}

SteadyClock* SteadyClock::Get() {
  static SteadyClock clock;
  return &clock;
}

void ManualClock::Set(Nanos t) {
  int64_t cur = now_.load(std::memory_order_acquire);
  while (t.count() > cur &&
         !now_.compare_exchange_weak(cur, t.count(), std::memory_order_acq_rel)) {
  }
}

}  // namespace salus
