// The C++ client of salus-server.
//
//   auto client = salus::client::Client::Connect("tcp://127.0.0.1:5501");
//   salus::client::SessionOptions o;
//   o.model = ReadFile("mlp.onnx");
//   o.mode = salus::client::Mode::kTrain;
//   o.inputs = {{"x", {64, 784}}, {"labels", {64}}};
//   o.loss = "loss";
//   o.optimizer.lr = 0.1;
//   auto session = (*client)->CreateSession(o);
//   auto out = (*session)->Run({x, labels}, {"loss"});
//
// Every call returns a Status: the daemon's error (its canonical code and message) or a
// transport failure (UNAVAILABLE, DEADLINE_EXCEEDED). A Client is thread-safe; calls are
// serialised on its one connection. While it lives it renews its lease, so the daemon keeps
// its sessions; when the process dies the daemon frees them after the lease. Its sessions and
// shared buffers are its own: no other client can use, close or list them.
//
// A daemon reached over a remote (CURVE) endpoint needs Options::server_key and the client's
// own secret key (Options::secret_key, or $SALUS_CURVE_SERVER_KEY and $SALUS_CURVE_SECRET_KEY).
// In a pod whose node's device plugin granted it an allocation, the client acts for it
// (Options::allocation_token, or $SALUS_ALLOCATION_TOKEN): its sessions take the allocation's
// class, priority and memory budget.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "salus/status.h"

namespace salus::client {

enum class DType { kFloat32 = 1, kInt64 = 2, kInt32 = 3, kFloat64 = 4, kUInt8 = 5, kBool = 6 };
size_t DTypeSize(DType dtype);

class SharedBuffer;

// A tensor's bytes travel in `data`, or (feeds only) lie in a SharedBuffer at an offset.
struct Tensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
  uint64_t buffer_id = 0;  // non-zero: the bytes are in that shared buffer, not in data
  uint64_t buffer_offset = 0;

  static Tensor Floats(std::string name, std::vector<int64_t> shape, const std::vector<float>& v);
  static Tensor Int64s(std::string name, std::vector<int64_t> shape, const std::vector<int64_t>& v);
  // A feed whose dtype × shape bytes the caller placed in `buffer` at `offset`.
  static Tensor InBuffer(std::string name, DType dtype, std::vector<int64_t> shape,
                         const SharedBuffer& buffer, uint64_t offset = 0);
  const float* floats() const { return reinterpret_cast<const float*>(data.data()); }
  const int64_t* int64s() const { return reinterpret_cast<const int64_t*>(data.data()); }
  size_t num_elements() const;
};

// What a tensor of a session is: its name, dtype and shape (CreateSession's reply lists them).
struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

enum class Mode { kTrain, kInfer };

struct Optimizer {
  std::string type = "sgd";  // "sgd" or "adam"
  double lr = 0.01;
  double momentum = 0;
  bool nesterov = false;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
};

struct Synthetic {
  uint64_t persistent_bytes = 0;
  uint64_t ephemeral_bytes = 0;
  double iteration_seconds = 0;
};

struct SessionOptions {
  // Either a model (ONNX bytes in `model`, or a TensorFlow graph in `tf_graph`) or a
  // synthetic profile.
  std::string model;
  // A serialized tensorflow.GraphDef (as the TensorFlow adaptor captures it), with `model`
  // empty. It runs as written (its own gradients and updates): `mode`, `loss` and `optimizer`
  // are not used; `inputs` gives every Placeholder's shape and `outputs` the tensors
  // ("node:k") iterations may fetch.
  std::string tf_graph;
  std::vector<std::string> outputs;
  std::optional<Synthetic> synthetic;
  Mode mode = Mode::kTrain;
  std::map<std::string, std::vector<int64_t>> inputs;
  std::string loss;
  Optimizer optimizer;
  // On a GPU, let convolutions take cuDNN's FFT and Winograd algorithms: faster for larger
  // batches, a larger E (ModelSpec.convolution_transforms). Ignored on the CPU.
  bool convolution_transforms = false;
  int64_t iterations = 0;       // declared length, 0: undeclared
  double duration_seconds = 0;  // declared length, 0: undeclared
  int32_t priority = 0;
  // Interactive sessions get lanes of their own (never shared with batch sessions).
  bool interactive = false;
  std::string name;
  double admission_timeout_seconds = 0;  // 0: wait as long as it takes
  // The job it belongs to (salus.v1.CreateSession.job): this client's sessions of one job
  // name take turns and are admitted as one. Empty: a job of its own.
  std::string job;
};

