#include "exec/swap_planner.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "exec/alignment.h"

namespace salus::exec {
namespace {

double CopySeconds(const SwapProblem& problem, uint64_t bytes) {
  return problem.bandwidth > 0 ? static_cast<double>(bytes) / problem.bandwidth : 0.0;
}

// A candidate's priority: the seconds its buffer would sit idle across its gap, times its
// bytes.
double GapTimesSize(const SwapProblem& problem, const Swap& swap) {
  double gap = 0;
  for (int s = swap.out + 1; s < swap.in; ++s) gap += problem.step_seconds[s];
  return gap * static_cast<double>(problem.buffers[swap.buffer].lifetime.size);
}

bool ByBuffer(const Swap& a, const Swap& b) { return a.buffer < b.buffer; }

// The point of `swaps` (in buffer order) with its lane `plan`: host slots in buffer order,
// the expected time.
SwapPoint MakePoint(const SwapProblem& problem, std::vector<Swap> swaps, MemoryPlan plan) {
  SwapPoint point;
  for (Swap& s : swaps) {
    s.host_offset = point.host_bytes;
    point.host_bytes += AlignUp(problem.buffers[s.buffer].lifetime.size);
  }
  point.plan = std::move(plan);
  point.ephemeral_bytes = point.plan.peak;
  point.expected_seconds = SwapPlanner::ExpectedSeconds(problem, swaps);
  point.swaps = std::move(swaps);
  return point;
}

SwapPoint Evaluate(const SwapProblem& problem, std::vector<Swap> swaps) {
  std::sort(swaps.begin(), swaps.end(), ByBuffer);
  MemoryPlan plan = MemoryPlanner::Plan(SwapPlanner::SplitLifetimes(problem, swaps));
  return MakePoint(problem, std::move(swaps), std::move(plan));
}

uint64_t PeakOf(const SwapProblem& problem, const std::vector<Swap>& swaps) {
  return MemoryPlanner::Plan(SwapPlanner::SplitLifetimes(problem, swaps)).peak;
}

// Drops the swaps whose removal leaves the point's E where it is (the greedy pass keeps
// swaps that only pay off together with later ones, and some never do). The smallest first.
SwapPoint Prune(const SwapProblem& problem, const SwapPoint& point) {
  std::vector<Swap> swaps = point.swaps;
  std::vector<size_t> order(swaps.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return GapTimesSize(problem, swaps[a]) < GapTimesSize(problem, swaps[b]);
  });
  std::vector<bool> dropped(swaps.size(), false);
  auto without = [&](size_t skip) {
    std::vector<Swap> rest;
    for (size_t i = 0; i < swaps.size(); ++i) {
      if (!dropped[i] && i != skip) rest.push_back(swaps[i]);
    }
    return rest;
  };
  for (size_t i : order) {
    if (PeakOf(problem, without(i)) <= point.ephemeral_bytes) dropped[i] = true;
  }
  return Evaluate(problem, without(swaps.size()));
}

// Sorted by E, highest first; a point stays when it is strictly faster than every point with
// a lower or equal E.
std::vector<SwapPoint> ParetoFront(std::vector<SwapPoint> points) {
  std::stable_sort(points.begin(), points.end(), [](const SwapPoint& a, const SwapPoint& b) {
    if (a.ephemeral_bytes != b.ephemeral_bytes) return a.ephemeral_bytes > b.ephemeral_bytes;
    return a.expected_seconds < b.expected_seconds;
  });
  std::vector<SwapPoint> front;
  double fastest_below = std::numeric_limits<double>::infinity();
  for (size_t i = points.size(); i-- > 0;) {
    if (!front.empty() && front.back().ephemeral_bytes == points[i].ephemeral_bytes) {
      front.back() = std::move(points[i]);  // as small, and at least as fast
      fastest_below = front.back().expected_seconds;
    } else if (points[i].expected_seconds < fastest_below) {
      fastest_below = points[i].expected_seconds;
      front.push_back(std::move(points[i]));
    }
  }
  std::reverse(front.begin(), front.end());
  return front;
}

// At most `max_points` of `front` (sorted by E, highest first): the first, the last, and
// for evenly spaced targets between their Es the fastest point that fits each.
std::vector<SwapPoint> Spread(std::vector<SwapPoint> front, size_t max_points) {
  max_points = std::max<size_t>(max_points, 2);
  if (front.size() <= max_points) return front;
  const double high = static_cast<double>(front.front().ephemeral_bytes);
  const double low = static_cast<double>(front.back().ephemeral_bytes);
  std::vector<size_t> picked{0};
  for (size_t j = 1; j + 1 < max_points; ++j) {
    const double target =
        high - (high - low) * static_cast<double>(j) / static_cast<double>(max_points - 1);
    size_t i = 0;
    while (static_cast<double>(front[i].ephemeral_bytes) > target) ++i;
    if (i != picked.back()) picked.push_back(i);
  }
  if (picked.back() != front.size() - 1) picked.push_back(front.size() - 1);
  std::vector<SwapPoint> out;
  for (size_t i : picked) out.push_back(std::move(front[i]));
  return out;
}

// Drops the points (sorted by E, highest first) that save less than `min_gap` bytes over the
// point kept before them; the lowest E takes the place of the last kept point instead, unless
// that one is the first (no swapping).
std::vector<SwapPoint> Thin(std::vector<SwapPoint> points, uint64_t min_gap) {
  std::vector<SwapPoint> kept;
  for (size_t i = 0; i < points.size(); ++i) {
    if (kept.empty() || points[i].ephemeral_bytes + min_gap <= kept.back().ephemeral_bytes) {
      kept.push_back(std::move(points[i]));
    } else if (i + 1 == points.size() && kept.size() > 1) {
      kept.back() = std::move(points[i]);
    }
  }
  return kept;
}

}  // namespace

