#include "exec/shape_inference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "exec/fusion.h"
#include "exec/lstm.h"
#include "exec/window.h"

namespace salus::exec {
namespace {

const std::set<std::string>& Ops() {
  // clang-format off
  static const std::set<std::string> ops = {
      "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Pow",
      "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Elu", "Softplus",
      "Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss",
      "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
      "BatchNormalization", "LayerNormalization", "Dropout",
      "Flatten", "Reshape", "Transpose", "Concat", "Identity", "Squeeze", "Unsqueeze", "Shape",
      "DepthToSpace", "Pad", "Constant",
      "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
      "ReduceSumSquare",
      "Mod", "Cast", "Range", "ConstantOfShape", "Equal", "Less", "Greater", "LessOrEqual",
      "GreaterOrEqual", "Not", "And", "Or", "Where", "Expand", "Gather", "GatherElements", "ScatterND", "Slice", "Split", "Erf",
      "Gelu", "Clip", "Min", "Max", "Trilu", "Reciprocal", "Sin", "Cos", "Atan", "Floor", "Ceil", "Round",
      "LSTM"};
  // clang-format on
  return ops;
}

const HostTensor* ConstantInput(const Graph& g, const Node& n, size_t i) {
  ValueId id = n.input(i);
  if (id == kNoValue) return nullptr;
  const Value& v = g.value(id);
  if (v.kind != ValueKind::kConstant) return nullptr;
  return &v.data;
}

Status Expect(const Node& n, bool cond, const std::string& what) {
  if (!cond) return InvalidArgumentError(n.Describe() + ": " + what);
  return OkStatus();
}

// Unimplemented naming the node, the op and the input unless input i is a compile-time constant.
StatusOr<const HostTensor*> RequireConstant(const Graph& g, const Node& n, size_t i,
                                            const std::string& what) {
  const HostTensor* t = ConstantInput(g, n, i);
  if (!t) {
    return UnimplementedError(n.Describe() + ": " + what + " must be a compile-time constant");
  }
  return t;
}

// The opset that introduced each op added after opset 7 (the oldest the engine reads).
int IntroducedIn(const std::string& op) {
  static const std::map<std::string, int> since = {
      {"Expand", 8}, {"ConstantOfShape", 9}, {"Where", 9},           {"Erf", 9},    {"Mod", 10},
      {"Range", 11}, {"LessOrEqual", 12},    {"GreaterOrEqual", 12}, {"Trilu", 14}, {"Gelu", 20}};
  auto it = since.find(op);
  return it == since.end() ? 0 : it->second;
}

// The element type of an ONNX TensorProto.DataType code the engine computes in, or kUndefined.
DataType TypeOfOnnxCode(int64_t code) {
  switch (code) {
    case 1:
      return DataType::kFloat32;
    case 7:
      return DataType::kInt64;
    case 9:
      return DataType::kBool;
    default:
      return DataType::kUndefined;
  }
}

// Range's element count, max(ceil((limit - start) / delta), 0), in exact integer arithmetic for
// int64 and in double (onnxruntime's) for float.
StatusOr<int64_t> RangeCount(const Node& n, const HostTensor& start, const HostTensor& limit,
                             const HostTensor& delta) {
  constexpr int64_t kMaxCount = int64_t{1} << 62;
  if (start.type == DataType::kInt64) {
    const __int128 s = start.int64s()[0], l = limit.int64s()[0], d = delta.int64s()[0];
    if (d == 0) return InvalidArgumentError(n.Describe() + ": delta is 0");
    const __int128 span = l - s;
    __int128 count = span / d;
    if (count * d != span && (span > 0) == (d > 0)) ++count;
    if (count < 0) count = 0;
    if (count > kMaxCount) return InvalidArgumentError(n.Describe() + ": too many elements");
    return static_cast<int64_t>(count);
  }
  const float s = start.floats()[0], l = limit.floats()[0], d = delta.floats()[0];
  if (d == 0.f) return InvalidArgumentError(n.Describe() + ": delta is 0");
  const double count = std::ceil(static_cast<double>(l - s) / d);
  if (!std::isfinite(count) || count > static_cast<double>(kMaxCount)) {
    return InvalidArgumentError(n.Describe() + ": bad or too many elements");
  }
  return count < 0 ? int64_t{0} : static_cast<int64_t>(count);
}

}  // namespace

bool IsSupportedOp(const std::string& op) { return Ops().count(op) > 0; }

std::vector<std::string> SupportedOps() { return {Ops().begin(), Ops().end()}; }

StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      return InvalidArgumentError("shapes " + ShapeString(a) + " and " + ShapeString(b) +
                                  " do not broadcast");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

StatusOr<int64_t> NormalizeAxis(const Node& node, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1)) {
    return InvalidArgumentError(node.Describe() + ": axis " + std::to_string(axis) +
                                " out of range for rank " + std::to_string(rank));
  }
  return axis < 0 ? axis + rank : axis;
}

StatusOr<std::vector<int64_t>> ReductionAxes(const Graph& graph, const Node& node) {
  const Shape& x = graph.value(node.input(0)).shape;
  const int64_t rank = static_cast<int64_t>(x.size());
  std::vector<int64_t> axes;
  // ReduceSum takes its axes as an input from opset 13, the other reductions from opset 18.
  bool axes_from_input = graph.opset() >= (node.op == "ReduceSum" ? 13 : 18);
  if (axes_from_input) {
    if (node.input(1) != kNoValue) {
      const HostTensor* t = ConstantInput(graph, node, 1);
      if (!t) {
        return UnimplementedError(node.Describe() + ": axes must be a compile-time constant");
      }
      axes = t->ToInt64s();
    }
  } else {
    axes = node.GetInts("axes");
  }
  if (axes.empty()) {
    if (node.GetInt("noop_with_empty_axes", 0) != 0) return axes;
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
    return axes;
  }
  for (int64_t& a : axes) {
    SALUS_ASSIGN_OR_RETURN(a, NormalizeAxis(node, a, rank));
  }
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  return axes;
}

