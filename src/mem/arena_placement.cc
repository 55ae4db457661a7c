// The memory manager's physical layout: where lanes sit during their iterations, which
// ranges are in use, and blocks that wait for their range to clear.
//
// Note [Lane placement]
// ~~~~~~~~~~~~~~~~~~~~~
// A lane has two places. Its *layout* place is where it belongs now: open lanes in id order,
// packed from offset 0, each as large as its size (the largest E of its sessions), so the
// lanes occupy exactly [0, ΣL) and the free ephemeral space is one range above them. Its
// *physical* place is where its current iteration runs; it is fixed by BeginIteration, which
// puts the lane at its layout place, and held until EndIteration. Lanes hold nothing between
// iterations (invariant 3), so this is the whole of relocation: a lane whose size or
// neighbours changed starts its next iteration at the new place, nothing is copied.
//   - Growing lane r (step 3) raises ΣL at once, so admission never over-commits; r and every
//     lane above it have new layout places, taken at their next BeginIteration.
//   - A shrink or a close lowers ΣL at once; the lanes above slide down at their next
//     BeginIteration (auto-defragmentation).
//   - A lane's layout place may overlap the physical place of another lane that is still in
//     the iteration it began before the layout changed. BeginIteration then returns
//     UNAVAILABLE naming that lane; once every lane mid-iteration has reached a boundary, all
//     physical places are layout places, which never overlap, so the wait is at most one
//     iteration of each lane that was running when the layout changed.
//   - The same holds for the persistent region, whose blocks never move while resident: a
//     newly placed block may land where a lane mid-iteration still sits at its old place (the
//     space was freed by a shrink or close below it), on a released block that its lane's
//     running iteration may still touch, or on a block whose copy to or from host memory has
//     not ended (Note [Paging]). Such a block is *pending*: Persistent() says UNAVAILABLE until
//     the EndIteration or FinishTransfer that clears it. Layout places never reach the
//     persistent region, because admission keeps F + ΣL ≤ C.
// So physically, at every moment: persistent blocks (placed, retiring or being copied) are
// pairwise disjoint; physical places of lanes mid-iteration are pairwise disjoint and
// disjoint from every placed block; layout places lie in [0, ΣL) below the region's floor.
//
#include <fmt/format.h>

#include <algorithm>

#include "common/check.h"
#include "mem/arena_memory_manager.h"

namespace salus::mem {
namespace {

bool Overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) {
  return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

}  // namespace

std::string ArenaRange(uint64_t offset, uint64_t size) {
  return fmt::format("[{}, {})", offset, offset + size);
}

std::optional<std::string> ArenaMemoryManager::Hazard(uint64_t offset, uint64_t size, LaneId except,
                                                      SessionId except_session) const {
  for (const LaneId id : in_flight_) {
    if (id == except) continue;
    auto it = lanes_.find(id);
    const Lane& l = it != lanes_.end() ? it->second : draining_.at(id);
    if (Overlaps(offset, size, l.placed_offset, l.placed_size)) {
      return fmt::format("lane {} is mid-iteration at {}", id,
                         ArenaRange(l.placed_offset, l.placed_size));
    }
  }
  for (const Retiring& r : retiring_) {
    if (Overlaps(offset, size, r.offset, r.size)) {
      return fmt::format(
          "a released session's block at {} is in use until lane {}'s iteration "
          "ends",
          ArenaRange(r.offset, r.size), r.lane);
    }
  }
  for (const auto& [id, m] : moving_) {
    if (m.session == except_session || !Overlaps(offset, size, m.offset, m.size)) continue;
    return fmt::format("the block at {} is being copied {} (transfer {})",
                       ArenaRange(m.offset, m.size), m.to_host ? "to the host" : "from the host",
                       id);
  }
  return std::nullopt;
}

void ArenaMemoryManager::PlacePendingBlocks() {
  for (auto it = pending_blocks_.begin(); it != pending_blocks_.end();) {
    Session& s = sessions_.at(*it);
    if (Hazard(s.block_offset, s.req.persistent_bytes, 0, s.id)) {
      ++it;
      continue;
    }
    s.block_pending = false;
    it = pending_blocks_.erase(it);
    // A page-in's copy may start once its range is its own.
    for (auto& [id, m] : moving_) {
      if (m.session == s.id && !m.to_host) m.ready = true;
    }
  }
}

uint64_t ArenaMemoryManager::LayoutOffset(LaneId lane) const {
  uint64_t offset = 0;
  for (const auto& [id, l] : lanes_) {
    if (id == lane) break;
    offset += l.size;
  }
  return offset;
}

ArenaMemoryManager::Lane* ArenaMemoryManager::FindLane(LaneId lane) {
  auto it = lanes_.find(lane);
  if (it != lanes_.end()) return &it->second;
  auto d = draining_.find(lane);
  return d != draining_.end() ? &d->second : nullptr;
}

StatusOr<PersistentBlock> ArenaMemoryManager::Persistent(SessionId session) const {
  MutexLock lock(&mu_);
  const auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    const bool waiting = std::any_of(waiting_.begin(), waiting_.end(),
                                     [&](const Waiting& w) { return w.id == session; });
    if (waiting) {
      return FailedPreconditionError(
          fmt::format("session {} is waiting for admission and has no block yet", session));
    }
    return NotFoundError(fmt::format("session {} is not admitted", session));
  }
  const Session& s = it->second;
  SALUS_RETURN_IF_ERROR(ResidentLocked(s));
  if (s.req.persistent_bytes == 0) return PersistentBlock{};
  return PersistentBlock{s.block_offset, s.req.persistent_bytes, base_ + s.block_offset};
}

