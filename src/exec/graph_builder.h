// Appending nodes to a Graph under construction, as the importers (ONNX, TensorFlow) do.
//
// GraphBuilder::Add appends one node whose output values already exist, then:
// 1. infers its outputs' types and shapes with the engine's rules (shape_inference.h); the
//    engine's own "Salus*" ops, which have no inference rules, come with theirs already set;
// 2. refuses any output with more than max_tensor_elements elements (InvalidArgument), and
//    ends the import past the deadline (Note [Compile budgets] in compile_limits.h);
// 3. turns a Shape node into a constant (shapes are fixed at compile time);
// 4. folds a node whose inputs are all constants: it runs once, now, on the CPU kernels, and
//    its outputs become constants, within max_constant_bytes in all (Note [What folds]).
// Every constant an importer makes is reserved here first (Reserve), so the constants of one
// compilation never hold more than max_constant_bytes, whatever the model declares.
#pragma once

#include <cstdint>
#include <string>

#include "exec/compile_limits.h"
#include "exec/graph.h"
#include "salus/status.h"

namespace salus::exec {

// Note [What folds]
// A node whose inputs are all constants runs once at compile time, on the daemon's control
// thread, so folding must stay cheap whatever the model says. Only ops whose work is linear in
// the sizes of their tensors fold; a Conv, MatMul or pooling of constants (work that grows
// with a kernel or inner dimension) runs each iteration like any other node. The bytes that
// folding creates count against the compilation's max_constant_bytes.
bool Foldable(const std::string& op);

// True when `shape` has more than `max` elements (or its element count overflows).
bool TooManyElements(const Shape& shape, int64_t max);

class GraphBuilder {
 public:
  GraphBuilder(Graph* graph, const CompileLimits& limits) : graph_(*graph), limits_(limits) {}

  // Appends `node` (steps 1-4 above). Its outputs are values of the graph (kNoValue for an
  // omitted optional output). The node may be folded away: afterwards its outputs are either
  // produced by the graph's last node or constants.
  Status Add(Node node);

  // Counts `bytes` of constants (of `what`) against max_constant_bytes before they are
  // allocated: ResourceExhausted past it, and nothing is counted.
  Status Reserve(uint64_t bytes, const std::string& what);
  // A zero-filled constant tensor of `type` and `shape`, reserved first (InvalidArgument past
  // max_tensor_elements, ResourceExhausted past max_constant_bytes).
  StatusOr<HostTensor> NewConstant(DataType type, const Shape& shape, const std::string& what);

  Graph& graph() { return graph_; }
  const CompileLimits& limits() const { return limits_; }
  uint64_t constant_bytes() const { return constant_bytes_; }

 private:
  Status Fold(int node_index);

  Graph& graph_;
  const CompileLimits limits_;
  uint64_t constant_bytes_ = 0;  // bytes of constants reserved so far
  uint64_t added_ = 0;           // nodes added so far
};

}  // namespace salus::exec