StatusOr<LayerNormSpec> LayerNormFor(const Graph& graph, const Node& node) {
  const Shape& x = graph.value(node.inputs[0]).shape;
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) {
    return InvalidArgumentError(node.Describe() + ": axis out of range for input " +
                                ShapeString(x));
  }
  if (node.GetInt("stash_type", 1) != 1) {
    return UnimplementedError(node.Describe() + ": stash_type other than float");
  }
  LayerNormSpec s;
  for (int64_t d = 0; d < rank; ++d) (d < axis ? s.outer : s.inner) *= x[d];
  // The forward node's inputs are (X, Scale, B?); its gradient's (X, Scale, dY).
  const bool forward = node.op == "LayerNormalization";
  for (size_t i = 1; i < (forward ? 3u : 2u); ++i) {
    if (i == 1 && node.input(i) == kNoValue) {
      return InvalidArgumentError(node.Describe() + ": missing Scale");
    }
    if (node.input(i) != kNoValue && NumElements(graph.value(node.inputs[i]).shape) != s.inner) {
      return InvalidArgumentError(node.Describe() + (i == 1 ? ": Scale" : ": B") + " must hold " +
                                  std::to_string(s.inner) + " values");
    }
  }
  s.epsilon = node.GetFloat("epsilon", 1e-5f);
  s.bias = forward && node.input(2) != kNoValue;
  return s;
}

StatusOr<SliceSpec> SliceFor(const Graph& graph, const Node& node) {
  const Shape& x = graph.value(node.input(0)).shape;
  const int64_t rank = static_cast<int64_t>(x.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (graph.opset() < 10) {
    starts = node.GetInts("starts");
    ends = node.GetInts("ends");
    axes = node.GetInts("axes");
  } else {
    const char* names[] = {"starts", "ends", "axes", "steps"};
    std::vector<int64_t>* lists[] = {&starts, &ends, &axes, &steps};
    for (size_t i = 0; i < 4; ++i) {
      if (node.input(i + 1) == kNoValue) {
        if (i < 2) return InvalidArgumentError(node.Describe() + ": missing " + names[i]);
        continue;
      }
      SALUS_ASSIGN_OR_RETURN(const HostTensor* t, RequireConstant(graph, node, i + 1, names[i]));
      if (t->type != DataType::kInt64) {
        return InvalidArgumentError(node.Describe() + ": " + names[i] + " is not int64");
      }
      *lists[i] = t->ToInt64s();
    }
  }
  if (axes.empty()) {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      steps.size() != starts.size()) {
    return InvalidArgumentError(node.Describe() +
                                ": starts, ends, axes and steps differ in length");
  }
  SliceSpec spec;
  spec.starts.assign(rank, 0);
  spec.steps.assign(rank, 1);
  spec.out = x;
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < starts.size(); ++i) {
    SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, axes[i], rank));
    if (rank == 0 || seen[axis]) {
      return InvalidArgumentError(node.Describe() + ": repeated or bad axis " +
                                  std::to_string(axes[i]));
    }
    seen[axis] = true;
    const int64_t dim = x[axis];
    // INT64_MIN cannot be negated; any step beyond the dim takes one element.
    const int64_t step = std::max(steps[i], -std::numeric_limits<int64_t>::max());
    if (step == 0) return InvalidArgumentError(node.Describe() + ": a step is 0");
    int64_t start = starts[i], end = ends[i];
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    int64_t count;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      count = end > start ? (end - start - 1) / step + 1 : 0;
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      count = start > end ? (start - end - 1) / -step + 1 : 0;
    }
    spec.starts[axis] = count > 0 ? start : 0;
    spec.steps[axis] = step;
    spec.out[axis] = count;
  }
  return spec;
}

StatusOr<std::vector<int64_t>> SplitSizes(const Graph& graph, const Node& node, int64_t* axis) {
  const Shape& x = graph.value(node.input(0)).shape;
  SALUS_ASSIGN_OR_RETURN(*axis, NormalizeAxis(node, node.GetInt("axis", 0), x.size()));
  if (x.empty()) return InvalidArgumentError(node.Describe() + ": scalar input");
  const int64_t dim = x[*axis];
  const int64_t outputs = static_cast<int64_t>(node.outputs.size());
  std::vector<int64_t> sizes;
  if (graph.opset() < 13) {
    sizes = node.GetInts("split");
  } else if (node.input(1) != kNoValue) {
    SALUS_ASSIGN_OR_RETURN(const HostTensor* t, RequireConstant(graph, node, 1, "split"));
    if (t->type != DataType::kInt64) {
      return InvalidArgumentError(node.Describe() + ": split is not int64");
    }
    sizes = t->ToInt64s();
  }
  if (sizes.empty() && graph.opset() >= 18 && node.Has("num_outputs")) {
    // Equal chunks of ceil(dim / num_outputs); the last one takes the rest.
    const int64_t num = node.GetInt("num_outputs", 0);
    if (num < 1 || num != outputs) {
      return InvalidArgumentError(node.Describe() + ": num_outputs " + std::to_string(num) +
                                  " with " + std::to_string(outputs) + " outputs");
    }
    const int64_t chunk = (dim + num - 1) / num;
    sizes.assign(num, chunk);
    sizes.back() = dim - chunk * (num - 1);
    if (sizes.back() < 0) {
      return InvalidArgumentError(node.Describe() + ": cannot split " + std::to_string(dim) +
                                  " into " + std::to_string(num) + " chunks");
    }
  } else if (sizes.empty()) {
    if (outputs < 1 || dim % outputs != 0) {
      return InvalidArgumentError(node.Describe() + ": dim " + std::to_string(dim) +
                                  " does not split evenly into " + std::to_string(outputs));
    }
    sizes.assign(outputs, dim / outputs);
  }
  if (static_cast<int64_t>(sizes.size()) != outputs) {
    return InvalidArgumentError(node.Describe() + ": " + std::to_string(sizes.size()) +
                                " split sizes for " + std::to_string(outputs) + " outputs");
  }
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0 || __builtin_add_overflow(total, s, &total)) {
      return InvalidArgumentError(node.Describe() + ": bad split sizes");
    }
  }
  if (total != dim) {
    return InvalidArgumentError(node.Describe() + ": split sizes sum to " + std::to_string(total) +
                                ", not " + std::to_string(dim));
  }
  return sizes;
}