Status ArenaMemoryManager::ResidentLocked(const Session& s) const {
  switch (s.residence) {
    case Residence::kResident:
      break;
    case Residence::kPagingIn:
      return UnavailableError(fmt::format(
          "session {} is paging in: its state is being copied back; retry when the copy ends",
          s.id));
    case Residence::kPagingOut:
    case Residence::kPagedOut:
      return FailedPreconditionError(
          fmt::format("session {} is {}: page it in first", s.id, ResidenceName(s.residence)));
  }
  if (s.block_pending) {
    return UnavailableError(
        fmt::format("session {}: its persistent block at {} is still in use ({}); retry after that "
                    "ends",
                    s.id, ArenaRange(s.block_offset, s.req.persistent_bytes),
                    Hazard(s.block_offset, s.req.persistent_bytes, 0, s.id).value_or("?")));
  }
  return OkStatus();
}

StatusOr<LaneIteration> ArenaMemoryManager::BeginIteration(LaneId lane) {
  return Begin(lane, std::nullopt);
}

StatusOr<LaneIteration> ArenaMemoryManager::BeginIteration(LaneId lane, SessionId session) {
  return Begin(lane, session);
}

StatusOr<LaneIteration> ArenaMemoryManager::Begin(LaneId id, std::optional<SessionId> session) {
  MutexLock lock(&mu_);
  const auto it = lanes_.find(id);
  if (it == lanes_.end()) {
    if (draining_.contains(id)) {
      return FailedPreconditionError(fmt::format("lane {} has closed", id));
    }
    return NotFoundError(fmt::format("no lane {}", id));
  }
  Lane& lane = it->second;
  if (lane.in_iteration) {
    return FailedPreconditionError(
        fmt::format("lane {} is already mid-iteration (one iteration per lane at a time)", id));
  }
  if (session) {
    const auto s = sessions_.find(*session);
    if (s == sessions_.end() || s->second.lane != id) {
      return InvalidArgumentError(fmt::format("session {} is not in lane {}", *session, id));
    }
    SALUS_RETURN_IF_ERROR(ResidentLocked(s->second).WithContext(fmt::format("lane {}", id)));
  }
  const uint64_t offset = LayoutOffset(id);
  if (auto hazard = Hazard(offset, lane.size, id)) {
    return UnavailableError(
        fmt::format("lane {} cannot be placed at {} yet: {}; retry after "
                    "that ends",
                    id, ArenaRange(offset, lane.size), *hazard));
  }
  SALUS_DCHECK(offset + lane.size <= region_.floor(),
               "a lane's layout place reaches into the persistent region");
  lane.in_iteration = true;
  lane.placed = true;
  lane.placed_offset = offset;
  lane.placed_size = lane.size;
  lane.iteration_session = session;
  lane.counters_at_begin = lane.allocator->stats();
  lane.allocator->Reset(base_ + offset, lane.size);
  in_flight_.insert(id);
  return LaneIteration{id,        lane.lane_class, offset,
                       lane.size, base_ + offset,  lane.allocator.get()};
}

Status ArenaMemoryManager::EndIteration(LaneId id) {
  MutexLock lock(&mu_);
  Lane* lane = FindLane(id);
  if (lane == nullptr) return NotFoundError(fmt::format("no lane {}", id));
  if (!lane->in_iteration) {
    return FailedPreconditionError(fmt::format("lane {} is not mid-iteration", id));
  }
  // Sample the ephemeral region's peak while this iteration's allocations still count.
  MemoryStats now = closed_lane_stats_;
  for (const LaneId f : in_flight_) now.Merge(FindLane(f)->allocator->stats());
  ephemeral_peak_ = std::max(ephemeral_peak_, now.current_bytes);

  const uint64_t iteration_peak = lane->allocator->iteration_peak_bytes();
  lane->allocator->ReleaseAll();
  if (lane->iteration_session) {
    const auto s = sessions_.find(*lane->iteration_session);
    if (s != sessions_.end()) {
      const MemoryStats before = lane->counters_at_begin;
      const MemoryStats after = lane->allocator->stats();
      MemoryStats& e = s->second.ephemeral;
      e.allocated_bytes += after.allocated_bytes - before.allocated_bytes;
      e.freed_bytes += after.freed_bytes - before.freed_bytes;
      e.allocation_count += after.allocation_count - before.allocation_count;
      e.free_count += after.free_count - before.free_count;
      e.peak_bytes = std::max(e.peak_bytes, iteration_peak);
    }
  }
  lane->in_iteration = false;
  lane->iteration_session.reset();
  in_flight_.erase(id);
  std::erase_if(retiring_, [&](const Retiring& r) { return r.lane == id; });
  if (lane->closed) {
    closed_lane_stats_.Merge(lane->allocator->stats());
    draining_.erase(id);
  }
  PlacePendingBlocks();
  DcheckInvariants();
  return OkStatus();
}

}  // namespace salus::mem
