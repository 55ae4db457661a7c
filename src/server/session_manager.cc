#include "server/session_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <stdexcept>
#include <utility>

#include "common/check.h"
#include "common/logging.h"
#include "common/units.h"
#include "server/metrics.h"
#include "server/synthetic_runtime.h"

namespace salus::server {
namespace {

// Session ids stay below 2^53, so any JSON reader holds them exactly.
constexpr uint64_t kSessionIdMask = (uint64_t{1} << 53) - 1;

Status NoSuchSession(uint64_t id) {
  return NotFoundError(fmt::format("session {} does not exist", id));
}

// Note [Replies before the end]
// A RunIteration with reply_when_fetched is replied when its runtime says the fetches are ready
// (IterationOutputs::ready), from the lane worker, while the iteration's remaining steps still
// run; `done` then sends nothing. Its stats' run_us is the time up to the reply (`early`
// says so). The session's later requests are queued behind the whole iteration as always, so
// they see its state; when the iteration fails after the reply, the error is kept and the
// session's next request (an iteration, a state read or write) fails with it, its message
// naming the iteration. Where the runtime cannot tell (a GPU, a fetch of a state value, a
// synthetic session), the reply goes at the end, as without the flag.
void ReplyIteration(Call& call, const IterationOutputs& outputs, const sched::IterationRecord& r,
                    bool early) {
  v1::Reply reply;
  v1::RunIterationReply* body = reply.mutable_run_iteration();
  std::vector<zmq::message_t> frames;
  for (size_t i = 0; i < outputs.specs.size(); ++i) {
    *body->add_outputs() = outputs.specs[i];
    frames.emplace_back(outputs.data[i].data(), outputs.data[i].size());
  }
  v1::IterationStats* st = body->mutable_stats();
  st->set_iteration(r.iteration);
  st->set_lane(r.lane);
  st->set_queue_delay_us(static_cast<double>(r.queue_delay.count()) / 1e3);
  st->set_run_us(static_cast<double>(r.run_time.count()) / 1e3);
  st->set_switch_gap_us(static_cast<double>(r.switch_gap.count()) / 1e3);
  st->set_early(early);
  call.Reply(std::move(reply), std::move(frames));
}

// Note [Rewound sessions]
// A session restored from a snapshot written while the daemon served (Note [Snapshots while
// serving] in server.cc) is at the iteration of that snapshot, which after a crash may be
// before iterations its client sent and saw answered. Run as they come, the client's next
// batches would train a state they were not meant for, and nobody would know. So such a
// session refuses an iteration that names an earlier daemon instance (the client has not
// heard of the restart): ABORTED, before anything is queued (nothing runs, nothing counts),
// naming the iteration the session is at, so the client can send the lost batches again from
// there. Requests naming this instance (the client heard) run; so do those naming none
// (clients that do not say). A drain's snapshot holds every accepted iteration: nothing to
// refuse.
Status Rewound(int64_t at) {
  return AbortedError(fmt::format(
      "the daemon restarted from a snapshot written while it served, and the session is at "
      "iteration {}: the iterations this client sent after it are lost; nothing ran",
      at));
}

}  // namespace

uint64_t SessionManager::NewSessionId() {
  while (true) {
    const uint64_t id = SecureRandom64() & kSessionIdMask;
    if (id != 0 && sessions_.count(id) == 0) return id;
  }
}

StatusOr<std::shared_ptr<SessionManager::Entry>> SessionManager::Owned(const ClientRef& owner,
                                                                       uint64_t id) const {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->client != owner.id) return NoSuchSession(id);
  return it->second;
}

StatusOr<v1::CreateSessionReply> SessionManager::Create(const ClientRef& owner,
                                                        const v1::CreateSession& req) {
  return Add(owner, req, nullptr);
}

