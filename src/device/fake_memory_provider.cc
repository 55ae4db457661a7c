#include "device/fake_memory_provider.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/units.h"

namespace salus::device {

StatusOr<std::byte*> FakeMemoryProvider::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("fake provider: cannot allocate 0 bytes");
  MutexLock lock(&mu_);
  ++calls_;
  if (options_.fuse && calls_ > *options_.fuse) {
    return ResourceExhaustedError(
        fmt::format("fake provider: fuse blown: call {} to allocate {} after a fuse of {} calls",
                    calls_, FormatBytes(bytes), *options_.fuse));
  }
  const uint64_t limit = std::min(options_.device_bytes, kMaxDeviceBytes);
  if (bytes > limit || live_bytes_ > limit - bytes) {
    return ResourceExhaustedError(fmt::format(
        "fake provider: cannot allocate {} ({} bytes): {} of a {} device already in use",
        FormatBytes(bytes), bytes, FormatBytes(live_bytes_), FormatBytes(limit)));
  }
  const uint64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (next_ - kFakeBase > kMaxDeviceBytes * 4 - rounded) {
    return ResourceExhaustedError(
        fmt::format("fake provider: address space exhausted allocating {}", FormatBytes(bytes)));
  }
  const uint64_t addr = next_;
  next_ += rounded;
  live_.emplace(addr, bytes);
  live_bytes_ += bytes;
  return reinterpret_cast<std::byte*>(addr);
}

Status FakeMemoryProvider::Free(std::byte* ptr, uint64_t bytes) {
  MutexLock lock(&mu_);
  const auto it = live_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == live_.end()) {
    return InvalidArgumentError(fmt::format(
        "fake provider: free of {} at {}, which it did not hand out or already took back",
        FormatBytes(bytes), static_cast<void*>(ptr)));
  }
  if (it->second != bytes) {
    return InvalidArgumentError(fmt::format("fake provider: free of {} at {}, allocated as {}",
                                            FormatBytes(bytes), static_cast<void*>(ptr),
                                            FormatBytes(it->second)));
  }
  live_bytes_ -= bytes;
  live_.erase(it);
  return OkStatus();
}

StatusOr<std::byte*> FakeMemoryProvider::AllocateHost(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("fake provider: host memory of 0 bytes");
  MutexLock lock(&mu_);
  const uint64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  const uint64_t addr = next_host_;
  next_host_ += rounded;
  live_host_.emplace(addr, bytes);
  live_host_bytes_ += bytes;
  return reinterpret_cast<std::byte*>(addr);
}

Status FakeMemoryProvider::FreeHost(std::byte* ptr, uint64_t bytes) {
  MutexLock lock(&mu_);
  const auto it = live_host_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == live_host_.end() || it->second != bytes) {
    return InvalidArgumentError(fmt::format(
        "fake provider: free of {} of host memory at {}, which it did not hand out as such",
        FormatBytes(bytes), static_cast<void*>(ptr)));
  }
  live_host_bytes_ -= bytes;
  live_host_.erase(it);
  return OkStatus();
}

Status FakeMemoryProvider::CopyToHost(std::byte*, const std::byte*, uint64_t) { return OkStatus(); }

Status FakeMemoryProvider::CopyToDevice(std::byte*, const std::byte*, uint64_t) {
  return OkStatus();
}

uint64_t FakeMemoryProvider::live_host_bytes() const {
  MutexLock lock(&mu_);
  return live_host_bytes_;
}

uint64_t FakeMemoryProvider::live_bytes() const {
  MutexLock lock(&mu_);
  return live_bytes_;
}

uint64_t FakeMemoryProvider::allocate_calls() const {
  MutexLock lock(&mu_);
  return calls_;
}

}  // namespace salus::device