Status InferNodeShapes(Graph* graph, int node_index) {
  Graph& g = *graph;
  const Node& n = g.nodes()[node_index];
  auto in = [&](size_t i) -> const Value& { return g.value(n.inputs[i]); };
  auto has_in = [&](size_t i) { return n.input(i) != kNoValue; };
  auto set_out = [&](size_t i, DataType t, Shape s) {
    if (n.output(i) == kNoValue) return;
    Value& v = g.value(n.outputs[i]);
    v.type = t;
    v.shape = std::move(s);
  };
  const std::string& op = n.op;
  size_t required_inputs = 1;
  if (op == "Gemm" || op == "MatMul" || op == "Add" || op == "Sub" || op == "Mul" || op == "Div" ||
      op == "Conv" || op == "ConvTranspose" || op == "Reshape" || op == "SoftmaxCrossEntropyLoss") {
    required_inputs = 2;
  } else if (op == "Mod" || op == "Equal" || op == "Less" || op == "Greater" ||
             op == "LessOrEqual" || op == "GreaterOrEqual" || op == "And" || op == "Or" ||
             op == "Expand" || op == "Gather" || op == "GatherElements") {
    required_inputs = 2;
  } else if (op == "Where" || op == "Range" || op == "ScatterND") {
    required_inputs = 3;
  } else if (op == "BatchNormalization") {
    required_inputs = 5;
  } else if (op == "LayerNormalization") {
    required_inputs = 2;
  } else if (op == "Constant" || op == "Concat") {
    required_inputs = 0;
  }
  if (g.opset() < IntroducedIn(op)) {
    return InvalidArgumentError(n.Describe() + ": op " + op + " needs opset " +
                                std::to_string(IntroducedIn(op)) + ", the model imports " +
                                std::to_string(g.opset()));
  }
  for (size_t i = 0; i < required_inputs; ++i) {
    if (!has_in(i))
      return InvalidArgumentError(n.Describe() + ": missing input " + std::to_string(i));
  }
  // LSTM's outputs are all optional (its shape inference wants one of them).
  if (op != "LSTM" && (n.outputs.empty() || n.outputs[0] == kNoValue)) {
    return InvalidArgumentError(n.Describe() + ": no output");
  }
  const DataType t0 = required_inputs > 0 || has_in(0) ? in(0).type : DataType::kFloat32;

  auto broadcast = [&](size_t i, size_t j) -> StatusOr<Shape> {
    auto s = BroadcastShapes(in(i).shape, in(j).shape);
    if (!s.ok()) return s.status().WithContext(n.Describe());
    return s;
  };
  auto same_types = [&](size_t first, size_t count) -> Status {
    for (size_t i = first; i < first + count; ++i) {
      if (in(i).type != in(first).type) {
        return InvalidArgumentError(n.Describe() + ": inputs of types " +
                                    DataTypeName(in(first).type) + " and " +
                                    DataTypeName(in(i).type));
      }
    }
    return OkStatus();
  };
  auto type_in = [&](size_t i, std::initializer_list<DataType> types) -> Status {
    for (DataType t : types) {
      if (in(i).type == t) return OkStatus();
    }
    return UnimplementedError(n.Describe() + ": input " + std::to_string(i) + " of type " +
                              DataTypeName(in(i).type));
  };

  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Pow" || op == "Mod") {
    // Pow's exponent may have another type (from opset 12); the kernels take float only.
    if (op != "Pow") SALUS_RETURN_IF_ERROR(same_types(0, 2));
    SALUS_ASSIGN_OR_RETURN(Shape s, broadcast(0, 1));
    if (op == "Mod") {
      SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kFloat32, DataType::kInt64}));
      SALUS_RETURN_IF_ERROR(Expect(n, t0 != DataType::kFloat32 || n.GetInt("fmod", 0) == 1,
                                   "floating-point Mod needs fmod=1"));
    }
    set_out(0, t0, s);
  } else if (op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" ||
             op == "GreaterOrEqual") {
    SALUS_RETURN_IF_ERROR(same_types(0, 2));
    if (op == "Equal") {
      SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kFloat32, DataType::kInt64, DataType::kBool}));
    } else {
      SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kFloat32, DataType::kInt64}));
    }
    SALUS_ASSIGN_OR_RETURN(Shape s, broadcast(0, 1));
    set_out(0, DataType::kBool, s);
  } else if (op == "And" || op == "Or" || op == "Not") {
    const size_t count = op == "Not" ? 1 : 2;
    for (size_t i = 0; i < count; ++i) SALUS_RETURN_IF_ERROR(type_in(i, {DataType::kBool}));
    Shape s = in(0).shape;
    if (count == 2) {
      SALUS_ASSIGN_OR_RETURN(s, broadcast(0, 1));
    }
    set_out(0, DataType::kBool, s);
  } else if (op == "Where") {
    SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kBool}));
    SALUS_RETURN_IF_ERROR(same_types(1, 2));
    SALUS_ASSIGN_OR_RETURN(Shape s, broadcast(0, 1));
    auto all = BroadcastShapes(s, in(2).shape);
    if (!all.ok()) return all.status().WithContext(n.Describe());
    set_out(0, in(1).type, *all);
  } else if (op == "Min" || op == "Max") {
    SALUS_RETURN_IF_ERROR(Expect(n, !n.inputs.empty(), "no inputs"));
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      SALUS_RETURN_IF_ERROR(Expect(n, has_in(i), "missing input " + std::to_string(i)));
    }
    SALUS_RETURN_IF_ERROR(same_types(0, n.inputs.size()));
    SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kFloat32, DataType::kInt64}));
    Shape s = in(0).shape;
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      // Before opset 8 the inputs had one shape; broadcasting came with Min-8/Max-8.
      if (g.opset() < 8) SALUS_RETURN_IF_ERROR(Expect(n, in(i).shape == s, "shapes differ"));
      auto b = BroadcastShapes(s, in(i).shape);
      if (!b.ok()) return b.status().WithContext(n.Describe());
      s = *b;
    }
    set_out(0, t0, s);
  } else if (op == "Cast") {
    SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kFloat32, DataType::kInt64, DataType::kBool}));
    if (!n.Has("to") || n.attrs.at("to").kind != Attribute::Kind::kInt) {
      return InvalidArgumentError(n.Describe() + ": no integer 'to' attribute");
    }
    const DataType to = TypeOfOnnxCode(n.GetInt("to", 0));
    if (to == DataType::kUndefined) {
      return UnimplementedError(n.Describe() + ": cast to ONNX element type " +
                                std::to_string(n.GetInt("to", 0)));
    }
    set_out(0, to, in(0).shape);
  } else if (op == "Erf" || op == "Reciprocal" || op == "Gelu" || op == "Sin" || op == "Cos" ||
             op == "Atan" || op == "Floor" || op == "Ceil" || op == "Round") {
    SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kFloat32}));
    if (op == "Gelu") {
      const std::string approximate = n.GetString("approximate", "none");
      SALUS_RETURN_IF_ERROR(Expect(n, approximate == "none" || approximate == "tanh",
                                   "approximate must be 'none' or 'tanh'"));
    }
    set_out(0, t0, in(0).shape);
  } else if (op == "Clip") {
    SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kFloat32, DataType::kInt64}));
    if (g.opset() < 11) {
      SALUS_RETURN_IF_ERROR(Expect(n, t0 == DataType::kFloat32, "int64 Clip needs opset 12"));
    } else {
      for (size_t i = 1; i < 3; ++i) {
        if (!has_in(i)) continue;
        SALUS_RETURN_IF_ERROR(Expect(n, in(i).type == t0, "min/max type differs from input"));
        SALUS_RETURN_IF_ERROR(Expect(n, NumElements(in(i).shape) == 1 && in(i).shape.size() <= 1,
                                     "min/max must be scalars"));
      }
    }
    set_out(0, t0, in(0).shape);
  } else if (op == "Trilu") {
    SALUS_RETURN_IF_ERROR(Expect(n, in(0).shape.size() >= 2, "input rank below 2"));
    if (has_in(1)) {
      SALUS_RETURN_IF_ERROR(type_in(1, {DataType::kInt64}));
      SALUS_RETURN_IF_ERROR(Expect(n, NumElements(in(1).shape) == 1 && in(1).shape.size() <= 1,
                                   "k must be a scalar"));
    }
    set_out(0, t0, in(0).shape);
  } else if (op == "Range") {
    SALUS_RETURN_IF_ERROR(same_types(0, 3));
    SALUS_RETURN_IF_ERROR(type_in(0, {DataType::kFloat32, DataType::kInt64}));
    const HostTensor* args[3];
    const char* names[] = {"start", "limit", "delta"};
    for (size_t i = 0; i < 3; ++i) {
      SALUS_ASSIGN_OR_RETURN(args[i], RequireConstant(g, n, i, names[i]));
      SALUS_RETURN_IF_ERROR(Expect(n, args[i]->num_elements() == 1 && args[i]->shape.size() <= 1,
                                   std::string(names[i]) + " must be a scalar"));
    }
    SALUS_ASSIGN_OR_RETURN(int64_t count, RangeCount(n, *args[0], *args[1], *args[2]));
    set_out(0, t0, {count});
  } else if (op == "ConstantOfShape") {
    SALUS_ASSIGN_OR_RETURN(const HostTensor* shape, RequireConstant(g, n, 0, "the shape"));
    SALUS_RETURN_IF_ERROR(Expect(n, shape->type == DataType::kInt64 && shape->shape.size() == 1,
                                 "the shape must be a 1-D int64 tensor"));
    Shape dims = shape->ToInt64s();
    for (int64_t d : dims) SALUS_RETURN_IF_ERROR(Expect(n, d >= 0, "negative dim"));
    SALUS_RETURN_IF_ERROR(Expect(n, NumElements(dims) >= 0, "dims overflow"));
    DataType type = DataType::kFloat32;
    if (n.Has("value")) {
      const HostTensor& v = n.attrs.at("value").t;
      SALUS_RETURN_IF_ERROR(Expect(n, v.num_elements() == 1, "value must have one element"));
      type = v.type;
    }
    set_out(0, type, dims);
  } else if (op == "Expand") {
    SALUS_ASSIGN_OR_RETURN(const HostTensor* shape, RequireConstant(g, n, 1, "the shape"));
    SALUS_RETURN_IF_ERROR(Expect(n, shape->type == DataType::kInt64 && shape->shape.size() == 1,
                                 "the shape must be a 1-D int64 tensor"));
    Shape dims = shape->ToInt64s();
    for (int64_t d : dims) SALUS_RETURN_IF_ERROR(Expect(n, d >= 0, "negative dim"));
    auto s = BroadcastShapes(in(0).shape, dims);
    if (!s.ok()) return s.status().WithContext(n.Describe());
    set_out(0, t0, *s);
  } else if (op == "Gather") {
    const Shape& x = in(0).shape;
    const Shape& idx = in(1).shape;
    SALUS_RETURN_IF_ERROR(Expect(n, !x.empty(), "scalar data"));
    SALUS_RETURN_IF_ERROR(type_in(1, {DataType::kInt64}));
    SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), x.size()));
    if (const HostTensor* c = ConstantInput(g, n, 1)) {
      for (int64_t i : c->ToInt64s()) {
        if (i < -x[axis] || i >= x[axis]) {
          return InvalidArgumentError(n.Describe() + ": index " + std::to_string(i) +
                                      " out of range for dim " + std::to_string(x[axis]));
        }
      }
    }
    Shape out(x.begin(), x.begin() + axis);
    out.insert(out.end(), idx.begin(), idx.end());
    out.insert(out.end(), x.begin() + axis + 1, x.end());
    set_out(0, t0, out);
  } else if (op == "GatherElements") {
    // y[i0, .., ik, ..] = x[i0, .., indices[i0, .., ik, ..], ..], k the axis: y has the
    // indices' shape, which matches the data's rank and fits inside it off the axis.
    const Shape& x = in(0).shape;
    const Shape& idx = in(1).shape;
    SALUS_RETURN_IF_ERROR(Expect(n, !x.empty(), "scalar data"));
    SALUS_RETURN_IF_ERROR(type_in(1, {DataType::kInt64}));
    SALUS_RETURN_IF_ERROR(
        Expect(n, idx.size() == x.size(), "indices of another rank than the data"));
    SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), x.size()));
    for (size_t d = 0; d < x.size(); ++d) {
      SALUS_RETURN_IF_ERROR(Expect(n, static_cast<int64_t>(d) == axis || idx[d] <= x[d],
                                   "indices larger than the data off the axis"));
    }
    if (const HostTensor* c = ConstantInput(g, n, 1)) {
      for (int64_t i : c->ToInt64s()) {
        if (i < -x[axis] || i >= x[axis]) {
          return InvalidArgumentError(n.Describe() + ": index " + std::to_string(i) +
                                      " out of range for dim " + std::to_string(x[axis]));
        }
      }
    }
    set_out(0, t0, idx);
  } else if (op == "ScatterND") {
    // data with the slices the index tuples address replaced by the updates, in order.
    const Shape& x = in(0).shape;
    const Shape& idx = in(1).shape;
    SALUS_RETURN_IF_ERROR(type_in(1, {DataType::kInt64}));
    if (n.GetString("reduction", "none") != "none") {
      return UnimplementedError(n.Describe() + ": reduction " + n.GetString("reduction", "none"));
    }
    SALUS_RETURN_IF_ERROR(Expect(n, !idx.empty(), "scalar indices"));
    const int64_t k = idx.back();
    SALUS_RETURN_IF_ERROR(Expect(n, k >= 1 && k <= static_cast<int64_t>(x.size()),
                                 "index tuples longer than the data's rank"));
    Shape want(idx.begin(), idx.end() - 1);
    want.insert(want.end(), x.begin() + k, x.end());
    SALUS_RETURN_IF_ERROR(Expect(n, in(2).shape == want && in(2).type == t0,
                                 "updates of another shape or type than the slices"));
    set_out(0, t0, x);
  } else if (op == "Slice") {
    SALUS_ASSIGN_OR_RETURN(SliceSpec spec, SliceFor(g, n));
    set_out(0, t0, spec.out);
  } else if (op == "Split") {
    int64_t axis = 0;
    SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, SplitSizes(g, n, &axis));
    for (size_t i = 0; i < sizes.size(); ++i) {
      Shape s = in(0).shape;
      s[axis] = sizes[i];
      set_out(i, t0, s);
    }
  } else if (op == "Relu" || op == "LeakyRelu" || op == "Sigmoid" || op == "Tanh" ||
             op == "Identity" || op == "Exp" || op == "Log" || op == "Sqrt" || op == "Neg" ||
             op == "Abs" || op == "Elu" || op == "Softplus") {
    set_out(0, t0, in(0).shape);
  } else if (op == "Softmax" || op == "LogSoftmax") {
    const int64_t rank = in(0).shape.size();
    SALUS_ASSIGN_OR_RETURN(int64_t axis,
                           NormalizeAxis(n, n.GetInt("axis", g.opset() >= 13 ? -1 : 1), rank));
    (void)axis;
    set_out(0, t0, in(0).shape);
  } else if (op == "Dropout") {
    set_out(0, t0, in(0).shape);
    set_out(1, DataType::kBool, in(0).shape);
  } else if (op == "Gemm") {
    const Shape& a = in(0).shape;
    const Shape& b = in(1).shape;
    SALUS_RETURN_IF_ERROR(Expect(n, a.size() == 2 && b.size() == 2, "A and B must be 2-D"));
    const bool ta = n.GetInt("transA", 0) != 0, tb = n.GetInt("transB", 0) != 0;
    const int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
    const int64_t kb = tb ? b[1] : b[0], nn = tb ? b[0] : b[1];
    SALUS_RETURN_IF_ERROR(Expect(n, k == kb, "inner dimensions differ"));
    if (has_in(2)) {
      SALUS_ASSIGN_OR_RETURN(Shape c, BroadcastShapes(in(2).shape, Shape{m, nn}));
      SALUS_RETURN_IF_ERROR(Expect(n, c == Shape({m, nn}), "C does not broadcast to (M, N)"));
    }
    set_out(0, t0, {m, nn});
  } else if (op == "MatMul") {
    Shape a = in(0).shape, b = in(1).shape;
    SALUS_RETURN_IF_ERROR(Expect(n, !a.empty() && !b.empty(), "scalar operand"));
    // Operands read transposed (Note [Transposed operands] in fusion.h).
    SALUS_RETURN_IF_ERROR(ApplyMatMulTransposes(n, &a, &b));
    const bool a1 = a.size() == 1, b1 = b.size() == 1;
    if (a1) a.insert(a.begin(), 1);
    if (b1) b.push_back(1);
    SALUS_RETURN_IF_ERROR(Expect(n, a[a.size() - 1] == b[b.size() - 2], "inner dimensions differ"));
    SALUS_ASSIGN_OR_RETURN(
        Shape batch, BroadcastShapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2)));
    Shape out = batch;
    if (!a1) out.push_back(a[a.size() - 2]);
    if (!b1) out.push_back(b.back());
    set_out(0, t0, out);
  } else if (op == "Conv" || op == "ConvTranspose") {
    const Shape& x = in(0).shape;
    const Shape& w = in(1).shape;
    SALUS_RETURN_IF_ERROR(Expect(n, x.size() == w.size() && x.size() >= 3, "bad X/W rank"));
    if (x.size() != 4 && x.size() != 5) {
      return UnimplementedError(n.Describe() + ": only 2-D and 3-D convolutions");
    }
    const int64_t group = n.GetInt("group", 1);
    SALUS_RETURN_IF_ERROR(Expect(n, group >= 1 && x[1] % group == 0, "bad group"));
    std::vector<int64_t> spatial(x.begin() + 2, x.end());
    std::vector<int64_t> kernel(w.begin() + 2, w.end());
    std::vector<int64_t> ks = n.GetInts("kernel_shape");
    SALUS_RETURN_IF_ERROR(Expect(n, ks.empty() || ks == kernel, "kernel_shape differs from W"));
    if (op == "Conv") {
      SALUS_RETURN_IF_ERROR(Expect(n, w[1] * group == x[1], "W channels do not match X"));
      SALUS_RETURN_IF_ERROR(Expect(n, w[0] % group == 0, "M not divisible by group"));
      SALUS_ASSIGN_OR_RETURN(Window win, ComputeWindow(n, spatial, kernel, false));
      Shape out = {x[0], w[0]};
      out.insert(out.end(), win.out.begin(), win.out.end());
      if (has_in(2)) SALUS_RETURN_IF_ERROR(Expect(n, in(2).shape == Shape{w[0]}, "bad B"));
      set_out(0, t0, out);
    } else {
      SALUS_RETURN_IF_ERROR(Expect(n, w[0] == x[1], "W channels do not match X"));
      SALUS_ASSIGN_OR_RETURN(Window win, ComputeTransposedWindow(n, spatial, kernel));
      Shape out = {x[0], w[1] * group};
      out.insert(out.end(), win.out.begin(), win.out.end());
      if (has_in(2)) SALUS_RETURN_IF_ERROR(Expect(n, in(2).shape == Shape{w[1] * group}, "bad B"));
      set_out(0, t0, out);
    }
  } else if (op == "MaxPool" || op == "AveragePool") {
    const Shape& x = in(0).shape;
    if (x.size() != 4) return UnimplementedError(n.Describe() + ": only 2-D pooling");
    if (n.output(1) != kNoValue) {
      return UnimplementedError(n.Describe() + ": the Indices output is not supported");
    }
    if (n.GetInt("storage_order", 0) != 0) {
      return UnimplementedError(n.Describe() + ": storage_order=1");
    }
    if (op == "AveragePool" && !n.GetInts("dilations").empty()) {
      for (int64_t d : n.GetInts("dilations")) {
        if (d != 1) return UnimplementedError(n.Describe() + ": dilated average pooling");
      }
    }
    std::vector<int64_t> spatial(x.begin() + 2, x.end());
    SALUS_ASSIGN_OR_RETURN(Window win, ComputeWindow(n, spatial, n.GetInts("kernel_shape"),
                                                     n.GetInt("ceil_mode", 0) != 0));
    Shape out = {x[0], x[1]};
    out.insert(out.end(), win.out.begin(), win.out.end());
    set_out(0, t0, out);
  } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    Shape out = in(0).shape;
    SALUS_RETURN_IF_ERROR(Expect(n, out.size() >= 3, "input rank below 3"));
    for (size_t i = 2; i < out.size(); ++i) out[i] = 1;
    set_out(0, t0, out);
  } else if (op == "BatchNormalization") {
    const Shape& x = in(0).shape;
    SALUS_RETURN_IF_ERROR(Expect(n, x.size() >= 2, "input rank below 2"));
    for (size_t i = 1; i < 5; ++i) {
      SALUS_RETURN_IF_ERROR(Expect(n, in(i).shape == Shape{x[1]}, "parameter shape is not [C]"));
    }
    set_out(0, t0, x);
    const bool training = n.GetInt("training_mode", 0) != 0;
    if (!training && n.outputs.size() > 1) {
      for (size_t i = 1; i < n.outputs.size(); ++i) {
        if (n.outputs[i] != kNoValue) {
          return UnimplementedError(n.Describe() + ": extra outputs outside training mode");
        }
      }
    }
    set_out(1, t0, {x[1]});
    set_out(2, t0, {x[1]});
    if (n.output(3) != kNoValue || n.output(4) != kNoValue) {
      return UnimplementedError(n.Describe() + ": saved_mean/saved_var outputs");
    }
  } else if (op == "LayerNormalization") {
    // Y like X; Mean and InvStdDev keep X's dims before `axis` and are 1 from it on. Scale and
    // B have the normalised dims X[axis:] (leading 1s aside): one value per element of them.
    const Shape& x = in(0).shape;
    const int64_t rank = x.size();
    SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", -1), rank));
    auto strip = [](Shape s) {
      while (!s.empty() && s.front() == 1) s.erase(s.begin());
      return s;
    };
    const Shape normalised = strip(Shape(x.begin() + axis, x.end()));
    for (size_t i = 1; i < 3; ++i) {
      if (!has_in(i)) continue;
      SALUS_RETURN_IF_ERROR(Expect(n, strip(in(i).shape) == normalised,
                                   "Scale and B must have the normalised dims' shape"));
    }
    Shape stat = x;
    for (int64_t d = axis; d < rank; ++d) stat[d] = 1;
    set_out(0, t0, x);
    set_out(1, t0, stat);
    set_out(2, t0, stat);
  } else if (op == "Flatten") {
    const Shape& x = in(0).shape;
    const int64_t rank = x.size();
    int64_t axis = n.GetInt("axis", 1);
    if (axis < 0) axis += rank;
    SALUS_RETURN_IF_ERROR(Expect(n, axis >= 0 && axis <= rank, "axis out of range"));
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x[i];
    set_out(0, t0, {outer, NumElements(x) / std::max<int64_t>(outer, 1)});
    if (outer == 0) set_out(0, t0, {0, 0});
  } else if (op == "Reshape") {
    const HostTensor* shape = ConstantInput(g, n, 1);
    if (!shape) return UnimplementedError(n.Describe() + ": shape must be a compile-time constant");
    std::vector<int64_t> dims = shape->ToInt64s();
    const Shape& x = in(0).shape;
    const bool allowzero = n.GetInt("allowzero", 0) != 0;
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] == 0 && !allowzero) {
        SALUS_RETURN_IF_ERROR(Expect(n, i < x.size(), "0 dim beyond the input rank"));
        dims[i] = x[i];
      }
      if (dims[i] == -1) {
        SALUS_RETURN_IF_ERROR(Expect(n, infer < 0, "more than one -1"));
        infer = i;
      } else {
        SALUS_RETURN_IF_ERROR(Expect(n, dims[i] >= 0, "negative dim"));
        SALUS_RETURN_IF_ERROR(
            Expect(n, !__builtin_mul_overflow(known, dims[i], &known), "dims overflow"));
      }
    }
    if (infer >= 0) {
      SALUS_RETURN_IF_ERROR(Expect(n, known > 0 && NumElements(x) % known == 0, "cannot infer -1"));
      dims[infer] = NumElements(x) / known;
    }
    SALUS_RETURN_IF_ERROR(Expect(n, NumElements(dims) == NumElements(x), "element count changes"));
    set_out(0, t0, dims);
  } else if (op == "Transpose") {
    const Shape& x = in(0).shape;
    std::vector<int64_t> perm = n.GetInts("perm");
    if (perm.empty()) {
      for (int64_t i = static_cast<int64_t>(x.size()) - 1; i >= 0; --i) perm.push_back(i);
    }
    SALUS_RETURN_IF_ERROR(Expect(n, perm.size() == x.size(), "perm rank mismatch"));
    std::vector<bool> seen(x.size(), false);
    Shape out;
    for (int64_t p : perm) {
      SALUS_RETURN_IF_ERROR(Expect(n, p >= 0 && p < static_cast<int64_t>(x.size()) && !seen[p],
                                   "perm is not a permutation"));
      seen[p] = true;
      out.push_back(x[p]);
    }
    set_out(0, t0, out);
  } else if (op == "Concat") {
    SALUS_RETURN_IF_ERROR(Expect(n, !n.inputs.empty() && has_in(0), "no inputs"));
    Shape out = in(0).shape;
    SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), out.size()));
    SALUS_RETURN_IF_ERROR(Expect(n, !out.empty(), "scalar inputs"));
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      SALUS_RETURN_IF_ERROR(Expect(n, has_in(i), "missing input"));
      const Shape& s = in(i).shape;
      SALUS_RETURN_IF_ERROR(
          Expect(n, s.size() == out.size() && in(i).type == t0, "input mismatch"));
      for (size_t d = 0; d < s.size(); ++d) {
        if (static_cast<int64_t>(d) == axis) continue;
        SALUS_RETURN_IF_ERROR(Expect(n, s[d] == out[d], "input dims differ"));
      }
      out[axis] += s[axis];
    }
    set_out(0, t0, out);
  } else if (op == "DepthToSpace") {
    const Shape& x = in(0).shape;
    const int64_t b = n.GetInt("blocksize", 0);
    SALUS_RETURN_IF_ERROR(Expect(n, x.size() == 4 && b > 0 && b < (1 << 15), "bad blocksize"));
    SALUS_RETURN_IF_ERROR(Expect(n, x[1] % (b * b) == 0, "channels not divisible by blocksize^2"));
    const std::string mode = n.GetString("mode", "DCR");
    SALUS_RETURN_IF_ERROR(Expect(n, mode == "DCR" || mode == "CRD", "unknown mode"));
    set_out(0, t0, {x[0], x[1] / (b * b), x[2] * b, x[3] * b});
  } else if (op == "Pad") {
    const Shape& x = in(0).shape;
    const std::string mode = n.GetString("mode", "constant");
    if (mode != "constant") return UnimplementedError(n.Describe() + ": mode '" + mode + "'");
    std::vector<int64_t> pads;
    if (g.opset() >= 11) {
      const HostTensor* p = ConstantInput(g, n, 1);
      if (!p) return UnimplementedError(n.Describe() + ": pads must be a compile-time constant");
      pads = p->ToInt64s();
      if (has_in(2) && !ConstantInput(g, n, 2)) {
        return UnimplementedError(n.Describe() +
                                  ": constant_value must be a compile-time constant");
      }
      if (n.input(3) != kNoValue) return UnimplementedError(n.Describe() + ": the axes input");
    } else {
      pads = n.GetInts("pads");
    }
    SALUS_RETURN_IF_ERROR(Expect(n, pads.size() == 2 * x.size(), "pads must have 2*rank entries"));
    Shape out = x;
    for (size_t i = 0; i < x.size(); ++i) {
      if (pads[i] < 0 || pads[i + x.size()] < 0) {
        return UnimplementedError(n.Describe() + ": negative pads");
      }
      if (pads[i] > (int64_t{1} << 30) || pads[i + x.size()] > (int64_t{1} << 30)) {
        return InvalidArgumentError(n.Describe() + ": pads out of range");
      }
      out[i] += pads[i] + pads[i + x.size()];
    }
    set_out(0, t0, out);
  } else if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin" ||
             op == "ReduceProd" || op == "ReduceL1" || op == "ReduceL2" ||
             op == "ReduceSumSquare") {
    SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReductionAxes(g, n));
    const bool keep = n.GetInt("keepdims", 1) != 0;
    Shape out;
    const Shape& x = in(0).shape;
    for (size_t i = 0; i < x.size(); ++i) {
      bool reduced = std::find(axes.begin(), axes.end(), static_cast<int64_t>(i)) != axes.end();
      if (!reduced)
        out.push_back(x[i]);
      else if (keep)
        out.push_back(1);
    }
    set_out(0, t0, out);
  } else if (op == "Squeeze" || op == "Unsqueeze") {
    std::vector<int64_t> axes;
    if (g.opset() >= 13) {
      if (has_in(1)) {
        const HostTensor* a = ConstantInput(g, n, 1);
        if (!a) return UnimplementedError(n.Describe() + ": axes must be a compile-time constant");
        axes = a->ToInt64s();
      }
    } else {
      axes = n.GetInts("axes");
    }
    const Shape& x = in(0).shape;
    Shape out;
    if (op == "Squeeze") {
      const int64_t rank = x.size();
      std::vector<bool> drop(rank, false);
      if (axes.empty()) {
        for (int64_t i = 0; i < rank; ++i) drop[i] = x[i] == 1;
      }
      for (int64_t a : axes) {
        SALUS_ASSIGN_OR_RETURN(int64_t ax, NormalizeAxis(n, a, rank));
        SALUS_RETURN_IF_ERROR(Expect(n, x[ax] == 1, "squeezed dim is not 1"));
        drop[ax] = true;
      }
      for (int64_t i = 0; i < rank; ++i) {
        if (!drop[i]) out.push_back(x[i]);
      }
    } else {
      const int64_t rank = x.size() + axes.size();
      std::vector<bool> ins(rank, false);
      for (int64_t a : axes) {
        SALUS_ASSIGN_OR_RETURN(int64_t ax, NormalizeAxis(n, a, rank));
        SALUS_RETURN_IF_ERROR(Expect(n, !ins[ax], "repeated axis"));
        ins[ax] = true;
      }
      size_t j = 0;
      for (int64_t i = 0; i < rank; ++i) out.push_back(ins[i] ? 1 : x[j++]);
    }
    set_out(0, t0, out);
  } else if (op == "Shape") {
    const int64_t rank = in(0).shape.size();
    int64_t start = n.GetInt("start", 0), end = n.GetInt("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, 0, rank);
    set_out(0, DataType::kInt64, {std::max<int64_t>(0, end - start)});
  } else if (op == "SoftmaxCrossEntropyLoss") {
    const Shape& s = in(0).shape;
    const Shape& l = in(1).shape;
    SALUS_RETURN_IF_ERROR(Expect(n, s.size() >= 2 && l.size() + 1 == s.size(), "bad ranks"));
    SALUS_RETURN_IF_ERROR(Expect(n, l[0] == s[0], "batch mismatch"));
    for (size_t i = 1; i < l.size(); ++i) {
      SALUS_RETURN_IF_ERROR(Expect(n, l[i] == s[i + 1], "label dims mismatch"));
    }
    if (in(1).type != DataType::kInt64) {
      return UnimplementedError(n.Describe() + ": labels of type " + DataTypeName(in(1).type));
    }
    if (has_in(2)) SALUS_RETURN_IF_ERROR(Expect(n, in(2).shape == Shape{s[1]}, "bad weights"));
    const std::string red = n.GetString("reduction", "mean");
    SALUS_RETURN_IF_ERROR(
        Expect(n, red == "mean" || red == "sum" || red == "none", "bad reduction"));
    set_out(0, t0, red == "none" ? l : Shape{});
    set_out(1, t0, s);
  } else if (op == "LSTM") {
    SALUS_RETURN_IF_ERROR(InferLstmShapes(&g, n));
  } else {
    return UnimplementedError("node '" + n.name + "': op " + op + " is not supported");
  }
  for (ValueId o : n.outputs) {
    if (o != kNoValue && g.value(o).type == DataType::kUndefined) {
      return InvalidArgumentError(n.Describe() + ": undefined output type");
    }
  }
  return OkStatus();
}

