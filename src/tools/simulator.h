// The trace simulator: replays a trace through the real scheduler and memory manager
// (sched::Engine, mem::MemoryManager) on a virtual clock and the fake memory provider.
//
// Model (see docs/scheduling.md):
//  - A job arrives at submit_time_s, asks for admission with its (P, E), and once admitted
//    requests its iterations until it has run `iterations` of them, each request coming its
//    client's turnaround after the previous iteration's end (back to back when 0): a
//    synchronous client, as every training loop is. That gap is what the policies'
//    anticipation (Note [Anticipation]) bridges.
//  - An iteration of a job alone on the device takes iteration_s. Lanes contend for compute:
//    while k iterations run at once, each progresses at speed min(1, 1 / Σ utilization_i)
//    (utilization 1.0 unless the trace says otherwise), so packing compute-bound jobs gives
//    no free speed-up. Speeds are recomputed whenever an iteration starts or ends.
//  - Switching costs nothing (the daemon's measured switch gap is tens of microseconds).
//  - Optional: `jitter` multiplies each iteration's work by a factor drawn uniformly from
//    [1 - jitter, 1 + jitter] with the seeded RNG; `quantum_s` groups a job's consecutive
//    iterations into scheduling units of about that many seconds (0: every iteration is a
//    scheduling point, exact).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mem/memory_manager.h"
#include "salus/status.h"
#include "tools/trace.h"

namespace salus::device {
class MemoryProvider;
}

namespace salus::tools {

struct SimOptions {
  std::string policy = "fair";
  nlohmann::json policy_options;
  uint64_t capacity = 0;
  uint64_t seed = 1;
  double jitter = 0;
  double quantum_s = 0;
  double turnaround_s = 0;  // client turnaround of jobs whose trace row gives none
};

struct SimJobResult {
  const TraceJob* job = nullptr;
  bool refused = false;
  std::string reason;
  double admitted_s = -1;
  double first_start_s = -1;
  double finish_s = -1;
  mem::LaneId lane = 0;
  int64_t units_done = 0;  // scheduling units (iterations, or groups with a quantum)
};

struct SimResult {
  std::vector<SimJobResult> jobs;  // in trace order
  nlohmann::json summary;
  uint64_t iterations = 0;  // scheduling units the engine ran
  uint64_t safety_violations = 0;
};

StatusOr<SimResult> Simulate(const std::vector<TraceJob>& jobs, const SimOptions& options,
                             device::MemoryProvider* provider);

// jobs.jsonl: one line per job; summary.json: the summary. Creates `dir` if needed.
Status WriteSimResult(const SimResult& result, const std::string& dir);

nlohmann::json JobResultJson(const SimJobResult& r);

}  // namespace salus::tools
