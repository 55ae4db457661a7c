// The CUDA provider: each range is one cudaMalloc on one GPU. Built only with the CUDA
// device (SALUS_HAVE_CUDA); CreateMemoryProvider("cuda:N") is the way to reach it.
#pragma once

#include <atomic>

#include "device/memory_provider.h"

namespace salus::device {

class CudaMemoryProvider final : public MemoryProvider {
 public:
  // cudaMalloc aligns to at least this.
  static constexpr uint64_t kCudaAlignment = 256;

  explicit CudaMemoryProvider(int ordinal) : ordinal_(ordinal) {}

  std::string name() const override;
  bool host_accessible() const override { return false; }
  uint64_t alignment() const override { return kCudaAlignment; }

  // Unavailable when the GPU cannot be used (no driver, no such ordinal); ResourceExhausted
  // when it has not that much free memory.
  StatusOr<std::byte*> Allocate(uint64_t bytes) override;
  Status Free(std::byte* ptr, uint64_t bytes) override;

  int ordinal() const { return ordinal_; }

 private:
  const int ordinal_;
};

}  // namespace salus::device