StatusOr<v1::CreateSessionReply> SessionManager::Add(const ClientRef& owner,
                                                     const v1::CreateSession& req,
                                                     const Resumed* resumed) {
  const Quotas& quota = o_.quotas;
  if (quota.sessions != 0 && SessionsOf(owner.id).size() >= quota.sessions) {
    return QuotaExceeded("sessions", quota.sessions, "close one of this client's sessions first");
  }
  if (req.name().size() > o_.limits.max_name_bytes) {
    return InvalidArgumentError(
        fmt::format("the session name has {} bytes, more than limits.max_name_bytes={}",
                    req.name().size(), o_.limits.max_name_bytes));
  }
  if (req.job().size() > o_.limits.max_name_bytes) {
    return InvalidArgumentError(
        fmt::format("the job name has {} bytes, more than limits.max_name_bytes={}",
                    req.job().size(), o_.limits.max_name_bytes));
  }
  if (req.iterations() < 0) {
    return InvalidArgumentError(fmt::format("iterations must be >= 0, got {}", req.iterations()));
  }
  if (!std::isfinite(req.duration_seconds()) || req.duration_seconds() < 0) {
    return InvalidArgumentError(
        fmt::format("duration_seconds must be >= 0, got {}", req.duration_seconds()));
  }
  if (!std::isfinite(req.admission_timeout_seconds()) || req.admission_timeout_seconds() < 0) {
    return InvalidArgumentError(fmt::format("admission_timeout_seconds must be >= 0, got {}",
                                            req.admission_timeout_seconds()));
  }
  if (std::abs(req.priority()) > kMaxPriority) {
    return InvalidArgumentError(
        fmt::format("priority must be in [-{0}, {0}], got {1}", kMaxPriority, req.priority()));
  }
  if (!v1::LatencyClass_IsValid(req.latency_class())) {
    return InvalidArgumentError(
        fmt::format("latency_class must be BATCH (0) or INTERACTIVE (1), got {}",
                    static_cast<int>(req.latency_class())));
  }
  // A client of an allocation gets its class, and its priority unless the request names one;
  // the allocation's max_priority, where it sets one, bounds it in place of the quota's.
  int32_t priority = req.priority();
  v1::LatencyClass latency_class = req.latency_class();
  std::optional<AllocationTerms> terms;
  if (!owner.allocation.empty()) {
    if (o_.allocations == nullptr) {
      return FailedPreconditionError("this server keeps no allocations");
    }
    auto t = o_.allocations->Terms(owner.allocation);
    if (!t.ok()) return UnauthenticatedError("this client's allocation was revoked");
    terms = std::move(*t);
    if (priority == 0) priority = terms->priority;
    latency_class = terms->latency_class;
  }
  if (terms && terms->max_priority > 0) {
    if (priority > terms->max_priority) {
      return ResourceExhaustedError(
          fmt::format("allocation {} max_priority={} reached: this session asks for priority {}",
                      terms->id, terms->max_priority, priority));
    }
  } else if (priority > 0 && static_cast<uint64_t>(priority) > quota.max_priority) {
    return QuotaExceeded("max_priority", quota.max_priority,
                         fmt::format("this session asks for priority {}", priority));
  }
  std::optional<size_t> pinned;
  if (!req.device().empty()) {
    SALUS_ASSIGN_OR_RETURN(pinned, o_.executor->engine().FindDevice(req.device()));
  }
  SALUS_ASSIGN_OR_RETURN(std::unique_ptr<SessionRuntime> runtime, BuildRuntime(owner, req, pinned));
  const uint64_t p = runtime->requirement().persistent_bytes;
  if (quota.persistent_bytes != 0) {
    uint64_t held = 0;
    {
      MutexLock lock(&mu_);
      for (const auto& [id, e] : sessions_) {
        if (e->client == owner.id) held += e->runtime->requirement().persistent_bytes;
      }
    }
    if (held + p > quota.persistent_bytes) {
      return QuotaExceeded(
          "persistent_bytes", quota.persistent_bytes,
          fmt::format("this session needs {} of persistent memory and the client holds {}",
                      FormatBytes(p), FormatBytes(held)));
    }
  }

  auto entry = std::make_shared<Entry>();
  entry->create = std::make_shared<const v1::CreateSession>(req);
  entry->host_bytes = runtime->host_bytes() + req.ByteSizeLong();
  entry->name = req.name();
  entry->client = owner.id;
  entry->client_name = owner.name;
  entry->allocation = owner.allocation;
  entry->priority = priority;
  entry->latency_class = latency_class;
  entry->iterations_declared = req.iterations();
  entry->job = req.job();
  sched::SessionSpec spec;
  spec.requirement = runtime->requirement();
  spec.requirement.lane_class = latency_class == v1::LATENCY_INTERACTIVE
                                    ? mem::LaneClass::kInteractive
                                    : mem::LaneClass::kBatch;
  spec.priority = priority;
  if (req.iterations() > 0) spec.declared_iterations = req.iterations();
  if (req.duration_seconds() > 0) spec.declared_duration = FromSeconds(req.duration_seconds());
  spec.iteration_time_hint = runtime->iteration_time_hint();
  if (req.admission_timeout_seconds() > 0) {
    spec.admission_timeout = FromSeconds(req.admission_timeout_seconds());
  }
  spec.device = pinned;
  if (resumed != nullptr) spec.iterations_done = resumed->iterations_done;
  entry->runtime = std::move(runtime);

  uint64_t id = 0;
  {
    MutexLock lock(&mu_);
    // Host memory, now that the compiled session's is known (Note [Host memory budget]).
    const Quotas& q = o_.quotas;
    if (q.host_bytes != 0 && HostBytesOf(owner.id) + entry->host_bytes > q.host_bytes) {
      return QuotaExceeded(
          "host_bytes", q.host_bytes,
          fmt::format("this session holds {} of host memory and the client {}",
                      FormatBytes(entry->host_bytes), FormatBytes(HostBytesOf(owner.id))));
    }
    const uint64_t limit = o_.limits.host_bytes;
    const uint64_t held = HostBytesOf(kAll) + compiling_host_bytes_;
    if (limit != 0 && held + entry->host_bytes > limit) {
      return ResourceExhaustedError(
          fmt::format("this session holds {} of host memory and the daemon's sessions {}: over "
                      "limits.host_bytes={}",
                      FormatBytes(entry->host_bytes), FormatBytes(held), FormatBytes(limit)));
    }
    if (resumed != nullptr && (resumed->id == 0 || (resumed->id & ~kSessionIdMask) != 0 ||
                               sessions_.count(resumed->id) != 0)) {
      return AlreadyExistsError(fmt::format("session {} cannot take its id again", resumed->id));
    }
    id = resumed != nullptr ? resumed->id : NewSessionId();
    // The allocation's budget, now that P and E are known (the registry's lock is a leaf).
    if (terms) {
      Status charged = o_.allocations->Reserve(
          terms->id, id, spec.requirement.persistent_bytes + spec.requirement.ephemeral_bytes);
      if (charged.code() == StatusCode::kNotFound) {
        return UnauthenticatedError("this client's allocation was revoked");
      }
      SALUS_RETURN_IF_ERROR(charged);
    }
    entry->id = id;
    sessions_[id] = entry;
    spec.requirement.job = JoinJob(owner.id, entry->job);
  }
  auto admitted = o_.executor->AddSession(id, spec);
  if (!admitted.ok()) {
    {
      MutexLock lock(&mu_);
      sessions_.erase(id);
      LeaveJob(owner.id, entry->job);
    }
    ReleaseCharge(*entry);
    return admitted.status();
  }
  if (terms && !o_.allocations->Holds(terms->id, id)) {
    // Revoked while this session was being added: the revoke's close may have missed it.
    Remove(id).IgnoreError();
    return UnauthenticatedError("this client's allocation was revoked");
  }
  v1::CreateSessionReply reply;
  reply.set_session_id(id);
  reply.set_state(*admitted ? v1::ADMITTED : v1::WAITING);
  reply.set_persistent_bytes(spec.requirement.persistent_bytes);
  reply.set_ephemeral_bytes(spec.requirement.ephemeral_bytes);
  if (*admitted) {
    auto info = o_.executor->engine().Session(id);
    if (info.ok()) reply.set_lane(info->lane);
    if (info.ok() && info->device) {
      reply.set_device(o_.executor->engine().device_name(*info->device));
    }
  }
  for (const auto& s : entry->runtime->input_specs()) *reply.add_inputs() = s;
  for (const auto& s : entry->runtime->output_specs()) *reply.add_outputs() = s;
  for (const auto& s : entry->runtime->state_specs()) *reply.add_state_tensors() = s;
  logging::Event("server", "session_created",
                 {{"session", id},
                  {"name", entry->name},
                  {"kind", entry->runtime->kind()},
                  {"latency_class", v1::LatencyClass_Name(entry->latency_class)},
                  {"allocation", entry->allocation},
                  {"job", entry->job},
                  {"persistent_bytes", spec.requirement.persistent_bytes},
                  {"ephemeral_bytes", spec.requirement.ephemeral_bytes},
                  {"admitted", *admitted},
                  {"restored", resumed != nullptr}});
  if (o_.metrics != nullptr) o_.metrics->SessionCreated(*admitted);
  return reply;
}