StatusOr<std::string> AssignModeFor(const Graph& graph, const Node& node) {
  if (node.inputs.size() != 2 || node.input(0) == kNoValue || node.input(1) == kNoValue) {
    return InvalidArgumentError(node.Describe() + ": needs a variable and a value");
  }
  const Value& var = graph.value(node.inputs[0]);
  const Value& x = graph.value(node.inputs[1]);
  if (var.type != x.type || var.shape != x.shape) {
    return InvalidArgumentError(node.Describe() + ": assigns " + DataTypeName(x.type) +
                                ShapeString(x.shape) + " to " + DataTypeName(var.type) +
                                ShapeString(var.shape));
  }
  std::string mode = node.GetString("mode", "set");
  if (mode != "set" && mode != "add" && mode != "sub") {
    return InvalidArgumentError(node.Describe() + ": unknown mode '" + mode + "'");
  }
  return mode;
}

StatusOr<ArgMaxGeometry> ArgMaxFor(const Graph& graph, const Node& node) {
  if (node.inputs.empty() || node.input(0) == kNoValue) {
    return InvalidArgumentError(node.Describe() + ": needs an input");
  }
  const Value& x = graph.value(node.inputs[0]);
  const int64_t axis = node.GetInt("axis", 0);
  if (axis < 0 || axis >= static_cast<int64_t>(x.shape.size()) || x.shape[axis] == 0) {
    return InvalidArgumentError(node.Describe() + ": bad axis for input " + ShapeString(x.shape));
  }
  if (x.type != DataType::kFloat32 && x.type != DataType::kInt64) {
    return UnimplementedError(node.Describe() + ": " + DataTypeName(x.type) + " is not supported");
  }
  ArgMaxGeometry geo;
  geo.axis_dim = x.shape[axis];
  for (int64_t d = 0; d < axis; ++d) geo.outer *= x.shape[d];
  for (size_t d = axis + 1; d < x.shape.size(); ++d) geo.inner *= x.shape[d];
  return geo;
}

