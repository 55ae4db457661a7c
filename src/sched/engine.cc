#include "sched/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <limits>

#include "common/logging.h"
#include "common/units.h"
#include "device/memory_provider.h"

namespace salus::sched {

// Note [Remaining time]
// SRTF orders sessions by their estimated remaining time, in seconds:
//  - a declared duration D: max(0, D - device time attained so far);
//  - else declared iterations N: (N - iterations done) × the moving average of measured
//    iteration time (EWMA, weight ewma_alpha on the newest), or the declared iteration time
//    hint before the first measurement; with neither, 0 — the session's first iteration is a
//    probe that yields a measurement;
//  - else nothing declared: +infinity, so an open-ended session yields to every job that
//    said how long it is.

// Note [Session lifecycle]
// A session is in exactly one SessionState, with a reason where the state alone does not say
// enough (who it was paged out for, that it is paging in). The lane fields mean something
// only in kAdmitted, kRunning and kClosing; a kPagedOut session is in no lane and never in
// a lane's runnable views. kClosing is a session removed while its iteration runs: Complete
// releases it. Nothing is inferred from a lookup failing: RemoveSession of a session gone
// through a failed admission says so.
//
// Note [Paging]
// With overcommit (Options::overcommit > 1) the memory manager admits sessions beyond what
// fits resident, paged out (src/mem, Note [Paging]). At every dispatch the engine pages in
// paged-out sessions that have work, best first by the policy's own Pick over them; for
// each it offers the memory manager resident sessions to page out, in the policy's
// OrderPageOut order, and the admission rule takes the shortest prefix that makes room. A
// resident session is offered only when it is between iterations, no copy of its state is
// running, it has been resident for paging_quantum and run an iteration since (so a session
// paged in makes progress before it can be paged out: no thrashing), and either it is idle
// (no iteration asked for in page_out_idle) or the policy would run the incoming session
// before it (Pick over the two). A session paging in joins its lane at once but becomes
// runnable only when its copy ends; the copies are Transfers the driver runs (the daemon's
// copy thread, the simulator's modelled bus) and reports with FinishTransfer.

// Note [Devices]
// The engine schedules one or more devices, each with its own memory manager (its arena,
// lanes and admission queue); lane ids are unique across them (MakeDevices), so lanes are
// keyed by id alone and a lane belongs to one device. A session lives on one device: the one
// its spec pins, or the one placement picks. Placement asks every device's manager what
// Admit would do now (MemoryManager::Preview: the policy's rule over that arena) and takes
// the best: joining an existing lane (no new lane memory), then opening or growing one, each
// by the least memory left unused after it (best fit, which keeps large holes for large
// jobs), then the lowest index. With overcommit, a device that would admit it paged out
// comes after every device that admits it resident. When no device admits it now, a pinned
// session queues in its device's manager, and an unpinned one in the engine's own queue for
// any device (unplaced_), re-tried in arrival order whenever memory is freed on any device
// (a release, a finished copy). Its admission timeout is the engine's to enforce then. With
// one device every session goes to its manager exactly as before placement existed. A device
// lost to a fault (SetDeviceLost: a GPU whose context is corrupt) is out of service: placement,
// moves and spreading pass it by, and a pin to it is refused.

// Note [Migration]
// Between its iterations a session can move to another device. Where the two providers copy
// into each other (MemoryProvider::CanCopyToPeer: two CPU devices, two GPUs), it takes one
// copy: the target admits it resident at once (Immigrate, incoming: its block placed and in a
// lane, kPagingIn), the source pages it out straight into that block (PageOut with a PeerCopy:
// one Transfer on the source's copy path, MemoryProvider::CopyToPeer; between GPUs a peer copy,
// direct over NVLink or PCIe where they have peer access), and when that copy ends the
// target's incoming transfer ends with it and the session leaves the source (Emigrate, with
// nothing in host memory). It belongs to the target from the start (copying, with a reason
// naming its source), and both blocks count until the copy ends. Where the target's block
// cannot be placed at once (its range is busy), or peer moves are off (Options::peer_moves),
// the move goes through host memory instead, in two copies: the engine pages it out to host
// memory (PageOut), and when that copy ends it leaves that manager (Emigrate) and enters the
// target's, resident (Immigrate), its state copied in by a second Transfer; it runs there once
// that copy ends. Meanwhile it is paged out, with a reason naming its target. If the target
// has lost its room by the time the copy out ends, the move is undone: the session stays
// paged out on its own device and pages back in there when it runs (so paged-out sessions are
// paged in even without overcommit). Only devices whose memory is of one kind
// (MemoryProvider::kind: the CPU devices, or the GPUs) exchange sessions; host memory one
// provider allocated goes back to it (Immigrate). A model session that lands on another GPU
// is compiled for it before its next iteration there (server/model_runtime.h).
//
// The engine moves sessions by itself for two reasons. Spreading: when nothing waits, a device
// holds no session, and another holds two or more (placement is memory-first, so light load
// packs sessions on one device beside idle ones, where they share its compute), the engine
// moves the one with the smallest P of the busiest device there (unpinned, between its
// iterations, resident for a paging quantum). Only devices left with no session at all
// qualify: ranking devices by their sessions at placement instead lengthened the mean
// makespan of five dense generated traces by 2-9% (benchmarks/trace_devices.py), where
// memory-first placement keeps the holes large jobs need. Defragmentation: when a session
// waits (for its device, or for any) and some device would admit it once one resident session
// between its iterations were gone, and another device admits that session now, the engine
// moves it. Which session is the policy's choice: the candidates go in the
// policy's OrderPageOut order (its least valuable resident first) and the admission rule
// takes the first whose departure makes room. Sessions their clients pinned are never moved
// by the engine. A session moved, paged in or admitted within
// the paging quantum is not moved again (no ping-pong), and one move is in flight at a time.
// The search looks at the head of each queue only (the first session waiting for each
// device, and the first waiting for any), at most once per paging quantum unless it just
// started a move: it scans the sessions, and the daemon dispatches at every iteration. While
// sessions wait and no move started, NextHoldDeadline names the next search, so that the
// driver looks again even when every session is idle (a candidate's quantum ends by time
// alone, with no event to say so).

// Note [Introspective packing]
// Packing lanes on one device pays only when the sessions leave it partly idle; two that each
// saturate it slow each other down, and often lose to running one after the other (contention
// for caches and memory bandwidth). A policy that asks for it (PACK: introspection()) has the
// engine measure what packing does, pair by pair, and decide from the measurements:
//  - Every iteration records which sessions of the device's other lanes ran at some moment of
//    it (LaneRec::met); a session's first `warmup` iterations are not measured (on a GPU the
//    first iterations load kernels and library state, and took 10-25x a warm one: measured,
//    they unpacked every pair of a hyperparam run on an H200). One that met nobody is a solo sample
//    of its session (an EWMA of its iteration time alone); one that met k sessions is a sample of
//    each of those k pairs, its time beside them and k.
//  - Once both members have `samples` iterations beside each other, the pair is decided if
//    both have a time alone (solo samples, else the iteration time their spec declares,
//    iteration_time_hint); otherwise it is probed: kept apart (never started while the other
//    runs, taking turns) until they have. A member's time beside its partner alone is its time
//    alone plus 1/k of the slowdown it saw beside k sessions: each adds an equal share. The policy
//    decides (KeepPacked): by default it keeps a pair whose gain a_without/a_with +
//    b_without/b_with (their progress together, in devices' worth; apart it is 1) is at least
//    min_gain.
//  - A pair unpacked is remembered for the sessions' lives: one of them moves to another
//    device that admits it now and has no lane open, where it runs alone (Note [Migration];
//    the one with the smaller P, unpinned; beside others it would be measured, and maybe
//    moved, again), or, with no such device, the two are never started at the same time
//    again.
// A kept-apart session's lane waits while its partner runs, and is dispatched again when an
// iteration ends (each Complete dispatches). Decisions are events (pair_probe, pair_kept,
// pair_unpacked) and counted (Introspection()).

std::string_view SessionStateName(SessionState s) {
  switch (s) {
    case SessionState::kWaiting:
      return "waiting";
    case SessionState::kAdmitted:
      return "admitted";
    case SessionState::kRunning:
      return "running";
    case SessionState::kPagedOut:
      return "paged out";
    case SessionState::kClosing:
      return "closing";
  }
  return "?";
}

Engine::Engine(Options options)
    : clock_(options.clock),
      policy_(std::move(options.policy)),
      devices_(std::move(options.devices)),
      ewma_alpha_(options.ewma_alpha),
      on_admitted_(std::move(options.on_admitted)),
      on_admission_failed_(std::move(options.on_admission_failed)),
      anticipation_(policy_->anticipation()),
      paging_(std::any_of(devices_.begin(), devices_.end(),
                          [](const EngineDevice& d) { return d.memory->overcommit() > 1.0; })),
      paging_quantum_(options.paging_quantum),
      page_out_idle_(options.page_out_idle),
      introspection_(policy_->introspection()),
      defragment_(options.defragment),
      peer_moves_(options.peer_moves) {
  lost_.assign(devices_.size(), OkStatus());
}

Engine::~Engine() = default;

StatusOr<std::vector<EngineDevice>> MakeDevices(const Policy& policy, const Clock* clock,
                                                const std::vector<DeviceSpec>& specs) {
  if (specs.empty()) return InvalidArgumentError("engine: no device given");
  std::vector<EngineDevice> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const DeviceSpec& d = specs[i];
    if (d.name.empty())
      return InvalidArgumentError(fmt::format("engine: device {} has no name", i));
    for (size_t j = 0; j < i; ++j) {
      if (specs[j].name == d.name) {
        return InvalidArgumentError(fmt::format("engine: device '{}' given twice", d.name));
      }
    }
    mem::MemoryManager::Options mo;
    mo.provider = d.provider;
    mo.capacity = d.capacity;
    mo.rule = policy.admission_rule();
    mo.overcommit = d.overcommit;
    // Freed host memory kept for the next page-out: what overcommit can page out, and with
    // several devices at least one arena's worth, so that moves (Note [Migration]) reuse the
    // host memory of the moves before them.
    uint64_t pool =
        d.overcommit > 1.0
            ? static_cast<uint64_t>((d.overcommit - 1.0) * static_cast<double>(d.capacity))
            : 0;
    if (specs.size() > 1) pool = std::max(pool, d.capacity);
    mo.host_pool_bytes = d.host_pool_bytes.value_or(pool);
    mo.clock = clock;
    mo.first_lane = i + 1;
    mo.lane_stride = specs.size();
    auto memory = mem::MemoryManager::Create(std::move(mo));
    if (!memory.ok()) return memory.status().WithContext(fmt::format("device '{}'", d.name));
    out.push_back(EngineDevice{d.name, std::move(*memory)});
  }
  return out;
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(Options options) {
  if (options.clock == nullptr) return InvalidArgumentError("engine: a clock is required");
  if (options.policy == nullptr) return InvalidArgumentError("engine: a policy is required");
  if (options.devices.empty())
    return InvalidArgumentError("engine: at least one device is required");
  for (const EngineDevice& d : options.devices) {
    if (d.memory == nullptr) {
      return InvalidArgumentError(fmt::format("engine: device '{}' has no memory manager", d.name));
    }
  }
  if (!(options.ewma_alpha > 0 && options.ewma_alpha <= 1)) {
    return InvalidArgumentError(
        fmt::format("engine: ewma_alpha must be in (0, 1], got {}", options.ewma_alpha));
  }
  return std::unique_ptr<Engine>(new Engine(std::move(options)));
}

std::optional<size_t> Engine::DeviceIndex(std::string_view name) const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i].name == name) return i;
  }
  return std::nullopt;
}

