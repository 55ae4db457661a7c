// SALUS_HD marks per-element math that both the CPU kernels (host compiler) and the CUDA
// kernels (nvcc) call, so the two devices compute each element with the same code. Headers
// using it must stay valid C++17 with no project headers beyond this one: nvcc compiles the
// CUDA sources as C++17.
#pragma once

#if defined(__CUDACC__)
#define SALUS_HD __host__ __device__ __forceinline__
#else
#define SALUS_HD inline
#endif
