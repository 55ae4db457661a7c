// Normalisation and dropout kernels of the CPU device, forward and backward:
//   - BatchNormalization (inference, and ONNX's training_mode with running-statistic outputs):
//     oneDNN batch_normalization_forward;
//   - SalusBatchNormTrain (a training compile's BatchNormalization, Note [BatchNorm running
//     statistics] in training_ops.cc): vectorised loops (Note [BatchNorm training loops]) for
//     the batch statistics, Y and the in-place update of the running statistics;
//     SalusBatchNormGrad: the same kind of loops for dX, dScale and dBias from the saved batch
//     statistics;
//   - LayerNormalization: layer_normalization_forward over [outer, inner];
//     SalusLayerNormGrad: layer_normalization_backward after recomputing each row's mean and
//     variance from X (cheaper than keeping them: one pass over X, no lane buffer);
//   - SalusDropoutTrain / SalusDropoutGrad: loops over element_math.h's mask hash (Note
//     [Dropout mask]).
// See Note [oneDNN memory] in dnnl_kernel.h.
#include <cmath>
#include <cstring>

#include "exec/cpu_kernel_helpers.h"
#include "exec/dnnl_kernel.h"
#include "exec/element_math.h"
#include "exec/grad_specs.h"
#include "exec/kernel_registry.h"
#include "exec/shape_inference.h"

