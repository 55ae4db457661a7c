// Server: one salus-server daemon. It owns the device's memory provider, the executor (and
// through it the engine and the memory manager), the sessions, the RPC frontend and the
// metrics endpoint, and answers each request type (the only place statuses become wire
// errors is the frontend's Call).
//
// Every request is classified once, by kind (Note [Request classes] in server.cc), and checked
// there against its caller: which client its token names, which role its principal has, and
// the client's requests-in-flight quota. Only then does the kind's handler run, and each
// handler gives the request its one reply.
//
// Threads: the frontend's I/O thread (decodes, dispatches, never waits on execution and never
// makes a blocking system call); a pool of compile threads for CreateSession (model
// compilation can take a while), which serve the queued creations by principal and then by
// client in turn; a buffer thread that opens clients' shared-memory objects (RegisterBuffer);
// lane workers; a housekeeping thread (admission timeouts, client leases, paced requests); the
// metrics HTTP thread.
#pragma once

#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/thread_annotations.h"
#include "common/version.h"
#include "device/memory_provider.h"
#include "exec/device.h"
#include "sched/executor.h"
#include "server/allocation_registry.h"
#include "server/client_registry.h"
#include "server/limits.h"
#include "server/metrics.h"
#include "server/metrics_http_server.h"
#include "server/request_pacer.h"
#include "server/rpc_frontend.h"
#include "server/session_manager.h"

namespace salus::server {

// The protocol and the daemon's version: common/version.h (CMakeLists.txt defines both).
using salus::kProtocolVersion;
inline constexpr const char* kServerVersion = salus::kVersion;
inline constexpr uint16_t kDefaultTcpPort = 5501;

// Who may reach the daemon from elsewhere, and who administers it (docs/operations.md).
struct SecurityOptions {
  // Endpoints that speak CURVE even on a loopback address; any tcp endpoint in `listen` that
  // is not loopback does so too.
  std::vector<std::string> listen_remote;
  std::string curve_secret_key;          // Z85; needed when any endpoint speaks CURVE
  std::vector<std::string> client_keys;  // allowed CURVE client keys, Z85
  std::vector<std::string> admin_keys;   // CURVE keys with the administrator role
  bool open = false;                     // any CURVE key may connect (as an ordinary user)
};

struct ServerOptions {
  std::vector<std::string> listen;  // empty: DefaultEndpoints()
  // "cpu", "cpu:N" (N CPU devices, each with its own arena), "cuda:N", "cuda:all" or a comma
  // list of devices (DeviceNames).
  std::string device = "cpu";
  uint64_t memory = 0;  // each device's arena; 0: the device's default
  std::string policy = "fair";
  nlohmann::json policy_options;
  std::string metrics_listen;  // HOST:PORT; empty: no metrics endpoint
  // Whether /metrics has a series per session (salus_mem_session_bytes): off by default, so the
  // number of series stays bounded however many sessions come and go.
  bool metrics_per_session = false;
  Nanos lease{std::chrono::seconds(30)};
  // Admission beyond the arena, paging persistent state to host memory (1: off), and how
  // long a session paged in keeps its place (sched::Engine::Options).
  double overcommit = 1.0;
  Nanos paging_quantum{std::chrono::seconds(1)};
  SessionManager::ModelFactory model_factory;  // null: model sessions are UNIMPLEMENTED
  SecurityOptions security;
  Quotas quotas;
  Limits limits;  // host_bytes 0: DefaultHostBytes()
  // Restarts (docs/operations.md, Restarts; Note [Restarts] in server/snapshot.cc).
  // A drain (SIGTERM, or Drain without a directory of its own) writes a snapshot here, and
  // the daemon restores the snapshot it finds here when it starts; empty: neither.
  std::string state_dir;
  // A snapshot to restore at start, which must be there and verify; empty: none.
  std::string restore_dir;
  // Start with no sessions when the snapshot to restore does not verify (it is logged and left
  // where it is), instead of refusing to start.
  bool discard_invalid_snapshot = false;
  // How long a drain waits for the iterations queued before it and the state reads.
  Nanos snapshot_timeout{std::chrono::minutes(5)};
  // With a state_dir: also write a snapshot there after every this many iterations (of all
  // sessions together), in the background, so a crash loses at most about as many; 0: only
  // when draining.
  uint64_t snapshot_every_iterations = 0;
};

// DefaultIpcEndpoint() (common/endpoints.h) and tcp://127.0.0.1:5501.
std::vector<std::string> DefaultEndpoints();

// The devices `--device` names, each as the engine and clients name it: "cpu" is one device
// "cpu"; "cpu:N" N devices "cpu:0".."cpu:N-1"; "cuda" or "cuda:N" one GPU; "cuda:all" every
// GPU the machine has; a comma list, each of its items one device. INVALID_ARGUMENT naming the
// offending item; a list may not mix CPU and GPU devices, nor name one twice.
StatusOr<std::vector<std::string>> DeviceNames(const std::string& device);
// The device a model session placed on `device` (one of DeviceNames) runs its kernels on:
// "cpu" for every CPU device ("cpu", "cpu:1"), else the GPU itself ("cuda:1").
std::string KernelDevice(const std::string& device);

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
  // With a `snapshot_dir` (or, without, the configured state_dir) it writes a snapshot of the
  // sessions first (salus.v1.Drain).
  void Drain(std::string snapshot_dir = "") EXCLUDES(mu_);
  // Blocks until a drain has finished and every reply is out.
  void Wait() EXCLUDES(mu_);

  const std::vector<std::string>& endpoints() const;
  std::string metrics_address() const;
  bool draining() const EXCLUDES(mu_);

