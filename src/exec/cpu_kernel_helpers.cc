#include "exec/cpu_kernel_helpers.h"

#include <cmath>

#include "exec/dnnl_kernel.h"
#include "exec/fusion.h"
#include "exec/window.h"

namespace salus::exec {

using dnnl::algorithm;

Status RequireFloat(const Node& n, const Graph& g, std::initializer_list<size_t> inputs) {
  auto check = [&](ValueId id) -> Status {
    if (id == kNoValue) return OkStatus();
    const Value& v = g.value(id);
    if (v.type != DataType::kFloat32) {
      return UnimplementedError("node '" + n.name + "': op " + n.op + " on " +
                                DataTypeName(v.type) + " tensor '" + v.name + "'");
    }
    return OkStatus();
  };
  // Pooling taps are int64 (Note [Pooling taps]); the kernels check them.
  const bool taps = n.op == "SalusPoolGrad" || n.op == "SalusMaxPool";
  if (inputs.size() == 0) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (taps && i == 2) continue;
      SALUS_RETURN_IF_ERROR(check(n.inputs[i]));
    }
  } else {
    for (size_t i : inputs) SALUS_RETURN_IF_ERROR(check(n.input(i)));
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if ((n.op == "Dropout" || taps) && i == 1) continue;
    SALUS_RETURN_IF_ERROR(check(n.outputs[i]));
  }
  return OkStatus();
}

StatusOr<PadSpec> PadSpecOf(const Node& n, const Graph& g) {
  PadSpec p;
  p.int64 = g.value(n.inputs[0]).type == DataType::kInt64;
  if (!p.int64) {
    SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {0, 2}));
  } else if (n.input(2) != kNoValue && g.value(n.inputs[2]).type != DataType::kInt64) {
    return UnimplementedError(n.Describe() + ": an int64 tensor padded with a " +
                              DataTypeName(g.value(n.inputs[2]).type) + " value");
  }
  if (g.opset() >= 11) {
    p.pads = g.value(n.inputs[1]).data.ToInt64s();
    if (n.input(2) != kNoValue) {
      const HostTensor& v = g.value(n.inputs[2]).data;
      if (p.int64) {
        p.int_value = v.ToInt64s()[0];
      } else {
        p.float_value = v.floats()[0];
      }
    }
  } else {
    p.pads = n.GetInts("pads");
    p.float_value = n.GetFloat("value", 0.f);
    p.int_value = static_cast<int64_t>(p.float_value);
  }
  return p;
}

Status RequireDropoutIsIdentity(const Node& n, const Graph& g) {
  float ratio = n.GetFloat("ratio", 0.5f);
  if (n.input(1) != kNoValue) {
    const Value& r = g.value(n.inputs[1]);
    if (r.kind != ValueKind::kConstant) {
      return UnimplementedError(n.Describe() + ": ratio must be a compile-time constant");
    }
    ratio = r.data.floats()[0];
  }
  bool training = false;
  if (n.input(2) != kNoValue) {
    const Value& t = g.value(n.inputs[2]);
    if (t.kind != ValueKind::kConstant) {
      return UnimplementedError(n.Describe() + ": training_mode must be a constant");
    }
    training = t.data.bytes.size() > 0 && t.data.bytes[0] != std::byte{0};
  }
  if (training && ratio != 0.f) {
    return UnimplementedError(n.Describe() + ": random dropout in training mode");
  }
  return OkStatus();
}