StatusOr<size_t> Engine::FindDevice(std::string_view name) const {
  if (const std::optional<size_t> d = DeviceIndex(name)) return *d;
  std::string names;
  for (const EngineDevice& d : devices_) names += (names.empty() ? "" : ", ") + d.name;
  return InvalidArgumentError(
      fmt::format("no device '{}' in this daemon (it has {})", name, names));
}

void Engine::OnAdmittedLocked(SessionId id, size_t device, const mem::Grant& grant) {
  SessionRec& s = sessions_.at(id);
  s.device = device;
  s.admission_deadline.reset();
  s.admit_seq = next_admit_seq_++;
  s.hold_window = HoldWindowLocked(s);
  s.granted_ephemeral = grant.ephemeral_bytes;
  if (!grant.resident) {
    s.state = SessionState::kPagedOut;
    paged_out_.insert(id);
    s.reason = "admitted beyond the device's capacity (overcommit); paged in when it runs";
    return;
  }
  s.state = SessionState::kAdmitted;
  s.resident_since = clock_->Now();
  JoinLaneLocked(s, grant.lane);
}

void Engine::JoinLaneLocked(SessionRec& s, LaneId lane) {
  const SessionId id = s.id;
  s.lane = lane;
  LaneRec& l = lanes_[lane];
  l.device = s.device;
  l.lane_class = s.spec.requirement.lane_class;
  l.members.push_back(id);
  // The lane's membership changed: FAIR's service counts from here.
  for (SessionId m : l.members) {
    SessionRec& member = sessions_.at(m);
    member.service = Nanos(0);
    RefreshViewLocked(member);
  }
}

void Engine::LeaveLaneLocked(SessionId id, LaneId lane) {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return;
  auto& members = it->second.members;
  members.erase(std::remove(members.begin(), members.end(), id), members.end());
  for (SessionId m : members) {
    SessionRec& member = sessions_.at(m);
    member.service = Nanos(0);
    RefreshViewLocked(member);
  }
  if (members.empty() && !it->second.busy) lanes_.erase(it);
}

void Engine::RemoveViewLocked(SessionRec& s, LaneRec& lane) {
  if (s.view == kNotRunnable) return;
  const size_t i = s.view;
  s.view = kNotRunnable;
  if (i + 1 != lane.runnable.size()) {
    lane.runnable[i] = lane.runnable.back();
    sessions_.at(lane.runnable[i].id).view = i;
  }
  lane.runnable.pop_back();
}

SessionView Engine::ViewLocked(const SessionRec& s) const {
  SessionView v;
  v.id = s.id;
  v.priority = s.spec.priority;
  v.admit_seq = s.admit_seq;
  if (PendingLocked(s) > 0) v.requested_at = s.requests[s.requests_head];
  v.service = s.service;
  v.total_service = s.total_service;
  v.remaining_seconds = RemainingSecondsLocked(s);
  v.iterations_done = s.iterations_done;
  v.last_ran = s.last_ran;
  return v;
}

void Engine::RefreshViewLocked(SessionRec& s) {
  if (!Live(s)) return;
  auto lit = lanes_.find(s.lane);
  if (lit == lanes_.end()) return;
  LaneRec& lane = lit->second;
  if (s.copying || PendingLocked(s) == 0) return RemoveViewLocked(s, lane);
  const SessionView v = ViewLocked(s);
  if (s.view == kNotRunnable) {
    s.view = lane.runnable.size();
    lane.runnable.push_back(v);
  } else {
    lane.runnable[s.view] = v;
  }
}

Nanos Engine::HoldWindowLocked(const SessionRec& s) const {
  const AnticipationOptions& a = anticipation_;
  if (a.max_hold <= Nanos(0)) return Nanos(0);
  const size_t n = std::min(s.gaps_observed, kGapHistory);
  if (n == 0) return a.max_hold;
  std::array<Nanos, kGapHistory> sorted;
  std::copy_n(s.gaps.begin(), n, sorted.begin());
  std::sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n));
  // Nearest-rank percentiles.
  auto rank = [n](size_t percent) { return std::max<size_t>(1, (percent * n + 99) / 100) - 1; };
  if (sorted[rank(50)] > a.max_hold) return Nanos(0);
  // A margin over the p90, so a client as fast as its usual is never cut off by a hair.
  const Nanos p90 = sorted[rank(90)];
  return std::clamp(p90 + p90 / kHoldMarginDivisor, a.min_hold, a.max_hold);
}

Nanos Engine::CurrentHoldWindowLocked(const SessionRec& s) const {
  if (s.hold_window_stale) {
    s.hold_window = HoldWindowLocked(s);
    s.hold_window_stale = false;
  }
  return s.hold_window;
}

bool Engine::AnticipatedLocked(const SessionRec& s, Nanos now) const {
  if (!s.idle_since || s.state != SessionState::kAdmitted || s.copying || PendingLocked(s) != 0) {
    return false;
  }
  if (s.spec.declared_iterations && s.iterations_done >= *s.spec.declared_iterations) return false;
  const Nanos window = CurrentHoldWindowLocked(s);
  return window > Nanos(0) && now - *s.idle_since < window;
}

void Engine::StopIdlingLocked(SessionRec& s, LaneRec* lane) {
  if (!s.idle_since) return;
  s.idle_since.reset();
  if (lane == nullptr) return;
  auto& idle = lane->idle;
  idle.erase(std::remove(idle.begin(), idle.end(), s.id), idle.end());
}

void Engine::DetachLocked(SessionRec& s) {
  auto lit = lanes_.find(s.lane);
  if (lit == lanes_.end()) return StopIdlingLocked(s, nullptr);
  StopIdlingLocked(s, &lit->second);  // a hold for it ends at the next decision
  RemoveViewLocked(s, lit->second);
}

void Engine::EndHoldLocked(LaneRec& lane, SessionId next, Nanos now) {
  if (!lane.hold) return;
  (lane.hold->session == next ? holds_.returned : holds_.expired)++;
  holds_.idle += now - lane.hold->since;
  lane.hold.reset();
}

