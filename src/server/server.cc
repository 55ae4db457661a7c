#include "server/server.h"

#include <fmt/format.h>
#include <google/protobuf/stubs/logging.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <set>

#include "common/endpoints.h"
#include "common/logging.h"
#include "common/thread_priority.h"
#include "common/units.h"
#include "device/cuda_query.h"
#include "server/snapshot.h"

namespace salus::server {
namespace {

constexpr uint64_t kDefaultCpuArenaBytes = 8 * kGiB;
constexpr uint64_t kCudaReserveBytes = 512 * kMiB;
constexpr int kMaxCpuDevices = 64;
constexpr auto kHousekeepingPeriod = std::chrono::milliseconds(100);
// A housekeeping pass this much later than the last means the daemon stood still.
constexpr Nanos kStallGap = std::chrono::seconds(1);
// Requests held back by the pacer in all, as a multiple of what one key may hold.
constexpr uint64_t kPacedKeysInAll = 16;
// The largest envelope of a request that is not work (everything but CreateSession,
// RunIteration and RegisterBuffer): such requests are small, and are held (paced) as such.
constexpr size_t kMaxControlEnvelopeBytes = 16 * 1024;

// The memory-map or stats JSON of the whole arena, cut down to what one client may see:
// entries of its own sessions in full, the others' summed into `others` ({sessions, bytes}).
nlohmann::json OwnSessionsOnly(const nlohmann::json& sessions, const std::set<uint64_t>& own,
                               const char* id_key, const char* bytes_key, nlohmann::json* others) {
  nlohmann::json kept = nlohmann::json::array();
  uint64_t count = 0, bytes = 0;
  for (const auto& s : sessions) {
    const auto& id = s.at(id_key);
    if (id.is_number_unsigned() && own.count(id.get<uint64_t>()) == 0) {
      ++count;
      bytes += s.value(bytes_key, uint64_t{0});
    } else {
      kept.push_back(s);
    }
  }
  *others = {{"sessions", count}, {"bytes", bytes}};
  return kept;
}

// Note [Request classes]
// Each request kind belongs to one class, decided once before any handler runs:
// - open: Hello and Heartbeat; anyone may send them (a Heartbeat with a live token renews it).
// - work: CreateSession, RunIteration, RegisterBuffer. They need a client, count against its
//   requests-in-flight quota, and are refused (UNAVAILABLE) while the daemon drains.
// - control: CloseSession, UnregisterBuffer. They need a client and act on its own things only;
//   they are served while draining (a client tidying up is not new work).
// - view: ListSessions, GetStats, GetMemoryMap. Anyone may ask; what they see depends on who
//   asks (a client sees its own sessions and the others' totals, an administrator everything).
// - admin: Drain, GrantAllocation, RevokeAllocation, ListAllocations, MoveSession. Only the
//   administrator role (PERMISSION_DENIED otherwise). A request carrying the token of an
//   allocation's client never has that role, whoever sent it (Note [Allocations] in
//   allocation_registry.cc).
enum class RequestClass { kOpen, kWork, kControl, kView, kAdmin, kUnknown };

RequestClass Classify(v1::Request::BodyCase body) {
  switch (body) {
    case v1::Request::kHello:
    case v1::Request::kHeartbeat:
      return RequestClass::kOpen;
    case v1::Request::kCreateSession:
    case v1::Request::kRunIteration:
    case v1::Request::kRegisterBuffer:
      return RequestClass::kWork;
    case v1::Request::kCloseSession:
    case v1::Request::kUnregisterBuffer:
      return RequestClass::kControl;
    case v1::Request::kListSessions:
    case v1::Request::kGetStats:
    case v1::Request::kGetMemoryMap:
      return RequestClass::kView;
    case v1::Request::kDrain:
    case v1::Request::kGrantAllocation:
    case v1::Request::kRevokeAllocation:
    case v1::Request::kMoveSession:
    case v1::Request::kListAllocations:
      return RequestClass::kAdmin;
    case v1::Request::BODY_NOT_SET:
      break;
  }
  return RequestClass::kUnknown;
}

// One counter family in Prometheus text: its HELP and TYPE lines, then a line per value,
// labelled `label`="<key>" (the bare name when `label` is empty).
std::string CounterFamily(std::string_view name, std::string_view help, std::string_view label,
                          std::initializer_list<std::pair<std::string_view, double>> values) {
  std::string out = fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n", name, help);
  for (const auto& [key, value] : values) {
    if (label.empty()) {
      out += fmt::format("{} {}\n", name, value);
    } else {
      out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, key, value);
    }
  }
  return out;
}

// The caller's Unix user, where the transport knows it: "uid:<N>" over ipc (Note [Principals]).
std::optional<uid_t> CallerUid(const std::string& transport) {
  if (transport.rfind("uid:", 0) != 0) return std::nullopt;
  uint64_t uid = 0;
  const char* first = transport.data() + 4;
  const char* last = transport.data() + transport.size();
  const auto [ptr, ec] = std::from_chars(first, last, uid);
  if (ec != std::errc() || ptr != last || uid > UINT32_MAX) return std::nullopt;
  return static_cast<uid_t>(uid);
}

}  // namespace

std::vector<std::string> DefaultEndpoints() {
  return {DefaultIpcEndpoint(), fmt::format("tcp://127.0.0.1:{}", kDefaultTcpPort)};
}

void RouteProtobufLogs() {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
        auto log = logging::Get("protobuf");
        if (level == google::protobuf::LOGLEVEL_FATAL) {
          log->critical("{}:{}: {}", file, line, message);
        } else {
          log->debug("{}:{}: {}", file, line, message);
        }
      });
}

