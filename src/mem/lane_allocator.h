// LaneAllocator: the allocator of one lane for one iteration at a time.
//
// A lane is [0, size) of ephemeral memory, resolved to an address when the iteration begins
// (Note [Lane placement] in arena_memory_manager.cc). Two kinds of allocation share it:
//   - planned: ReservePlan(bytes) sets aside [0, bytes) for the executable's static memory
//     plan, and AllocatePlanned(offset, size) hands out base + offset for a tensor the plan
//     placed there. The planner already made planned tensors that are alive at the same time
//     disjoint, so this is a bounds check and a counter update: zero fragmentation.
//   - dynamic: Allocate(size) is best-fit over [plan, size) with coalescing on Free, for
//     data-dependent allocations the plan could not size. Chunks live in a vector and refer
//     to their neighbours by index handles; free chunks sit in a set ordered by (size, handle).
// ReleaseAll (the end of the iteration) frees everything at once. An allocation that does not
// fit is ResourceExhausted; a dynamic allocation never overlaps another one or the plan.
//
// Not thread-safe: one iteration runs on one thread at a time (invariant 2). The statistics
// alone may be read from any thread (stats()): they are single-writer atomics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "mem/memory_stats.h"
#include "salus/status.h"

namespace salus::mem {

class LaneAllocator {
 public:
  // Dynamic allocations are rounded up to, and start at, multiples of this (bytes): what CUDA
  // kernels expect of a buffer.
  static constexpr uint64_t kAlignment = 256;

  using Handle = uint32_t;
  static constexpr Handle kNoChunk = UINT32_MAX;

  struct Allocation {
    Handle handle = kNoChunk;
    uint64_t offset = 0;  // from the lane base
    uint64_t size = 0;    // rounded up to kAlignment
    std::byte* address = nullptr;
  };

  LaneAllocator() = default;
  LaneAllocator(const LaneAllocator&) = delete;
  LaneAllocator& operator=(const LaneAllocator&) = delete;

  // Starts an iteration over a lane of `size` bytes at `base`. Any earlier iteration must have
  // ended (ReleaseAll).
  void Reset(std::byte* base, uint64_t size);
  // Ends the iteration: every live allocation is freed.
  void ReleaseAll();

  // Sets aside [0, bytes) for planned allocations. ResourceExhausted when the plan is larger
  // than the lane; FailedPrecondition while any allocation is live.
  Status ReservePlan(uint64_t bytes);
  // base + offset for a tensor of the plan. ResourceExhausted when [offset, offset + bytes)
  // does not fit the lane; InvalidArgument when it leaves the reserved plan or is empty.
  StatusOr<std::byte*> AllocatePlanned(uint64_t offset, uint64_t bytes);

  // Best-fit from the dynamic part. ResourceExhausted when no free range is large enough;
  // InvalidArgument for zero bytes.
  StatusOr<Allocation> Allocate(uint64_t bytes);
  // InvalidArgument for an allocation that is not live in this iteration.
  Status Free(const Allocation& allocation);

  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
  uint64_t plan_bytes() const { return plan_bytes_; }
  // Free bytes of the dynamic part, and its largest free range.
  uint64_t dynamic_free_bytes() const { return dynamic_free_bytes_; }
  uint64_t largest_free_range() const;
  // Live allocations, planned and dynamic, as (offset, size) in address order. For checks.
  std::vector<std::pair<uint64_t, uint64_t>> LiveRanges() const;

  // Counters over the allocator's whole life. Safe to call from any thread.
  MemoryStats stats() const;
  // The most bytes live at once since Reset.
  uint64_t iteration_peak_bytes() const { return iteration_peak_; }

 private:
  struct Chunk {
    uint64_t offset = 0;
    uint64_t size = 0;
    Handle prev = kNoChunk;  // neighbours in address order
    Handle next = kNoChunk;
    bool in_use = false;
  };

  // A counter written by one thread and read by any: a plain load and store, no lock prefix.
  class Counter {
   public:
    void Add(uint64_t d) {
      v_.store(v_.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
    }
    void Sub(uint64_t d) {
      v_.store(v_.load(std::memory_order_relaxed) - d, std::memory_order_relaxed);
    }
    void Max(uint64_t v) {
      if (v > v_.load(std::memory_order_relaxed)) v_.store(v, std::memory_order_relaxed);
    }
    uint64_t Get() const { return v_.load(std::memory_order_relaxed); }

   private:
    std::atomic<uint64_t> v_{0};
  };

  // The free set's nodes are recycled so that an allocate/free pair does not touch the heap.
  void InsertFree(uint64_t size, Handle h);
  void EraseFree(uint64_t size, Handle h);
  Handle NewChunk(uint64_t offset, uint64_t size);
  void DropChunk(Handle h);
  void ResetDynamic(uint64_t from);
  void CountAllocate(uint64_t bytes);

  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t plan_bytes_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> planned_;  // live planned (offset, size)
  uint64_t planned_live_bytes_ = 0;

  std::vector<Chunk> chunks_;
  std::vector<Handle> spare_;  // indices of dropped chunks, for reuse
  using FreeSet = std::set<std::pair<uint64_t, Handle>>;
  FreeSet free_;  // (size, handle) of free chunks
  std::vector<FreeSet::node_type> spare_nodes_;
  uint64_t dynamic_free_bytes_ = 0;
  uint64_t dynamic_live_bytes_ = 0;
  uint64_t dynamic_live_count_ = 0;
  uint64_t iteration_peak_ = 0;

  Counter current_, peak_, allocated_, freed_, allocations_, frees_;
};

}  // namespace salus::mem
