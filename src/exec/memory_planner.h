// The memory planner: buffers with lifetimes -> offsets from one base.
//
// Each lane buffer (an iteration's input, an intermediate, a kernel's scratch) is live from
// the step that defines it to the last step that reads it. Buffers are placed greedily by
// size, largest first, each at the lowest kAlignment-aligned offset where it overlaps no
// already-placed buffer whose lifetime intersects its own. The plan's peak (the largest end
// offset) is the executable's E. The persistent layout (parameters, constants, optimizer
// state) is a plain sequence of aligned offsets; its total is P.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/alignment.h"

namespace salus::exec {

struct PlannedBuffer {
  uint64_t size = 0;
  int first = 0;  // first step at which the buffer is live (may be -1: before step 0)
  int last = 0;   // last step at which it is live, inclusive
};

struct MemoryPlan {
  std::vector<uint64_t> offsets;  // one per buffer
  uint64_t peak = 0;              // E
};

class MemoryPlanner {
 public:
  static MemoryPlan Plan(const std::vector<PlannedBuffer>& buffers);
  // Sequential aligned layout; returns the total.
  static uint64_t Sequential(const std::vector<uint64_t>& sizes, std::vector<uint64_t>* offsets);
};

}  // namespace salus::exec
