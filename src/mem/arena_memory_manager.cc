// The memory manager: the arena [0, C), the persistent region growing down from C, lanes
// growing up from 0, Algorithm 1 and the admission queue.
//
// Algorithm 1 (DESIGN.md), with F the persistent footprint once P is placed (= ΣP + P when the
// persistent region has no holes, Note [Persistent footprint]) and ΣL the lanes' sizes:
//   1. F + ΣL + E ≤ C                        open a new lane of size E;
//   2. F + ΣL ≤ C and some lane has L ≥ E    join the smallest such lane;
//   3. the smallest lane r with F + ΣL - L_r + E ≤ C (all lanes are < E here): grow r to E,
//                                             at its next iteration boundary, and join it;
//   4. otherwise                              wait in the admission queue.
// Every search stays within the session's lane class (a lane holds sessions of one class).
// kSingleLane keeps at most one lane per class and admits when F + ΣL - L + max(L, E) ≤ C, L
// the class's lane; kExclusive admits when no session is admitted, whatever its class.
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
//   - The same holds for the persistent region, which never moves: a newly placed block may
//     land where a lane mid-iteration still sits at its old place (the space was freed by a
//     shrink or close below it), or on a released block that its lane's running iteration may
//     still touch. Such a block is *pending*: Persistent() says UNAVAILABLE until the
//     EndIteration that clears it. Layout places never reach the persistent region, because
//     admission keeps F + ΣL ≤ C.
// So physically, at every moment: persistent blocks (placed, pending or retiring) are
// pairwise disjoint; physical places of lanes mid-iteration are pairwise disjoint and
// disjoint from every placed block; layout places lie in [0, ΣL) below the region's floor.
//
// Note [Persistent footprint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Blocks do not move (paging and compaction may come later, invariant 4), so a freed block in
// the middle of the region leaves a hole only a block of at most its size can reuse. The lanes
// need [0, ΣL) below the region's floor, so what bounds them is the footprint F = C - floor,
// not ΣP. Admission evaluates Algorithm 1 with the footprint after placing P in place of
// ΣP + P; F ≥ ΣP, so F + ΣL ≤ C implies the safety condition ΣP + ΣL ≤ C (invariant 1).
#include "mem/arena_memory_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "common/check.h"
#include "common/units.h"
#include "device/memory_provider.h"