StatusOr<ArgMaxGeometry> SortFor(const Graph& graph, const Node& node) {
  SALUS_ASSIGN_OR_RETURN(ArgMaxGeometry geo, ArgMaxFor(graph, node));
  const Value& x = graph.value(node.inputs[0]);
  if (node.outputs.size() != 2 || node.outputs[0] == kNoValue || node.outputs[1] == kNoValue) {
    return InvalidArgumentError(node.Describe() + ": needs the values and indices outputs");
  }
  const Value& values = graph.value(node.outputs[0]);
  const Value& indices = graph.value(node.outputs[1]);
  if (values.type != x.type || values.shape != x.shape || indices.type != DataType::kInt64 ||
      indices.shape != x.shape) {
    return InvalidArgumentError(node.Describe() + ": outputs must be the input's type and int64, " +
                                "both of the input's shape " + ShapeString(x.shape));
  }
  return geo;
}

namespace {

// Checks that `v` (the node's `what`) is int64 with `count` elements: Philox words.
Status CheckWords(const Node& n, const Value& v, const char* what, int64_t count) {
  if (v.type != DataType::kInt64 || NumElements(v.shape) != count) {
    return InvalidArgumentError(n.Describe() + ": the " + what + " must be int64 with " +
                                std::to_string(count) + " elements, not " + DataTypeName(v.type) +
                                ShapeString(v.shape));
  }
  return OkStatus();
}

}  // namespace

