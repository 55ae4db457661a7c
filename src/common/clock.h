// Time for everything that decides: the scheduler, admission timeouts, leases, statistics.
//
// Code never reads std::chrono clocks directly; it is handed a Clock. The daemon uses
// SteadyClock; tests and the simulator use ManualClock, whose time moves only when told.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace salus {

using Nanos = std::chrono::nanoseconds;

class Clock {
 public:
  virtual ~Clock() = default;
  // Time since an arbitrary, fixed origin; never decreases.
  virtual Nanos Now() const = 0;

  double NowSeconds() const { return std::chrono::duration<double>(Now()).count(); }
};

class SteadyClock final : public Clock {
 public:
  Nanos Now() const override;
  // A process-wide instance.
  static SteadyClock* Get();
};

// A clock that moves only when told to. Thread-safe: readers may race with Advance.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Nanos start = Nanos(0)) : now_(start.count()) {}

  Nanos Now() const override { return Nanos(now_.load(std::memory_order_acquire)); }
  void Advance(Nanos d) { now_.fetch_add(d.count(), std::memory_order_acq_rel); }
  // Moves the clock to t. Moving it backwards is a broken invariant and is ignored.
  void Set(Nanos t);

 private:
  std::atomic<int64_t> now_;
};

inline double ToSeconds(Nanos d) { return std::chrono::duration<double>(d).count(); }
inline Nanos FromSeconds(double s) {
  return std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(s));
}

}  // namespace salus