double EstimateStepSeconds(uint64_t bytes_touched) {
  return kEstimatedStepOverheadSeconds +
         static_cast<double>(bytes_touched) / kEstimatedKernelBytesPerSecond;
}

bool SwapPlanner::MakeSwap(const SwapProblem& problem, int buffer, bool prefetch, Swap* swap) {
  const SwapBuffer& b = problem.buffers[buffer];
  if (!b.swappable || b.uses.empty() || b.lifetime.size == 0) return false;
  // The buffer's accesses in order: its definition, then its readers.
  std::vector<int> accesses{b.lifetime.first};
  for (int u : b.uses) {
    if (u > accesses.back()) accesses.push_back(u);
  }
  auto forward = [&](int step) { return step < 0 || !problem.backward[step]; };
  auto idle_seconds = [&](size_t k) {
    double idle = 0;
    for (int s = accesses[k] + 1; s < accesses[k + 1]; ++s) idle += problem.step_seconds[s];
    return idle;
  };
  // The gap across the two passes if there is one (an activation), else the longest.
  size_t gap = accesses.size();
  for (size_t k = 0; k + 1 < accesses.size() && gap == accesses.size(); ++k) {
    if (forward(accesses[k]) && !forward(accesses[k + 1])) gap = k;
  }
  if (gap == accesses.size()) {
    for (size_t k = 0; k + 1 < accesses.size(); ++k) {
      if (gap == accesses.size() || idle_seconds(k) > idle_seconds(gap)) gap = k;
    }
  }
  if (gap == accesses.size()) return false;
  const int out = accesses[gap], in = accesses[gap + 1];
  // out + 1: the copy out reads the buffer; in_issue >= out + 3 leaves step out + 2 free.
  if (in < out + 3) return false;
  const double copy = CopySeconds(problem, b.lifetime.size);
  int issue = in;
  double hidden = 0;
  while (prefetch && problem.overlap && issue > out + 3 && hidden < copy) {
    hidden += problem.step_seconds[--issue];
  }
  *swap = Swap{buffer, out, out + 2, issue, in, 0};
  return true;
}

std::vector<PlannedBuffer> SwapPlanner::SplitLifetimes(const SwapProblem& problem,
                                                       const std::vector<Swap>& swaps) {
  std::vector<PlannedBuffer> lifetimes;
  lifetimes.reserve(problem.buffers.size() + swaps.size());
  for (const SwapBuffer& b : problem.buffers) lifetimes.push_back(b.lifetime);
  for (const Swap& s : swaps) {
    PlannedBuffer& first = lifetimes[s.buffer];
    PlannedBuffer second = first;
    first.last = s.out_done - 1;
    second.first = s.in_issue;
    lifetimes.push_back(second);
  }
  return lifetimes;
}

