#include "mem/persistent_region.h"

#include <algorithm>

#include "common/check.h"

namespace salus::mem {

uint64_t PersistentRegion::ExtentWith(uint64_t bytes) const {
  if (bytes == 0) return extent();
  const auto it = holes_.lower_bound({bytes, 0});
  return it != holes_.end() ? extent() : extent() + bytes;
}

void PersistentRegion::AddHole(uint64_t offset, uint64_t size) {
  if (size > 0) holes_.emplace(size, offset);
}

void PersistentRegion::DropHole(uint64_t offset, uint64_t size) {
  if (size > 0) holes_.erase({size, offset});
}

uint64_t PersistentRegion::Place(uint64_t bytes) {
  SALUS_DCHECK(bytes > 0, "a persistent block of 0 bytes");
  uint64_t offset;
  const auto it = holes_.lower_bound({bytes, 0});
  if (it != holes_.end()) {
    const auto [hole_size, hole_offset] = *it;
    holes_.erase(it);
    offset = hole_offset + hole_size - bytes;  // the top end: the rest stays below
    AddHole(hole_offset, hole_size - bytes);
  } else {
    SALUS_DCHECK(floor() >= bytes, "persistent region grows below the arena");
    offset = floor() - bytes;
  }
  blocks_.emplace(offset, bytes);
  block_bytes_ += bytes;
  return offset;
}

bool PersistentRegion::Remove(uint64_t offset) {
  const auto it = blocks_.find(offset);
  if (it == blocks_.end()) return false;
  const uint64_t end = offset + it->second;
  const auto next = std::next(it);
  const uint64_t upper = next == blocks_.end() ? capacity_ : next->first;
  DropHole(end, upper - end);
  if (it == blocks_.begin()) {
    // The lowest block: the floor rises to the next block, and the space goes to the lanes.
  } else {
    const auto prev = std::prev(it);
    const uint64_t prev_end = prev->first + prev->second;
    DropHole(prev_end, offset - prev_end);
    AddHole(prev_end, upper - prev_end);
  }
  block_bytes_ -= it->second;
  blocks_.erase(it);
  // Without blocks there are no holes: the floor is back at the capacity.
  if (blocks_.empty()) holes_.clear();
  return true;
}

std::vector<std::pair<uint64_t, uint64_t>> PersistentRegion::Holes() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  out.reserve(holes_.size());
  for (const auto& [size, offset] : holes_) out.emplace_back(offset, size);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace salus::mem