// Note [Host memory budget]
// A compiled session holds host memory outside the arena for as long as it lives, admitted or
// waiting: its model's constants (the initial state it writes into its persistent block), its
// graph and kernels (an estimate per node: exec::kHostBytesPerNode), where it may move
// between GPUs its model's bytes (SessionRuntime::host_bytes), and the CreateSession it came
// from, kept for a snapshot (Note [Restarts] in snapshot.cc). The sessions
// of all clients together may hold at most limits.host_bytes, one client's at most the
// host_bytes quota. A compilation in progress counts as the most it may hold (its model's bytes
// and limits.max_constant_bytes) from before it starts, so the budget holds before memory is
// touched; once compiled, the session counts what it holds.
StatusOr<std::unique_ptr<SessionRuntime>> SessionManager::BuildRuntime(
    const ClientRef& owner, const v1::CreateSession& req, std::optional<size_t> pinned) {
  switch (req.workload_case()) {
    case v1::CreateSession::kSynthetic: {
      SALUS_ASSIGN_OR_RETURN(auto synthetic,
                             SyntheticRuntime::Create(req.synthetic(), o_.host_accessible));
      return std::unique_ptr<SessionRuntime>(std::move(synthetic));
    }
    case v1::CreateSession::kModel:
      break;
    default:
      return InvalidArgumentError("CreateSession needs a model or a synthetic profile");
  }
  if (!o_.model_factory) return UnimplementedError("this server cannot run model sessions");
  // Compiled for its pin, or for the first device still in service (Note [Devices] in
  // sched/engine.cc: a lost device takes no sessions).
  const sched::Engine& engine = o_.executor->engine();
  std::optional<size_t> compile_for = pinned;
  for (size_t d = 0; !compile_for && d < engine.device_count(); ++d) {
    if (engine.DeviceLost(d).ok()) compile_for = d;
  }
  if (!compile_for) return engine.DeviceLost(0);
  SALUS_RETURN_IF_ERROR(engine.DeviceLost(*compile_for));
  const uint64_t reserved = req.model().ByteSizeLong() + o_.limits.max_constant_bytes;
  {
    MutexLock lock(&mu_);
    const uint64_t held = HostBytesOf(kAll) + compiling_host_bytes_;
    const uint64_t limit = o_.limits.host_bytes;
    if (limit != 0 && held + reserved > limit) {
      return ResourceExhaustedError(fmt::format(
          "compiling this model may take {} of host memory and the daemon's sessions and "
          "compilations hold {}: over limits.host_bytes={}",
          FormatBytes(reserved), FormatBytes(held), FormatBytes(limit)));
    }
    const uint64_t quota = o_.quotas.host_bytes;
    if (quota != 0 && HostBytesOf(owner.id) >= quota) {
      return QuotaExceeded("host_bytes", quota,
                           fmt::format("the client's sessions hold {} of host memory",
                                       FormatBytes(HostBytesOf(owner.id))));
    }
    compiling_host_bytes_ += reserved;
  }
  StatusOr<std::unique_ptr<SessionRuntime>> runtime = InternalError("not compiled");
  try {
    runtime = o_.model_factory(req.model(), *compile_for);
  } catch (const std::bad_alloc&) {
    // The budgets above are the mechanism; this is the last line behind them.
    runtime = ResourceExhaustedError("the host ran out of memory compiling this model");
  } catch (const std::length_error&) {
    runtime = ResourceExhaustedError("compiling this model asked for an impossible allocation");
  } catch (const std::exception& e) {
    // A library's own check (protobuf's index checks throw) that an importer failed to make
    // first: a bug of the engine's, answered as one, never the end of the daemon.
    logging::Get("server")->error("compiling a model threw: {}", e.what());
    runtime = InternalError(std::string("compiling this model failed: ") + e.what());
  }
  MutexLock lock(&mu_);
  compiling_host_bytes_ -= reserved;
  return runtime;
}

