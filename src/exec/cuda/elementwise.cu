// The hand-written kernels of basic_kernels.cc (elementwise_launch.h). Elementwise kernels are
// grid-stride loops over 64-bit indices whose per-element math and index maps are
// element_math.h's, instantiated per op so the op's switch folds away. The loss's final sum runs
// in one thread block in a fixed order, so every result is deterministic.
#include <algorithm>
#include <cstdint>

#include "exec/cuda/elementwise_launch.h"
#include "exec/cuda/grid.cuh"
#include "exec/element_math.h"
#include "exec/hd.h"

namespace salus::exec::cuda {
namespace {

template <UnaryOp kOp>
__global__ void UnaryKernel(float alpha, const float* __restrict__ x, float* __restrict__ y,
                            int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) y[i] = ApplyUnary(kOp, alpha, x[i]);
}

template <UnaryOp kOp>
cudaError_t Unary(float alpha, const float* x, float* y, int64_t count, cudaStream_t stream) {
  UnaryKernel<kOp><<<BlocksFor(count), kThreads, 0, stream>>>(alpha, x, y, count);
  return cudaGetLastError();
}

// a and b may be the same tensor (both only read).
template <BinaryOp kOp>
__global__ void BinaryKernel(IndexMap map, const float* a, const float* b, float* __restrict__ z,
                             int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    z[e] = ApplyBinary(kOp, a[off[0]], b[off[1]]);
  }
}

template <BinaryOp kOp>
cudaError_t Binary(const IndexMap& map, const float* a, const float* b, float* z, int64_t count,
                   cudaStream_t stream) {
  BinaryKernel<kOp><<<BlocksFor(count), kThreads, 0, stream>>>(map, a, b, z, count);
  return cudaGetLastError();
}

// int64 Add, Sub and Mul (wrapping, as numpy): rare and small tensors (step counters), so the op
// is a kernel argument rather than a template parameter.
__global__ void BinaryInt64Kernel(BinaryOp op, IndexMap map, const int64_t* a, const int64_t* b,
                                  int64_t* __restrict__ z, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    z[e] = ApplyBinaryInt64(op, a[off[0]], b[off[1]]);
  }
}

__global__ void GatherKernel(IndexMap map, const float* __restrict__ x, float* __restrict__ y,
                             int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    y[e] = x[off[0]];
  }
}

template <typename T>
__global__ void PadKernel(PadMap map, T value, const T* __restrict__ x, T* __restrict__ y,
                          int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) {
    const int64_t src = PadSourceIndex(map, o);
    y[o] = src < 0 ? value : x[src];
  }
}

// One thread per input element: the reads are coalesced, the writes strided by the block size.
__global__ void DepthToSpaceKernel(DepthToSpaceGeometry g, const float* __restrict__ x,
                                   float* __restrict__ y, int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) y[DepthToSpaceTarget(g, i)] = x[i];
}

// One thread per row (batch, position); a row's classes are read with stride s.d, so for
// d > 1 neighbouring threads read neighbouring elements.
__global__ void SceRowsKernel(SceSpec s, const float* __restrict__ scores,
                              const int64_t* __restrict__ labels, const float* __restrict__ weights,
                              float* __restrict__ logp, float* __restrict__ row_loss,
                              float* __restrict__ row_weight, int64_t rows) {
  for (int64_t r = FirstIndex(); r < rows; r += GridStride()) {
    const SceTerm t = SceRow(s, scores, labels, weights, logp, r);
    row_loss[r] = t.loss;
    if (row_weight != nullptr) row_weight[r] = t.weight;
  }
}

// One block of kThreads threads: thread t sums rows t, t + kThreads, ... in order, then the
// block's tree adds the threads' sums.
__global__ void SceReduceKernel(SceSpec s, const float* __restrict__ row_loss,
                                const float* __restrict__ row_weight, float* __restrict__ loss,
                                int64_t rows) {
  __shared__ double partial[kThreads];
  double total = 0, weight_sum = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    total += row_loss[r];
    weight_sum += row_weight[r];
  }
  total = BlockSum(partial, total);
  weight_sum = BlockSum(partial, weight_sum);
  if (threadIdx.x == 0) loss[0] = SceReduce(s, total, weight_sum);
}

}  // namespace