namespace salus::exec {
namespace {

using dnnl::prop_kind;
using KernelOr = StatusOr<std::unique_ptr<Kernel>>;
using Flags = dnnl::normalization_flags;

const Flags kScaleShift = Flags::use_scale | Flags::use_shift;

// Inference, or ONNX's training_mode outside a training compile: running statistics in,
// updated copies out (outputs 1 and 2), nothing changed in place.
KernelOr BatchNorm(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& x = g.value(n.inputs[0]).shape;
  const int64_t channels = x[1];
  const float eps = n.GetFloat("epsilon", 1e-5f);
  const float momentum = n.GetFloat("momentum", 0.9f);
  const bool training = n.GetInt("training_mode", 0) != 0;
  auto md = PlainDesc(x);
  auto c_md = PlainDesc({channels});
  auto k = std::make_unique<DnnlKernel>();
  if (!training) {
    dnnl::batch_normalization_forward::primitive_desc pd(
        dnnl::batch_normalization_forward::desc(prop_kind::forward_inference, md, eps,
                                                kScaleShift | Flags::use_global_stats),
        UserScratchpad(), CpuEngine());
    k->AddPrimitive(dnnl::batch_normalization_forward(pd),
                    {{DNNL_ARG_SRC, md, Slot::In(0)},
                     {DNNL_ARG_SCALE, c_md, Slot::In(1)},
                     {DNNL_ARG_SHIFT, c_md, Slot::In(2)},
                     {DNNL_ARG_MEAN, c_md, Slot::In(3)},
                     {DNNL_ARG_VARIANCE, c_md, Slot::In(4)},
                     {DNNL_ARG_DST, md, Slot::Out(0)}},
                    pd.scratchpad_desc().get_size());
    return std::unique_ptr<Kernel>(std::move(k));
  }
  dnnl::batch_normalization_forward::primitive_desc pd(
      dnnl::batch_normalization_forward::desc(prop_kind::forward_training, md, eps, kScaleShift),
      UserScratchpad(), CpuEngine());
  const size_t mean = k->AddTemp(channels * 4), var = k->AddTemp(channels * 4);
  k->AddPrimitive(dnnl::batch_normalization_forward(pd),
                  {{DNNL_ARG_SRC, md, Slot::In(0)},
                   {DNNL_ARG_SCALE, c_md, Slot::In(1)},
                   {DNNL_ARG_SHIFT, c_md, Slot::In(2)},
                   {DNNL_ARG_MEAN, c_md, Slot::Temp(mean)},
                   {DNNL_ARG_VARIANCE, c_md, Slot::Temp(var)},
                   {DNNL_ARG_DST, md, Slot::Out(0)}},
                  pd.scratchpad_desc().get_size());
  k->AddLoop([=](const KernelArgs& a, std::byte* scratch) {
    const float* bm = reinterpret_cast<const float*>(scratch + mean);
    const float* bv = reinterpret_cast<const float*>(scratch + var);
    const float* rm = static_cast<const float*>(a.inputs[3]);
    const float* rv = static_cast<const float*>(a.inputs[4]);
    float* om = a.outputs.size() > 1 ? static_cast<float*>(a.outputs[1]) : nullptr;
    float* ov = a.outputs.size() > 2 ? static_cast<float*>(a.outputs[2]) : nullptr;
    for (int64_t c = 0; c < channels; ++c) {
      if (om) om[c] = rm[c] * momentum + bm[c] * (1 - momentum);
      if (ov) ov[c] = rv[c] * momentum + bv[c] * (1 - momentum);
    }
  });
  return std::unique_ptr<Kernel>(std::move(k));
}

// Note [BatchNorm training loops]: oneDNN 2.6 trains BatchNormalization on row-major NCHW with
// its generic implementation, which took a third of MobileNetV2's training step. These loops
// walk each channel's N rows of S contiguous values: a row's sum is a float reduction the
// compiler vectorises, rows accumulate in double, and channels run in parallel (the order of
// every addition is fixed, whatever the thread count). Statistics are two-pass (the mean, then
// the squared deviations from it).
// Sum over channel c of f(value index): rows of s floats, each reduced in float, in double.
template <typename RowSum>
double ChannelSum(const BatchNormGeometry& geo, int64_t c, RowSum row_sum) {
  double total = 0;
  for (int64_t i = 0; i < geo.n; ++i) total += row_sum((i * geo.c + c) * geo.s);
  return total;
}

// Inputs (X, scale, B, running_mean, running_var); outputs (Y, batch mean, batch variance,
// optional copies of the updated running statistics). The running statistics change in
// place (Note [BatchNorm running statistics]).
KernelOr BatchNormTrain(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const BatchNormGeometry geo = BatchNormGeometryOf(g.value(n.inputs[0]).shape);
  const float eps = n.GetFloat("epsilon", 1e-5f);
  const float momentum = n.GetFloat("momentum", 0.9f);
  const int64_t m = geo.per_channel();
  // The batch variance is biased; running_var takes the unbiased one.
  const float unbias = static_cast<float>(m) / static_cast<float>(std::max<int64_t>(m - 1, 1));
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    const float* scale = static_cast<const float*>(a.inputs[1]);
    const float* shift = static_cast<const float*>(a.inputs[2]);
    float* rm = static_cast<float*>(a.inputs[3]);
    float* rv = static_cast<float*>(a.inputs[4]);
    float* y = static_cast<float*>(a.outputs[0]);
    float* bm = static_cast<float*>(a.outputs[1]);
    float* bv = static_cast<float*>(a.outputs[2]);
    const int64_t s = geo.s;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < geo.c; ++c) {
      const float mean = static_cast<float>(ChannelSum(geo, c,
                                                       [&](int64_t row) {
                                                         float sum = 0.f;
#pragma omp simd reduction(+ : sum)
                                                         for (int64_t k = 0; k < s; ++k)
                                                           sum += x[row + k];
                                                         return static_cast<double>(sum);
                                                       }) /
                                            static_cast<double>(m));
      const float var = static_cast<float>(ChannelSum(geo, c,
                                                      [&](int64_t row) {
                                                        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
                                                        for (int64_t k = 0; k < s; ++k) {
                                                          const float d = x[row + k] - mean;
                                                          sum += d * d;
                                                        }
                                                        return static_cast<double>(sum);
                                                      }) /
                                           static_cast<double>(m));
      // Note [Normalise after centring]: x * mul + (shift - mean * mul) would be one operation
      // fewer, but where the mean is large against the deviation (a convolution's bias ahead
      // of the norm) x * mul and mean * mul cancel, losing float's digits in proportion: VGG-BN's
      // gradients came out 1e-3 from float64's where PyTorch's were 1e-6. The deviation first,
      // as PyTorch computes it.
      const float mul = scale[c] / std::sqrt(var + eps);
      const float add = shift[c];
      for (int64_t i = 0; i < geo.n; ++i) {
        const int64_t row = (i * geo.c + c) * s;
#pragma omp simd
        for (int64_t k = 0; k < s; ++k) y[row + k] = (x[row + k] - mean) * mul + add;
      }
      bm[c] = mean;
      bv[c] = var;
      rm[c] = momentum * rm[c] + (1 - momentum) * mean;
      rv[c] = momentum * rv[c] + (1 - momentum) * var * unbias;
    }
    if (a.outputs.size() > 3 && a.outputs[3]) std::memcpy(a.outputs[3], rm, geo.c * 4);
    if (a.outputs.size() > 4 && a.outputs[4]) std::memcpy(a.outputs[4], rv, geo.c * 4);
  }));
}

