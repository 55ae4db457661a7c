#include "exec/autodiff.h"

#include <algorithm>
#include <functional>

#include "exec/shape_inference.h"

namespace salus::exec {
namespace {

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

  // A zero constant, for an output without gradient where a formula needs one.
  ValueId Zeros(const Shape& shape) {
    Value v;
    v.name = g_.UniqueName("grad_zeros");
    v.shape = shape;
    v.kind = ValueKind::kConstant;
    v.data = HostTensor(DataType::kFloat32, shape);
    return g_.AddValue(std::move(v));
  }

  Shape shape(ValueId id) const { return id == kNoValue ? Shape{} : g_.value(id).shape; }
  Graph& graph() { return g_; }

 private:
  Graph& g_;
};

// LSTM's gradient is one SalusLstmGrad node. Inputs (kNoValue where absent): X, W, R, B,
// initial_h, initial_c, then the gradients of the forward outputs Y, Y_h, Y_c. Outputs
// (kNoValue where not needed): dX, dW, dR, dB, d_initial_h, d_initial_c, each with its forward
// input's shape. Attributes are the forward node's.
Status LstmGrad(Builder& b, const Node& n, const std::vector<ValueId>& dys,
                const std::function<bool(size_t)>& need, std::vector<ValueId>* dx) {
  if (n.input(4) != kNoValue) {
    return UnimplementedError(n.Describe() + ": no gradient with sequence_lens");
  }
  if (n.input(7) != kNoValue) {
    return UnimplementedError(n.Describe() + ": no gradient with peepholes (input P)");
  }
  auto dy = [&](size_t o) { return o < dys.size() ? dys[o] : kNoValue; };
  Node gn;
  gn.op = "SalusLstmGrad";
  gn.attrs = n.attrs;
  gn.inputs = {n.input(0), n.input(1), n.input(2), n.input(3), n.input(5),
               n.input(6), dy(0),      dy(1),      dy(2)};
  constexpr size_t kForwardInput[] = {0, 1, 2, 3, 5, 6};  // of each SalusLstmGrad output
  bool any = false;
  for (size_t i : kForwardInput) {
    const ValueId d = need(i)
                          ? b.NewValue("grad_lstm", b.shape(n.inputs[i]), ValueKind::kIntermediate)
                          : kNoValue;
    gn.outputs.push_back(d);
    if (d != kNoValue) (*dx)[i] = d;  // need(i): input i is present
    any = any || d != kNoValue;
  }
  if (any) b.EmitNode(std::move(gn));
  return OkStatus();
}

// Batched MatMul with broadcasting, and 1-D operands (Note [Batched MatMul gradient]).
//
// Note [Batched MatMul gradient]: a 1-D A is [1, K] and a 1-D B is [K, 1] (ONNX promotes them,
// then drops the added dim from Y), so dY is first reshaped to batch + [M, N]. Then
// dA = dY·B^T and dB = A^T·dY, each a broadcasting MatMul over the batch dims with Transpose
// swapping the last two dims of the other operand, summed back to the operand's own batch dims
// (SalusSumTo) and reshaped to its shape. A 2-D B (a linear layer) takes two Gemms over A's
// rows instead, without the batch-sized dB the general form sums.
Status BatchedMatMulGrad(Builder& b, const Node& n, ValueId dy,
                         const std::function<bool(size_t)>& need, std::vector<ValueId>* dx) {
  const Shape as = b.shape(n.inputs[0]), bs = b.shape(n.inputs[1]);
  if (as.empty() || bs.empty()) return InvalidArgumentError(n.Describe() + ": scalar operand");
  Shape ap = as, bp = bs;
  if (ap.size() == 1) ap.insert(ap.begin(), 1);
  if (bp.size() == 1) bp.push_back(1);
  const int64_t m = ap[ap.size() - 2], k = ap.back(), nn = bp.back();
  SALUS_ASSIGN_OR_RETURN(Shape batch, BroadcastShapes(Shape(ap.begin(), ap.end() - 2),
                                                      Shape(bp.begin(), bp.end() - 2)));
  auto with = [&](Shape s, int64_t r, int64_t c) {
    s.push_back(r);
    s.push_back(c);
    return s;
  };
  auto reshape = [&](ValueId v, const Shape& to) {
    return b.shape(v) == to ? v : b.Emit("SalusReshape", {v}, to);
  };
  // Swaps the last two dims.
  auto transpose = [&](ValueId v) {
    Shape s = b.shape(v);
    std::vector<int64_t> perm(s.size());
    for (size_t i = 0; i < s.size(); ++i) perm[i] = static_cast<int64_t>(i);
    std::swap(perm[s.size() - 2], perm[s.size() - 1]);
    std::swap(s[s.size() - 2], s[s.size() - 1]);
    return b.Emit("Transpose", {v}, s, {{"perm", IntsAttr(perm)}});
  };
  if (bs.size() == 2) {
    // A linear layer over N-D activations: rows of A against one B, two Gemms with no
    // batch-sized intermediate.
    const int64_t rows = NumElements(as) / std::max<int64_t>(k, 1);
    auto gemm = [&](ValueId x, ValueId w, bool ta, bool tb, const Shape& s) {
      return b.Emit("Gemm", {x, w}, s, {{"transA", IntAttr(ta)}, {"transB", IntAttr(tb)}});
    };
    const ValueId dy2 = reshape(dy, {rows, nn});
    if (need(0)) (*dx)[0] = reshape(gemm(dy2, n.inputs[1], false, true, {rows, k}), as);
    if (need(1)) (*dx)[1] = gemm(reshape(n.inputs[0], {rows, k}), dy2, true, false, {k, nn});
    return OkStatus();
  }
  const ValueId dyp = reshape(dy, with(batch, m, nn));
  if (need(0)) {
    ValueId d = b.Emit("MatMul", {dyp, transpose(reshape(n.inputs[1], bp))}, with(batch, m, k));
    (*dx)[0] = reshape(b.SumTo(d, ap), as);
  }
  if (need(1)) {
    ValueId d = b.Emit("MatMul", {transpose(reshape(n.inputs[0], ap)), dyp}, with(batch, k, nn));
    (*dx)[1] = reshape(b.SumTo(d, bp), bs);
  }
  return OkStatus();
}

// The gradients of the tensor and index ops of exported models: Gather, Slice, Concat, Split,
// Expand, Where, Clip, Min, Max, Pow, Erf, Gelu, Reciprocal, Pad, Trilu, Cast, LSTM. Only
// float inputs get gradients (indices, conditions and integer casts stop them).
Status TensorOpGrad(Builder& b, const Node& n, const std::vector<ValueId>& dys, ValueId dy,
                    const std::vector<bool>& needs, std::vector<ValueId>* dx) {
  const Graph& g = b.graph();
  auto need = [&](size_t i) {
    const ValueId v = n.input(i);
    return v != kNoValue && needs[v] && g.value(v).type == DataType::kFloat32;
  };
  auto in = [&](size_t i) { return n.inputs[i]; };
  const std::string& op = n.op;
  const Shape ys = b.shape(n.output(0));
  if (op == "Gather") {
    if (need(0)) {
      SALUS_ASSIGN_OR_RETURN(int64_t axis,
                             NormalizeAxis(n, n.GetInt("axis", 0), b.shape(in(0)).size()));
      (*dx)[0] = b.Emit("SalusGatherGrad", {in(1), dy}, b.shape(in(0)), {{"axis", IntAttr(axis)}});
    }
  } else if (op == "Slice") {
    if (need(0)) {
      SALUS_ASSIGN_OR_RETURN(SliceSpec spec, SliceFor(g, n));
      (*dx)[0] = b.Emit("SalusSliceGrad", {dy}, b.shape(in(0)),
                        {{"starts", IntsAttr(spec.starts)}, {"steps", IntsAttr(spec.steps)}});
    }
  } else if (op == "Concat") {
    SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), ys.size()));
    Node split;
    split.op = "SalusConcatGrad";
    split.inputs = {dy};
    split.attrs["axis"] = IntAttr(axis);
    std::vector<int64_t> sizes;
    bool any = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      sizes.push_back(b.shape(in(i))[axis]);
      split.outputs.push_back(
          need(i) ? b.NewValue("grad_concat", b.shape(in(i)), ValueKind::kIntermediate) : kNoValue);
      (*dx)[i] = split.outputs.back();
      any = any || need(i);
    }
    split.attrs["sizes"] = IntsAttr(sizes);
    if (any) b.EmitNode(std::move(split));
  } else if (op == "Split") {
    if (need(0)) {
      int64_t axis = 0;
      SALUS_RETURN_IF_ERROR(SplitSizes(g, n, &axis).status());
      std::vector<ValueId> parts;
      for (size_t o = 0; o < n.outputs.size(); ++o) {
        parts.push_back(dys[o] != kNoValue ? dys[o] : b.Zeros(b.shape(n.outputs[o])));
      }
      (*dx)[0] = parts.size() == 1
                     ? parts[0]
                     : b.Emit("Concat", parts, b.shape(in(0)), {{"axis", IntAttr(axis)}});
    }
  } else if (op == "Expand") {
    if (need(0)) (*dx)[0] = b.SumTo(dy, b.shape(in(0)));
  } else if (op == "Where") {
    if (need(1) || need(2)) {
      const ValueId zero = b.Zeros({});
      if (need(1)) {
        (*dx)[1] = b.SumTo(b.Emit("Where", {in(0), dy, zero}, ys), b.shape(in(1)));
      }
      if (need(2)) {
        (*dx)[2] = b.SumTo(b.Emit("Where", {in(0), zero, dy}, ys), b.shape(in(2)));
      }
    }
  } else if (op == "Clip") {
    // One node: dX, and the sums of dY where min and where max was taken (the bounds are
    // trainable when they are float initializers).
    Node gn;
    gn.op = "SalusClipGrad";
    gn.inputs = {in(0), n.input(1), n.input(2), dy};
    gn.attrs = n.attrs;
    bool any = false;
    for (size_t i = 0; i < 3; ++i) {
      gn.outputs.push_back(kNoValue);
      if (!need(i)) continue;
      gn.outputs.back() = b.NewValue("grad_clip", b.shape(in(i)), ValueKind::kIntermediate);
      (*dx)[i] = gn.outputs.back();
      any = true;
    }
    if (any) b.EmitNode(std::move(gn));
  } else if (op == "Min" || op == "Max") {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!need(i)) continue;
      if (n.inputs.size() == 1) {
        (*dx)[i] = dy;
        continue;
      }
      std::vector<ValueId> inputs = n.inputs;
      inputs.push_back(dy);
      ValueId d = b.Emit("SalusMinMaxGrad", inputs, ys,
                         {{"forward_op", StringAttr(op)}, {"input", IntAttr(i)}});
      (*dx)[i] = b.SumTo(d, b.shape(in(i)));
    }
  } else if (op == "Pow") {
    for (size_t i = 0; i < 2; ++i) {
      if (!need(i)) continue;
      ValueId d = b.Emit("SalusPowGrad", {in(0), in(1), dy}, ys, {{"input", IntAttr(i)}});
      (*dx)[i] = b.SumTo(d, b.shape(in(i)));
    }
  } else if (op == "Erf" || op == "Gelu" || op == "Reciprocal") {
    if (need(0)) {
      std::map<std::string, Attribute> attrs = n.attrs;
      attrs["forward_op"] = StringAttr(op);
      (*dx)[0] = b.Emit("SalusUnaryGrad", {in(0), dy}, ys, attrs);
    }
  } else if (op == "Pad") {
    // Constant mode with non-negative pads (shape inference refuses the rest); the constant
    // value is a compile-time constant.
    if (need(0)) {
      const std::vector<int64_t> pads =
          g.opset() >= 11 ? g.value(in(1)).data.ToInt64s() : n.GetInts("pads");
      (*dx)[0] = b.Emit("SalusPadGrad", {dy}, b.shape(in(0)), {{"pads", IntsAttr(pads)}});
    }
  } else if (op == "Trilu") {
    if (need(0)) (*dx)[0] = b.Emit("Trilu", {dy, n.input(1)}, ys, n.attrs);
  } else if (op == "Cast") {
    // Float to float is the identity; casts to or from integers carry no gradient.
    if (need(0) && g.value(n.outputs[0]).type == DataType::kFloat32) (*dx)[0] = dy;
  } else if (op == "LSTM") {
    return LstmGrad(b, n, dys, need, dx);
  } else {
    return UnimplementedError(n.Describe() + " has no gradient");
  }
  return OkStatus();
}

