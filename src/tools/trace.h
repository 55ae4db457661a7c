// Traces and workload profiles for the simulator and the benchmark driver.
//
// A profile row (benchmarks/workloads/salus-p100-profiles.csv) gives a workload's persistent
// and ephemeral memory in MB (2^20 bytes, as the profiles were measured) and its measured
// iteration time. A trace is CSV with the columns job_id,workload,submit_time_s,iterations
// and the optional persistent_mb,ephemeral_mb,iteration_s,utilization, which override the
// profile (or replace it, when the workload names no profile row), and the optional
// turnaround_s (the job's client: seconds from a reply to its next request; the simulator's
// default when absent), priority (an integer, 0 when absent) and swap_fraction (the most of E
// the job may swap to host memory, in [0, 1); the simulator's default when absent, and 0 for a
// workload whose profile is inference) and device (the index of the device it is pinned to;
// any when absent). Every error names the file and line.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "salus/status.h"

namespace salus::tools {

struct Profile {
  std::string workload;
  std::string kind;  // "training" or "inference"
  double persistent_mb = 0;
  double ephemeral_mb = 0;
  std::optional<double> iteration_s;
};

struct TraceJob {
  std::string job_id;
  std::string workload;
  double submit_s = 0;
  int64_t iterations = 0;
  uint64_t persistent_bytes = 0;
  uint64_t ephemeral_bytes = 0;
  double iteration_s = 0;
  double utilization = 1.0;
  std::optional<double> turnaround_s;
  int priority = 0;
  bool training = true;                 // false: an inference profile, nothing to swap
  std::optional<int> device;            // the device it is pinned to (an index); any when absent
  std::optional<double> swap_fraction;  // the trace's own; the simulator's default when absent
  int line = 0;
};

StatusOr<std::map<std::string, Profile>> LoadProfiles(const std::string& path);
// Parses a trace; `profiles` resolves workload names. Jobs come back in file order.
StatusOr<std::vector<TraceJob>> ParseTrace(const std::string& text, const std::string& origin,
                                           const std::map<std::string, Profile>& profiles);
StatusOr<std::vector<TraceJob>> LoadTrace(const std::string& path,
                                          const std::map<std::string, Profile>& profiles);

// One CSV line split on commas (no quoting: the formats above never need it), each field
// trimmed of surrounding blanks.
std::vector<std::string> SplitCsvLine(const std::string& line);

inline constexpr uint64_t kProfileMegabyte = 1024 * 1024;

}  // namespace salus::tools
