// Launch interface of elementwise.cu (C++17: nvcc compiles it): the hand-written kernels behind
// basic_kernels.cc. The per-element math and index maps are element_math.h's, which the CPU
// kernels share.
//
// Each function queues its kernels on `stream` and returns the launch's error
// (cudaGetLastError); it never waits for them and allocates nothing. Tensors are packed float32
// (labels int64) in device memory. Nothing is launched for an empty tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "exec/element_math.h"

namespace salus::exec::cuda {

// y = ApplyUnary(op, alpha, x) over `count` elements.
cudaError_t LaunchUnary(UnaryOp op, float alpha, const float* x, float* y, int64_t count,
                        cudaStream_t stream);

// z[e] = ApplyBinary(op, a[off[0]], b[off[1]]) with off = MapIndex(map, e), for every element
// of the map.
cudaError_t LaunchBinary(BinaryOp op, const IndexMap& map, const float* a, const float* b, float* z,
                         cudaStream_t stream);

// The binary ops with an int64 kernel: Add, Sub and Mul. Not Div: its zero divisor is an error
// the CPU reports, which a kernel could not without a host read.
inline bool HasInt64Kernel(BinaryOp op) {
  return op == BinaryOp::kAdd || op == BinaryOp::kSub || op == BinaryOp::kMul;
}

// The same over int64 tensors with ApplyBinaryInt64, for the ops HasInt64Kernel names; other
// ops are cudaErrorInvalidValue.
cudaError_t LaunchBinaryInt64(BinaryOp op, const IndexMap& map, const int64_t* a, const int64_t* b,
                              int64_t* z, cudaStream_t stream);

// y[e] = x[MapIndex(map, e)[0]] for every element of the map: Transpose, with the input's
// strides permuted into the output's dim order.
cudaError_t LaunchGather(const IndexMap& map, const float* x, float* y, cudaStream_t stream);

// y[o] = x[PadSourceIndex(map, o)], or `value` where that is padding.
cudaError_t LaunchPad(const PadMap& map, float value, const float* x, float* y,
                      cudaStream_t stream);
cudaError_t LaunchPad(const PadMap& map, int64_t value, const int64_t* x, int64_t* y,
                      cudaStream_t stream);

// y[DepthToSpaceTarget(g, i)] = x[i] for every input element.
cudaError_t LaunchDepthToSpace(const DepthToSpaceGeometry& g, const float* x, float* y,
                               cudaStream_t stream);

// SoftmaxCrossEntropyLoss forward, as the CPU's SceForward: every row's SceRow (one thread per
// row) writes the log-probabilities into logp, and its term into loss (reduction none) or into
// row_loss and row_weight (s.n * s.d floats each, scratch). For mean and sum, one thread block
// then sums the terms and weights in double in a fixed order and writes SceReduce into loss[0]:
// deterministic, with no atomics. weights may be null; row_loss and row_weight are unused (may
// be null) for reduction none.
cudaError_t LaunchSoftmaxCrossEntropy(const SceSpec& s, const float* scores, const int64_t* labels,
                                      const float* weights, float* logp, float* row_loss,
                                      float* row_weight, float* loss, cudaStream_t stream);

}  // namespace salus::exec::cuda