dnnl::memory::desc AnyLayout(const dnnl::memory::desc& d) {
  return dnnl::memory::desc(d.dims(), dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
}

StatusOr<EltwiseSpec> EltwiseFor(const Node& n) {
  const std::string op = n.GetString("forward_op", n.op);
  if (op == "Relu") return EltwiseSpec{algorithm::eltwise_relu, 0.f, 0.f};
  if (op == "LeakyRelu")
    return EltwiseSpec{algorithm::eltwise_relu, n.GetFloat("alpha", 0.01f), 0.f};
  if (op == "Sigmoid") return EltwiseSpec{algorithm::eltwise_logistic, 0.f, 0.f};
  if (op == "Tanh") return EltwiseSpec{algorithm::eltwise_tanh, 0.f, 0.f};
  if (op == "Exp") return EltwiseSpec{algorithm::eltwise_exp, 0.f, 0.f};
  if (op == "Log") return EltwiseSpec{algorithm::eltwise_log, 0.f, 0.f};
  if (op == "Sqrt") return EltwiseSpec{algorithm::eltwise_sqrt, 0.f, 0.f};
  if (op == "Neg") return EltwiseSpec{algorithm::eltwise_linear, -1.f, 0.f};
  if (op == "Abs") return EltwiseSpec{algorithm::eltwise_abs, 0.f, 0.f};
  if (op == "Elu") return EltwiseSpec{algorithm::eltwise_elu, n.GetFloat("alpha", 1.f), 0.f};
  if (op == "Softplus") return EltwiseSpec{algorithm::eltwise_soft_relu, 0.f, 0.f};
  if (op == "Gelu") {
    return EltwiseSpec{n.GetString("approximate", "none") == "tanh" ? algorithm::eltwise_gelu_tanh
                                                                    : algorithm::eltwise_gelu_erf,
                       0.f, 0.f};
  }
  if (op == "Reciprocal") return EltwiseSpec{algorithm::eltwise_pow, 1.f, -1.f};  // 1 * x^-1
  return UnimplementedError("node '" + n.name + "': op " + op + " is not an eltwise op");
}

std::unique_ptr<Kernel> EltwiseBackwardKernel(const EltwiseSpec& spec, const Shape& shape) {
  auto md = PlainDesc(shape);
  dnnl::eltwise_forward::primitive_desc fwd(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, spec.alg, md, spec.alpha,
                                  spec.beta),
      CpuEngine());
  dnnl::eltwise_backward::primitive_desc pd(
      dnnl::eltwise_backward::desc(spec.alg, md, md, spec.alpha, spec.beta), UserScratchpad(),
      CpuEngine(), fwd);
  auto k = std::make_unique<DnnlKernel>();
  k->AddPrimitive(dnnl::eltwise_backward(pd),
                  {{DNNL_ARG_SRC, md, Slot::In(0)},
                   {DNNL_ARG_DIFF_DST, md, Slot::In(1)},
                   {DNNL_ARG_DIFF_SRC, md, Slot::Out(0)}},
                  pd.scratchpad_desc().get_size());
  return k;
}

StatusOr<SoftmaxSpec> SoftmaxFor(const Node& n, const Graph& g, ValueId x) {
  if (x == kNoValue) x = n.inputs[0];
  const Shape& s = g.value(x).shape;
  const int64_t rank = s.size();
  const int opset = static_cast<int>(n.GetInt("opset", g.opset()));
  int64_t axis = n.GetInt("axis", opset >= 13 ? -1 : 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= std::max<int64_t>(rank, 1)) {
    return InvalidArgumentError(n.Describe() + ": axis out of range");
  }
  SoftmaxSpec spec;
  if (rank == 0) {
    spec.shape = {1};
    spec.axis = 0;
  } else if (opset >= 13) {
    spec.shape = s;
    spec.axis = static_cast<int>(axis);
  } else {
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= s[i];
    spec.shape = {outer, NumElements(s) / std::max<int64_t>(outer, 1)};
    spec.axis = 1;
  }
  return spec;
}

namespace {

dnnl::memory::desc NhwcDesc(const dnnl::memory::desc& plain) {
  return dnnl::memory::desc(plain.dims(), dnnl::memory::data_type::f32,
                            dnnl::memory::format_tag::nhwc);
}

}  // namespace

dnnl::memory::desc PoolLayout(const Node& n, const dnnl::memory::desc& plain) {
  if (plain.dims().size() != 4) return plain;
  if (n.GetInt(kChannelsLastAttr, 0) != 0) return plain;  // NHWC already (PoolFor)
  return BlockedDesc(plain.dims(), CpuChannelBlock());
}

Shape ActivationShape(const Node& n, const Shape& shape) {
  return n.GetInt(kChannelsLastAttr, 0) != 0 ? NchwOf(shape) : shape;
}

Shape FilterShape(const Node& n, const Shape& shape) {
  return n.GetInt(kFilterHwioAttr, 0) != 0 ? OihwOf(shape) : shape;
}