void Engine::ApplyEventsLocked(size_t device, mem::AdmissionEvents events, Notices* notices) {
  for (const mem::Grant& g : events.admitted) {
    if (!sessions_.contains(g.session)) continue;  // removed by its owner meanwhile
    OnAdmittedLocked(g.session, device, g);
    notices->admitted.emplace_back(g.session, g.lane);
  }
  for (auto& [id, failure] : events.failed) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) continue;
    // Its admission failed, or (paging) its state was lost and the memory released it.
    SessionRec& s = it->second;
    const LaneId lane = s.lane;
    if (s.migrate_to || s.moving_from) --migrations_in_flight_;
    ForgetPairsLocked(s);
    if (s.state != SessionState::kWaiting) DetachLocked(s);
    sessions_.erase(it);
    paged_out_.erase(id);
    if (lane != 0) LeaveLaneLocked(id, lane);
    notices->failed.emplace_back(id, std::move(failure));
  }
}

void Engine::Notify(const Notices& notices) {
  for (const auto& [id, lane] : notices.admitted) {
    logging::Event("sched", "admitted", {{"session", id}, {"lane", lane}, {"queued", true}});
    if (on_admitted_) on_admitted_(id, lane);
  }
  for (const auto& [id, status] : notices.failed) {
    if (on_admission_failed_) on_admission_failed_(id, status);
  }
}

StatusOr<bool> Engine::AddSession(SessionId id, const SessionSpec& spec) {
  if (spec.declared_iterations && *spec.declared_iterations < 0) {
    return InvalidArgumentError(fmt::format("session {}: declared iterations must be >= 0", id));
  }
  if (spec.declared_duration && spec.declared_duration->count() < 0) {
    return InvalidArgumentError(fmt::format("session {}: declared duration must be >= 0", id));
  }
  if (spec.iterations_done < 0) {
    return InvalidArgumentError(fmt::format("session {}: iterations done must be >= 0", id));
  }
  bool admitted = false;
  {
    MutexLock lock(&mu_);
    if (sessions_.count(id) != 0) {
      return AlreadyExistsError(fmt::format("session {} already exists", id));
    }
    if (spec.device && *spec.device >= devices_.size()) {
      return InvalidArgumentError(fmt::format("session {}: no device {} (the daemon has {})", id,
                                              *spec.device, devices_.size()));
    }
    if (spec.device && !lost_[*spec.device].ok()) {
      return UnavailableError(fmt::format("session {}: {} was lost: {}", id,
                                          devices_[*spec.device].name,
                                          lost_[*spec.device].message()));
    }
    if (std::all_of(lost_.begin(), lost_.end(), [](const Status& l) { return !l.ok(); })) {
      return UnavailableError(
          fmt::format("session {}: every device was lost: {}", id, lost_.front().message()));
    }
    // Note [Devices]: its pinned device, the only one, or where it fits best now.
    std::optional<size_t> device = spec.device;
    if (!device && devices_.size() == 1) device = 0;
    if (!device) {
      device = PlaceLocked(spec.requirement);
      const bool fits_somewhere =
          device || std::any_of(devices_.begin(), devices_.end(), [&](const EngineDevice& d) {
            return !d.memory->Preview(spec.requirement).never;
          });
      if (!fits_somewhere) {
        uint64_t least_e = spec.requirement.ephemeral_bytes;
        for (const uint64_t e : spec.requirement.smaller_ephemeral) least_e = std::min(least_e, e);
        uint64_t largest = 0;
        for (const EngineDevice& d : devices_) largest = std::max(largest, d.memory->capacity());
        return ResourceExhaustedError(fmt::format(
            "session {} can never be admitted: it needs P = {} persistent + E = {} ephemeral, "
            "more than any device's capacity (the largest is C = {})",
            id, FormatBytes(spec.requirement.persistent_bytes), FormatBytes(least_e),
            FormatBytes(largest)));
      }
    }
    SessionRec& rec = sessions_[id];
    rec.id = id;
    rec.spec = spec;
    rec.iterations_done = spec.iterations_done;
    if (!device) {
      rec.reason = "waiting for room on any device";
      if (spec.admission_timeout && *spec.admission_timeout <= Nanos::max() - clock_->Now()) {
        rec.admission_deadline = clock_->Now() + *spec.admission_timeout;
      }
      unplaced_.push_back(id);
      return false;
    }
    rec.device = *device;
    auto grant = MemoryOf(rec).Admit(id, spec.requirement, spec.admission_timeout);
    if (!grant.ok()) {
      sessions_.erase(id);
      return grant.status();
    }
    if (grant->has_value()) {
      OnAdmittedLocked(id, *device, **grant);
      admitted = true;
    }
  }
  return admitted;
}

std::optional<size_t> Engine::PlaceLocked(const mem::Requirement& req) const {
  // Rank: join an existing lane, then open or grow one, then admit paged out; within a rank
  // the least memory left unused, then the lowest index.
  auto rank = [](const mem::AdmissionPreview& p) {
    if (!p.resident) return 3;
    return p.step == mem::AdmissionDecision::Step::kJoin ? 0 : 1;
  };
  std::optional<size_t> best;
  mem::AdmissionPreview best_p;
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (!lost_[i].ok()) continue;
    const mem::AdmissionPreview p = devices_[i].memory->Preview(req);
    if (!p.now) continue;
    if (!best || rank(p) < rank(best_p) ||
        (rank(p) == rank(best_p) && p.free_after < best_p.free_after)) {
      best = i;
      best_p = p;
    }
  }
  return best;
}

void Engine::RetryUnplacedLocked(Notices* notices) {
  for (auto it = unplaced_.begin(); it != unplaced_.end();) {
    SessionRec& s = sessions_.at(*it);
    const std::optional<size_t> device = PlaceLocked(s.spec.requirement);
    if (!device) {
      ++it;
      continue;
    }
    auto grant = devices_[*device].memory->Admit(s.id, s.spec.requirement);
    if (!grant.ok() || !grant->has_value()) {  // Preview said now: never, but be safe
      ++it;
      continue;
    }
    it = unplaced_.erase(it);
    OnAdmittedLocked(s.id, *device, **grant);
    notices->admitted.emplace_back(s.id, (*grant)->lane);
  }
}

mem::Requirement Engine::HeldLocked(const SessionRec& s) {
  mem::Requirement r = s.spec.requirement;
  r.ephemeral_bytes = s.granted_ephemeral > 0 ? s.granted_ephemeral : r.ephemeral_bytes;
  r.smaller_ephemeral.clear();
  return r;
}

std::optional<size_t> Engine::TargetLocked(const mem::Requirement& req, size_t except) const {
  const std::string kind = devices_[except].memory->provider().kind();
  std::optional<size_t> best;
  mem::AdmissionPreview best_p;
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (i == except || !lost_[i].ok() || devices_[i].memory->provider().kind() != kind) continue;
    const mem::AdmissionPreview p = devices_[i].memory->Preview(req);
    if (!p.resident) continue;
    const bool join = p.step == mem::AdmissionDecision::Step::kJoin;
    const bool best_join = best && best_p.step == mem::AdmissionDecision::Step::kJoin;
    if (!best || (join && !best_join) || (join == best_join && p.free_after < best_p.free_after)) {
      best = i;
      best_p = p;
    }
  }
  return best;
}

StatusOr<bool> Engine::MoveByPeerLocked(SessionRec& s, size_t to, const std::string& why,
                                        Notices* notices) {
  const size_t from = s.device;
  mem::MemoryManager& target = *devices_[to].memory;
  SALUS_ASSIGN_OR_RETURN(mem::Emigrant e, MemoryOf(s).Prospect(s.id));
  SALUS_ASSIGN_OR_RETURN(std::optional<mem::Grant> grant, target.Immigrate(e, /*incoming=*/true));
  if (!grant) return false;
  std::optional<mem::PeerCopy> dst = target.Incoming(s.id);
  mem::AdmissionEvents out_events;
  Status out_status;
  if (dst) {
    dst->device = to;
    auto out = MemoryOf(s).PageOut(s.id, *dst);
    if (out.ok()) {
      out_events = std::move(*out);
    } else {
      out_status = out.status();
    }
  }
  if (!dst || !out_status.ok()) {  // its block waits for its range, or the page-out failed
    auto undone = target.Release(s.id);
    if (undone.ok()) ApplyEventsLocked(to, std::move(*undone), notices);
    if (!out_status.ok()) return out_status;
    return false;
  }
  const LaneId lane = s.lane;
  DetachLocked(s);
  s.lane = 0;
  LeaveLaneLocked(s.id, lane);
  const Nanos now = clock_->Now();
  s.device = to;
  s.moving_from = from;
  s.state = SessionState::kAdmitted;
  s.copying = true;
  s.reason =
      fmt::format("moving from {}{}: its state is being copied in", devices_[from].name, why);
  s.resident_since = now;
  s.iterations_at_resident = s.iterations_done;
  s.migrations++;
  JoinLaneLocked(s, grant->lane);
  migration_stats_.started++;
  ++migrations_in_flight_;
  logging::Event("sched", "migrating",
                 {{"session", s.id},
                  {"from", devices_[from].name},
                  {"to", devices_[to].name},
                  {"why", why},
                  {"copy", "peer"}});
  ApplyEventsLocked(from, std::move(out_events), notices);
  RetryUnplacedLocked(notices);
  return true;
}

