// The device code of blas_kernels.cc (reduce_launch.h): CUB's segmented reductions and the
// small elementwise kernels around cuBLAS and CUB. Elementwise kernels are grid-stride loops over
// 64-bit indices whose index math is reduce_math.h's. Every reduction runs in an order fixed by
// its plan (CUB reduces each segment with one thread block, in a fixed tree): results are
// deterministic, with no atomics.
//
// CUB is slow to compile, so the reductions are instantiated as few times as the ops need: one
// input iterator per ReduceInput and one functor per ReduceOp, 6 combinations in all, all with the
// same offset iterators.
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/device/device_segmented_reduce.cuh>

#include "exec/cuda/grid.cuh"
#include "exec/cuda/reduce_launch.h"
#include "exec/hd.h"

namespace salus::exec::cuda {
namespace {

// Reduction functors. Max and min propagate NaN whichever side it is on, so that they stay
// commutative, as CUB requires.
struct SumOp {
  SALUS_HD float operator()(float a, float b) const { return a + b; }
};
struct ProdOp {
  SALUS_HD float operator()(float a, float b) const { return a * b; }
};
struct MaxOp {
  SALUS_HD float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};
struct MinOp {
  SALUS_HD float operator()(float a, float b) const { return (a < b || a != a) ? a : b; }
};

struct AbsOp {
  SALUS_HD float operator()(float x) const { return fabsf(x); }
};
struct SquareOp {
  SALUS_HD float operator()(float x) const { return x * x; }
};

struct ChunkBeginOp {
  ReducePass pass;
  SALUS_HD int64_t operator()(int64_t i) const { return ChunkBegin(pass, i); }
};
struct ChunkEndOp {
  ReducePass pass;
  SALUS_HD int64_t operator()(int64_t i) const { return ChunkEnd(pass, i); }
};

template <typename InputIt, typename Op>
cudaError_t Segmented(const ReducePass& pass, InputIt in, float* out, Op op, float identity,
                      void* temp, size_t* temp_bytes, cudaStream_t stream) {
  const thrust::counting_iterator<int64_t> index(0);
  const auto begin = thrust::make_transform_iterator(index, ChunkBeginOp{pass});
  const auto end = thrust::make_transform_iterator(index, ChunkEndOp{pass});
  return cub::DeviceSegmentedReduce::Reduce(temp, *temp_bytes, in, out, PassOutputs(pass), begin,
                                            end, op, identity, stream);
}

template <typename InputIt>
cudaError_t SegmentedSum(const ReducePass& pass, InputIt in, float* out, void* temp,
                         size_t* temp_bytes, cudaStream_t stream) {
  return Segmented(pass, in, out, SumOp{}, 0.f, temp, temp_bytes, stream);
}

__global__ void PermuteKernel(PermuteGeometry p, const float* __restrict__ x, float* __restrict__ y,
                              int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) y[o] = x[PermuteSource(p, o)];
}

__global__ void ReduceFinishKernel(ReduceFinish finish, float divisor, float* y, int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) {
    y[i] = finish == ReduceFinish::kSqrt ? sqrtf(y[i]) : y[i] / divisor;
  }
}

__global__ void ReduceMapKernel(ReduceInput map, const float* __restrict__ x, float* __restrict__ y,
                                int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) {
    const float v = x[i];
    y[i] = map == ReduceInput::kAbs ? fabsf(v) : v * v;
  }
}

__global__ void GemmBiasKernel(GemmBias b, float beta, const float* __restrict__ c,
                               float* __restrict__ y, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    y[e] = beta * c[GemmBiasSource(b, e)];
  }
}

__global__ void ReluKernel(float* y, int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) {
    const float v = y[i];
    y[i] = v < 0.f ? 0.f : v;
  }
}

}  // namespace

cudaError_t LaunchSegmentedReduce(const ReducePass& pass, ReduceOp op, ReduceInput input,
                                  const float* in, float* out, void* temp, size_t* temp_bytes,
                                  cudaStream_t stream) {
  if (PassOutputs(pass) <= 0) {
    if (temp == nullptr) *temp_bytes = 0;
    return cudaSuccess;
  }
  // Only sums transform their input (L1, L2, SumSquare); the other ops read it as it is.
  if (op != ReduceOp::kSum && input != ReduceInput::kPlain) return cudaErrorInvalidValue;
  switch (op) {
    case ReduceOp::kSum:
      if (input == ReduceInput::kAbs) {
        return SegmentedSum(pass, thrust::make_transform_iterator(in, AbsOp{}), out, temp,
                            temp_bytes, stream);
      }
      if (input == ReduceInput::kSquare) {
        return SegmentedSum(pass, thrust::make_transform_iterator(in, SquareOp{}), out, temp,
                            temp_bytes, stream);
      }
      return SegmentedSum(pass, in, out, temp, temp_bytes, stream);
    case ReduceOp::kMax:
      return Segmented(pass, in, out, MaxOp{}, -INFINITY, temp, temp_bytes, stream);
    case ReduceOp::kMin:
      return Segmented(pass, in, out, MinOp{}, INFINITY, temp, temp_bytes, stream);
    case ReduceOp::kProd:
      return Segmented(pass, in, out, ProdOp{}, 1.f, temp, temp_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchPermute(const PermuteGeometry& p, const float* x, float* y, cudaStream_t stream) {
  const int64_t count = PermuteCount(p);
  if (count <= 0) return cudaSuccess;
  PermuteKernel<<<BlocksFor(count), kThreads, 0, stream>>>(p, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchReduceFinish(ReduceFinish finish, float divisor, float* y, int64_t count,
                               cudaStream_t stream) {
  if (count <= 0 || finish == ReduceFinish::kNone) return cudaSuccess;
  ReduceFinishKernel<<<BlocksFor(count), kThreads, 0, stream>>>(finish, divisor, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchReduceMap(ReduceInput map, const float* x, float* y, int64_t count,
                            cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (map == ReduceInput::kPlain) return cudaErrorInvalidValue;
  ReduceMapKernel<<<BlocksFor(count), kThreads, 0, stream>>>(map, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchGemmBias(const GemmBias& b, float beta, const float* c, float* y,
                           cudaStream_t stream) {
  const int64_t count = b.m * b.n;
  if (count <= 0) return cudaSuccess;
  GemmBiasKernel<<<BlocksFor(count), kThreads, 0, stream>>>(b, beta, c, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchRelu(float* y, int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  ReluKernel<<<BlocksFor(count), kThreads, 0, stream>>>(y, count);
  return cudaGetLastError();
}

}  // namespace salus::exec::cuda