struct IterationStats {
  uint64_t iteration = 0;
  uint64_t lane = 0;
  double queue_delay_us = 0;
  double run_us = 0;
  double switch_gap_us = 0;
  // Replied when its fetches were ready, before the iteration ended (reply_when_fetched):
  // run_us is the time up to the reply.
  bool early = false;
};

struct ServerInfo {
  uint32_t protocol_version = 0;
  std::string server_version, device, policy, client_id;
  std::string role;  // "user" or "admin"
  // who the daemon authenticated: "uid:1000", "curve:<key>", "tcp:<ip>", or "alloc:<id>" for
  // a client of an allocation
  std::string principal;
  std::string allocation;  // the allocation this client acts for; empty: none

  uint64_t capacity_bytes = 0;
  uint64_t lease_ms = 0;
};

struct SessionInfo {
  uint64_t id = 0;
  std::string name, kind, state, client_id;
  std::string device;  // the device it runs on; empty while it waits for any device
  uint64_t lane = 0;
  int32_t priority = 0;
  bool interactive = false;
  uint64_t persistent_bytes = 0, ephemeral_bytes = 0;
  int64_t iterations_done = 0, iterations_declared = 0;
  double avg_iteration_seconds = 0;
  std::string allocation;  // the allocation its client acts for; empty: none
  std::string job;         // SessionOptions::job; empty: none
};

// A share of the daemon its administrator granted (salus.v1.Allocation, without the token).
struct AllocationInfo {
  std::string id;
  uint64_t memory_bytes = 0;  // budget for the P+E of its sessions; 0: none
  bool interactive = false;   // the latency class of its sessions
  int32_t priority = 0;       // its sessions' priority when they ask for none
  int32_t max_priority = 0;   // their ceiling; 0: the daemon's max_priority quota
  std::string pod;            // "namespace/name", or empty
  uint64_t used_bytes = 0;    // P+E of its open sessions
  uint32_t sessions = 0, clients = 0;
};

// Sessions of other clients, as the totals an ordinary client may see.
struct OtherSessions {
  uint64_t sessions = 0, admitted = 0, waiting = 0, persistent_bytes = 0, ephemeral_bytes = 0;
};

class Client;
class Session;

// Memory shared with a daemon on the same host (POSIX shared memory, mapped by both), so feeds
// written into it reach the daemon without travelling through the socket. Create with
// Client::CreateSharedBuffer; refer to its bytes with Tensor::InBuffer. Do not change bytes an
// iteration reads until that iteration's reply has arrived.
class SharedBuffer {
 public:
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  ~SharedBuffer();  // unregisters it (best effort; not with a daemon that is gone) and unmaps it
  uint64_t id() const { return id_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  friend class Client;
  SharedBuffer(Client* client, uint64_t id, std::byte* data, uint64_t size)
      : client_(client), id_(id), data_(data), size_(size) {}
  Client* client_;
  uint64_t id_;
  std::byte* data_;
  uint64_t size_;
  bool forgotten_ = false;  // the daemon that had it restarted: nothing to unregister
};

// An iteration handed to Session::Submit and not yet collected. It keeps its feeds alive until
// the server has them (they are sent without a copy). Wait collects the outputs, once;
// destroying it uncollected waits for the reply and drops it. It must not outlive its Session
// (nor a Session its Client).
class PendingIteration {
 public:
  PendingIteration(const PendingIteration&) = delete;
  PendingIteration& operator=(const PendingIteration&) = delete;
  ~PendingIteration();
  uint64_t request_id() const { return request_id_; }
  // The fetched tensors, or the iteration's error. Updates the session's last_stats().
  StatusOr<std::map<std::string, Tensor>> Wait();

