// Shape and type inference of the engine's forward ops.
//
// The importer runs ONNX's own shape inference first (it checks the model); this is the
// engine's authority, since it must know every shape exactly once input shapes are fixed, and
// it is where an op or attribute the engine lacks is refused with Unimplemented naming the
// node and the op. Inputs that determine shapes (Reshape's shape, Pad's pads, reduction
// axes, Slice's starts/ends/axes/steps, Split's sizes, Expand's shape, Range's arguments,
// ConstantOfShape's input) must be compile-time constants. Each op follows ONNX's semantics of
// the graph's opset, from 7 on.
#pragma once

#include <string>
#include <vector>

#include "exec/element_math.h"
#include "exec/graph.h"
#include "exec/philox_math.h"
#include "salus/status.h"

namespace salus::exec {

// The ops the importer accepts (forward ops of the default ONNX domain).
bool IsSupportedOp(const std::string& op);
std::vector<std::string> SupportedOps();

// Sets the type and shape of every output of graph->nodes()[node_index].
Status InferNodeShapes(Graph* graph, int node_index);

// Numpy broadcasting of two shapes.
StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);

// Resolves reduction axes (attribute or constant input, per opset) to sorted positive axes.
StatusOr<std::vector<int64_t>> ReductionAxes(const Graph& graph, const Node& node);

// Normalises a possibly negative axis; InvalidArgument when out of range.
StatusOr<int64_t> NormalizeAxis(const Node& node, int64_t axis, int64_t rank);

// A Slice node resolved over its input's dims: the first input index and the step of every dim
// (0 and 1 where not sliced) and the output dims. Starts, ends, axes and steps are attributes
// before opset 10 and compile-time constant inputs from opset 10 (Unimplemented otherwise);
// starts and ends are clamped as ONNX says (to [0, dim] for positive steps, [-1, dim - 1] for
// negative ones).
struct SliceSpec {
  std::vector<int64_t> starts, steps;
  Shape out;
};
StatusOr<SliceSpec> SliceFor(const Graph& graph, const Node& node);

// A Split node's output sizes along its (normalised) axis: the `split` attribute before opset
// 13, the constant `split` input from 13, `num_outputs` chunks from 18, else equal parts.
StatusOr<std::vector<int64_t>> SplitSizes(const Graph& graph, const Node& node, int64_t* axis);

// A LayerNormalization node's X seen as [outer, inner], inner the product of the dims from
// `axis` on; Scale (and B, when given) hold `inner` values. Both devices' kernels take it.
struct LayerNormSpec {
  int64_t outer = 1, inner = 1;
  float epsilon = 1e-5f;
  bool bias = false;
};
StatusOr<LayerNormSpec> LayerNormFor(const Graph& graph, const Node& node);

// The TensorFlow-graph ops' checks, shared by both devices' kernels:
// SalusAssign's (variable, value) agree in type and shape; its mode: "set", "add" or "sub".
StatusOr<std::string> AssignModeFor(const Graph& graph, const Node& node);
// SalusArgMax's input (float32 or int64) seen around its axis.
StatusOr<ArgMaxGeometry> ArgMaxFor(const Graph& graph, const Node& node);
// SalusSort (attributes axis, descending): its input seen around the axis, after checking its
// outputs, the sorted values (the input's type and shape) and their indices (int64).
StatusOr<ArgMaxGeometry> SortFor(const Graph& graph, const Node& node);
// SalusPhiloxKeyCounter: int64 seed [2] -> key [1], counter [2]; whether the seed is int32
// (attribute seed_bits 32, else 64).
StatusOr<bool> PhiloxKeyCounterFor(const Graph& graph, const Node& node);
// SalusRandomUniform, SalusRandomNormal, SalusRandomTruncatedNormal: int64 key [1] and counter [2]
// -> float32; the output's element count and the op's distribution.
struct PhiloxDraw {
  int64_t count = 0;
  PhiloxDistribution distribution = PhiloxDistribution::kUniform;
};
StatusOr<PhiloxDraw> PhiloxDrawFor(const Graph& graph, const Node& node);

}  // namespace salus::exec
