// Shape and type inference of the engine's forward ops.
//
// The importer runs ONNX's own shape inference first (it checks the model); this is the
// engine's authority, since it must know every shape exactly once input shapes are fixed, and
// it is where an op or attribute the engine lacks is refused with Unimplemented naming the
// node and the op. Inputs that determine shapes (Reshape's shape, Pad's pads, reduction
// axes) must be compile-time constants.
#pragma once

#include <string>
#include <vector>

#include "exec/graph.h"
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

}  // namespace salus::exec