StatusOr<std::vector<std::string>> DeviceNames(const std::string& device) {
  std::vector<std::string> names;
  auto add = [&](std::string name) -> Status {
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      return InvalidArgumentError(fmt::format("device '{}' is named twice in '{}'", name, device));
    }
    names.push_back(std::move(name));
    return OkStatus();
  };
  size_t start = 0;
  while (true) {
    const size_t comma = device.find(',', start);
    const std::string item = device.substr(start, comma - start);
    if (item == "cpu" || item == "cuda") {
      SALUS_RETURN_IF_ERROR(add(item));
    } else if (item.rfind("cpu:", 0) == 0) {
      const char* first = item.data() + 4;
      const char* last = item.data() + item.size();
      int n = 0;
      const auto [ptr, ec] = std::from_chars(first, last, n);
      if (ec != std::errc() || ptr != last || n < 1 || n > kMaxCpuDevices) {
        return InvalidArgumentError(
            fmt::format("device '{}': expected cpu:N with N the number of CPU devices, 1 to {}",
                        item, kMaxCpuDevices));
      }
      for (int i = 0; i < n; ++i) SALUS_RETURN_IF_ERROR(add(fmt::format("cpu:{}", i)));
    } else if (item == "cuda:all") {
      const device::CudaAvailability cuda = device::QueryCuda();
      if (cuda.devices.empty()) {
        return FailedPreconditionError(
            fmt::format("device 'cuda:all': no GPU is available: {}",
                        cuda.reason.empty() ? "none found" : cuda.reason));
      }
      for (const auto& d : cuda.devices)
        SALUS_RETURN_IF_ERROR(add(fmt::format("cuda:{}", d.ordinal)));
    } else if (exec::ParseDevice(item).ok()) {
      SALUS_RETURN_IF_ERROR(add(item));
    } else {
      return InvalidArgumentError(fmt::format(
          "unknown device '{}' (expected cpu, cpu:N, cuda, cuda:N, cuda:all, or a comma list)",
          item));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const bool any_cpu = std::any_of(names.begin(), names.end(),
                                   [](const std::string& n) { return n.rfind("cpu", 0) == 0; });
  if (any_cpu && names.size() > 1 &&
      std::any_of(names.begin(), names.end(),
                  [](const std::string& n) { return n.rfind("cuda", 0) == 0; })) {
    return InvalidArgumentError(
        fmt::format("device '{}': a daemon runs CPU devices or GPUs, not both", device));
  }
  return names;
}

std::string KernelDevice(const std::string& device) {
  return device.rfind("cpu", 0) == 0 ? "cpu" : device;
}

uint64_t Server::ReservedBytes() const {
  uint64_t bytes = 0;
  for (const exec::DeviceRuntime* rt : runtimes_) bytes += rt != nullptr ? rt->reserved_bytes() : 0;
  return bytes;
}

StatusOr<uint64_t> DefaultMemory(const std::string& device) {
  if (device.rfind("cpu", 0) == 0) return kDefaultCpuArenaBytes;
  if (device.rfind("cuda", 0) == 0) {
    const device::CudaAvailability cuda = device::QueryCuda();
    int ordinal = 0;
    if (device.size() > 5) ordinal = std::atoi(device.c_str() + 5);
    for (const auto& d : cuda.devices) {
      if (d.ordinal == ordinal) {
        if (d.free_bytes <= kCudaReserveBytes) {
          return ResourceExhaustedError(
              fmt::format("{} has only {} free", device, FormatBytes(d.free_bytes)));
        }
        return d.free_bytes - kCudaReserveBytes;
      }
    }
    return FailedPreconditionError(
        fmt::format("device '{}' is not available: {}", device,
                    cuda.reason.empty() ? "no such ordinal" : cuda.reason));
  }
  return InvalidArgumentError(fmt::format("unknown device '{}' (expected cpu or cuda:N)", device));
}

StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  SALUS_ASSIGN_OR_RETURN(std::vector<std::string> devices, DeviceNames(options.device));
  // A GPU daemon brings up the engine's device runtime of each GPU first: the CUDA context and
  // the first lane context (stream, cuDNN and cuBLAS handles) take device memory outside the
  // arena, so the default arena is sized from what is free after them (Note [Device
  // contexts]). Each GPU's arena is its own free memory unless --memory gives one size for all.
  std::vector<exec::DeviceRuntime*> runtimes(devices.size(), nullptr);  // by device; null: CPU
  std::vector<uint64_t> capacities;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (auto d = exec::ParseDevice(devices[i]); d.ok() && d->type == exec::DeviceType::kCuda) {
      SALUS_ASSIGN_OR_RETURN(runtimes[i], exec::DeviceRuntime::For(*d));
      SALUS_RETURN_IF_ERROR(runtimes[i]->ThreadContext().status().WithContext(devices[i]));
    }
  }
  for (const std::string& name : devices) {
    uint64_t capacity = options.memory;
    if (capacity == 0) {
      SALUS_ASSIGN_OR_RETURN(capacity, DefaultMemory(name));
    }
    capacities.push_back(capacity);
  }
  if (options.memory == 0) options.memory = capacities.front();
  if (options.listen.empty()) options.listen = DefaultEndpoints();
  if (options.lease <= Nanos(0)) return InvalidArgumentError("the client lease must be positive");
  // Note [Principals] (rpc_frontend.cc): what may be reached from elsewhere speaks CURVE.
  const SecurityOptions& sec = options.security;
  std::vector<Listener> listeners;
  for (const std::string& ep : options.listen) listeners.push_back({ep, !IsLocalEndpoint(ep)});
  for (const std::string& ep : sec.listen_remote) listeners.push_back({ep, true});
  for (const Listener& l : listeners) {
    if (!l.curve) continue;
    if (sec.curve_secret_key.empty()) {
      return FailedPreconditionError(fmt::format(
          "'{}' can be reached from other hosts, so it needs CURVE encryption: generate a key "
          "pair with `salusctl keygen /etc/salus/server`, and set security.curve.secret_key_file "
          "and either security.curve.client_keys_file (the clients' public keys) or "
          "security.curve.open in the config (docs/operations.md, Security)",
          l.endpoint));
    }
    if (sec.client_keys.empty() && sec.admin_keys.empty() && !sec.open) {
      return FailedPreconditionError(fmt::format(
          "no client could connect to '{}': list client keys in security.curve.client_keys "
          "(or client_keys_file, or admin_keys), or set security.curve.open to accept any key",
          l.endpoint));
    }
  }
  CurveServer curve{sec.curve_secret_key, sec.client_keys, sec.open};
  curve.allowed.insert(curve.allowed.end(), sec.admin_keys.begin(), sec.admin_keys.end());
  std::unique_ptr<Server> s(new Server(std::move(options)));
  s->runtimes_ = runtimes;
  SALUS_ASSIGN_OR_RETURN(auto policy, sched::CreatePolicy(s->o_.policy, s->o_.policy_options));
  std::vector<sched::DeviceSpec> specs;
  for (size_t d = 0; d < devices.size(); ++d) {
    SALUS_ASSIGN_OR_RETURN(auto provider, device::CreateMemoryProvider(KernelDevice(devices[d])));
    specs.push_back({devices[d], provider.get(), capacities[d], s->o_.overcommit});
    s->providers_.push_back(std::move(provider));
  }
  s->device_names_ = devices;

  Server* self = s.get();
  sched::Engine::Options eo;
  eo.clock = SteadyClock::Get();
  SALUS_ASSIGN_OR_RETURN(eo.devices, sched::MakeDevices(*policy, eo.clock, specs));
  for (const sched::EngineDevice& d : eo.devices) s->memory_.push_back(d.memory.get());
  eo.policy = std::move(policy);
  eo.paging_quantum = s->o_.paging_quantum;
  eo.on_admitted = [self](uint64_t id, uint64_t lane) { self->sessions_->OnAdmitted(id, lane); };
  eo.on_admission_failed = [self](uint64_t id, const Status& st) {
    self->sessions_->OnAdmissionFailed(id, st);
  };
  SALUS_ASSIGN_OR_RETURN(s->executor_, sched::Executor::Create(std::move(eo)));

  if (s->o_.limits.request_bytes == 0) s->o_.limits.request_bytes = DefaultRequestBytes();
  s->clients_ = std::make_unique<ClientRegistry>(SteadyClock::Get(), s->o_.lease, s->o_.quotas,
                                                 s->o_.limits.request_bytes);
  if (s->o_.limits.host_bytes == 0) s->o_.limits.host_bytes = DefaultHostBytes();
  s->pacer_ = std::make_unique<RequestPacer>(
      SteadyClock::Get(), static_cast<double>(s->o_.quotas.requests_per_second),
      s->o_.limits.paced_requests, s->o_.limits.paced_requests * kPacedKeysInAll);
  SessionManager::Options so;
  so.executor = s->executor_.get();
  so.quotas = s->o_.quotas;
  so.limits = s->o_.limits;
  so.host_accessible = s->providers_.front()->host_accessible();
  so.model_factory = s->o_.model_factory;
  so.metrics = &s->metrics_;
  s->allocations_ = std::make_unique<AllocationRegistry>();
  so.allocations = s->allocations_.get();
  if (std::any_of(runtimes.begin(), runtimes.end(), [](auto* rt) { return rt != nullptr; })) {
    so.device_health = [runtimes](size_t device) {
      return device < runtimes.size() && runtimes[device] != nullptr
                 ? runtimes[device]->CheckHealth()
                 : OkStatus();
    };
  }
  if (s->o_.snapshot_every_iterations > 0 && !s->o_.state_dir.empty()) {
    const uint64_t every = s->o_.snapshot_every_iterations;
    so.iteration_done = [self, every] {
      if (self->iterations_since_snapshot_.fetch_add(1) + 1 == every) {
        MutexLock lock(&self->mu_);
        self->cv_.NotifyAll();
      }
    };
  }
  so.instance = s->instance_;
  s->sessions_ = std::make_unique<SessionManager>(std::move(so));
  s->metrics_.SetGaugeSource([self] { return self->Gauges(); });
  // A snapshot to take up, before anyone is served.
  std::string restore = s->o_.restore_dir;
  if (restore.empty() && !s->o_.state_dir.empty() && HasSnapshot(s->o_.state_dir)) {
    restore = s->o_.state_dir;
  }
  if (!restore.empty()) {
    if (Status r = s->RestoreFrom(restore); !r.ok()) {
      if (!s->o_.discard_invalid_snapshot) {
        return Status(r.code(),
                      fmt::format("{} (the daemon does not start; --discard-invalid-snapshot "
                                  "starts it without the snapshot's sessions)",
                                  r.message()));
      }
      logging::Get("server")->error("the snapshot is not restored, the daemon starts empty: {}",
                                    r.message());
    }
  }

  for (const Listener& l : listeners) {
    if (l.endpoint.rfind("ipc://", 0) == 0) {
      const std::filesystem::path dir = std::filesystem::path(l.endpoint.substr(6)).parent_path();
      std::error_code ec;
      if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    }
  }
  SALUS_ASSIGN_OR_RETURN(s->frontend_,
                         RpcFrontend::Create(
                             listeners, curve, [self](Call c) { self->Handle(std::move(c)); },
                             s->o_.limits.reply_backlog, s->o_.limits.reply_backlog_bytes));
  // Any local user may connect over ipc: the peer's user is its principal (Note [Principals]),
  // and ownership, not the socket's mode, keeps users apart.
  for (const std::string& ep : s->frontend_->endpoints()) {
    if (ep.rfind("ipc://", 0) != 0) continue;
    std::error_code ec;
    std::filesystem::permissions(ep.substr(6), std::filesystem::perms(0666), ec);
    if (ec) {
      logging::Get("server")->warn("cannot open '{}' to other users: {}", ep, ec.message());
    }
  }
  if (!s->o_.metrics_listen.empty()) {
    SALUS_ASSIGN_OR_RETURN(
        s->http_, MetricsHttpServer::Create(
                      s->o_.metrics_listen, [self] { return self->metrics_.RenderPrometheus(); },
                      [self] { return !self->draining(); }));
  }
  return s;
}