void Engine::FinishPeerMoveLocked(const mem::Transfer& t, const Status& copy, Notices* notices) {
  // The target's incoming transfer ends with the copy (a failed copy loses the session
  // there, and that is reported once, from there); the session then leaves the source, where
  // it is paged out with nothing in host memory.
  auto in = devices_[t.peer_device].memory->FinishTransfer(t.peer_transfer, copy);
  if (in.ok()) {
    ApplyEventsLocked(t.peer_device, std::move(*in), notices);
  } else {
    logging::Get("sched")->error("session {}: incoming transfer {} on {}: {}", t.session,
                                 t.peer_transfer, devices_[t.peer_device].name,
                                 in.status().ToString());
  }
  auto left = devices_[t.device_index].memory->Emigrate(t.session);
  if (left.ok()) ApplyEventsLocked(t.device_index, std::move(left->events), notices);
  auto it = sessions_.find(t.session);
  if (it == sessions_.end() || !it->second.moving_from) return;  // released or lost meanwhile
  SessionRec& s = it->second;
  s.moving_from.reset();
  --migrations_in_flight_;
  s.copying = false;
  s.reason.clear();
  migration_stats_.finished++;
  logging::Event("sched", "migrated",
                 {{"session", s.id},
                  {"from", devices_[t.device_index].name},
                  {"to", devices_[s.device].name},
                  {"copy", "peer"}});
  RefreshViewLocked(s);
}

Status Engine::SetDeviceLost(size_t device, const Status& why) {
  Notices notices;
  {
    MutexLock lock(&mu_);
    if (device >= devices_.size()) {
      return InvalidArgumentError(
          fmt::format("no device {} (the daemon has {})", device, devices_.size()));
    }
    if (!lost_[device].ok()) return OkStatus();
    lost_[device] = why.ok() ? UnavailableError("lost") : why;
    logging::Event("sched", "device_lost",
                   {{"device", devices_[device].name}, {"status", lost_[device].ToString()}});
    // Sessions waiting for this device alone would wait for good: they fail now.
    std::vector<SessionId> stranded;
    for (const auto& [id, s] : sessions_) {
      if (s.state == SessionState::kWaiting && s.device == device) stranded.push_back(id);
    }
    for (const SessionId id : stranded) {
      devices_[device].memory->CancelWaiting(id);  // its own cancellation is reported below
      sessions_.erase(id);
      notices.failed.emplace_back(
          id, UnavailableError(fmt::format("session {}: {} was lost while it waited for it: {}", id,
                                           devices_[device].name, lost_[device].message())));
    }
  }
  Notify(notices);
  return OkStatus();
}

Status Engine::DeviceLost(size_t device) const {
  MutexLock lock(&mu_);
  if (device >= devices_.size()) {
    return InvalidArgumentError(
        fmt::format("no device {} (the daemon has {})", device, devices_.size()));
  }
  return lost_[device];
}

Status Engine::MigrateLocked(SessionRec& s, size_t to, const std::string& why, Notices* notices) {
  const size_t from = s.device;
  if (peer_moves_ && s.spec.requirement.persistent_bytes > 0 &&
      MemoryOf(s).provider().CanCopyToPeer(devices_[to].memory->provider())) {
    SALUS_ASSIGN_OR_RETURN(const bool moved, MoveByPeerLocked(s, to, why, notices));
    if (moved) return OkStatus();
  }
  SALUS_ASSIGN_OR_RETURN(mem::AdmissionEvents events, MemoryOf(s).PageOut(s.id));
  const LaneId lane = s.lane;
  DetachLocked(s);
  s.lane = 0;
  LeaveLaneLocked(s.id, lane);
  s.state = SessionState::kPagedOut;
  paged_out_.insert(s.id);
  s.migrate_to = to;
  s.copying = s.spec.requirement.persistent_bytes > 0;
  s.reason = fmt::format("moving to {}{}", devices_[to].name, why);
  migration_stats_.started++;
  ++migrations_in_flight_;
  logging::Event(
      "sched", "migrating",
      {{"session", s.id}, {"from", devices_[from].name}, {"to", devices_[to].name}, {"why", why}});
  const SessionId id = s.id;
  ApplyEventsLocked(from, std::move(events), notices);
  RetryUnplacedLocked(notices);
  SessionRec& moved = sessions_.at(id);
  if (!moved.copying) FinishMigrationLocked(moved, clock_->Now(), notices);
  return OkStatus();
}

void Engine::FinishMigrationLocked(SessionRec& s, Nanos now, Notices* notices) {
  const size_t from = s.device, to = *s.migrate_to;
  s.migrate_to.reset();
  --migrations_in_flight_;
  const mem::Requirement held = HeldLocked(s);
  if (!devices_[to].memory->Preview(held).resident) {
    migration_stats_.undone++;
    s.reason = fmt::format("paged out: {} had no room left for it; paged in on {} when it runs",
                           devices_[to].name, devices_[from].name);
    logging::Event("sched", "migration_undone", {{"session", s.id}, {"to", devices_[to].name}});
    return;
  }
  auto leaving = MemoryOf(s).Emigrate(s.id);
  if (!leaving.ok()) {
    migration_stats_.undone++;
    logging::Get("sched")->error("session {}: move to {}: {}", s.id, devices_[to].name,
                                 leaving.status().ToString());
    return;
  }
  const SessionId id = s.id;
  mem::AdmissionEvents freed = std::move(leaving->events);
  auto grant = devices_[to].memory->Immigrate(*leaving);
  if (!grant.ok() || !grant->has_value()) {
    // The preview said it fits and nothing ran since: a broken contract. Its state is lost.
    if (leaving->host != nullptr && leaving->host_provider != nullptr) {
      leaving->host_provider->FreeHost(leaving->host, held.persistent_bytes).IgnoreError();
    }
    const Status lost = InternalError(
        fmt::format("session {}: its state was lost moving it to {}: {}", id, devices_[to].name,
                    grant.ok() ? "the device refused it" : grant.status().ToString()));
    logging::Get("sched")->error("{}", lost.ToString());
    freed.failed.emplace_back(id, lost);
    ApplyEventsLocked(from, std::move(freed), notices);
    return;
  }
  s.device = to;
  paged_out_.erase(id);
  s.state = SessionState::kAdmitted;
  auto residence = devices_[to].memory->ResidenceOf(id);
  s.copying = residence.ok() && *residence == mem::Residence::kPagingIn;
  s.reason = s.copying
                 ? fmt::format("moved from {}: its state is being copied in", devices_[from].name)
                 : "";
  s.resident_since = now;
  s.iterations_at_resident = s.iterations_done;
  s.migrations++;
  JoinLaneLocked(s, (*grant)->lane);
  migration_stats_.finished++;
  logging::Event("sched", "migrated",
                 {{"session", id}, {"from", devices_[from].name}, {"to", devices_[to].name}});
  ApplyEventsLocked(from, std::move(freed), notices);
  RetryUnplacedLocked(notices);
}

void Engine::SpreadLocked(Nanos now, Notices* notices) {
  if (now < next_defragment_) return;
  next_defragment_ = now + std::max(paging_quantum_, kMinDefragmentInterval);
  std::vector<size_t> placed(devices_.size(), 0);
  for (const auto& [id, s] : sessions_) {
    if (s.device != kUnplaced) ++placed[s.device];
  }
  const auto busiest = std::max_element(placed.begin(), placed.end());
  if (*busiest < 2) return;
  const size_t from = static_cast<size_t>(busiest - placed.begin());
  if (!lost_[from].ok()) return;
  for (size_t to = 0; to < devices_.size(); ++to) {
    if (placed[to] != 0 || !lost_[to].ok() ||
        devices_[to].memory->provider().kind() != devices_[from].memory->provider().kind()) {
      continue;
    }
    // The cheapest to move: the smallest P among those that may move now and fit there.
    SessionRec* move = nullptr;
    for (auto& [id, s] : sessions_) {
      if (s.device != from || s.spec.device || s.state != SessionState::kAdmitted || s.copying ||
          now - s.resident_since < paging_quantum_) {
        continue;
      }
      if (move != nullptr &&
          s.spec.requirement.persistent_bytes >= move->spec.requirement.persistent_bytes) {
        continue;
      }
      if (devices_[to].memory->Preview(HeldLocked(s)).resident) move = &s;
    }
    if (move == nullptr) continue;
    next_defragment_ = Nanos(0);  // the next look may find the next move
    const Status st = MigrateLocked(
        *move, to, fmt::format(" to {}, which had no session", devices_[to].name), notices);
    if (!st.ok()) {
      logging::Get("sched")->error("session {}: move to {}: {}", move->id, devices_[to].name,
                                   st.ToString());
    }
    return;
  }
}