uint64_t SessionManager::HostBytesOf(uint64_t client) const {
  uint64_t bytes = 0;
  for (const auto& [id, e] : sessions_) {
    if (client == kAll || e->client == client) bytes += e->host_bytes;
  }
  return bytes;
}

uint64_t SessionManager::HostBytes() const {
  MutexLock lock(&mu_);
  return HostBytesOf(kAll) + compiling_host_bytes_;
}

void SessionManager::Run(Call call, const ClientRef& owner) {
  const uint64_t id = call.request().session_id();
  auto owned = Owned(owner, id);
  if (!owned.ok()) return call.ReplyError(owned.status());
  std::shared_ptr<Entry> entry = std::move(*owned);
  if (entry->runtime->kind() == "model") {
    // A session on a lost device is refused at once (its iterations would fail).
    const sched::Engine& engine = o_.executor->engine();
    if (auto info = engine.Session(id); info.ok() && info->device) {
      if (Status lost = engine.DeviceLost(*info->device); !lost.ok()) {
        return call.ReplyError(lost);
      }
    }
  }

  // Decode and check the feeds against their frames and buffers before anything is queued.
  const v1::RunIteration& body = call.request().run_iteration();
  if (entry->rewound_at && body.server_instance() != 0 && body.server_instance() != o_.instance &&
      !body.state_only()) {
    return call.ReplyError(Rewound(*entry->rewound_at));
  }
  const uint64_t client = owner.id;
  size_t framed = 0;
  for (const v1::TensorSpec& spec : body.feeds()) framed += spec.has_buffer() ? 0 : 1;
  if (framed != call.frames().size()) {
    return call.ReplyError(InvalidArgumentError(fmt::format(
        "RunIteration lists {} feeds without a shared buffer but carries {} tensor frames", framed,
        call.frames().size())));
  }
  auto state = std::make_shared<Call>(std::move(call));
  std::vector<HostTensor> feeds;
  std::vector<std::shared_ptr<SharedBuffer>> buffers;  // distinct, kept alive by the work
  size_t next_frame = 0;
  for (const v1::TensorSpec& spec : body.feeds()) {
    if (!spec.has_buffer()) {
      zmq::message_t& frame = state->frames()[next_frame++];
      if (Status s = CheckFrame(spec, frame.size()); !s.ok()) return state->ReplyError(s);
      feeds.push_back(HostTensor{spec, static_cast<const std::byte*>(frame.data()), frame.size()});
      continue;
    }
    auto slice = ResolveSlice(client, spec, &buffers);
    if (!slice.ok()) return state->ReplyError(slice.status());
    feeds.push_back(*slice);
  }
  std::vector<std::string> fetches(body.fetches().begin(), body.fetches().end());
  // A state-only request is queued and ordered with the session's iterations (so it never
  // races a step) but is not one of them (Engine::Complete's `counted`).
  const bool state_only = body.state_only();
  if (Status s = entry->runtime->Validate(feeds, fetches, state_only); !s.ok()) {
    return state->ReplyError(s);
  }

  auto outputs = std::make_shared<IterationOutputs>();
  // Note [Replies before the end]: the reply goes as soon as the fetches are ready; `replied`
  // tells `work` and `done` that it went.
  auto replied = std::make_shared<bool>(false);
  const bool early = body.reply_when_fetched() && !state_only;
  auto run = [this, entry, feeds, fetches, state_only, outputs, buffers](const sched::Dispatch& d) {
    if (buffers.empty()) {
      Status s = entry->runtime->Run(d, feeds, fetches, state_only, outputs.get());
      return s.ok() ? s : CheckDevice(s, d.device);
    }
    for (const auto& b : buffers) SALUS_RETURN_IF_ERROR(b->CheckIntact());
    Status s;
    {
      SharedReadScope guard(buffers);
      s = entry->runtime->Run(d, feeds, fetches, state_only, outputs.get());
    }
    if (!s.ok()) s = CheckDevice(s, d.device);
    for (const auto& b : buffers) {
      if (b->faulted()) {
        return DataLossError(
            fmt::format("shared buffer '{}' was truncated by its owner while the iteration read it",
                        b->name()));
      }
    }
    return s;
  };
  const Clock* clock = &o_.executor->engine().clock();
  auto work = [entry, state, outputs, early, replied, clock,
               run = std::move(run)](const sched::Dispatch& d) {
    {
      MutexLock lock(&entry->late_mu);
      if (!entry->restore_error.ok()) return entry->restore_error;
      if (!entry->late_error.ok()) return std::exchange(entry->late_error, OkStatus());
    }
    if (early) {
      // (`out`, not `outputs`: the callback lives in *outputs; `done` drops it)
      outputs->ready = [state, out = outputs.get(), replied, d, clock] {
        *replied = true;
        sched::IterationRecord r;  // as the engine's, up to now
        r.iteration = d.iteration;
        r.lane = d.lane;
        r.queue_delay = d.started_at - d.requested_at;
        r.run_time = clock->Now() - d.started_at;
        r.switch_gap = d.switch_gap;
        ReplyIteration(*state, *out, r, /*early=*/true);
      };
    }
    Status s;
    try {
      s = run(d);
    } catch (const std::bad_alloc&) {
      // Iterations allocate only what their plans say; this is the last line behind that.
      s = ResourceExhaustedError("the host ran out of memory during this iteration");
    } catch (const std::exception& e) {
      logging::Get("server")->error("an iteration threw: {}", e.what());
      s = InternalError(std::string("the iteration failed: ") + e.what());
    }
    if (*replied && !s.ok()) {
      // Kept before the engine completes the iteration, so no later request of the session
      // can start before it is there.
      MutexLock lock(&entry->late_mu);
      entry->late_error =
          Status(s.code(), fmt::format("iteration {} failed after its fetches were replied: {}",
                                       d.iteration, s.message()));
    }
    return s;
  };
  Metrics* metrics = o_.metrics;
  AllocationRegistry* allocations = entry->allocation.empty() ? nullptr : o_.allocations;
  const std::function<void()>* iteration_done = o_.iteration_done ? &o_.iteration_done : nullptr;
  auto done = [state, outputs, metrics, state_only, allocations, entry, replied, iteration_done](
                  const Status& status, const sched::IterationRecord& r) {
    outputs->ready = nullptr;  // (not called: a GPU, a state fetch, a failure before it)
    if (iteration_done != nullptr && status.ok() && !state_only) (*iteration_done)();
    if (metrics != nullptr && status.ok() && !state_only) metrics->IterationDone(r);
    if (allocations != nullptr && status.ok() && !state_only) {
      allocations->IterationDone(entry->allocation);
    }
    if (*replied) return;  // (an error after the reply was kept for the next request)
    if (!status.ok()) return state->ReplyError(status);
    ReplyIteration(*state, *outputs, r, /*early=*/false);
  };
  if (Status s = o_.executor->Submit(id, work, done, /*counted=*/!state_only); !s.ok()) {
    state->ReplyError(s);
  }
}

