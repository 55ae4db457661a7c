#include "salus/client.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/curve_keys.h"
#include "common/endpoints.h"
#include "common/version.h"
#include "salus/v1/data_type.h"
#include "salus/v1/salus.pb.h"

namespace salus::client {
namespace {

// Heartbeats go out this many times per lease.
constexpr int kBeatsPerLease = 3;

// The public DType is the wire's DataType without protobuf in the header.
v1::DataType ToWire(DType d) { return static_cast<v1::DataType>(static_cast<int>(d)); }
static_assert(static_cast<int>(DType::kFloat32) == v1::FLOAT32 &&
              static_cast<int>(DType::kInt64) == v1::INT64 &&
              static_cast<int>(DType::kInt32) == v1::INT32 &&
              static_cast<int>(DType::kFloat64) == v1::FLOAT64 &&
              static_cast<int>(DType::kUInt8) == v1::UINT8 &&
              static_cast<int>(DType::kBool) == v1::BOOL);

Status FromWire(const v1::Status& s) {
  if (s.code() < 0 || s.code() > 16) return UnknownError(s.message());
  return Status(static_cast<StatusCode>(s.code()), s.message());
}

std::vector<TensorSpec> FromWire(const google::protobuf::RepeatedPtrField<v1::TensorSpec>& specs) {
  std::vector<TensorSpec> out;
  out.reserve(specs.size());
  for (const v1::TensorSpec& s : specs) {
    out.push_back({s.name(), static_cast<DType>(s.dtype()), {s.shape().begin(), s.shape().end()}});
  }
  return out;
}

}  // namespace

size_t DTypeSize(DType d) { return v1::DataTypeSize(ToWire(d)); }

size_t Tensor::num_elements() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

Tensor Tensor::Floats(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
  Tensor t{std::move(name), DType::kFloat32, std::move(shape), {}};
  t.data.resize(v.size() * sizeof(float));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

Tensor Tensor::Int64s(std::string name, std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  Tensor t{std::move(name), DType::kInt64, std::move(shape), {}};
  t.data.resize(v.size() * sizeof(int64_t));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

Tensor Tensor::InBuffer(std::string name, DType dtype, std::vector<int64_t> shape,
                        const SharedBuffer& buffer, uint64_t offset) {
  Tensor t{std::move(name), dtype, std::move(shape), {}};
  t.buffer_id = buffer.id();
  t.buffer_offset = offset;
  return t;
}

struct Client::Impl {
  std::string endpoint;
  Options options;
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
  std::mutex mu;  // serialises requests on the socket
  uint64_t next_id = 1;
  ServerInfo server;
  std::string token;                       // from Hello, on every later request
  std::atomic<uint64_t> instance{0};       // the daemon's (HelloReply.server_instance)
  std::chrono::milliseconds reconnect{0};  // Options::reconnect, resolved
  std::thread heartbeat;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop = false;

  // Replies that arrived for requests other than the one being waited for, by request id.
  std::map<uint64_t, std::pair<v1::Reply, std::vector<zmq::message_t>>> stash;
  std::set<uint64_t> outstanding;  // sent, reply not yet taken; others' replies are stale

  using Answer = std::pair<v1::Reply, std::vector<zmq::message_t>>;

  // Staging buffers (Note [Staged feeds]); indices are stable, a slot's buffer may be
  // replaced by a larger one while it is free.
  struct Stage {
    std::unique_ptr<SharedBuffer> buffer;
    bool busy = false;
  };
  std::mutex stage_mu;  // never held while waiting for a reply other than a buffer's own
  std::vector<Stage> stages;
  std::atomic<bool> staging_refused{false};

  // Sends one request; its reply is collected with Await.
  StatusOr<uint64_t> Send(v1::Request req, std::vector<zmq::message_t> frames) {
    std::lock_guard<std::mutex> lock(mu);
    req.set_request_id(next_id++);
    if (!token.empty()) req.set_client_token(token);
    std::string bytes;
    req.SerializeToString(&bytes);
    std::vector<zmq::message_t> msg;
    msg.reserve(frames.size() + 1);
    msg.emplace_back(bytes.data(), bytes.size());
    for (auto& f : frames) msg.push_back(std::move(f));
    try {
      zmq::send_multipart(sock, msg);
    } catch (const zmq::error_t& e) {
      return UnavailableError(fmt::format("talking to {}: {}", endpoint, e.what()));
    }
    outstanding.insert(req.request_id());
    return req.request_id();
  }

  // Waits for the reply to request `id` (forever when wait is empty), keeping replies to
  // other outstanding requests for their own Await. The reply's status becomes the result.
  StatusOr<Answer> Await(uint64_t id, std::optional<std::chrono::milliseconds> wait) {
    std::lock_guard<std::mutex> lock(mu);
    auto take = [&](Answer a) -> StatusOr<Answer> {
      outstanding.erase(id);
      SALUS_RETURN_IF_ERROR(FromWire(a.first.status()));
      return a;
    };
    const auto deadline = std::chrono::steady_clock::now() + wait.value_or(std::chrono::hours(0));
    try {
      while (true) {
        if (auto it = stash.find(id); it != stash.end()) {
          Answer a = std::move(it->second);
          stash.erase(it);
          return take(std::move(a));
        }
        if (wait) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
              deadline - std::chrono::steady_clock::now());
          zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
          if (left.count() <= 0 || zmq::poll(&item, 1, left) == 0) {
            outstanding.erase(id);  // a late reply is dropped
            return DeadlineExceededError(
                fmt::format("no reply from {} within {} ms", endpoint, wait->count()));
          }
        }
        std::vector<zmq::message_t> parts;
        if (!zmq::recv_multipart(sock, std::back_inserter(parts)) || parts.empty()) continue;
        v1::Reply reply;
        if (!reply.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size()))) {
          outstanding.erase(id);
          return DataLossError("the server's reply does not parse");
        }
        parts.erase(parts.begin());
        const uint64_t rid = reply.request_id();
        // 0: the server could not read an envelope at all; it answers the oldest request.
        if (rid == id || (rid == 0 && !outstanding.empty() && *outstanding.begin() == id)) {
          return take({std::move(reply), std::move(parts)});
        }
        if (outstanding.count(rid) != 0) {
          stash.emplace(rid, Answer{std::move(reply), std::move(parts)});
        }
        // Anything else answers a request that timed out: dropped.
      }
    } catch (const zmq::error_t& e) {
      outstanding.erase(id);
      return UnavailableError(fmt::format("talking to {}: {}", endpoint, e.what()));
    }
  }

  StatusOr<Answer> Call(v1::Request req, std::vector<zmq::message_t> frames,
                        std::optional<std::chrono::milliseconds> wait) {
    SALUS_ASSIGN_OR_RETURN(uint64_t id, Send(std::move(req), std::move(frames)));
    return Await(id, wait);
  }

  StatusOr<v1::Reply> Control(v1::Request req) {
    SALUS_ASSIGN_OR_RETURN(auto r, Call(std::move(req), {}, options.timeout));
    return std::move(r.first);
  }

  // One Heartbeat, answered within `wait`.
  StatusOr<v1::HeartbeatReply> Heartbeat(std::chrono::milliseconds wait) {
    v1::Request req;
    req.mutable_heartbeat();
    SALUS_ASSIGN_OR_RETURN(auto r, Call(std::move(req), {}, wait));
    return std::move(*r.first.mutable_heartbeat());
  }

  void Beat(std::chrono::milliseconds period) {
    std::unique_lock<std::mutex> lock(stop_mu);
    while (!stop_cv.wait_for(lock, period, [this] { return stop; })) {
      lock.unlock();
      // A request in flight keeps the lease alive by itself; only beat when idle.
      std::unique_lock<std::mutex> busy(mu, std::try_to_lock);
      if (busy.owns_lock()) {
        busy.unlock();
        Heartbeat(options.timeout).status().IgnoreError();
      }
      lock.lock();
    }
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  {
    std::lock_guard<std::mutex> lock(impl_->stage_mu);
    impl_->stages.clear();  // unregisters them while the socket is still open
  }
  {
    std::lock_guard<std::mutex> lock(impl_->stop_mu);
    impl_->stop = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
  impl_->sock.close();
}

StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& endpoint) {
  return Connect(endpoint, Options{});
}