namespace salus::mem {
namespace {

constexpr uint64_t AlignUp(uint64_t v) {
  return (v + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

bool Overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) {
  return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

std::string Range(uint64_t offset, uint64_t size) {
  return fmt::format("[{}, {})", offset, offset + size);
}

}  // namespace

std::string_view LaneClassName(LaneClass c) {
  return c == LaneClass::kInteractive ? "interactive" : "batch";
}

StatusOr<std::unique_ptr<MemoryManager>> MemoryManager::Create(Options options) {
  SALUS_ASSIGN_OR_RETURN(auto manager, ArenaMemoryManager::Create(std::move(options)));
  return std::unique_ptr<MemoryManager>(std::move(manager));
}

StatusOr<std::unique_ptr<ArenaMemoryManager>> ArenaMemoryManager::Create(Options options) {
  if (options.provider == nullptr) {
    return InvalidArgumentError("memory manager: no memory provider given");
  }
  if (options.capacity == 0 || options.capacity % kArenaAlignment != 0) {
    return InvalidArgumentError(
        fmt::format("memory manager: capacity {} bytes must be a positive multiple of {} bytes",
                    options.capacity, kArenaAlignment));
  }
  auto base = options.provider->Allocate(options.capacity);
  if (!base.ok()) return base.status().WithContext("memory manager: taking the arena");
  return std::unique_ptr<ArenaMemoryManager>(new ArenaMemoryManager(std::move(options), *base));
}

ArenaMemoryManager::ArenaMemoryManager(Options options, std::byte* base)
    : options_(std::move(options)),
      capacity_(options_.capacity),
      base_(base),
      clock_(options_.clock != nullptr ? options_.clock : SteadyClock::Get()),
      region_(options_.capacity) {}

ArenaMemoryManager::~ArenaMemoryManager() {
  // Nothing to report to: a provider that refuses its own range back is a broken invariant.
  const Status s = options_.provider->Free(base_, capacity_);
  SALUS_DCHECK(s.ok(), s.ToString());
  s.IgnoreError();
}

// ----------------------------------------------------------------------------------------
// Admission

ArenaMemoryManager::Decision ArenaMemoryManager::Decide(const Requirement& req) const {
  const uint64_t p = req.persistent_bytes;
  const uint64_t e = req.ephemeral_bytes;
  const uint64_t f = region_.ExtentWith(p);  // ΣP + P without holes
  const uint64_t c = capacity_;
  const uint64_t l = lane_bytes_;
  if (f > c) return {Step::kWait, 0};
  switch (options_.mode) {
    case AdmissionMode::kExclusive:
      if (sessions_.empty() && l + e <= c - f) return {Step::kNewLane, 0};
      return {Step::kWait, 0};
    case AdmissionMode::kSingleLane: {
      const auto mine = lanes_by_size_.lower_bound({req.lane_class, 0, 0});
      if (mine == lanes_by_size_.end() || std::get<0>(*mine) != req.lane_class) {
        if (l <= c - f && e <= c - f - l) return {Step::kNewLane, 0};
        return {Step::kWait, 0};
      }
      const auto [cls, size, id] = *mine;
      // The class's lane grows to max(L, E) and the other classes' lanes stay.
      if (l > c - f || std::max(size, e) - size > c - f - l) return {Step::kWait, 0};
      return {size >= e ? Step::kJoin : Step::kGrow, id};
    }
    case AdmissionMode::kPack:
      break;
  }
  // 1. A new lane of size E.
  if (l <= c - f && e <= c - f - l) return {Step::kNewLane, 0};
  // Joining adds P without adding lane bytes; nothing fits unless the lanes fit beside F.
  if (l > c - f) return {Step::kWait, 0};
  // 2. The best match: the smallest lane of the class with L >= E.
  const LaneClass cls = req.lane_class;
  const auto best = lanes_by_size_.lower_bound({cls, e, 0});
  if (best != lanes_by_size_.end() && std::get<0>(*best) == cls) {
    return {Step::kJoin, std::get<2>(*best)};
  }
  // 3. Lanes in ascending size: the first with F + ΣL - L_r + E ≤ C, i.e. L_r ≥ F + ΣL + E - C.
  // Every lane is smaller than E here (step 2 found none), so growing it to E is the step.
  const uint64_t need = f + l + e - c;  // > 0: step 1 failed
  const auto grow = lanes_by_size_.lower_bound({cls, need, 0});
  if (grow != lanes_by_size_.end() && std::get<0>(*grow) == cls) {
    return {Step::kGrow, std::get<2>(*grow)};
  }
  // 4. Wait.
  return {Step::kWait, 0};
}

Grant ArenaMemoryManager::Apply(const Waiting& w, const Decision& d) {
  Session s;
  s.id = w.id;
  s.req = w.req;
  s.declared = w.declared;
  const uint64_t p = w.req.persistent_bytes;
  const uint64_t e = w.req.ephemeral_bytes;
  if (p > 0) {
    s.block_offset = region_.Place(p);
    if (Hazard(s.block_offset, p, 0)) {
      s.block_pending = true;
      pending_blocks_.push_back(s.id);
    }
  }
  persistent_bytes_ += p;
  s.persistent.OnAllocate(p);
  persistent_stats_.OnAllocate(p);

  Lane* lane = nullptr;
  if (d.step == Step::kNewLane) {
    const LaneId id = next_lane_++;
    Lane& l = lanes_[id];
    l.id = id;
    l.lane_class = w.req.lane_class;
    l.allocator = std::make_unique<LaneAllocator>();
    lanes_by_size_.emplace(l.lane_class, 0, id);
    lane = &l;
  } else {
    lane = &lanes_.at(d.lane);
  }
  lane->sessions.push_back(s.id);
  lane->ephemeral.insert(e);
  if (d.step != Step::kJoin) ResizeLane(*lane, *lane->ephemeral.rbegin());
  s.lane = lane->id;
  sessions_.emplace(s.id, std::move(s));
  return Grant{w.id, lane->id};
}

void ArenaMemoryManager::ResizeLane(Lane& lane, uint64_t size) {
  lanes_by_size_.erase({lane.lane_class, lane.size, lane.id});
  lane_bytes_ = lane_bytes_ - lane.size + size;
  lane.size = size;
  lanes_by_size_.emplace(lane.lane_class, size, lane.id);
}

StatusOr<std::optional<Grant>> ArenaMemoryManager::Admit(SessionId session, Requirement req,
                                                         std::optional<Nanos> timeout) {
  if (timeout && timeout->count() < 0) {
    return InvalidArgumentError(fmt::format("admission of session {}: negative timeout", session));
  }
  const uint64_t c = capacity_;
  if (req.persistent_bytes > c || req.ephemeral_bytes > c ||
      AlignUp(req.persistent_bytes) + AlignUp(req.ephemeral_bytes) > c) {
    return ResourceExhaustedError(fmt::format(
        "session {} can never be admitted: it needs P = {} persistent + E = {} ephemeral, more "
        "than the device's capacity C = {}",
        session, FormatBytes(req.persistent_bytes), FormatBytes(req.ephemeral_bytes),
        FormatBytes(c)));
  }
  MutexLock lock(&mu_);
  if (sessions_.contains(session)) {
    return AlreadyExistsError(fmt::format("session {} is already admitted", session));
  }
  if (std::any_of(waiting_.begin(), waiting_.end(),
                  [&](const Waiting& w) { return w.id == session; })) {
    return AlreadyExistsError(fmt::format("session {} is already waiting for admission", session));
  }
  Waiting w;
  w.id = session;
  w.declared = req;
  w.req = {AlignUp(req.persistent_bytes), AlignUp(req.ephemeral_bytes), req.lane_class};
  const Decision d = Decide(w.req);
  if (d.step != Step::kWait) {
    const Grant g = Apply(w, d);
    DcheckInvariants();
    return std::optional<Grant>(g);
  }
  if (timeout) {
    const Nanos now = clock_->Now();
    // A timeout too long to represent is no timeout.
    if (*timeout <= Nanos::max() - now) w.deadline = now + *timeout;
  }
  waiting_.push_back(w);
  return std::optional<Grant>();
}

std::vector<Grant> ArenaMemoryManager::RetryQueue() {
  std::vector<Grant> granted;
  if (waiting_.empty()) return granted;
  const Nanos now = clock_->Now();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->deadline && *it->deadline <= now) {  // left for ExpireWaiting to report
      ++it;
      continue;
    }
    const Decision d = Decide(it->req);
    if (d.step == Step::kWait) {
      ++it;
      continue;
    }
    granted.push_back(Apply(*it, d));
    it = waiting_.erase(it);
  }
  return granted;
}

void ArenaMemoryManager::LeaveLane(const Session& s) {
  auto it = lanes_.find(s.lane);
  SALUS_DCHECK(it != lanes_.end(), fmt::format("session {} in no open lane", s.id));
  Lane& lane = it->second;
  lane.sessions.erase(std::find(lane.sessions.begin(), lane.sessions.end(), s.id));
  lane.ephemeral.erase(lane.ephemeral.find(s.req.ephemeral_bytes));
  if (!lane.ephemeral.empty()) {
    // Shrinks (or stays): takes effect at the lane's next BeginIteration.
    ResizeLane(lane, *lane.ephemeral.rbegin());
    return;
  }
  lanes_by_size_.erase({lane.lane_class, lane.size, lane.id});
  lane_bytes_ -= lane.size;
  lane.size = 0;
  if (lane.in_iteration) {
    lane.closed = true;
    draining_.emplace(lane.id, std::move(lane));
  } else {
    closed_lane_stats_.Merge(lane.allocator->stats());
  }
  lanes_.erase(it);
}

Status ArenaMemoryManager::Release(SessionId session) {
  std::vector<Grant> granted;
  bool cancelled = false;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      const auto w = std::find_if(waiting_.begin(), waiting_.end(),
                                  [&](const Waiting& x) { return x.id == session; });
      if (w == waiting_.end()) {
        return NotFoundError(fmt::format("release: session {} is not admitted", session));
      }
      waiting_.erase(w);
      cancelled = true;
    } else {
      const Session& s = it->second;
      const uint64_t p = s.req.persistent_bytes;
      if (p > 0) {
        const bool removed = region_.Remove(s.block_offset);
        SALUS_DCHECK(removed, "a session's block is not in the persistent region");
        (void)removed;
        if (s.block_pending) {
          pending_blocks_.erase(std::find(pending_blocks_.begin(), pending_blocks_.end(), s.id));
        } else {
          const auto lane = lanes_.find(s.lane);
          if (lane != lanes_.end() && lane->second.in_iteration) {
            retiring_.push_back({s.block_offset, p, s.lane});
          }
        }
      }
      persistent_bytes_ -= p;
      persistent_stats_.OnFree(p);
      LeaveLane(s);
      sessions_.erase(it);
      granted = RetryQueue();
      DcheckInvariants();
    }
  }
  if (cancelled) {
    if (options_.on_admission_failed) {
      options_.on_admission_failed(
          session,
          CancelledError(fmt::format("session {} released while waiting for admission", session)));
    }
    return OkStatus();
  }
  if (options_.on_admitted) {
    for (const Grant& g : granted) options_.on_admitted(g);
  }
  return OkStatus();
}