Server::~Server() {
  // A Create that failed part-way leaves members null and no thread running: nothing to drain.
  if (!frontend_) return;
  Drain();
  Wait();
}

Status Server::Start() {
  for (uint64_t i = 0; i < o_.limits.compile_threads; ++i) {
    compilers_.emplace_back([this] { CompileLoop(); });
  }
  buffers_ = std::thread([this] { BufferLoop(); });
  housekeeping_ = std::thread([this] { HousekeepingLoop(); });
  if (o_.snapshot_every_iterations > 0 && !o_.state_dir.empty()) {
    snapshotter_ = std::thread([this] { SnapshotLoop(); });
  }
  frontend_->Start();
  nlohmann::json ready = {{"version", kServerVersion},
                          {"protocol", kProtocolVersion},
                          {"device", o_.device},
                          {"capacity_bytes", o_.memory},
                          {"policy", o_.policy},
                          {"endpoints", frontend_->endpoints()},
                          {"pid", getpid()}};
  if (http_) ready["metrics"] = http_->address();
  logging::Lifecycle("ready", ready);
  return OkStatus();
}

const std::vector<std::string>& Server::endpoints() const { return frontend_->endpoints(); }
std::string Server::metrics_address() const { return http_ ? http_->address() : ""; }

// The nice value of the thread that writes snapshots while the daemon serves.
constexpr int kSnapshotNice = 10;

// Note [Snapshots while serving]
// A drain's snapshot keeps the jobs across a planned restart; a crash leaves no drain. So with
// snapshot_every_iterations N (and a state directory) a thread of its own writes a snapshot
// whenever N iterations of all sessions together have finished since the last one, while the
// daemon serves. It is the drain's snapshot, taken without stopping anything: each session's
// state is read by a state-only request queued behind its iterations (so at an iteration
// boundary, on its lane, a copy out of the arena), and everything else (hashing, writing,
// syncing) happens on this thread, at a low priority (nice kSnapshotNice), so that it yields
// to the sessions' own threads. The iterations go on meanwhile; each session's state in the
// snapshot is the one after the iterations queued before its read. After a crash, the start
// restores the last snapshot written whole, and its sessions refuse iterations from clients
// that have not heard of the restart (Note [Rewound sessions] in session_manager.cc).
void Server::SnapshotLoop() {
  const uint64_t every = o_.snapshot_every_iterations;
  // Background work: hashing and writing yield to the sessions' own threads.
  SetCurrentThreadNice(kSnapshotNice).status().IgnoreError();
  while (true) {
    {
      MutexLock lock(&mu_);
      while (!stop_ && !draining_ && iterations_since_snapshot_.load() < every) cv_.Wait(&mu_);
      if (stop_ || draining_) return;
    }
    iterations_since_snapshot_ = 0;
    if (Status s = WriteSnapshotTo(o_.state_dir); !s.ok()) {
      logging::Get("server")->error("the periodic snapshot failed: {}", s.message());
    }
  }
}

Status Server::WriteSnapshotTo(const std::string& dir) {
  MutexLock one_at_a_time(&snapshot_mu_);
  const auto started = std::chrono::steady_clock::now();
  const bool complete = draining();  // a drain's: every accepted iteration is in it
  std::vector<std::string> skipped;
  std::vector<SessionManager::SavedSession> saved = sessions_->Save(o_.snapshot_timeout, &skipped);
  SnapshotData data;
  data.manifest.set_protocol_version(kProtocolVersion);
  data.manifest.set_server_version(kServerVersion);
  data.manifest.set_device(o_.device);
  data.manifest.set_complete(complete);
  for (v1::Allocation& a : allocations_->Save()) *data.manifest.add_allocations() = std::move(a);
  std::map<uint64_t, bool> kept;  // each session's client: whether it is in the snapshot
  for (SessionManager::SavedSession& s : saved) {
    auto [client, first] = kept.try_emplace(s.session.client(), false);
    if (first) {
      if (std::optional<ClientRegistry::Saved> c = clients_->Save(s.session.client())) {
        v1::SnapshotClient* out = data.manifest.add_clients();
        out->set_id(c->ref.id);
        out->set_name(c->ref.name);
        out->set_principal(c->bound_to);
        out->set_allocation(c->ref.allocation);
        out->set_token_sha256(c->token_sha256);
        client->second = true;
      }
    }
    if (!client->second) {  // its lease ran out meanwhile: its sessions are closing
      skipped.push_back(fmt::format("session {}: its client is gone", s.session.session_id()));
      continue;
    }
    *data.manifest.add_sessions() = std::move(s.session);
    data.states.push_back(std::move(s.state));
  }
  for (const std::string& why : skipped) {
    logging::Get("server")->error("not in the snapshot: {}", why);
  }
  SALUS_RETURN_IF_ERROR(WriteSnapshot(dir, &data));
  uint64_t bytes = 0;
  for (const std::string& state : data.states) bytes += state.size();
  logging::Lifecycle(
      "snapshot",
      {{"dir", dir},
       {"sessions", data.manifest.sessions_size()},
       {"clients", data.manifest.clients_size()},
       {"left_out", skipped.size()},
       {"state_bytes", bytes},
       {"seconds",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()}});
  return OkStatus();
}