StatusOr<HostTensor> SessionManager::ResolveSlice(
    uint64_t client, const v1::TensorSpec& spec,
    std::vector<std::shared_ptr<SharedBuffer>>* buffers) {
  const uint64_t id = spec.buffer().buffer_id();
  std::shared_ptr<SharedBuffer> buffer;
  {
    MutexLock lock(&mu_);
    auto c = buffers_.find(client);
    if (c != buffers_.end()) {
      auto b = c->second.find(id);
      if (b != c->second.end()) buffer = b->second;
    }
  }
  if (!buffer) {
    return NotFoundError(fmt::format("feed '{}': shared buffer {} is not registered by this client",
                                     spec.name(), id));
  }
  if (buffer->faulted()) return buffer->CheckIntact();
  SALUS_ASSIGN_OR_RETURN(const uint64_t bytes, TensorBytes(spec));
  const uint64_t offset = spec.buffer().offset();
  if (offset > buffer->size() || bytes > buffer->size() - offset) {
    return InvalidArgumentError(
        fmt::format("feed '{}': {} bytes at offset {} run past the end of shared buffer {} ({} "
                    "bytes)",
                    spec.name(), bytes, offset, id, buffer->size()));
  }
  if (std::find(buffers->begin(), buffers->end(), buffer) == buffers->end()) {
    if (buffers->size() == SharedReadScope::kMaxBuffers) {
      return InvalidArgumentError(fmt::format("an iteration may read at most {} shared buffers",
                                              SharedReadScope::kMaxBuffers));
    }
    buffers->push_back(buffer);
  }
  HostTensor t;
  t.spec = spec;
  t.spec.clear_buffer();
  t.data = buffer->data() + offset;
  t.bytes = bytes;
  return t;
}

