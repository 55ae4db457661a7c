// Backward and optimizer kernels of the CPU device. Convolution, pooling, eltwise and softmax
// gradients are oneDNN backward primitives (each created with the forward primitive
// descriptor as its hint; max pooling reruns its forward primitive into a planned workspace);
// reductions to a broadcast shape, broadcasts, DepthToSpace, the loss gradient and the
// optimizer updates are loops (the last two over grad_math.h's per-element math, which the
// CUDA kernels share). See Note [oneDNN memory] in dnnl_kernel.h.
#include <cmath>
#include <cstring>

#include "exec/cpu_kernel_helpers.h"
#include "exec/dnnl_kernel.h"
#include "exec/grad_math.h"
#include "exec/kernel_registry.h"

namespace salus::exec {
namespace {

using dnnl::algorithm;
using dnnl::prop_kind;
using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

KernelOr EltwiseGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(EltwiseSpec spec, EltwiseFor(n));
  return EltwiseBackwardKernel(spec, g.value(n.inputs[0]).shape);
}

// Note [Softmax gradient loop]: oneDNN 2.6 has JIT softmax backward kernels for AVX-512 only;
// elsewhere it runs its reference implementation, which took 1.0-1.8 ms per attention
// softmax (32x4x32x32) of a Transformer encoder's step on an AVX2 machine, 3.4 of the graph's
// 23 ms. Where oneDNN offers only that, the gradient is this loop over the softmax's rows:
// dX = Y * (dY - sum(dY * Y)) for Softmax, dX = dY - exp(Y) * sum(dY) for LogSoftmax.
std::unique_ptr<Kernel> SoftmaxGradLoop(const SoftmaxSpec& spec, bool log) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < spec.axis; ++d) outer *= spec.shape[d];
  for (size_t d = spec.axis + 1; d < spec.shape.size(); ++d) inner *= spec.shape[d];
  const int64_t n = spec.shape[spec.axis], rows = outer * inner;
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* y = static_cast<const float*>(a.inputs[0]);
    const float* dy = static_cast<const float*>(a.inputs[1]);
    float* dx = static_cast<float*>(a.outputs[0]);
#pragma omp parallel for schedule(static) if (rows * n >= (int64_t{1} << 15))
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = (r / inner) * n * inner + r % inner;
      float sum = 0.f;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t e = base + k * inner;
        sum += log ? dy[e] : dy[e] * y[e];
      }
      for (int64_t k = 0; k < n; ++k) {
        const int64_t e = base + k * inner;
        dx[e] = log ? dy[e] - std::exp(y[e]) * sum : y[e] * (dy[e] - sum);
      }
    }
  }));
}

KernelOr SoftmaxGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(SoftmaxSpec spec, SoftmaxFor(n, g));
  auto md = PlainDesc(spec.shape);
  auto k = std::make_unique<DnnlKernel>();
  std::vector<DnnlKernel::Binding> bind = {{DNNL_ARG_DST, md, Slot::In(0)},
                                           {DNNL_ARG_DIFF_DST, md, Slot::In(1)},
                                           {DNNL_ARG_DIFF_SRC, md, Slot::Out(0)}};
  const bool log = n.GetString("forward_op", "Softmax") != "Softmax";
  // (Note [Softmax gradient loop]: oneDNN's reference implementation is replaced.)
  auto reference = [](const std::string& impl) { return impl.rfind("ref", 0) == 0; };
  if (!log) {
    dnnl::softmax_forward::primitive_desc fwd(
        dnnl::softmax_forward::desc(prop_kind::forward_training, md, spec.axis), CpuEngine());
    dnnl::softmax_backward::primitive_desc pd(dnnl::softmax_backward::desc(md, md, spec.axis),
                                              UserScratchpad(), CpuEngine(), fwd);
    if (reference(pd.impl_info_str())) return SoftmaxGradLoop(spec, log);
    k->AddPrimitive(dnnl::softmax_backward(pd), bind, pd.scratchpad_desc().get_size());
  } else {
    dnnl::logsoftmax_forward::primitive_desc fwd(
        dnnl::logsoftmax_forward::desc(prop_kind::forward_training, md, spec.axis), CpuEngine());
    dnnl::logsoftmax_backward::primitive_desc pd(dnnl::logsoftmax_backward::desc(md, md, spec.axis),
                                                 UserScratchpad(), CpuEngine(), fwd);
    if (reference(pd.impl_info_str())) return SoftmaxGradLoop(spec, log);
    k->AddPrimitive(dnnl::logsoftmax_backward(pd), bind, pd.scratchpad_desc().get_size());
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

// Convolutions pick their own layouts (Note [Blocked layouts] in dnnl_kernel.h).
dnnl::convolution_forward::primitive_desc ConvForwardHint(const ConvSpec& c) {
  return dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                      AnyLayout(c.src), AnyLayout(c.weights), c.bias,
                                      AnyLayout(c.dst), c.strides, c.dilates, c.pad_l, c.pad_r),
      CpuEngine());
}