Status Server::RestoreFrom(const std::string& dir) {
  const auto started = std::chrono::steady_clock::now();
  SALUS_ASSIGN_OR_RETURN(SnapshotData data, ReadSnapshot(dir));
  for (const v1::Allocation& a : data.manifest.allocations()) {
    if (auto granted = allocations_->Grant(a); !granted.ok()) {
      return DataLossError(fmt::format("snapshot in '{}': allocation {}: {}", dir, a.id(),
                                       granted.status().message()));
    }
  }
  std::map<uint64_t, ClientRef> clients;
  for (const v1::SnapshotClient& c : data.manifest.clients()) {
    ClientRegistry::Saved saved;
    saved.ref.id = c.id();
    saved.ref.name = c.name();
    saved.ref.allocation = c.allocation();
    saved.ref.principal =
        c.allocation().empty() ? c.principal() : AllocationPrincipal(c.allocation());
    saved.bound_to = c.principal();
    saved.token_sha256 = c.token_sha256();
    if (Status s = clients_->Restore(saved); !s.ok()) {
      return DataLossError(fmt::format("snapshot in '{}': {}", dir, s.message()));
    }
    clients[c.id()] = saved.ref;
  }
  size_t restored = 0;
  std::vector<std::string> failed;
  for (int i = 0; i < data.manifest.sessions_size(); ++i) {
    const v1::SnapshotSession& s = data.manifest.sessions(i);
    auto owner = clients.find(s.client());
    Status st =
        owner == clients.end()
            ? DataLossError("its client is not in the snapshot")
            : sessions_->Restore(owner->second, s, std::move(data.states[static_cast<size_t>(i)]),
                                 data.manifest.complete());
    if (st.ok()) {
      ++restored;
    } else {
      failed.push_back(
          fmt::format("session {} ({}): {}", s.session_id(), s.create().name(), st.message()));
      logging::Get("server")->error("not restored: {}", failed.back());
    }
  }
  SALUS_RETURN_IF_ERROR(RetireSnapshot(dir));
  logging::Lifecycle(
      "restored",
      {{"dir", dir},
       {"written_by", data.manifest.server_version()},
       {"complete", data.manifest.complete()},
       {"allocations", data.manifest.allocations_size()},
       {"clients", clients.size()},
       {"sessions", restored},
       {"failed", failed},
       {"seconds",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()}});
  return OkStatus();
}

bool Server::draining() const {
  MutexLock lock(&mu_);
  return draining_;
}

void Server::Drain(std::string snapshot_dir) {
  MutexLock lock(&mu_);
  if (draining_) return;
  draining_ = true;
  if (snapshot_dir.empty()) snapshot_dir = o_.state_dir;
  logging::Lifecycle("draining", {{"sessions", sessions_->Count()}, {"snapshot", snapshot_dir}});
  // Created under mu_, which the drainer needs before it can set drained_: Wait() therefore
  // always sees drainer_ assigned once drained_ is true, and joins it.
  drainer_ = std::thread([this, snapshot_dir] {
    if (!snapshot_dir.empty()) {
      if (Status s = WriteSnapshotTo(snapshot_dir); !s.ok()) {
        logging::Get("server")->error("the snapshot failed, the sessions end with the daemon: {}",
                                      s.message());
      }
    }
    // Queued iterations are answered UNAVAILABLE, those in flight finish, memory returns.
    executor_->Shutdown();
    sessions_->CloseAll();
    MutexLock done(&mu_);
    drained_ = true;
    cv_.NotifyAll();
  });
}

void Server::Wait() {
  {
    MutexLock lock(&mu_);
    while (!drained_) cv_.Wait(&mu_);
    if (stop_) return;
    stop_ = true;
    cv_.NotifyAll();
  }
  if (drainer_.joinable()) drainer_.join();
  for (std::thread& t : compilers_) t.join();
  if (buffers_.joinable()) buffers_.join();
  if (housekeeping_.joinable()) housekeeping_.join();
  if (snapshotter_.joinable()) snapshotter_.join();
  pacer_->Flush();    // requests still held back get their answers
  frontend_->Stop();  // after every reply has been posted
  if (http_) http_->Stop();
  logging::Lifecycle("stopped", nlohmann::json::object());
}

void Server::Handle(Call call) {
  metrics_.RequestReceived();
  try {
    Admit(call);
  } catch (const std::bad_alloc&) {
    // The budgets are the mechanism (docs/operations.md, Limits); this is the last line.
    if (!call.answered()) Fail(call, ResourceExhaustedError("the daemon ran out of memory"));
  } catch (const std::exception& e) {
    // A library's check that the daemon failed to make first: its bug, answered as one.
    logging::Get("server")->error("handling a request threw: {}", e.what());
    if (!call.answered()) Fail(call, InternalError(std::string("the request failed: ") + e.what()));
  }
}

void Server::Admit(Call& call) {
  const v1::Request& req = call.request();
  const RequestClass cls = Classify(req.body_case());
  if (cls == RequestClass::kUnknown) {
    return Fail(call,
                InvalidArgumentError("the request has no body (or one this server does not know)"));
  }
  // Only work carries a model or tensors: anything else is small, and is held only as such.
  if (cls != RequestClass::kWork &&
      (call.envelope_bytes() > kMaxControlEnvelopeBytes || !call.frames().empty())) {
    return Fail(call, InvalidArgumentError(fmt::format(
                          "a {} request carries {} envelope bytes and {} frames; it may carry at "
                          "most {} bytes and no frame",
                          v1::Request::GetDescriptor()
                              ->FindFieldByNumber(static_cast<int>(req.body_case()))
                              ->name(),
                          call.envelope_bytes(), call.frames().size(), kMaxControlEnvelopeBytes)));
  }
  Caller caller;
  caller.principal = call.principal();
  caller.transport = call.principal();
  caller.admin = IsAdmin(caller.principal);
  const bool needs_client = cls == RequestClass::kWork || cls == RequestClass::kControl;
  if (!req.client_token().empty() || needs_client) {
    auto client = clients_->Resolve(req.client_token(), caller.principal);
    if (client.ok()) {
      caller.client = std::move(*client);
    } else if (needs_client) {
      return Fail(call, client.status());
    }
  }
  if (caller.client && !caller.client->allocation.empty()) {
    caller.principal = caller.client->principal;
    caller.admin = false;
  }
  if (cls == RequestClass::kAdmin && !caller.admin) {
    return Fail(call,
                PermissionDeniedError(fmt::format(
                    "this request needs the administrator role (the daemon's own user or "
                    "root over its ipc socket, or an administrator CURVE key); it came from "
                    "'{}'",
                    caller.principal.empty() ? "an unauthenticated peer" : caller.principal)));
  }
  if (cls == RequestClass::kWork && draining()) {
    return Fail(call, UnavailableError("the server is draining and takes no new work"));
  }
  if (caller.client) {
    // The request's bytes count until its reply goes out: a queued iteration holds its frames.
    const uint64_t id = caller.client->id, bytes = call.message_bytes();
    if (Status s = clients_->BeginRequest(id, bytes); !s.ok()) return Fail(call, s);
    call.OnAnswered([registry = clients_.get(), id, bytes] { registry->EndRequest(id, bytes); });
  }
  if (cls == RequestClass::kWork) return Dispatch(caller, std::move(call));
  // Everything else is cheap to ask and is paced per client (per principal without one); the
  // requests held back are bounded (limits.paced_requests), past which they are refused. Without
  // a client, Hello and Heartbeat are paced apart from the views, so a flood of token-less
  // views (from one user, or over loopback TCP from any) leaves the principal's Hellos alone.
  const std::string key = caller.client                ? fmt::format("c{}", caller.client->id)
                          : cls == RequestClass::kOpen ? fmt::format("o{}", caller.principal)
                                                       : fmt::format("p{}", caller.principal);
  auto held = std::make_shared<std::pair<Caller, Call>>(std::move(caller), std::move(call));
  const bool taken = pacer_->Offer(key, [this, held] {
    try {
      Dispatch(held->first, std::move(held->second));
    } catch (const std::bad_alloc&) {
      if (!held->second.answered()) {
        Fail(held->second, ResourceExhaustedError("the daemon ran out of memory"));
      }
    } catch (const std::exception& e) {
      logging::Get("server")->error("handling a request threw: {}", e.what());
      if (!held->second.answered()) {
        Fail(held->second, InternalError(std::string("the request failed: ") + e.what()));
      }
    }
  });
  if (!taken) {
    metrics_.RequestPaced();
    Fail(held->second,
         ResourceExhaustedError(fmt::format(
             "limits.paced_requests={} reached: this {} has that many requests held back by the "
             "requests_per_second quota ({}/s); wait for their replies",
             o_.limits.paced_requests, held->first.client ? "client" : "principal",
             o_.quotas.requests_per_second)));
  }
}

