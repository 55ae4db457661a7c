// Allocator statistics as data: one MemoryStats per region, lane and session, the way the
// daemon will expose them (Stats() JSON, metrics). Every byte handed out is counted once in
// `allocated_bytes` and once in `freed_bytes` when it comes back, so at any moment
// current_bytes == allocated_bytes - freed_bytes and peak_bytes >= current_bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>

namespace salus::mem {

struct MemoryStats {
  uint64_t current_bytes = 0;
  uint64_t peak_bytes = 0;
  uint64_t allocated_bytes = 0;
  uint64_t freed_bytes = 0;
  uint64_t allocation_count = 0;
  uint64_t free_count = 0;

  void OnAllocate(uint64_t bytes) {
    current_bytes += bytes;
    peak_bytes = std::max(peak_bytes, current_bytes);
    allocated_bytes += bytes;
    ++allocation_count;
  }
  void OnFree(uint64_t bytes) {
    current_bytes -= bytes;
    freed_bytes += bytes;
    ++free_count;
  }
  // Adds another account's counters (peaks add too: an upper bound of the combined peak).
  void Merge(const MemoryStats& other) {
    current_bytes += other.current_bytes;
    peak_bytes += other.peak_bytes;
    allocated_bytes += other.allocated_bytes;
    freed_bytes += other.freed_bytes;
    allocation_count += other.allocation_count;
    free_count += other.free_count;
  }
  bool Balanced() const {
    return allocated_bytes - freed_bytes == current_bytes && peak_bytes >= current_bytes &&
           allocation_count >= free_count;
  }

  friend bool operator==(const MemoryStats&, const MemoryStats&) = default;
};

// {"current_bytes": .., "peak_bytes": .., "allocated_bytes": .., "freed_bytes": ..,
//  "allocation_count": .., "free_count": ..}
inline nlohmann::json ToJson(const MemoryStats& s) {
  return {{"current_bytes", s.current_bytes},       {"peak_bytes", s.peak_bytes},
          {"allocated_bytes", s.allocated_bytes},   {"freed_bytes", s.freed_bytes},
          {"allocation_count", s.allocation_count}, {"free_count", s.free_count}};
}

}  // namespace salus::mem
