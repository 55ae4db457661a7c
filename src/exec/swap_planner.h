// The swap planner: which activations a training iteration copies out to host memory after
// their last forward access and back before their first backward use, so that the iteration
// fits a smaller lane (a lower E) at a bounded cost in time.
//
// Assumptions: steps run one after another in a fixed order, forward steps first; an
// iteration has ONE host<->device copy path, so its copies run one at a time, in the order
// they are issued, beside the compute (or, without overlap, by the thread that runs the
// steps); a copy that is not over when a step needs its buffer stalls compute. Step times are
// estimates (measured ones when the executable was profiled).
//
// Algorithm (Note [Swap planning]):
//   1. Candidates: every swappable buffer (an input or intermediate, not a kernel's scratch,
//      not a fetch) with a gap between two consecutive accesses (its definition, its reads)
//      that leaves at least one whole step between the end of the copy out and the start of
//      the copy back. The gap of an activation is the one from its last forward access to
//      its first backward use; a buffer accessed in one pass only (a weight's gradient
//      waiting for the optimizer's update) takes its longest gap.
//   2. Candidates are taken in order of gap x size (the gap's estimated seconds times the
//      bytes), largest first. Each is tried on top of those kept so far: its lifetime is
//      split in two ([def, out + 1] and [in_issue, last]), the MemoryPlanner re-plans every
//      buffer, and the candidate is kept when the peak did not grow. Each strict fall of the
//      peak is a point. This greedy pass runs twice: with each copy back issued early enough
//      to hide it behind the steps before its read (prefetch: slower to free, no stall), and
//      issued right before its read (just in time: the region lives shortest, the step
//      stalls for the copy). Both passes' points compete in step 4.
//   3. The time of a point is a simulation of its schedule (ExpectedSeconds): compute advances
//      by the step times, copies queue on the one path, waits stall compute.
//   4. The points are Pareto-filtered (a lower E must cost more time), each point's swaps are
//      pruned of those whose removal leaves its E unchanged, and at most max_points are
//      offered, from no swapping to the lowest E, spread evenly in E; a point that saves less
//      than min_saving of the unswapped E over the point before it is not worth its copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "exec/memory_planner.h"

namespace salus::exec {

// One lane buffer as the planner sees it.
struct SwapBuffer {
  PlannedBuffer lifetime;  // first: the defining step (-1: fed before step 0); last: inclusive
  std::vector<int> uses;   // the steps that read it, ascending
  bool swappable = false;  // an input or an intermediate that is not fetched
};

struct SwapProblem {
  std::vector<SwapBuffer> buffers;
  std::vector<bool> backward;        // per step: after the forward pass (backward or update)
  std::vector<double> step_seconds;  // per step: estimated or measured
  double bandwidth = 0;              // bytes/s of the one host<->device copy path
  // Whether copies run beside the steps; false: the thread that issues a copy performs it
  // before the next step (the planner then issues each copy back right before its read).
  bool overlap = true;
};

// Note [Swap schedule]: one buffer's round trip, in step boundaries. Before step s starts, in
// this order: the copies out of buffers whose `out` is s - 1 are issued; the copies back of
// those whose `in_issue` is s are issued; compute waits for the copies out whose `out_done`
// is s and the copies back whose `in` is s. Copies run in issue order on one path, so a copy
// back always follows its own copy out. The buffer's first region is live in [def, out + 1]
// (out_done = out + 2): the copy out reads it during step out + 1. Its second region is live
// in [in_issue, last]: the copy back writes it while steps in_issue .. in - 1 run.
struct Swap {
  int buffer = 0;            // index into SwapProblem::buffers
  int out = 0;               // the access before the gap (a read, or the definition; -1: fed)
  int out_done = 0;          // out + 2
  int in_issue = 0;          // out + 3 <= in_issue <= in
  int in = 0;                // the read after the gap
  uint64_t host_offset = 0;  // where the bytes wait in host memory (aligned)
};

// One offered trade-off.
struct SwapPoint {
  uint64_t ephemeral_bytes = 0;  // E: the lane this point needs
  double expected_seconds = 0;   // the iteration's estimated time, copies and stalls included
  std::vector<Swap> swaps;       // in order of `buffer`
  uint64_t host_bytes = 0;       // host memory the copies out need
  // offsets[b] for each buffer b (the first region of a swapped one), then one offset per
  // swap, in the order of `swaps`: the region it is copied back into.
  MemoryPlan plan;
};

struct SwapPlannerOptions {
  size_t max_points = 5;     // at least 2: no swapping and the lowest E
  double min_saving = 0.01;  // of the unswapped E, from one offered point to the next
};

class SwapPlanner {
 public:
  // The offered points: the first swaps nothing; each next one has a strictly lower E and a
  // strictly higher expected time. Only the first when nothing can be swapped.
  static std::vector<SwapPoint> Plan(const SwapProblem& problem,
                                     const SwapPlannerOptions& options = {});

  // Every buffer's lifetime, then the second region of each swap, as MemoryPlanner plans them.
  static std::vector<PlannedBuffer> SplitLifetimes(const SwapProblem& problem,
                                                   const std::vector<Swap>& swaps);
  // The iteration's time under Note [Swap schedule] with one copy path.
  static double ExpectedSeconds(const SwapProblem& problem, const std::vector<Swap>& swaps);
  // The swap of `buffer` across its gap (step 1 above), its copy back issued as late as hides
  // the copy behind the steps before the read (`prefetch`, with overlap), or right before the
  // read; false when it is no candidate.
  static bool MakeSwap(const SwapProblem& problem, int buffer, bool prefetch, Swap* swap);

 private:
  static void Greedy(const SwapProblem& problem, bool prefetch, std::vector<SwapPoint>* found);
};

// A size-based time of a step when none was measured: the bytes it reads and writes at a
// memory-bound kernel's rate, plus a fixed launch cost.
inline constexpr double kEstimatedKernelBytesPerSecond = 10e9;
inline constexpr double kEstimatedStepOverheadSeconds = 5e-6;
double EstimateStepSeconds(uint64_t bytes_touched);
// Candidates smaller than this fraction of the unswapped E are not tried.
inline constexpr double kMinSwapFraction = 1.0 / 1024;
// What issuing one copy costs compute (queueing it, waking the copy thread).
inline constexpr double kSwapIssueSeconds = 2e-6;

}  // namespace salus::exec
