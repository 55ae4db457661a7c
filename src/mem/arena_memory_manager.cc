// The memory manager's accounting: admission, release and paging. Where a session goes is
// its AdmissionRule's answer (src/sched/admission_rules.h); this file applies answers, and
// checks each against the safety condition before it does (a rule that broke its contract is
// an error, never an over-commitment).
//
// Note [Persistent footprint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Resident blocks do not move, so a freed or paged-out block in the middle of the region
// leaves a hole only a block of at most its size can reuse. The lanes need [0, ΣL) below the
// region's floor, so what bounds them is the footprint F = C - floor, not ΣP. Rules evaluate
// their conditions with the footprint after placing P in place of ΣP + P; F ≥ ΣP, so F + ΣL ≤ C
// implies the safety condition ΣP + ΣL ≤ C (invariant 1). Paging a block out and back in is
// the compaction this allows: a block comes back wherever the region has room then.
//
// Note [Paging]
// ~~~~~~~~~~~~~
// A session's persistent block moves to host memory and back only between its iterations
// (invariant 4: everything in device memory is relocatable between iterations):
//   resident --PageIn(other) pages it out--> paging out --copy ends--> paged out
//   paged out --PageIn(it)--> paging in --copy ends--> resident
// Accounting moves at once, physics when the copy ends. Paging out takes the block out of
// the region and the session out of its lane in the same step, so ΣP and ΣL count what will
// be resident; the block's range stays *in use* (a hazard, like a lane mid-iteration) until
// its copy to host ends, and whatever is placed over it meanwhile (the session paged in, a
// lane) is pending until then. Paging in places the block and joins a lane at once; the copy
// back starts once nothing else occupies the range, and the session's iterations may begin
// when it ends. A session admitted paged out (overcommit) has nothing to copy in. The copies
// are Transfers the caller runs on its own copy path (a copy thread, a copy stream, the
// simulator's modelled bus) so that they overlap other lanes' iterations; the manager only
// allocates the host memory (MemoryProvider::AllocateHost), hands the copies out and learns
// when they end.
#include "mem/arena_memory_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "common/units.h"
#include "device/memory_provider.h"

