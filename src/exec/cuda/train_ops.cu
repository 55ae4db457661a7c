// The hand-written kernels of train_kernels.cc (train_ops_launch.h): grid-stride loops over
// 64-bit indices with element_math.h's per-element math, and one block per channel or row
// where a kernel reduces (grid.cuh's BlockSum: a fixed tree, no atomics).
#include <cmath>
#include <cstdint>

#include "exec/cuda/grid.cuh"
#include "exec/cuda/train_ops_launch.h"

namespace salus::exec::cuda {
namespace {

template <UnaryGradOp kOp>
__global__ void UnaryGradKernel(const float* __restrict__ x, const float* __restrict__ dy,
                                float* __restrict__ dx, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) dx[e] = UnaryGrad(kOp, x[e], dy[e]);
}

template <UnaryGradOp kOp>
cudaError_t Unary(const float* x, const float* dy, float* dx, int64_t count, cudaStream_t stream) {
  UnaryGradKernel<kOp><<<BlocksFor(count), kThreads, 0, stream>>>(x, dy, dx, count);
  return cudaGetLastError();
}

__global__ void PowGradKernel(IndexMap map, bool wrt_exponent, const float* __restrict__ x,
                              const void* __restrict__ p, bool p_int64,
                              const float* __restrict__ dy, float* __restrict__ dx, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    const float pe = p_int64 ? static_cast<float>(static_cast<const int64_t*>(p)[off[1]])
                             : static_cast<const float*>(p)[off[1]];
    const float d = wrt_exponent ? PowGradExponent(x[off[0]], pe) : PowGradBase(x[off[0]], pe);
    dx[e] = dy[e] * d;
  }
}

__global__ void MinMaxGradKernel(IndexMap map, bool is_max, int which, const float* __restrict__ a,
                                 const float* __restrict__ b, const float* __restrict__ dy,
                                 float* __restrict__ dx, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    const int arg = MinMaxReplaces(is_max, b[off[1]], a[off[0]]) ? 1 : 0;
    dx[e] = arg == which ? dy[e] : 0.f;
  }
}

__global__ void MinMaxArgStepKernel(IndexMap map, bool is_max, int index, const float* prev,
                                    const float* __restrict__ x, float* best,
                                    int32_t* __restrict__ arg, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    float extreme = prev[off[0]];
    int32_t at = index == 1 ? 0 : arg[e];
    const float v = x[off[1]];
    if (MinMaxReplaces(is_max, v, extreme)) {
      extreme = v;
      at = index;
    }
    best[e] = extreme;
    arg[e] = at;
  }
}

__global__ void MinMaxArgGradKernel(int64_t count, int which, const int32_t* __restrict__ arg,
                                    const float* __restrict__ dy, float* __restrict__ dx) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    dx[e] = arg[e] == which ? dy[e] : 0.f;
  }
}

__device__ __forceinline__ float Bound(const float* ptr, float value) {
  return ptr != nullptr ? *ptr : value;
}

__global__ void ClipGradKernel(int64_t count, const float* __restrict__ x, const float* lo_ptr,
                               float lo, const float* hi_ptr, float hi,
                               const float* __restrict__ dy, float* __restrict__ dx) {
  const float l = Bound(lo_ptr, lo), h = Bound(hi_ptr, hi);
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    dx[e] = ClipGradTarget(x[e], l, h) == 0 ? dy[e] : 0.f;
  }
}

// One block: thread t sums elements t, t + kThreads, ... of each bound's share, in order.
__global__ void ClipBoundsKernel(int64_t count, const float* __restrict__ x, const float* lo_ptr,
                                 float lo, const float* hi_ptr, float hi,
                                 const float* __restrict__ dy, float* dmin, float* dmax) {
  __shared__ double partial[kThreads];
  const float l = Bound(lo_ptr, lo), h = Bound(hi_ptr, hi);
  double low = 0, high = 0;
  for (int64_t e = threadIdx.x; e < count; e += kThreads) {
    const int target = ClipGradTarget(x[e], l, h);
    if (target == 1) low += dy[e];
    if (target == 2) high += dy[e];
  }
  low = BlockSum(partial, low);
  high = BlockSum(partial, high);
  if (threadIdx.x == 0) {
    if (dmin != nullptr) *dmin = static_cast<float>(low);
    if (dmax != nullptr) *dmax = static_cast<float>(high);
  }
}

