// Launch interface of pool_bn.cu (C++17: nvcc compiles it): the hand-written kernels behind
// cudnn_kernels.cc, for what cuDNN cannot express with the CPU's semantics (Note [cuDNN windows]
// in cudnn_kernels.cc) and for batch normalization's running statistics.
//
// Each function queues one kernel on `stream` and returns the launch's error
// (cudaGetLastError); it never waits for the kernel. Tensors are packed float32 in device memory.
// Nothing is launched for an empty tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "exec/cuda/pool_math.h"

namespace salus::exec::cuda {

// y[o] = PoolAt(g, x, o) for every output element (pool_math.h).
cudaError_t LaunchPool(const PoolGeometry& g, const float* x, float* y, cudaStream_t stream);

// y[o] = x[PadSource(g, o)], or 0 where PadSource is -1 (pool_math.h).
cudaError_t LaunchPadCopy(const PadGeometry& g, const float* x, float* y, cudaStream_t stream);

// Batch normalization's view of x: [n, channels, spatial] (the dims after the channels flattened).
struct BnShape {
  int64_t n = 0;
  int64_t channels = 0;
  int64_t spatial = 1;
};

// y = scale * (x - mean) / sqrt(var + epsilon) + bias, per channel: the CPU's formula, with
// epsilon below what cuDNN accepts, and with the batch statistics of BnBatchStats.
cudaError_t LaunchBnNormalize(const BnShape& s, float epsilon, const float* x, const float* scale,
                              const float* bias, const float* mean, const float* var, float* y,
                              cudaStream_t stream);

// Per channel, the mean and the biased variance (sum of squared deviations over n * spatial) of
// x, as the CPU's batch statistics. Two passes in double, one thread block per channel, a fixed
// reduction order: deterministic.
cudaError_t LaunchBnBatchStats(const BnShape& s, const float* x, float* mean, float* var,
                               cudaStream_t stream);

// Training-mode running statistics, as the CPU computes them:
//   out_mean = running_mean * momentum + batch_mean * (1 - momentum)
//   out_var  = running_var * momentum + batch_var * var_scale * (1 - momentum)
// var_scale turns the variance at hand into the biased batch variance ((m - 1) / m for an
// unbiased one over m elements, 1 when it is already biased). Either output may be null; outputs
// may alias the running inputs.
cudaError_t LaunchBnRunningUpdate(int64_t channels, float momentum, float var_scale,
                                  const float* running_mean, const float* running_var,
                                  const float* batch_mean, const float* batch_var, float* out_mean,
                                  float* out_var, cudaStream_t stream);

}  // namespace salus::exec::cuda
