// Launch interface of grad.cu (C++17: nvcc compiles it): the hand-written backward and optimizer
// kernels behind grad_kernels.cc. The per-element math is grad_math.h's and pool_math.h's, which
// the host tests run against the CPU.
//
// Each function queues its kernels on `stream` and returns the launch's error
// (cudaGetLastError); it never waits for them and allocates nothing. Tensors are packed float32
// (labels int64) in device memory. Nothing is launched for an empty tensor. No kernel uses
// atomics: every sum has a fixed order, so two runs give bit-identical results.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exec/cuda/pool_math.h"
#include "exec/element_math.h"
#include "exec/grad_math.h"

namespace salus::exec::cuda {

// dx = ApplyEltwiseGrad(op, alpha, x, dy) over `count` elements.
cudaError_t LaunchEltwiseGrad(EltwiseGradOp op, float alpha, const float* x, const float* dy,
                              float* dx, int64_t count, cudaStream_t stream);

// y[o] = SumToAt(map, scale, x, o) for every output element, up to the order of the additions
// (Note [Long sums] in grad.cu). `scratch` holds SumToScratchBytes(map) bytes (8-byte aligned;
// may be null when that is 0) for the partial sums of long ones.
size_t SumToScratchBytes(const SumToMap& map);
cudaError_t LaunchSumTo(const SumToMap& map, float scale, const float* x, float* y, void* scratch,
                        cudaStream_t stream);

// y[e] = scale * x[MapIndex(map, e)[0]] for every element of the map (SalusExpand).
cudaError_t LaunchBroadcastScale(const IndexMap& map, float scale, const float* x, float* y,
                                 cudaStream_t stream);

// dx[i] = dy[DepthToSpaceTarget(g, i)], g the forward input's geometry.
cudaError_t LaunchDepthToSpaceGrad(const DepthToSpaceGeometry& g, const float* dy, float* dx,
                                   cudaStream_t stream);

// SoftmaxCrossEntropyLoss's gradient: the rows' log-probabilities into logp (n*c*d floats), the
// weight sum of the counted rows into *weight_sum (one block, in double, fixed order), then
// dScores. weights may be null.
cudaError_t LaunchSceGrad(const SceSpec& s, const float* scores, const int64_t* labels,
                          const float* weights, const float* dloss, float* logp, double* weight_sum,
                          float* dx, cudaStream_t stream);

// SgdStep over `count` elements; the rate is *lr_input when it is not null, else lr. v may be
// null (no momentum).
cudaError_t LaunchSgdUpdate(const SgdHyper& h, float lr, const float* lr_input, int64_t count,
                            float* p, const float* grad, float* v, cudaStream_t stream);

// One Adam step: a single thread advances *step and writes AdamScalarsFor into *scalars (device
// memory), then AdamStep over `count` elements. The step count never leaves the device.
cudaError_t LaunchAdamUpdate(const AdamHyper& h, float lr, const float* lr_input, int64_t count,
                             float* p, const float* grad, float* m, float* v, float* step,
                             AdamScalars* scalars, cudaStream_t stream);

// Pooling's gradient: PoolTap into tap (PoolOutputCount int64s), then PoolGradAt for every
// input element.
cudaError_t LaunchPoolGrad(const PoolGeometry& g, const float* x, const float* dy, int64_t* tap,
                           float* dx, cudaStream_t stream);
// The second pass alone, from taps SalusMaxPool wrote (LaunchMaxPoolTaps).
cudaError_t LaunchPoolGradFromTaps(const PoolGeometry& g, const float* dy, const int64_t* tap,
                                   float* dx, cudaStream_t stream);
// SalusMaxPool: each output's tap (PoolTap) into tap and its value (PoolAtTap) into y.
cudaError_t LaunchMaxPoolTaps(const PoolGeometry& g, const float* x, float* y, int64_t* tap,
                              cudaStream_t stream);

}  // namespace salus::exec::cuda
