#include "device/cuda_memory_provider.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "common/units.h"

namespace salus::device {
namespace {

std::string Describe(cudaError_t err) {
  return fmt::format("{} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
}

// Makes GPU `ordinal` the calling thread's device for one call and gives the thread back the
// device it had: the provider is called from threads that run another GPU's kernels (a lane's
// worker pages or moves a session of another device, the copy thread serves every GPU), and
// those must find their device unchanged.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != ordinal) error_ = cudaSetDevice(ordinal);
  }
  ~DeviceScope() {
    if (previous_ >= 0 && error_ == cudaSuccess) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return error_; }

 private:
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace

std::string CudaMemoryProvider::name() const { return fmt::format("cuda:{}", ordinal_); }

StatusOr<std::byte*> CudaMemoryProvider::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError(name() + ": cannot allocate an arena of 0 bytes");
  const DeviceScope scope(ordinal_);
  cudaError_t err = scope.error();
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
  const DeviceScope scope(ordinal_);
  cudaError_t err = scope.error();
  if (err == cudaSuccess) err = cudaFree(ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return InvalidArgumentError(fmt::format("{}: cudaFree of {} at {} failed: {}", name(),
                                            FormatBytes(bytes), static_cast<void*>(ptr),
                                            Describe(err)));
  }
  return OkStatus();
}

CudaMemoryProvider::~CudaMemoryProvider() {
  if (copy_stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream_));
}

StatusOr<std::byte*> CudaMemoryProvider::AllocateHost(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError(name() + ": host memory of 0 bytes");
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ResourceExhaustedError(fmt::format("{}: cudaMallocHost of {} ({} bytes) failed: {}",
                                              name(), FormatBytes(bytes), bytes, Describe(err)));
  }
  return static_cast<std::byte*>(p);
}

Status CudaMemoryProvider::FreeHost(std::byte* ptr, uint64_t bytes) {
  if (ptr == nullptr) return InvalidArgumentError(name() + ": free of null host memory");
  const cudaError_t err = cudaFreeHost(ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return InvalidArgumentError(fmt::format("{}: cudaFreeHost of {} failed: {}", name(),
                                            FormatBytes(bytes), Describe(err)));
  }
  return OkStatus();
}

int CudaMemoryProvider::PrepareCopyLocked() {
  cudaError_t err = cudaSuccess;
  if (copy_stream_ == nullptr) {
    cudaStream_t s = nullptr;
    err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    copy_stream_ = s;
  }
  return static_cast<int>(err);
}

Status CudaMemoryProvider::Copy(void* dst, const void* src, uint64_t bytes, bool to_host) {
  if (bytes == 0) return OkStatus();
  std::lock_guard<std::mutex> lock(copy_mu_);
  const DeviceScope scope(ordinal_);
  cudaError_t err = scope.error();
  if (err == cudaSuccess) err = static_cast<cudaError_t>(PrepareCopyLocked());
  const auto stream = static_cast<cudaStream_t>(copy_stream_);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(dst, src, bytes,
                          to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return InternalError(fmt::format("{}: copying {} {} failed: {}", name(), FormatBytes(bytes),
                                     to_host ? "to the host" : "to the device", Describe(err)));
  }
  return OkStatus();
}

Status CudaMemoryProvider::CopyToHost(std::byte* host, const std::byte* device, uint64_t bytes) {
  return Copy(host, device, bytes, true);
}

Status CudaMemoryProvider::CopyToDevice(std::byte* device, const std::byte* host, uint64_t bytes) {
  return Copy(device, host, bytes, false);
}

bool CudaMemoryProvider::CanCopyToPeer(const MemoryProvider& to) const {
  return dynamic_cast<const CudaMemoryProvider*>(&to) != nullptr;
}

Status CudaMemoryProvider::CopyToPeer(std::byte* dst, MemoryProvider& to, const std::byte* src,
                                      uint64_t bytes) {
  auto* peer = dynamic_cast<CudaMemoryProvider*>(&to);
  if (peer == nullptr) {
    return FailedPreconditionError(
        fmt::format("{} cannot copy into {}'s memory directly", name(), to.name()));
  }
  if (bytes == 0) return OkStatus();
  std::lock_guard<std::mutex> lock(copy_mu_);
  const DeviceScope scope(ordinal_);
  cudaError_t err = scope.error();
  if (err == cudaSuccess) err = static_cast<cudaError_t>(PrepareCopyLocked());
  if (err == cudaSuccess && peer->ordinal_ != ordinal_ && !peers_.contains(peer->ordinal_)) {
    // Once per pair: where the GPUs can reach each other, the copy skips the host.
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, ordinal_, peer->ordinal_) == cudaSuccess && can != 0) {
      const cudaError_t enabled = cudaDeviceEnablePeerAccess(peer->ordinal_, 0);
      if (enabled != cudaSuccess) cudaGetLastError();  // already enabled, or refused: staged
    }
    peers_.insert(peer->ordinal_);
  }
  const auto stream = static_cast<cudaStream_t>(copy_stream_);
  if (err == cudaSuccess) {
    err = cudaMemcpyPeerAsync(dst, peer->ordinal_, src, ordinal_, bytes, stream);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return InternalError(fmt::format("{}: copying {} to {} failed: {}", name(), FormatBytes(bytes),
                                     peer->name(), Describe(err)));
  }
  return OkStatus();
}

}  // namespace salus::device
