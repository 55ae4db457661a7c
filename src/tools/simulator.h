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
//  - Optional: `overcommit` > 1 pages persistent state to host memory (Note [Simulated
//    paging] in simulator.cc): the engine decides what to page, and each copy takes
//    bytes / host_bandwidth on one serialized copy path.
//  - Optional: `swap_fraction` > 0 lets training jobs swap activations to host memory within
//    an iteration (Note [Simulated swapping] in simulator.cc): a job offers smaller lanes at a
//    cost in time, admission grants the first that fits, and the jobs' copies share the path.
//  - Optional: `devices` > 1 replays on several devices (Note [Simulated devices]): each has
//    its own compute and copy path; the engine places, moves and unpacks jobs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mem/memory_manager.h"
#include "salus/status.h"
#include "tools/trace.h"

namespace salus::device {
class MemoryProvider;
}

namespace salus::tools {

// A PCIe 4.0 x16 link moves about 25 GB/s between device and pinned host memory in practice
// (32 GB/s raw); the default copy path between them in the simulator.
inline constexpr double kDefaultHostBandwidthBytesPerS = 25e9;

struct SimOptions {
  std::string policy = "fair";
  nlohmann::json policy_options;
  uint64_t capacity = 0;
  uint64_t seed = 1;
  double jitter = 0;
  double quantum_s = 0;
  double turnaround_s = 0;  // client turnaround of jobs whose trace row gives none
  // Paging (Note [Simulated paging]): sched::Engine::Options::overcommit (1: off), the copy
  // path's bandwidth in bytes per second, and Engine::Options::paging_quantum.
  double overcommit = 1.0;
  double host_bandwidth = kDefaultHostBandwidthBytesPerS;
  double paging_quantum_ms = 1000;
  // Swapping (Note [Simulated swapping]): the most of E a training job may swap (0: none; a
  // trace row's swap_fraction overrides it), how many points a job offers (the first swaps
  // nothing), and the fraction of an iteration its copies can hide behind.
  double swap_fraction = 0;
  int swap_points = 4;
  double swap_overlap = 0.5;
  // Devices (Note [Simulated devices]): how many identical devices of `capacity`, whether the
  // engine moves sessions by itself (Engine::Options::defragment), and how much
  // each iteration slows per other iteration running on its device beside it (on top of the
  // compute contention; 0: none), what introspective packing detects.
  int devices = 1;
  bool defragment = true;
  double interference = 0;
};

// One of a job's swap points (Note [Simulated swapping]).
struct SimSwapPoint {
  uint64_t ephemeral_bytes = 0;  // the lane this point needs
  uint64_t copied_bytes = 0;     // per iteration, out and back
  double time_factor = 1;        // its iteration time alone over the unswapped one
  double path_share = 0;         // the fraction of its iteration the copy path is busy for it
};

// The points `job` offers, the first swapping nothing, each next one with a smaller E and a
// longer time; only the first when the job swaps nothing.
std::vector<SimSwapPoint> SwapPoints(const TraceJob& job, const SimOptions& options);

struct SimJobResult {
  const TraceJob* job = nullptr;
  bool refused = false;
  std::string reason;
  double admitted_s = -1;
  double first_start_s = -1;
  double finish_s = -1;
  mem::LaneId lane = 0;
  int64_t units_done = 0;                // scheduling units (iterations, or groups with a quantum)
  std::optional<uint64_t> page_outs;     // times paged out; set only when paging is modelled
  std::optional<int64_t> swapped_units;  // units run at a swap point; set only with swapping
  std::optional<size_t> device;          // the device it ran last on; set only with devices > 1
  std::optional<uint64_t> migrations;    // times moved; set only with devices > 1
};

// The copy path's work over a replay (Note [Simulated paging]).
struct SimPagingResult {
  uint64_t page_ins = 0;   // sessions made resident by paging in (Engine::Paging())
  uint64_t page_outs = 0;  // sessions paged out to make room
  uint64_t copies = 0;     // transfers run on the copy path
  uint64_t copied_bytes = 0;
  double busy_s = 0;  // time the copy path was copying: Σ bytes / host_bandwidth
};

// Swapping over a replay (Note [Simulated swapping]).
struct SimSwapResult {
  uint64_t jobs = 0;          // jobs that ran at least one unit at a swap point
  uint64_t units = 0;         // scheduling units run at a swap point
  uint64_t copied_bytes = 0;  // swap copies, out and back
};

struct SimResult {
  std::vector<SimJobResult> jobs;  // in trace order
  nlohmann::json summary;
  uint64_t iterations = 0;  // scheduling units the engine ran
  uint64_t safety_violations = 0;
  SimPagingResult paging;
  SimSwapResult swapping;
  std::vector<double> device_busy_s;  // per device: time it had an iteration running
};

StatusOr<SimResult> Simulate(const std::vector<TraceJob>& jobs, const SimOptions& options,
                             device::MemoryProvider* provider);

// jobs.jsonl: one line per job; summary.json: the summary. Creates `dir` if needed.
Status WriteSimResult(const SimResult& result, const std::string& dir);

nlohmann::json JobResultJson(const SimJobResult& r);

}  // namespace salus::tools