// Inputs (X, scale, batch mean, batch variance, dY); outputs (dX, dScale, dBias). With
// x^ = (x - mean) / sqrt(var + eps): dBias = sum dY, dScale = sum dY x^, and
// dX = scale / sqrt(var + eps) * (dY - dBias / m - x^ dScale / m).
KernelOr BatchNormGrad(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const BatchNormGeometry geo = BatchNormGeometryOf(g.value(n.inputs[0]).shape);
  const float eps = n.GetFloat("epsilon", 1e-5f);
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    const float* scale = static_cast<const float*>(a.inputs[1]);
    const float* bm = static_cast<const float*>(a.inputs[2]);
    const float* bv = static_cast<const float*>(a.inputs[3]);
    const float* dy = static_cast<const float*>(a.inputs[4]);
    float* dx = static_cast<float*>(a.outputs[0]);
    float* dscale = a.outputs.size() > 1 ? static_cast<float*>(a.outputs[1]) : nullptr;
    float* dbias = a.outputs.size() > 2 ? static_cast<float*>(a.outputs[2]) : nullptr;
    const int64_t s = geo.s;
    const double m = static_cast<double>(geo.per_channel());
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < geo.c; ++c) {
      const float mean = bm[c];
      const float invstd = 1.f / std::sqrt(bv[c] + eps);
      const double sum_dy = ChannelSum(geo, c, [&](int64_t row) {
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t k = 0; k < s; ++k) sum += dy[row + k];
        return static_cast<double>(sum);
      });
      const double sum_dy_xc = ChannelSum(geo, c, [&](int64_t row) {
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t k = 0; k < s; ++k) sum += dy[row + k] * (x[row + k] - mean);
        return static_cast<double>(sum);
      });
      const float db = static_cast<float>(sum_dy);
      const float ds = static_cast<float>(sum_dy_xc) * invstd;
      if (dbias) dbias[c] = db;
      if (dscale) dscale[c] = ds;
      if (!dx) continue;
      const float k_dy = scale[c] * invstd;
      const float k_mean = static_cast<float>(db / m);
      const float k_x = static_cast<float>(ds / m) * invstd;  // times x^ = (x - mean) invstd
      for (int64_t i = 0; i < geo.n; ++i) {
        const int64_t row = (i * geo.c + c) * s;
#pragma omp simd
        for (int64_t k = 0; k < s; ++k) {
          dx[row + k] = k_dy * (dy[row + k] - k_mean - (x[row + k] - mean) * k_x);
        }
      }
    }
  }));
}

// LayerNormalization normalises each row of X seen as [outer, inner] (LayerNormFor in
// shape_inference.h).
dnnl::memory::desc RowsDesc(const LayerNormSpec& s) { return PlainDesc({s.outer, s.inner}); }