namespace {

// Sets the CURVE options on `sock` when the options, or for a tcp endpoint the environment,
// give a server key (an ipc endpoint never speaks CURVE).
Status ConfigureCurve(zmq::socket_t& sock, const std::string& endpoint, const Client::Options& o) {
  const bool tcp = endpoint.rfind("tcp://", 0) == 0;
  auto from_env = [tcp](const std::string& given, const char* var) {
    const char* v = std::getenv(var);
    return !given.empty() || v == nullptr || !tcp ? given : std::string(v);
  };
  const std::string server = from_env(o.server_key, "SALUS_CURVE_SERVER_KEY");
  const std::string secret = from_env(o.secret_key, "SALUS_CURVE_SECRET_KEY");
  if (server.empty()) {
    if (!secret.empty()) return InvalidArgumentError("a CURVE secret key needs the server's key");
    return OkStatus();
  }
  SALUS_ASSIGN_OR_RETURN(std::string server_key, ResolveKey(server));
  char public_key[kCurveKeyZ85Chars + 1] = {}, secret_key[kCurveKeyZ85Chars + 1] = {};
  if (secret.empty()) {
    if (zmq_curve_keypair(public_key, secret_key) != 0) {
      return UnavailableError(
          fmt::format("cannot make a CURVE key pair: {}", zmq_strerror(zmq_errno())));
    }
  } else {
    SALUS_ASSIGN_OR_RETURN(std::string key, ResolveKey(secret));
    std::memcpy(secret_key, key.data(), kCurveKeyZ85Chars);
    if (zmq_curve_public(public_key, secret_key) != 0) {
      return InvalidArgumentError(
          fmt::format("the CURVE secret key is not usable: {}", zmq_strerror(zmq_errno())));
    }
  }
  try {
    sock.set(zmq::sockopt::curve_serverkey, server_key);
    sock.set(zmq::sockopt::curve_publickey, std::string(public_key));
    sock.set(zmq::sockopt::curve_secretkey, std::string(secret_key));
  } catch (const zmq::error_t& e) {
    return UnavailableError(fmt::format("cannot set up CURVE: {}", e.what()));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& endpoint_or_empty,
                                                  Options options) {
  const std::string endpoint = endpoint_or_empty.empty() ? ClientEndpoint() : endpoint_or_empty;
  auto impl = std::make_unique<Impl>();
  impl->endpoint = endpoint;
  impl->options = options;
  SALUS_RETURN_IF_ERROR(ConfigureCurve(impl->sock, endpoint, options));
  try {
    impl->sock.set(zmq::sockopt::linger, 0);
    impl->sock.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError(fmt::format("cannot connect to '{}': {}", endpoint, e.what()));
  }
  v1::Request req;
  req.mutable_hello()->set_protocol_version(kProtocolVersion);
  req.mutable_hello()->set_client_name(options.name);
  std::string allocation_token = options.allocation_token;
  if (const char* env = std::getenv("SALUS_ALLOCATION_TOKEN");
      allocation_token.empty() && env != nullptr) {
    allocation_token = env;
  }
  req.mutable_hello()->set_allocation_token(allocation_token);
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl->Control(std::move(req)));
  const v1::HelloReply& h = reply.hello();
  ServerInfo& info = impl->server;
  info.protocol_version = h.protocol_version();
  info.server_version = h.server_version();
  info.device = h.device();
  info.policy = h.policy();
  info.client_id = h.client_id();
  info.role = h.role() == v1::ROLE_ADMIN ? "admin" : "user";
  info.principal = h.principal();
  info.allocation = h.allocation();
  info.capacity_bytes = h.capacity_bytes();
  info.lease_ms = h.lease_ms();
  impl->token = h.client_token();
  impl->instance = h.server_instance();
  impl->reconnect = options.reconnect;
  if (impl->reconnect.count() < 0) {
    const char* env = std::getenv("SALUS_RECONNECT_SECONDS");
    const double seconds = env != nullptr ? std::atof(env) : 300.0;
    impl->reconnect = std::chrono::milliseconds(static_cast<int64_t>(std::max(seconds, 0.0) * 1e3));
  }
  const auto period =
      std::chrono::milliseconds(std::max<uint64_t>(h.lease_ms() / kBeatsPerLease, 100));
  Impl* raw = impl.get();
  impl->heartbeat = std::thread([raw, period] { raw->Beat(period); });
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const ServerInfo& Client::server() const { return impl_->server; }

StatusOr<std::unique_ptr<Session>> Client::CreateSession(const SessionOptions& o) {
  v1::Request req;
  v1::CreateSession* cs = req.mutable_create_session();
  // Both a model and a TensorFlow graph go to the daemon, which refuses them.
  if (o.synthetic.has_value() == (!o.model.empty() || !o.tf_graph.empty())) {
    return InvalidArgumentError("give exactly one of a model and a synthetic profile");
  }
  if (o.synthetic) {
    cs->mutable_synthetic()->set_persistent_bytes(o.synthetic->persistent_bytes);
    cs->mutable_synthetic()->set_ephemeral_bytes(o.synthetic->ephemeral_bytes);
    cs->mutable_synthetic()->set_iteration_seconds(o.synthetic->iteration_seconds);
  } else {
    v1::ModelSpec* m = cs->mutable_model();
    m->set_onnx(o.model);
    m->set_tf_graph(o.tf_graph);
    for (const std::string& name : o.outputs) m->add_outputs(name);
    m->set_mode(o.mode == Mode::kTrain ? v1::TRAIN : v1::INFER);
    for (const auto& [name, dims] : o.inputs) {
      v1::InputShape* in = m->add_inputs();
      in->set_name(name);
      for (int64_t d : dims) in->add_dims(d);
    }
    m->set_loss(o.loss);
    m->set_convolution_transforms(o.convolution_transforms);
    v1::Optimizer* opt = m->mutable_optimizer();
    opt->set_type(o.optimizer.type);
    opt->set_lr(o.optimizer.lr);
    opt->set_momentum(o.optimizer.momentum);
    opt->set_nesterov(o.optimizer.nesterov);
    opt->set_weight_decay(o.optimizer.weight_decay);
    opt->set_beta1(o.optimizer.beta1);
    opt->set_beta2(o.optimizer.beta2);
    opt->set_epsilon(o.optimizer.epsilon);
  }
  cs->set_iterations(o.iterations);
  cs->set_duration_seconds(o.duration_seconds);
  cs->set_priority(o.priority);
  cs->set_latency_class(o.interactive ? v1::LATENCY_INTERACTIVE : v1::LATENCY_BATCH);
  cs->set_name(o.name);
  cs->set_admission_timeout_seconds(o.admission_timeout_seconds);
  cs->set_job(o.job);
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl_->Control(std::move(req)));
  const v1::CreateSessionReply& r = reply.create_session();
  std::unique_ptr<Session> s(new Session(this, r.session_id()));
  s->admitted_ = r.state() == v1::ADMITTED;
  s->p_ = r.persistent_bytes();
  s->e_ = r.ephemeral_bytes();
  s->inputs_ = FromWire(r.inputs());
  s->outputs_ = FromWire(r.outputs());
  s->state_ = FromWire(r.state_tensors());
  return s;
}

StatusOr<std::vector<SessionInfo>> Client::ListSessions(OtherSessions* others) {
  v1::Request req;
  req.mutable_list_sessions();
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl_->Control(std::move(req)));
  if (others != nullptr) {
    const v1::OtherSessions& o = reply.list_sessions().others();
    *others = {o.sessions(), o.admitted(), o.waiting(), o.persistent_bytes(), o.ephemeral_bytes()};
  }
  std::vector<SessionInfo> out;
  for (const v1::SessionInfo& s : reply.list_sessions().sessions()) {
    SessionInfo i;
    i.id = s.session_id();
    i.name = s.name();
    i.kind = s.kind();
    i.state = v1::SessionState_Name(s.state());
    i.client_id = s.client_id();
    i.lane = s.lane();
    i.device = s.device();
    i.priority = s.priority();
    i.interactive = s.latency_class() == v1::LATENCY_INTERACTIVE;
    i.persistent_bytes = s.persistent_bytes();
    i.ephemeral_bytes = s.ephemeral_bytes();
    i.iterations_done = s.iterations_done();
    i.iterations_declared = s.iterations_declared();
    i.avg_iteration_seconds = s.avg_iteration_seconds();
    i.allocation = s.allocation();
    i.job = s.job();
    out.push_back(std::move(i));
  }
  return out;
}

