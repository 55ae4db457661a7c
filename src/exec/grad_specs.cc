#include "exec/grad_specs.h"

#include <string>

#include "exec/cpu_kernel_helpers.h"
#include "exec/dnnl_kernel.h"

namespace salus::exec {

Status ExpectNode(const Node& n, bool ok, const std::string& what) {
  return ok ? OkStatus() : InvalidArgumentError(n.Describe() + ": " + what);
}

Status ExpectInputs(const Node& n, size_t count) {
  if (n.inputs.size() < count || n.outputs.empty() || n.outputs[0] == kNoValue) {
    return InvalidArgumentError(n.Describe() + ": expects " + std::to_string(count) +
                                " inputs and an output");
  }
  return OkStatus();
}

StatusOr<GatherGeometry> GatherGradFor(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(ExpectInputs(n, 2));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {1}));
  if (g.value(n.inputs[0]).type != DataType::kInt64) {
    return UnimplementedError(n.Describe() + ": indices must be int64");
  }
  const Shape& data = g.value(n.outputs[0]).shape;
  const int64_t axis = n.GetInt("axis", 0);
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, axis >= 0 && axis < static_cast<int64_t>(data.size()), "axis out of range"));
  GatherGeometry geo;
  for (int64_t d = 0; d < axis; ++d) geo.outer *= data[d];
  geo.axis_dim = data[axis];
  for (size_t d = axis + 1; d < data.size(); ++d) geo.inner *= data[d];
  geo.count = NumElements(g.value(n.inputs[0]).shape);
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, NumElements(g.value(n.inputs[1]).shape) == geo.outer * geo.count * geo.inner,
                 "dY does not match the gathered shape"));
  return geo;
}

StatusOr<SliceGradSpec> SliceGradFor(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(ExpectInputs(n, 1));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& x = g.value(n.outputs[0]).shape;
  const Shape& y = g.value(n.inputs[0]).shape;
  const std::vector<int64_t> starts = n.GetInts("starts"), steps = n.GetInts("steps");
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, starts.size() == x.size() && steps.size() == x.size() && y.size() == x.size(),
                 "starts, steps and dY must match the input's rank"));
  SliceGradSpec s;
  if (!MakeSliceMap(x, starts, steps, y, &s.map)) {
    return UnimplementedError(n.Describe() + ": slices of more than " +
                              std::to_string(kMaxIndexDims) + " non-contiguous dims");
  }
  s.x_count = NumElements(x);
  return s;
}

StatusOr<PadGradSpec> PadGradFor(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(ExpectInputs(n, 1));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  PadGradSpec s;
  s.x = g.value(n.outputs[0]).shape;
  const Shape& y = g.value(n.inputs[0]).shape;
  const std::vector<int64_t> pads = n.GetInts("pads");
  const size_t rank = s.x.size();
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, pads.size() == 2 * rank && y.size() == rank, "pads must have 2*rank entries"));
  for (size_t d = 0; d < rank; ++d) {
    SALUS_RETURN_IF_ERROR(ExpectNode(
        n, pads[d] >= 0 && pads[d + rank] >= 0 && y[d] == s.x[d] + pads[d] + pads[d + rank],
        "pads do not match dX and dY"));
  }
  s.y_strides = DenseStrides(y);
  for (size_t d = 0; d < rank; ++d) s.base += pads[d] * s.y_strides[d];
  return s;
}

StatusOr<ConcatGradSpec> ConcatGradFor(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_RETURN_IF_ERROR(ExpectNode(n, n.inputs.size() == 1, "expects one input"));
  const Shape& y = g.value(n.inputs[0]).shape;
  const int64_t axis = n.GetInt("axis", 0);
  ConcatGradSpec s;
  s.sizes = n.GetInts("sizes");
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, axis >= 0 && axis < static_cast<int64_t>(y.size()), "axis out of range"));
  SALUS_RETURN_IF_ERROR(ExpectNode(n, s.sizes.size() == n.outputs.size(), "one size per output"));
  for (int64_t size : s.sizes) s.total += size;
  SALUS_RETURN_IF_ERROR(ExpectNode(n, s.total == y[axis], "sizes do not add up to dY's axis"));
  for (int64_t d = 0; d < axis; ++d) s.outer *= y[d];
  for (size_t d = axis + 1; d < y.size(); ++d) s.inner *= y[d];
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    if (n.outputs[k] == kNoValue) continue;
    SALUS_RETURN_IF_ERROR(
        ExpectNode(n, NumElements(g.value(n.outputs[k]).shape) == s.outer * s.sizes[k] * s.inner,
                   "output " + std::to_string(k) + " does not match its size"));
  }
  return s;
}

StatusOr<int64_t> ClipGradFor(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(ExpectNode(n, n.inputs.size() == 4 && n.outputs.size() == 3,
                                   "expects 4 inputs and 3 outputs"));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, NumElements(g.value(n.inputs[3]).shape) == count, "dY does not match X"));
  for (size_t i = 1; i < 3; ++i) {
    if (n.inputs[i] == kNoValue) {
      SALUS_RETURN_IF_ERROR(ExpectNode(n, n.outputs[i] == kNoValue, "gradient of an absent bound"));
      continue;
    }
    SALUS_RETURN_IF_ERROR(
        ExpectNode(n, NumElements(g.value(n.inputs[i]).shape) == 1, "min and max must be scalars"));
  }
  return count;
}

StatusOr<UnaryGradOp> UnaryGradFor(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(ExpectInputs(n, 2));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_RETURN_IF_ERROR(ExpectNode(
      n, NumElements(g.value(n.inputs[1]).shape) == NumElements(g.value(n.inputs[0]).shape),
      "dY does not match X"));
  const std::string fwd = n.GetString("forward_op", "");
  if (fwd == "Erf") return UnaryGradOp::kErf;
  if (fwd == "Reciprocal") return UnaryGradOp::kReciprocal;
  if (fwd == "Gelu") {
    const std::string approximate = n.GetString("approximate", "none");
    if (approximate != "none" && approximate != "tanh") {
      return InvalidArgumentError(n.Describe() + ": approximate must be 'none' or 'tanh'");
    }
    return approximate == "tanh" ? UnaryGradOp::kGeluTanh : UnaryGradOp::kGeluErf;
  }
  return UnimplementedError(n.Describe() + ": no gradient kernel for " + fwd);
}

Status RequireDropoutTrainTypes(const Node& n, const Graph& g) {
  if (n.inputs.size() < 2 || n.outputs.size() < 2 ||
      g.value(n.inputs[0]).type != DataType::kFloat32 ||
      g.value(n.outputs[0]).type != DataType::kFloat32 ||
      g.value(n.inputs[1]).type != DataType::kInt64 || n.output(1) == kNoValue ||
      g.value(n.outputs[1]).type != DataType::kBool) {
    return UnimplementedError(n.Describe() +
                              ": expects float data, an int64 counter and a bool mask");
  }
  return OkStatus();
}

}  // namespace salus::exec
