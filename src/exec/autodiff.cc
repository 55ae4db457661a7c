#include "exec/autodiff.h"

#include <algorithm>

#include "exec/shape_inference.h"

namespace salus::exec {
namespace {

Attribute IntAttr(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::kInt;
  a.i = v;
  return a;
}
Attribute FloatAttr(float v) {
  Attribute a;
  a.kind = Attribute::Kind::kFloat;
  a.f = v;
  return a;
}
Attribute StringAttr(std::string v) {
  Attribute a;
  a.kind = Attribute::Kind::kString;
  a.s = std::move(v);
  return a;
}
Attribute IntsAttr(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::kInts;
  a.ints = std::move(v);
  return a;
}

// Emits backward nodes into the graph.
class Builder {
 public:
  explicit Builder(Graph* g) : g_(*g) {}

  ValueId NewValue(const std::string& stem, const Shape& shape, ValueKind kind) {
    Value v;
    v.name = g_.UniqueName(stem);
    v.type = DataType::kFloat32;
    v.shape = shape;
    v.kind = kind;
    return g_.AddValue(std::move(v));
  }

  // One node with one float output of `shape`.
  ValueId Emit(const std::string& op, std::vector<ValueId> inputs, const Shape& shape,
               std::map<std::string, Attribute> attrs = {}) {
    ValueId out = NewValue("grad_" + op, shape, ValueKind::kIntermediate);
    Node n;
    n.op = op;
    n.name = g_.UniqueName(op);
    n.inputs = std::move(inputs);
    n.outputs = {out};
    n.attrs = std::move(attrs);
    g_.AddNode(std::move(n));
    return out;
  }

  void EmitNode(Node n) {
    n.name = g_.UniqueName(n.op);
    g_.AddNode(std::move(n));
  }

  // Sums dy over the dims along which `target` was broadcast to dy's shape.
  ValueId SumTo(ValueId dy, const Shape& target, float scale = 1.f) {
    if (g_.value(dy).shape == target && scale == 1.f) return dy;
    return Emit("SalusSumTo", {dy}, target, {{"scale", FloatAttr(scale)}});
  }

  Shape shape(ValueId id) const { return g_.value(id).shape; }
  Graph& graph() { return g_; }