void Server::Dispatch(const Caller& caller, Call call) {
  const v1::Request& req = call.request();
  switch (req.body_case()) {
    case v1::Request::kCreateSession: {
      MutexLock lock(&mu_);
      const uint64_t now = ++create_clock_;
      auto [principal, fresh] = creates_.try_emplace(caller.client->principal);
      if (fresh) principal->second.arrived = now;
      auto [client, new_client] = principal->second.clients.try_emplace(caller.client->id);
      if (new_client) client->second.arrived = now;
      client->second.queue.push_back(PendingCreate{*caller.client, std::move(call)});
      ++principal->second.waiting;
      ++waiting_creates_;
      cv_.NotifyAll();
      return;
    }
    case v1::Request::kRegisterBuffer: {
      MutexLock lock(&mu_);
      registrations_.emplace_back(caller, std::move(call));
      cv_.NotifyAll();
      return;
    }
    case v1::Request::kRunIteration:
      return sessions_->Run(std::move(call), *caller.client);
    default:
      break;
  }
  StatusOr<v1::Reply> reply = Answer(caller, req);
  if (!reply.ok()) return Fail(call, reply.status());
  const bool drain = req.body_case() == v1::Request::kDrain;
  call.Reply(std::move(*reply));
  if (drain) Drain(req.drain().snapshot_dir());
}

StatusOr<v1::Reply> Server::Answer(const Caller& caller, const v1::Request& req) {
  // An administrator sees everything; anyone else what its client owns (nothing, without one).
  static const ClientRef kNobody{};
  const ClientRef* viewer = caller.admin ? nullptr : (caller.client ? &*caller.client : &kNobody);
  v1::Reply reply;
  switch (req.body_case()) {
    case v1::Request::kHello:
      return Hello(caller, req.hello());
    case v1::Request::kHeartbeat:
      reply.mutable_heartbeat()->set_server_instance(instance_);
      reply.mutable_heartbeat()->set_draining(draining());
      reply.mutable_heartbeat()->set_client_known(caller.client.has_value());
      return reply;
    case v1::Request::kCloseSession:
      SALUS_RETURN_IF_ERROR(sessions_->Close(*caller.client, req.session_id(), caller.admin));
      reply.mutable_close_session();
      return reply;
    case v1::Request::kUnregisterBuffer:
      SALUS_RETURN_IF_ERROR(
          sessions_->UnregisterBuffer(*caller.client, req.unregister_buffer().buffer_id()));
      reply.mutable_unregister_buffer();
      return reply;
    case v1::Request::kListSessions:
      *reply.mutable_list_sessions() = sessions_->List(viewer);
      return reply;
    case v1::Request::kGetStats:
      reply.mutable_get_stats()->set_json(StatsJson(viewer).dump());
      return reply;
    case v1::Request::kGetMemoryMap:
      reply.mutable_get_memory_map()->set_json(MemoryMapJson(viewer).dump());
      return reply;
    case v1::Request::kDrain:
      reply.mutable_drain();
      return reply;
    case v1::Request::kGrantAllocation: {
      SALUS_ASSIGN_OR_RETURN(const bool created,
                             allocations_->Grant(req.grant_allocation().allocation()));
      const v1::Allocation& a = req.grant_allocation().allocation();
      logging::Event("server", "allocation_granted",
                     {{"allocation", a.id()},
                      {"created", created},
                      {"memory_bytes", a.memory_bytes()},
                      {"latency_class", v1::LatencyClass_Name(a.latency_class())},
                      {"priority", a.priority()},
                      {"max_priority", a.max_priority()},
                      {"pod", a.pod()},
                      {"by", caller.principal}});
      reply.mutable_grant_allocation()->set_created(created);
      return reply;
    }
    case v1::Request::kRevokeAllocation: {
      SALUS_ASSIGN_OR_RETURN(const size_t closed,
                             RevokeAllocation(req.revoke_allocation().id(), caller));
      reply.mutable_revoke_allocation()->set_sessions_closed(static_cast<uint32_t>(closed));
      return reply;
    }
    case v1::Request::kMoveSession: {
      sched::Engine& engine = executor_->engine();
      SALUS_ASSIGN_OR_RETURN(const size_t to, engine.FindDevice(req.move_session().device()));
      SALUS_ASSIGN_OR_RETURN(const sched::SessionInfo before, engine.Session(req.session_id()));
      SALUS_RETURN_IF_ERROR(executor_->Migrate(req.session_id(), to));
      logging::Event("server", "session_moved",
                     {{"session", req.session_id()},
                      {"to", engine.device_name(to)},
                      {"by", caller.principal}});
      v1::MoveSessionReply* out = reply.mutable_move_session();
      if (before.device) out->set_from(engine.device_name(*before.device));
      out->set_to(engine.device_name(to));
      return reply;
    }
    case v1::Request::kListAllocations: {
      v1::ListAllocationsReply* out = reply.mutable_list_allocations();
      for (AllocationUsage& u : allocations_->List()) {
        u.allocation.set_clients(
            static_cast<uint32_t>(clients_->CountOf(AllocationPrincipal(u.allocation.id()))));
        *out->add_allocations() = std::move(u.allocation);
      }
      return reply;
    }
    default:
      return InternalError(fmt::format("request kind {} has no immediate answer",
                                       static_cast<int>(req.body_case())));
  }
}

void Server::Fail(Call& call, const Status& s) {
  metrics_.RequestFailed();
  call.ReplyError(s);
}

bool Server::IsAdmin(const std::string& principal) const {
  if (principal == "uid:0" || principal == own_principal_) return true;
  const std::vector<std::string>& keys = o_.security.admin_keys;
  return principal.rfind("curve:", 0) == 0 &&
         std::find(keys.begin(), keys.end(), principal.substr(6)) != keys.end();
}