 private:
  friend class Session;
  PendingIteration(Session* session, std::vector<Tensor> feeds)
      : session_(session), feeds_(std::move(feeds)) {}
  Session* session_;
  std::vector<Tensor> feeds_;
  // What sends it again should the daemon refuse it while it restarts.
  std::vector<std::string> fetches_;
  bool reply_when_fetched_ = false;
  uint64_t instance_ = 0;  // the daemon's instance it was sent to
  uint64_t request_id_ = 0;
  int stage_ = -1;  // the staging buffer its large feeds were copied into, if any
  bool waited_ = false;
};

class Session {
 public:
  ~Session();
  uint64_t id() const { return id_; }
  bool admitted() const { return admitted_; }  // at creation; false: it was queued
  uint64_t persistent_bytes() const { return p_; }
  uint64_t ephemeral_bytes() const { return e_; }
  // What Run feeds and may fetch (model sessions).
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  // The persistent values (parameters, optimizer state, variables) the session's state I/O
  // can write and read: as feeds and fetches of Run, or with SyncState.
  const std::vector<TensorSpec>& state() const { return state_; }
  // One iteration (waits for admission first when the session is queued). With
  // `reply_when_fetched`, returns as soon as the fetches are computed, where the daemon's
  // device tells: a training step's loss after its forward pass, while the rest of the step
  // runs. The session's later requests still follow the whole iteration, and an error in that
  // rest fails the next one (salus.v1.RunIteration.reply_when_fetched).
  StatusOr<std::map<std::string, Tensor>> Run(const std::vector<Tensor>& feeds = {},
                                              const std::vector<std::string>& fetches = {},
                                              bool reply_when_fetched = false);
  // Queues one iteration and returns at once, so the next iteration's feeds travel while
  // this one runs. A session's iterations run in submission order; Wait on each in turn.
  StatusOr<std::unique_ptr<PendingIteration>> Submit(std::vector<Tensor> feeds = {},
                                                     std::vector<std::string> fetches = {},
                                                     bool reply_when_fetched = false);
  // Writes the state values in `writes`, then reads those named in `reads`, with no
  // iteration: queued behind the session's iterations (never racing one), and not counted as
  // one. A session that never ran gets its initial state first. Leaves last_stats() alone.
  StatusOr<std::map<std::string, Tensor>> SyncState(const std::vector<Tensor>& writes,
                                                    const std::vector<std::string>& reads = {});
  const IterationStats& last_stats() const { return stats_; }
  Status Close();

 private:
  friend class Client;
  friend class PendingIteration;
  Session(Client* client, uint64_t id) : client_(client), id_(id) {}
  // Sends a RunIteration whose frames point at `feeds` (which must outlive the send). Feeds
  // of Options::stage_feeds_from bytes or more are copied into a staging buffer first; its
  // index goes to *stage (-1: none), to be released once the reply is collected.
  // `instance`: the daemon instance to name (RunIteration.server_instance); 0: the client's.
  StatusOr<uint64_t> Send(const std::vector<Tensor>& feeds, const std::vector<std::string>& fetches,
                          int* stage, bool state_only = false, bool reply_when_fetched = false,
                          uint64_t instance = 0);
  StatusOr<std::map<std::string, Tensor>> Collect(uint64_t request_id, bool update_stats = true);
  // Send and Collect, sending it again while the daemon refuses it because it restarts
  // (Client::AfterRefusal), naming the daemon instance it was first sent to (0: the client's).
  StatusOr<std::map<std::string, Tensor>> Exchange(const std::vector<Tensor>& feeds,
                                                   const std::vector<std::string>& fetches,
                                                   bool state_only, bool reply_when_fetched,
                                                   uint64_t instance = 0);
  Client* client_;
  uint64_t id_;
  bool admitted_ = false;
  bool closed_ = false;
  uint64_t p_ = 0, e_ = 0;
  std::vector<TensorSpec> inputs_, outputs_, state_;
  IterationStats stats_;
};

class Client {
 public:
  struct Options {
    std::string name = "cpp";
    // Control requests fail with DEADLINE_EXCEEDED after this; iterations wait as long as
    // they take.
    std::chrono::milliseconds timeout{30000};
    // Feeds of this many bytes or more are copied into shared memory this client owns and the
    // daemon maps, instead of travelling through the socket, when the daemon can map it (same
    // host, readable by its user); otherwise, and with 0, every feed travels in a frame.
    uint64_t stage_feeds_from = 64 << 10;
    // Staging buffers at most, one per iteration in flight; more in flight use frames.
    int max_staging_buffers = 4;
    // CURVE, for a daemon's remote endpoint: the daemon's public key and this client's secret
    // key, each a Z85 key or the path of a key file (`salusctl keygen`). Empty: for a tcp
    // endpoint, from $SALUS_CURVE_SERVER_KEY and $SALUS_CURVE_SECRET_KEY; with a server key but
    // no secret key the client makes a key pair of its own (enough for a daemon in open mode).
    std::string server_key, secret_key;
    // An allocation's token (Note [Allocations] in the daemon): the client acts for that
    // allocation. Empty: $SALUS_ALLOCATION_TOKEN, if set.
    std::string allocation_token;
    // How long an iteration the daemon refused because it drains waits for the daemon to come
    // back (a restart that restores its snapshot: docs/operations.md, Restarts) before it is
    // sent again; past it, or when the daemon came back without this client's sessions, the
    // iteration fails with a clear error. Negative: $SALUS_RECONNECT_SECONDS, else 300 s;
    // 0: fail at once.
    std::chrono::milliseconds reconnect{-1};
  };
  // An empty endpoint is the daemon every client finds by default: $SALUS_ENDPOINT, else a
  // local daemon's ipc socket, else tcp://127.0.0.1:5501 (Note [Default endpoint]).
  static StatusOr<std::unique_ptr<Client>> Connect(const std::string& endpoint);
  static StatusOr<std::unique_ptr<Client>> Connect(const std::string& endpoint, Options options);
  ~Client();