// Inputs (dY, W); output dX. Attribute x_shape: the forward input's shape.
KernelOr ConvGradData(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(ConvSpec c, ConvFor(n, n.GetInts("x_shape"),
                                             FilterShape(n, g.value(n.inputs[1]).shape), "Conv"));
  dnnl::convolution_backward_data::primitive_desc pd(
      dnnl::convolution_backward_data::desc(algorithm::convolution_direct, AnyLayout(c.src),
                                            AnyLayout(c.weights), AnyLayout(c.dst), c.strides,
                                            c.dilates, c.pad_l, c.pad_r),
      UserScratchpad(), CpuEngine(), ConvForwardHint(c));
  auto k = std::make_unique<DnnlKernel>();
  std::vector<DnnlKernel::Binding> bind = {
      k->Input(DNNL_ARG_DIFF_DST, c.dst, pd.diff_dst_desc(), Slot::In(0)),
      k->Input(DNNL_ARG_WEIGHTS, c.weights, pd.weights_desc(), Slot::In(1)),
      k->Output(DNNL_ARG_DIFF_SRC, c.src, pd.diff_src_desc(), Slot::Out(0))};
  k->AddPrimitive(dnnl::convolution_backward_data(pd), bind, pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

// Inputs (X, dY); outputs dW and optionally dB. Attribute w_shape: the weights' shape.
KernelOr ConvGradWeights(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(ConvSpec c, ConvFor(n, ActivationShape(n, g.value(n.inputs[0]).shape),
                                             n.GetInts("w_shape"), "Conv"));
  const bool bias = n.output(1) != kNoValue;
  auto src = AnyLayout(c.src), w = AnyLayout(c.weights), dst = AnyLayout(c.dst);
  auto d =
      bias ? dnnl::convolution_backward_weights::desc(algorithm::convolution_direct, src, w, c.bias,
                                                      dst, c.strides, c.dilates, c.pad_l, c.pad_r)
           : dnnl::convolution_backward_weights::desc(algorithm::convolution_direct, src, w, dst,
                                                      c.strides, c.dilates, c.pad_l, c.pad_r);
  dnnl::convolution_backward_weights::primitive_desc pd(d, UserScratchpad(), CpuEngine(),
                                                        ConvForwardHint(c));
  auto k = std::make_unique<DnnlKernel>();
  std::vector<DnnlKernel::Binding> bind = {
      k->Input(DNNL_ARG_SRC, c.src, pd.src_desc(), Slot::In(0)),
      k->Input(DNNL_ARG_DIFF_DST, c.dst, pd.diff_dst_desc(), Slot::In(1)),
      k->Output(DNNL_ARG_DIFF_WEIGHTS, c.weights, pd.diff_weights_desc(), Slot::Out(0))};
  if (bias)
    bind.push_back(k->Output(DNNL_ARG_DIFF_BIAS, c.bias, pd.diff_bias_desc(), Slot::Out(1)));
  k->AddPrimitive(dnnl::convolution_backward_weights(pd), bind, pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

// Inputs (X, dY, optional Taps); output dX. Max pooling reads oneDNN's workspace from Taps
// (SalusMaxPool's, Note [Pooling taps] in cpu_kernel_helpers.h) or, without them, runs the
// forward primitive again for it.
KernelOr PoolGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(PoolSpec p, PoolFor(n, ActivationShape(n, g.value(n.inputs[0]).shape),
                                             n.GetString("forward_op", "")));
  // Note [Blocked pooling] in cpu_kernel_helpers.h.
  const dnnl::memory::desc src = PoolLayout(n, p.src), dst = PoolLayout(n, p.dst);
  dnnl::pooling_v2_forward::primitive_desc fwd(
      dnnl::pooling_v2_forward::desc(prop_kind::forward_training, p.alg, src, dst, p.strides,
                                     p.kernel, p.dilation, p.pad_l, p.pad_r),
      UserScratchpad(), CpuEngine());
  dnnl::pooling_v2_backward::primitive_desc pd(
      dnnl::pooling_v2_backward::desc(p.alg, src, dst, p.strides, p.kernel, p.dilation, p.pad_l,
                                      p.pad_r),
      UserScratchpad(), CpuEngine(), fwd);
  auto k = std::make_unique<DnnlKernel>();
  std::vector<DnnlKernel::Binding> bind;
  const ValueId taps = n.input(2);
  SALUS_RETURN_IF_ERROR(CheckPoolTaps(n, g));
  if (taps != kNoValue && WorkspaceFitsTaps(fwd.workspace_desc(), g.value(taps).shape)) {
    bind.push_back({DNNL_ARG_WORKSPACE, fwd.workspace_desc(), Slot::In(2)});
  } else if (p.alg == algorithm::pooling_max) {
    // The forward again, for the workspace that says where each window's maximum was.
    auto ws = fwd.workspace_desc();
    const size_t ws_off = k->AddTemp(ws.get_size());
    const size_t dst_off = k->AddTemp(dst.get_size());
    k->AddPrimitive(dnnl::pooling_v2_forward(fwd),
                    {k->Input(DNNL_ARG_SRC, p.src, src, Slot::In(0)),
                     {DNNL_ARG_DST, dst, Slot::Temp(dst_off)},
                     {DNNL_ARG_WORKSPACE, ws, Slot::Temp(ws_off)}},
                    fwd.scratchpad_desc().get_size());
    bind.push_back({DNNL_ARG_WORKSPACE, ws, Slot::Temp(ws_off)});
  }
  // (the gradient's reorder back is appended after the backward primitive, not the forward)
  bind.push_back(k->Input(DNNL_ARG_DIFF_DST, p.dst, dst, Slot::In(1)));
  bind.push_back(k->Output(DNNL_ARG_DIFF_SRC, p.src, src, Slot::Out(0)));
  k->AddPrimitive(dnnl::pooling_v2_backward(pd), bind, pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

// dY -> the sum of dY over the dims it was broadcast along, times attribute `scale`.
KernelOr SumTo(const Node& n, const Graph& g) {
  const Shape in = g.value(n.inputs[0]).shape;
  const Shape out = g.value(n.outputs[0]).shape;
  const float scale = n.GetFloat("scale", 1.f);
  const Shape strides = BroadcastStrides(out, in);
  const int64_t count = NumElements(out);
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    float* y = static_cast<float*>(a.outputs[0]);
    std::fill(y, y + count, 0.f);
    ForEachBroadcast(in, {strides}, [&](int64_t e, const int64_t* off) { y[off[0]] += x[e]; });
    if (scale != 1.f) {
      for (int64_t i = 0; i < count; ++i) y[i] *= scale;
    }
  }));
}

// dY (with the shape of attribute keep_shape) broadcast to the output shape, times `scale`.
KernelOr Expand(const Node& n, const Graph& g) {
  const Shape keep = n.GetInts("keep_shape");
  const Shape out = g.value(n.outputs[0]).shape;
  const float scale = n.GetFloat("scale", 1.f);
  const Shape strides = BroadcastStrides(keep, out);
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    float* y = static_cast<float*>(a.outputs[0]);
    ForEachBroadcast(out, {strides},
                     [&](int64_t e, const int64_t* off) { y[e] = scale * x[off[0]]; });
  }));
}

