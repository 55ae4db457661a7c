// Launch interface of reduce.cu (C++17: nvcc compiles it): CUB's segmented reductions and the
// small hand-written kernels behind blas_kernels.cc (the reduction's permutation and finishing
// step, Gemm's C broadcast and fused Relu). The index math is reduce_math.h's.
//
// Each function queues its work on `stream` and returns the launch's error; it never waits for
// the work and allocates nothing. Tensors are packed float32 in device memory. Nothing is
// launched for an empty tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exec/cuda/reduce_math.h"

namespace salus::exec::cuda {

// One pass of a reduction (reduce_math.h): out[i] = the `op` of `input`(in[j]) over
// j in [ChunkBegin(pass, i), ChunkEnd(pass, i)), for i < PassOutputs(pass), by
// cub::DeviceSegmentedReduce. With temp == nullptr nothing is launched and *temp_bytes is set to
// the temporary storage the pass needs (the device must be set on the calling thread); otherwise
// temp holds *temp_bytes bytes, aligned to 256.
cudaError_t LaunchSegmentedReduce(const ReducePass& pass, ReduceOp op, ReduceInput input,
                                  const float* in, float* out, void* temp, size_t* temp_bytes,
                                  cudaStream_t stream);

// y[o] = x[PermuteSource(p, o)] for every element of y.
cudaError_t LaunchPermute(const PermuteGeometry& p, const float* x, float* y, cudaStream_t stream);

// In place on y's `count` elements: y / divisor (kDivide) or sqrt(y) (kSqrt).
cudaError_t LaunchReduceFinish(ReduceFinish finish, float divisor, float* y, int64_t count,
                               cudaStream_t stream);

// y = |x| (kAbs) or x * x (kSquare) elementwise over `count` elements (not kPlain: that is a
// copy).
cudaError_t LaunchReduceMap(ReduceInput map, const float* x, float* y, int64_t count,
                            cudaStream_t stream);

// y[e] = beta * c[GemmBiasSource(b, e)] for the m * n elements of y.
cudaError_t LaunchGemmBias(const GemmBias& b, float beta, const float* c, float* y,
                           cudaStream_t stream);

// y = max(y, 0) in place over `count` elements, as the CPU's fused Relu (NaN stays NaN).
cudaError_t LaunchRelu(float* y, int64_t count, cudaStream_t stream);

}  // namespace salus::exec::cuda
