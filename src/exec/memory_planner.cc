#include "exec/memory_planner.h"

#include <algorithm>
#include <climits>
#include <numeric>

namespace salus::exec {
namespace {

// Note [Planning in n log n]
// Placing a buffer needs the placed buffers whose lifetimes overlap its own. Scanning every
// placed buffer for each costs n^2 (a 100,000-node model spent seconds here); instead the
// placed buffers are kept by the step their lifetime starts at, in a segment tree over steps
// whose nodes hold the latest last step below them. A query [first, last] descends only into
// subtrees that start no later than `last` and hold a buffer live until `first` or after, so it
// costs about log(steps) per overlapping buffer found. The overlapping set, and so the plan, is
// the same as the scan's.
class LiveIndex {
 public:
  // Lifetimes start at -1 at the earliest and end at `max_last` at the latest.
  explicit LiveIndex(int max_last) {
    const size_t positions = static_cast<size_t>(std::max(max_last, 0)) + 2;  // -1 .. max_last
    while (leaves_ < positions) leaves_ *= 2;
    latest_.assign(2 * leaves_, INT_MIN);
    starting_.resize(leaves_);
  }

  void Insert(size_t id, const PlannedBuffer& b) {
    size_t node = leaves_ + Position(b.first);
    starting_[node - leaves_].push_back(id);
    for (; node >= 1 && latest_[node] < b.last; node /= 2) latest_[node] = b.last;
  }

  // Appends to `out` every inserted buffer live at some step of [first, last].
  void Overlapping(int first, int last, const std::vector<PlannedBuffer>& buffers,
                   std::vector<size_t>* out) const {
    Collect(1, 0, leaves_ - 1, first, Position(last), buffers, out);
  }

 private:
  static size_t Position(int step) { return static_cast<size_t>(std::max(step, -1) + 1); }

  void Collect(size_t node, size_t lo, size_t hi, int first, size_t last_position,
               const std::vector<PlannedBuffer>& buffers, std::vector<size_t>* out) const {
    if (lo > last_position || latest_[node] < first) return;
    if (node >= leaves_) {
      for (size_t id : starting_[node - leaves_]) {
        if (buffers[id].last >= first) out->push_back(id);
      }
      return;
    }
    const size_t mid = lo + (hi - lo) / 2;
    Collect(2 * node, lo, mid, first, last_position, buffers, out);
    Collect(2 * node + 1, mid + 1, hi, first, last_position, buffers, out);
  }

  size_t leaves_ = 1;
  std::vector<int> latest_;                    // per node: the latest last step below it
  std::vector<std::vector<size_t>> starting_;  // per step: the buffers that start there
};

}  // namespace

MemoryPlan MemoryPlanner::Plan(const std::vector<PlannedBuffer>& buffers) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffers[a].size > buffers[b].size; });
  int max_last = 0;
  for (const PlannedBuffer& b : buffers) max_last = std::max(max_last, b.last);
  LiveIndex placed(max_last);
  std::vector<size_t> live;
  std::vector<std::pair<uint64_t, uint64_t>> busy;
  for (size_t i : order) {
    const PlannedBuffer& b = buffers[i];
    const uint64_t size = AlignUp(b.size);
    if (size == 0) continue;
    // Live neighbours sorted by offset; take the first gap that fits.
    live.clear();
    placed.Overlapping(b.first, b.last, buffers, &live);
    busy.clear();
    for (size_t j : live)
      busy.emplace_back(plan.offsets[j], plan.offsets[j] + AlignUp(buffers[j].size));
    std::sort(busy.begin(), busy.end());
    uint64_t offset = 0;
    for (const auto& [start, end] : busy) {
      if (start >= offset + size) break;
      offset = std::max(offset, end);
    }
    plan.offsets[i] = offset;
    plan.peak = std::max(plan.peak, offset + size);
    placed.Insert(i, b);
  }
  return plan;
}

uint64_t MemoryPlanner::Sequential(const std::vector<uint64_t>& sizes,
                                   std::vector<uint64_t>* offsets) {
  uint64_t total = 0;
  offsets->clear();
  for (uint64_t s : sizes) {
    offsets->push_back(total);
    total += AlignUp(s);
  }
  return total;
}

}  // namespace salus::exec