namespace salus::mem {
namespace {

constexpr uint64_t AlignUp(uint64_t v) {
  return (v + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

}  // namespace

std::string_view LaneClassName(LaneClass c) {
  return c == LaneClass::kInteractive ? "interactive" : "batch";
}

std::string_view ResidenceName(Residence r) {
  switch (r) {
    case Residence::kResident:
      return "resident";
    case Residence::kPagingOut:
      return "paging out";
    case Residence::kPagedOut:
      return "paged out";
    case Residence::kPagingIn:
      return "paging in";
  }
  return "?";
}

StatusOr<std::unique_ptr<MemoryManager>> MemoryManager::Create(Options options) {
  SALUS_ASSIGN_OR_RETURN(auto manager, ArenaMemoryManager::Create(std::move(options)));
  return std::unique_ptr<MemoryManager>(std::move(manager));
}

StatusOr<std::unique_ptr<ArenaMemoryManager>> ArenaMemoryManager::Create(Options options) {
  if (options.provider == nullptr) {
    return InvalidArgumentError("memory manager: no memory provider given");
  }
  if (options.rule == nullptr) return InvalidArgumentError("memory manager: no admission rule");
  if (options.capacity == 0 || options.capacity % kArenaAlignment != 0) {
    return InvalidArgumentError(
        fmt::format("memory manager: capacity {} bytes must be a positive multiple of {} bytes",
                    options.capacity, kArenaAlignment));
  }
  if (options.first_lane == 0 || options.lane_stride == 0) {
    return InvalidArgumentError("memory manager: lane ids start at 1 and step by at least 1");
  }
  if (!(options.overcommit >= 1.0) || !std::isfinite(options.overcommit)) {
    return InvalidArgumentError(fmt::format(
        "memory manager: overcommit ratio must be a number >= 1, got {}", options.overcommit));
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
      region_(options_.capacity),
      next_lane_(options_.first_lane) {}

ArenaMemoryManager::~ArenaMemoryManager() {
  // Nothing to report to: a provider that refuses its own memory back is a broken invariant.
  MutexLock lock(&mu_);
  for (auto& [id, s] : sessions_) {
    if (s.host != nullptr) FreeHost(s.host, s.req.persistent_bytes);
  }
  for (auto& [id, m] : moving_) {
    if (m.released && m.host != nullptr) FreeHost(m.host, m.size);
  }
  for (const auto& [bytes, host] : host_pool_) {
    const Status freed = options_.provider->FreeHost(host, bytes);
    SALUS_DCHECK(freed.ok(), freed.ToString());
    freed.IgnoreError();
  }
  const Status st = options_.provider->Free(base_, capacity_);
  SALUS_DCHECK(st.ok(), st.ToString());
  st.IgnoreError();
}

StatusOr<std::byte*> ArenaMemoryManager::AllocateHost(uint64_t bytes) {
  const auto it = host_pool_.find(bytes);
  if (it == host_pool_.end()) return options_.provider->AllocateHost(bytes);
  std::byte* host = it->second;
  host_pool_.erase(it);
  host_pool_bytes_ -= bytes;
  return host;
}

void ArenaMemoryManager::FreeHost(std::byte* host, uint64_t bytes) {
  if (const auto f = foreign_host_.find(host); f != foreign_host_.end()) {
    device::MemoryProvider* owner = f->second;
    foreign_host_.erase(f);
    const Status st = owner->FreeHost(host, bytes);
    SALUS_DCHECK(st.ok(), st.ToString());
    st.IgnoreError();
    return;
  }
  if (host_pool_bytes_ + bytes <= options_.host_pool_bytes) {
    host_pool_.emplace(bytes, host);
    host_pool_bytes_ += bytes;
    return;
  }
  const Status st = options_.provider->FreeHost(host, bytes);
  SALUS_DCHECK(st.ok(), st.ToString());
  st.IgnoreError();
}

// ----------------------------------------------------------------------------------------
// Decisions

size_t ArenaMemoryManager::LiveView::resident_sessions() const {
  return m_.sessions_.size() - m_.paged_sessions_;
}

void ArenaMemoryManager::LiveView::ResidentJobs(std::vector<uint64_t>* out) const {
  for (const auto& [id, s] : m_.sessions_) {
    if (s.lane != 0) out->push_back(s.req.job);
  }
}

std::optional<LaneView> ArenaMemoryManager::LiveView::SmallestLane(LaneClass cls,
                                                                   uint64_t at_least) const {
  const auto it = m_.lanes_by_size_.lower_bound({cls, at_least, 0});
  if (it == m_.lanes_by_size_.end() || std::get<0>(*it) != cls) return std::nullopt;
  return LaneView{std::get<2>(*it), cls, std::get<1>(*it)};
}

std::optional<LaneView> ArenaMemoryManager::LiveView::FindLane(LaneId id) const {
  const auto it = m_.lanes_.find(id);
  if (it == m_.lanes_.end()) return std::nullopt;
  return LaneView{id, it->second.lane_class, it->second.size};
}

size_t ArenaMemoryManager::LiveView::LaneCount(LaneClass cls) const {
  const auto from = m_.lanes_by_size_.lower_bound({cls, 0, 0});
  size_t n = 0;
  for (auto it = from; it != m_.lanes_by_size_.end() && std::get<0>(*it) == cls; ++it) ++n;
  return n;
}

ArenaSnapshot ArenaMemoryManager::SnapshotArenaLocked() const {
  ArenaSnapshot a;
  a.capacity_bytes = capacity_;
  a.lane_total = lane_bytes_;
  a.region = region_;
  for (const auto& [id, l] : lanes_) {
    a.lanes.emplace(id, ArenaSnapshot::Lane{id, l.lane_class, l.size, l.ephemeral});
  }
  for (const auto& [id, s] : sessions_) {
    if (s.lane == 0) continue;
    a.resident.emplace(
        id, ArenaSnapshot::Resident{s.lane, s.req.persistent_bytes, s.req.ephemeral_bytes,
                                    s.block_offset, s.req.job});
  }
  return a;
}

Status ArenaMemoryManager::CheckDecisionLocked(const ArenaView& arena, const Requirement& req,
                                               const AdmissionDecision& d) const {
  const std::string_view rule = options_.rule->name();
  std::optional<ArenaSnapshot> paged;  // the arena once the decision's page-outs are done
  if (!d.page_out.empty()) {
    paged = arena.Materialize();
    for (const SessionId v : d.page_out) {
      if (!paged->PageOut(v)) {
        return InternalError(fmt::format(
            "admission rule '{}' pages out session {}, which is not resident", rule, v));
      }
    }
  }
  const ArenaView& after = paged ? static_cast<const ArenaView&>(*paged) : arena;
  const uint64_t f = after.FootprintWith(req.persistent_bytes);
  uint64_t lanes = after.lane_bytes();
  if (d.step == Step::kNewLane) {
    lanes += req.ephemeral_bytes;
  } else {
    const std::optional<LaneView> lane = after.FindLane(d.lane);
    if (!lane || lane->lane_class != req.lane_class) {
      return InternalError(
          fmt::format("admission rule '{}' chose lane {}, which is no open {} lane", rule, d.lane,
                      LaneClassName(req.lane_class)));
    }
    if (d.step == Step::kJoin && lane->size < req.ephemeral_bytes) {
      return InternalError(fmt::format("admission rule '{}' joins lane {} of {} with E = {}", rule,
                                       d.lane, lane->size, req.ephemeral_bytes));
    }
    lanes += std::max(lane->size, req.ephemeral_bytes) - lane->size;
  }
  if (f > capacity_ || lanes > capacity_ - f) {
    return InternalError(fmt::format(
        "admission rule '{}' answered {} but the footprint {} plus lanes {} exceed C = {}", rule,
        StepName(d.step), f, lanes, capacity_));
  }
  return OkStatus();
}

ArenaMemoryManager::Outcome ArenaMemoryManager::DecideLocked(const Requirement& req) const {
  const LiveView arena(*this);
  Outcome o;
  // Overcommit bounds every admitted block, resident or not, by overcommit × C.
  const double limit = options_.overcommit * static_cast<double>(capacity_);
  const bool within =
      static_cast<double>(persistent_bytes_ + paged_bytes_ + req.persistent_bytes) <= limit;
  if (options_.overcommit > 1.0 && !within) return o;
  // E as asked, then each smaller lane the session can run in, the first that the rule admits.
  Requirement r = req;
  for (size_t i = 0; i <= req.smaller_ephemeral.size(); ++i) {
    if (i > 0) r.ephemeral_bytes = req.smaller_ephemeral[i - 1];
    o.decision = options_.rule->Decide(arena, r);
    if (o.decision.step == Step::kWait) continue;
    const Status ok = CheckDecisionLocked(arena, r, o.decision);
    SALUS_DCHECK(ok.ok(), ok.ToString());
    if (ok.ok()) {
      o.ephemeral_bytes = r.ephemeral_bytes;
      return o;
    }
    o.decision = AdmissionDecision::Wait();
  }
  // Overcommit: admitted paged out while every admitted block fits overcommit × C.
  o.paged = options_.overcommit > 1.0 && within;
  return o;
}

// ----------------------------------------------------------------------------------------
// Admission

void ArenaMemoryManager::Enter(Session& s, const AdmissionDecision& d) {
  const uint64_t p = s.req.persistent_bytes;
  const uint64_t e = s.req.ephemeral_bytes;
  if (p > 0) {
    s.block_offset = region_.Place(p);
    s.block_pending = false;
    if (Hazard(s.block_offset, p, 0, s.id)) {
      s.block_pending = true;
      pending_blocks_.push_back(s.id);
    }
  }
  persistent_bytes_ += p;
  s.persistent.OnAllocate(p);
  persistent_stats_.OnAllocate(p);

  Lane* lane = nullptr;
  if (d.step == Step::kNewLane) {
    const LaneId id = next_lane_;
    next_lane_ += options_.lane_stride;
    Lane& l = lanes_[id];
    l.id = id;
    l.lane_class = s.req.lane_class;
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
}

Grant ArenaMemoryManager::Apply(const Waiting& w, const Outcome& o) {
  Session s;
  s.id = w.id;
  s.req = w.req;
  s.req.ephemeral_bytes = o.ephemeral_bytes;
  s.req.smaller_ephemeral.clear();
  s.declared = w.declared;
  Session& placed = sessions_.emplace(s.id, std::move(s)).first->second;
  Enter(placed, o.decision);
  return Grant{w.id, placed.lane, true, placed.req.ephemeral_bytes};
}

Grant ArenaMemoryManager::AdmitPaged(const Waiting& w) {
  Session s;
  s.id = w.id;
  s.req = w.req;
  // The largest lane it can run in that fits beside its block when it pages in.
  for (const uint64_t e : w.req.smaller_ephemeral) {
    if (s.req.persistent_bytes + s.req.ephemeral_bytes <= capacity_) break;
    s.req.ephemeral_bytes = e;
  }
  s.req.smaller_ephemeral.clear();
  s.declared = w.declared;
  s.residence = Residence::kPagedOut;
  s.fresh = true;
  paged_bytes_ += s.req.persistent_bytes;
  ++paged_sessions_;
  sessions_.emplace(s.id, std::move(s));
  return Grant{w.id, 0, false, sessions_.at(w.id).req.ephemeral_bytes};
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
  SALUS_ASSIGN_OR_RETURN(const Requirement aligned, Aligned(session, req));
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
  w.req = aligned;
  // Earlier requests keep their turn: a newcomer is admitted paged out only behind none.
  const Outcome o = DecideLocked(w.req);
  if (o.decision.step != Step::kWait) {
    const Grant g = Apply(w, o);
    DcheckInvariants();
    return std::optional<Grant>(g);
  }
  if (o.paged && waiting_.empty()) {
    const Grant g = AdmitPaged(w);
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

StatusOr<Requirement> ArenaMemoryManager::Aligned(SessionId session, const Requirement& req) const {
  const uint64_t c = capacity_;
  uint64_t least_e = req.ephemeral_bytes;  // the smallest lane it can run in
  for (const uint64_t e : req.smaller_ephemeral) least_e = std::min(least_e, e);
  if (req.persistent_bytes > c || least_e > c ||
      AlignUp(req.persistent_bytes) + AlignUp(least_e) > c) {
    return ResourceExhaustedError(fmt::format(
        "session {} can never be admitted: it needs P = {} persistent + E = {} ephemeral, more "
        "than the device's capacity C = {}",
        session, FormatBytes(req.persistent_bytes), FormatBytes(least_e), FormatBytes(c)));
  }
  Requirement r{
      AlignUp(req.persistent_bytes), AlignUp(req.ephemeral_bytes), req.lane_class, {}, req.job};
  for (const uint64_t e : req.smaller_ephemeral) {
    if (AlignUp(e) < r.ephemeral_bytes) r.smaller_ephemeral.push_back(AlignUp(e));
  }
  return r;
}

AdmissionPreview ArenaMemoryManager::Preview(const Requirement& req,
                                             std::span<const SessionId> page_out) const {
  AdmissionPreview p;
  const auto aligned = Aligned(0, req);
  if (!aligned.ok()) {
    p.never = true;
    return p;
  }
  MutexLock lock(&mu_);
  if (!page_out.empty()) {
    // What the rule would page out of the candidates for it, and where it would go then.
    std::vector<SessionId> pageable;
    for (const SessionId c : page_out) {
      const auto v = sessions_.find(c);
      if (v != sessions_.end() && Pageable(v->second)) pageable.push_back(c);
    }
    const LiveView arena(*this);
    Requirement r = *aligned;
    for (size_t i = 0; i <= aligned->smaller_ephemeral.size(); ++i) {
      if (i > 0) r.ephemeral_bytes = aligned->smaller_ephemeral[i - 1];
      const AdmissionDecision d = options_.rule->Decide(arena, r, pageable);
      if (d.step == Step::kWait) continue;
      p.now = p.resident = true;
      p.step = d.step;
      p.ephemeral_bytes = r.ephemeral_bytes;
      p.page_out = d.page_out;
      return p;
    }
    return p;
  }
  const Outcome o = DecideLocked(*aligned);
  if (o.decision.step == Step::kWait) {
    p.now = o.paged && waiting_.empty();  // as Admit: paged out only behind no one
    p.ephemeral_bytes = aligned->ephemeral_bytes;
    return p;
  }
  p.now = p.resident = true;
  p.step = o.decision.step;
  p.ephemeral_bytes = o.ephemeral_bytes;
  const LiveView arena(*this);
  uint64_t lanes = lane_bytes_;
  if (o.decision.step == Step::kNewLane) lanes += o.ephemeral_bytes;
  if (o.decision.step == Step::kGrow) lanes += o.ephemeral_bytes - lanes_.at(o.decision.lane).size;
  const uint64_t used = arena.FootprintWith(aligned->persistent_bytes) + lanes;
  p.free_after = used < capacity_ ? capacity_ - used : 0;
  return p;
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
    const Outcome o = DecideLocked(it->req);
    if (o.decision.step != Step::kWait) {
      granted.push_back(Apply(*it, o));
    } else if (o.paged) {
      granted.push_back(AdmitPaged(*it));
    } else {
      ++it;
      continue;
    }
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

void ArenaMemoryManager::RemoveBlock(Session& s) {
  const uint64_t p = s.req.persistent_bytes;
  if (p > 0) {
    const bool removed = region_.Remove(s.block_offset);
    SALUS_DCHECK(removed, "a session's block is not in the persistent region");
    (void)removed;
    if (s.block_pending) {
      pending_blocks_.erase(std::find(pending_blocks_.begin(), pending_blocks_.end(), s.id));
      s.block_pending = false;
    } else {
      const auto lane = lanes_.find(s.lane);
      if (lane != lanes_.end() && lane->second.in_iteration) {
        retiring_.push_back({s.block_offset, p, s.lane});
      }
    }
  }
  persistent_bytes_ -= p;
  s.persistent.OnFree(p);
  persistent_stats_.OnFree(p);
}

StatusOr<AdmissionEvents> ArenaMemoryManager::Release(SessionId session) {
  AdmissionEvents events;
  MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    const auto w = std::find_if(waiting_.begin(), waiting_.end(),
                                [&](const Waiting& x) { return x.id == session; });
    if (w == waiting_.end()) {
      return NotFoundError(fmt::format("release: session {} is not admitted", session));
    }
    waiting_.erase(w);
    events.failed.emplace_back(
        session,
        CancelledError(fmt::format("session {} released while waiting for admission", session)));
    return events;
  }
  Session& s = it->second;
  const uint64_t p = s.req.persistent_bytes;
  // A copy in flight keeps its device range and host memory until it ends.
  for (auto& [id, m] : moving_) {
    if (m.session != session) continue;
    if (m.issued) {
      m.released = true;
    } else {
      // No copy at all: a page-in whose block is pending, or a copy out not yet handed out.
      const uint64_t not_started = id;
      moving_.erase(not_started);
    }
    break;
  }
  const bool in_flight = std::any_of(moving_.begin(), moving_.end(), [&](const auto& m) {
    return m.second.session == session && m.second.released;
  });
  switch (s.residence) {
    case Residence::kResident:
    case Residence::kPagingIn:
      RemoveBlock(s);
      LeaveLane(s);
      break;
    case Residence::kPagingOut:
    case Residence::kPagedOut:
      paged_bytes_ -= p;
      --paged_sessions_;
      break;
  }
  if (s.host != nullptr && !in_flight) FreeHost(s.host, p);
  sessions_.erase(it);
  // A copy out not yet handed out never runs: blocks placed over its range may be used now.
  PlacePendingBlocks();
  events.admitted = RetryQueue();
  DcheckInvariants();
  return events;
}

AdmissionEvents ArenaMemoryManager::CancelWaiting(SessionId session) {
  AdmissionEvents events;
  MutexLock lock(&mu_);
  const auto w = std::find_if(waiting_.begin(), waiting_.end(),
                              [&](const Waiting& x) { return x.id == session; });
  if (w != waiting_.end()) {
    waiting_.erase(w);
    events.failed.emplace_back(
        session, CancelledError(fmt::format("session {}: admission cancelled", session)));
  }
  return events;
}

AdmissionEvents ArenaMemoryManager::ExpireWaiting() {
  AdmissionEvents events;
  MutexLock lock(&mu_);
  const Nanos now = clock_->Now();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->deadline && *it->deadline <= now) {
      events.failed.emplace_back(
          it->id, DeadlineExceededError(fmt::format(
                      "session {}: no room for it before its admission timeout (expired {:.3f}s "
                      "ago)",
                      it->id, ToSeconds(now - *it->deadline))));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  return events;
}

// ----------------------------------------------------------------------------------------
// Paging (Note [Paging])

bool ArenaMemoryManager::Pageable(const Session& s) const {
  if (s.residence != Residence::kResident || s.block_pending) return false;
  const auto lane = lanes_.find(s.lane);
  // Between its iterations only: a lane mid-iteration for an unnamed session may be its.
  return lane == lanes_.end() || !lane->second.in_iteration ||
         (lane->second.iteration_session && *lane->second.iteration_session != s.id);
}

void ArenaMemoryManager::BeginPageOut(Session& s, std::byte* host, std::optional<PeerCopy> peer) {
  const uint64_t p = s.req.persistent_bytes;
  const uint64_t offset = s.block_offset;
  RemoveBlock(s);
  LeaveLane(s);
  s.lane = 0;
  s.host = host;
  s.residence = Residence::kPagingOut;
  paged_bytes_ += p;
  ++paged_sessions_;
  if (p == 0) {
    s.residence = Residence::kPagedOut;
    ++page_outs_;
    return;
  }
  Moving m;
  m.id = next_transfer_++;
  m.session = s.id;
  m.to_host = true;
  m.offset = offset;
  m.size = p;
  m.host = host;
  m.ready = true;
  m.peer = peer;
  s.leaving = peer.has_value();
  moving_.emplace(m.id, m);
}

void ArenaMemoryManager::BeginPageIn(Session& s, bool incoming) {
  if (s.req.persistent_bytes == 0 || (!incoming && (s.fresh || s.host == nullptr))) {
    s.residence = Residence::kResident;
    s.fresh = false;
    if (s.host != nullptr) FreeHost(s.host, s.req.persistent_bytes);
    s.host = nullptr;
    return;
  }
  s.residence = Residence::kPagingIn;
  Moving m;
  m.id = next_transfer_++;
  m.session = s.id;
  m.to_host = false;
  m.offset = s.block_offset;
  m.size = s.req.persistent_bytes;
  m.host = s.host;
  m.ready = !s.block_pending;
  m.incoming = incoming;
  m.issued = incoming && m.ready;  // the other manager's copy may write it from now on
  moving_.emplace(m.id, m);
}

StatusOr<AdmissionEvents> ArenaMemoryManager::PageOut(SessionId session,
                                                      std::optional<PeerCopy> to) {
  AdmissionEvents events;
  MutexLock lock(&mu_);
  const auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    return NotFoundError(fmt::format("page-out: session {} is not admitted", session));
  }
  Session& s = it->second;
  if (!Pageable(s)) {
    return FailedPreconditionError(fmt::format(
        "page-out: session {} is {}{}", session, ResidenceName(s.residence),
        s.residence == Residence::kResident ? " but mid-iteration or not yet placed" : ""));
  }
  std::byte* host = nullptr;
  if (s.req.persistent_bytes > 0 && !to) {
    auto h = AllocateHost(s.req.persistent_bytes);
    if (!h.ok()) return h.status().WithContext(fmt::format("paging session {} out", session));
    host = *h;
  }
  BeginPageOut(s, host, to);
  events.admitted = RetryQueue();
  DcheckInvariants();
  return events;
}

StatusOr<Emigrant> ArenaMemoryManager::Emigrate(SessionId session) {
  MutexLock lock(&mu_);
  const auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    return NotFoundError(fmt::format("emigrate: session {} is not admitted", session));
  }
  Session& s = it->second;
  if (s.residence != Residence::kPagedOut) {
    return FailedPreconditionError(fmt::format("emigrate: session {} is {}, not paged out", session,
                                               ResidenceName(s.residence)));
  }
  Emigrant e;
  e.session = session;
  e.req = s.req;
  e.declared = s.declared;
  e.host = s.fresh ? nullptr : s.host;
  if (s.fresh && s.host != nullptr) FreeHost(s.host, s.req.persistent_bytes);
  e.host_provider = options_.provider;
  if (const auto f = foreign_host_.find(e.host); e.host != nullptr && f != foreign_host_.end()) {
    e.host_provider = f->second;  // it passes on with the session
    foreign_host_.erase(f);
  }
  paged_bytes_ -= s.req.persistent_bytes;
  --paged_sessions_;
  sessions_.erase(it);
  e.events.admitted = RetryQueue();
  DcheckInvariants();
  return e;
}

StatusOr<Emigrant> ArenaMemoryManager::Prospect(SessionId session) const {
  MutexLock lock(&mu_);
  const auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    return NotFoundError(fmt::format("prospect: session {} is not admitted", session));
  }
  Emigrant e;
  e.session = session;
  e.req = it->second.req;
  e.declared = it->second.declared;
  return e;
}

std::optional<PeerCopy> ArenaMemoryManager::Incoming(SessionId session) const {
  MutexLock lock(&mu_);
  for (const auto& [id, m] : moving_) {
    if (m.session != session || !m.incoming || m.released) continue;
    if (!m.ready) return std::nullopt;
    return PeerCopy{base_ + m.offset, 0, id};
  }
  return std::nullopt;
}

StatusOr<std::optional<Grant>> ArenaMemoryManager::Immigrate(const Emigrant& emigrant,
                                                             bool incoming) {
  MutexLock lock(&mu_);
  if (sessions_.contains(emigrant.session) ||
      std::any_of(waiting_.begin(), waiting_.end(),
                  [&](const Waiting& w) { return w.id == emigrant.session; })) {
    return AlreadyExistsError(fmt::format("session {} is already here", emigrant.session));
  }
  if (emigrant.req.persistent_bytes + emigrant.req.ephemeral_bytes > capacity_) {
    return std::optional<Grant>();
  }
  const Outcome o = DecideLocked(emigrant.req);
  if (o.decision.step == Step::kWait) return std::optional<Grant>();
  Waiting w;
  w.id = emigrant.session;
  w.req = emigrant.req;
  w.declared = emigrant.declared;
  const Grant g = Apply(w, o);
  Session& s = sessions_.at(emigrant.session);
  s.host = emigrant.host;
  if (s.host != nullptr && emigrant.host_provider != nullptr &&
      emigrant.host_provider != options_.provider) {
    foreign_host_.emplace(s.host, emigrant.host_provider);
  }
  BeginPageIn(s, incoming);
  DcheckInvariants();
  return std::optional<Grant>(g);
}

StatusOr<PageInResult> ArenaMemoryManager::PageIn(SessionId session,
                                                  std::span<const SessionId> candidates) {
  PageInResult result;
  {
    MutexLock lock(&mu_);
    const auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      return NotFoundError(fmt::format("page-in: session {} is not admitted", session));
    }
    Session& s = it->second;
    if (s.residence != Residence::kPagedOut) {
      return FailedPreconditionError(fmt::format("page-in: session {} is {}, not paged out",
                                                 session, ResidenceName(s.residence)));
    }
    if (s.leaving) {
      return FailedPreconditionError(
          fmt::format("page-in: session {} left for another device; its state is there", session));
    }
    std::vector<SessionId> pageable;
    for (const SessionId c : candidates) {
      const auto v = sessions_.find(c);
      if (c != session && v != sessions_.end() && Pageable(v->second)) pageable.push_back(c);
    }
    const LiveView arena(*this);
    AdmissionDecision d = options_.rule->Decide(arena, s.req, pageable);
    if (d.step == Step::kWait) return result;
    if (!std::equal(d.page_out.begin(), d.page_out.end(), pageable.begin(),
                    pageable.begin() + static_cast<std::ptrdiff_t>(
                                           std::min(d.page_out.size(), pageable.size()))) ||
        d.page_out.size() > pageable.size()) {
      return InternalError(fmt::format(
          "admission rule '{}' pages out sessions that are not a prefix of the candidates",
          options_.rule->name()));
    }
    SALUS_RETURN_IF_ERROR(CheckDecisionLocked(arena, s.req, d));
    // Host memory for every victim first: nothing changes unless all of it is there.
    std::vector<std::byte*> hosts;
    for (const SessionId v : d.page_out) {
      const uint64_t p = sessions_.at(v).req.persistent_bytes;
      if (p == 0) {
        hosts.push_back(nullptr);
        continue;
      }
      auto h = AllocateHost(p);
      if (!h.ok()) {
        for (size_t i = 0; i < hosts.size(); ++i) {
          if (hosts[i] != nullptr)
            FreeHost(hosts[i], sessions_.at(d.page_out[i]).req.persistent_bytes);
        }
        return h.status().WithContext(fmt::format("paging session {} out", v));
      }
      hosts.push_back(*h);
    }
    for (size_t i = 0; i < d.page_out.size(); ++i) {
      BeginPageOut(sessions_.at(d.page_out[i]), hosts[i]);
    }
    // The victims' lanes shrank or closed; the decision's lane is the same lane id.
    paged_bytes_ -= s.req.persistent_bytes;
    --paged_sessions_;
    Enter(s, d);
    BeginPageIn(s);
    result.resident = true;
    result.lane = s.lane;
    result.paged_out = d.page_out;
    result.events.admitted = RetryQueue();
    DcheckInvariants();
  }
  return result;
}

std::vector<Transfer> ArenaMemoryManager::TakeTransfers() {
  MutexLock lock(&mu_);
  std::vector<Transfer> out;
  for (auto& [id, m] : moving_) {
    if (!m.ready || m.issued || m.incoming) continue;
    m.issued = true;
    Transfer t{id, m.session, m.to_host, base_ + m.offset, m.host, m.size};
    if (m.peer) {
      t.peer = m.peer->address;
      t.peer_device = m.peer->device;
      t.peer_transfer = m.peer->transfer;
    }
    out.push_back(t);
  }
  return out;
}

StatusOr<AdmissionEvents> ArenaMemoryManager::FinishTransfer(uint64_t transfer,
                                                             const Status& copy) {
  std::optional<std::pair<SessionId, Status>> lost;
  {
    MutexLock lock(&mu_);
    const auto it = moving_.find(transfer);
    if (it == moving_.end() || !it->second.issued) {
      return NotFoundError(fmt::format("no transfer {} in flight", transfer));
    }
    const Moving m = it->second;
    moving_.erase(it);
    if (m.released) {
      if (m.host != nullptr) FreeHost(m.host, m.size);
    } else {
      Session& s = sessions_.at(m.session);
      if (m.to_host) {
        s.residence = Residence::kPagedOut;
        ++page_outs_;
        paged_out_bytes_ += m.size;
      } else {
        if (s.host != nullptr) FreeHost(s.host, m.size);
        s.host = nullptr;
        s.residence = Residence::kResident;
        ++page_ins_;
        paged_in_bytes_ += m.size;
      }
      if (!copy.ok()) {
        lost.emplace(m.session, InternalError(fmt::format(
                                    "session {}: its persistent state was lost paging it {}: {}",
                                    m.session, m.to_host ? "out" : "in", copy.ToString())));
      }
    }
    PlacePendingBlocks();
    DcheckInvariants();
  }
  AdmissionEvents events;
  if (lost) {
    // Its release makes room: what that admits is this call's too.
    if (auto released = Release(lost->first); released.ok()) events = std::move(*released);
    events.failed.push_back(std::move(*lost));
  }
  return events;
}

void AdmissionEvents::Append(AdmissionEvents&& other) {
  admitted.insert(admitted.end(), std::make_move_iterator(other.admitted.begin()),
                  std::make_move_iterator(other.admitted.end()));
  failed.insert(failed.end(), std::make_move_iterator(other.failed.begin()),
                std::make_move_iterator(other.failed.end()));
}

StatusOr<Residence> ArenaMemoryManager::ResidenceOf(SessionId session) const {
  MutexLock lock(&mu_);
  const auto it = sessions_.find(session);
  if (it == sessions_.end())
    return NotFoundError(fmt::format("session {} is not admitted", session));
  return it->second.residence;
}

ArenaSnapshot ArenaMemoryManager::Snapshot() const {
  MutexLock lock(&mu_);
  return SnapshotArenaLocked();
}

}  // namespace salus::mem
