#include "device/cuda_memory_provider.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "common/units.h"

namespace salus::device {
namespace {

std::string Describe(cudaError_t err) {
  return fmt::format("{} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace

std::string CudaMemoryProvider::name() const { return fmt::format("cuda:{}", ordinal_); }

StatusOr<std::byte*> CudaMemoryProvider::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError(name() + ": cannot allocate an arena of 0 bytes");
  cudaError_t err = cudaSetDevice(ordinal_);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return UnavailableError(fmt::format("{}: cannot use the GPU for an arena of {} ({} bytes): {}",
                                        name(), FormatBytes(bytes), bytes, Describe(err)));
  }
  void* p = nullptr;
  err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    const std::string what = fmt::format("{}: cudaMalloc of an arena of {} ({} bytes) failed: {}",
                                         name(), FormatBytes(bytes), bytes, Describe(err));
    if (err == cudaErrorMemoryAllocation) return ResourceExhaustedError(what);
    return UnavailableError(what);
  }
  return static_cast<std::byte*>(p);
}

Status CudaMemoryProvider::Free(std::byte* ptr, uint64_t bytes) {
  if (ptr == nullptr) return InvalidArgumentError(name() + ": free of a null range");
  cudaError_t err = cudaSetDevice(ordinal_);
  if (err == cudaSuccess) err = cudaFree(ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return InvalidArgumentError(fmt::format("{}: cudaFree of {} at {} failed: {}", name(),
                                            FormatBytes(bytes), static_cast<void*>(ptr),
                                            Describe(err)));
  }
  return OkStatus();
}

}  // namespace salus::device