Flags LayerNormFlags(const LayerNormSpec& s) { return s.bias ? kScaleShift : Flags::use_scale; }

// Inputs (X, Scale, B?); outputs (Y, Mean?, InvStdDev?).
KernelOr LayerNorm(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_ASSIGN_OR_RETURN(LayerNormSpec s, LayerNormFor(g, n));
  const bool mean_out = n.output(1) != kNoValue, invstd_out = n.output(2) != kNoValue;
  auto md = RowsDesc(s);
  auto stat_md = PlainDesc({s.outer});
  auto c_md = PlainDesc({s.inner});
  auto k = std::make_unique<DnnlKernel>();
  const bool stats = mean_out || invstd_out;
  dnnl::layer_normalization_forward::primitive_desc pd(
      dnnl::layer_normalization_forward::desc(
          stats ? prop_kind::forward_training : prop_kind::forward_inference, md, stat_md,
          s.epsilon, LayerNormFlags(s)),
      UserScratchpad(), CpuEngine());
  std::vector<DnnlKernel::Binding> bind = {{DNNL_ARG_SRC, md, Slot::In(0)},
                                           {DNNL_ARG_SCALE, c_md, Slot::In(1)},
                                           {DNNL_ARG_DST, md, Slot::Out(0)}};
  if (s.bias) bind.push_back({DNNL_ARG_SHIFT, c_md, Slot::In(2)});
  size_t var = 0;
  if (stats) {
    var = k->AddTemp(s.outer * 4);
    bind.push_back(
        {DNNL_ARG_MEAN, stat_md, mean_out ? Slot::Out(1) : Slot::Temp(k->AddTemp(s.outer * 4))});
    bind.push_back({DNNL_ARG_VARIANCE, stat_md, Slot::Temp(var)});
  }
  k->AddPrimitive(dnnl::layer_normalization_forward(pd), bind, pd.scratchpad_desc().get_size());
  if (invstd_out) {
    k->AddLoop([s, var](const KernelArgs& a, std::byte* scratch) {
      const float* v = reinterpret_cast<const float*>(scratch + var);
      float* out = static_cast<float*>(a.outputs[2]);
      for (int64_t r = 0; r < s.outer; ++r) out[r] = 1.f / std::sqrt(v[r] + s.epsilon);
    });
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

// Inputs (X, Scale, dY); outputs (dX, dScale, dBias?). Each row's mean and variance are
// recomputed from X (in double) into scratch before oneDNN's backward primitive.
KernelOr LayerNormGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(LayerNormSpec s, LayerNormFor(g, n));
  s.bias = n.output(2) != kNoValue;
  auto md = RowsDesc(s);
  auto stat_md = PlainDesc({s.outer});
  auto c_md = PlainDesc({s.inner});
  dnnl::layer_normalization_forward::primitive_desc fwd(
      dnnl::layer_normalization_forward::desc(prop_kind::forward_training, md, stat_md, s.epsilon,
                                              LayerNormFlags(s)),
      CpuEngine());
  dnnl::layer_normalization_backward::primitive_desc pd(
      dnnl::layer_normalization_backward::desc(prop_kind::backward, md, md, stat_md, s.epsilon,
                                               LayerNormFlags(s)),
      UserScratchpad(), CpuEngine(), fwd);
  auto k = std::make_unique<DnnlKernel>();
  const size_t mean = k->AddTemp(s.outer * 4), var = k->AddTemp(s.outer * 4);
  k->AddLoop([s, mean, var](const KernelArgs& a, std::byte* scratch) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    float* m = reinterpret_cast<float*>(scratch + mean);
    float* v = reinterpret_cast<float*>(scratch + var);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < s.outer; ++r) {
      const float* row = x + r * s.inner;
      double sum = 0, sq = 0;
      // (vectorised in double lanes: the order of a row's additions changes, not their precision)
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < s.inner; ++i) sum += row[i];
      const double mu = sum / static_cast<double>(s.inner);
#pragma omp simd reduction(+ : sq)
      for (int64_t i = 0; i < s.inner; ++i) sq += (row[i] - mu) * (row[i] - mu);
      m[r] = static_cast<float>(mu);
      v[r] = static_cast<float>(sq / static_cast<double>(s.inner));
    }
  });
  std::vector<DnnlKernel::Binding> bind = {{DNNL_ARG_SRC, md, Slot::In(0)},
                                           {DNNL_ARG_SCALE, c_md, Slot::In(1)},
                                           {DNNL_ARG_MEAN, stat_md, Slot::Temp(mean)},
                                           {DNNL_ARG_VARIANCE, stat_md, Slot::Temp(var)},
                                           {DNNL_ARG_DIFF_DST, md, Slot::In(2)},
                                           {DNNL_ARG_DIFF_SRC, md, Slot::Out(0)},
                                           {DNNL_ARG_DIFF_SCALE, c_md, Slot::Out(1)}};
  if (s.bias) {
    bind.push_back({DNNL_ARG_DIFF_SHIFT, c_md, Slot::Out(2)});
    bind.push_back({DNNL_ARG_SHIFT, c_md, Slot::In(1)});  // as in BatchNormGrad
  }
  k->AddPrimitive(dnnl::layer_normalization_backward(pd), bind, pd.scratchpad_desc().get_size());
  return std::unique_ptr<Kernel>(std::move(k));
}

