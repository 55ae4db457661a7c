#include "device/host_memory_provider.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/units.h"

namespace salus::device {

uint64_t HostMemoryProvider::alignment() const {
  return static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

StatusOr<std::byte*> HostMemoryProvider::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("host provider: cannot map an arena of 0 bytes");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return ResourceExhaustedError(
        fmt::format("host provider: cannot map an arena of {} ({} bytes): {}", FormatBytes(bytes),
                    bytes, std::strerror(err)));
  }
  mapped_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return static_cast<std::byte*>(p);
}

Status HostMemoryProvider::Free(std::byte* ptr, uint64_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return InvalidArgumentError("host provider: free of a null or empty range");
  }
  if (munmap(ptr, bytes) != 0) {
    const int err = errno;
    return InvalidArgumentError(fmt::format("host provider: cannot unmap {} at {}: {}",
                                            FormatBytes(bytes), static_cast<void*>(ptr),
                                            std::strerror(err)));
  }
  mapped_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  return OkStatus();
}

}  // namespace salus::device