double SwapPlanner::ExpectedSeconds(const SwapProblem& problem, const std::vector<Swap>& swaps) {
  const int num_steps = static_cast<int>(problem.step_seconds.size());
  // Per step boundary, the swaps whose copies are issued or awaited there.
  std::vector<std::vector<size_t>> issue_out(num_steps + 1), issue_in(num_steps + 1),
      wait(num_steps + 1);
  for (size_t i = 0; i < swaps.size(); ++i) {
    issue_out[swaps[i].out + 1].push_back(i);
    issue_in[swaps[i].in_issue].push_back(i);
    wait[swaps[i].out_done].push_back(i);
    wait[swaps[i].in].push_back(i);
  }
  std::vector<double> out_end(swaps.size(), 0), in_end(swaps.size(), 0);
  double now = 0, path_free = 0;
  auto issue = [&](size_t i, std::vector<double>* end) {
    const double start = std::max(path_free, now);
    path_free = start + CopySeconds(problem, problem.buffers[swaps[i].buffer].lifetime.size);
    now = problem.overlap ? now + kSwapIssueSeconds : path_free;
    (*end)[i] = path_free;
  };
  for (int s = 0; s < num_steps; ++s) {
    for (size_t i : issue_out[s]) issue(i, &out_end);
    for (size_t i : issue_in[s]) issue(i, &in_end);
    for (size_t i : wait[s]) now = std::max(now, s == swaps[i].in ? in_end[i] : out_end[i]);
    now += problem.step_seconds[s];
  }
  return std::max(now, path_free);  // the iteration ends with its copies
}

std::vector<SwapPoint> SwapPlanner::Plan(const SwapProblem& problem,
                                         const SwapPlannerOptions& options) {
  std::vector<SwapPoint> found{Evaluate(problem, {})};
  Greedy(problem, /*prefetch=*/true, &found);
  if (problem.overlap) Greedy(problem, /*prefetch=*/false, &found);
  std::vector<SwapPoint> offered = Spread(ParetoFront(std::move(found)), options.max_points);
  for (size_t i = 1; i < offered.size(); ++i) offered[i] = Prune(problem, offered[i]);
  const auto min_gap = static_cast<uint64_t>(options.min_saving *
                                             static_cast<double>(offered.front().ephemeral_bytes));
  return Thin(ParetoFront(std::move(offered)), min_gap);
}

// Step 2 of Note [Swap planning]: appends a point to `found` at each strict fall of the peak.
void SwapPlanner::Greedy(const SwapProblem& problem, bool prefetch, std::vector<SwapPoint>* found) {
  // A buffer this small cannot lower E by more than the copy costs (a batch normalisation's
  // statistics, a bias's gradient), and each one would cost a whole plan here.
  const auto min_bytes =
      static_cast<uint64_t>(static_cast<double>(found->front().ephemeral_bytes) * kMinSwapFraction);
  std::vector<Swap> candidates;
  for (int b = 0; b < static_cast<int>(problem.buffers.size()); ++b) {
    Swap s;
    if (MakeSwap(problem, b, prefetch, &s) && problem.buffers[b].lifetime.size >= min_bytes) {
      candidates.push_back(s);
    }
  }

  std::vector<double> priority;
  for (const Swap& s : candidates) priority.push_back(GapTimesSize(problem, s));
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return priority[a] > priority[b]; });

  std::vector<Swap> kept;  // in buffer order, as points keep them
  uint64_t peak = found->front().ephemeral_bytes;
  for (size_t c : order) {
    auto at = kept.insert(std::lower_bound(kept.begin(), kept.end(), candidates[c], ByBuffer),
                          candidates[c]);
    MemoryPlan trial = MemoryPlanner::Plan(SplitLifetimes(problem, kept));
    if (trial.peak > peak) {
      kept.erase(at);
    } else if (trial.peak < peak) {
      peak = trial.peak;
      found->push_back(MakePoint(problem, kept, std::move(trial)));
    }
  }
}

}  // namespace salus::exec