KernelOr DepthToSpaceGrad(const Node& n, const Graph& g) {
  const Shape x = g.value(n.outputs[0]).shape;
  const int64_t b = n.GetInt("blocksize", 1);
  const bool dcr = n.GetString("mode", "DCR") == "DCR";
  return std::unique_ptr<Kernel>(new LoopKernel([x, b, dcr](const KernelArgs& a) {
    DepthToSpaceMap(x, b, dcr, [&](int64_t in, int64_t out) {
      static_cast<float*>(a.outputs[0])[in] = static_cast<const float*>(a.inputs[0])[out];
    });
  }));
}

// Inputs (scores, labels, weights or none, dLoss); output dScores.
KernelOr SceGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(SceSpec s, SceFor(n, g));
  const size_t scratch = static_cast<size_t>(s.n * s.c * s.d) * 4;
  return std::unique_ptr<Kernel>(new LoopKernel(
      [s](const KernelArgs& a) {
        const float* scores = static_cast<const float*>(a.inputs[0]);
        const int64_t* labels = static_cast<const int64_t*>(a.inputs[1]);
        const float* weights = static_cast<const float*>(a.inputs[2]);
        const float* dloss = static_cast<const float*>(a.inputs[3]);
        float* dx = static_cast<float*>(a.outputs[0]);
        float* logp = static_cast<float*>(a.scratch);
        float unused[1];
        SceSpec sum = s;
        sum.reduction = 1;
        SceForward(sum, scores, labels, weights, logp, unused);
        double wsum = 0;
        for (int64_t e = 0; e < s.n * s.d; ++e) {
          if (SceLabelCounts(s, labels[e])) wsum += weights ? weights[labels[e]] : 1.0;
        }
        for (int64_t idx = 0; idx < s.n * s.c * s.d; ++idx) {
          const int64_t row = idx / (s.c * s.d) * s.d + idx % s.d;
          dx[idx] =
              SceGradAt(s, logp, labels, SceGradCoef(s, labels, weights, dloss, wsum, row), idx);
        }
      },
      scratch));
}