StatusOr<bool> PhiloxKeyCounterFor(const Graph& graph, const Node& node) {
  if (node.inputs.size() != 1 || node.outputs.size() != 2 || node.input(0) == kNoValue ||
      node.output(0) == kNoValue || node.output(1) == kNoValue) {
    return InvalidArgumentError(node.Describe() + ": takes a seed and gives a key and a counter");
  }
  SALUS_RETURN_IF_ERROR(CheckWords(node, graph.value(node.inputs[0]), "seed", 2));
  SALUS_RETURN_IF_ERROR(CheckWords(node, graph.value(node.outputs[0]), "key", 1));
  SALUS_RETURN_IF_ERROR(CheckWords(node, graph.value(node.outputs[1]), "counter", 2));
  const int64_t seed_bits = node.GetInt("seed_bits", 64);
  if (seed_bits != 32 && seed_bits != 64) {
    return InvalidArgumentError(node.Describe() + ": seed_bits must be 32 or 64");
  }
  return seed_bits == 32;
}

StatusOr<PhiloxDraw> PhiloxDrawFor(const Graph& graph, const Node& node) {
  PhiloxDraw draw;
  if (node.op == "SalusRandomUniform") {
    draw.distribution = PhiloxDistribution::kUniform;
  } else if (node.op == "SalusRandomNormal") {
    draw.distribution = PhiloxDistribution::kNormal;
  } else if (node.op == "SalusRandomTruncatedNormal") {
    draw.distribution = PhiloxDistribution::kTruncatedNormal;
  } else {
    return InvalidArgumentError(node.Describe() + ": not a random draw");
  }
  if (node.inputs.size() != 2 || node.outputs.size() != 1 || node.input(0) == kNoValue ||
      node.input(1) == kNoValue || node.output(0) == kNoValue) {
    return InvalidArgumentError(node.Describe() + ": takes a key and a counter");
  }
  SALUS_RETURN_IF_ERROR(CheckWords(node, graph.value(node.inputs[0]), "key", 1));
  SALUS_RETURN_IF_ERROR(CheckWords(node, graph.value(node.inputs[1]), "counter", 2));
  const Value& y = graph.value(node.outputs[0]);
  if (y.type != DataType::kFloat32) {
    return UnimplementedError(node.Describe() + ": draws float32 only, not " +
                              DataTypeName(y.type));
  }
  draw.count = NumElements(y.shape);
  return draw;
}

}  // namespace salus::exec