StatusOr<std::string> Client::StatsJson() {
  v1::Request req;
  req.mutable_get_stats();
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl_->Control(std::move(req)));
  return reply.get_stats().json();
}

StatusOr<std::string> Client::MemoryMapJson() {
  v1::Request req;
  req.mutable_get_memory_map();
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl_->Control(std::move(req)));
  return reply.get_memory_map().json();
}

Status Client::CloseSession(uint64_t session_id) {
  v1::Request req;
  req.set_session_id(session_id);
  req.mutable_close_session();
  return impl_->Control(std::move(req)).status();
}

StatusOr<std::pair<std::string, std::string>> Client::MoveSession(uint64_t session_id,
                                                                  const std::string& device) {
  v1::Request req;
  req.set_session_id(session_id);
  req.mutable_move_session()->set_device(device);
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl_->Control(std::move(req)));
  return std::make_pair(reply.move_session().from(), reply.move_session().to());
}

Status Client::Drain(const std::string& snapshot_dir) {
  v1::Request req;
  req.mutable_drain()->set_snapshot_dir(snapshot_dir);
  return impl_->Control(std::move(req)).status();
}

StatusOr<std::vector<AllocationInfo>> Client::ListAllocations() {
  v1::Request req;
  req.mutable_list_allocations();
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl_->Control(std::move(req)));
  std::vector<AllocationInfo> out;
  for (const v1::Allocation& a : reply.list_allocations().allocations()) {
    AllocationInfo i;
    i.id = a.id();
    i.memory_bytes = a.memory_bytes();
    i.interactive = a.latency_class() == v1::LATENCY_INTERACTIVE;
    i.priority = a.priority();
    i.max_priority = a.max_priority();
    i.pod = a.pod();
    i.used_bytes = a.used_bytes();
    i.sessions = a.sessions();
    i.clients = a.clients();
    out.push_back(std::move(i));
  }
  return out;
}

