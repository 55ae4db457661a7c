#include "server/server.h"

#include <fmt/format.h>
#include <google/protobuf/stubs/logging.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "common/logging.h"
#include "common/units.h"
#include "device/cuda_query.h"

namespace salus::server {
namespace {

constexpr uint64_t kDefaultCpuArenaBytes = 8 * kGiB;
constexpr uint64_t kCudaReserveBytes = 512 * kMiB;
constexpr auto kHousekeepingPeriod = std::chrono::milliseconds(100);

std::string RuntimeDir() {
  if (const char* d = std::getenv("RUNTIME_DIRECTORY"); d != nullptr && *d != '\0') {
    std::string s(d);
    return s.substr(0, s.find(':'));  // systemd may list several
  }
  if (const char* d = std::getenv("XDG_RUNTIME_DIR"); d != nullptr && *d != '\0') {
    return std::string(d) + "/salus";
  }
  return fmt::format("/tmp/salus-{}", getuid());
}

}  // namespace

std::vector<std::string> DefaultEndpoints() {
  return {fmt::format("ipc://{}/salus.sock", RuntimeDir()),
          fmt::format("tcp://127.0.0.1:{}", kDefaultTcpPort)};
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
  std::unique_ptr<Server> s(new Server(std::move(options)));
  s->runtime_ = runtime;
  SALUS_ASSIGN_OR_RETURN(s->provider_, device::CreateMemoryProvider(s->o_.device));
  SALUS_ASSIGN_OR_RETURN(auto policy, sched::CreatePolicy(s->o_.policy, s->o_.policy_options));

  Server* self = s.get();
  sched::Engine::Options eo;
  eo.clock = SteadyClock::Get();
  eo.provider = s->provider_.get();
  eo.capacity = s->o_.memory;
  eo.policy = std::move(policy);
  eo.on_admitted = [self](uint64_t id, uint64_t lane) { self->sessions_->OnAdmitted(id, lane); };
  eo.on_admission_failed = [self](uint64_t id, const Status& st) {
    self->sessions_->OnAdmissionFailed(id, st);
  };
  SALUS_ASSIGN_OR_RETURN(s->executor_, sched::Executor::Create(std::move(eo)));

  SessionManager::Options so;
  so.executor = s->executor_.get();
  so.clock = SteadyClock::Get();
  so.lease = s->o_.lease;
  so.host_accessible = s->provider_->host_accessible();
  so.model_factory = s->o_.model_factory;
  so.metrics = &s->metrics_;
  if (runtime != nullptr) so.device_health = [runtime] { return runtime->CheckHealth(); };
  s->sessions_ = std::make_unique<SessionManager>(std::move(so));
  s->metrics_.SetGaugeSource([self] { return self->Gauges(); });

  for (const std::string& ep : s->o_.listen) {
    if (ep.rfind("ipc://", 0) == 0) {
      const std::filesystem::path dir = std::filesystem::path(ep.substr(6)).parent_path();
      std::error_code ec;
      if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    }
  }
  SALUS_ASSIGN_OR_RETURN(s->frontend_, RpcFrontend::Create(s->o_.listen, [self](Call c) {
                           self->Handle(std::move(c));
                         }));
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
  frontend_->Stop();  // after every reply has been posted
  if (http_) http_->Stop();
  logging::Lifecycle("stopped", nlohmann::json::object());
}

void Server::Handle(Call call) {
  metrics_.RequestReceived();
  const v1::Request& req = call.request();
  sessions_->Touch(call.peer());
  const bool draining_now = draining();
  switch (req.body_case()) {
    case v1::Request::kHello:
      return HandleHello(std::move(call));
    case v1::Request::kHeartbeat: {
      v1::Reply reply;
      reply.mutable_heartbeat();
      return call.Reply(std::move(reply));
    }
    case v1::Request::kCreateSession: {
      if (draining_now) break;
      MutexLock lock(&mu_);
      control_queue_.push_back(std::move(call));
      cv_.NotifyAll();
      return;
    }
    case v1::Request::kRunIteration:
      if (draining_now) break;
      return sessions_->Run(std::move(call));
    case v1::Request::kCloseSession: {
      Status s = sessions_->Close(req.session_id());
      if (!s.ok()) {
        return Fail(call, s);
      }
      v1::Reply reply;
      reply.mutable_close_session();
      return call.Reply(std::move(reply));
    }
    case v1::Request::kRegisterBuffer: {
      if (draining_now) break;
      auto id = sessions_->RegisterBuffer(call.peer(), req.register_buffer());
      if (!id.ok()) {
        return Fail(call, id.status());
      }
      v1::Reply reply;
      reply.mutable_register_buffer()->set_buffer_id(*id);
      return call.Reply(std::move(reply));
    }
    case v1::Request::kUnregisterBuffer: {
      Status s = sessions_->UnregisterBuffer(call.peer(), req.unregister_buffer().buffer_id());
      if (!s.ok()) {
        return Fail(call, s);
      }
      v1::Reply reply;
      reply.mutable_unregister_buffer();
      return call.Reply(std::move(reply));
    }
    case v1::Request::kListSessions: {
      v1::Reply reply;
      for (auto& info : sessions_->List()) *reply.mutable_list_sessions()->add_sessions() = info;
      return call.Reply(std::move(reply));
    }
    case v1::Request::kGetStats: {
      v1::Reply reply;
      reply.mutable_get_stats()->set_json(StatsJson().dump());
      return call.Reply(std::move(reply));
    }
    case v1::Request::kGetMemoryMap: {
      v1::Reply reply;
      reply.mutable_get_memory_map()->set_json(executor_->engine().memory().MemoryMap().dump());
      return call.Reply(std::move(reply));
    }
    case v1::Request::kDrain: {
      v1::Reply reply;
      reply.mutable_drain();
      call.Reply(std::move(reply));
      return Drain();
    }
    case v1::Request::BODY_NOT_SET:
      return Fail(
          call, InvalidArgumentError("the request has no body (or one this server does not know)"));
  }
  Fail(call, UnavailableError("the server is draining and takes no new work"));
}

void Server::Fail(Call& call, const Status& s) {
  metrics_.RequestFailed();
  call.ReplyError(s);
}

void Server::HandleHello(Call call) {
  const v1::Hello& hello = call.request().hello();
  if (hello.protocol_version() != kProtocolVersion) {
    return Fail(call, FailedPreconditionError(
                          fmt::format("protocol version {} is not supported; this server speaks {}",
                                      hello.protocol_version(), kProtocolVersion)));
  }
  v1::Reply reply;
  v1::HelloReply* h = reply.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_server_version(kServerVersion);
  h->set_device(o_.device);
  h->set_capacity_bytes(o_.memory);
  h->set_policy(o_.policy);
  h->set_client_id(call.peer());
  h->set_lease_ms(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(o_.lease).count()));
  call.Reply(std::move(reply));
}

