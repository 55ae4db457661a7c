// SessionManager: the daemon's sessions, from CreateSession to close.
//
// create: build the runtime (compile the model, or the synthetic profile) → admission via
// the executor's engine (admitted, or WAITING in the admission queue) → iterations, each
// validated here and queued on the executor; its reply goes out when the lane worker is done
// → close (explicit, lease expiry of the owning client, admission timeout, or drain).
//
// Ownership: a session and a shared buffer belong to the client (ClientRegistry) that made
// them; a request from any other client that names one gets NOT_FOUND, worded exactly as for
// an id that does not exist. Session ids are random (53 bits, so they survive any JSON
// reader), not a sequence. When the registry forgets a client (its lease ran out), the server
// calls CloseClient: its sessions close and its buffers go, which frees its memory and wakes
// the admission queue; an iteration in flight finishes first (a lane is never interrupted
// mid-iteration). The session, persistent-memory and buffer quotas are enforced here, and so
// are the terms of an allocation a client acts for (its class, priorities and memory budget:
// Note [Allocations] in allocation_registry.cc).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/clock.h"
#include "common/thread_annotations.h"
#include "salus/v1/snapshot.pb.h"
#include "sched/executor.h"
#include "server/allocation_registry.h"
#include "server/client_registry.h"
#include "server/limits.h"
#include "server/rpc_frontend.h"
#include "server/session_runtime.h"
#include "server/shared_buffer.h"

namespace salus::server {

class Metrics;

class SessionManager {
 public:
  // Compiles a model; for the engine's device `device` when the session is pinned to one.
  using ModelFactory = std::function<StatusOr<std::unique_ptr<SessionRuntime>>(
      const v1::ModelSpec&, std::optional<size_t> device)>;

  struct Options {
    sched::Executor* executor = nullptr;
    bool host_accessible = true;  // the arena's memory may be touched by the host
    ModelFactory model_factory;   // null: model sessions are UNIMPLEMENTED
    Metrics* metrics = nullptr;   // optional
    // The allocations clients may act for; null: a client of an allocation cannot open
    // sessions (FAILED_PRECONDITION).
    AllocationRegistry* allocations = nullptr;
    Quotas quotas;
    Limits limits;
    // Asked after an iteration fails on the engine's device `device`: whether it survived (a
    // GPU fault can corrupt its context). Null: no device can be lost (the CPU).
    std::function<Status(size_t device)> device_health;
    // Called on the lane worker after each iteration that ran (not state-only requests);
    // null: nothing to tell. Must not block.
    std::function<void()> iteration_done;
    // This start of the daemon (salus.v1.HelloReply.server_instance).
    uint64_t instance = 0;
  };

  explicit SessionManager(Options options) : o_(std::move(options)) {}

  StatusOr<v1::CreateSessionReply> Create(const ClientRef& owner, const v1::CreateSession& req)
      EXCLUDES(mu_);
  // Validates and queues one iteration of one of `owner`'s sessions; the Call is answered
  // exactly once, now (on error) or when the iteration ends.
  void Run(Call call, const ClientRef& owner) EXCLUDES(mu_);
  // Closes one of `owner`'s sessions; an administrator (`any_owner`) may close anyone's.
  Status Close(const ClientRef& owner, uint64_t session, bool any_owner = false) EXCLUDES(mu_);
  // Shared buffers (see salus.v1.RegisterBuffer): owned by the client, dropped with it.
  // `caller_uid` is the Unix user of the connection that asks, where the transport knows it
  // (ipc); a buffer is mapped only when it is that user's own (Note [Whose buffer]).
  StatusOr<uint64_t> RegisterBuffer(const ClientRef& owner, const v1::RegisterBuffer& req,
                                    std::optional<uid_t> caller_uid) EXCLUDES(mu_);
  Status UnregisterBuffer(const ClientRef& owner, uint64_t buffer_id) EXCLUDES(mu_);
  size_t BufferCount() const EXCLUDES(mu_);
  // Host memory the sessions hold outside the arena (SessionRuntime::host_bytes), with the
  // compilations in progress.
  uint64_t HostBytes() const EXCLUDES(mu_);
  // Closes the sessions and drops the buffers of a client the registry forgot; returns how
  // many sessions closed. `event` is what each closed session logs.
  size_t CloseClient(uint64_t client, std::string_view event = "lease_expired") EXCLUDES(mu_);
  // Closes every session (drain).
  void CloseAll() EXCLUDES(mu_);

  // What `viewer` may see: its own sessions in full and the others' as totals; with a null
  // viewer (an administrator) every session in full.
  v1::ListSessionsReply List(const ClientRef* viewer) const EXCLUDES(mu_);
  // Ids of the sessions `client` owns.
  std::vector<uint64_t> SessionsOf(uint64_t client) const EXCLUDES(mu_);
  size_t Count() const EXCLUDES(mu_);

  // Snapshots (Note [Restarts] in server/snapshot.cc). A session as a snapshot keeps it.
  struct SavedSession {
    v1::SnapshotSession session;  // its state file's name and digest still unset
    std::string state;            // its state values' bytes, in session.state order
  };
  // Every session's spec and iteration count, and its persistent state read at an iteration
  // boundary after the iterations queued before (each session's read waits for those; all of
  // them together wait at most `timeout`). A session it cannot save is left out, with why in
  // *skipped ("session N (name): ..."). Call it while the daemon takes no new work.
  std::vector<SavedSession> Save(Nanos timeout, std::vector<std::string>* skipped) EXCLUDES(mu_);
  // Recreates a saved session for `owner` (a restored client) with its id and iteration
  // count, compiled for the device the daemon has now, and queues the write of `state` before
  // anything else the session runs. A session whose state write fails answers each later
  // request with that error.
  // `complete`: the snapshot holds every iteration its clients had answered (a drain's);
  // otherwise the session refuses iterations from clients that have not heard of the restart
  // (Note [Rewound sessions] in session_manager.cc).
  Status Restore(const ClientRef& owner, const v1::SnapshotSession& saved, std::string state,
                 bool complete) EXCLUDES(mu_);