StatusOr<bool> Client::GrantAllocation(const AllocationInfo& allocation, const std::string& token) {
  v1::Request req;
  v1::Allocation* a = req.mutable_grant_allocation()->mutable_allocation();
  a->set_id(allocation.id);
  a->set_token(token);
  a->set_memory_bytes(allocation.memory_bytes);
  a->set_latency_class(allocation.interactive ? v1::LATENCY_INTERACTIVE : v1::LATENCY_BATCH);
  a->set_priority(allocation.priority);
  a->set_max_priority(allocation.max_priority);
  a->set_pod(allocation.pod);
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl_->Control(std::move(req)));
  return reply.grant_allocation().created();
}

StatusOr<uint32_t> Client::RevokeAllocation(const std::string& id) {
  v1::Request req;
  req.mutable_revoke_allocation()->set_id(id);
  SALUS_ASSIGN_OR_RETURN(v1::Reply reply, impl_->Control(std::move(req)));
  return reply.revoke_allocation().sessions_closed();
}

StatusOr<std::unique_ptr<SharedBuffer>> Client::CreateSharedBuffer(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("a shared buffer needs at least one byte");
  static std::atomic<uint64_t> seq{0};
  std::random_device rd;
  const std::string name = fmt::format("/salus-{}-{}-{:08x}{:08x}", getpid(), seq++, rd(), rd());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return UnavailableError(
        fmt::format("cannot create shared memory '{}': {}", name, std::strerror(errno)));
  }
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return ResourceExhaustedError(
        fmt::format("cannot size or map shared memory of {} bytes: {}", bytes, std::strerror(err)));
  }
  v1::Request req;
  req.mutable_register_buffer()->set_shm_name(name);
  req.mutable_register_buffer()->set_bytes(bytes);
  auto reply = impl_->Control(std::move(req));
  shm_unlink(name.c_str());  // both sides hold it mapped; the name is no longer needed
  if (!reply.ok()) {
    munmap(p, bytes);
    return reply.status();
  }
  return std::unique_ptr<SharedBuffer>(new SharedBuffer(this, reply->register_buffer().buffer_id(),
                                                        static_cast<std::byte*>(p), bytes));
}

