// Forward kernels of the CPU device (normalisation and training dropout: cpu_norm_kernels.cc):
// oneDNN primitives for convolution, deconvolution, pooling, eltwise, softmax, matmul, binary,
// concat, reduction and reorder (transpose); plain loops for the ops oneDNN has no primitive
// for (DepthToSpace, Pad, the loss, copies, and binary ops whose first operand broadcasts),
// whose per-element math and index maps are element_math.h's, shared with the CUDA device.
// See Note [oneDNN memory] in dnnl_kernel.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "exec/cpu_kernel_helpers.h"
#include "exec/cpu_tensor_kernels.h"
#include "exec/dnnl_kernel.h"
#include "exec/element_math.h"
#include "exec/fusion.h"
#include "exec/kernel_registry.h"
#include "exec/shape_inference.h"
#include "exec/window.h"

namespace salus::exec {
namespace {

using dnnl::algorithm;
using dnnl::prop_kind;
using KernelOr = StatusOr<std::unique_ptr<Kernel>>;
using Tag = dnnl::memory::format_tag;

KernelOr Copy(const Node& n, const Graph& g) {
  const size_t bytes = g.value(n.inputs[0]).bytes();
  const bool mask = n.op == "Dropout" && n.output(1) != kNoValue;
  if (n.op == "Dropout") SALUS_RETURN_IF_ERROR(RequireDropoutIsIdentity(n, g));
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  return std::unique_ptr<Kernel>(new LoopKernel([bytes, mask, count](const KernelArgs& a) {
    if (a.outputs[0] != a.inputs[0]) std::memcpy(a.outputs[0], a.inputs[0], bytes);
    if (mask) std::memset(a.outputs[1], 1, count);
  }));
}

KernelOr Eltwise(const Node& n, const Graph& g) {
  if (g.value(n.outputs[0]).type == DataType::kInt64) return CpuIntegerUnary(n, g);
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_ASSIGN_OR_RETURN(EltwiseSpec spec, EltwiseFor(n));
  auto md = PlainDesc(g.value(n.inputs[0]).shape);
  dnnl::eltwise_forward::desc d(prop_kind::forward_training, spec.alg, md, spec.alpha, spec.beta);
  dnnl::eltwise_forward::primitive_desc pd(d, UserScratchpad(), CpuEngine());
  auto k = std::make_unique<DnnlKernel>();
  k->AddPrimitive(dnnl::eltwise_forward(pd),
                  {{DNNL_ARG_SRC, md, Slot::In(0)}, {DNNL_ARG_DST, md, Slot::Out(0)}},
                  pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

KernelOr Binary(const Node& n, const Graph& g) {
  if (g.value(n.outputs[0]).type == DataType::kInt64) return CpuIntegerBinary(n, g);
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& a = g.value(n.inputs[0]).shape;
  const Shape& b = g.value(n.inputs[1]).shape;
  const Shape& out = g.value(n.outputs[0]).shape;
  const std::string& op = n.op;
  const bool commutative = op == "Add" || op == "Mul";
  algorithm alg = op == "Add"   ? algorithm::binary_add
                  : op == "Sub" ? algorithm::binary_sub
                  : op == "Mul" ? algorithm::binary_mul
                                : algorithm::binary_div;
  size_t first = 0, second = 1;
  if (a != out && commutative && b == out) std::swap(first, second);
  const bool pow = op == "Pow";
  const Shape& s0 = first == 0 ? a : b;
  const Shape& s1 = first == 0 ? b : a;
  if (s0 == out && !pow) {
    Shape o = out.empty() ? Shape{1} : out;
    Shape p1 = s1;
    while (p1.size() < o.size()) p1.insert(p1.begin(), 1);
    // A second operand along the last dim only (a bias added to NHWC activations): as a row of
    // a 2-D tensor it is broadcast along oneDNN's channels, which its fast kernels take.
    if (o.size() > 2 && p1.back() == o.back() && NumElements(p1) == p1.back()) {
      o = {NumElements(o) / o.back(), o.back()};
      p1 = {1, o.back()};
    }
    auto md0 = PlainDesc(o), md1 = PlainDesc(p1);
    dnnl::binary::desc d(alg, md0, md1, md0);
    dnnl::binary::primitive_desc pd(d, UserScratchpad(), CpuEngine());
    // Note [Broadcasts oneDNN runs slowly]: oneDNN has fast binary kernels for equal shapes and
    // for a second operand broadcast over all dims or along the channels; others (a row
    // statistic, [..., n] against [..., 1]) get its reference kernel, about 100 ns an element
    // (13 ms for a 32x4x32x32 attention score minus its row maximum, where the loop below takes
    // well under one). Those take the loop.
    if (std::string_view(pd.impl_info_str()).substr(0, 3) != "ref") {
      auto k = std::make_unique<DnnlKernel>();
      k->AddPrimitive(dnnl::binary(pd),
                      {{DNNL_ARG_SRC_0, md0, Slot::In(first)},
                       {DNNL_ARG_SRC_1, md1, Slot::In(second)},
                       {DNNL_ARG_DST, md0, Slot::Out(0)}},
                      pd.scratchpad_desc().get_size());
      return std::unique_ptr<Kernel>(std::move(k));
    }
  }
  // The CUDA device's element math and index map (element_math.h), a row of the innermost
  // merged dim at a time; ForEachBroadcast only where the map cannot hold the broadcast (the
  // CUDA device refuses those).
  std::vector<Shape> strides = {BroadcastStrides(a, out), BroadcastStrides(b, out)};
  BinaryOp which = BinaryOp::kAdd;
  BinaryOpFor(op, &which);
  IndexMap map;
  if (MakeIndexMap(out, strides, &map)) {
    return std::unique_ptr<Kernel>(new LoopKernel([map, which](const KernelArgs& args) {
      const float* x = static_cast<const float*>(args.inputs[0]);
      const float* y = static_cast<const float*>(args.inputs[1]);
      float* z = static_cast<float*>(args.outputs[0]);
      const int64_t count = IndexMapCount(map);
      const int inner_dim = map.rank - 1;
      const int64_t inner = inner_dim < 0 ? 1 : map.dims[inner_dim];
      const int64_t sx = inner_dim < 0 ? 0 : map.strides[0][inner_dim];
      const int64_t sy = inner_dim < 0 ? 0 : map.strides[1][inner_dim];
      for (int64_t row = 0; row < count; row += inner) {
        int64_t off[kMaxIndexOperands];
        MapIndex(map, row, off);
        const float* xr = x + off[0];
        const float* yr = y + off[1];
        float* zr = z + row;
        for (int64_t i = 0; i < inner; ++i) zr[i] = ApplyBinary(which, xr[i * sx], yr[i * sy]);
      }
    }));
  }
  return std::unique_ptr<Kernel>(new LoopKernel([out, strides, which](const KernelArgs& args) {
    const float* x = static_cast<const float*>(args.inputs[0]);
    const float* y = static_cast<const float*>(args.inputs[1]);
    float* z = static_cast<float*>(args.outputs[0]);
    ForEachBroadcast(out, strides, [&](int64_t e, const int64_t* off) {
      z[e] = ApplyBinary(which, x[off[0]], y[off[1]]);
    });
  }));
}

KernelOr Gemm(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& a = g.value(n.inputs[0]).shape;
  const Shape& out = g.value(n.outputs[0]).shape;
  const bool ta = n.GetInt("transA", 0) != 0, tb = n.GetInt("transB", 0) != 0;
  const float alpha = n.GetFloat("alpha", 1.f), beta = n.GetFloat("beta", 1.f);
  const int64_t m = out[0], nn = out[1], kk = ta ? a[0] : a[1];
  auto a_md = StridedDesc({m, kk}, ta ? Shape{1, m} : Shape{kk, 1});
  auto b_md = StridedDesc({kk, nn}, tb ? Shape{1, kk} : Shape{nn, 1});
  auto c_md = PlainDesc(out);
  const bool has_c = n.input(2) != kNoValue && beta != 0.f;
  Shape c_shape = has_c ? g.value(n.inputs[2]).shape : Shape{};
  const bool c_as_bias =
      has_c && beta == 1.f && alpha == 1.f && (c_shape == Shape{nn} || c_shape == Shape{1, nn});
  dnnl::primitive_attr attr = UserScratchpad();
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});
  // A fused Relu (inference) is a post-op unless C is added by the loop below.
  const bool relu = n.GetString("fused_activation", "") == "Relu";
  if (kk == 0) {
    // An empty product (oneDNN cannot create it): Y is beta * C, or zeros.
    Shape cs = has_c ? BroadcastStrides(c_shape, out) : Shape{};
    return std::unique_ptr<Kernel>(
        new LoopKernel([out, cs, has_c, beta, relu](const KernelArgs& a) {
          const float* c = has_c ? static_cast<const float*>(a.inputs[2]) : nullptr;
          float* y = static_cast<float*>(a.outputs[0]);
          std::fill(y, y + NumElements(out), 0.f);
          if (has_c) {
            ForEachBroadcast(out, {cs},
                             [&](int64_t e, const int64_t* off) { y[e] = beta * c[off[0]]; });
          }
          if (relu) {
            for (int64_t e = 0; e < NumElements(out); ++e) y[e] = std::max(y[e], 0.f);
          }
        }));
  }
  if (relu && (!has_c || c_as_bias)) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(ops);
  }
  auto k = std::make_unique<DnnlKernel>();
  std::vector<DnnlKernel::Binding> bind = {{DNNL_ARG_SRC, a_md, Slot::In(0)},
                                           {DNNL_ARG_WEIGHTS, b_md, Slot::In(1)},
                                           {DNNL_ARG_DST, c_md, Slot::Out(0)}};
  dnnl::matmul::primitive_desc pd;
  if (c_as_bias) {
    auto bias_md = PlainDesc({1, nn});
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), attr,
                                      CpuEngine());
    bind.push_back({DNNL_ARG_BIAS, bias_md, Slot::In(2)});
  } else {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, CpuEngine());
  }
  k->AddPrimitive(dnnl::matmul(pd), bind, pd.scratchpad_desc().get_size());
  if (has_c && !c_as_bias) {
    Shape cs = BroadcastStrides(c_shape, out);
    k->AddLoop([out, cs, beta, relu](const KernelArgs& args, std::byte*) {
      const float* c = static_cast<const float*>(args.inputs[2]);
      float* y = static_cast<float*>(args.outputs[0]);
      ForEachBroadcast(out, {cs}, [&](int64_t e, const int64_t* off) {
        y[e] += beta * c[off[0]];
        if (relu) y[e] = std::max(y[e], 0.f);
      });
    });
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

// An operand of MatMul as oneDNN reads it: row-major, or (Note [Transposed operands] in
// fusion.h) stored with its last two dims swapped, so that its `dims` are read through swapped
// strides.
dnnl::memory::desc MatMulOperand(const Shape& dims, bool transposed) {
  if (!transposed) return PlainDesc(dims);
  Shape stored = dims;
  std::swap(stored[stored.size() - 2], stored.back());
  Shape strides = DenseStrides(stored);
  std::swap(strides[strides.size() - 2], strides.back());
  return StridedDesc(dims, strides);
}

KernelOr MatMul(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  Shape a = g.value(n.inputs[0]).shape, b = g.value(n.inputs[1]).shape;
  SALUS_RETURN_IF_ERROR(ApplyMatMulTransposes(n, &a, &b));
  const bool ta = n.GetInt(kMatMulTransA, 0) != 0, tb = n.GetInt(kMatMulTransB, 0) != 0;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const size_t rank = std::max(a.size(), b.size());
  while (a.size() < rank) a.insert(a.begin(), 1);
  while (b.size() < rank) b.insert(b.begin(), 1);
  Shape out(rank);
  for (size_t i = 0; i + 2 < rank; ++i) out[i] = std::max(a[i], b[i]);
  out[rank - 2] = a[rank - 2];
  out[rank - 1] = b[rank - 1];
  if (a[rank - 1] == 0) {
    // An empty product (oneDNN cannot create it): zeros.
    const int64_t count = NumElements(out);
    return std::unique_ptr<Kernel>(new LoopKernel([count](const KernelArgs& args) {
      std::fill(static_cast<float*>(args.outputs[0]), static_cast<float*>(args.outputs[0]) + count,
                0.f);
    }));
  }
  auto a_md = MatMulOperand(a, ta), b_md = MatMulOperand(b, tb), c_md = PlainDesc(out);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), UserScratchpad(),
                                  CpuEngine());
  auto k = std::make_unique<DnnlKernel>();
  k->AddPrimitive(dnnl::matmul(pd),
                  {{DNNL_ARG_SRC, a_md, Slot::In(0)},
                   {DNNL_ARG_WEIGHTS, b_md, Slot::In(1)},
                   {DNNL_ARG_DST, c_md, Slot::Out(0)}},
                  pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

KernelOr Softmax(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_ASSIGN_OR_RETURN(SoftmaxSpec spec, SoftmaxFor(n, g));
  auto md = PlainDesc(spec.shape);
  auto k = std::make_unique<DnnlKernel>();
  std::vector<DnnlKernel::Binding> bind = {{DNNL_ARG_SRC, md, Slot::In(0)},
                                           {DNNL_ARG_DST, md, Slot::Out(0)}};
  if (n.op == "Softmax") {
    dnnl::softmax_forward::primitive_desc pd(
        dnnl::softmax_forward::desc(prop_kind::forward_training, md, spec.axis), UserScratchpad(),
        CpuEngine());
    k->AddPrimitive(dnnl::softmax_forward(pd), bind, pd.scratchpad_desc().get_size());
  } else {
    dnnl::logsoftmax_forward::primitive_desc pd(
        dnnl::logsoftmax_forward::desc(prop_kind::forward_training, md, spec.axis),
        UserScratchpad(), CpuEngine());
    k->AddPrimitive(dnnl::logsoftmax_forward(pd), bind, pd.scratchpad_desc().get_size());
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

KernelOr Conv(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_ASSIGN_OR_RETURN(ConvSpec c, ConvFor(n, ActivationShape(n, g.value(n.inputs[0]).shape),
                                             FilterShape(n, g.value(n.inputs[1]).shape), n.op));
  auto k = std::make_unique<DnnlKernel>();
  const bool bias = n.input(2) != kNoValue;
  // Note [Blocked layouts] in dnnl_kernel.h: X and Y are row-major unless the graph keeps them
  // blocked between Convs.
  const int64_t src_block = n.GetInt("src_block", 0), dst_block = n.GetInt("dst_block", 0);
  if (src_block > 0) c.src = BlockedDesc(c.src.dims(), src_block);
  if (dst_block > 0) c.dst = BlockedDesc(c.dst.dims(), dst_block);
  auto src = src_block > 0 ? c.src : AnyLayout(c.src), w = AnyLayout(c.weights);
  auto dst = dst_block > 0 ? c.dst : AnyLayout(c.dst);
  dnnl::convolution_forward::desc d =
      bias ? dnnl::convolution_forward::desc(prop_kind::forward_training,
                                             algorithm::convolution_direct, src, w, c.bias, dst,
                                             c.strides, c.dilates, c.pad_l, c.pad_r)
           : dnnl::convolution_forward::desc(prop_kind::forward_training,
                                             algorithm::convolution_direct, src, w, dst, c.strides,
                                             c.dilates, c.pad_l, c.pad_r);
  // Inference fusions (exec/fusion.h): a residual sum (fourth input, Note [Fused residual
  // sum]), then an activation.
  const bool sum = n.input(3) != kNoValue;
  const std::string activation = n.GetString("fused_activation", "");
  dnnl::post_ops ops;
  if (sum) ops.append_sum(1.f);
  if (activation == "Relu") {
    ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  } else if (activation == "Clip") {
    ops.append_eltwise(1.f, algorithm::eltwise_clip, n.GetFloat("fused_min", 0.f),
                       n.GetFloat("fused_max", 0.f));
  } else if (!activation.empty()) {
    return UnimplementedError(n.Describe() + ": fused activation " + activation);
  }
  dnnl::primitive_attr attr = UserScratchpad();
  attr.set_post_ops(ops);
  dnnl::convolution_forward::primitive_desc pd(d, attr, CpuEngine());
  std::vector<DnnlKernel::Binding> bind = {
      k->Input(DNNL_ARG_SRC, c.src, pd.src_desc(), Slot::In(0)),
      k->Input(DNNL_ARG_WEIGHTS, c.weights, pd.weights_desc(), Slot::In(1))};
  if (bias) bind.push_back({DNNL_ARG_BIAS, c.bias, Slot::In(2)});
  if (sum) {
    // The destination starts as the other operand of the sum, in the primitive's layout.
    bind.push_back(k->Seed(DNNL_ARG_DST, c.dst, pd.dst_desc(), Slot::In(3), Slot::Out(0)));
  } else {
    bind.push_back(k->Output(DNNL_ARG_DST, c.dst, pd.dst_desc(), Slot::Out(0)));
  }
  k->AddPrimitive(dnnl::convolution_forward(pd), bind, pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

KernelOr ConvTranspose(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_ASSIGN_OR_RETURN(ConvSpec c,
                         ConvFor(n, g.value(n.inputs[0]).shape, g.value(n.inputs[1]).shape, n.op));
  auto k = std::make_unique<DnnlKernel>();
  const bool bias = n.input(2) != kNoValue;
  auto any_w = dnnl::memory::desc(c.weights.dims(), dnnl::memory::data_type::f32, Tag::any);
  dnnl::deconvolution_forward::desc d =
      bias ? dnnl::deconvolution_forward::desc(
                 prop_kind::forward_training, algorithm::deconvolution_direct, c.src, any_w, c.bias,
                 c.dst, c.strides, c.dilates, c.pad_l, c.pad_r)
           : dnnl::deconvolution_forward::desc(prop_kind::forward_training,
                                               algorithm::deconvolution_direct, c.src, any_w, c.dst,
                                               c.strides, c.dilates, c.pad_l, c.pad_r);
  dnnl::deconvolution_forward::primitive_desc pd(d, UserScratchpad(), CpuEngine());
  // ONNX stores W as [C_in, C_out/group, kH, kW]; reorder it into the layout oneDNN picked.
  auto w_md = pd.weights_desc();
  const size_t w_temp = k->AddTemp(w_md.get_size());
  dnnl::reorder::primitive_desc rpd(CpuEngine(), c.weights, CpuEngine(), w_md, UserScratchpad());
  k->AddPrimitive(
      dnnl::reorder(rpd),
      {{DNNL_ARG_FROM, c.weights, Slot::In(1)}, {DNNL_ARG_TO, w_md, Slot::Temp(w_temp)}},
      rpd.scratchpad_desc().get_size());
  std::vector<DnnlKernel::Binding> bind = {{DNNL_ARG_SRC, c.src, Slot::In(0)},
                                           {DNNL_ARG_WEIGHTS, w_md, Slot::Temp(w_temp)},
                                           {DNNL_ARG_DST, c.dst, Slot::Out(0)}};
  if (bias) bind.push_back({DNNL_ARG_BIAS, c.bias, Slot::In(2)});
  k->AddPrimitive(dnnl::deconvolution_forward(pd), bind, pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

// MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool; and SalusMaxPool, MaxPool with its
// workspace in output Taps (Note [Pooling taps] in cpu_kernel_helpers.h).
KernelOr Pool(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const bool taps = n.op == "SalusMaxPool";
  if (taps) SALUS_RETURN_IF_ERROR(CheckPoolTaps(n, g));
  SALUS_ASSIGN_OR_RETURN(PoolSpec p, PoolFor(n, ActivationShape(n, g.value(n.inputs[0]).shape),
                                             taps ? "MaxPool" : n.op));
  // Note [Blocked pooling] in cpu_kernel_helpers.h.
  const dnnl::memory::desc src = PoolLayout(n, p.src), dst = PoolLayout(n, p.dst);
  dnnl::pooling_v2_forward::desc d(prop_kind::forward_training, p.alg, src, dst, p.strides,
                                   p.kernel, p.dilation, p.pad_l, p.pad_r);
  dnnl::pooling_v2_forward::primitive_desc pd(d, UserScratchpad(), CpuEngine());
  auto k = std::make_unique<DnnlKernel>();
  std::vector<DnnlKernel::Binding> bind = {k->Input(DNNL_ARG_SRC, p.src, src, Slot::In(0)),
                                           k->Output(DNNL_ARG_DST, p.dst, dst, Slot::Out(0))};
  if (p.alg == algorithm::pooling_max) {
    auto ws = pd.workspace_desc();
    if (taps && WorkspaceFitsTaps(ws, g.value(n.outputs[1]).shape)) {
      bind.push_back({DNNL_ARG_WORKSPACE, ws, Slot::Out(1)});
    } else if (ws.get_size() > 0) {
      bind.push_back({DNNL_ARG_WORKSPACE, ws, Slot::Temp(k->AddTemp(ws.get_size()))});
    }
  }
  k->AddPrimitive(dnnl::pooling_v2_forward(pd), bind, pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

// Transpose: a oneDNN reorder. oneDNN has no 64-bit type, so an int64 tensor moves as pairs of
// floats' bits (a trailing dim of 2 that stays in place): a reorder between two f32 layouts
// copies bits.
KernelOr Transpose(const Node& n, const Graph& g) {
  const bool int64 = g.value(n.inputs[0]).type == DataType::kInt64;
  if (!int64) SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  Shape x = g.value(n.inputs[0]).shape;
  Shape y = g.value(n.outputs[0]).shape;
  std::vector<int64_t> perm = n.GetInts("perm");
  if (perm.empty()) {
    for (int64_t i = static_cast<int64_t>(x.size()) - 1; i >= 0; --i) perm.push_back(i);
  }
  if (x.empty()) return Copy(n, g);
  if (int64) {
    x.push_back(2);
    y.push_back(2);
    perm.push_back(static_cast<int64_t>(perm.size()));
  }
  Shape ys = DenseStrides(y);
  Shape dst_strides(x.size());
  for (size_t j = 0; j < perm.size(); ++j) dst_strides[perm[j]] = ys[j];
  auto src = PlainDesc(x);
  auto dst = StridedDesc(x, dst_strides);
  dnnl::reorder::primitive_desc pd(CpuEngine(), src, CpuEngine(), dst, UserScratchpad());
  auto k = std::make_unique<DnnlKernel>();
  k->AddPrimitive(dnnl::reorder(pd),
                  {{DNNL_ARG_FROM, src, Slot::In(0)}, {DNNL_ARG_TO, dst, Slot::Out(0)}},
                  pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

// Note [Concatenation by blocks]: oneDNN 2.6's concat of plain row-major tensors runs its
// "simple" kernel at about 1.6 GB/s here (0.48 ms for three 256 KB parts along axis 0, the
// gradient of an attention's q, k and v stacked back together). Each input is a block of
// contiguous bytes per outer index, so where those blocks are large enough a memcpy per block
// (CpuConcatCopy) does it at memory speed; short blocks (a concat along a small last dim) stay
// with oneDNN.
constexpr int64_t kConcatBlockMin = 256;  // floats per block

KernelOr Concat(const Node& n, const Graph& g) {
  if (g.value(n.outputs[0]).type != DataType::kFloat32) return CpuConcatCopy(n, g);
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& y = g.value(n.outputs[0]).shape;
  SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), y.size()));
  int64_t inner = 1;
  for (size_t d = axis + 1; d < y.size(); ++d) inner *= y[d];
  bool blocks = true;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& s = g.value(n.inputs[i]).shape;
    if (NumElements(s) != 0 && s[axis] * inner < kConcatBlockMin) blocks = false;
  }
  if (blocks) return CpuConcatCopy(n, g);
  std::vector<dnnl::memory::desc> srcs;
  std::vector<DnnlKernel::Binding> bind;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& s = g.value(n.inputs[i]).shape;
    if (NumElements(s) == 0) continue;
    srcs.push_back(PlainDesc(s));
    bind.push_back(
        {DNNL_ARG_MULTIPLE_SRC + static_cast<int>(srcs.size() - 1), srcs.back(), Slot::In(i)});
  }
  auto dst = PlainDesc(y);
  dnnl::concat::primitive_desc pd(dst, static_cast<int>(axis), srcs, CpuEngine(), UserScratchpad());
  bind.push_back({DNNL_ARG_DST, dst, Slot::Out(0)});
  auto k = std::make_unique<DnnlKernel>();
  k->AddPrimitive(dnnl::concat(pd), bind, pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

// Note [Block reductions]: oneDNN 2.6 reduces over a middle axis (a Transformer's mean over
// its tokens) with its reference implementation, ten times slower than a loop. When the reduced
// dims (size-1 dims aside) are one contiguous block, x is [outer, reduced, inner] and each output
// row of `inner` values is accumulated slice by slice in order (sums in double): contiguous,
// vectorisable, and the same order every run.
struct ReduceBlock {
  int64_t outer = 1, reduced = 1, inner = 1;
};

std::optional<ReduceBlock> ReducedBlock(const Shape& x, const Shape& kept) {
  int first = -1, last = -1;
  for (int d = 0; d < static_cast<int>(x.size()); ++d) {
    if (x[d] == 1 || kept[d] == x[d]) continue;
    if (first < 0) first = d;
    last = d;
  }
  if (first < 0) return std::nullopt;
  ReduceBlock b;
  for (int d = 0; d < static_cast<int>(x.size()); ++d) {
    const bool reduced = kept[d] != x[d];
    if (d < first) {
      b.outer *= x[d];
    } else if (d > last) {
      b.inner *= x[d];
    } else if (reduced || x[d] == 1) {
      b.reduced *= x[d];
    } else {
      return std::nullopt;  // a kept dim inside the reduced block
    }
  }
  return b;
}

// The runs of rows a single long sum is split into (BlockReduce).
constexpr int64_t kReduceChunks = 16;

KernelOr BlockReduce(const std::string& op, const ReduceBlock& b) {
  enum class Fn { kSum, kMean, kMax, kMin };
  const Fn fn = op == "ReduceMean"  ? Fn::kMean
                : op == "ReduceMax" ? Fn::kMax
                : op == "ReduceMin" ? Fn::kMin
                                    : Fn::kSum;
  if (b.reduced == 0) {
    // An empty reduction gives each op's identity: 0, NaN (0 / 0), -inf, +inf.
    const float identity = fn == Fn::kSum    ? 0.f
                           : fn == Fn::kMean ? std::numeric_limits<float>::quiet_NaN()
                           : fn == Fn::kMax  ? -std::numeric_limits<float>::infinity()
                                             : std::numeric_limits<float>::infinity();
    const int64_t count = b.outer * b.inner;
    return std::unique_ptr<Kernel>(new LoopKernel([count, identity](const KernelArgs& a) {
      std::fill_n(static_cast<float*>(a.outputs[0]), count, identity);
    }));
  }
  if (fn == Fn::kSum || fn == Fn::kMean) {
    // Sums accumulate in double (scratch: one row of `inner`): a long float accumulation loses
    // digits in proportion to the reduced count, and a training step's gradients (a batch
    // normalisation's, above all, whose sums cancel) amplify that loss.
    const bool mean = fn == Fn::kMean;
    if (b.outer == 1 && b.reduced >= 2 * kReduceChunks &&
        b.reduced * b.inner >= (int64_t{1} << 15)) {
      // One long reduction (a bias gradient over N*H*W rows): kReduceChunks runs of rows, each
      // summed into its own row of doubles, split across the step's threads, then added in
      // order. The chunks do not depend on the thread count, so neither do the results.
      return std::unique_ptr<Kernel>(new LoopKernel(
          [b, mean](const KernelArgs& a) {
            const float* x = static_cast<const float*>(a.inputs[0]);
            float* y = static_cast<float*>(a.outputs[0]);
            double* acc = static_cast<double*>(a.scratch);
            const int64_t per = (b.reduced + kReduceChunks - 1) / kReduceChunks;
#pragma omp parallel for schedule(static)
            for (int64_t c = 0; c < kReduceChunks; ++c) {
              double* part = acc + c * b.inner;
              std::fill(part, part + b.inner, 0.0);
              const int64_t end = std::min(b.reduced, (c + 1) * per);
              for (int64_t r = c * per; r < end; ++r) {
                const float* row = x + r * b.inner;
#pragma omp simd
                for (int64_t i = 0; i < b.inner; ++i) part[i] += row[i];
              }
            }
            const double scale = mean ? 1.0 / static_cast<double>(b.reduced) : 1.0;
            for (int64_t i = 0; i < b.inner; ++i) {
              double sum = acc[i];
              for (int64_t c = 1; c < kReduceChunks; ++c) sum += acc[c * b.inner + i];
              y[i] = static_cast<float>(sum * scale);
            }
          },
          static_cast<size_t>(kReduceChunks * b.inner) * sizeof(double)));
    }
    return std::unique_ptr<Kernel>(new LoopKernel(
        [b, mean](const KernelArgs& a) {
          const float* x = static_cast<const float*>(a.inputs[0]);
          float* y = static_cast<float*>(a.outputs[0]);
          double* acc = static_cast<double*>(a.scratch);
          const double scale = mean ? 1.0 / static_cast<double>(b.reduced) : 1.0;
          for (int64_t o = 0; o < b.outer; ++o) {
            const float* src = x + o * b.reduced * b.inner;
            for (int64_t i = 0; i < b.inner; ++i) acc[i] = src[i];
            for (int64_t r = 1; r < b.reduced; ++r) {
              const float* row = src + r * b.inner;
              for (int64_t i = 0; i < b.inner; ++i) acc[i] += row[i];
            }
            float* dst = y + o * b.inner;
            for (int64_t i = 0; i < b.inner; ++i) dst[i] = static_cast<float>(acc[i] * scale);
          }
        },
        static_cast<size_t>(b.inner) * sizeof(double)));
  }
  return std::unique_ptr<Kernel>(new LoopKernel([b, fn](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    float* y = static_cast<float*>(a.outputs[0]);
    for (int64_t o = 0; o < b.outer; ++o) {
      const float* src = x + o * b.reduced * b.inner;
      float* dst = y + o * b.inner;
      std::copy(src, src + b.inner, dst);
      for (int64_t r = 1; r < b.reduced; ++r) {
        const float* row = src + r * b.inner;
        if (fn == Fn::kMax) {
          for (int64_t i = 0; i < b.inner; ++i) dst[i] = std::max(dst[i], row[i]);
        } else {
          for (int64_t i = 0; i < b.inner; ++i) dst[i] = std::min(dst[i], row[i]);
        }
      }
    }
  }));
}

KernelOr Reduce(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {0}));
  const Shape& x = g.value(n.inputs[0]).shape;
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReductionAxes(g, n));
  Shape kept = x;
  // A scalar's only axis (0, which NormalizeAxis allows for rank 0) reduces nothing.
  for (int64_t a : axes) {
    if (a < static_cast<int64_t>(kept.size())) kept[a] = 1;
  }
  if (kept == x || x.empty()) {
    // Nothing to reduce: the value itself, or its absolute value or square.
    const int fn = n.op == "ReduceL1" || n.op == "ReduceL2" ? 1 : n.op == "ReduceSumSquare" ? 2 : 0;
    if (fn == 0) return Copy(n, g);
    const int64_t count = NumElements(x);
    return std::unique_ptr<Kernel>(new LoopKernel([count, fn](const KernelArgs& a) {
      const float* in = static_cast<const float*>(a.inputs[0]);
      float* out = static_cast<float*>(a.outputs[0]);
      for (int64_t i = 0; i < count; ++i) out[i] = fn == 1 ? std::abs(in[i]) : in[i] * in[i];
    }));
  }
  if (auto block = ReducedBlock(x, kept); block && n.op != "ReduceProd" && n.op != "ReduceL1" &&
                                          n.op != "ReduceL2" && n.op != "ReduceSumSquare") {
    return BlockReduce(n.op, *block);
  }
  auto src = PlainDesc(x), dst = PlainDesc(kept);
  algorithm alg = algorithm::reduction_sum;
  float p = 0.f;
  if (n.op == "ReduceMean") alg = algorithm::reduction_mean;
  if (n.op == "ReduceMax") alg = algorithm::reduction_max;
  if (n.op == "ReduceMin") alg = algorithm::reduction_min;
  if (n.op == "ReduceProd") alg = algorithm::reduction_mul;
  if (n.op == "ReduceL1" || n.op == "ReduceL2") alg = algorithm::reduction_norm_lp_sum;
  if (n.op == "ReduceSumSquare") alg = algorithm::reduction_norm_lp_power_p_sum;
  if (n.op == "ReduceL1") p = 1.f;
  if (n.op == "ReduceL2" || n.op == "ReduceSumSquare") p = 2.f;
  dnnl::reduction::primitive_desc pd(dnnl::reduction::desc(alg, src, dst, p, 0.f), UserScratchpad(),
                                     CpuEngine());
  auto k = std::make_unique<DnnlKernel>();
  k->AddPrimitive(dnnl::reduction(pd),
                  {{DNNL_ARG_SRC, src, Slot::In(0)}, {DNNL_ARG_DST, dst, Slot::Out(0)}},
                  pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

KernelOr DepthToSpace(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape x = g.value(n.inputs[0]).shape;
  const int64_t b = n.GetInt("blocksize", 1);
  const bool dcr = n.GetString("mode", "DCR") == "DCR";
  return std::unique_ptr<Kernel>(new LoopKernel([x, b, dcr](const KernelArgs& a) {
    DepthToSpaceMap(x, b, dcr, [&](int64_t in, int64_t out) {
      static_cast<float*>(a.outputs[0])[out] = static_cast<const float*>(a.inputs[0])[in];
    });
  }));
}

// Row by row of element_math.h's PadMap, whose innermost dim is a contiguous run in both
// tensors: a row is the pad value, or the value around one copied input run (the run's start
// from PadSourceIndex, as the CUDA device maps each element). A scatter of the input into the
// filled output only where that map cannot hold the padding (the CUDA device refuses those).
template <typename T>
std::unique_ptr<Kernel> PadKernel(const Shape& x, const Shape& y, const std::vector<int64_t>& pads,
                                  T value) {
  PadMap map;
  if (MakePadMap(x, pads, &map)) {
    return std::unique_ptr<Kernel>(new LoopKernel([map, value](const KernelArgs& a) {
      T* out = static_cast<T*>(a.outputs[0]);
      const T* in = static_cast<const T*>(a.inputs[0]);
      const int64_t count = PadOutputCount(map);
      if (map.rank == 0) {  // one element, no padding
        if (count > 0) out[0] = in[0];
        return;
      }
      const int64_t row = map.out[map.rank - 1], run = map.in[map.rank - 1];
      const int64_t begin = map.begin[map.rank - 1];
      const int64_t rows = row > 0 ? count / row : 0;
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 16))
      for (int64_t r = 0; r < rows; ++r) {
        T* o = out + r * row;
        const int64_t src = run > 0 ? PadSourceIndex(map, r * row + begin) : -1;
        if (src < 0) {
          std::fill(o, o + row, value);
          continue;
        }
        std::fill(o, o + begin, value);
        std::memcpy(o + begin, in + src, run * sizeof(T));
        std::fill(o + begin + run, o + row, value);
      }
    }));
  }
  Shape ys = DenseStrides(y);
  int64_t base = 0;
  for (size_t i = 0; i < x.size(); ++i) base += pads[i] * ys[i];
  return std::unique_ptr<Kernel>(new LoopKernel([x, y, ys, base, value](const KernelArgs& a) {
    T* out = static_cast<T*>(a.outputs[0]);
    const T* in = static_cast<const T*>(a.inputs[0]);
    std::fill(out, out + NumElements(y), value);
    ForEachBroadcast(x, {ys}, [&](int64_t e, const int64_t* off) { out[base + off[0]] = in[e]; });
  }));
}

KernelOr Pad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const PadSpec p, PadSpecOf(n, g));
  const Shape& x = g.value(n.inputs[0]).shape;
  const Shape& y = g.value(n.outputs[0]).shape;
  if (p.int64) return PadKernel<int64_t>(x, y, p.pads, p.int_value);
  return PadKernel<float>(x, y, p.pads, p.float_value);
}

KernelOr SoftmaxCrossEntropy(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {0, 2}));
  SALUS_ASSIGN_OR_RETURN(SceSpec s, SceFor(n, g));
  const bool want_logp = n.output(1) != kNoValue;
  const size_t scratch = want_logp ? 0 : static_cast<size_t>(s.n * s.c * s.d) * 4;
  return std::unique_ptr<Kernel>(new LoopKernel(
      [s, want_logp](const KernelArgs& a) {
        float* logp =
            want_logp ? static_cast<float*>(a.outputs[1]) : static_cast<float*>(a.scratch);
        SceForward(s, static_cast<const float*>(a.inputs[0]),
                   static_cast<const int64_t*>(a.inputs[1]),
                   a.inputs.size() > 2 ? static_cast<const float*>(a.inputs[2]) : nullptr, logp,
                   static_cast<float*>(a.outputs[0]));
      },
      scratch));
}

}  // namespace