void Engine::DefragmentLocked(Nanos now, Notices* notices) {
  if (migrations_in_flight_ > 0) return;
  bool any_waiting = !unplaced_.empty();
  for (const EngineDevice& d : devices_) any_waiting = any_waiting || d.memory->WaitingCount() > 0;
  if (!any_waiting) {
    SpreadLocked(now, notices);
    return;
  }
  // At most once per paging quantum (a candidate's standing changes with time, and a search
  // costs a scan of the sessions), and for the head of each queue only: the first session
  // waiting for each device, and the first waiting for any. While sessions wait and no move
  // started, the driver dispatches again when the next search may run: the sessions may all
  // be idle, with no event to come, and a candidate's quantum ends by time alone.
  if (now < next_defragment_) {
    defragment_deadline_ = next_defragment_;
    return;
  }
  next_defragment_ = now + std::max(paging_quantum_, kMinDefragmentInterval);
  defragment_deadline_ = next_defragment_;
  std::vector<SessionId> waiting(devices_.size() + 1, 0);
  for (const auto& [id, s] : sessions_) {
    if (s.state != SessionState::kWaiting || s.device == kUnplaced) continue;
    SessionId& head = waiting[s.device];
    if (head == 0 || id < head) head = id;  // ids grow with arrival
  }
  if (!unplaced_.empty()) waiting.back() = unplaced_.front();
  std::erase(waiting, SessionId{0});
  std::sort(waiting.begin(), waiting.end());
  std::vector<SessionView> candidates;
  std::vector<SessionId> ids;
  for (const SessionId w : waiting) {
    const SessionRec& in = sessions_.at(w);
    for (size_t a = 0; a < devices_.size(); ++a) {
      if ((in.device != kUnplaced && in.device != a) || !lost_[a].ok()) continue;
      candidates.clear();
      for (const auto& [id, s] : sessions_) {
        // A session its client pinned stays where it was put.
        if (s.device == a && !s.spec.device && s.state == SessionState::kAdmitted && !s.copying &&
            now - s.resident_since >= paging_quantum_) {
          candidates.push_back(PagingViewLocked(s));
        }
      }
      if (candidates.empty()) continue;
      policy_->OrderPageOut(candidates);
      ids.clear();
      for (const SessionView& v : candidates) ids.push_back(v.id);
      const mem::AdmissionPreview p = devices_[a].memory->Preview(in.spec.requirement, ids);
      if (!p.resident || p.page_out.size() != 1) continue;
      SessionRec& move = sessions_.at(p.page_out[0]);
      const std::optional<size_t> to = TargetLocked(HeldLocked(move), a);
      if (!to) continue;
      next_defragment_ = Nanos(0);   // the next look may find the next move
      defragment_deadline_.reset();  // the move's copy ends with a dispatch
      const Status st = MigrateLocked(
          move, *to, fmt::format(" to make room for session {} on {}", w, devices_[a].name),
          notices);
      if (!st.ok()) {
        logging::Get("sched")->error("session {}: move to {}: {}", move.id, devices_[*to].name,
                                     st.ToString());
        continue;
      }
      return;
    }
  }
}

Status Engine::Migrate(SessionId id, size_t device) {
  Notices notices;
  Status st;
  {
    MutexLock lock(&mu_);
    if (device >= devices_.size()) {
      return InvalidArgumentError(
          fmt::format("session {}: no device {} (the daemon has {})", id, device, devices_.size()));
    }
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return NotFoundError(fmt::format("session {} does not exist", id));
    SessionRec& s = it->second;
    if (s.state != SessionState::kAdmitted || s.copying) {
      return FailedPreconditionError(fmt::format(
          "session {} can move only between its iterations, resident and not copying; it is {}", id,
          SessionStateName(s.state)));
    }
    if (s.device == device) {
      return FailedPreconditionError(
          fmt::format("session {} is on {} already", id, devices_[device].name));
    }
    for (const size_t d : {s.device, device}) {
      if (!lost_[d].ok()) {
        return FailedPreconditionError(fmt::format("session {} cannot move: {} was lost: {}", id,
                                                   devices_[d].name, lost_[d].message()));
      }
    }
    if (devices_[device].memory->provider().kind() != MemoryOf(s).provider().kind()) {
      return FailedPreconditionError(fmt::format("{} and {} do not share a kind of memory",
                                                 devices_[s.device].name, devices_[device].name));
    }
    if (!devices_[device].memory->Preview(HeldLocked(s)).resident) {
      return FailedPreconditionError(
          fmt::format("{} has no room for session {} now", devices_[device].name, id));
    }
    st = MigrateLocked(s, device, "", &notices);
  }
  Notify(notices);
  return st;
}

void Engine::NoteStartLocked(LaneId lane_id, LaneRec& lane, SessionId session) {
  lane.running = session;
  lane.met.clear();
  for (auto& [id, other] : lanes_) {
    if (id == lane_id || !other.busy || other.device != lane.device) continue;
    lane.met.push_back(other.running);
    if (std::find(other.met.begin(), other.met.end(), session) == other.met.end()) {
      other.met.push_back(session);
    }
  }
}

bool Engine::KeptApartLocked(SessionRec& s, Nanos now) {
  // The longest waiting first: a strict order (wait, then id), so sessions kept apart from
  // each other never all yield to one another.
  const auto waits = [&](const SessionRec& x) {
    return std::pair(x.apart_since.value_or(now), x.id);
  };
  for (const SessionId partner : s.partners) {
    const PairRec& pair = pairs_.at(KeyOf(s.id, partner));
    if (pair.state != PairRec::State::kApart && pair.state != PairRec::State::kProbing) continue;
    const SessionRec& p = sessions_.at(partner);
    if (p.device != s.device) continue;
    // Runnable now: resident between iterations, with work, and its lane free.
    const auto lane = lanes_.find(p.lane);
    const bool runnable = p.state == SessionState::kAdmitted && !p.copying &&
                          PendingLocked(p) > 0 && lane != lanes_.end() && !lane->second.busy;
    if (p.state == SessionState::kRunning || (runnable && waits(p) < waits(s))) {
      if (!s.apart_since) s.apart_since = now;
      return true;
    }
  }
  s.apart_since.reset();
  return false;
}

void Engine::MeasureLocked(SessionRec& s, const std::vector<SessionId>& met, double seconds,
                           Notices* notices) {
  auto average = [&](double* ewma, double sample, size_t n) {
    *ewma = n == 0 ? sample : ewma_alpha_ * sample + (1 - ewma_alpha_) * *ewma;
  };
  // Its first iterations carry one-time costs; nor do they count beside partners.
  if (s.iterations_done <= static_cast<int64_t>(introspection_.warmup)) return;
  if (met.empty()) average(&s.solo_seconds, seconds, s.solo_samples++);
  for (const SessionId partner : met) {
    if (!sessions_.contains(partner)) continue;
    const PairKey key = KeyOf(s.id, partner);
    if (!pairs_.contains(key)) {
      s.partners.push_back(partner);
      sessions_.at(partner).partners.push_back(s.id);
    }
    PairRec& pair = pairs_[key];
    const size_t i = key.first == s.id ? 0 : 1;
    average(&pair.with_k[i], static_cast<double>(met.size()), pair.with_n[i]);
    average(&pair.with[i], seconds, pair.with_n[i]++);
  }
  // Decide what this iteration completed; a decision may move a session (s itself too).
  const std::vector<SessionId> partners = s.partners;
  const SessionId id = s.id;
  for (const SessionId partner : partners) {
    const auto it = pairs_.find(KeyOf(id, partner));
    if (it != pairs_.end()) DecidePairLocked(it->first, it->second, notices);
  }
}

