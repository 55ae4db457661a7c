// Launch geometry and block-level helpers shared by the hand-written CUDA kernels (device
// code only: included by .cu files, C++17).
#pragma once

#include <algorithm>
#include <cstdint>

namespace salus::exec::cuda {

// Threads per block of every hand-written kernel; a power of two (BlockSum halves it).
inline constexpr int kThreads = 256;
// Grid-stride loops cover any size, so the grid is capped; this many blocks fill any current GPU.
inline constexpr int64_t kMaxBlocks = 65535;

inline unsigned BlocksFor(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
}

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

// The sum of every thread's `v` in a block of kThreads threads, returned to all of them.
// `partial` holds kThreads doubles; the tree has a fixed shape, so the sum is the same on every
// run.
__device__ __forceinline__ double BlockSum(double* partial, double v) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();  // before the next call overwrites partial
  return total;
}

}  // namespace salus::exec::cuda