void RegisterCpuKernels(KernelRegistry* r) {
  const DeviceType cpu = DeviceType::kCpu;
  for (const char* op :
       {"Identity", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Dropout", "SalusReshape"}) {
    r->Register(op, cpu, Copy);
  }
  for (const char* op : {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs",
                         "Elu", "Softplus", "Gelu", "Reciprocal"}) {
    r->Register(op, cpu, Eltwise);
  }
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow"}) r->Register(op, cpu, Binary);
  r->Register("Gemm", cpu, Gemm);
  r->Register("MatMul", cpu, MatMul);
  r->Register("Softmax", cpu, Softmax);
  r->Register("LogSoftmax", cpu, Softmax);
  r->Register("Conv", cpu, Conv);
  r->Register("ConvTranspose", cpu, ConvTranspose);
  for (const char* op :
       {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "SalusMaxPool"}) {
    r->Register(op, cpu, Pool);
  }
  r->Register("Transpose", cpu, Transpose);
  r->Register("Concat", cpu, Concat);
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL1", "ReduceL2", "ReduceSumSquare"}) {
    r->Register(op, cpu, Reduce);
  }
  r->Register("DepthToSpace", cpu, DepthToSpace);
  r->Register("Pad", cpu, Pad);
  r->Register("SoftmaxCrossEntropyLoss", cpu, SoftmaxCrossEntropy);
}

}  // namespace salus::exec