// Inputs (X, iteration counter: int64 in persistent memory); outputs (Y, bool mask). The
// counter is read for this iteration's key and incremented (Note [Dropout mask]).
KernelOr DropoutTrain(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireDropoutTrainTypes(n, g));
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const float ratio = n.GetFloat("ratio", 0.5f);
  const uint64_t seed = static_cast<uint64_t>(n.GetInt("seed", 0));
  const uint64_t stream = static_cast<uint64_t>(n.GetInt("stream", 0));
  const float scale = DropoutScale(ratio);
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    int64_t* iteration = static_cast<int64_t*>(a.inputs[1]);
    float* y = static_cast<float*>(a.outputs[0]);
    bool* mask = static_cast<bool*>(a.outputs[1]);
    const uint64_t key = DropoutKey(seed, stream, static_cast<uint64_t>(*iteration));
    for (int64_t e = 0; e < count; ++e) {
      const bool keep = DropoutKeeps(key, static_cast<uint64_t>(e), ratio);
      mask[e] = keep;
      y[e] = x[e] * (keep ? scale : 0.f);
    }
    *iteration += 1;
  }));
}

// Inputs (dY, mask); output dX = dY * mask / (1 - ratio).
KernelOr DropoutGrad(const Node& n, const Graph& g) {
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const float scale = DropoutScale(n.GetFloat("ratio", 0.5f));
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* dy = static_cast<const float*>(a.inputs[0]);
    const bool* mask = static_cast<const bool*>(a.inputs[1]);
    float* dx = static_cast<float*>(a.outputs[0]);
    for (int64_t e = 0; e < count; ++e) dx[e] = dy[e] * (mask[e] ? scale : 0.f);
  }));
}

}  // namespace

void RegisterCpuNormKernels(KernelRegistry* r) {
  const DeviceType cpu = DeviceType::kCpu;
  r->Register("BatchNormalization", cpu, BatchNorm);
  r->Register("SalusBatchNormTrain", cpu, BatchNormTrain);
  r->Register("SalusBatchNormGrad", cpu, BatchNormGrad);
  r->Register("LayerNormalization", cpu, LayerNorm);
  r->Register("SalusLayerNormGrad", cpu, LayerNormGrad);
  r->Register("SalusDropoutTrain", cpu, DropoutTrain);
  r->Register("SalusDropoutGrad", cpu, DropoutGrad);
}

}  // namespace salus::exec