__global__ void SliceGradKernel(SliceMap m, const float* __restrict__ dy, float* __restrict__ dx,
                                int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) dx[SliceSourceIndex(m, o)] = dy[o];
}

__global__ void PadGradKernel(IndexMap map, int64_t base, const float* __restrict__ dy,
                              float* __restrict__ dx, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    dx[e] = dy[base + off[0]];
  }
}

// One thread per table element; the rows gathered from it are added in index order, as the
// CPU adds them (Note [Deterministic scatter-add] in cpu_tensor_grad_kernels.cc).
__global__ void GatherGradKernel(GatherGeometry g, const int64_t* __restrict__ indices,
                                 const float* __restrict__ dy, float* __restrict__ dx,
                                 int64_t total) {
  for (int64_t t = FirstIndex(); t < total; t += GridStride()) {
    const int64_t i = t % g.inner;
    const int64_t a = (t / g.inner) % g.axis_dim;
    const int64_t b = t / (g.inner * g.axis_dim);
    float acc = 0.f;
    for (int64_t j = 0; j < g.count; ++j) {
      int64_t index = indices[j];
      if (index < 0) index += g.axis_dim;
      if (index == a) acc += dy[(b * g.count + j) * g.inner + i];
    }
    dx[t] = acc;
  }
}

__global__ void DropoutKernel(int64_t count, float ratio, float scale, uint64_t seed,
                              uint64_t stream_id, const float* __restrict__ x,
                              const int64_t* iteration, float* __restrict__ y,
                              bool* __restrict__ mask) {
  const uint64_t key = DropoutKey(seed, stream_id, static_cast<uint64_t>(*iteration));
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const bool keep = DropoutKeeps(key, static_cast<uint64_t>(e), ratio);
    mask[e] = keep;
    y[e] = x[e] * (keep ? scale : 0.f);
  }
}

__global__ void IncrementKernel(int64_t* counter) { *counter += 1; }

__global__ void DropoutGradKernel(int64_t count, float scale, const float* __restrict__ dy,
                                  const bool* __restrict__ mask, float* __restrict__ dx) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    dx[e] = dy[e] * (mask[e] ? scale : 0.f);
  }
}

// Element t of channel ch's n * s values.
__device__ __forceinline__ int64_t ChannelIndex(const BatchNormGeometry& g, int64_t ch, int64_t t) {
  return ((t / g.s) * g.c + ch) * g.s + t % g.s;
}

__global__ void BnTrainKernel(BatchNormGeometry g, float eps, float momentum, float unbias,
                              const float* __restrict__ x, const float* __restrict__ scale,
                              const float* __restrict__ shift, float* rm, float* rv,
                              float* __restrict__ y, float* bm, float* bv, float* out_rm,
                              float* out_rv) {
  __shared__ double partial[kThreads];
  const int64_t m = g.n * g.s;
  for (int64_t ch = blockIdx.x; ch < g.c; ch += gridDim.x) {
    double sum = 0;
    for (int64_t t = threadIdx.x; t < m; t += kThreads) sum += x[ChannelIndex(g, ch, t)];
    const float mean = static_cast<float>(BlockSum(partial, sum) / static_cast<double>(m));
    double sq = 0;
    for (int64_t t = threadIdx.x; t < m; t += kThreads) {
      const float d = x[ChannelIndex(g, ch, t)] - mean;
      sq += static_cast<double>(d) * d;
    }
    const float var = static_cast<float>(BlockSum(partial, sq) / static_cast<double>(m));
    // Note [Normalise after centring]: (x - mean) first, as on the CPU.
    const float mul = scale[ch] / sqrtf(var + eps);
    for (int64_t t = threadIdx.x; t < m; t += kThreads) {
      const int64_t at = ChannelIndex(g, ch, t);
      y[at] = (x[at] - mean) * mul + shift[ch];
    }
    if (threadIdx.x == 0) {
      bm[ch] = mean;
      bv[ch] = var;
      rm[ch] = momentum * rm[ch] + (1 - momentum) * mean;
      rv[ch] = momentum * rv[ch] + (1 - momentum) * var * unbias;
      if (out_rm != nullptr) out_rm[ch] = rm[ch];
      if (out_rv != nullptr) out_rv[ch] = rv[ch];
    }
  }
}