StatusOr<uint64_t> SessionManager::RegisterBuffer(const ClientRef& owner,
                                                  const v1::RegisterBuffer& req,
                                                  std::optional<uid_t> caller_uid) {
  if (!caller_uid) {
    return FailedPreconditionError(
        "shared buffers need the daemon's ipc endpoint: over TCP the daemon cannot tell which "
        "Unix user owns the object (send the feeds in frames, or connect over ipc)");
  }
  const uint64_t limit = o_.quotas.shared_buffers;
  const uint64_t byte_quota = o_.quotas.shared_buffer_bytes;
  const uint64_t byte_limit = o_.limits.shared_buffer_bytes;
  // The client's and the daemon's mapped bytes are checked before anything is opened, and
  // again once it is (another registration may have come first).
  auto refuse = [&]() REQUIRES(mu_) -> Status {
    auto c = buffers_.find(owner.id);
    const size_t count = c == buffers_.end() ? 0 : c->second.size();
    uint64_t mine = 0;
    if (c != buffers_.end()) {
      for (const auto& [id, b] : c->second) mine += b->size();
    }
    if (limit != 0 && count >= limit) {
      return QuotaExceeded("shared_buffers", limit, "unregister one first");
    }
    if (byte_quota != 0 && (req.bytes() > byte_quota || mine > byte_quota - req.bytes())) {
      return QuotaExceeded("shared_buffer_bytes", byte_quota,
                           fmt::format("the client maps {} and asks for {} more", FormatBytes(mine),
                                       FormatBytes(req.bytes())));
    }
    if (byte_limit != 0 && (req.bytes() > byte_limit || mapped_bytes_ > byte_limit - req.bytes())) {
      return ResourceExhaustedError(fmt::format(
          "the daemon maps {} of shared buffers; {} more would pass limits.shared_buffer_bytes={}",
          FormatBytes(mapped_bytes_), FormatBytes(req.bytes()), FormatBytes(byte_limit)));
    }
    return OkStatus();
  };
  if (req.bytes() > o_.limits.max_shared_buffer_bytes) {
    return ResourceExhaustedError(fmt::format(
        "shared buffer '{}' of {} bytes is larger than limits.max_shared_buffer_bytes={}",
        req.shm_name().substr(0, SharedBuffer::kMaxNameLength), req.bytes(),
        o_.limits.max_shared_buffer_bytes));
  }
  {
    MutexLock lock(&mu_);
    SALUS_RETURN_IF_ERROR(refuse());
  }
  SALUS_ASSIGN_OR_RETURN(auto buffer, SharedBuffer::Open(req.shm_name(), req.bytes(), *caller_uid,
                                                         o_.limits.max_shared_buffer_bytes));
  MutexLock lock(&mu_);
  SALUS_RETURN_IF_ERROR(refuse());
  const uint64_t id = next_buffer_id_++;
  mapped_bytes_ += buffer->size();
  buffers_[owner.id].emplace(id, std::move(buffer));
  return id;
}

Status SessionManager::UnregisterBuffer(const ClientRef& owner, uint64_t buffer_id) {
  std::shared_ptr<SharedBuffer> dropped;  // unmapped outside the lock (or after its iterations)
  MutexLock lock(&mu_);
  auto c = buffers_.find(owner.id);
  if (c == buffers_.end() || c->second.count(buffer_id) == 0) {
    return NotFoundError(
        fmt::format("shared buffer {} is not registered by this client", buffer_id));
  }
  dropped = std::move(c->second[buffer_id]);
  c->second.erase(buffer_id);
  SALUS_DCHECK(mapped_bytes_ >= dropped->size(), "shared buffer bytes underflow");
  mapped_bytes_ -= dropped->size();
  return OkStatus();
}

size_t SessionManager::BufferCount() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, c] : buffers_) n += c.size();
  return n;
}

Status SessionManager::Close(const ClientRef& owner, uint64_t id, bool any_owner) {
  const bool theirs = !Owned(owner, id).ok();
  if (theirs && !any_owner) return NoSuchSession(id);
  SALUS_RETURN_IF_ERROR(Remove(id));
  if (theirs) {
    logging::Event("server", "session_closed_by_admin", {{"session", id}, {"by", owner.name}});
  }
  return OkStatus();
}

Status SessionManager::Remove(uint64_t id) {
  std::shared_ptr<Entry> entry;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return NoSuchSession(id);  // closed meanwhile by another path
    entry = it->second;
    sessions_.erase(it);
    LeaveJob(entry->client, entry->job);
  }
  Status s = o_.executor->RemoveSession(id);
  if (s.code() == StatusCode::kNotFound) {
    // The engine dropped it first: its admission just failed (OnAdmissionFailed is on its
    // way). It is gone, as it would be a moment later: the same answer as then.
    return NotFoundError(fmt::format("session {} does not exist (its admission failed)", id));
  }
  ReleaseCharge(*entry);
  logging::Event("server", "session_closed", {{"session", id}, {"name", entry->name}});
  if (o_.metrics != nullptr) o_.metrics->SessionClosed();
  return s;
}

uint64_t SessionManager::JoinJob(uint64_t client, const std::string& name) {
  if (name.empty()) return 0;
  Job& job = jobs_[{client, name}];
  if (job.id == 0) job.id = next_job_++;
  ++job.sessions;
  return job.id;
}

void SessionManager::LeaveJob(uint64_t client, const std::string& name) {
  if (name.empty()) return;
  const auto it = jobs_.find({client, name});
  SALUS_DCHECK(it != jobs_.end() && it->second.sessions > 0, "a session left a job it was not in");
  if (it == jobs_.end()) return;
  if (--it->second.sessions == 0) jobs_.erase(it);
}

void SessionManager::ReleaseCharge(const Entry& entry) {
  if (!entry.allocation.empty() && o_.allocations != nullptr) {
    o_.allocations->Release(entry.allocation, entry.id);
  }
}

size_t SessionManager::CloseClient(uint64_t client, std::string_view event) {
  std::vector<uint64_t> ids = SessionsOf(client);
  std::map<uint64_t, std::shared_ptr<SharedBuffer>> dropped;  // unmapped outside the lock
  {
    MutexLock lock(&mu_);
    if (auto c = buffers_.find(client); c != buffers_.end()) {
      dropped = std::move(c->second);
      buffers_.erase(c);
      for (const auto& [id, b] : dropped) {
        SALUS_DCHECK(mapped_bytes_ >= b->size(), "shared buffer bytes underflow");
        mapped_bytes_ -= b->size();
      }
    }
  }
  for (uint64_t id : ids) {
    logging::Event("server", event, {{"session", id}});
    Remove(id).IgnoreError();  // closed by its owner meanwhile is fine
  }
  return ids.size();
}