void Engine::DecidePairLocked(const PairKey& key, PairRec& pair, Notices* notices) {
  if (pair.state == PairRec::State::kKept || pair.state == PairRec::State::kApart) return;
  const size_t n = introspection_.samples;
  if (pair.with_n[0] < n || pair.with_n[1] < n) return;
  const SessionRec& a = sessions_.at(key.first);
  const SessionRec& b = sessions_.at(key.second);
  // Alone: its solo samples, else the time its spec declares for an iteration alone; with
  // neither, the pair is probed (run apart, taking turns) until the solo samples are there.
  auto alone = [&](const SessionRec& s) -> double {
    if (s.solo_samples >= n) return s.solo_seconds;
    if (pair.state == PairRec::State::kMeasuring && s.spec.iteration_time_hint &&
        *s.spec.iteration_time_hint > Nanos(0)) {
      return ToSeconds(*s.spec.iteration_time_hint);
    }
    return -1;
  };
  // With the partner alone beside it: each of the k sessions it met adds an equal share of
  // the slowdown it saw.
  auto beside = [&](size_t i, double solo) {
    return solo + (pair.with[i] - solo) / std::max(1.0, pair.with_k[i]);
  };
  PairMeasurement m;
  m.a = key.first;
  m.b = key.second;
  m.a_without = alone(a);
  m.b_without = alone(b);
  m.a_with = beside(0, m.a_without);
  m.b_with = beside(1, m.b_without);
  if (m.a_without < 0 || m.b_without < 0) {
    if (pair.state == PairRec::State::kMeasuring) {
      pair.state = PairRec::State::kProbing;
      introspection_stats_.probes++;
      logging::Event("sched", "pair_probe", {{"a", m.a}, {"b", m.b}});
    }
    return;
  }
  if (policy_->KeepPacked(m)) {
    pair.state = PairRec::State::kKept;
    introspection_stats_.kept++;
    logging::Event("sched", "pair_kept", {{"a", m.a}, {"b", m.b}, {"gain", m.gain()}});
    return;
  }
  pair.state = PairRec::State::kApart;
  // Move the smaller one (unpinned, between its iterations) to a device that takes it now.
  std::string action = "apart";
  std::array<SessionId, 2> order = {m.a, m.b};
  if (b.spec.requirement.persistent_bytes < a.spec.requirement.persistent_bytes) {
    std::swap(order[0], order[1]);
  }
  for (const SessionId id : order) {
    SessionRec& s = sessions_.at(id);
    if (s.spec.device || s.state != SessionState::kAdmitted || s.copying || s.migrate_to) {
      continue;
    }
    const std::optional<size_t> to = TargetLocked(HeldLocked(s), s.device);
    // Only to a device where it runs alone: beside others it would be measured, and maybe
    // moved, again.
    if (!to || !devices_[*to].memory->Lanes().empty()) continue;
    if (MigrateLocked(s, *to,
                      fmt::format(": it runs slower beside session {}", id == m.a ? m.b : m.a),
                      notices)
            .ok()) {
      action = "moved";
      break;
    }
  }
  (action == "moved" ? introspection_stats_.moved : introspection_stats_.apart)++;
  logging::Event("sched", "pair_unpacked",
                 {{"a", m.a}, {"b", m.b}, {"gain", m.gain()}, {"action", action}});
}

void Engine::ForgetPairsLocked(const SessionRec& s) {
  for (const SessionId partner : s.partners) {
    pairs_.erase(KeyOf(s.id, partner));
    auto it = sessions_.find(partner);
    if (it != sessions_.end()) std::erase(it->second.partners, s.id);
  }
}

IntrospectionStats Engine::Introspection() const {
  MutexLock lock(&mu_);
  return introspection_stats_;
}

MigrationStats Engine::Migrations() const {
  MutexLock lock(&mu_);
  return migration_stats_;
}

Status Engine::ReleaseLocked(SessionId id, Notices* notices) {
  SessionRec& s = sessions_.at(id);
  if (s.migrate_to || s.moving_from) --migrations_in_flight_;
  ForgetPairsLocked(s);
  const LaneId lane = s.lane;
  const size_t device = s.device;
  const std::optional<size_t> source = s.moving_from;
  DetachLocked(s);
  sessions_.erase(id);
  paged_out_.erase(id);
  if (lane != 0) LeaveLaneLocked(id, lane);
  if (source) {  // a peer copy is moving it: it is still paging out there
    auto left = devices_[*source].memory->Release(id);
    if (left.ok()) ApplyEventsLocked(*source, std::move(*left), notices);
  }
  auto events = devices_[device].memory->Release(id);
  if (!events.ok()) return events.status();
  ApplyEventsLocked(device, std::move(*events), notices);
  RetryUnplacedLocked(notices);
  return OkStatus();
}

StatusOr<int> Engine::RemoveSession(SessionId id) {
  Notices notices;
  int dropped = 0;
  Status st;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      return NotFoundError(fmt::format("session {} does not exist", id));
    }
    SessionRec& s = it->second;
    if (s.state == SessionState::kClosing) {
      return FailedPreconditionError(
          fmt::format("session {} is already closing (its last iteration is ending)", id));
    }
    dropped = PendingLocked(s);
    s.requests.clear();
    s.requests_head = 0;
    switch (s.state) {
      case SessionState::kWaiting:
        // Its own cancellation is no news to the caller; it unblocks no one else.
        if (s.device == kUnplaced) {
          std::erase(unplaced_, id);
        } else {
          MemoryOf(s).CancelWaiting(id);
        }
        sessions_.erase(it);
        break;
      case SessionState::kRunning:
        DetachLocked(s);
        s.state = SessionState::kClosing;  // released by Complete()
        s.reason = "removed while its iteration runs";
        break;
      default:
        st = ReleaseLocked(id, &notices);
    }
  }
  Notify(notices);
  SALUS_RETURN_IF_ERROR(st);
  return dropped;
}

Status Engine::RequestIteration(SessionId id) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return NotFoundError(fmt::format("session {} does not exist", id));
  SessionRec& s = it->second;
  if (s.state == SessionState::kClosing) {
    return FailedPreconditionError(fmt::format("session {} is closing", id));
  }
  if (s.requests_head > 0 && s.requests_head == s.requests.size()) {
    s.requests.clear();
    s.requests_head = 0;
  }
  const Nanos now = clock_->Now();
  s.requests.push_back(now);
  s.last_request = now;
  if (s.idle_since) {
    // Note [Anticipation]: one more reply-to-request gap; the window follows it.
    s.gaps[s.gaps_observed % kGapHistory] = now - *s.idle_since;
    s.gaps_observed++;
    s.hold_window_stale = true;
    auto lit = lanes_.find(s.lane);
    StopIdlingLocked(s, lit == lanes_.end() ? nullptr : &lit->second);
  }
  if (PendingLocked(s) == 1) RefreshViewLocked(s);
  return OkStatus();
}

double Engine::RemainingSecondsLocked(const SessionRec& s) const {
  if (s.spec.declared_duration) {
    return std::max(0.0, ToSeconds(*s.spec.declared_duration - s.total_service));
  }
  if (s.spec.declared_iterations) {
    const double left =
        static_cast<double>(std::max<int64_t>(0, *s.spec.declared_iterations - s.iterations_done));
    double per = 0;
    if (s.ewma_seconds >= 0) {
      per = s.ewma_seconds;
    } else if (s.spec.iteration_time_hint) {
      per = ToSeconds(*s.spec.iteration_time_hint);
    }
    return left * per;
  }
  return std::numeric_limits<double>::infinity();
}

std::vector<Dispatch> Engine::DispatchReady() {
  std::vector<Dispatch> out;
  DispatchReady(&out);
  return out;
}

void Engine::DispatchReady(std::vector<Dispatch>* out) {
  Notices notices;
  {
    MutexLock lock(&mu_);
    const Nanos now = clock_->Now();
    defragment_deadline_.reset();
    if (defragment_ && devices_.size() > 1) DefragmentLocked(now, &notices);
    // Paged-out sessions: overcommit's, and moves undone (Note [Migration]).
    if (paging_ || !paged_out_.empty()) PageInLocked(now, &notices);
    DispatchLanesLocked(now, out);
  }
  if (!notices.admitted.empty() || !notices.failed.empty()) Notify(notices);
}