bool Client::staging() const {
  return impl_->options.stage_feeds_from > 0 && !impl_->staging_refused;
}

size_t Client::staging_buffers() const {
  std::lock_guard<std::mutex> lock(impl_->stage_mu);
  size_t n = 0;
  for (const auto& s : impl_->stages) n += s.buffer ? 1 : 0;
  return n;
}

// Note [Staged feeds]
// A large feed costs far more in a frame than its copy: ZeroMQ moves it through both
// processes' I/O threads and the socket in pieces. So by default a feed of stage_feeds_from
// bytes or more is copied into a shared buffer this client owns, and the request names the
// slice instead. Each iteration in flight holds one staging buffer (all its large feeds, each
// at a 64-byte aligned offset) from the send until its reply is collected: the daemon reads
// feeds only while the iteration runs, and the reply comes after. With max_staging_buffers
// busy, or after the daemon refused a buffer once (another host, another user, its limit),
// feeds go in frames, so staging changes the cost of an iteration, never its result.
SharedBuffer* Client::AcquireStage(uint64_t bytes, int* index) {
  *index = -1;
  if (!staging() || bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(impl_->stage_mu);
  auto& stages = impl_->stages;
  int free_slot = -1;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].busy) continue;
    if (stages[i].buffer && stages[i].buffer->size() >= bytes) {
      stages[i].busy = true;
      *index = static_cast<int>(i);
      return stages[i].buffer.get();
    }
    free_slot = static_cast<int>(i);
  }
  if (free_slot < 0) {
    if (stages.size() >= static_cast<size_t>(std::max(impl_->options.max_staging_buffers, 0))) {
      return nullptr;
    }
    stages.emplace_back();
    free_slot = static_cast<int>(stages.size() - 1);
  }
  Impl::Stage& slot = stages[free_slot];
  slot.buffer.reset();  // too small: replaced by one that fits
  auto buffer = CreateSharedBuffer(std::bit_ceil(std::max<uint64_t>(bytes, 1 << 20)));
  if (!buffer.ok()) {
    impl_->staging_refused = true;  // the slot stays, empty: other slots keep their indices
    return nullptr;
  }
  slot.buffer = std::move(*buffer);
  slot.busy = true;
  *index = free_slot;
  return slot.buffer.get();
}