void ArenaMemoryManager::CancelWaiting(SessionId session) {
  bool found = false;
  {
    MutexLock lock(&mu_);
    const auto w = std::find_if(waiting_.begin(), waiting_.end(),
                                [&](const Waiting& x) { return x.id == session; });
    if (w != waiting_.end()) {
      waiting_.erase(w);
      found = true;
    }
  }
  if (found && options_.on_admission_failed) {
    options_.on_admission_failed(
        session, CancelledError(fmt::format("session {}: admission cancelled", session)));
  }
}

void ArenaMemoryManager::ExpireWaiting() {
  std::vector<std::pair<SessionId, Nanos>> expired;
  {
    MutexLock lock(&mu_);
    const Nanos now = clock_->Now();
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->deadline && *it->deadline <= now) {
        expired.emplace_back(it->id, now - *it->deadline);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (!options_.on_admission_failed) return;
  for (const auto& [id, late] : expired) {
    options_.on_admission_failed(
        id, DeadlineExceededError(fmt::format(
                "session {}: no room for it before its admission timeout (expired {:.3f}s ago)", id,
                ToSeconds(late))));
  }
}

// ----------------------------------------------------------------------------------------
// Placement

std::optional<std::string> ArenaMemoryManager::Hazard(uint64_t offset, uint64_t size,
                                                      LaneId except) const {
  for (const LaneId id : in_flight_) {
    if (id == except) continue;
    auto it = lanes_.find(id);
    const Lane& l = it != lanes_.end() ? it->second : draining_.at(id);
    if (Overlaps(offset, size, l.placed_offset, l.placed_size)) {
      return fmt::format("lane {} is mid-iteration at {}", id,
                         Range(l.placed_offset, l.placed_size));
    }
  }
  for (const Retiring& r : retiring_) {
    if (Overlaps(offset, size, r.offset, r.size)) {
      return fmt::format(
          "a released session's block at {} is in use until lane {}'s iteration "
          "ends",
          Range(r.offset, r.size), r.lane);
    }
  }
  return std::nullopt;
}

void ArenaMemoryManager::PlacePendingBlocks() {
  for (auto it = pending_blocks_.begin(); it != pending_blocks_.end();) {
    Session& s = sessions_.at(*it);
    if (Hazard(s.block_offset, s.req.persistent_bytes, 0)) {
      ++it;
    } else {
      s.block_pending = false;
      it = pending_blocks_.erase(it);
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
  if (s.req.persistent_bytes == 0) return PersistentBlock{};
  if (s.block_pending) {
    return UnavailableError(
        fmt::format("session {}: its persistent block at {} is still in use ({}); retry after that "
                    "iteration ends",
                    session, Range(s.block_offset, s.req.persistent_bytes),
                    Hazard(s.block_offset, s.req.persistent_bytes, 0).value_or("?")));
  }
  return PersistentBlock{s.block_offset, s.req.persistent_bytes, base_ + s.block_offset};
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
    if (s->second.block_pending) {
      return UnavailableError(fmt::format(
          "lane {}: session {}'s persistent block is still in use ({}); retry after that "
          "iteration ends",
          id, *session,
          Hazard(s->second.block_offset, s->second.req.persistent_bytes, 0).value_or("?")));
    }
  }
  const uint64_t offset = LayoutOffset(id);
  if (auto hazard = Hazard(offset, lane.size, id)) {
    return UnavailableError(
        fmt::format("lane {} cannot be placed at {} yet: {}; retry after "
                    "that iteration ends",
                    id, Range(offset, lane.size), *hazard));
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

// ----------------------------------------------------------------------------------------
// Views

std::vector<LaneInfo> ArenaMemoryManager::Lanes() const {
  MutexLock lock(&mu_);
  std::vector<LaneInfo> out;
  out.reserve(lanes_.size());
  uint64_t offset = 0;
  for (const auto& [id, l] : lanes_) {
    out.push_back(LaneInfo{id, l.lane_class, offset, l.size, l.sessions, l.in_iteration});
    offset += l.size;
  }
  return out;
}

size_t ArenaMemoryManager::WaitingCount() const {
  MutexLock lock(&mu_);
  return waiting_.size();
}

uint64_t ArenaMemoryManager::CommittedBytes() const {
  MutexLock lock(&mu_);
  return persistent_bytes_ + lane_bytes_;
}

MemoryStatsSnapshot ArenaMemoryManager::StatsSnapshot() const {
  MutexLock lock(&mu_);
  return SnapshotLocked();
}

MemoryStatsSnapshot ArenaMemoryManager::SnapshotLocked() const {
  MemoryStatsSnapshot s;
  s.capacity = capacity_;
  s.persistent_committed_bytes = persistent_bytes_;
  s.ephemeral_committed_bytes = lane_bytes_;
  s.persistent_footprint_bytes = region_.extent();
  s.admitted_sessions = sessions_.size();
  s.waiting_sessions = waiting_.size();
  s.persistent = persistent_stats_;
  s.ephemeral = closed_lane_stats_;
  uint64_t offset = 0;
  for (const auto& [id, l] : lanes_) {
    const MemoryStats ls = l.allocator->stats();
    s.ephemeral.Merge(ls);
    s.lanes.push_back(LaneStats{id, offset, l.size, ls});
    offset += l.size;
  }
  for (const auto& [id, l] : draining_) s.ephemeral.Merge(l.allocator->stats());
  ephemeral_peak_ = std::max(ephemeral_peak_, s.ephemeral.current_bytes);
  s.ephemeral.peak_bytes = ephemeral_peak_;
  for (const auto& [id, x] : sessions_) {
    SessionStats ss{id, x.lane, x.req, x.persistent, x.ephemeral};
    ss.ephemeral.current_bytes = 0;
    s.sessions.push_back(ss);
  }
  return s;
}

nlohmann::json ArenaMemoryManager::Stats() const {
  const MemoryStatsSnapshot s = StatsSnapshot();
  nlohmann::json lanes = nlohmann::json::array();
  for (const LaneStats& l : s.lanes) {
    lanes.push_back({{"id", l.lane},
                     {"offset", l.offset},
                     {"size", l.size},
                     {"ephemeral", ToJson(l.ephemeral)}});
  }
  nlohmann::json sessions = nlohmann::json::array();
  for (const SessionStats& x : s.sessions) {
    sessions.push_back({{"id", x.session},
                        {"lane", x.lane},
                        {"persistent_bytes", x.requirement.persistent_bytes},
                        {"ephemeral_bytes", x.requirement.ephemeral_bytes},
                        {"persistent", ToJson(x.persistent)},
                        {"ephemeral", ToJson(x.ephemeral)}});
  }
  return {{"capacity", s.capacity},
          {"committed_bytes", s.persistent_committed_bytes + s.ephemeral_committed_bytes},
          {"persistent_committed_bytes", s.persistent_committed_bytes},
          {"ephemeral_committed_bytes", s.ephemeral_committed_bytes},
          {"persistent_footprint_bytes", s.persistent_footprint_bytes},
          {"admitted_sessions", s.admitted_sessions},
          {"waiting_sessions", s.waiting_sessions},
          {"regions", {{"persistent", ToJson(s.persistent)}, {"ephemeral", ToJson(s.ephemeral)}}},
          {"lanes", lanes},
          {"sessions", sessions}};
}

nlohmann::json ArenaMemoryManager::MemoryMap() const {
  MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, uint64_t>> used;  // (offset, size)
  nlohmann::json lanes = nlohmann::json::array();
  uint64_t offset = 0;
  auto lane_json = [&](const Lane& l, std::optional<uint64_t> layout) {
    nlohmann::json j = {{"id", l.id},
                        {"class", LaneClassName(l.lane_class)},
                        {"size", l.size},
                        {"sessions", l.sessions},
                        {"in_iteration", l.in_iteration}};
    j["offset"] = layout ? nlohmann::json(*layout) : nlohmann::json(nullptr);
    if (l.in_iteration) {
      j["placed"] = {{"offset", l.placed_offset}, {"size", l.placed_size}};
      used.emplace_back(l.placed_offset, l.placed_size);
    }
    if (l.closed)
      j["state"] = "draining";
    else if (!l.placed || l.placed_offset != *layout || l.placed_size != l.size) {
      j["state"] = "moves at next iteration";
    } else {
      j["state"] = "placed";
    }
    return j;
  };
  for (const auto& [id, l] : lanes_) {
    lanes.push_back(lane_json(l, offset));
    used.emplace_back(offset, l.size);
    offset += l.size;
  }
  for (const auto& [id, l] : draining_) lanes.push_back(lane_json(l, std::nullopt));
  nlohmann::json blocks = nlohmann::json::array();
  for (const auto& [id, s] : sessions_) {
    if (s.req.persistent_bytes == 0) continue;
    blocks.push_back({{"session", id},
                      {"offset", s.block_offset},
                      {"size", s.req.persistent_bytes},
                      {"state", s.block_pending ? "pending" : "placed"}});
    used.emplace_back(s.block_offset, s.req.persistent_bytes);
  }
  for (const Retiring& r : retiring_) {
    blocks.push_back({{"session", nullptr},
                      {"offset", r.offset},
                      {"size", r.size},
                      {"state", "retiring"},
                      {"lane", r.lane}});
    used.emplace_back(r.offset, r.size);
  }
  std::sort(used.begin(), used.end());
  nlohmann::json free = nlohmann::json::array();
  uint64_t at = 0;
  for (const auto& [o, n] : used) {
    if (n == 0) continue;
    if (o > at) free.push_back({{"offset", at}, {"size", o - at}});
    at = std::max(at, o + n);
  }
  if (at < capacity_) free.push_back({{"offset", at}, {"size", capacity_ - at}});
  return {{"capacity", capacity_},
          {"alignment", kArenaAlignment},
          {"regions",
           {{"ephemeral", {{"offset", 0}, {"size", lane_bytes_}}},
            {"persistent", {{"offset", region_.floor()}, {"size", region_.extent()}}}}},
          {"lanes", lanes},
          {"persistent_blocks", blocks},
          {"free_ranges", free}};
}

// ----------------------------------------------------------------------------------------
// Invariants

void ArenaMemoryManager::DcheckInvariants() const {
#if SALUS_DCHECK_IS_ON
  const Status s = CheckInvariantsLocked();
  SALUS_DCHECK(s.ok(), s.ToString());
#endif
}

Status ArenaMemoryManager::CheckInvariants() const {
  MutexLock lock(&mu_);
  return CheckInvariantsLocked();
}

Status ArenaMemoryManager::CheckInvariantsLocked() const {
  auto broken = [](std::string what) { return InternalError("memory invariant broken: " + what); };
  const uint64_t c = capacity_;
  // Invariant 1, and the footprint rule that implies it (Note [Persistent footprint]).
  if (persistent_bytes_ + lane_bytes_ > c) {
    return broken(
        fmt::format("safety condition: ΣP {} + ΣL {} > C {}", persistent_bytes_, lane_bytes_, c));
  }
  if (region_.extent() + lane_bytes_ > c) {
    return broken(
        fmt::format("persistent footprint {} + ΣL {} > C {}", region_.extent(), lane_bytes_, c));
  }
  uint64_t sum_p = 0;
  for (const auto& [id, s] : sessions_) {
    sum_p += s.req.persistent_bytes;
    const auto lane = lanes_.find(s.lane);
    if (lane == lanes_.end()) return broken(fmt::format("session {} in no open lane", id));
    if (s.req.persistent_bytes > 0) {
      const auto b = region_.blocks().find(s.block_offset);
      if (b == region_.blocks().end() || b->second != s.req.persistent_bytes) {
        return broken(fmt::format("session {}'s block is not in the persistent region", id));
      }
      if (s.block_pending != Hazard(s.block_offset, s.req.persistent_bytes, 0).has_value()) {
        return broken(fmt::format("session {}'s block is {} but {}", id,
                                  s.block_pending ? "pending" : "placed",
                                  s.block_pending ? "nothing occupies it" : "it is occupied"));
      }
    }
  }
  if (sum_p != persistent_bytes_ || region_.block_bytes() != sum_p) {
    return broken(fmt::format("ΣP {} but the sessions hold {} and the region {}", persistent_bytes_,
                              sum_p, region_.block_bytes()));
  }
  if (persistent_stats_.current_bytes != sum_p || !persistent_stats_.Balanced()) {
    return broken("persistent statistics do not account for the blocks");
  }
  uint64_t sum_l = 0;
  size_t members = 0;
  for (const auto& [id, l] : lanes_) {
    if (l.sessions.empty()) return broken(fmt::format("open lane {} has no session", id));
    if (l.size != *l.ephemeral.rbegin()) {
      return broken(fmt::format("lane {} has size {} but its largest E is {}", id, l.size,
                                *l.ephemeral.rbegin()));
    }
    if (!lanes_by_size_.contains({l.lane_class, l.size, id})) {
      return broken("lane size index out of date");
    }
    if (l.in_iteration != in_flight_.contains(id)) return broken("in-flight set out of date");
    for (const SessionId s : l.sessions) {
      const auto it = sessions_.find(s);
      if (it == sessions_.end() || it->second.lane != id) {
        return broken(fmt::format("lane {} lists session {}, which is not in it", id, s));
      }
      if (options_.mode != AdmissionMode::kExclusive && it->second.req.lane_class != l.lane_class) {
        return broken(fmt::format("lane {} ({}) holds session {} of another class", id,
                                  LaneClassName(l.lane_class), s));
      }
    }
    members += l.sessions.size();
    sum_l += l.size;
  }
  if (sum_l != lane_bytes_ || lanes_by_size_.size() != lanes_.size() ||
      members != sessions_.size()) {
    return broken(fmt::format("ΣL {} but the lanes hold {}", lane_bytes_, sum_l));
  }
  if (options_.mode == AdmissionMode::kExclusive && lanes_.size() > 1) {
    return broken("more than one lane in kExclusive");
  }
  if (options_.mode == AdmissionMode::kSingleLane) {
    std::array<int, kLaneClasses> per_class{};
    for (const auto& [id, l] : lanes_) {
      if (++per_class[static_cast<size_t>(l.lane_class)] > 1) {
        return broken(
            fmt::format("more than one {} lane in kSingleLane", LaneClassName(l.lane_class)));
      }
    }
  }
  if (options_.mode == AdmissionMode::kExclusive && sessions_.size() > 1) {
    return broken("more than one session in kExclusive");
  }
  for (const auto& [id, l] : draining_) {
    if (!l.in_iteration || !l.closed || !in_flight_.contains(id)) {
      return broken(fmt::format("draining lane {} is not mid-iteration", id));
    }
  }
  // Invariant 2 and 3 physically: lanes mid-iteration are disjoint from each other and from
  // placed blocks; layout places stay below the persistent region.
  if (lane_bytes_ > region_.floor()) return broken("lane layout reaches the persistent region");
  // (offset, size, lane or session id, is a lane); names are formatted only on failure.
  struct Placed {
    uint64_t offset, size, id;
    bool lane;
    bool operator<(const Placed& o) const { return offset < o.offset; }
  };
  std::vector<Placed> placed;
  placed.reserve(in_flight_.size() + sessions_.size());
  for (const LaneId id : in_flight_) {
    const auto it = lanes_.find(id);
    const Lane& l = it != lanes_.end() ? it->second : draining_.at(id);
    placed.push_back({l.placed_offset, l.placed_size, id, true});
  }
  for (const auto& [id, s] : sessions_) {
    if (s.req.persistent_bytes > 0 && !s.block_pending) {
      placed.push_back({s.block_offset, s.req.persistent_bytes, id, false});
    }
  }
  std::sort(placed.begin(), placed.end());
  uint64_t end = 0;
  for (const Placed& x : placed) {
    if (x.size == 0) continue;
    const auto name = [&] {
      return fmt::format("{} {}", x.lane ? "lane" : "block of session", x.id);
    };
    if (x.offset + x.size > c) return broken(name() + " leaves the arena");
    if (x.offset < end) return broken(name() + " overlaps its neighbour");
    end = x.offset + x.size;
  }
  return OkStatus();
}

}  // namespace salus::mem
