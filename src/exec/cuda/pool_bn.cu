// The hand-written kernels of cudnn_kernels.cc (pool_bn_launch.h). Elementwise kernels are
// grid-stride loops over 64-bit indices whose per-element math is pool_math.h's; the batch
// statistics reduce one channel per thread block in a fixed order, so every result is
// deterministic.
#include <algorithm>
#include <cstdint>

#include "exec/cuda/grid.cuh"
#include "exec/cuda/pool_bn_launch.h"
#include "exec/hd.h"

namespace salus::exec::cuda {
namespace {

__global__ void PoolKernel(PoolGeometry g, const float* __restrict__ x, float* __restrict__ y,
                           int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) y[o] = PoolAt(g, x, o);
}

__global__ void PadCopyKernel(PadGeometry g, const float* __restrict__ x, float* __restrict__ y,
                              int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) {
    const int64_t src = PadSource(g, o);
    y[o] = src < 0 ? 0.f : x[src];
  }
}

__global__ void BnNormalizeKernel(BnShape s, float epsilon, const float* __restrict__ x,
                                  const float* __restrict__ scale, const float* __restrict__ bias,
                                  const float* __restrict__ mean, const float* __restrict__ var,
                                  float* __restrict__ y, int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) {
    const int64_t c = (o / s.spatial) % s.channels;
    const float sm = scale[c] / sqrtf(var[c] + epsilon);
    y[o] = sm * (x[o] - mean[c]) + bias[c];
  }
}

// One block per channel (blockIdx.x), kThreads threads.
__global__ void BnBatchStatsKernel(BnShape s, const float* __restrict__ x, float* __restrict__ mean,
                                   float* __restrict__ var) {
  __shared__ double partial[kThreads];
  const int64_t c = blockIdx.x;
  const int64_t m = s.n * s.spatial;
  auto at = [&](int64_t i) {
    const int64_t batch = i / s.spatial;
    return static_cast<double>(x[(batch * s.channels + c) * s.spatial + i % s.spatial]);
  };
  double sum = 0;
  for (int64_t i = threadIdx.x; i < m; i += kThreads) sum += at(i);
  const double mu = BlockSum(partial, sum) / static_cast<double>(m);
  double squares = 0;
  for (int64_t i = threadIdx.x; i < m; i += kThreads) {
    const double d = at(i) - mu;
    squares += d * d;
  }
  const double variance = BlockSum(partial, squares) / static_cast<double>(m);
  if (threadIdx.x == 0) {
    mean[c] = static_cast<float>(mu);
    var[c] = static_cast<float>(variance);
  }
}

// No __restrict__: the outputs may alias the running inputs (each element is read, then written,
// by one thread).
__global__ void BnRunningUpdateKernel(int64_t channels, float momentum, float var_scale,
                                      const float* running_mean, const float* running_var,
                                      const float* batch_mean, const float* batch_var,
                                      float* out_mean, float* out_var) {
  for (int64_t c = FirstIndex(); c < channels; c += GridStride()) {
    if (out_mean != nullptr) {
      out_mean[c] = running_mean[c] * momentum + batch_mean[c] * (1 - momentum);
    }
    if (out_var != nullptr) {
      out_var[c] = running_var[c] * momentum + batch_var[c] * var_scale * (1 - momentum);
    }
  }
}

}  // namespace

cudaError_t LaunchPool(const PoolGeometry& g, const float* x, float* y, cudaStream_t stream) {
  const int64_t count = PoolOutputCount(g);
  if (count <= 0) return cudaSuccess;
  PoolKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchPadCopy(const PadGeometry& g, const float* x, float* y, cudaStream_t stream) {
  const int64_t count = PadOutputCount(g);
  if (count <= 0) return cudaSuccess;
  PadCopyKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchBnNormalize(const BnShape& s, float epsilon, const float* x, const float* scale,
                              const float* bias, const float* mean, const float* var, float* y,
                              cudaStream_t stream) {
  const int64_t count = s.n * s.channels * s.spatial;
  if (count <= 0) return cudaSuccess;
  BnNormalizeKernel<<<BlocksFor(count), kThreads, 0, stream>>>(s, epsilon, x, scale, bias, mean,
                                                               var, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchBnBatchStats(const BnShape& s, const float* x, float* mean, float* var,
                               cudaStream_t stream) {
  if (s.channels <= 0) return cudaSuccess;
  BnBatchStatsKernel<<<static_cast<unsigned>(s.channels), kThreads, 0, stream>>>(s, x, mean, var);
  return cudaGetLastError();
}

cudaError_t LaunchBnRunningUpdate(int64_t channels, float momentum, float var_scale,
                                  const float* running_mean, const float* running_var,
                                  const float* batch_mean, const float* batch_var, float* out_mean,
                                  float* out_var, cudaStream_t stream) {
  if (channels <= 0 || (out_mean == nullptr && out_var == nullptr)) return cudaSuccess;
  BnRunningUpdateKernel<<<BlocksFor(channels), kThreads, 0, stream>>>(
      channels, momentum, var_scale, running_mean, running_var, batch_mean, batch_var, out_mean,
      out_var);
  return cudaGetLastError();
}

}  // namespace salus::exec::cuda