cudaError_t LaunchUnary(UnaryOp op, float alpha, const float* x, float* y, int64_t count,
                        cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  switch (op) {
    case UnaryOp::kLeakyRelu:
      return Unary<UnaryOp::kLeakyRelu>(alpha, x, y, count, stream);
    case UnaryOp::kExp:
      return Unary<UnaryOp::kExp>(alpha, x, y, count, stream);
    case UnaryOp::kLog:
      return Unary<UnaryOp::kLog>(alpha, x, y, count, stream);
    case UnaryOp::kSqrt:
      return Unary<UnaryOp::kSqrt>(alpha, x, y, count, stream);
    case UnaryOp::kNeg:
      return Unary<UnaryOp::kNeg>(alpha, x, y, count, stream);
    case UnaryOp::kAbs:
      return Unary<UnaryOp::kAbs>(alpha, x, y, count, stream);
    case UnaryOp::kSoftplus:
      return Unary<UnaryOp::kSoftplus>(alpha, x, y, count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchBinary(BinaryOp op, const IndexMap& map, const float* a, const float* b, float* z,
                         cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  if (count <= 0) return cudaSuccess;
  switch (op) {
    case BinaryOp::kAdd:
      return Binary<BinaryOp::kAdd>(map, a, b, z, count, stream);
    case BinaryOp::kSub:
      return Binary<BinaryOp::kSub>(map, a, b, z, count, stream);
    case BinaryOp::kMul:
      return Binary<BinaryOp::kMul>(map, a, b, z, count, stream);
    case BinaryOp::kDiv:
      return Binary<BinaryOp::kDiv>(map, a, b, z, count, stream);
    case BinaryOp::kPow:
      return Binary<BinaryOp::kPow>(map, a, b, z, count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchBinaryInt64(BinaryOp op, const IndexMap& map, const int64_t* a, const int64_t* b,
                              int64_t* z, cudaStream_t stream) {
  if (!HasInt64Kernel(op)) return cudaErrorInvalidValue;
  const int64_t count = IndexMapCount(map);
  if (count <= 0) return cudaSuccess;
  BinaryInt64Kernel<<<BlocksFor(count), kThreads, 0, stream>>>(op, map, a, b, z, count);
  return cudaGetLastError();
}

cudaError_t LaunchGather(const IndexMap& map, const float* x, float* y, cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  if (count <= 0) return cudaSuccess;
  GatherKernel<<<BlocksFor(count), kThreads, 0, stream>>>(map, x, y, count);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchPadOf(const PadMap& map, T value, const T* x, T* y, cudaStream_t stream) {
  const int64_t count = PadOutputCount(map);
  if (count <= 0) return cudaSuccess;
  PadKernel<T><<<BlocksFor(count), kThreads, 0, stream>>>(map, value, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchPad(const PadMap& map, float value, const float* x, float* y,
                      cudaStream_t stream) {
  return LaunchPadOf(map, value, x, y, stream);
}

cudaError_t LaunchPad(const PadMap& map, int64_t value, const int64_t* x, int64_t* y,
                      cudaStream_t stream) {
  return LaunchPadOf(map, value, x, y, stream);
}

cudaError_t LaunchDepthToSpace(const DepthToSpaceGeometry& g, const float* x, float* y,
                               cudaStream_t stream) {
  const int64_t count = DepthToSpaceCount(g);
  if (count <= 0) return cudaSuccess;
  DepthToSpaceKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(const SceSpec& s, const float* scores, const int64_t* labels,
                                      const float* weights, float* logp, float* row_loss,
                                      float* row_weight, float* loss, cudaStream_t stream) {
  const int64_t rows = s.n * s.d;
  const bool none = s.reduction == 2;
  if (rows > 0) {
    SceRowsKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(s, scores, labels, weights, logp,
                                                            none ? loss : row_loss,
                                                            none ? nullptr : row_weight, rows);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (none) return cudaSuccess;
  // Also with no rows: the mean or sum of nothing is 0, and loss[0] must be written.
  SceReduceKernel<<<1, kThreads, 0, stream>>>(s, row_loss, row_weight, loss, rows);
  return cudaGetLastError();
}

}  // namespace salus::exec::cuda