void Client::ReleaseStage(int index) {
  if (index < 0) return;
  std::lock_guard<std::mutex> lock(impl_->stage_mu);
  impl_->stages[static_cast<size_t>(index)].busy = false;
}

SharedBuffer::~SharedBuffer() {
  if (!forgotten_) {
    v1::Request req;
    req.mutable_unregister_buffer()->set_buffer_id(id_);
    client_->impl_->Control(std::move(req)).status().IgnoreError();  // the lease frees it anyway
  }
  munmap(data_, size_);
}

Status Client::AfterRefusal(const Status& error, uint64_t submitted_to) {
  const StatusCode code = error.code();
  if (code == StatusCode::kAborted &&
      error.message().find("the session is at iteration") != std::string_view::npos) {
    // The daemon restarted from an older snapshot (a crash): the job is told; from now on this
    // client has heard of the restart, so its next iterations run.
    auto beat = impl_->Heartbeat(std::chrono::milliseconds(1000));
    if (beat.ok() && beat->server_instance() != impl_->instance) {
      Restarted(beat->server_instance());
    }
    return error;
  }
  if (impl_->reconnect.count() <= 0 ||
      (code != StatusCode::kUnavailable && code != StatusCode::kNotFound &&
       code != StatusCode::kUnauthenticated)) {
    return error;
  }
  const auto deadline = std::chrono::steady_clock::now() + impl_->reconnect;
  auto delay = std::chrono::milliseconds(50);
  while (true) {
    if (impl_->instance != submitted_to) return OkStatus();  // another saw the restart
    auto beat = impl_->Heartbeat(std::chrono::milliseconds(1000));
    if (beat.ok()) {
      const v1::HeartbeatReply& h = *beat;
      if (h.server_instance() != impl_->instance) {
        if (!h.client_known()) {
          return AbortedError(
              fmt::format("the daemon at {} restarted without this client's sessions (no "
                          "snapshot restored them)",
                          impl_->endpoint));
        }
        Restarted(h.server_instance());
        return OkStatus();
      }
      if (!h.draining()) return error;  // the daemon is as it was: the error is the answer
    } else if (beat.status().code() != StatusCode::kDeadlineExceeded) {
      return beat.status();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return UnavailableError(
          fmt::format("the daemon at {} drained and did not come back within {} s: {}",
                      impl_->endpoint, impl_->reconnect.count() / 1000, error.message()));
    }
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(1000));
  }
}

