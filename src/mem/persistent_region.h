// PersistentRegion: placement of the sessions' persistent blocks at the top of the arena.
//
// The region grows down from the capacity C: its floor is the lowest block's offset (C when
// there is none), its extent C - floor. A block goes best-fit into a hole between blocks
// (the smallest hole that holds it, at the hole's top end), or, when no hole holds it, just
// below the floor, which moves down. Freeing a block merges it with the holes beside it; when
// it was the lowest block the floor rises to the next block instead.
//
// Blocks are not moved once placed, so holes can make the extent larger than the sum of the
// blocks; admission therefore checks the extent (Note [Persistent footprint] in
// arena_memory_manager.cc). Not thread-safe; the memory manager's lock guards it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace salus::mem {

class PersistentRegion {
 public:
  explicit PersistentRegion(uint64_t capacity) : capacity_(capacity) {}

  uint64_t floor() const { return blocks_.empty() ? capacity_ : blocks_.begin()->first; }
  uint64_t extent() const { return capacity_ - floor(); }
  // Sum of the live blocks' sizes.
  uint64_t block_bytes() const { return block_bytes_; }
  // The extent once a block of `bytes` is placed (Place would put it in a hole or below the
  // floor). Zero bytes place nothing.
  uint64_t ExtentWith(uint64_t bytes) const;

  // Places a block of `bytes` > 0 and returns its offset. The caller has checked that
  // ExtentWith(bytes) leaves room below for the lanes.
  uint64_t Place(uint64_t bytes);
  // Frees the block at `offset`; false when no block starts there.
  bool Remove(uint64_t offset);

  // (offset, size) of live blocks and of holes, in address order.
  const std::map<uint64_t, uint64_t>& blocks() const { return blocks_; }
  std::vector<std::pair<uint64_t, uint64_t>> Holes() const;

 private:
  void AddHole(uint64_t offset, uint64_t size);
  void DropHole(uint64_t offset, uint64_t size);

  uint64_t capacity_;
  uint64_t block_bytes_ = 0;
  std::map<uint64_t, uint64_t> blocks_;            // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> holes_;  // (size, offset), between blocks only
};

}  // namespace salus::mem