void SessionManager::CloseAll() {
  std::vector<uint64_t> ids;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, e] : sessions_) ids.push_back(id);
  }
  for (uint64_t id : ids) Remove(id).IgnoreError();
}

std::vector<SessionManager::SavedSession> SessionManager::Save(Nanos timeout,
                                                               std::vector<std::string>* skipped) {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, e] : sessions_) entries.push_back(e);
  }
  const sched::Engine& engine = o_.executor->engine();
  // Sessions resident now first, so that a restore admits them before those that waited.
  std::stable_partition(entries.begin(), entries.end(), [&](const auto& e) {
    auto info = engine.Session(e->id);
    return info.ok() && info->state != sched::SessionState::kWaiting;
  });
  struct Read {
    Mutex mu;
    CondVar cv;
    size_t pending GUARDED_BY(mu) = 0;
  };
  auto read = std::make_shared<Read>();
  struct One {
    std::shared_ptr<Entry> entry;
    std::vector<std::string> names;
    std::shared_ptr<IterationOutputs> outputs = std::make_shared<IterationOutputs>();
    // How its read ended (under Read::mu); none while it has not.
    std::shared_ptr<std::optional<Status>> result = std::make_shared<std::optional<Status>>();
    std::string why_not;  // set: left out
  };
  std::vector<One> ones;
  for (const auto& e : entries) {
    One one;
    one.entry = e;
    auto info = engine.Session(e->id);
    if (!info.ok()) continue;  // closed meanwhile
    if (info->state == sched::SessionState::kWaiting && info->iterations_done > 0) {
      one.why_not = "it ran before but waits for the device now";
    } else if (info->state != sched::SessionState::kWaiting) {
      for (const v1::TensorSpec& t : e->runtime->state_specs()) one.names.push_back(t.name());
    }
    if (one.why_not.empty() && !one.names.empty()) {
      {
        MutexLock lock(&read->mu);
        ++read->pending;
      }
      auto work = [entry = e, names = one.names, outputs = one.outputs](const sched::Dispatch& d) {
        return entry->runtime->Run(d, {}, names, /*state_only=*/true, outputs.get());
      };
      auto done = [read, result = one.result](const Status& st, const sched::IterationRecord&) {
        MutexLock lock(&read->mu);
        *result = st;
        --read->pending;
        read->cv.NotifyAll();
      };
      if (Status st = o_.executor->Submit(e->id, work, done, /*counted=*/false); !st.ok()) {
        MutexLock lock(&read->mu);
        --read->pending;
        one.why_not = st.message();
      }
    }
    ones.push_back(std::move(one));
  }
  {
    MutexLock lock(&read->mu);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (read->pending > 0 && std::chrono::steady_clock::now() < deadline) {
      read->cv.WaitFor(&read->mu, std::chrono::milliseconds(100));
    }
    // Those still unread are left out (their reads hold only shared pointers).
    for (One& one : ones) {
      if (one.names.empty() || !one.why_not.empty()) continue;
      if (!one.result->has_value()) {
        one.why_not = "its state was not read in time";
      } else if (!(*one.result)->ok()) {
        one.why_not = (*one.result)->message();
      }
    }
  }
  std::vector<SavedSession> saved;
  for (One& one : ones) {
    const Entry& e = *one.entry;
    if (!one.why_not.empty()) {
      skipped->push_back(fmt::format("session {} ({}): {}", e.id, e.name, one.why_not));
      continue;
    }
    SavedSession s;
    s.session.set_session_id(e.id);
    s.session.set_client(e.client);
    *s.session.mutable_create() = *e.create;
    auto info = engine.Session(e.id);
    s.session.set_iterations_done(info.ok() ? info->iterations_done : 0);
    for (size_t i = 0; i < one.outputs->specs.size(); ++i) {
      *s.session.add_state() = one.outputs->specs[i];
      s.state += one.outputs->data[i];
    }
    saved.push_back(std::move(s));
  }
  return saved;
}

Status SessionManager::Restore(const ClientRef& owner, const v1::SnapshotSession& saved,
                               std::string state, bool complete) {
  const Resumed resumed{saved.session_id(), saved.iterations_done()};
  SALUS_ASSIGN_OR_RETURN(v1::CreateSessionReply created, Add(owner, saved.create(), &resumed));
  std::shared_ptr<Entry> entry;
  {
    MutexLock lock(&mu_);
    entry = sessions_.at(created.session_id());
  }
  if (!complete) entry->rewound_at = saved.iterations_done();
  if (saved.state().empty()) return OkStatus();
  // The feeds point into `bytes`, which the queued write keeps alive.
  auto bytes = std::make_shared<const std::string>(std::move(state));
  std::vector<HostTensor> feeds;
  size_t offset = 0;
  for (const v1::TensorSpec& spec : saved.state()) {
    SALUS_ASSIGN_OR_RETURN(const uint64_t n, TensorBytes(spec));
    feeds.push_back(HostTensor{spec, reinterpret_cast<const std::byte*>(bytes->data()) + offset,
                               static_cast<size_t>(n)});
    offset += n;
  }
  Status valid = offset == bytes->size()
                     ? entry->runtime->Validate(feeds, {}, /*state_only=*/true)
                     : DataLossError("its state values do not add up to its state's bytes");
  if (valid.ok()) {
    auto work = [entry, feeds, bytes](const sched::Dispatch& d) {
      IterationOutputs unused;
      return entry->runtime->Run(d, feeds, {}, /*state_only=*/true, &unused);
    };
    auto done = [entry](const Status& st, const sched::IterationRecord&) {
      if (st.ok()) return;
      MutexLock lock(&entry->late_mu);
      entry->restore_error = DataLossError(
          fmt::format("session {}: its state could not be restored: {}", entry->id, st.message()));
      logging::Get("server")->error("{}", entry->restore_error.message());
    };
    valid = o_.executor->Submit(entry->id, work, done, /*counted=*/false);
  }
  if (!valid.ok()) {
    Remove(entry->id).IgnoreError();
    return valid;
  }
  return OkStatus();
}

