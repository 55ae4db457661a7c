// Launch interface of train_ops.cu (C++17: nvcc compiles it): the hand-written backward kernels
// of the tensor ops and the training forms of BatchNormalization, LayerNormalization's gradient
// and Dropout, behind train_kernels.cc. The per-element math and index maps are
// element_math.h's, shared with the CPU's kernels (cpu_tensor_grad_kernels.cc,
// cpu_norm_kernels.cc).
//
// Each function queues its kernels on `stream` and returns the launch's error; it never waits
// and allocates nothing. No kernel uses atomics: a sum is gathered by the thread that owns its
// result, or by one block's fixed tree, so runs repeat bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "exec/element_math.h"

namespace salus::exec::cuda {

// dx = UnaryGrad(op, x, dy) over `count` elements.
cudaError_t LaunchUnaryGrad(UnaryGradOp op, const float* x, const float* dy, float* dx,
                            int64_t count, cudaStream_t stream);

// dx[e] = dy[e] * d(x^p)/d(x or p) at the operands' offsets MapIndex(map, e) (x operand 0, p
// operand 1; p int64 when p_int64).
cudaError_t LaunchPowGrad(const IndexMap& map, bool wrt_exponent, const float* x, const void* p,
                          bool p_int64, const float* dy, float* dx, cudaStream_t stream);

// Two inputs of Min/Max: dx[e] = dy[e] where input `which` is the first to attain the extreme.
cudaError_t LaunchMinMaxGrad(const IndexMap& map, bool is_max, int which, const float* a,
                             const float* b, const float* dy, float* dx, cudaStream_t stream);

// Min/Max of more inputs, one at a time as the CPU takes them: step `index` (1, 2, ...) combines
// the extreme so far (`prev` through operand 0 of map: input 0 broadcast at step 1, then `best`
// itself) with input `index` (x, operand 1), keeping the extreme in best and the first input
// attaining it in arg, both in the output's shape.
cudaError_t LaunchMinMaxArgStep(const IndexMap& map, bool is_max, int index, const float* prev,
                                const float* x, float* best, int32_t* arg, cudaStream_t stream);

// dx[e] = dy[e] where arg[e] == which, 0 elsewhere, over `count` elements.
cudaError_t LaunchMinMaxArgGrad(int64_t count, int which, const int32_t* arg, const float* dy,
                                float* dx, cudaStream_t stream);

// Clip's gradient: dx (may be null) dY where x lies in [lo, hi]; dmin and dmax (may be null)
// the sums of dY where the bound was taken (one block, in double). The bounds are read from
// lo_ptr / hi_ptr (device scalars) when not null, else lo / hi.
cudaError_t LaunchClipGrad(int64_t count, const float* x, const float* lo_ptr, float lo,
                           const float* hi_ptr, float hi, const float* dy, float* dx, float* dmin,
                           float* dmax, cudaStream_t stream);

// dx zeroed, then dx[SliceSourceIndex(m, o)] = dy[o].
cudaError_t LaunchSliceGrad(const SliceMap& m, int64_t x_count, const float* dy, float* dx,
                            cudaStream_t stream);

// dx[e] = dy[base + MapIndex(map, e)[0]]: the block of dY inside Pad's padding.
cudaError_t LaunchPadGrad(const IndexMap& map, int64_t base, const float* dy, float* dx,
                          cudaStream_t stream);

// Gather's gradient, gathered per table element: dx[b, a, i] is the sum over j, in order, of
// dy[b, j, i] where index j (normalised) is a; indices out of range count nowhere.
cudaError_t LaunchGatherGrad(const GatherGeometry& g, const int64_t* indices, const float* dy,
                             float* dx, cudaStream_t stream);

// Dropout in training: y = x * mask * scale with the mask of DropoutKeeps under the key of
// (seed, stream_id, *iteration); then *iteration += 1 (one thread, after the elements).
cudaError_t LaunchDropoutTrain(int64_t count, float ratio, uint64_t seed, uint64_t stream_id,
                               const float* x, int64_t* iteration, float* y, bool* mask,
                               cudaStream_t stream);
cudaError_t LaunchDropoutGrad(int64_t count, float scale, const float* dy, const bool* mask,
                              float* dx, cudaStream_t stream);

// BatchNormalization over [n, c, s] in a training compile: one block per channel computes the
// batch mean and biased variance (two passes, double), writes y, the batch statistics, and
// updates the running statistics in place (copies into out_rm / out_rv when not null).
cudaError_t LaunchBnTrain(const BatchNormGeometry& g, float eps, float momentum, float unbias,
                          const float* x, const float* scale, const float* shift, float* rm,
                          float* rv, float* y, float* bm, float* bv, float* out_rm, float* out_rv,
                          cudaStream_t stream);
// Its gradient from the saved batch statistics: dbias = sum dY, dscale = sum dY x^, dx (each
// may be null), one block per channel.
cudaError_t LaunchBnGrad(const BatchNormGeometry& g, float eps, const float* x, const float* scale,
                         const float* bm, const float* bv, const float* dy, float* dx,
                         float* dscale, float* dbias, cudaStream_t stream);

// LayerNormalization's gradient over rows of `inner`: each row's mean and variance recomputed
// from x, dx per row (one block each); dscale and dbias (may be null) per column, summed over
// the rows in order.
// row_stats: scratch of 2 * outer floats (each row's mean, then its 1 / sqrt(var + eps)).
cudaError_t LaunchLayerNormGrad(int64_t outer, int64_t inner, float eps, const float* x,
                                const float* scale, const float* dy, float* dx, float* dscale,
                                float* dbias, float* row_stats, cudaStream_t stream);

}  // namespace salus::exec::cuda