  // Engine callbacks (wired by the server).
  void OnAdmitted(uint64_t session, uint64_t lane) EXCLUDES(mu_);
  void OnAdmissionFailed(uint64_t session, const Status& status) EXCLUDES(mu_);

 private:
  struct Entry {
    uint64_t id = 0;
    std::string name;
    uint64_t client = 0;
    std::string client_name;  // public
    std::string allocation;   // the allocation its P+E is charged to; empty: none
    int32_t priority = 0;
    v1::LatencyClass latency_class = v1::LATENCY_BATCH;
    int64_t iterations_declared = 0;
    std::string job;  // CreateSession.job; empty: none
    // Its CreateSession, kept for a snapshot (the model's bytes with it).
    std::shared_ptr<const v1::CreateSession> create;
    // runtime->host_bytes() and `create`'s bytes, counted against the host_bytes limits
    uint64_t host_bytes = 0;
    std::unique_ptr<SessionRuntime> runtime;
    // An iteration that failed after its reply (RunIteration.reply_when_fetched): the
    // session's next request fails with it, once.
    Mutex late_mu;
    Status late_error GUARDED_BY(late_mu);
    // Its state could not be restored from a snapshot: every later request fails with it.
    Status restore_error GUARDED_BY(late_mu);
    // Restored from a snapshot written while the daemon served, at this iteration (Note
    // [Rewound sessions] in session_manager.cc); set before anyone can reach it.
    std::optional<int64_t> rewound_at;
  };
  // A session taken up from a snapshot: its id and the iterations it ran.
  struct Resumed {
    uint64_t id = 0;
    int64_t iterations_done = 0;
  };
  // Create, and Restore's creation with the id and count of `resumed`.
  StatusOr<v1::CreateSessionReply> Add(const ClientRef& owner, const v1::CreateSession& req,
                                       const Resumed* resumed) EXCLUDES(mu_);

  // After an iteration failed on the engine's device `device`: checks the device; when it is
  // lost, takes it out of service (Engine::SetDeviceLost) and returns the status every
  // session on it gets from now on; otherwise returns `iteration`.
  Status CheckDevice(const Status& iteration, size_t device);
  // `owner`'s session `id`, or NOT_FOUND (the same for a session that is someone else's).
  StatusOr<std::shared_ptr<Entry>> Owned(const ClientRef& owner, uint64_t id) const EXCLUDES(mu_);
  // Removes session `id`, whoever owns it.
  Status Remove(uint64_t id) EXCLUDES(mu_);
  // A fresh random session id.
  uint64_t NewSessionId() REQUIRES(mu_);
  // Host bytes of `client`'s sessions (every session's with kAll).
  uint64_t HostBytesOf(uint64_t client) const REQUIRES(mu_);
  // The engine's id of `client`'s job `name` (Note [Jobs] in src/sched/admission_rules.cc),
  // counting one more session of it; 0 for no job.
  uint64_t JoinJob(uint64_t client, const std::string& name) REQUIRES(mu_);
  // One session of the job fewer; it is forgotten with its last session.
  void LeaveJob(uint64_t client, const std::string& name) REQUIRES(mu_);
  static constexpr uint64_t kAll = 0;
  // The runtime of a CreateSession, compiled with `reserved` host bytes counted meanwhile.
  StatusOr<std::unique_ptr<SessionRuntime>> BuildRuntime(const ClientRef& owner,
                                                         const v1::CreateSession& req,
                                                         std::optional<size_t> pinned)
      EXCLUDES(mu_);
  // Gives back what session `entry` charged to its allocation, if anything.
  void ReleaseCharge(const Entry& entry);

  Options o_;
  mutable Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Entry>> sessions_ GUARDED_BY(mu_);
  uint64_t next_buffer_id_ GUARDED_BY(mu_) = 1;
  uint64_t compiling_host_bytes_ GUARDED_BY(mu_) = 0;  // reserved by compilations under way
  uint64_t mapped_bytes_ GUARDED_BY(mu_) = 0;          // all shared buffers' bytes
  // Live jobs by (client, name): the engine's job id and how many sessions it has.
  struct Job {
    uint64_t id = 0;
    size_t sessions = 0;
  };
  std::map<std::pair<uint64_t, std::string>, Job> jobs_ GUARDED_BY(mu_);
  uint64_t next_job_ GUARDED_BY(mu_) = 1;
  // A feed in a shared buffer: checked against the buffer, which joins `buffers` (distinct).
  StatusOr<HostTensor> ResolveSlice(uint64_t client, const v1::TensorSpec& spec,
                                    std::vector<std::shared_ptr<SharedBuffer>>* buffers)
      EXCLUDES(mu_);
  // Each client's shared buffers, by id.
  std::unordered_map<uint64_t, std::map<uint64_t, std::shared_ptr<SharedBuffer>>> buffers_
      GUARDED_BY(mu_);
};

}  // namespace salus::server