// Appends the gradients of node `n`'s inputs given `dys` (the gradient of each output,
// kNoValue where none flows) to `dx` (kNoValue where an input needs none). At least one of
// `dys` is set; `dy` is the gradient of output 0, which single-output ops always have.
Status NodeGrad(Builder& b, const Node& n, const std::vector<ValueId>& dys,
                const std::vector<bool>& needs, std::vector<ValueId>* dx) {
  dx->assign(n.inputs.size(), kNoValue);
  auto need = [&](size_t i) { return n.input(i) != kNoValue && needs[n.inputs[i]]; };
  auto in = [&](size_t i) { return n.inputs[i]; };
  const std::string& op = n.op;
  const Shape ys = b.shape(n.output(0));
  // Ops that read only output 0's gradient get zeros when only other outputs carry one;
  // Split and LSTM read `dys` themselves.
  const bool reads_dys = op == "Split" || op == "LSTM";
  const ValueId dy =
      dys[0] != kNoValue || reads_dys || n.output(0) == kNoValue ? dys[0] : b.Zeros(ys);
  if (dy == kNoValue && !reads_dys) {
    return UnimplementedError(n.Describe() + ": no gradient without output 0");
  }
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
      return BatchedMatMulGrad(b, n, dy, need, dx);
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
  } else if (op == "ReduceL2" || op == "ReduceSumSquare") {
    // d‖x‖/dx = x / ‖x‖, 0 where the norm is 0 (as PyTorch's norm backward); d(Σx²)/dx = 2x.
    if (need(0)) {
      SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReductionAxes(b.graph(), n));
      const Shape xs = b.shape(in(0));
      Shape keep = xs;
      for (int64_t a : axes) keep[a] = 1;
      ValueId per_norm = dy;
      if (op == "ReduceL2") {
        const ValueId y = n.outputs[0];
        const ValueId zero = b.Zeros({});
        Node eq;
        eq.op = "Equal";
        eq.inputs = {y, zero};
        eq.outputs = {b.NewValue("grad_norm_is_zero", b.shape(y), ValueKind::kIntermediate)};
        b.graph().value(eq.outputs[0]).type = DataType::kBool;
        const ValueId is_zero = eq.outputs[0];
        b.EmitNode(std::move(eq));
        const ValueId q = b.Emit("Div", {dy, y}, b.shape(y));
        per_norm = b.Emit("Where", {is_zero, zero, q}, b.shape(y));
      }
      const ValueId spread = b.Emit("SalusExpand", {per_norm}, xs,
                                    {{"keep_shape", IntsAttr(keep)},
                                     {"scale", FloatAttr(op == "ReduceSumSquare" ? 2.f : 1.f)}});
      (*dx)[0] = b.Emit("Mul", {in(0), spread}, xs);
    }
  } else if (op == "SalusBatchNormTrain" || op == "LayerNormalization") {
    // A training compile's BatchNormalization (training_ops.h) or a LayerNormalization:
    // one node computes dX, dScale and dBias; the statistics outputs carry no gradient.
    for (size_t o = 1; o < dys.size(); ++o) {
      if (dys[o] != kNoValue) {
        return UnimplementedError(n.Describe() + ": no gradient through output " +
                                  std::to_string(o));
      }
    }
    const bool bn = op == "SalusBatchNormTrain";
    Node gn;
    gn.op = bn ? "SalusBatchNormGrad" : "SalusLayerNormGrad";
    gn.inputs = bn ? std::vector<ValueId>{in(0), in(1), n.outputs[1], n.outputs[2], dy}
                   : std::vector<ValueId>{in(0), in(1), dy};
    gn.attrs = n.attrs;
    gn.outputs = {b.NewValue("grad_X", b.shape(in(0)), ValueKind::kIntermediate),
                  b.NewValue("grad_scale", b.shape(in(1)), ValueKind::kIntermediate),
                  n.input(2) == kNoValue
                      ? kNoValue
                      : b.NewValue("grad_B", b.shape(in(2)), ValueKind::kIntermediate)};
    for (size_t i = 0; i < 3; ++i) {
      if (need(i)) (*dx)[i] = gn.outputs[i];
    }
    b.EmitNode(std::move(gn));
  } else if (op == "SalusDropoutTrain") {
    if (need(0)) {
      (*dx)[0] = b.Emit("SalusDropoutGrad", {dy, n.outputs[1]}, ys,
                        {{"ratio", FloatAttr(n.GetFloat("ratio", 0.5f))}});
    }
  } else if (op == "SoftmaxCrossEntropyLoss") {
    if (need(0)) {
      (*dx)[0] = b.Emit("SalusSoftmaxCrossEntropyGrad", {in(0), in(1), n.input(2), dy},
                        b.shape(in(0)), n.attrs);
    }
  } else {
    return TensorOpGrad(b, n, dys, dy, needs, dx);
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
    std::vector<ValueId> dys(n.outputs.size(), kNoValue);
    bool any_grad = false;
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      if (n.outputs[o] == kNoValue) continue;
      dys[o] = grad[n.outputs[o]];
      any_grad = any_grad || dys[o] != kNoValue;
    }
    // Only float inputs that depend on a parameter take gradients: nodes with none (shape
    // arithmetic, masks from ConstantOfShape, Range or comparisons) are not differentiated.
    bool any_input = false;
    for (ValueId x : n.inputs) {
      any_input = any_input || (x != kNoValue && needs[x] && g.value(x).type == DataType::kFloat32);
    }
    if (!any_grad || !any_input) continue;
    std::vector<ValueId> dx;
    SALUS_RETURN_IF_ERROR(NodeGrad(b, n, dys, needs, &dx));
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
      // AdamW decays the parameter itself (decoupled); Adam adds L2 to the gradient.
      u.op = "SalusAdamUpdate";
      u.attrs["decoupled_weight_decay"] =
          IntAttr(opt.kind == OptimizerOptions::Kind::kAdamW ? 1 : 0);
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
