#include "server/server.h"

#include <fmt/format.h>
#include <google/protobuf/stubs/logging.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "common/endpoints.h"
#include "common/logging.h"
#include "common/units.h"
#include "device/cuda_query.h"

namespace salus::server {
namespace {

constexpr uint64_t kDefaultCpuArenaBytes = 8 * kGiB;
constexpr uint64_t kCudaReserveBytes = 512 * kMiB;
constexpr auto kHousekeepingPeriod = std::chrono::milliseconds(100);

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
// - admin: Drain. Only the administrator role (PERMISSION_DENIED otherwise).
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
      return RequestClass::kAdmin;
    case v1::Request::BODY_NOT_SET:
      break;
  }
  return RequestClass::kUnknown;
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

StatusOr<uint64_t> DefaultMemory(const std::string& device) {
  if (device == "cpu") return kDefaultCpuArenaBytes;
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
  if (options.device != "cpu" && options.device.rfind("cuda", 0) != 0) {
    return InvalidArgumentError(
        fmt::format("unknown device '{}' (expected cpu or cuda:N)", options.device));
  }
  // A GPU daemon brings up the engine's device runtime first: the CUDA context and the first
  // lane context (stream, cuDNN and cuBLAS handles) take device memory outside the arena, so
  // the default arena is sized from what is free after them (Note [Device contexts]).
  exec::DeviceRuntime* runtime = nullptr;
  if (auto d = exec::ParseDevice(options.device); d.ok() && d->type == exec::DeviceType::kCuda) {
    SALUS_ASSIGN_OR_RETURN(runtime, exec::DeviceRuntime::For(*d));
    SALUS_RETURN_IF_ERROR(runtime->ThreadContext().status());
  }
  if (options.memory == 0) {
    SALUS_ASSIGN_OR_RETURN(options.memory, DefaultMemory(options.device));
  }
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
  s->runtime_ = runtime;
  SALUS_ASSIGN_OR_RETURN(s->provider_, device::CreateMemoryProvider(s->o_.device));
  SALUS_ASSIGN_OR_RETURN(auto policy, sched::CreatePolicy(s->o_.policy, s->o_.policy_options));

  Server* self = s.get();
  sched::Engine::Options eo;
  eo.clock = SteadyClock::Get();
  SALUS_ASSIGN_OR_RETURN(eo.devices,
                         sched::MakeDevices(*policy, eo.clock,
                                            {{s->o_.device, s->provider_.get(), s->o_.memory,
                                              s->o_.overcommit, std::nullopt}}));
  eo.policy = std::move(policy);
  eo.paging_quantum = s->o_.paging_quantum;
  eo.on_admitted = [self](uint64_t id, uint64_t lane) { self->sessions_->OnAdmitted(id, lane); };
  eo.on_admission_failed = [self](uint64_t id, const Status& st) {
    self->sessions_->OnAdmissionFailed(id, st);
  };
  SALUS_ASSIGN_OR_RETURN(s->executor_, sched::Executor::Create(std::move(eo)));

  s->clients_ = std::make_unique<ClientRegistry>(SteadyClock::Get(), s->o_.lease, s->o_.quotas);
  s->pacer_ = std::make_unique<RequestPacer>(SteadyClock::Get(),
                                             static_cast<double>(s->o_.quotas.requests_per_second));
  SessionManager::Options so;
  so.executor = s->executor_.get();
  so.quotas = s->o_.quotas;
  so.host_accessible = s->provider_->host_accessible();
  so.model_factory = s->o_.model_factory;
  so.metrics = &s->metrics_;
  if (runtime != nullptr) so.device_health = [runtime] { return runtime->CheckHealth(); };
  s->sessions_ = std::make_unique<SessionManager>(std::move(so));
  s->metrics_.SetGaugeSource([self] { return self->Gauges(); });

  for (const Listener& l : listeners) {
    if (l.endpoint.rfind("ipc://", 0) == 0) {
      const std::filesystem::path dir = std::filesystem::path(l.endpoint.substr(6)).parent_path();
      std::error_code ec;
      if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    }
  }
  SALUS_ASSIGN_OR_RETURN(s->frontend_, RpcFrontend::Create(listeners, curve, [self](Call c) {
                           self->Handle(std::move(c));
                         }));
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
  control_ = std::thread([this] { ControlLoop(); });
  housekeeping_ = std::thread([this] { HousekeepingLoop(); });
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

bool Server::draining() const {
  MutexLock lock(&mu_);
  return draining_;
}

void Server::Drain() {
  MutexLock lock(&mu_);
  if (draining_) return;
  draining_ = true;
  logging::Lifecycle("draining", {{"sessions", sessions_->Count()}});
  // Created under mu_, which the drainer needs before it can set drained_: Wait() therefore
  // always sees drainer_ assigned once drained_ is true, and joins it.
  drainer_ = std::thread([this] {
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
  if (control_.joinable()) control_.join();
  if (housekeeping_.joinable()) housekeeping_.join();
  pacer_->Flush();    // requests still held back get their answers
  frontend_->Stop();  // after every reply has been posted
  if (http_) http_->Stop();
  logging::Lifecycle("stopped", nlohmann::json::object());
}

void Server::Handle(Call call) {
  metrics_.RequestReceived();
  const v1::Request& req = call.request();
  const RequestClass cls = Classify(req.body_case());
  if (cls == RequestClass::kUnknown) {
    return Fail(call,
                InvalidArgumentError("the request has no body (or one this server does not know)"));
  }
  Caller caller;
  caller.principal = call.principal();
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
    const uint64_t id = caller.client->id;
    if (Status s = clients_->BeginRequest(id); !s.ok()) return Fail(call, s);
    call.OnAnswered([registry = clients_.get(), id] { registry->EndRequest(id); });
  }
  if (cls == RequestClass::kWork) return Dispatch(caller, std::move(call));
  // Everything else is cheap to ask and is paced per client (per principal without one).
  const std::string key =
      caller.client ? fmt::format("c{}", caller.client->id) : fmt::format("p{}", caller.principal);
  auto held = std::make_shared<std::pair<Caller, Call>>(std::move(caller), std::move(call));
  pacer_->Offer(key, [this, held] { Dispatch(held->first, std::move(held->second)); });
}

void Server::Dispatch(const Caller& caller, Call call) {
  const v1::Request& req = call.request();
  switch (req.body_case()) {
    case v1::Request::kCreateSession: {
      MutexLock lock(&mu_);
      auto& queue = control_queue_[caller.client->id];
      if (queue.empty()) control_turns_.push_back(caller.client->id);
      queue.emplace_back(*caller.client, std::move(call));
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
  if (drain) Drain();
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
      reply.mutable_heartbeat();
      return reply;
    case v1::Request::kCloseSession:
      SALUS_RETURN_IF_ERROR(sessions_->Close(*caller.client, req.session_id(), caller.admin));
      reply.mutable_close_session();
      return reply;
    case v1::Request::kRegisterBuffer: {
      SALUS_ASSIGN_OR_RETURN(uint64_t id,
                             sessions_->RegisterBuffer(*caller.client, req.register_buffer()));
      reply.mutable_register_buffer()->set_buffer_id(id);
      return reply;
    }
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
  if (hello.protocol_version() != kProtocolVersion) {
    return FailedPreconditionError(
        fmt::format("protocol version {} is not supported; this server speaks {}",
                    hello.protocol_version(), kProtocolVersion));
  }
  std::string token;
  SALUS_ASSIGN_OR_RETURN(ClientRef client, clients_->Hello(caller.principal, &token));
  v1::Reply reply;
  v1::HelloReply* h = reply.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_server_version(kServerVersion);
  h->set_device(o_.device);
  h->set_capacity_bytes(o_.memory);
  h->set_policy(o_.policy);
  h->set_client_id(client.name);
  h->set_client_token(std::move(token));
  h->set_role(caller.admin ? v1::ROLE_ADMIN : v1::ROLE_USER);
  h->set_principal(caller.principal);
  h->set_lease_ms(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(o_.lease).count()));
  return reply;
}

void Server::ControlLoop() {
  while (true) {
    std::optional<std::pair<ClientRef, Call>> next;
    {
      MutexLock lock(&mu_);
      while (control_turns_.empty() && !stop_) cv_.Wait(&mu_);
      if (control_turns_.empty()) return;
      // One creation per client in turn: a client with many queued waits behind the others.
      const uint64_t client = control_turns_.front();
      control_turns_.pop_front();
      auto& queue = control_queue_[client];
      next.emplace(std::move(queue.front()));
      queue.pop_front();
      if (queue.empty()) {
        control_queue_.erase(client);
      } else {
        control_turns_.push_back(client);
      }
    }
    Call* call = &next->second;
    if (draining()) {
      Fail(*call, UnavailableError("the server is draining and takes no new work"));
      continue;
    }
    auto created = sessions_->Create(next->first, call->request().create_session());
    if (!created.ok()) {
      Fail(*call, created.status());
      continue;
    }
    v1::Reply reply;
    *reply.mutable_create_session() = std::move(*created);
    call->Reply(std::move(reply));
  }
}

void Server::HousekeepingLoop() {
  while (true) {
    bool draining = false;
    {
      MutexLock lock(&mu_);
      if (!stop_) cv_.WaitFor(&mu_, kHousekeepingPeriod);
      if (stop_) return;
      draining = draining_;
    }
    pacer_->Release();  // held-back requests are answered while draining too
    if (draining) continue;
    executor_->ExpireWaiting();
    for (uint64_t client : clients_->Expire()) sessions_->CloseClient(client);
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
  const auto& mem = executor_->engine().memory();
  const auto lanes = mem.Lanes();
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
  out += fmt::format(
      "# HELP salus_sched_holds_total Lanes held idle for a session expected back, by how the "
      "hold ended.\n# TYPE salus_sched_holds_total counter\n"
      "salus_sched_holds_total{{outcome=\"returned\"}} {}\n"
      "salus_sched_holds_total{{outcome=\"expired\"}} {}\n"
      "# HELP salus_sched_hold_idle_seconds_total Lane time spent held.\n"
      "# TYPE salus_sched_hold_idle_seconds_total counter\n"
      "salus_sched_hold_idle_seconds_total {}\n",
      holds.returned, holds.expired, ToSeconds(holds.idle));
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
      "# HELP salus_mem_lanes Open lanes.\n# TYPE salus_mem_lanes gauge\nsalus_mem_lanes {}\n",
      lanes.size());
  out += "# HELP salus_mem_lane_bytes Size of each lane.\n# TYPE salus_mem_lane_bytes gauge\n";
  uint64_t lane_total = 0;
  for (const auto& l : lanes) {
    out += fmt::format("salus_mem_lane_bytes{{lane=\"{}\",class=\"{}\"}} {}\n", l.id,
                       mem::LaneClassName(l.lane_class), l.size);
    lane_total += l.size;
  }
  const uint64_t committed = mem.CommittedBytes();
  out +=
      "# HELP salus_mem_region_bytes Bytes committed per region of the arena.\n"
      "# TYPE salus_mem_region_bytes gauge\n";
  out += fmt::format("salus_mem_region_bytes{{region=\"ephemeral\"}} {}\n", lane_total);
  out += fmt::format("salus_mem_region_bytes{{region=\"persistent\"}} {}\n",
                     committed >= lane_total ? committed - lane_total : 0);
  out += fmt::format(
      "# HELP salus_mem_capacity_bytes The arena.\n# TYPE salus_mem_capacity_bytes gauge\n"
      "salus_mem_capacity_bytes {}\n",
      mem.capacity());
  out += fmt::format(
      "# HELP salus_device_reserved_bytes Device memory outside the arena held by the engine's "
      "contexts (streams, cuDNN and cuBLAS handles), as measured when each was created.\n"
      "# TYPE salus_device_reserved_bytes gauge\nsalus_device_reserved_bytes {}\n",
      runtime_ ? runtime_->reserved_bytes() : 0);
  out += fmt::format(
      "# HELP salus_device_lost Whether the device was lost to a fault (1) or not (0).\n"
      "# TYPE salus_device_lost gauge\nsalus_device_lost {}\n",
      sessions_->DeviceLost().ok() ? 0 : 1);
  const mem::MemoryStatsSnapshot snap = mem.StatsSnapshot();
  out +=
      "# HELP salus_mem_session_bytes Persistent bytes of each admitted session, resident in the "
      "arena or paged out to host memory.\n# TYPE salus_mem_session_bytes gauge\n";
  for (const mem::SessionStats& s : snap.sessions) {
    const bool resident =
        s.residence == mem::Residence::kResident || s.residence == mem::Residence::kPagingIn;
    out += fmt::format("salus_mem_session_bytes{{session=\"{}\",residence=\"resident\"}} {}\n",
                       s.session, resident ? s.requirement.persistent_bytes : 0);
    out += fmt::format("salus_mem_session_bytes{{session=\"{}\",residence=\"paged\"}} {}\n",
                       s.session, resident ? 0 : s.requirement.persistent_bytes);
  }
  const sched::PagingStats paging = executor_->engine().Paging();
  out += fmt::format(
      "# HELP salus_mem_paged_bytes Persistent bytes paged out to host memory.\n"
      "# TYPE salus_mem_paged_bytes gauge\nsalus_mem_paged_bytes {}\n"
      "# HELP salus_mem_pages_total Sessions paged, by direction.\n"
      "# TYPE salus_mem_pages_total counter\n"
      "salus_mem_pages_total{{direction=\"out\"}} {}\n"
      "salus_mem_pages_total{{direction=\"in\"}} {}\n"
      "# HELP salus_mem_paging_copied_bytes_total Bytes copied between the arena and host memory.\n"
      "# TYPE salus_mem_paging_copied_bytes_total counter\n"
      "salus_mem_paging_copied_bytes_total {}\n"
      "# HELP salus_mem_paging_copy_seconds_total Time the copy path spent copying.\n"
      "# TYPE salus_mem_paging_copy_seconds_total counter\n"
      "salus_mem_paging_copy_seconds_total {}\n",
      snap.paged_bytes, paging.page_outs, paging.page_ins, paging.copied_bytes,
      ToSeconds(paging.copy_time));
  out += fmt::format(
      "# HELP salus_mem_admission_queue Sessions waiting for memory.\n"
      "# TYPE salus_mem_admission_queue gauge\nsalus_mem_admission_queue {}\n",
      mem.WaitingCount());
  return out;
}

nlohmann::json Server::StatsJson(const ClientRef* viewer) const {
  const auto& mem = executor_->engine().memory();
  nlohmann::json memory = mem.Stats();
  if (viewer != nullptr) {
    const std::vector<uint64_t> own = sessions_->SessionsOf(viewer->id);
    nlohmann::json others;
    memory["sessions"] = OwnSessionsOnly(memory["sessions"], {own.begin(), own.end()}, "id",
                                         "persistent_bytes", &others);
    memory["other_sessions"] = others;
  }
  return {{"device", o_.device},
          {"device_reserved_bytes", runtime_ ? runtime_->reserved_bytes() : 0},
          {"device_lost", sessions_->DeviceLost().ToString()},
          {"policy", o_.policy},
          {"capacity_bytes", mem.capacity()},
          {"committed_bytes", mem.CommittedBytes()},
          {"sessions", sessions_->Count()},
          {"shared_buffers", sessions_->BufferCount()},
          {"waiting", mem.WaitingCount()},
          {"lanes", mem.Lanes().size()},
          {"running_iterations", executor_->engine().RunningIterations()},
          {"requests", frontend_->requests_received()},
          {"bad_envelopes", frontend_->bad_envelopes()},
          {"draining", draining()},
          {"clients", clients_->Count()},
          {"memory", memory}};
}

nlohmann::json Server::MemoryMapJson(const ClientRef* viewer) const {
  nlohmann::json map = executor_->engine().memory().MemoryMap();
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