void Engine::DispatchLanesLocked(Nanos now, std::vector<Dispatch>* out) {
  next_hold_deadline_.reset();
  for (auto& [lane_id, lane] : lanes_) {
    if (lane.busy) continue;
    lane.blocked = false;
    if (lane.runnable.empty()) {
      EndHoldLocked(lane, 0, now);  // nothing waits behind it any more
      continue;
    }
    anticipated_.clear();
    for (SessionId m : lane.idle) {
      const SessionRec& s = sessions_.at(m);
      if (!AnticipatedLocked(s, now)) continue;
      SessionView v = ViewLocked(s);
      v.requested_at = *s.idle_since;
      v.expected_by = *s.idle_since + CurrentHoldWindowLocked(s);
      anticipated_.push_back(v);
    }
    const Decision decision =
        policy_->Pick(LaneSnapshot{now, lane_id, lane.runnable, anticipated_});
    if (decision.hold) {
      const bool known = std::any_of(anticipated_.begin(), anticipated_.end(),
                                     [&](const SessionView& v) { return v.id == decision.next; });
      assert(known && decision.hold_until > now);
      if (!known || decision.hold_until <= now) continue;  // policy broke its contract
      if (!lane.hold || lane.hold->session != decision.next) {
        EndHoldLocked(lane, decision.next, now);
        lane.hold = Hold{decision.next, decision.hold_until, now};
        holds_.started++;
      }
      lane.hold->until = decision.hold_until;
      if (!next_hold_deadline_ || decision.hold_until < *next_hold_deadline_) {
        next_hold_deadline_ = decision.hold_until;
      }
      continue;
    }
    auto sit = sessions_.find(decision.next);
    assert(sit != sessions_.end() && sit->second.lane == lane_id &&
           sit->second.view != kNotRunnable);
    if (sit == sessions_.end() || sit->second.lane != lane_id || sit->second.view == kNotRunnable) {
      continue;  // policy broke its contract
    }

    if (introspection_.enabled && KeptApartLocked(sit->second, now)) {
      // Another session of the lane may run instead: the policy picks among those not kept
      // apart (else a lane could idle behind its pick while the session its pick yields to
      // waits in the same lane).
      apart_scratch_.clear();
      for (const SessionView& v : lane.runnable) {
        if (v.id != decision.next && !KeptApartLocked(sessions_.at(v.id), now)) {
          apart_scratch_.push_back(v);
        }
      }
      if (apart_scratch_.empty()) continue;
      const Decision other = policy_->Pick(LaneSnapshot{now, lane_id, apart_scratch_});
      sit = sessions_.find(other.next);
      if (other.hold || sit == sessions_.end() || sit->second.lane != lane_id ||
          sit->second.view == kNotRunnable) {
        continue;
      }
    }
    const SessionId next = sit->second.id;
    mem::MemoryManager& memory = *devices_[lane.device].memory;
    auto lane_memory = memory.BeginIteration(lane_id, next);
    if (!lane_memory.ok()) {
      if (lane_memory.status().code() != StatusCode::kUnavailable) {
        logging::Get("sched")->error("lane {}: cannot begin an iteration: {}", lane_id,
                                     lane_memory.status().ToString());
      }
      lane.blocked = true;
      continue;  // blocked by lanes mid-iteration; retried after the next Complete()
    }
    auto persistent = memory.Persistent(next);
    if (!persistent.ok()) {
      memory.EndIteration(lane_id).IgnoreError();  // nothing was allocated in it
      if (persistent.status().code() != StatusCode::kUnavailable) {
        logging::Get("sched")->error("session {}: no persistent block: {}", next,
                                     persistent.status().ToString());
      }
      lane.blocked = true;
      continue;  // its block is placed when the iteration in its way ends
    }
    EndHoldLocked(lane, next, now);
    SessionRec& s = sit->second;
    Dispatch d;
    d.session = next;
    d.lane = lane_id;
    d.device = lane.device;
    d.lane_class = lane.lane_class;
    d.iteration = static_cast<uint64_t>(s.iterations_done);
    d.lane_memory = *lane_memory;
    d.persistent = *persistent;
    d.requested_at = s.requests[s.requests_head++];
    d.started_at = now;
    d.lane_first = !lane.has_run;
    d.switch_gap = lane.has_run ? now - lane.last_end : Nanos(0);
    s.state = SessionState::kRunning;
    RefreshViewLocked(s);
    if (introspection_.enabled) NoteStartLocked(lane_id, lane, d.session);
    lane.busy = true;
    ++running_;
    out->push_back(d);
  }
}

StatusOr<IterationRecord> Engine::Complete(const Dispatch& d, bool counted) {
  Notices notices;
  IterationRecord rec;
  Status release_status;
  {
    MutexLock lock(&mu_);
    auto sit = sessions_.find(d.session);
    auto lit = lanes_.find(d.lane);
    if (sit == sessions_.end() || lit == lanes_.end() ||
        (sit->second.state != SessionState::kRunning &&
         sit->second.state != SessionState::kClosing) ||
        !lit->second.busy) {
      return FailedPreconditionError(
          fmt::format("session {} has no iteration running on lane {}", d.session, d.lane));
    }
    const Nanos now = clock_->Now();
    SessionRec& s = sit->second;
    LaneRec& lane = lit->second;
    rec.session = d.session;
    rec.lane = d.lane;
    rec.lane_class = d.lane_class;
    rec.iteration = d.iteration;
    rec.requested_at = d.requested_at;
    rec.started_at = d.started_at;
    rec.finished_at = now;
    rec.queue_delay = d.started_at - d.requested_at;
    rec.run_time = now - d.started_at;
    rec.switch_gap = d.switch_gap;
    rec.lane_first = d.lane_first;

    const bool closing = s.state == SessionState::kClosing;
    if (!closing) s.state = SessionState::kAdmitted;
    s.last_ran = now;
    s.service += rec.run_time;
    if (counted) {
      s.iterations_done++;
      s.total_service += rec.run_time;
      const double secs = ToSeconds(rec.run_time);
      s.ewma_seconds =
          s.ewma_seconds < 0 ? secs : ewma_alpha_ * secs + (1 - ewma_alpha_) * s.ewma_seconds;
    }
    if (!closing) {
      RefreshViewLocked(s);
      if (anticipation_.max_hold > Nanos(0) && PendingLocked(s) == 0) {
        // Its reply goes out now; a synchronous client comes back after its turnaround.
        s.idle_since = now;
        lane.idle.push_back(s.id);
      }
    }
    std::vector<SessionId> met;
    if (introspection_.enabled) {
      met.swap(lane.met);
      lane.running = 0;
    }
    lane.busy = false;
    lane.has_run = true;
    lane.last_end = now;
    --running_;
    Status end = devices_[lane.device].memory->EndIteration(d.lane);
    if (!end.ok()) {
      logging::Get("sched")->error("lane {}: end of iteration: {}", d.lane, end.ToString());
    }
    if (closing) {
      release_status = ReleaseLocked(d.session, &notices);
    } else {
      if (lane.members.empty()) lanes_.erase(lit);
      // Last: a decision may move the session, now between its iterations.
      if (introspection_.enabled && counted) {
        MeasureLocked(s, met, ToSeconds(rec.run_time), &notices);
      }
    }
  }
  Notify(notices);
  SALUS_RETURN_IF_ERROR(release_status);
  return rec;
}

void Engine::ExpireWaiting() {
  Notices notices;
  {
    MutexLock lock(&mu_);
    for (size_t d = 0; d < devices_.size(); ++d) {
      ApplyEventsLocked(d, devices_[d].memory->ExpireWaiting(), &notices);
    }
    // Sessions waiting for any device (Note [Devices]) are the engine's to expire.
    const Nanos now = clock_->Now();
    for (auto it = unplaced_.begin(); it != unplaced_.end();) {
      const SessionRec& s = sessions_.at(*it);
      if (!s.admission_deadline || *s.admission_deadline > now) {
        ++it;
        continue;
      }
      notices.failed.emplace_back(
          s.id, DeadlineExceededError(fmt::format(
                    "session {}: no room for it on any device before its admission timeout "
                    "(expired {:.3f}s ago)",
                    s.id, ToSeconds(now - *s.admission_deadline))));
      sessions_.erase(*it);
      it = unplaced_.erase(it);
    }
  }
  Notify(notices);
}

StatusOr<SessionInfo> Engine::Session(SessionId id) const {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return NotFoundError(fmt::format("session {} does not exist", id));
  const SessionRec& s = it->second;
  SessionInfo info;
  info.id = id;
  if (s.device != kUnplaced) info.device = s.device;
  info.state = s.state;
  info.reason = s.reason;
  info.copying = s.copying;
  info.page_outs = s.page_outs;
  info.migrations = s.migrations;
  info.migrating_to = s.migrate_to;
  info.ephemeral_bytes = s.granted_ephemeral;
  info.lane = s.lane;
  info.lane_class = s.spec.requirement.lane_class;
  info.priority = s.spec.priority;
  info.iterations_done = s.iterations_done;
  info.pending = PendingLocked(s);
  info.running = s.state == SessionState::kRunning || s.state == SessionState::kClosing;
  info.total_service = s.total_service;
  info.remaining_seconds = RemainingSecondsLocked(s);
  info.avg_iteration_seconds = std::max(0.0, s.ewma_seconds);
  info.hold_window = CurrentHoldWindowLocked(s);
  info.gaps_observed = s.gaps_observed;
  return info;
}

std::vector<SessionInfo> Engine::Sessions() const {
  std::vector<SessionId> ids;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<SessionInfo> out;
  for (SessionId id : ids) {
    auto info = Session(id);
    if (info.ok()) out.push_back(*info);
  }
  return out;
}

std::vector<LaneId> Engine::BlockedLanes() const {
  MutexLock lock(&mu_);
  std::vector<LaneId> out;
  for (const auto& [id, lane] : lanes_) {
    if (lane.blocked) out.push_back(id);
  }
  return out;
}