 private:
  Graph& g_;
};

// Appends the gradients of node `n`'s inputs given dy (the gradient of output 0) to `dx`
// (kNoValue where an input needs none).
Status NodeGrad(Builder& b, const Node& n, ValueId dy, const std::vector<bool>& needs,
                std::vector<ValueId>* dx) {
  dx->assign(n.inputs.size(), kNoValue);
  auto need = [&](size_t i) { return n.input(i) != kNoValue && needs[n.inputs[i]]; };
  auto in = [&](size_t i) { return n.inputs[i]; };
  const std::string& op = n.op;
  const Shape ys = b.shape(n.outputs[0]);
  auto with_forward = [&](std::map<std::string, Attribute> extra) {
    std::map<std::string, Attribute> attrs = n.attrs;
    attrs["forward_op"] = StringAttr(op);
    attrs["opset"] = IntAttr(b.graph().opset());
    for (auto& [k, v] : extra) attrs[k] = v;
    return attrs;
  };
  if (op == "Add" || op == "Sub") {
    if (need(0)) (*dx)[0] = b.SumTo(dy, b.shape(in(0)));
    if (need(1)) {
      ValueId d = op == "Sub" ? b.Emit("Neg", {dy}, ys) : dy;
      (*dx)[1] = b.SumTo(d, b.shape(in(1)));
    }
  } else if (op == "Mul") {
    if (need(0)) (*dx)[0] = b.SumTo(b.Emit("Mul", {dy, in(1)}, ys), b.shape(in(0)));
    if (need(1)) (*dx)[1] = b.SumTo(b.Emit("Mul", {dy, in(0)}, ys), b.shape(in(1)));
  } else if (op == "Div") {
    if (need(0)) (*dx)[0] = b.SumTo(b.Emit("Div", {dy, in(1)}, ys), b.shape(in(0)));
    if (need(1)) {
      ValueId q = b.Emit("Div", {n.outputs[0], in(1)}, ys);
      ValueId t = b.Emit("Mul", {dy, q}, ys);
      (*dx)[1] = b.SumTo(b.Emit("Neg", {t}, ys), b.shape(in(1)));
    }
  } else if (op == "Relu" || op == "LeakyRelu" || op == "Sigmoid" || op == "Tanh" || op == "Exp" ||
             op == "Log" || op == "Sqrt" || op == "Abs" || op == "Elu" || op == "Softplus") {
    if (need(0)) (*dx)[0] = b.Emit("SalusEltwiseGrad", {in(0), dy}, ys, with_forward({}));
  } else if (op == "Neg") {
    if (need(0)) (*dx)[0] = b.Emit("Neg", {dy}, ys);
  } else if (op == "Softmax" || op == "LogSoftmax") {
    if (need(0)) (*dx)[0] = b.Emit("SalusSoftmaxGrad", {n.outputs[0], dy}, ys, with_forward({}));
  } else if (op == "Gemm" || op == "MatMul") {
    const bool ta = n.GetInt("transA", 0) != 0, tb = n.GetInt("transB", 0) != 0;
    if (op == "MatMul" && (b.shape(in(0)).size() != 2 || b.shape(in(1)).size() != 2)) {
      return UnimplementedError("node '" + n.name + "': op MatMul gradient beyond 2-D operands");
    }
    const float alpha = n.GetFloat("alpha", 1.f), beta = n.GetFloat("beta", 1.f);
    auto gemm = [&](ValueId a, ValueId c, bool t1, bool t2, const Shape& s) {
      return b.Emit(
          "Gemm", {a, c}, s,
          {{"transA", IntAttr(t1)}, {"transB", IntAttr(t2)}, {"alpha", FloatAttr(alpha)}});
    };
    if (need(0)) {
      (*dx)[0] = ta ? gemm(in(1), dy, tb, true, b.shape(in(0)))
                    : gemm(dy, in(1), false, !tb, b.shape(in(0)));
    }
    if (need(1)) {
      (*dx)[1] = tb ? gemm(dy, in(0), true, ta, b.shape(in(1)))
                    : gemm(in(0), dy, !ta, false, b.shape(in(1)));
    }
    if (op == "Gemm" && need(2)) (*dx)[2] = b.SumTo(dy, b.shape(in(2)), beta);
  } else if (op == "Conv") {
    if (need(0)) {
      (*dx)[0] = b.Emit("SalusConvGradData", {dy, in(1)}, b.shape(in(0)),
                        with_forward({{"x_shape", IntsAttr(b.shape(in(0)))}}));
    }
    if (need(1) || need(2)) {
      Node gw;
      gw.op = "SalusConvGradWeights";
      gw.inputs = {in(0), dy};
      gw.attrs = with_forward({{"w_shape", IntsAttr(b.shape(in(1)))}});
      ValueId dw = b.NewValue("grad_W", b.shape(in(1)), ValueKind::kIntermediate);
      gw.outputs = {dw};
      if (n.input(2) != kNoValue) {
        ValueId db = b.NewValue("grad_B", b.shape(in(2)), ValueKind::kIntermediate);
        gw.outputs.push_back(db);
        if (need(2)) (*dx)[2] = db;
      }
      b.EmitNode(std::move(gw));
      if (need(1)) (*dx)[1] = dw;
    }
  } else if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" ||
             op == "GlobalMaxPool") {
    if (need(0)) (*dx)[0] = b.Emit("SalusPoolGrad", {in(0), dy}, b.shape(in(0)), with_forward({}));
  } else if (op == "Flatten" || op == "Reshape" || op == "Identity" || op == "Squeeze" ||
             op == "Unsqueeze" || op == "Dropout") {
    if (need(0)) (*dx)[0] = b.Emit("SalusReshape", {dy}, b.shape(in(0)));
  } else if (op == "Transpose") {
    std::vector<int64_t> perm = n.GetInts("perm");
    const size_t rank = b.shape(in(0)).size();
    if (perm.empty()) {
      for (size_t i = 0; i < rank; ++i) perm.push_back(rank - 1 - i);
    }
    std::vector<int64_t> inv(rank);
    for (size_t i = 0; i < rank; ++i) inv[perm[i]] = i;
    if (need(0)) (*dx)[0] = b.Emit("Transpose", {dy}, b.shape(in(0)), {{"perm", IntsAttr(inv)}});
  } else if (op == "DepthToSpace") {
    if (need(0)) (*dx)[0] = b.Emit("SalusDepthToSpaceGrad", {dy}, b.shape(in(0)), n.attrs);
  } else if (op == "ReduceMean" || op == "ReduceSum") {
    if (need(0)) {
      SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReductionAxes(b.graph(), n));
      Shape keep = b.shape(in(0));
      int64_t count = 1;
      for (int64_t a : axes) {
        count *= keep[a];
        keep[a] = 1;
      }
      const float scale =
          op == "ReduceMean" ? 1.f / static_cast<float>(std::max<int64_t>(count, 1)) : 1.f;
      (*dx)[0] = b.Emit("SalusExpand", {dy}, b.shape(in(0)),
                        {{"keep_shape", IntsAttr(keep)}, {"scale", FloatAttr(scale)}});
    }
  } else if (op == "SoftmaxCrossEntropyLoss") {
    if (need(0)) {
      (*dx)[0] = b.Emit("SalusSoftmaxCrossEntropyGrad", {in(0), in(1), n.input(2), dy},
                        b.shape(in(0)), n.attrs);
    }
  } else {
    return UnimplementedError("node '" + n.name + "': op " + op + " has no gradient");
  }
  return OkStatus();
}

}  // namespace