void Client::Restarted(uint64_t instance) {
  std::lock_guard<std::mutex> lock(impl_->stage_mu);
  for (Impl::Stage& stage : impl_->stages) {
    if (stage.buffer) stage.buffer->forgotten_ = true;
    stage.buffer.reset();  // a busy slot gets a new buffer once released and taken again
  }
  impl_->staging_refused = false;
  impl_->instance = instance;
}

Session::~Session() {
  if (!closed_) Close().IgnoreError();  // best effort; the lease frees it otherwise
}

namespace {

constexpr uint64_t kStageAlign = 64;
uint64_t StageAligned(uint64_t n) { return (n + kStageAlign - 1) / kStageAlign * kStageAlign; }

}  // namespace

StatusOr<uint64_t> Session::Send(const std::vector<Tensor>& feeds,
                                 const std::vector<std::string>& fetches, int* stage,
                                 bool state_only, bool reply_when_fetched, uint64_t instance) {
  const uint64_t stage_from = client_->impl_->options.stage_feeds_from;
  auto staged = [&](const Tensor& t) {
    return stage_from > 0 && t.buffer_id == 0 && t.data.size() >= stage_from;
  };
  uint64_t stage_bytes = 0;
  for (const Tensor& t : feeds) stage_bytes += staged(t) ? StageAligned(t.data.size()) : 0;
  SharedBuffer* buffer = client_->AcquireStage(stage_bytes, stage);
  uint64_t stage_offset = 0;

  v1::Request req;
  req.set_session_id(id_);
  v1::RunIteration* body = req.mutable_run_iteration();
  std::vector<zmq::message_t> frames;
  for (const Tensor& t : feeds) {
    v1::TensorSpec* spec = body->add_feeds();
    spec->set_name(t.name);
    spec->set_dtype(ToWire(t.dtype));
    for (int64_t d : t.shape) spec->add_shape(d);
    if (t.buffer_id != 0) {
      spec->mutable_buffer()->set_buffer_id(t.buffer_id);
      spec->mutable_buffer()->set_offset(t.buffer_offset);
      continue;  // no frame: the daemon reads the bytes from the buffer
    }
    if (buffer != nullptr && staged(t)) {
      std::memcpy(buffer->data() + stage_offset, t.data.data(), t.data.size());
      spec->mutable_buffer()->set_buffer_id(buffer->id());
      spec->mutable_buffer()->set_offset(stage_offset);
      stage_offset += StageAligned(t.data.size());
      continue;
    }
    // Zero-copy: ZeroMQ reads the caller's bytes in place. The caller keeps them until the
    // reply, which the server can only send once the whole message arrived.
    frames.emplace_back(const_cast<std::byte*>(t.data.data()), t.data.size(), nullptr, nullptr);
  }
  for (const auto& f : fetches) body->add_fetches(f);
  body->set_state_only(state_only);
  body->set_reply_when_fetched(reply_when_fetched);
  // The daemon this client last heard from (Note [Rewound sessions] in the daemon).
  body->set_server_instance(instance != 0 ? instance : client_->impl_->instance.load());
  auto sent = client_->impl_->Send(std::move(req), std::move(frames));
  if (!sent.ok()) {
    client_->ReleaseStage(*stage);
    *stage = -1;
  }
  return sent;
}

