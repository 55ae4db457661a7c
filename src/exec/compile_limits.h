// What one model's compilation may cost the process that compiles it.
//
// Note [Compile budgets]
// A model is data a client sends; compiling it must cost the daemon no more than a documented
// bound, whatever the model says. Every size a model declares is checked against these limits
// before memory is touched:
// - max_tensor_elements: any tensor (input, constant, intermediate) with more elements is
//   refused (InvalidArgument) when its shape is known, before anything of it is allocated;
// - max_constant_bytes: the host bytes of constants the compilation holds in all: data the
//   model carries (initializers, Const tensors), fills it only describes (a TensorFlow Const
//   with one value repeated, an ATen full), and what constant folding makes. An importer
//   reserves a constant's bytes (GraphBuilder::Reserve) before allocating it; past the limit
//   the compilation ends ResourceExhausted;
// - max_nodes: nodes a model may declare (ResourceExhausted), checked before any is imported;
//   work that grows faster than linearly in the node count is thereby bounded too;
// - deadline: compilation checks it between nodes and between passes and ends
//   DeadlineExceeded past it, so no model holds a compiling thread for longer.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "salus/status.h"

namespace salus::exec {

inline constexpr int64_t kDefaultMaxTensorElements = int64_t{1} << 30;
inline constexpr uint64_t kDefaultMaxConstantBytes = uint64_t{1} << 30;
inline constexpr int64_t kDefaultMaxNodes = 100'000;

struct CompileLimits {
  using TimePoint = std::chrono::steady_clock::time_point;

  int64_t max_tensor_elements = kDefaultMaxTensorElements;
  uint64_t max_constant_bytes = kDefaultMaxConstantBytes;
  int64_t max_nodes = kDefaultMaxNodes;
  TimePoint deadline = TimePoint::max();

  // ResourceExhausted when a model declaring `nodes` nodes (of `what`) is over max_nodes.
  Status CheckNodes(int64_t nodes, const std::string& what) const;
  // DeadlineExceeded once the deadline has passed; `during` says what was being done.
  Status CheckDeadline(const char* during) const;
};

}  // namespace salus::exec
