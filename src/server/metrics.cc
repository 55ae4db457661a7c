#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace salus::server {

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

void Histogram::Observe(double us) {
  const auto it = std::lower_bound(kBoundsUs.begin(), kBoundsUs.end(), us);
  buckets_[static_cast<size_t>(it - kBoundsUs.begin())].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max(0.0, us) * 1e3), std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  RenderSeries(name, "", out);
}

void Histogram::RenderSeries(const std::string& name, const std::string& labels,
                             std::string* out) const {
  const std::string sep = labels.empty() ? "" : ",";
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBoundsUs.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    *out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, kBoundsUs[i] / 1e6,
                        cumulative);
  }
  cumulative += buckets_[kBoundsUs.size()].load(std::memory_order_relaxed);
  *out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, cumulative);
  *out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, braces,
                      static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9, name,
                      braces, cumulative);
}

void Metrics::SessionCreated(bool admitted) {
  created_++;
  if (!admitted) created_waiting_++;
}

void Metrics::IterationDone(const sched::IterationRecord& r) {
  iterations_++;
  const double queue_us = static_cast<double>(r.queue_delay.count()) / 1e3;
  const double run_us = static_cast<double>(r.run_time.count()) / 1e3;
  queue_delay_.Observe(queue_us);
  run_time_.Observe(run_us);
  PerClass& c = by_class_[static_cast<size_t>(r.lane_class)];
  c.iterations++;
  c.queue_delay.Observe(queue_us);
  c.run_time.Observe(run_us);
  if (!r.lane_first) switch_gap_.Observe(static_cast<double>(r.switch_gap.count()) / 1e3);
}

std::string Metrics::RenderPrometheus() const {
  std::string out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, v);
  };
  counter("salus_server_sessions_created_total", "Sessions created.", created_.load());
  counter("salus_mem_admission_waits_total", "Sessions that had to wait for admission.",
          created_waiting_.load());
  counter("salus_mem_admitted_from_queue_total", "Waiting sessions admitted later.",
          admitted_from_queue_.load());
  counter("salus_server_sessions_closed_total", "Sessions closed.", closed_.load());
  counter("salus_sched_iterations_total", "Iterations run.", iterations_.load());
  counter("salus_server_requests_total", "Requests received.", requests_.load());
  counter("salus_server_request_errors_total", "Requests answered with an error.",
          request_errors_.load());
  counter("salus_server_paced_refused_total",
          "Requests refused because their client or principal had limits.paced_requests held back.",
          paced_refused_.load());
  queue_delay_.Render("salus_sched_queue_delay_seconds",
                      "Time from an iteration's request to its start.", &out);
  run_time_.Render("salus_sched_iteration_seconds", "Iteration run time.", &out);
  switch_gap_.Render("salus_sched_switch_gap_seconds",
                     "Time between consecutive iterations on a lane.", &out);
  auto per_class = [&](const char* name, const char* type, const char* help, auto series) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n", name, help, type);
    for (int k = 0; k < mem::kLaneClasses; ++k) {
      const auto cls = static_cast<mem::LaneClass>(k);
      series(by_class_[static_cast<size_t>(k)],
             fmt::format("class=\"{}\"", mem::LaneClassName(cls)));
    }
  };
  per_class("salus_sched_class_iterations_total", "counter", "Iterations run, by latency class.",
            [&](const PerClass& c, const std::string& labels) {
              out += fmt::format("salus_sched_class_iterations_total{{{}}} {}\n", labels,
                                 c.iterations.load());
            });
  per_class("salus_sched_class_queue_delay_seconds", "histogram",
            "Time from an iteration's request to its start, by latency class.",
            [&](const PerClass& c, const std::string& labels) {
              c.queue_delay.RenderSeries("salus_sched_class_queue_delay_seconds", labels, &out);
            });
  per_class("salus_sched_class_iteration_seconds", "histogram",
            "Iteration run time, by latency class.",
            [&](const PerClass& c, const std::string& labels) {
              c.run_time.RenderSeries("salus_sched_class_iteration_seconds", labels, &out);
            });
  if (gauges_) out += gauges_();
  return out;
}

}  // namespace salus::server