std::vector<LaneId> Engine::HeldLanes() const {
  MutexLock lock(&mu_);
  std::vector<LaneId> out;
  for (const auto& [id, lane] : lanes_) {
    if (lane.hold && !lane.busy) out.push_back(id);
  }
  return out;
}

std::optional<Nanos> Engine::NextHoldDeadline() const {
  MutexLock lock(&mu_);
  std::optional<Nanos> next;
  for (const std::optional<Nanos>& t :
       {next_hold_deadline_, paging_deadline_, defragment_deadline_}) {
    if (t && (!next || *t < *next)) next = t;
  }
  return next;
}

HoldStats Engine::Holds() const {
  MutexLock lock(&mu_);
  return holds_;
}

size_t Engine::RunningIterations() const {
  MutexLock lock(&mu_);
  return running_;
}

// ----------------------------------------------------------------------------------------
// Paging (Note [Paging])

bool Engine::MayPageOutLocked(const SessionRec& v, const SessionView& in, Nanos now) const {
  if (v.state != SessionState::kAdmitted || v.copying) return false;
  if (now - v.resident_since < paging_quantum_ || v.iterations_done == v.iterations_at_resident) {
    // Made resident for a reason: it keeps its place until it has used it. An idle session
    // that never ran since is the exception, once it has been idle a quantum.
    const bool stale = PendingLocked(v) == 0 && now - v.resident_since >= paging_quantum_ &&
                       now - v.last_request >= page_out_idle_;
    if (!stale) return false;
  }
  if (PendingLocked(v) == 0 && now - std::max(v.last_ran, v.last_request) >= page_out_idle_) {
    return true;  // idle
  }
  const std::array<SessionView, 2> pair{in, PagingViewLocked(v)};
  return policy_->Pick(LaneSnapshot{now, 0, pair}).next == in.id;
}

SessionView Engine::PagingViewLocked(const SessionRec& s) const {
  // Sessions of different lanes, or of none, compared: FAIR's service since a lane's
  // membership changed means nothing across lanes, the service since admission does.
  SessionView v = ViewLocked(s);
  v.service = s.total_service;
  return v;
}

std::optional<Nanos> Engine::NextCandidacyLocked(Nanos now) const {
  // The earliest moment a resident's standing changes by time alone: its quantum ends, or it
  // has been idle long enough. Events (requests, completions, copies) dispatch anyway.
  std::optional<Nanos> next;
  auto consider = [&](Nanos t) {
    if (t > now && (!next || t < *next)) next = t;
  };
  for (const auto& [id, s] : sessions_) {
    if (s.state != SessionState::kAdmitted || s.copying) continue;
    consider(s.resident_since + paging_quantum_);
    if (PendingLocked(s) == 0) {
      consider(std::max(s.last_ran, s.last_request) + page_out_idle_);
      consider(s.last_request + page_out_idle_);
    }
  }
  return next;
}

void Engine::PageInLocked(Nanos now, Notices* notices) {
  // Paged-out sessions with work, fully copied out.
  std::vector<SessionView>& want = page_scratch_;
  want.clear();
  for (const SessionId id : paged_out_) {
    const SessionRec& s = sessions_.at(id);
    if (!s.copying && !s.migrate_to && PendingLocked(s) > 0) want.push_back(PagingViewLocked(s));
  }
  paging_deadline_.reset();
  if (want.empty()) return;
  std::vector<SessionView> candidates;
  std::vector<SessionId> ids;
  bool left_waiting = false;
  while (!want.empty()) {
    // The policy's best of them first.
    const SessionId next = policy_->Pick(LaneSnapshot{now, 0, want}).next;
    const auto w =
        std::find_if(want.begin(), want.end(), [&](const SessionView& v) { return v.id == next; });
    if (w == want.end()) break;  // policy broke its contract
    const SessionView in = *w;
    *w = want.back();
    want.pop_back();

    const size_t device = sessions_.at(in.id).device;
    candidates.clear();
    for (const auto& [id, s] : sessions_) {
      if (s.device == device && MayPageOutLocked(s, in, now)) {
        candidates.push_back(PagingViewLocked(s));
      }
    }
    policy_->OrderPageOut(candidates);
    ids.clear();
    for (const SessionView& v : candidates) ids.push_back(v.id);
    mem::MemoryManager& memory = *devices_[device].memory;
    auto r = memory.PageIn(in.id, ids);
    if (!r.ok()) {
      logging::Get("sched")->error("session {}: page-in: {}", in.id, r.status().ToString());
      continue;
    }
    if (!r->resident) {  // no room even so; a smaller one may fit
      left_waiting = true;
      continue;
    }
    ApplyEventsLocked(device, std::move(r->events), notices);
    for (const SessionId v : r->paged_out) {
      SessionRec& out = sessions_.at(v);
      const LaneId lane = out.lane;
      DetachLocked(out);
      out.lane = 0;
      LeaveLaneLocked(v, lane);
      out.state = SessionState::kPagedOut;
      paged_out_.insert(v);
      out.reason = fmt::format("paged out to make room for session {}", in.id);
      out.copying = out.spec.requirement.persistent_bytes > 0;
      out.page_outs++;
      paging_stats_.page_outs++;
      logging::Event("sched", "paged_out", {{"session", v}, {"for", in.id}});
    }
    SessionRec& s = sessions_.at(in.id);
    auto residence = memory.ResidenceOf(in.id);
    s.state = SessionState::kAdmitted;
    paged_out_.erase(in.id);
    s.copying = residence.ok() && *residence == mem::Residence::kPagingIn;
    s.reason = s.copying ? "paging in: its state is being copied back" : "";
    s.resident_since = now;
    s.iterations_at_resident = s.iterations_done;
    JoinLaneLocked(s, r->lane);
    paging_stats_.page_ins++;
    logging::Event("sched", "paged_in",
                   {{"session", in.id}, {"lane", r->lane}, {"paged_out", r->paged_out.size()}});
  }
  // Residents become candidates as time passes (quantum, idleness), with no event to say so:
  // whoever drives the engine dispatches again then.
  if (left_waiting) paging_deadline_ = NextCandidacyLocked(now);
}

std::vector<mem::Transfer> Engine::TakeTransfers() {
  MutexLock lock(&mu_);
  std::vector<mem::Transfer> out;
  for (size_t d = 0; d < devices_.size(); ++d) {
    for (mem::Transfer& t : devices_[d].memory->TakeTransfers()) {
      t.device_index = d;
      out.push_back(t);
    }
  }
  return out;
}

Status Engine::FinishTransfer(const mem::Transfer& t, const Status& copy, Nanos took) {
  Notices notices;
  Status st;
  {
    MutexLock lock(&mu_);
    if (t.device_index >= devices_.size()) {
      return InvalidArgumentError(fmt::format("transfer {}: no device {}", t.id, t.device_index));
    }
    // A peer copy's loss is the target's to report (FinishPeerMoveLocked): for the source the
    // block is done with either way.
    const bool peer = t.peer != nullptr;
    if (peer && t.peer_device >= devices_.size()) {
      return InvalidArgumentError(
          fmt::format("transfer {}: no peer device {}", t.id, t.peer_device));
    }
    auto events = devices_[t.device_index].memory->FinishTransfer(t.id, peer ? OkStatus() : copy);
    st = events.status();
    if (st.ok()) {
      paging_stats_.copies++;
      paging_stats_.copied_bytes += t.bytes;
      paging_stats_.copy_time += took;
      if (peer) FinishPeerMoveLocked(t, copy, &notices);
    }
    auto it = sessions_.find(t.session);
    if (st.ok() && !peer && it != sessions_.end()) {
      SessionRec& s = it->second;
      s.copying = false;
      if (s.migrate_to && t.to_host) {
        FinishMigrationLocked(s, clock_->Now(), &notices);
      } else if (s.state == SessionState::kPagedOut) {
        s.reason = "paged out; paged in when the policy runs it";
      } else {
        s.reason.clear();
        RefreshViewLocked(s);  // runnable now, if it has work
      }
    }
    if (events.ok()) {
      ApplyEventsLocked(t.device_index, std::move(*events), &notices);
      RetryUnplacedLocked(&notices);  // a page-out's copy freed its range
    }
  }
  Notify(notices);
  return st;
}

Status RunCopy(const Engine& engine, const mem::Transfer& t) {
  device::MemoryProvider& p = engine.provider(t.device_index);
  if (t.peer != nullptr)
    return p.CopyToPeer(t.peer, engine.provider(t.peer_device), t.device, t.bytes);
  return t.to_host ? p.CopyToHost(t.host, t.device, t.bytes)
                   : p.CopyToDevice(t.device, t.host, t.bytes);
}

PagingStats Engine::Paging() const {
  MutexLock lock(&mu_);
  return paging_stats_;
}

}  // namespace salus::sched
