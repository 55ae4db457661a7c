#include "exec/training_ops.h"

#include <cmath>
#include <string>

namespace salus::exec {
namespace {

// Note [BatchNorm running statistics]: in training, BatchNormalization normalises with the
// batch's mean and biased variance, and updates the running statistics in place each
// iteration as PyTorch does: running = momentum * running + (1 - momentum) * batch, where
// ONNX's momentum is 1 - PyTorch's. running_var takes the batch's UNBIASED variance (times
// m / (m - 1), m the number of values per channel), again as PyTorch does, so a model trained
// here and exported for inference matches one trained by PyTorch. The running statistics are
// persistent state initialised from the model's initializers: no gradient, no optimizer
// state, and a fetch of them by name returns the values after the iteration.
Status LowerBatchNorm(Graph& g, Node& n) {
  const Shape x = g.value(n.inputs[0]).shape;
  int64_t per_channel = 1;
  for (size_t d = 0; d < x.size(); ++d) {
    if (d != 1) per_channel *= x[d];
  }
  if (per_channel < 2) {
    return InvalidArgumentError(n.Describe() +
                                ": training needs more than one value per channel, got input " +
                                ShapeString(x));
  }
  for (size_t i = 3; i < 5; ++i) {
    Value& stat = g.value(n.inputs[i]);
    if (stat.kind != ValueKind::kParameter && stat.kind != ValueKind::kConstant) {
      return UnimplementedError(n.Describe() + ": running statistic '" + stat.name +
                                "' is not an initializer");
    }
    stat.kind = ValueKind::kState;  // keeps its data: InitializePersistent copies it in
  }
  const int64_t channels = x[1];
  auto saved = [&](const std::string& what) {
    Value v;
    v.name = g.UniqueName(n.name + "." + what);
    v.shape = {channels};
    return g.AddValue(std::move(v));
  };
  // Outputs: Y, the batch mean and biased variance (for the gradient), then the original
  // node's running_mean/running_var outputs, which receive the updated running statistics.
  std::vector<ValueId> outputs = {n.outputs[0], saved("batch_mean"), saved("batch_var"),
                                  n.output(1), n.output(2)};
  for (size_t o = 3; o < n.outputs.size(); ++o) {
    if (n.outputs[o] != kNoValue) {
      return UnimplementedError(n.Describe() + ": output " + std::to_string(o));
    }
  }
  n.outputs = std::move(outputs);
  n.attrs.erase("training_mode");
  n.op = "SalusBatchNormTrain";
  return OkStatus();
}

StatusOr<float> DropoutRatio(const Graph& g, const Node& n) {
  float ratio = n.GetFloat("ratio", 0.5f);
  if (n.input(1) != kNoValue) {
    const Value& r = g.value(n.inputs[1]);
    if (r.data.type != DataType::kFloat32 || r.data.bytes.size() != sizeof(float)) {
      return UnimplementedError(n.Describe() + ": ratio must be a float initializer or constant");
    }
    ratio = r.data.floats()[0];
  }
  if (!(ratio >= 0.f && ratio <= 1.f)) {
    return InvalidArgumentError(n.Describe() + ": ratio " + std::to_string(ratio) +
                                " is outside [0, 1]");
  }
  return ratio;
}

Status LowerDropout(Graph& g, Node& n, uint64_t seed, int64_t stream) {
  SALUS_ASSIGN_OR_RETURN(float ratio, DropoutRatio(g, n));
  if (n.input(1) != kNoValue && g.value(n.inputs[1]).kind == ValueKind::kParameter) {
    g.value(n.inputs[1]).kind = ValueKind::kConstant;  // a ratio is never trained
  }
  const Shape x = g.value(n.inputs[0]).shape;
  ValueId mask = n.output(1);
  if (mask == kNoValue) {
    Value v;
    v.name = g.UniqueName(n.name + ".mask");
    v.type = DataType::kBool;
    v.shape = x;
    mask = g.AddValue(std::move(v));
  }
  Value step;
  step.name = g.UniqueName(n.name + ".dropout_iteration");
  step.type = DataType::kInt64;
  step.shape = {1};
  step.kind = ValueKind::kState;
  const ValueId step_id = g.AddValue(std::move(step));

  n.attrs.clear();
  n.attrs["ratio"] = FloatAttr(ratio);
  n.attrs["seed"] = IntAttr(static_cast<int64_t>(seed));
  n.attrs["stream"] = IntAttr(stream);
  n.inputs = {n.inputs[0], step_id};
  n.outputs = {n.outputs[0], mask};
  n.op = "SalusDropoutTrain";
  return OkStatus();
}

}  // namespace

Status LowerTrainingOps(Graph* graph, uint64_t seed) {
  Graph& g = *graph;
  if (seed == 0) seed = kDefaultDropoutSeed;
  int64_t stream = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    Node& n = g.nodes()[i];
    if (n.op == "BatchNormalization") {
      SALUS_RETURN_IF_ERROR(LowerBatchNorm(g, n));
    } else if (n.op == "Dropout") {
      SALUS_RETURN_IF_ERROR(LowerDropout(g, n, seed, stream++));
    } else {
      continue;
    }
    for (ValueId o : n.outputs) {
      if (o != kNoValue) g.value(o).producer = static_cast<int>(i);
    }
  }
  return OkStatus();
}

}  // namespace salus::exec
