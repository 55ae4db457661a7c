// SessionManager: the daemon's sessions, from CreateSession to close.
//
// create: build the runtime (compile the model, or the synthetic profile) → admission via
// the executor's engine (admitted, or WAITING in the admission queue) → iterations, each
// validated here and queued on the executor; its reply goes out when the lane worker is done
// → close (explicit, lease expiry of the owning client, admission timeout, or drain).
//
// Leases: a session belongs to the client (ZeroMQ peer) that created it. Any request from
// that peer renews its lease; a peer silent for longer than the lease, with no iteration of
// its own queued or running, loses its sessions, so a client that dies frees its memory and
// wakes the admission queue. (A client blocked on a long iteration or on admission sends
// nothing, but is not silent: it is owed a reply.) An iteration in flight
// when that happens finishes first (the lane is never interrupted mid-iteration).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/clock.h"
#include "common/thread_annotations.h"
#include "sched/executor.h"
#include "server/rpc_frontend.h"
#include "server/session_runtime.h"
#include "server/shared_buffer.h"

namespace salus::server {

class Metrics;

class SessionManager {
 public:
  using ModelFactory =
      std::function<StatusOr<std::unique_ptr<SessionRuntime>>(const v1::ModelSpec&)>;

  struct Options {
    sched::Executor* executor = nullptr;
    const Clock* clock = nullptr;
    Nanos lease{std::chrono::seconds(30)};
    bool host_accessible = true;  // the arena's memory may be touched by the host
    ModelFactory model_factory;   // null: model sessions are UNIMPLEMENTED
    Metrics* metrics = nullptr;   // optional
    // Asked after an iteration fails: whether the device survived (a GPU fault can corrupt
    // its context). Null: the device cannot be lost (the CPU).
    std::function<Status()> device_health;
  };

  explicit SessionManager(Options options) : o_(std::move(options)) {}

  StatusOr<v1::CreateSessionReply> Create(const std::string& client, const v1::CreateSession& req)
      EXCLUDES(mu_);
  // Validates and queues one iteration; the Call is answered exactly once, now (on error) or
  // when the iteration ends.
  void Run(Call call) EXCLUDES(mu_);
  Status Close(uint64_t session) EXCLUDES(mu_);
  // Shared buffers (see salus.v1.RegisterBuffer): owned by the client, dropped with its lease.
  StatusOr<uint64_t> RegisterBuffer(const std::string& client, const v1::RegisterBuffer& req)
      EXCLUDES(mu_);
  Status UnregisterBuffer(const std::string& client, uint64_t buffer_id) EXCLUDES(mu_);
  size_t BufferCount() const EXCLUDES(mu_);
  // Renews the client's lease.
  void Touch(const std::string& client) EXCLUDES(mu_);
  // Closes the sessions of clients whose lease expired; returns how many sessions closed.
  size_t ExpireLeases() EXCLUDES(mu_);
  // Closes every session (drain).
  void CloseAll() EXCLUDES(mu_);

  // Set once the device is lost: every later iteration and model session is refused with it.
  Status DeviceLost() const EXCLUDES(mu_);

  std::vector<v1::SessionInfo> List() const EXCLUDES(mu_);
  size_t Count() const EXCLUDES(mu_);

  // Engine callbacks (wired by the server).
  void OnAdmitted(uint64_t session, uint64_t lane) EXCLUDES(mu_);
  void OnAdmissionFailed(uint64_t session, const Status& status) EXCLUDES(mu_);

 private:
  struct Entry {
    uint64_t id = 0;
    std::string name;
    std::string client;
    int32_t priority = 0;
    v1::LatencyClass latency_class = v1::LATENCY_BATCH;
    int64_t iterations_declared = 0;
    std::unique_ptr<SessionRuntime> runtime;
  };

  // After a failed iteration: checks the device; when it is lost, records that (once) and
  // returns the status every session gets from now on; otherwise returns `iteration`.
  Status CheckDevice(const Status& iteration) EXCLUDES(mu_);

  Options o_;
  mutable Mutex mu_;
  Status device_lost_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Entry>> sessions_ GUARDED_BY(mu_);
  struct ClientLease {
    Nanos last_seen{0};
    int in_flight = 0;  // iterations queued or running: a client waiting on them is alive
    std::map<uint64_t, std::shared_ptr<SharedBuffer>> buffers;
  };
  uint64_t next_buffer_id_ GUARDED_BY(mu_) = 1;
  void IterationEnded(const std::string& client) EXCLUDES(mu_);
  // A feed in a shared buffer: checked against the buffer, which joins `buffers` (distinct).
  StatusOr<HostTensor> ResolveSlice(const std::string& client, const v1::TensorSpec& spec,
                                    std::vector<std::shared_ptr<SharedBuffer>>* buffers)
      EXCLUDES(mu_);
  std::unordered_map<std::string, ClientLease> clients_ GUARDED_BY(mu_);
};

}  // namespace salus::server