Status Autodiff::Apply(Graph* graph, ValueId loss, const OptimizerOptions& opt) {
  Graph& g = *graph;
  const size_t num_forward = g.nodes().size();
  // Values that depend on a parameter.
  std::vector<bool> needs(g.values().size(), false);
  for (ValueId id = 0; id < static_cast<ValueId>(g.values().size()); ++id) {
    needs[id] = g.value(id).kind == ValueKind::kParameter;
  }
  for (size_t i = 0; i < num_forward; ++i) {
    const Node& n = g.nodes()[i];
    bool any = false;
    for (ValueId in : n.inputs) any = any || (in != kNoValue && needs[in]);
    for (ValueId o : n.outputs) {
      if (o != kNoValue) needs[o] = any;
    }
  }
  if (!needs[loss]) return InvalidArgumentError("the loss does not depend on any parameter");

  Builder b(graph);
  std::vector<ValueId> grad(g.values().size(), kNoValue);
  {
    Value one;
    one.name = g.UniqueName("grad_seed");
    one.shape = g.value(loss).shape;
    one.kind = ValueKind::kConstant;
    one.data = HostTensor::FromFloats(one.shape, {1.f});
    grad[loss] = g.AddValue(std::move(one));
  }
  for (size_t i = num_forward; i-- > 0;) {
    const Node n = g.nodes()[i];  // a copy: emitting nodes grows the vector
    if (n.outputs.empty() || n.outputs[0] == kNoValue || grad[n.outputs[0]] == kNoValue) continue;
    for (size_t o = 1; o < n.outputs.size(); ++o) {
      if (n.outputs[o] != kNoValue && grad[n.outputs[o]] != kNoValue) {
        return UnimplementedError("node '" + n.name + "': op " + n.op +
                                  " has no gradient through output " + std::to_string(o));
      }
    }
    std::vector<ValueId> dx;
    SALUS_RETURN_IF_ERROR(NodeGrad(b, n, grad[n.outputs[0]], needs, &dx));
    grad.resize(g.values().size(), kNoValue);
    for (size_t k = 0; k < dx.size(); ++k) {
      if (dx[k] == kNoValue) continue;
      ValueId x = n.inputs[k];
      if (grad[x] == kNoValue) {
        grad[x] = dx[k];
      } else {
        grad[x] = b.Emit("Add", {grad[x], dx[k]}, g.value(x).shape);
      }
    }
    grad.resize(g.values().size(), kNoValue);
  }

  // Optimizer updates, in place in persistent memory.
  const size_t num_values = g.values().size();
  for (ValueId p = 0; p < static_cast<ValueId>(num_values); ++p) {
    if (g.value(p).kind != ValueKind::kParameter || grad[p] == kNoValue) continue;
    const Shape shape = g.value(p).shape;
    const std::string name = g.value(p).name;
    Node u;
    u.inputs = {p, grad[p]};
    u.attrs["lr"] = FloatAttr(opt.learning_rate);
    u.attrs["weight_decay"] = FloatAttr(opt.weight_decay);
    if (opt.kind == OptimizerOptions::Kind::kSgd) {
      u.op = "SalusSgdUpdate";
      u.attrs["momentum"] = FloatAttr(opt.momentum);
      u.attrs["nesterov"] = IntAttr(opt.nesterov ? 1 : 0);
      if (opt.momentum != 0.f)
        u.inputs.push_back(b.NewValue(name + ".velocity", shape, ValueKind::kState));
    } else {
      u.op = "SalusAdamUpdate";
      u.attrs["beta1"] = FloatAttr(opt.beta1);
      u.attrs["beta2"] = FloatAttr(opt.beta2);
      u.attrs["epsilon"] = FloatAttr(opt.epsilon);
      u.inputs.push_back(b.NewValue(name + ".m", shape, ValueKind::kState));
      u.inputs.push_back(b.NewValue(name + ".v", shape, ValueKind::kState));
      u.inputs.push_back(b.NewValue(name + ".step", {1}, ValueKind::kState));
    }
    b.EmitNode(std::move(u));
  }
  return OkStatus();
}

}  // namespace salus::exec