StatusOr<ConvSpec> ConvFor(const Node& n, const Shape& xs, const Shape& ws, const std::string& op) {
  const int64_t group = n.GetInt("group", 1);
  std::vector<int64_t> spatial(xs.begin() + 2, xs.end()), kernel(ws.begin() + 2, ws.end());
  ConvSpec c;
  Window win;
  Shape out;
  if (op == "Conv") {
    SALUS_ASSIGN_OR_RETURN(win, ComputeWindow(n, spatial, kernel, false));
    out = {xs[0], ws[0]};
    if (group == 1) {
      c.weights = PlainDesc(ws);
    } else {
      Shape gw = {group, ws[0] / group};
      gw.insert(gw.end(), ws.begin() + 1, ws.end());
      c.weights = PlainDesc(gw);
    }
    c.bias = PlainDesc({ws[0]});
  } else {
    SALUS_ASSIGN_OR_RETURN(win, ComputeTransposedWindow(n, spatial, kernel));
    // W is [C_in, C_out / group, k...], read as oneDNN's [(group,) oc, ic, k...].
    const int64_t ocg = ws[1], icg = ws[0] / group, khw = NumElements(kernel);
    out = {xs[0], ocg * group};
    Shape dims = {ocg, icg}, strides = {khw, ocg * khw};
    dims.insert(dims.end(), kernel.begin(), kernel.end());
    int64_t step = 1;
    Shape kernel_strides(kernel.size());
    for (size_t d = kernel.size(); d-- > 0;) {
      kernel_strides[d] = step;
      step *= kernel[d];
    }
    strides.insert(strides.end(), kernel_strides.begin(), kernel_strides.end());
    if (group > 1) {
      dims.insert(dims.begin(), group);
      strides.insert(strides.begin(), icg * ocg * khw);
    }
    c.weights = StridedDesc(dims, strides);
    c.bias = PlainDesc({ocg * group});
  }
  out.insert(out.end(), win.out.begin(), win.out.end());
  c.src = PlainDesc(xs);
  c.dst = PlainDesc(out);
  if (n.GetInt(kChannelsLastAttr, 0) != 0 && xs.size() == 4) {
    // Note [Channels-last convolutions]: the same dims, laid out NHWC.
    c.src = NhwcDesc(c.src);
    c.dst = NhwcDesc(c.dst);
  }
  if (n.GetInt(kFilterHwioAttr, 0) != 0 && op == "Conv" && ws.size() == 4) {
    // An HWIO filter of OIHW dims ws: element (o, i, h, w) at ((h * kw + w) * I + i) * O + o,
    // I the input channels per group and O all the outputs; grouped, [G, O / G, I, kh, kw].
    const int64_t O = ws[0], I = ws[1], kw = ws[3];
    if (group == 1) {
      c.weights = StridedDesc(ws, {1, O, kw * I * O, I * O});
    } else {
      c.weights =
          StridedDesc({group, O / group, I, ws[2], kw}, {O / group, 1, O, kw * I * O, I * O});
    }
  }
  for (size_t i = 0; i < win.rank(); ++i) {
    c.strides.push_back(win.strides[i]);
    c.dilates.push_back(win.dilations[i] - 1);
    c.pad_l.push_back(win.pad_begin[i]);
    c.pad_r.push_back(win.pad_end[i]);
  }
  return c;
}