std::vector<uint64_t> SessionManager::SessionsOf(uint64_t client) const {
  std::vector<uint64_t> ids;
  MutexLock lock(&mu_);
  for (const auto& [id, e] : sessions_) {
    if (e->client == client) ids.push_back(id);
  }
  return ids;
}

namespace {

v1::SessionState WireState(sched::SessionState s) {
  switch (s) {
    case sched::SessionState::kWaiting:
      return v1::WAITING;
    case sched::SessionState::kAdmitted:
    case sched::SessionState::kRunning:
      return v1::ADMITTED;
    case sched::SessionState::kPagedOut:
      return v1::PAGED_OUT;
    case sched::SessionState::kClosing:
      return v1::CLOSING;
  }
  return v1::SESSION_STATE_UNSPECIFIED;
}

}  // namespace

v1::ListSessionsReply SessionManager::List(const ClientRef* viewer) const {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, e] : sessions_) entries.push_back(e);
  }
  v1::ListSessionsReply out;
  v1::OtherSessions* others = out.mutable_others();
  for (const auto& e : entries) {
    auto s = o_.executor->engine().Session(e->id);
    const bool admitted = s.ok() && s->state != sched::SessionState::kWaiting;
    if (viewer != nullptr && e->client != viewer->id) {
      others->set_sessions(others->sessions() + 1);
      others->set_waiting(others->waiting() + (s.ok() && !admitted ? 1 : 0));
      others->set_admitted(others->admitted() + (admitted ? 1 : 0));
      others->set_persistent_bytes(others->persistent_bytes() +
                                   e->runtime->requirement().persistent_bytes);
      others->set_ephemeral_bytes(others->ephemeral_bytes() +
                                  e->runtime->requirement().ephemeral_bytes);
      continue;
    }
    v1::SessionInfo info;
    info.set_session_id(e->id);
    info.set_name(e->name);
    info.set_kind(std::string(e->runtime->kind()));
    info.set_priority(e->priority);
    info.set_latency_class(e->latency_class);
    info.set_persistent_bytes(e->runtime->requirement().persistent_bytes);
    info.set_ephemeral_bytes(e->runtime->requirement().ephemeral_bytes);
    info.set_iterations_declared(e->iterations_declared);
    info.set_client_id(e->client_name);
    info.set_allocation(e->allocation);
    info.set_job(e->job);
    if (s.ok()) {
      info.set_state(WireState(s->state));
      if (s->ephemeral_bytes > 0) info.set_ephemeral_bytes(s->ephemeral_bytes);
      info.set_state_reason(s->reason);
      info.set_page_outs(s->page_outs);
      info.set_lane(s->lane);
      if (s->device) info.set_device(o_.executor->engine().device_name(*s->device));
      info.set_migrations(s->migrations);
      info.set_iterations_done(s->iterations_done);
      info.set_avg_iteration_seconds(s->avg_iteration_seconds);
    } else {
      info.set_state(v1::CLOSING);
    }
    *out.add_sessions() = std::move(info);
  }
  return out;
}

size_t SessionManager::Count() const {
  MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionManager::OnAdmitted(uint64_t session, uint64_t lane) {
  logging::Event("server", "session_admitted", {{"session", session}, {"lane", lane}});
  if (o_.metrics != nullptr) o_.metrics->SessionAdmittedFromQueue();
}

void SessionManager::OnAdmissionFailed(uint64_t session, const Status& status) {
  // The engine dropped it; its queued iterations were answered with `status` already.
  std::shared_ptr<Entry> entry;
  {
    MutexLock lock(&mu_);
    if (auto it = sessions_.find(session); it != sessions_.end()) {
      entry = std::move(it->second);
      sessions_.erase(it);
      LeaveJob(entry->client, entry->job);
    }
  }
  if (entry) ReleaseCharge(*entry);
  logging::Event("server", "admission_failed",
                 {{"session", session}, {"status", status.ToString()}});
}

Status SessionManager::CheckDevice(const Status& iteration, size_t device) {
  if (!o_.device_health) return iteration;
  sched::Engine& engine = o_.executor->engine();
  if (Status lost = engine.DeviceLost(device); !lost.ok()) return lost;
  Status health = o_.device_health(device);
  if (health.ok()) return iteration;
  if (engine.DeviceLost(device).ok()) {
    logging::Event("server", "device_lost",
                   {{"device", engine.device_name(device)},
                    {"status", health.ToString()},
                    {"iteration", iteration.ToString()}});
  }
  engine.SetDeviceLost(device, health).IgnoreError();
  return Status(health.code(),
                health.message() + "; the failing iteration: " + iteration.ToString());
}

}  // namespace salus::server