 private:
  // Who sent a request, as far as the server could tell.
  struct Caller {
    std::string principal;
    std::string transport;  // the principal the transport authenticated (Note [Principals])
    bool admin = false;
    std::optional<ClientRef> client;  // the live client its token names
  };
  // A CreateSession waiting for a compile thread.
  struct PendingCreate {
    ClientRef client;
    Call call;
  };
  // Waiting creations of one client, or of one principal's clients, and when they were last
  // served and first waited (Note [Turns of compilation] in server.cc).
  struct ClientCreates {
    uint64_t served = 0;
    uint64_t arrived = 0;
    uint64_t running = 0;  // its creations compiling now
    std::deque<PendingCreate> queue;
    bool waits() const { return !queue.empty(); }
  };
  struct PrincipalCreates {
    uint64_t served = 0;
    uint64_t arrived = 0;
    uint64_t running = 0;
    size_t waiting = 0;  // creations queued over all its clients
    std::map<uint64_t, ClientCreates> clients;
    bool waits() const { return waiting > 0; }
  };
  explicit Server(ServerOptions options) : o_(std::move(options)) {}
  void Handle(Call call);
  // Handle's checks; moves `call` on to Dispatch or the pacer, or answers it.
  void Admit(Call& call);
  // Runs the kind's handler for a request that passed Handle's checks (and the pacer).
  void Dispatch(const Caller& caller, Call call);
  // The reply of each kind answered at once (everything but CreateSession and RunIteration).
  StatusOr<v1::Reply> Answer(const Caller& caller, const v1::Request& req);
  StatusOr<v1::Reply> Hello(const Caller& caller, const v1::Hello& hello);
  // Forgets allocation `id`, drops its clients and closes their sessions; returns how many.
  StatusOr<size_t> RevokeAllocation(const std::string& id, const Caller& caller);
  bool IsAdmin(const std::string& principal) const;
  // Answers `call` with the error `s` and counts it as a failed request.
  void Fail(Call& call, const Status& s);
  void CompileLoop();
  // The next creation to compile, by principal then by client in turn; none once stopping.
  std::optional<PendingCreate> NextCreate() EXCLUDES(mu_);
  // A creation NextCreate gave out has been answered.
  void CreateDone(const ClientRef& client) EXCLUDES(mu_);
  void BufferLoop();
  void HousekeepingLoop();
  // Writes a snapshot of every session to `dir` (Note [Restarts] in server/snapshot.cc); one
  // at a time.
  Status WriteSnapshotTo(const std::string& dir) EXCLUDES(snapshot_mu_);
  // Writes a snapshot to the state directory after every snapshot_every_iterations
  // iterations, until the daemon drains (Note [Snapshots while serving] in server.cc).
  void SnapshotLoop() EXCLUDES(mu_);
  // Takes up the snapshot in `dir`: its clients and sessions. Before the frontend starts.
  Status RestoreFrom(const std::string& dir);
  std::string Gauges() const;
  // The per-allocation series (salus_alloc_*), labelled with allocation and pod.
  std::string AllocationGauges() const;
  // Everything for an administrator (null viewer); for a client its own sessions and the
  // others' totals.
  nlohmann::json StatsJson(const ClientRef* viewer) const;
  nlohmann::json MemoryMapJson(const ClientRef* viewer) const;
  nlohmann::json DeviceMemoryMapJson(size_t device, const ClientRef* viewer) const;

  ServerOptions o_;
  // Random per start (salus.v1.HelloReply.server_instance).
  const uint64_t instance_ = SecureRandom64();
  const std::string own_principal_ = "uid:" + std::to_string(geteuid());  // the daemon's user
  // One per device, in the engine's device order; the memory managers are the engine's, and
  // the server reads them through these handles (they live as long as the executor).
  std::vector<std::string> device_names_;
  std::vector<std::unique_ptr<device::MemoryProvider>> providers_;
  std::vector<const mem::MemoryManager*> memory_;
  std::vector<exec::DeviceRuntime*> runtimes_;  // by device: its GPU runtime; null on the CPU
  // Device memory the GPUs' runtimes hold outside the arenas (DeviceRuntime::reserved_bytes).
  uint64_t ReservedBytes() const;
  Metrics metrics_;
  std::unique_ptr<ClientRegistry> clients_;  // outlives every Call (their OnAnswered hooks)
  std::unique_ptr<AllocationRegistry> allocations_;
  std::unique_ptr<RequestPacer> pacer_;
  std::unique_ptr<sched::Executor> executor_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<RpcFrontend> frontend_;
  std::unique_ptr<MetricsHttpServer> http_;

  mutable Mutex mu_;
  CondVar cv_;
  bool draining_ GUARDED_BY(mu_) = false;
  bool drained_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  // CreateSession requests waiting for a compile thread, per principal with any waiting or
  // compiling, and how many wait in all.
  std::map<std::string, PrincipalCreates> creates_ GUARDED_BY(mu_);
  size_t waiting_creates_ GUARDED_BY(mu_) = 0;
  uint64_t create_clock_ GUARDED_BY(mu_) = 0;  // counts arrivals and starts
  // RegisterBuffer requests waiting for the buffer thread.
  std::deque<std::pair<Caller, Call>> registrations_ GUARDED_BY(mu_);
  std::vector<std::thread> compilers_;
  std::thread buffers_, housekeeping_, drainer_, snapshotter_;
  Mutex snapshot_mu_;  // one snapshot at a time
  std::atomic<uint64_t> iterations_since_snapshot_{0};
};

}  // namespace salus::server