StatusOr<v1::Reply> Server::Hello(const Caller& caller, const v1::Hello& hello) {
  if (hello.client_name().size() > o_.limits.max_name_bytes) {
    return InvalidArgumentError(
        fmt::format("the client name has {} bytes, more than "
                    "limits.max_name_bytes={}",
                    hello.client_name().size(), o_.limits.max_name_bytes));
  }
  if (hello.protocol_version() != kProtocolVersion) {
    return FailedPreconditionError(
        fmt::format("protocol version {} is not supported; this server speaks {}",
                    hello.protocol_version(), kProtocolVersion));
  }
  std::string token;
  std::string allocation;
  if (!hello.allocation_token().empty()) {
    SALUS_ASSIGN_OR_RETURN(AllocationTerms terms, allocations_->Resolve(hello.allocation_token()));
    allocation = terms.id;
  }
  SALUS_ASSIGN_OR_RETURN(ClientRef client, clients_->Hello(caller.principal, &token, allocation));
  if (!allocation.empty() && !allocations_->Terms(allocation).ok()) {
    // Revoked meanwhile, after the revoke dropped the allocation's clients: so is this one.
    clients_->Forget(client.id);
    return UnauthenticatedError("unknown allocation token");
  }
  const bool admin = caller.admin && allocation.empty();
  v1::Reply reply;
  v1::HelloReply* h = reply.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_server_version(kServerVersion);
  h->set_device(o_.device);
  h->set_capacity_bytes(o_.memory);
  h->set_policy(o_.policy);
  h->set_client_id(client.name);
  h->set_client_token(std::move(token));
  h->set_role(admin ? v1::ROLE_ADMIN : v1::ROLE_USER);
  h->set_principal(client.principal);
  h->set_allocation(allocation);
  h->set_lease_ms(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(o_.lease).count()));
  h->set_server_instance(instance_);
  return reply;
}

StatusOr<size_t> Server::RevokeAllocation(const std::string& id, const Caller& caller) {
  // Forgotten first, so its token and any CreateSession racing this fail from now on; then its
  // clients go and their sessions close as at a lease expiry (Note [Allocations]).
  SALUS_RETURN_IF_ERROR(allocations_->Revoke(id));
  size_t closed = 0;
  const std::vector<uint64_t> dropped = clients_->DropAllocation(id);
  for (uint64_t client : dropped) closed += sessions_->CloseClient(client, "session_revoked");
  logging::Event("server", "allocation_revoked",
                 {{"allocation", id},
                  {"clients", dropped.size()},
                  {"sessions_closed", closed},
                  {"by", caller.principal}});
  return closed;
}

// Note [Turns of compilation]
// Compilations wait for a compile thread in turns: the principal served least recently goes
// first (one that was never served, or whose queue had emptied, before any that was; among
// those, the first to arrive), and within it the client served least recently, by the same
// rule. A principal that queues a hundred creations, over one client or many, thus delays
// another principal's by at most the one compilation it has running per thread, and one
// client's delays its principal's other clients' likewise. Picking costs a look at every
// principal and client waiting, which is a few; the request-in-flight quota bounds them.
std::optional<Server::PendingCreate> Server::NextCreate() {
  MutexLock lock(&mu_);
  while (waiting_creates_ == 0 && !stop_) cv_.Wait(&mu_);
  if (waiting_creates_ == 0) return std::nullopt;
  // Entries stay while one of theirs compiles, so a principal that has just been served keeps
  // its place behind the others even when its queue was empty meanwhile.
  auto earlier = [](const auto& a, const auto& b) {
    const bool a_waits = a.second.waits(), b_waits = b.second.waits();
    if (a_waits != b_waits) return a_waits;
    return std::pair(a.second.served, a.second.arrived) <
           std::pair(b.second.served, b.second.arrived);
  };
  auto principal = std::min_element(creates_.begin(), creates_.end(), earlier);
  auto& clients = principal->second.clients;
  auto client = std::min_element(clients.begin(), clients.end(), earlier);
  PendingCreate next = std::move(client->second.queue.front());
  client->second.queue.pop_front();
  const uint64_t now = ++create_clock_;
  for (auto* entry : {&client->second.served, &principal->second.served}) *entry = now;
  ++client->second.running;
  ++principal->second.running;
  --principal->second.waiting;
  --waiting_creates_;
  return next;
}

void Server::CreateDone(const ClientRef& done) {
  MutexLock lock(&mu_);
  auto principal = creates_.find(done.principal);
  if (principal == creates_.end()) return;
  auto& clients = principal->second.clients;
  if (auto client = clients.find(done.id); client != clients.end()) {
    --client->second.running;
    if (client->second.running == 0 && client->second.queue.empty()) clients.erase(client);
  }
  --principal->second.running;
  if (principal->second.running == 0 && principal->second.waiting == 0) creates_.erase(principal);
}

void Server::CompileLoop() {
  while (std::optional<PendingCreate> next = NextCreate()) {
    Call& call = next->call;
    // Answered or not, the turn ends with this pass (Note [Turns of compilation]).
    struct Done {
      Server* server;
      const ClientRef& client;
      ~Done() { server->CreateDone(client); }
    } done{this, next->client};
    if (draining()) {
      Fail(call, UnavailableError("the server is draining and takes no new work"));
      continue;
    }
    StatusOr<v1::CreateSessionReply> created = InternalError("not created");
    try {
      created = sessions_->Create(next->client, call.request().create_session());
    } catch (const std::bad_alloc&) {
      created = ResourceExhaustedError("the daemon ran out of memory creating this session");
    } catch (const std::exception& e) {
      logging::Get("server")->error("creating a session threw: {}", e.what());
      created = InternalError(std::string("creating this session failed: ") + e.what());
    }
    if (!created.ok()) {
      Fail(call, created.status());
      continue;
    }
    v1::Reply reply;
    *reply.mutable_create_session() = std::move(*created);
    call.Reply(std::move(reply));
  }
}

void Server::BufferLoop() {
  while (true) {
    std::optional<std::pair<Caller, Call>> next;
    {
      MutexLock lock(&mu_);
      while (registrations_.empty() && !stop_) cv_.Wait(&mu_);
      if (registrations_.empty()) return;
      next.emplace(std::move(registrations_.front()));
      registrations_.pop_front();
    }
    const Caller& caller = next->first;
    Call& call = next->second;
    StatusOr<uint64_t> id = InternalError("not registered");
    try {
      id = sessions_->RegisterBuffer(*caller.client, call.request().register_buffer(),
                                     CallerUid(caller.transport));
    } catch (const std::bad_alloc&) {
      id = ResourceExhaustedError("the daemon ran out of memory registering this buffer");
    } catch (const std::exception& e) {
      logging::Get("server")->error("registering a buffer threw: {}", e.what());
      id = InternalError(std::string("registering this buffer failed: ") + e.what());
    }
    if (!id.ok()) {
      Fail(call, id.status());
      continue;
    }
    v1::Reply reply;
    reply.mutable_register_buffer()->set_buffer_id(*id);
    call.Reply(std::move(reply));
  }
}

void Server::HousekeepingLoop() {
  const Clock* clock = SteadyClock::Get();
  Nanos last = clock->Now();
  while (true) {
    bool draining = false;
    {
      MutexLock lock(&mu_);
      if (!stop_) cv_.WaitFor(&mu_, kHousekeepingPeriod);
      if (stop_) return;
      draining = draining_;
    }
    // Note [Leases and stalls]: a pass this late means the daemon stood still meanwhile.
    const Nanos now = clock->Now();
    if (now - last > kStallGap) {
      clients_->Forgive(now - last);
      logging::Event("server", "stall", {{"seconds", ToSeconds(now - last)}});
    }
    last = now;
    pacer_->Release();  // held-back requests are answered while draining too
    if (draining) continue;
    executor_->ExpireWaiting();
    // Leases are measured up to the last time the frontend had read every request (Note
    // [Leases and stalls] in client_registry.cc).
    for (uint64_t client : clients_->Expire(frontend_->caught_up())) {
      sessions_->CloseClient(client);
    }
  }
}

