#include "exec/graph_builder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "exec/alignment.h"
#include "exec/kernel_registry.h"
#include "exec/shape_inference.h"

namespace salus::exec {
namespace {

// Nodes imported between two reads of the compilation's deadline.
constexpr uint64_t kNodesPerDeadlineCheck = 256;

}  // namespace

bool Foldable(const std::string& op) {
  static const std::set<std::string> heavy = {"Conv",
                                              "ConvTranspose",
                                              "MatMul",
                                              "Gemm",
                                              "MaxPool",
                                              "AveragePool",
                                              "SalusConvGradData",
                                              "SalusConvGradWeights",
                                              "SalusPoolGrad"};
  return heavy.count(op) == 0;
}

bool TooManyElements(const Shape& shape, int64_t max) {
  const int64_t n = NumElements(shape);
  return n < 0 || n > max;
}

Status GraphBuilder::Fold(int node_index) {
  Graph& g = graph_;
  const Node& n = g.nodes()[node_index];
  SALUS_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> kernel,
                         KernelRegistry::Global().Create(n, g, DeviceType::kCpu));
  KernelArgs args;
  for (ValueId id : n.inputs) {
    args.inputs.push_back(id == kNoValue ? nullptr : g.value(id).data.bytes.data());
  }
  std::vector<HostTensor> outs;
  for (ValueId id : n.outputs) {
    outs.emplace_back(id == kNoValue ? DataType::kFloat32 : g.value(id).type,
                      id == kNoValue ? Shape{0} : g.value(id).shape);
  }
  for (HostTensor& t : outs) args.outputs.push_back(t.bytes.empty() ? nullptr : t.bytes.data());
  std::vector<std::byte> scratch(kernel->scratch_bytes() + kAlignment);
  args.scratch =
      scratch.data() + (kAlignment - reinterpret_cast<uintptr_t>(scratch.data()) % kAlignment);
  SALUS_RETURN_IF_ERROR(kernel->Run(args));
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] == kNoValue) continue;
    Value& v = g.value(n.outputs[i]);
    v.kind = ValueKind::kConstant;
    v.producer = -1;
    v.data = std::move(outs[i]);
  }
  return OkStatus();
}

Status GraphBuilder::Reserve(uint64_t bytes, const std::string& what) {
  const uint64_t limit = limits_.max_constant_bytes;
  if (bytes > limit || constant_bytes_ > limit - bytes) {
    return ResourceExhaustedError(fmt::format(
        "{}: {} bytes of constants would make the compilation hold {} in all, over "
        "max_constant_bytes={} (the daemon's limits.max_constant_bytes)",
        what, bytes, constant_bytes_ + std::min(bytes, UINT64_MAX - constant_bytes_), limit));
  }
  constant_bytes_ += bytes;
  return OkStatus();
}

StatusOr<HostTensor> GraphBuilder::NewConstant(DataType type, const Shape& shape,
                                               const std::string& what) {
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgumentError(what + ": negative dim in " + ShapeString(shape));
  }
  if (TooManyElements(shape, limits_.max_tensor_elements)) {
    return InvalidArgumentError(fmt::format("{}: {} has more than max_tensor_elements={} elements",
                                            what, ShapeString(shape), limits_.max_tensor_elements));
  }
  SALUS_RETURN_IF_ERROR(
      Reserve(static_cast<uint64_t>(NumElements(shape)) * ElementSize(type), what));
  return HostTensor(type, shape);
}

Status GraphBuilder::Add(Node node) {
  Graph& g = graph_;
  // The deadline is read every few nodes: a clock read per node would cost more than most.
  if (++added_ % kNodesPerDeadlineCheck == 0) {
    SALUS_RETURN_IF_ERROR(limits_.CheckDeadline("importing the model"));
  }
  const bool engine_op = node.op.rfind("Salus", 0) == 0;
  const int idx = g.AddNode(std::move(node));
  if (!engine_op) SALUS_RETURN_IF_ERROR(InferNodeShapes(&g, idx));
  const Node& added = g.nodes()[idx];
  for (ValueId o : added.outputs) {
    if (o == kNoValue) continue;
    const Value& v = g.value(o);
    if (TooManyElements(v.shape, limits_.max_tensor_elements)) {
      return InvalidArgumentError(added.Describe() + ": output '" + v.name + "' is too large");
    }
  }
  if (added.op == "Shape") {
    // Shapes are fixed at compile time: a Shape node is always a constant.
    const Shape& x = g.value(added.inputs[0]).shape;
    Value& out = g.value(added.outputs[0]);
    const int64_t rank = x.size();
    int64_t start = added.GetInt("start", 0);
    if (start < 0) start += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    std::vector<int64_t> dims(x.begin() + start, x.begin() + start + out.shape[0]);
    out.kind = ValueKind::kConstant;
    out.producer = -1;
    out.data = HostTensor::FromInt64s(out.shape, dims);
    g.nodes().pop_back();
    return OkStatus();
  }
  bool all_constant = !added.inputs.empty() && Foldable(added.op);
  for (ValueId id : added.inputs) {
    if (id != kNoValue && g.value(id).kind != ValueKind::kConstant) all_constant = false;
  }
  if (!all_constant) return OkStatus();
  uint64_t bytes = 0;
  for (ValueId o : added.outputs) bytes += o == kNoValue ? 0 : g.value(o).bytes();
  SALUS_RETURN_IF_ERROR(Reserve(bytes, added.Describe() + " folded at compile time"));
  SALUS_RETURN_IF_ERROR(Fold(idx));
  g.nodes().pop_back();
  return OkStatus();
}

}  // namespace salus::exec
