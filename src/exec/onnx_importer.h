// ONNX import: bytes -> checked, shape-inferred, constant-folded Graph.
//
// 1. Parse the ModelProto (InvalidArgument on truncated or malformed bytes).
// 2. Fix every graph input's shape (from the options, or the model's static dims), drop stale
//    value_info, and run libonnx's checker and shape inference (InvalidArgument on failure).
// 3. Build the IR node by node in the model's (topological) order, inferring every output's
//    shape with the engine's own rules and cross-checking them against libonnx's; an op or
//    type the engine lacks is Unimplemented naming the node and the op.
// 4. Fold constants: a node whose inputs are all constants runs once, now, on the CPU kernels,
//    and its outputs become constants (so Reshape's shape, Constant nodes and the like cost
//    nothing at run time). Only ops whose work is linear in their tensors fold, and the bytes
//    folding makes are bounded (ResourceExhausted past max_constant_bytes): Note [What folds].
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "exec/compile_limits.h"
#include "exec/graph.h"
#include "salus/status.h"

namespace onnx {
class TensorProto;
}

namespace salus::exec {

struct ImportOptions {
  // Shapes of graph inputs, batch included; required for inputs with symbolic dims.
  std::map<std::string, Shape> input_shapes;
  // Graph inputs bound to values at compile time (they become constants and are folded).
  std::map<std::string, HostTensor> constant_inputs;
  // Float initializers become trainable parameters instead of foldable constants.
  bool trainable_initializers = false;
  // What the import may cost (Note [Compile budgets] in compile_limits.h).
  CompileLimits limits;
};

class OnnxImporter {
 public:
  static StatusOr<Graph> Import(const void* data, size_t size, const ImportOptions& options);
  // A TensorProto's contents (float, int64 or bool; raw or typed fields).
  static StatusOr<HostTensor> TensorFromProto(const onnx::TensorProto& proto);
  static StatusOr<DataType> TypeFromOnnx(int elem_type);
};

}  // namespace salus::exec
