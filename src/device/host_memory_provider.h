// The host provider: each range is one private anonymous mapping with MAP_NORESERVE, so a
// large arena costs address space, not memory, until its pages are touched.
#pragma once

#include <atomic>

#include "device/memory_provider.h"

namespace salus::device {

class HostMemoryProvider final : public MemoryProvider {
 public:
  std::string name() const override { return "host"; }
  bool host_accessible() const override { return true; }
  uint64_t alignment() const override;  // the page size

  StatusOr<std::byte*> Allocate(uint64_t bytes) override;
  Status Free(std::byte* ptr, uint64_t bytes) override;

  // Bytes mapped and not yet returned.
  uint64_t mapped_bytes() const { return mapped_bytes_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> mapped_bytes_{0};
};

}  // namespace salus::device
