// What the backward kernels of the tensor ops and Dropout's training form read from their node,
// checked once for both devices: the CPU's (cpu_tensor_grad_kernels.cc, cpu_norm_kernels.cc)
// and CUDA's (cuda/train_kernels.cc) factories call these, then differ only in how they loop.
// Each returns InvalidArgument naming the node for a node autodiff would not have emitted, and
// Unimplemented for what no kernel takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/element_math.h"
#include "exec/graph.h"
#include "salus/status.h"

namespace salus::exec {

// InvalidArgument "<node>: <what>" unless `ok`.
Status ExpectNode(const Node& n, bool ok, const std::string& what);
// InvalidArgument unless the node has at least `count` inputs and an output.
Status ExpectInputs(const Node& n, size_t count);

// SalusGatherGrad: inputs (int64 indices, float dY), output dData; attribute axis (normalised).
StatusOr<GatherGeometry> GatherGradFor(const Node& n, const Graph& g);

// SalusSliceGrad: input dY, output dX (zero but for the sliced positions); attributes starts
// and steps (the forward Slice resolved over every dim).
struct SliceGradSpec {
  SliceMap map;
  int64_t x_count = 0;
};
StatusOr<SliceGradSpec> SliceGradFor(const Node& n, const Graph& g);

// SalusPadGrad: input dY, output dX = the block of dY inside the padding (attribute pads:
// begins then ends, non-negative). dX element e reads dY at base + (e's index . y_strides).
struct PadGradSpec {
  Shape x;
  Shape y_strides;
  int64_t base = 0;
};
StatusOr<PadGradSpec> PadGradFor(const Node& n, const Graph& g);

// SalusConcatGrad: input dY, output k the k-th block of `sizes` along `axis`, dY seen as
// [outer, total, inner].
struct ConcatGradSpec {
  int64_t outer = 1, inner = 1, total = 0;
  std::vector<int64_t> sizes;
};
StatusOr<ConcatGradSpec> ConcatGradFor(const Node& n, const Graph& g);

// SalusClipGrad: inputs (X, min or none, max or none, dY), outputs (dX, dMin, dMax); returns
// X's element count.
StatusOr<int64_t> ClipGradFor(const Node& n, const Graph& g);

// SalusUnaryGrad: the gradient op of its forward_op (Erf, Gelu with its approximate, Reciprocal).
StatusOr<UnaryGradOp> UnaryGradFor(const Node& n, const Graph& g);

// SalusDropoutTrain: float data, an int64 iteration counter, a bool mask output.
Status RequireDropoutTrainTypes(const Node& n, const Graph& g);

}  // namespace salus::exec
