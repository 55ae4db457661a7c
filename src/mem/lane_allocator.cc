#include "mem/lane_allocator.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/check.h"
#include "common/units.h"

namespace salus::mem {
namespace {

constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

void LaneAllocator::Reset(std::byte* base, uint64_t size) {
  SALUS_DCHECK(planned_.empty() && dynamic_live_count_ == 0,
               "a lane allocator was reset with live allocations");
  base_ = base;
  size_ = size;
  plan_bytes_ = 0;
  iteration_peak_ = 0;
  ResetDynamic(0);
}

void LaneAllocator::ResetDynamic(uint64_t from) {
  chunks_.clear();
  spare_.clear();
  free_.clear();
  dynamic_free_bytes_ = 0;
  if (from < size_) {
    const Handle h = NewChunk(from, size_ - from);
    InsertFree(size_ - from, h);
    dynamic_free_bytes_ = size_ - from;
  }
}

void LaneAllocator::ReleaseAll() {
  const uint64_t live = planned_live_bytes_ + dynamic_live_bytes_;
  const uint64_t count = planned_.size() + dynamic_live_count_;
  if (count > 0) {
    current_.Sub(live);
    freed_.Add(live);
    frees_.Add(count);
  }
  planned_.clear();
  planned_live_bytes_ = 0;
  dynamic_live_bytes_ = 0;
  dynamic_live_count_ = 0;
  plan_bytes_ = 0;
  ResetDynamic(0);
}

Status LaneAllocator::ReservePlan(uint64_t bytes) {
  if (!planned_.empty() || dynamic_live_count_ > 0) {
    return FailedPreconditionError(
        "lane allocator: a plan can be reserved only while nothing is allocated");
  }
  if (bytes > size_) {
    return ResourceExhaustedError(fmt::format(
        "lane allocator: a memory plan of {} ({} bytes) does not fit a lane of {} ({} bytes)",
        FormatBytes(bytes), bytes, FormatBytes(size_), size_));
  }
  plan_bytes_ = bytes;
  ResetDynamic(AlignUp(bytes, kAlignment));
  return OkStatus();
}

void LaneAllocator::CountAllocate(uint64_t bytes) {
  current_.Add(bytes);
  peak_.Max(current_.Get());
  allocated_.Add(bytes);
  allocations_.Add(1);
  iteration_peak_ = std::max(iteration_peak_, planned_live_bytes_ + dynamic_live_bytes_);
}

StatusOr<std::byte*> LaneAllocator::AllocatePlanned(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("lane allocator: a planned allocation of 0 bytes");
  if (offset > size_ || bytes > size_ - offset) {
    return ResourceExhaustedError(fmt::format(
        "lane allocator: planned allocation at offset {} of {} bytes does not fit a lane of {} "
        "({} bytes)",
        offset, bytes, FormatBytes(size_), size_));
  }
  if (offset + bytes > plan_bytes_) {
    return InvalidArgumentError(fmt::format(
        "lane allocator: planned allocation at offset {} of {} bytes leaves the reserved plan "
        "of {} bytes (ReservePlan sets it)",
        offset, bytes, plan_bytes_));
  }
  planned_.emplace_back(offset, bytes);
  planned_live_bytes_ += bytes;
  CountAllocate(bytes);
  return base_ + offset;
}

void LaneAllocator::InsertFree(uint64_t size, Handle h) {
  if (spare_nodes_.empty()) {
    free_.emplace(size, h);
    return;
  }
  FreeSet::node_type node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  node.value() = {size, h};
  free_.insert(std::move(node));
}

void LaneAllocator::EraseFree(uint64_t size, Handle h) {
  const auto it = free_.find({size, h});
  SALUS_DCHECK(it != free_.end(), "a free chunk is missing from the free set");
  spare_nodes_.push_back(free_.extract(it));
}

LaneAllocator::Handle LaneAllocator::NewChunk(uint64_t offset, uint64_t size) {
  Handle h;
  if (!spare_.empty()) {
    h = spare_.back();
    spare_.pop_back();
    chunks_[h] = Chunk{};
  } else {
    h = static_cast<Handle>(chunks_.size());
    chunks_.emplace_back();
  }
  chunks_[h].offset = offset;
  chunks_[h].size = size;
  return h;
}

void LaneAllocator::DropChunk(Handle h) {
  chunks_[h].size = 0;
  chunks_[h].in_use = false;
  spare_.push_back(h);
}

StatusOr<LaneAllocator::Allocation> LaneAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("lane allocator: an allocation of 0 bytes");
  if (bytes > size_) {
    return ResourceExhaustedError(
        fmt::format("lane allocator: {} ({} bytes) is more than the whole lane of {}",
                    FormatBytes(bytes), bytes, FormatBytes(size_)));
  }
  const uint64_t rounded = AlignUp(bytes, kAlignment);
  auto it = free_.lower_bound({rounded, 0});
  if (it == free_.end()) {
    return ResourceExhaustedError(fmt::format(
        "lane allocator: cannot allocate {} ({} bytes): the largest free range is {} of {} free "
        "in a lane of {}",
        FormatBytes(rounded), rounded, FormatBytes(largest_free_range()),
        FormatBytes(dynamic_free_bytes_), FormatBytes(size_)));
  }
  const Handle h = it->second;
  spare_nodes_.push_back(free_.extract(it));
  if (chunks_[h].size > rounded) {
    // Split: the remainder stays free, after the allocation.
    const Handle rest = NewChunk(chunks_[h].offset + rounded, chunks_[h].size - rounded);
    Chunk& c = chunks_[h];  // NewChunk may have moved the vector
    Chunk& r = chunks_[rest];
    r.prev = h;
    r.next = c.next;
    if (c.next != kNoChunk) chunks_[c.next].prev = rest;
    c.next = rest;
    c.size = rounded;
    InsertFree(r.size, rest);
  }
  Chunk& c = chunks_[h];
  c.in_use = true;
  dynamic_free_bytes_ -= rounded;
  dynamic_live_bytes_ += rounded;
  ++dynamic_live_count_;
  CountAllocate(rounded);
  return Allocation{h, c.offset, rounded, base_ + c.offset};
}

Status LaneAllocator::Free(const Allocation& a) {
  if (a.handle >= chunks_.size() || !chunks_[a.handle].in_use ||
      chunks_[a.handle].offset != a.offset || chunks_[a.handle].size != a.size) {
    return InvalidArgumentError(fmt::format(
        "lane allocator: free of {} bytes at offset {}, which is not live in this iteration",
        a.size, a.offset));
  }
  Handle h = a.handle;
  chunks_[h].in_use = false;
  dynamic_free_bytes_ += a.size;
  dynamic_live_bytes_ -= a.size;
  --dynamic_live_count_;
  current_.Sub(a.size);
  freed_.Add(a.size);
  frees_.Add(1);
  // Coalesce with a free successor, then with a free predecessor.
  const Handle next = chunks_[h].next;
  if (next != kNoChunk && !chunks_[next].in_use) {
    EraseFree(chunks_[next].size, next);
    chunks_[h].size += chunks_[next].size;
    chunks_[h].next = chunks_[next].next;
    if (chunks_[h].next != kNoChunk) chunks_[chunks_[h].next].prev = h;
    DropChunk(next);
  }
  const Handle prev = chunks_[h].prev;
  if (prev != kNoChunk && !chunks_[prev].in_use) {
    EraseFree(chunks_[prev].size, prev);
    chunks_[prev].size += chunks_[h].size;
    chunks_[prev].next = chunks_[h].next;
    if (chunks_[prev].next != kNoChunk) chunks_[chunks_[prev].next].prev = prev;
    DropChunk(h);
    h = prev;
  }
  InsertFree(chunks_[h].size, h);
  return OkStatus();
}

uint64_t LaneAllocator::largest_free_range() const {
  return free_.empty() ? 0 : free_.rbegin()->first;
}

std::vector<std::pair<uint64_t, uint64_t>> LaneAllocator::LiveRanges() const {
  std::vector<std::pair<uint64_t, uint64_t>> out = planned_;
  for (const Chunk& c : chunks_) {
    if (c.in_use) out.emplace_back(c.offset, c.size);
  }
  std::sort(out.begin(), out.end());
  return out;
}

MemoryStats LaneAllocator::stats() const {
  MemoryStats s;
  s.current_bytes = current_.Get();
  s.peak_bytes = peak_.Get();
  s.allocated_bytes = allocated_.Get();
  s.freed_bytes = freed_.Get();
  s.allocation_count = allocations_.Get();
  s.free_count = frees_.Get();
  return s;
}

}  // namespace salus::mem