__global__ void BnGradKernel(BatchNormGeometry g, float eps, const float* __restrict__ x,
                             const float* __restrict__ scale, const float* __restrict__ bm,
                             const float* __restrict__ bv, const float* __restrict__ dy,
                             float* __restrict__ dx, float* dscale, float* dbias) {
  __shared__ double partial[kThreads];
  const int64_t m = g.n * g.s;
  for (int64_t ch = blockIdx.x; ch < g.c; ch += gridDim.x) {
    const float mean = bm[ch];
    const float invstd = 1.f / sqrtf(bv[ch] + eps);
    double s_dy = 0, s_dy_xc = 0;
    for (int64_t t = threadIdx.x; t < m; t += kThreads) {
      const int64_t at = ChannelIndex(g, ch, t);
      s_dy += dy[at];
      s_dy_xc += dy[at] * (x[at] - mean);
    }
    s_dy = BlockSum(partial, s_dy);
    s_dy_xc = BlockSum(partial, s_dy_xc);
    const float db = static_cast<float>(s_dy);
    const float ds = static_cast<float>(s_dy_xc) * invstd;
    if (threadIdx.x == 0) {
      if (dbias != nullptr) dbias[ch] = db;
      if (dscale != nullptr) dscale[ch] = ds;
    }
    if (dx == nullptr) continue;
    const float k_dy = scale[ch] * invstd;
    const float k_mean = static_cast<float>(db / static_cast<double>(m));
    const float k_x = static_cast<float>(ds / static_cast<double>(m)) * invstd;
    for (int64_t t = threadIdx.x; t < m; t += kThreads) {
      const int64_t at = ChannelIndex(g, ch, t);
      dx[at] = k_dy * (dy[at] - k_mean - (x[at] - mean) * k_x);
    }
  }
}

// One block per row: the row's mean and 1/sqrt(var + eps) into row_stats, and dx.
__global__ void LayerNormGradRowsKernel(int64_t outer, int64_t inner, float eps,
                                        const float* __restrict__ x,
                                        const float* __restrict__ scale,
                                        const float* __restrict__ dy, float* __restrict__ dx,
                                        float* __restrict__ row_stats) {
  __shared__ double partial[kThreads];
  for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
    const float* xr = x + r * inner;
    const float* dyr = dy + r * inner;
    double sum = 0;
    for (int64_t i = threadIdx.x; i < inner; i += kThreads) sum += xr[i];
    const double mu = BlockSum(partial, sum) / static_cast<double>(inner);
    double sq = 0;
    for (int64_t i = threadIdx.x; i < inner; i += kThreads) sq += (xr[i] - mu) * (xr[i] - mu);
    const float var = static_cast<float>(BlockSum(partial, sq) / static_cast<double>(inner));
    const float mean = static_cast<float>(mu);
    const float inv = 1.f / sqrtf(var + eps);
    double s_g = 0, s_gx = 0;
    for (int64_t i = threadIdx.x; i < inner; i += kThreads) {
      const float gi = dyr[i] * scale[i];
      s_g += gi;
      s_gx += gi * ((xr[i] - mean) * inv);
    }
    const float mean_g = static_cast<float>(BlockSum(partial, s_g) / static_cast<double>(inner));
    const float mean_gx = static_cast<float>(BlockSum(partial, s_gx) / static_cast<double>(inner));
    if (dx != nullptr) {
      for (int64_t i = threadIdx.x; i < inner; i += kThreads) {
        const float xh = (xr[i] - mean) * inv;
        dx[r * inner + i] = inv * (dyr[i] * scale[i] - mean_g - xh * mean_gx);
      }
    }
    if (threadIdx.x == 0) {
      row_stats[r] = mean;
      row_stats[outer + r] = inv;
    }
  }
}

