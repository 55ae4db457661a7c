#include "exec/memory_planner.h"

#include <algorithm>
#include <numeric>

namespace salus::exec {

MemoryPlan MemoryPlanner::Plan(const std::vector<PlannedBuffer>& buffers) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffers[a].size > buffers[b].size; });
  std::vector<size_t> placed;
  for (size_t i : order) {
    const PlannedBuffer& b = buffers[i];
    const uint64_t size = AlignUp(b.size);
    if (size == 0) continue;
    // Live neighbours sorted by offset; take the first gap that fits.
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (size_t j : placed) {
      const PlannedBuffer& o = buffers[j];
      if (o.first <= b.last && b.first <= o.last) {
        busy.emplace_back(plan.offsets[j], plan.offsets[j] + AlignUp(o.size));
      }
    }
    std::sort(busy.begin(), busy.end());
    uint64_t offset = 0;
    for (const auto& [start, end] : busy) {
      if (start >= offset + size) break;
      offset = std::max(offset, end);
    }
    plan.offsets[i] = offset;
    plan.peak = std::max(plan.peak, offset + size);
    placed.push_back(i);
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