StatusOr<std::map<std::string, Tensor>> Session::Collect(uint64_t request_id, bool update_stats) {
  SALUS_ASSIGN_OR_RETURN(auto r, client_->impl_->Await(request_id, std::nullopt));
  const v1::RunIterationReply& reply = r.first.run_iteration();
  const v1::IterationStats& st = reply.stats();
  if (update_stats) {
    stats_ = {st.iteration(), st.lane(),          st.queue_delay_us(),
              st.run_us(),    st.switch_gap_us(), st.early()};
  }
  if (static_cast<size_t>(reply.outputs_size()) != r.second.size()) {
    return DataLossError("the reply's tensor frames do not match its output list");
  }
  std::map<std::string, Tensor> out;
  for (int i = 0; i < reply.outputs_size(); ++i) {
    const v1::TensorSpec& spec = reply.outputs(i);
    Tensor t;
    t.name = spec.name();
    t.dtype = static_cast<DType>(spec.dtype());
    t.shape.assign(spec.shape().begin(), spec.shape().end());
    const zmq::message_t& f = r.second[i];
    t.data.resize(f.size());
    std::memcpy(t.data.data(), f.data(), f.size());
    out[t.name] = std::move(t);
  }
  return out;
}

StatusOr<std::map<std::string, Tensor>> Session::Exchange(const std::vector<Tensor>& feeds,
                                                          const std::vector<std::string>& fetches,
                                                          bool state_only, bool reply_when_fetched,
                                                          uint64_t instance) {
  // Sent again, it names the daemon it was first sent to: a session rewound since refuses it.
  if (instance == 0) instance = client_->impl_->instance;
  while (true) {
    int stage = -1;
    SALUS_ASSIGN_OR_RETURN(uint64_t id,
                           Send(feeds, fetches, &stage, state_only, reply_when_fetched, instance));
    auto out = Collect(id, /*update_stats=*/!state_only);
    client_->ReleaseStage(stage);  // the daemon has finished reading it
    if (out.ok()) return out;
    // Nothing of it ran when it is to be sent again (docs/operations.md, Restarts).
    SALUS_RETURN_IF_ERROR(client_->AfterRefusal(out.status(), instance));
  }
}

StatusOr<std::map<std::string, Tensor>> Session::Run(const std::vector<Tensor>& feeds,
                                                     const std::vector<std::string>& fetches,
                                                     bool reply_when_fetched) {
  return Exchange(feeds, fetches, /*state_only=*/false, reply_when_fetched);
}

StatusOr<std::map<std::string, Tensor>> Session::SyncState(const std::vector<Tensor>& writes,
                                                           const std::vector<std::string>& reads) {
  return Exchange(writes, reads, /*state_only=*/true, /*reply_when_fetched=*/false);
}

StatusOr<std::unique_ptr<PendingIteration>> Session::Submit(std::vector<Tensor> feeds,
                                                            std::vector<std::string> fetches,
                                                            bool reply_when_fetched) {
  std::unique_ptr<PendingIteration> p(new PendingIteration(this, std::move(feeds)));
  p->instance_ = client_->impl_->instance;
  p->reply_when_fetched_ = reply_when_fetched;
  auto id =
      Send(p->feeds_, fetches, &p->stage_, /*state_only=*/false, reply_when_fetched, p->instance_);
  p->fetches_ = std::move(fetches);
  if (!id.ok()) {
    p->waited_ = true;  // nothing was sent: nothing to wait for
    return id.status();
  }
  p->request_id_ = *id;
  return p;
}

PendingIteration::~PendingIteration() {
  if (!waited_) Wait().status().IgnoreError();  // the feeds must outlive the send
}

StatusOr<std::map<std::string, Tensor>> PendingIteration::Wait() {
  if (waited_) return FailedPreconditionError("this iteration's result was already taken");
  waited_ = true;
  auto out = session_->Collect(request_id_);
  session_->client_->ReleaseStage(stage_);  // the daemon has finished reading it
  stage_ = -1;
  if (out.ok()) return out;
  // Refused while the daemon restarts: sent again once it is back (docs/operations.md).
  SALUS_RETURN_IF_ERROR(session_->client_->AfterRefusal(out.status(), instance_));
  return session_->Exchange(feeds_, fetches_, /*state_only=*/false, reply_when_fetched_, instance_);
}

Status Session::Close() {
  if (closed_) return OkStatus();
  Status s = client_->CloseSession(id_);
  closed_ = true;
  return s;
}

}  // namespace salus::client