// One thread per column: the column's sums over the rows, in row order.
__global__ void LayerNormGradColumnsKernel(int64_t outer, int64_t inner,
                                           const float* __restrict__ x,
                                           const float* __restrict__ dy,
                                           const float* __restrict__ row_stats, float* dscale,
                                           float* dbias) {
  for (int64_t i = FirstIndex(); i < inner; i += GridStride()) {
    double s = 0, b = 0;
    for (int64_t r = 0; r < outer; ++r) {
      const float g = dy[r * inner + i];
      s += g * ((x[r * inner + i] - row_stats[r]) * row_stats[outer + r]);
      b += g;
    }
    if (dscale != nullptr) dscale[i] = static_cast<float>(s);
    if (dbias != nullptr) dbias[i] = static_cast<float>(b);
  }
}

unsigned BlocksForRows(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

}  // namespace

cudaError_t LaunchUnaryGrad(UnaryGradOp op, const float* x, const float* dy, float* dx,
                            int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  switch (op) {
    case UnaryGradOp::kErf:
      return Unary<UnaryGradOp::kErf>(x, dy, dx, count, stream);
    case UnaryGradOp::kGeluErf:
      return Unary<UnaryGradOp::kGeluErf>(x, dy, dx, count, stream);
    case UnaryGradOp::kGeluTanh:
      return Unary<UnaryGradOp::kGeluTanh>(x, dy, dx, count, stream);
    case UnaryGradOp::kReciprocal:
      return Unary<UnaryGradOp::kReciprocal>(x, dy, dx, count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchPowGrad(const IndexMap& map, bool wrt_exponent, const float* x, const void* p,
                          bool p_int64, const float* dy, float* dx, cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  if (count <= 0) return cudaSuccess;
  PowGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(map, wrt_exponent, x, p, p_int64, dy, dx,
                                                           count);
  return cudaGetLastError();
}

cudaError_t LaunchMinMaxArgStep(const IndexMap& map, bool is_max, int index, const float* prev,
                                const float* x, float* best, int32_t* arg, cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  if (count <= 0) return cudaSuccess;
  MinMaxArgStepKernel<<<BlocksFor(count), kThreads, 0, stream>>>(map, is_max, index, prev, x, best,
                                                                 arg, count);
  return cudaGetLastError();
}

cudaError_t LaunchMinMaxArgGrad(int64_t count, int which, const int32_t* arg, const float* dy,
                                float* dx, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  MinMaxArgGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(count, which, arg, dy, dx);
  return cudaGetLastError();
}

cudaError_t LaunchMinMaxGrad(const IndexMap& map, bool is_max, int which, const float* a,
                             const float* b, const float* dy, float* dx, cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  if (count <= 0) return cudaSuccess;
  MinMaxGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(map, is_max, which, a, b, dy, dx,
                                                              count);
  return cudaGetLastError();
}

cudaError_t LaunchClipGrad(int64_t count, const float* x, const float* lo_ptr, float lo,
                           const float* hi_ptr, float hi, const float* dy, float* dx, float* dmin,
                           float* dmax, cudaStream_t stream) {
  if (dx != nullptr && count > 0) {
    ClipGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(count, x, lo_ptr, lo, hi_ptr, hi, dy,
                                                              dx);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (dmin == nullptr && dmax == nullptr) return cudaSuccess;
  ClipBoundsKernel<<<1, kThreads, 0, stream>>>(count, x, lo_ptr, lo, hi_ptr, hi, dy, dmin, dmax);
  return cudaGetLastError();
}

cudaError_t LaunchSliceGrad(const SliceMap& m, int64_t x_count, const float* dy, float* dx,
                            cudaStream_t stream) {
  if (x_count <= 0) return cudaSuccess;
  cudaError_t err = cudaMemsetAsync(dx, 0, x_count * sizeof(float), stream);
  const int64_t count = SliceOutputCount(m);
  if (err != cudaSuccess || count <= 0) return err;
  SliceGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(m, dy, dx, count);
  return cudaGetLastError();
}

cudaError_t LaunchPadGrad(const IndexMap& map, int64_t base, const float* dy, float* dx,
                          cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  if (count <= 0) return cudaSuccess;
  PadGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(map, base, dy, dx, count);
  return cudaGetLastError();
}

cudaError_t LaunchGatherGrad(const GatherGeometry& g, const int64_t* indices, const float* dy,
                             float* dx, cudaStream_t stream) {
  const int64_t total = g.outer * g.axis_dim * g.inner;
  if (total <= 0) return cudaSuccess;
  GatherGradKernel<<<BlocksFor(total), kThreads, 0, stream>>>(g, indices, dy, dx, total);
  return cudaGetLastError();
}

cudaError_t LaunchDropoutTrain(int64_t count, float ratio, uint64_t seed, uint64_t stream_id,
                               const float* x, int64_t* iteration, float* y, bool* mask,
                               cudaStream_t stream) {
  if (count > 0) {
    DropoutKernel<<<BlocksFor(count), kThreads, 0, stream>>>(
        count, ratio, DropoutScale(ratio), seed, stream_id, x, iteration, y, mask);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  IncrementKernel<<<1, 1, 0, stream>>>(iteration);
  return cudaGetLastError();
}

cudaError_t LaunchDropoutGrad(int64_t count, float scale, const float* dy, const bool* mask,
                              float* dx, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  DropoutGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(count, scale, dy, mask, dx);
  return cudaGetLastError();
}

cudaError_t LaunchBnTrain(const BatchNormGeometry& g, float eps, float momentum, float unbias,
                          const float* x, const float* scale, const float* shift, float* rm,
                          float* rv, float* y, float* bm, float* bv, float* out_rm, float* out_rv,
                          cudaStream_t stream) {
  if (g.c <= 0) return cudaSuccess;
  BnTrainKernel<<<BlocksForRows(g.c), kThreads, 0, stream>>>(
      g, eps, momentum, unbias, x, scale, shift, rm, rv, y, bm, bv, out_rm, out_rv);
  return cudaGetLastError();
}

cudaError_t LaunchBnGrad(const BatchNormGeometry& g, float eps, const float* x, const float* scale,
                         const float* bm, const float* bv, const float* dy, float* dx,
                         float* dscale, float* dbias, cudaStream_t stream) {
  if (g.c <= 0) return cudaSuccess;
  BnGradKernel<<<BlocksForRows(g.c), kThreads, 0, stream>>>(g, eps, x, scale, bm, bv, dy, dx,
                                                            dscale, dbias);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormGrad(int64_t outer, int64_t inner, float eps, const float* x,
                                const float* scale, const float* dy, float* dx, float* dscale,
                                float* dbias, float* row_stats, cudaStream_t stream) {
  if (outer <= 0 || inner <= 0) return cudaSuccess;
  LayerNormGradRowsKernel<<<BlocksForRows(outer), kThreads, 0, stream>>>(outer, inner, eps, x,
                                                                         scale, dy, dx, row_stats);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || (dscale == nullptr && dbias == nullptr)) return err;
  LayerNormGradColumnsKernel<<<BlocksFor(inner), kThreads, 0, stream>>>(outer, inner, x, dy,
                                                                        row_stats, dscale, dbias);
  return cudaGetLastError();
}

}  // namespace salus::exec::cuda
