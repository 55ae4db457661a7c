#include "device/memory_provider.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "common/units.h"
#include "device/fake_memory_provider.h"
#include "device/host_memory_provider.h"
#ifdef SALUS_HAVE_CUDA
#include "device/cuda_memory_provider.h"
#endif

namespace salus::device {
namespace {

constexpr std::string_view kCudaPrefix = "cuda";

StatusOr<int> ParseCudaOrdinal(std::string_view name) {
  std::string_view rest = name.substr(kCudaPrefix.size());
  if (rest.empty()) return 0;
  if (rest.front() != ':' || rest.size() == 1) {
    return InvalidArgumentError(fmt::format(
        "memory provider '{}': expected 'cuda' or 'cuda:N' with N a GPU ordinal", name));
  }
  rest.remove_prefix(1);
  int ordinal = -1;
  const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), ordinal);
  if (ec != std::errc() || ptr != rest.data() + rest.size() || ordinal < 0) {
    return InvalidArgumentError(
        fmt::format("memory provider '{}': '{}' is not a GPU ordinal", name, rest));
  }
  return ordinal;
}

constexpr uint64_t kHostPoolAlignment = 4096;

}  // namespace

StatusOr<std::byte*> MemoryProvider::AllocateHost(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError(name() + ": host memory of 0 bytes");
  const uint64_t rounded =
      (bytes + kHostPoolAlignment - 1) / kHostPoolAlignment * kHostPoolAlignment;
  void* p = std::aligned_alloc(kHostPoolAlignment, rounded);
  if (p == nullptr) {
    return ResourceExhaustedError(fmt::format("{}: no host memory for {} ({} bytes) of paged state",
                                              name(), FormatBytes(bytes), bytes));
  }
  return static_cast<std::byte*>(p);
}

Status MemoryProvider::FreeHost(std::byte* ptr, uint64_t /*bytes*/) {
  if (ptr == nullptr) return InvalidArgumentError(name() + ": free of null host memory");
  std::free(ptr);
  return OkStatus();
}

Status MemoryProvider::CopyToHost(std::byte* host, const std::byte* device, uint64_t bytes) {
  if (!host_accessible()) {
    return FailedPreconditionError(name() + ": its memory cannot be copied by the host");
  }
  if (bytes > 0) std::memcpy(host, device, bytes);
  return OkStatus();
}

Status MemoryProvider::CopyToDevice(std::byte* device, const std::byte* host, uint64_t bytes) {
  if (!host_accessible()) {
    return FailedPreconditionError(name() + ": its memory cannot be copied by the host");
  }
  if (bytes > 0) std::memcpy(device, host, bytes);
  return OkStatus();
}

Status MemoryProvider::CopyToPeer(std::byte* dst, MemoryProvider& to, const std::byte* src,
                                  uint64_t bytes) {
  if (!CanCopyToPeer(to)) {
    return FailedPreconditionError(
        fmt::format("{} cannot copy into {}'s memory directly", name(), to.name()));
  }
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return OkStatus();
}

StatusOr<std::unique_ptr<MemoryProvider>> CreateMemoryProvider(std::string_view name) {
  if (name == "cpu" || name == "host") {
    return std::unique_ptr<MemoryProvider>(std::make_unique<HostMemoryProvider>());
  }
  if (name == "fake") {
    return std::unique_ptr<MemoryProvider>(std::make_unique<FakeMemoryProvider>());
  }
  if (name.substr(0, kCudaPrefix.size()) == kCudaPrefix) {
    SALUS_ASSIGN_OR_RETURN(const int ordinal, ParseCudaOrdinal(name));
#ifdef SALUS_HAVE_CUDA
    return std::unique_ptr<MemoryProvider>(std::make_unique<CudaMemoryProvider>(ordinal));
#else
    return FailedPreconditionError(
        fmt::format("memory provider '{}' (GPU {}): this build has no CUDA device (configured with "
                    "SALUS_WITH_CUDA=OFF or without the CUDA toolkit and cuDNN)",
                    name, ordinal));
#endif
  }
  return InvalidArgumentError(fmt::format(
      "unknown memory provider '{}' (expected 'cpu', 'host', 'fake', 'cuda' or 'cuda:N')", name));
}

}  // namespace salus::device
