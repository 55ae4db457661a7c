// The CUDA provider: each range is one cudaMalloc on one GPU. Built only with the CUDA
// device (SALUS_HAVE_CUDA); CreateMemoryProvider("cuda:N") is the way to reach it.
#pragma once

#include <atomic>
#include <mutex>
#include <set>

#include "device/memory_provider.h"

namespace salus::device {

class CudaMemoryProvider final : public MemoryProvider {
 public:
  // cudaMalloc aligns to at least this.
  static constexpr uint64_t kCudaAlignment = 256;

  explicit CudaMemoryProvider(int ordinal) : ordinal_(ordinal) {}

  std::string name() const override;
  std::string kind() const override { return "cuda"; }
  bool host_accessible() const override { return false; }
  uint64_t alignment() const override { return kCudaAlignment; }

  // Unavailable when the GPU cannot be used (no driver, no such ordinal); ResourceExhausted
  // when it has not that much free memory.
  StatusOr<std::byte*> Allocate(uint64_t bytes) override;
  Status Free(std::byte* ptr, uint64_t bytes) override;
  // Pinned (page-locked) host memory, so that copies run asynchronously at full bandwidth.
  StatusOr<std::byte*> AllocateHost(uint64_t bytes) override;
  Status FreeHost(std::byte* ptr, uint64_t bytes) override;
  // On the provider's copy stream (created at the first copy, never the default stream), then
  // waits for that stream alone: kernels on the compute streams keep running meanwhile.
  Status CopyToHost(std::byte* host, const std::byte* device, uint64_t bytes) override;
  Status CopyToDevice(std::byte* device, const std::byte* host, uint64_t bytes) override;
  // Between two GPUs: cudaMemcpyPeerAsync on this provider's copy stream, with peer access
  // enabled first where the two GPUs support it (the copy then goes over NVLink or PCIe
  // without the host; the driver stages it through host memory otherwise).
  bool CanCopyToPeer(const MemoryProvider& to) const override;
  Status CopyToPeer(std::byte* dst, MemoryProvider& to, const std::byte* src,
                    uint64_t bytes) override;
  ~CudaMemoryProvider() override;

  int ordinal() const { return ordinal_; }

 private:
  Status Copy(void* dst, const void* src, uint64_t bytes, bool to_host);
  // Creates the copy stream at the first copy (held copy_mu_, the device set); a CUDA error
  // code, 0 on success.
  int PrepareCopyLocked();

  const int ordinal_;
  std::mutex copy_mu_;           // copies are serialized on the one copy path
  void* copy_stream_ = nullptr;  // cudaStream_t, guarded by copy_mu_
  std::set<int> peers_;  // GPUs whose peer access was set up (or found absent), guarded by copy_mu_
};

}  // namespace salus::device