void Server::ControlLoop() {
  while (true) {
    std::optional<Call> call;
    {
      MutexLock lock(&mu_);
      while (control_queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (control_queue_.empty()) return;
      call.emplace(std::move(control_queue_.front()));
      control_queue_.pop_front();
    }
    if (draining()) {
      Fail(*call, UnavailableError("the server is draining and takes no new work"));
      continue;
    }
    auto created = sessions_->Create(call->peer(), call->request().create_session());
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
    {
      MutexLock lock(&mu_);
      if (!stop_) cv_.WaitFor(&mu_, kHousekeepingPeriod);
      if (stop_) return;
      if (draining_) continue;
    }
    executor_->ExpireWaiting();
    sessions_->ExpireLeases();
  }
}

std::string Server::Gauges() const {
  std::string out;
  size_t waiting = 0, admitted = 0, interactive = 0;
  for (const auto& s : sessions_->List()) {
    (s.state() == v1::WAITING ? waiting : admitted)++;
    if (s.latency_class() == v1::LATENCY_INTERACTIVE) interactive++;
  }
  const auto& mem = executor_->engine().memory();
  const auto lanes = mem.Lanes();
  out += "# HELP salus_server_sessions Sessions by state.\n# TYPE salus_server_sessions gauge\n";
  out += fmt::format("salus_server_sessions{{state=\"waiting\"}} {}\n", waiting);
  out += fmt::format("salus_server_sessions{{state=\"admitted\"}} {}\n", admitted);
  out +=
      "# HELP salus_server_class_sessions Sessions by latency class.\n"
      "# TYPE salus_server_class_sessions gauge\n";
  out += fmt::format("salus_server_class_sessions{{class=\"batch\"}} {}\n",
                     waiting + admitted - interactive);
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
  out += fmt::format(
      "# HELP salus_mem_admission_queue Sessions waiting for memory.\n"
      "# TYPE salus_mem_admission_queue gauge\nsalus_mem_admission_queue {}\n",
      mem.WaitingCount());
  return out;
}

nlohmann::json Server::StatsJson() const {
  const auto& mem = executor_->engine().memory();
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
          {"memory", mem.Stats()}};
}

}  // namespace salus::server