std::string Server::Gauges() const {
  std::string out;
  size_t waiting = 0, admitted = 0, paged = 0, interactive = 0;
  const v1::ListSessionsReply all = sessions_->List(nullptr);
  for (const auto& s : all.sessions()) {
    (s.state() == v1::WAITING ? waiting : s.state() == v1::PAGED_OUT ? paged : admitted)++;
    if (s.latency_class() == v1::LATENCY_INTERACTIVE) interactive++;
  }
  out += "# HELP salus_server_sessions Sessions by state.\n# TYPE salus_server_sessions gauge\n";
  out += fmt::format("salus_server_sessions{{state=\"waiting\"}} {}\n", waiting);
  out += fmt::format("salus_server_sessions{{state=\"admitted\"}} {}\n", admitted);
  out += fmt::format("salus_server_sessions{{state=\"paged_out\"}} {}\n", paged);
  out +=
      "# HELP salus_server_class_sessions Sessions by latency class.\n"
      "# TYPE salus_server_class_sessions gauge\n";
  out += fmt::format("salus_server_class_sessions{{class=\"batch\"}} {}\n",
                     waiting + admitted + paged - interactive);
  out += fmt::format("salus_server_class_sessions{{class=\"interactive\"}} {}\n", interactive);
  const sched::HoldStats holds = executor_->engine().Holds();
  out += CounterFamily("salus_sched_holds_total",
                       "Lanes held idle for a session expected back, by how the hold ended.",
                       "outcome", {{"returned", holds.returned}, {"expired", holds.expired}});
  out += CounterFamily("salus_sched_hold_idle_seconds_total", "Lane time spent held.", "",
                       {{"", ToSeconds(holds.idle)}});
  out += fmt::format(
      "# HELP salus_server_clients Clients with a live lease.\n"
      "# TYPE salus_server_clients gauge\nsalus_server_clients {}\n"
      "# HELP salus_server_paced_requests Requests held back by the per-client rate.\n"
      "# TYPE salus_server_paced_requests gauge\nsalus_server_paced_requests {}\n",
      clients_->Count(), pacer_->held());
  out += fmt::format(
      "# HELP salus_server_shared_buffers Shared buffers registered by clients.\n"
      "# TYPE salus_server_shared_buffers gauge\nsalus_server_shared_buffers {}\n",
      sessions_->BufferCount());
  out += fmt::format(
      "# HELP salus_server_host_bytes Host memory sessions hold outside the arena, compilations "
      "in progress included (limits.host_bytes).\n"
      "# TYPE salus_server_host_bytes gauge\nsalus_server_host_bytes {}\n"
      "# HELP salus_rpc_reply_backlog Replies kept for connections that do not read them.\n"
      "# TYPE salus_rpc_reply_backlog gauge\nsalus_rpc_reply_backlog {}\n",
      sessions_->HostBytes(), frontend_->backlogged_replies());
  out += CounterFamily("salus_rpc_replies_dropped_total",
                       "Replies dropped because their connection did not read them while "
                       "limits.reply_backlog were waiting.",
                       "", {{"", static_cast<double>(frontend_->dropped_replies())}});
  out += AllocationGauges();
  // Memory, per device (Note [Devices] in src/sched/engine.cc): each series has a device label.
  std::string lanes_out, lane_bytes_out, region_out, capacity_out, session_out, paged_out,
      queue_out;
  for (size_t d = 0; d < memory_.size(); ++d) {
    const mem::MemoryManager& mem = *memory_[d];
    const std::string& dev = device_names_[d];
    const auto lanes = mem.Lanes();
    lanes_out += fmt::format("salus_mem_lanes{{device=\"{}\"}} {}\n", dev, lanes.size());
    uint64_t lane_total = 0;
    for (const auto& l : lanes) {
      lane_bytes_out +=
          fmt::format("salus_mem_lane_bytes{{device=\"{}\",lane=\"{}\",class=\"{}\"}} {}\n", dev,
                      l.id, mem::LaneClassName(l.lane_class), l.size);
      lane_total += l.size;
    }
    const uint64_t committed = mem.CommittedBytes();
    region_out += fmt::format("salus_mem_region_bytes{{device=\"{}\",region=\"ephemeral\"}} {}\n",
                              dev, lane_total);
    region_out += fmt::format("salus_mem_region_bytes{{device=\"{}\",region=\"persistent\"}} {}\n",
                              dev, committed >= lane_total ? committed - lane_total : 0);
    capacity_out +=
        fmt::format("salus_mem_capacity_bytes{{device=\"{}\"}} {}\n", dev, mem.capacity());
    const mem::MemoryStatsSnapshot snap = mem.StatsSnapshot();
    if (o_.metrics_per_session) {
      for (const mem::SessionStats& s : snap.sessions) {
        const bool resident =
            s.residence == mem::Residence::kResident || s.residence == mem::Residence::kPagingIn;
        session_out += fmt::format(
            "salus_mem_session_bytes{{device=\"{}\",session=\"{}\",residence=\"resident\"}} {}\n",
            dev, s.session, resident ? s.requirement.persistent_bytes : 0);
        session_out += fmt::format(
            "salus_mem_session_bytes{{device=\"{}\",session=\"{}\",residence=\"paged\"}} {}\n", dev,
            s.session, resident ? 0 : s.requirement.persistent_bytes);
      }
    }
    paged_out += fmt::format("salus_mem_paged_bytes{{device=\"{}\"}} {}\n", dev, snap.paged_bytes);
    queue_out +=
        fmt::format("salus_mem_admission_queue{{device=\"{}\"}} {}\n", dev, mem.WaitingCount());
  }
  out += "# HELP salus_mem_lanes Open lanes.\n# TYPE salus_mem_lanes gauge\n" + lanes_out;
  out += "# HELP salus_mem_lane_bytes Size of each lane.\n# TYPE salus_mem_lane_bytes gauge\n" +
         lane_bytes_out;
  out +=
      "# HELP salus_mem_region_bytes Bytes committed per region of the arena.\n"
      "# TYPE salus_mem_region_bytes gauge\n" +
      region_out;
  out += "# HELP salus_mem_capacity_bytes The arena.\n# TYPE salus_mem_capacity_bytes gauge\n" +
         capacity_out;
  out += fmt::format(
      "# HELP salus_device_reserved_bytes Device memory outside the arena held by the engine's "
      "contexts (streams, cuDNN and cuBLAS handles), as measured when each was created.\n"
      "# TYPE salus_device_reserved_bytes gauge\nsalus_device_reserved_bytes {}\n",
      ReservedBytes());
  out +=
      "# HELP salus_device_lost Whether the device was lost to a fault (1) or not (0).\n"
      "# TYPE salus_device_lost gauge\n";
  for (size_t d = 0; d < device_names_.size(); ++d) {
    out += fmt::format("salus_device_lost{{device=\"{}\"}} {}\n", device_names_[d],
                       executor_->engine().DeviceLost(d).ok() ? 0 : 1);
  }
  if (o_.metrics_per_session) {
    out +=
        "# HELP salus_mem_session_bytes Persistent bytes of each admitted session, resident in "
        "the arena or paged out to host memory (metrics_per_session).\n"
        "# TYPE salus_mem_session_bytes gauge\n" +
        session_out;
  }
  out +=
      "# HELP salus_mem_paged_bytes Persistent bytes paged out to host memory.\n"
      "# TYPE salus_mem_paged_bytes gauge\n" +
      paged_out;
  const sched::MigrationStats moves = executor_->engine().Migrations();
  out += CounterFamily(
      "salus_sched_migrations_total",
      "Sessions moved between devices, by outcome (started, finished, or undone when the "
      "target had filled up).",
      "outcome",
      {{"started", moves.started}, {"finished", moves.finished}, {"undone", moves.undone}});
  const sched::IntrospectionStats pairs = executor_->engine().Introspection();
  out += CounterFamily(
      "salus_sched_pair_decisions_total",
      "Introspective packing: pairs of sessions run side by side and measured, by what became "
      "of them (probed apart to measure them alone, kept packed, unpacked by running them "
      "apart, or by moving one to another device).",
      "decision",
      {{"probe", pairs.probes},
       {"kept", pairs.kept},
       {"apart", pairs.apart},
       {"moved", pairs.moved}});
  const sched::PagingStats paging = executor_->engine().Paging();
  out += CounterFamily("salus_mem_pages_total", "Sessions paged, by direction.", "direction",
                       {{"out", paging.page_outs}, {"in", paging.page_ins}});
  out += CounterFamily("salus_mem_paging_copied_bytes_total",
                       "Bytes copied between the arena and host memory.", "",
                       {{"", paging.copied_bytes}});
  out += CounterFamily("salus_mem_paging_copy_seconds_total", "Time the copy path spent copying.",
                       "", {{"", ToSeconds(paging.copy_time)}});
  out +=
      "# HELP salus_mem_admission_queue Sessions waiting for memory on each device.\n"
      "# TYPE salus_mem_admission_queue gauge\n" +
      queue_out;
  return out;
}

