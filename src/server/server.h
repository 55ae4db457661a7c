// Server: one salus-server daemon. It owns the device's memory provider, the executor (and
// through it the engine and the memory manager), the sessions, the RPC frontend and the
// metrics endpoint, and answers each request type (the only place statuses become wire
// errors is the frontend's Call).
//
// Threads: the frontend's I/O thread (decodes, dispatches, never waits on execution); one
// control thread for CreateSession (model compilation can take a while); lane workers; a
// housekeeping thread (admission timeouts, client leases); the metrics HTTP thread.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/thread_annotations.h"
#include "device/memory_provider.h"
#include "exec/device.h"
#include "sched/executor.h"
#include "server/metrics.h"
#include "server/metrics_http_server.h"
#include "server/rpc_frontend.h"
#include "server/session_manager.h"

namespace salus::server {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr char kServerVersion[] = "0.1.0";
inline constexpr uint16_t kDefaultTcpPort = 5501;

struct ServerOptions {
  std::vector<std::string> listen;  // empty: DefaultEndpoints()
  std::string device = "cpu";       // "cpu" or "cuda:N"
  uint64_t memory = 0;              // the arena; 0: the device's default
  std::string policy = "fair";
  nlohmann::json policy_options;
  std::string metrics_listen;  // HOST:PORT; empty: no metrics endpoint
  Nanos lease{std::chrono::seconds(30)};
  SessionManager::ModelFactory model_factory;  // null: model sessions are UNIMPLEMENTED
};

// ipc://<runtime dir>/salus.sock and tcp://127.0.0.1:5501. The runtime dir is
// $RUNTIME_DIRECTORY (systemd), else $XDG_RUNTIME_DIR/salus, else /tmp/salus-<uid>.
std::vector<std::string> DefaultEndpoints();

// The arena a device gets without --memory: on the CPU 8 GiB of address space (pages are
// committed only when touched); on a GPU its free memory less a reserve for the runtime.
StatusOr<uint64_t> DefaultMemory(const std::string& device);

// Sends the protobuf library's own log lines to the "protobuf" logger at debug level (fatal
// ones at critical). By default it writes them to stderr, one per bad string a client sends,
// so any client could flood the daemon's log; the request itself is answered with an error.
// Process-wide; call once at startup, before any thread parses a message.
void RouteProtobufLogs();

class Server {
 public:
  static StatusOr<std::unique_ptr<Server>> Create(ServerOptions options);
  ~Server();

  // Starts serving; logs `event: ready {json}` when requests can be sent.
  Status Start();
  // Stops admitting, finishes iterations in flight, answers every waiter; returns at once.
  void Drain() EXCLUDES(mu_);
  // Blocks until a drain has finished and every reply is out.
  void Wait() EXCLUDES(mu_);

  const std::vector<std::string>& endpoints() const;
  std::string metrics_address() const;
  bool draining() const EXCLUDES(mu_);

 private:
  explicit Server(ServerOptions options) : o_(std::move(options)) {}
  void Handle(Call call);
  void HandleHello(Call call);
  // Answers `call` with the error `s` and counts it as a failed request.
  void Fail(Call& call, const Status& s);
  void ControlLoop();
  void HousekeepingLoop();
  std::string Gauges() const;
  nlohmann::json StatsJson() const;

  ServerOptions o_;
  std::unique_ptr<device::MemoryProvider> provider_;
  exec::DeviceRuntime* runtime_ = nullptr;  // the engine's GPU runtime; null on the CPU
  Metrics metrics_;
  std::unique_ptr<sched::Executor> executor_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<RpcFrontend> frontend_;
  std::unique_ptr<MetricsHttpServer> http_;

  mutable Mutex mu_;
  CondVar cv_;
  bool draining_ GUARDED_BY(mu_) = false;
  bool drained_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  std::deque<Call> control_queue_ GUARDED_BY(mu_);
  std::thread control_, housekeeping_, drainer_;
};

}  // namespace salus::server
