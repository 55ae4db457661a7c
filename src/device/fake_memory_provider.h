// The fake provider: hands out addresses in a range no process can map (non-canonical on
// x86-64 and AArch64), so any attempt to touch the memory faults at once. Tests and the
// simulator use it to run the memory manager exactly, with arenas of any size and no device.
//
// The fuse turns a would-be hang or leak into a failure: with `fuse` set to N, the first N
// calls to Allocate may succeed and every later one fails with ResourceExhausted.
#pragma once

#include <map>
#include <optional>

#include "common/thread_annotations.h"
#include "device/memory_provider.h"

namespace salus::device {

class FakeMemoryProvider final : public MemoryProvider {
 public:
  // The first address handed out.
  static constexpr uint64_t kFakeBase = 0x5a15'0000'0000'0000ULL;

  // The most a fake device may hold (1PiB); addresses stay non-canonical up to there.
  static constexpr uint64_t kMaxDeviceBytes = 1ULL << 50;

  struct Options {
    // Allocations beyond this many bytes live at once fail, as a device of this size would.
    uint64_t device_bytes = kMaxDeviceBytes;
    // Allocate calls after this many fail; unset: never.
    std::optional<uint64_t> fuse;
  };

  FakeMemoryProvider() : FakeMemoryProvider(Options{}) {}
  explicit FakeMemoryProvider(Options options) : options_(options) {}

  std::string name() const override { return "fake"; }
  bool host_accessible() const override { return false; }
  uint64_t alignment() const override { return kAlignment; }

  StatusOr<std::byte*> Allocate(uint64_t bytes) override EXCLUDES(mu_);
  Status Free(std::byte* ptr, uint64_t bytes) override EXCLUDES(mu_);
  // Host memory is fake too (addresses above the device's), and copies move nothing: tests
  // and the simulator page state of any size without holding it.
  StatusOr<std::byte*> AllocateHost(uint64_t bytes) override EXCLUDES(mu_);
  Status FreeHost(std::byte* ptr, uint64_t bytes) override EXCLUDES(mu_);
  Status CopyToHost(std::byte* host, const std::byte* device, uint64_t bytes) override;
  Status CopyToDevice(std::byte* device, const std::byte* host, uint64_t bytes) override;
  // Between fake devices, as between GPUs: a peer copy, which moves nothing either.
  bool CanCopyToPeer(const MemoryProvider& to) const override {
    return dynamic_cast<const FakeMemoryProvider*>(&to) != nullptr;
  }
  Status CopyToPeer(std::byte*, MemoryProvider&, const std::byte*, uint64_t) override {
    return OkStatus();
  }

  uint64_t live_bytes() const EXCLUDES(mu_);
  uint64_t live_host_bytes() const EXCLUDES(mu_);
  uint64_t allocate_calls() const EXCLUDES(mu_);

 private:
  static constexpr uint64_t kAlignment = 4096;

  const Options options_;
  mutable Mutex mu_;
  uint64_t next_ GUARDED_BY(mu_) = kFakeBase;
  uint64_t calls_ GUARDED_BY(mu_) = 0;
  uint64_t live_bytes_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, uint64_t> live_ GUARDED_BY(mu_);  // address -> size
  uint64_t next_host_ GUARDED_BY(mu_) = kFakeBase + 4 * kMaxDeviceBytes;
  std::map<uint64_t, uint64_t> live_host_ GUARDED_BY(mu_);
  uint64_t live_host_bytes_ GUARDED_BY(mu_) = 0;
};

}  // namespace salus::device