std::string Server::AllocationGauges() const {
  std::string budget, used, sessions, iterations;
  for (const AllocationUsage& u : allocations_->List()) {
    const v1::Allocation& a = u.allocation;
    const std::string labels = fmt::format("{{allocation=\"{}\",pod=\"{}\"}}",
                                           EscapeLabelValue(a.id()), EscapeLabelValue(a.pod()));
    budget += fmt::format("salus_alloc_memory_budget_bytes{} {}\n", labels, a.memory_bytes());
    used += fmt::format("salus_alloc_used_bytes{} {}\n", labels, a.used_bytes());
    sessions += fmt::format("salus_alloc_sessions{} {}\n", labels, a.sessions());
    iterations += fmt::format("salus_alloc_iterations_total{} {}\n", labels, u.iterations);
  }
  return "# HELP salus_alloc_memory_budget_bytes Each allocation's memory budget (P+E of its "
         "sessions; 0: none).\n# TYPE salus_alloc_memory_budget_bytes gauge\n" +
         budget +
         "# HELP salus_alloc_used_bytes P+E of each allocation's open sessions.\n"
         "# TYPE salus_alloc_used_bytes gauge\n" +
         used +
         "# HELP salus_alloc_sessions Each allocation's open sessions.\n"
         "# TYPE salus_alloc_sessions gauge\n" +
         sessions +
         "# HELP salus_alloc_iterations_total Iterations run by each allocation's sessions.\n"
         "# TYPE salus_alloc_iterations_total counter\n" +
         iterations;
}

nlohmann::json Server::StatsJson(const ClientRef* viewer) const {
  std::vector<uint64_t> own;
  if (viewer != nullptr) own = sessions_->SessionsOf(viewer->id);
  uint64_t capacity = 0, committed = 0;
  size_t waiting = 0, lanes = 0;
  std::string lost;  // "device: status" of each lost device
  nlohmann::json devices = nlohmann::json::array();
  for (size_t d = 0; d < memory_.size(); ++d) {
    const mem::MemoryManager& mem = *memory_[d];
    nlohmann::json memory = mem.Stats();
    if (viewer != nullptr) {
      nlohmann::json others;
      memory["sessions"] = OwnSessionsOnly(memory["sessions"], {own.begin(), own.end()}, "id",
                                           "persistent_bytes", &others);
      memory["other_sessions"] = others;
    }
    const size_t device_lanes = mem.Lanes().size();
    const Status device_lost = executor_->engine().DeviceLost(d);
    if (!device_lost.ok()) {
      lost += (lost.empty() ? "" : "; ") + device_names_[d] + ": " + device_lost.ToString();
    }
    devices.push_back({{"device", device_names_[d]},
                       {"lost", device_lost.ToString()},
                       {"capacity_bytes", mem.capacity()},
                       {"committed_bytes", mem.CommittedBytes()},
                       {"waiting", mem.WaitingCount()},
                       {"lanes", device_lanes},
                       {"memory", std::move(memory)}});
    capacity += mem.capacity();
    committed += mem.CommittedBytes();
    waiting += mem.WaitingCount();
    lanes += device_lanes;
  }
  nlohmann::json out = {{"device", o_.device},
                        {"device_reserved_bytes", ReservedBytes()},
                        {"device_lost", lost.empty() ? std::string("OK") : lost},
                        {"policy", o_.policy},
                        {"capacity_bytes", capacity},
                        {"committed_bytes", committed},
                        {"sessions", sessions_->Count()},
                        {"shared_buffers", sessions_->BufferCount()},
                        {"waiting", waiting},
                        {"lanes", lanes},
                        {"running_iterations", executor_->engine().RunningIterations()},
                        {"requests", frontend_->requests_received()},
                        {"bad_envelopes", frontend_->bad_envelopes()},
                        {"draining", draining()},
                        {"clients", clients_->Count()}};
  // One device: its memory statistics at the top too, as before devices were several. The list
  // is there for any number, so a client reads each device's name the same way.
  if (devices.size() == 1) out["memory"] = devices[0]["memory"];
  out["devices"] = std::move(devices);
  return out;
}

nlohmann::json Server::MemoryMapJson(const ClientRef* viewer) const {
  // One device: its map; several: {"devices": [map with its "device" name, ...]}.
  if (memory_.size() > 1) {
    nlohmann::json devices = nlohmann::json::array();
    for (size_t d = 0; d < memory_.size(); ++d) {
      nlohmann::json map = DeviceMemoryMapJson(d, viewer);
      map["device"] = device_names_[d];
      devices.push_back(std::move(map));
    }
    return {{"devices", std::move(devices)}};
  }
  return DeviceMemoryMapJson(0, viewer);
}

nlohmann::json Server::DeviceMemoryMapJson(size_t device, const ClientRef* viewer) const {
  nlohmann::json map = memory_[device]->MemoryMap();
  if (viewer == nullptr) return map;
  const std::vector<uint64_t> own_ids = sessions_->SessionsOf(viewer->id);
  const std::set<uint64_t> own(own_ids.begin(), own_ids.end());
  nlohmann::json others;
  map["persistent_blocks"] =
      OwnSessionsOnly(map["persistent_blocks"], own, "session", "size", &others);
  map["other_persistent_blocks"] = others;
  nlohmann::json other_paged;
  map["paged_sessions"] =
      OwnSessionsOnly(map["paged_sessions"], own, "session", "size", &other_paged);
  map["other_paged_sessions"] = other_paged;
  for (auto& lane : map["lanes"]) {
    nlohmann::json kept = nlohmann::json::array();
    uint64_t hidden = 0;
    for (const auto& id : lane["sessions"]) {
      if (id.is_number_unsigned() && own.count(id.get<uint64_t>()) != 0) {
        kept.push_back(id);
      } else {
        ++hidden;
      }
    }
    lane["sessions"] = kept;
    lane["other_sessions"] = hidden;
  }
  return map;
}

}  // namespace salus::server