StatusOr<PoolSpec> PoolFor(const Node& n, const Shape& xs, const std::string& op) {
  std::vector<int64_t> spatial(xs.begin() + 2, xs.end());
  PoolSpec p;
  Shape out = {xs[0], xs[1]};
  if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    p.alg = op == "GlobalMaxPool" ? algorithm::pooling_max : algorithm::pooling_avg_exclude_padding;
    for (int64_t s : spatial) {
      out.push_back(1);
      p.kernel.push_back(s);
      p.strides.push_back(1);
      p.dilation.push_back(0);
      p.pad_l.push_back(0);
      p.pad_r.push_back(0);
    }
  } else {
    SALUS_ASSIGN_OR_RETURN(Window win, ComputeWindow(n, spatial, n.GetInts("kernel_shape"),
                                                     n.GetInt("ceil_mode", 0) != 0));
    if (op == "MaxPool") {
      p.alg = algorithm::pooling_max;
    } else {
      p.alg = n.GetInt("count_include_pad", 0) != 0 ? algorithm::pooling_avg_include_padding
                                                    : algorithm::pooling_avg_exclude_padding;
      if (n.GetInt("ceil_mode", 0) != 0 && n.GetInt("count_include_pad", 0) != 0) {
        return UnimplementedError(n.Describe() + ": ceil_mode with count_include_pad");
      }
    }
    out.insert(out.end(), win.out.begin(), win.out.end());
    for (size_t i = 0; i < win.rank(); ++i) {
      p.kernel.push_back(win.kernel[i]);
      p.strides.push_back(win.strides[i]);
      p.dilation.push_back(win.dilations[i] - 1);
      p.pad_l.push_back(win.pad_begin[i]);
      p.pad_r.push_back(win.pad_end[i]);
    }
  }
  p.src = PlainDesc(xs);
  p.dst = PlainDesc(out);
  if (n.GetInt(kChannelsLastAttr, 0) != 0 && xs.size() == 4) {
    // Note [Channels-last convolutions]: the same dims, laid out NHWC.
    p.src = NhwcDesc(p.src);
    p.dst = NhwcDesc(p.dst);
  }
  return p;
}

bool WorkspaceFitsTaps(const dnnl::memory::desc& workspace, const Shape& y) {
  const int64_t elements = NumElements(y);
  return elements > 0 && workspace.get_size() <= static_cast<size_t>(elements) * sizeof(int64_t);
}

Status CheckPoolTaps(const Node& n, const Graph& g) {
  const bool forward = n.op == "SalusMaxPool";
  const ValueId taps = forward ? n.output(1) : n.input(2);
  if (!forward && taps == kNoValue) return OkStatus();
  const Shape& pooled = forward ? g.value(n.outputs[0]).shape : g.value(n.inputs[1]).shape;
  const bool fits =
      taps != kNoValue && g.value(taps).type == DataType::kInt64 && g.value(taps).shape == pooled;
  if (forward) {
    if (!fits) return InvalidArgumentError(n.Describe() + ": Taps must have the output's shape");
    return OkStatus();
  }
  const std::string op = n.GetString("forward_op", "");
  if (!fits || (op != "MaxPool" && op != "GlobalMaxPool")) {
    return InvalidArgumentError(n.Describe() + ": taps of a pooling that is not SalusMaxPool's");
  }
  return OkStatus();
}

void DepthToSpaceMap(const Shape& x, int64_t b, bool dcr,
                     const std::function<void(int64_t, int64_t)>& fn) {
  const DepthToSpaceGeometry geo{x[0], x[1], x[2], x[3], b, dcr};
  const int64_t count = DepthToSpaceCount(geo);
  for (int64_t in = 0; in < count; ++in) fn(in, DepthToSpaceTarget(geo, in));
}

StatusOr<SceSpec> SceFor(const Node& n, const Graph& g) {
  const Shape& s = g.value(n.inputs[0]).shape;
  SceSpec spec;
  spec.n = s[0];
  spec.c = s[1];
  for (size_t i = 2; i < s.size(); ++i) spec.d *= s[i];
  spec.has_ignore = n.Has("ignore_index");
  spec.ignore_index = n.GetInt("ignore_index", 0);
  const std::string red = n.GetString("reduction", "mean");
  spec.reduction = red == "mean" ? 0 : red == "sum" ? 1 : 2;
  return spec;
}

void SceForward(const SceSpec& s, const float* scores, const int64_t* labels, const float* weights,
                float* logp, float* loss) {
  double total = 0, weight_sum = 0;
  for (int64_t r = 0; r < s.n * s.d; ++r) {
    const SceTerm t = SceRow(s, scores, labels, weights, logp, r);
    if (s.reduction == 2) loss[r] = t.loss;
    total += t.loss;
    weight_sum += t.weight;
  }
  if (s.reduction != 2) loss[0] = SceReduce(s, total, weight_sum);
}

}  // namespace salus::exec
