// Metrics: the daemon's counters, gauges and histograms, rendered in the Prometheus text
// format. Names follow salus_<module>_<thing>_<unit>. Updates are lock-free atomics on the
// iteration path; rendering reads a consistent-enough view (each value atomically).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "sched/engine.h"

namespace salus::server {

// `value` as a Prometheus label value goes between its double quotes: backslash, double quote
// and newline escaped (\\, \", \n), everything else as it is.
std::string EscapeLabelValue(std::string_view value);

// A histogram over microseconds with fixed, exponential bucket bounds.
class Histogram {
 public:
  static constexpr std::array<double, 16> kBoundsUs = {10,  25,  50,    100, 250, 500,   1e3, 2.5e3,
                                                       5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 1e6, 1e7};

  void Observe(double us);
  // Appends the Prometheus lines of this histogram (in seconds, as Prometheus prefers), with
  // its HELP and TYPE lines.
  void Render(const std::string& name, const std::string& help, std::string* out) const;
  // Appends only the series, each with `labels` (e.g. `class="batch"`) beside `le`.
  void RenderSeries(const std::string& name, const std::string& labels, std::string* out) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, kBoundsUs.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

class Metrics {
 public:
  void SessionCreated(bool admitted);
  void SessionAdmittedFromQueue() { admitted_from_queue_++; }
  void SessionClosed() { closed_++; }
  void IterationDone(const sched::IterationRecord& r);
  void RequestReceived() { requests_++; }
  void RequestFailed() { request_errors_++; }
  // A request refused because its client (or principal) had limits.paced_requests held back.
  void RequestPaced() { paced_refused_++; }

  // Gauges read at render time: sessions by state, lanes, bytes per region and lane.
  using GaugeSource = std::function<std::string()>;
  void SetGaugeSource(GaugeSource source) { gauges_ = std::move(source); }

  std::string RenderPrometheus() const;

 private:
  std::atomic<uint64_t> created_{0}, created_waiting_{0}, admitted_from_queue_{0}, closed_{0};
  std::atomic<uint64_t> iterations_{0}, requests_{0}, request_errors_{0}, paced_refused_{0};
  Histogram queue_delay_, run_time_, switch_gap_;
  // Per lane class (mem::LaneClass): iterations, queue delay, run time.
  struct PerClass {
    std::atomic<uint64_t> iterations{0};
    Histogram queue_delay, run_time;
  };
  std::array<PerClass, mem::kLaneClasses> by_class_;
  GaugeSource gauges_;
};

}  // namespace salus::server