// In place: inputs (param, grad, velocity if momentum, then with "lr_input" the learning rate
// as a 1-element tensor, read each run, instead of the "lr" attribute).
KernelOr SgdUpdate(const Node& n, const Graph& g) {
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const float lr_attr = n.GetFloat("lr", 0.01f);
  SgdHyper h;
  h.momentum = n.GetFloat("momentum", 0.f);
  h.weight_decay = n.GetFloat("weight_decay", 0.f);
  h.nesterov = n.GetInt("nesterov", 0) != 0;
  const bool lr_input = n.GetInt("lr_input", 0) != 0;
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    float* p = static_cast<float*>(a.inputs[0]);
    const float* grad = static_cast<const float*>(a.inputs[1]);
    float* v = h.momentum != 0.f ? static_cast<float*>(a.inputs[2]) : nullptr;
    const float lr = lr_input ? *static_cast<const float*>(a.inputs.back()) : lr_attr;
    for (int64_t i = 0; i < count; ++i) SgdStep(h, lr, p, grad, v, i);
  }));
}

// In place: inputs (param, grad, m, v, step, and with "lr_input" the learning rate as a
// 1-element tensor instead of the "lr" attribute). Weight decay is L2 added to the gradient
// (torch.optim.Adam), or with "decoupled_weight_decay" p -= lr * wd * p before the step
// (torch.optim.AdamW).
KernelOr AdamUpdate(const Node& n, const Graph& g) {
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const float lr_attr = n.GetFloat("lr", 1e-3f);
  AdamHyper h;
  h.beta1 = n.GetFloat("beta1", 0.9f);
  h.beta2 = n.GetFloat("beta2", 0.999f);
  h.epsilon = n.GetFloat("epsilon", 1e-8f);
  h.decoupled = n.GetInt("decoupled_weight_decay", 0) != 0;
  h.weight_decay = h.decoupled ? 0.f : n.GetFloat("weight_decay", 0.f);
  h.decoupled_weight_decay = h.decoupled ? n.GetFloat("weight_decay", 0.f) : 0.f;
  const bool lr_input = n.GetInt("lr_input", 0) != 0;
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float lr = lr_input ? *static_cast<const float*>(a.inputs[5]) : lr_attr;
    float* p = static_cast<float*>(a.inputs[0]);
    const float* grad = static_cast<const float*>(a.inputs[1]);
    float* m = static_cast<float*>(a.inputs[2]);
    float* v = static_cast<float*>(a.inputs[3]);
    float* step = static_cast<float*>(a.inputs[4]);
    step[0] += 1.f;
    const AdamScalars sc = AdamScalarsFor(h, step[0], lr);
    for (int64_t i = 0; i < count; ++i) AdamStep(h, sc, p, grad, m, v, i);
  }));
}

}  // namespace

void RegisterCpuGradKernels(KernelRegistry* r) {
  const DeviceType cpu = DeviceType::kCpu;
  r->Register("SalusEltwiseGrad", cpu, EltwiseGrad);
  r->Register("SalusSoftmaxGrad", cpu, SoftmaxGrad);
  r->Register("SalusConvGradData", cpu, ConvGradData);
  r->Register("SalusConvGradWeights", cpu, ConvGradWeights);
  r->Register("SalusPoolGrad", cpu, PoolGrad);
  r->Register("SalusSumTo", cpu, SumTo);
  r->Register("SalusExpand", cpu, Expand);
  r->Register("SalusDepthToSpaceGrad", cpu, DepthToSpaceGrad);
  r->Register("SalusSoftmaxCrossEntropyGrad", cpu, SceGrad);
  r->Register("SalusSgdUpdate", cpu, SgdUpdate);
  r->Register("SalusAdamUpdate", cpu, AdamUpdate);
}

}  // namespace salus::exec