  const ServerInfo& server() const;
  StatusOr<std::unique_ptr<Session>> CreateSession(const SessionOptions& options);
  // This client's sessions (an administrator's: every session), and the others' totals.
  StatusOr<std::vector<SessionInfo>> ListSessions(OtherSessions* others = nullptr);
  StatusOr<std::string> StatsJson();
  StatusOr<std::string> MemoryMapJson();
  // Closes a session by id: one of this client's, or as the administrator anyone's.
  Status CloseSession(uint64_t session_id);
  // Moves a session, between its iterations, to the daemon's device `device` ("cpu:1",
  // "cuda:1"); the administrator only. Returns the devices it left and went to.
  StatusOr<std::pair<std::string, std::string>> MoveSession(uint64_t session_id,
                                                            const std::string& device);
  // Drains the daemon (the administrator only); with `snapshot_dir`, it writes a snapshot of
  // the sessions there first, for `salus-server --restore` (salus.v1.Drain).
  Status Drain(const std::string& snapshot_dir = "");
  // Allocations (the administrator only, PERMISSION_DENIED otherwise): every allocation with
  // its usage; grant (true: created, false: updated; an empty token keeps the one it has);
  // revoke, which closes its clients' sessions and returns how many.
  StatusOr<std::vector<AllocationInfo>> ListAllocations();
  StatusOr<bool> GrantAllocation(const AllocationInfo& allocation, const std::string& token);
  StatusOr<uint32_t> RevokeAllocation(const std::string& id);
  // A shared buffer of `bytes` (the daemon must run on this host and be able to read this
  // user's shared memory: NOT_FOUND or PERMISSION_DENIED otherwise). Outlived by the Client.
  StatusOr<std::unique_ptr<SharedBuffer>> CreateSharedBuffer(uint64_t bytes);
  // Whether large feeds are staged in shared memory: true until the daemon refuses a buffer.
  bool staging() const;
  // Staging buffers this client holds (busy or free).
  size_t staging_buffers() const;

  struct Impl;

 private:
  friend class Session;
  friend class PendingIteration;
  friend class SharedBuffer;
  explicit Client(std::unique_ptr<Impl> impl);
  // Called with the error an iteration sent to daemon instance `submitted_to` got: OK when it
  // should be sent again (the daemon restarted since, or drained and is back), else the error
  // to return (`error` itself, or why the daemon did not come back).
  Status AfterRefusal(const Status& error, uint64_t submitted_to);
  // The daemon is new instance `instance`, which restored this client: its staging buffers
  // are gone there, so they are dropped here without a word to it.
  void Restarted(uint64_t instance);
  // A free staging buffer of at least `bytes`, marked busy with its index in *index, or
  // null: use frames.
  SharedBuffer* AcquireStage(uint64_t bytes, int* index);
  void ReleaseStage(int index);
  std::unique_ptr<Impl> impl_;
};

}  // namespace salus::client
