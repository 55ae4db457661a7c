// RpcFrontend: the daemon's ZeroMQ front door.
//
// One ROUTER is bound to each configured endpoint. The I/O thread receives: it decodes
// envelopes and hands each request to the handler, which must not block; it never waits on
// execution. Replies are sent by whichever thread produced them, straight onto the ROUTER
// under a mutex (ZeroMQ sockets are not thread-safe, but may be used from several threads
// with a full barrier between uses), so a reply costs no extra thread hand-off. See
// Note [Sending from any thread] in rpc_frontend.cc for how the I/O thread still wakes for
// every request.
//
// Framing (see proto/salus/v1/salus.proto): frame 0 is a salus.v1.Request, frames 1..n raw
// tensors. An envelope that does not parse, is empty or too large is answered here with
// INVALID_ARGUMENT (request id 0 when none could be read); everything else reaches the
// handler with a Call that must be answered exactly once. A Call destroyed unanswered
// answers INTERNAL itself, so no request ever goes without its one reply.
//
// Authentication (Note [Principals] in rpc_frontend.cc): the frontend runs the context's ZAP
// handler, so every connection is authenticated before its first request and each Call names
// its principal: the peer's Unix user over ipc, its CURVE key on a CURVE listener, its address
// on plain TCP. A CURVE listener refuses keys outside its allow-list (unless open).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/clock.h"
#include "common/thread_annotations.h"
#include "salus/status.h"
#include "salus/v1/salus.pb.h"

namespace salus::server {

// Largest envelope frame (a CreateSession carries a whole ONNX model).
inline constexpr size_t kMaxEnvelopeBytes = 512ull << 20;
// Largest message ZeroMQ accepts at all; larger ones drop the connection.
inline constexpr int64_t kMaxMessageBytes = 2ll << 30;
// Replies held for one connection that does not read them, beyond ZeroMQ's own queue, and
// their bytes.
inline constexpr uint64_t kDefaultReplyBacklog = 10000;
inline constexpr uint64_t kDefaultReplyBacklogBytes = uint64_t{256} << 20;

class RpcFrontend;

// One endpoint to bind, and whether it speaks CURVE.
struct Listener {
  std::string endpoint;
  bool curve = false;
};

// The server side of CURVE, for the listeners that speak it.
struct CurveServer {
  std::string secret_key;            // Z85
  std::vector<std::string> allowed;  // clients' public keys, Z85
  bool open = false;                 // any key may connect (still encrypted)
};

// One request and the means to answer it. Movable, answer-once.
class Call {
 public:
  Call(RpcFrontend* frontend, size_t socket, std::string route, uint64_t request_id);
  Call(Call&& other) noexcept;
  Call& operator=(Call&&) = delete;
  ~Call();

  v1::Request& request() { return request_; }
  // The size of the request's envelope frame, as it arrived; and of all its frames.
  size_t envelope_bytes() const { return envelope_bytes_; }
  uint64_t message_bytes() const;
  std::vector<zmq::message_t>& frames() { return frames_; }
  // Who the transport authenticated (Note [Principals]); empty when it could not tell.
  const std::string& principal() const { return principal_; }
  // Runs `fn` once, right after the reply is posted (or the Call is destroyed unanswered).
  void OnAnswered(std::function<void()> fn) { on_answered_ = std::move(fn); }

  // Sends `reply` (its request_id is set here) followed by `frames`.
  void Reply(v1::Reply reply, std::vector<zmq::message_t> frames = {});
  void ReplyError(const Status& status);
  bool answered() const { return frontend_ == nullptr; }

 private:
  friend class RpcFrontend;
  RpcFrontend* frontend_;
  size_t socket_;
  std::string route_;
  uint64_t request_id_;
  std::string principal_;
  size_t envelope_bytes_ = 0;
  std::function<void()> on_answered_;
  v1::Request request_;
  std::vector<zmq::message_t> frames_;
};

class RpcFrontend {
 public:
  using Handler = std::function<void(Call call)>;

  // Binds every endpoint ("ipc:///run/salus/salus.sock", "tcp://127.0.0.1:5501"). Errors name
  // the endpoint.
  static StatusOr<std::unique_ptr<RpcFrontend>> Create(const std::vector<std::string>& endpoints,
                                                       Handler handler);
  // The same, with CURVE on the listeners that ask for it (`curve` must then hold a key), and at
  // most `reply_backlog` replies of at most `reply_backlog_bytes` held for one connection that
  // does not read them (Note [Replies a peer does not read]).
  static StatusOr<std::unique_ptr<RpcFrontend>> Create(
      const std::vector<Listener>& listeners, const CurveServer& curve, Handler handler,
      uint64_t reply_backlog = kDefaultReplyBacklog,
      uint64_t reply_backlog_bytes = kDefaultReplyBacklogBytes);
  ~RpcFrontend();

  // Starts the I/O thread.
  void Start();
  // Stops the I/O thread: no request is received after it returns. Replies are sent as they
  // are posted, before and after, until the frontend is destroyed. Idempotent.
  void Stop();
  // The endpoints as bound (a tcp port of 0 resolved to the real one).
  const std::vector<std::string>& endpoints() const { return endpoints_; }

  uint64_t requests_received() const { return received_.load(); }
  uint64_t bad_envelopes() const { return bad_envelopes_.load(); }
  // Replies held for connections that did not read them, and replies dropped past the backlog.
  size_t backlogged_replies() const EXCLUDES(sock_mu_);
  uint64_t dropped_replies() const { return dropped_replies_.load(); }
  // The last time (on the steady clock) the I/O thread had read every request that had
  // arrived: leases are measured up to it (Note [Leases and stalls] in client_registry.cc).
  Nanos caught_up() const { return Nanos(caught_up_ns_.load()); }

 private:
  friend class Call;
  RpcFrontend(Handler handler);
  // Replies held for one peer (Note [Replies a peer does not read]).
  struct Backlog {
    std::deque<std::vector<zmq::message_t>> replies;  // [route, frames...], in order
    uint64_t bytes = 0;                               // of `replies`
    // The peer's requests that arrived while replies waited, to be handled once they are out.
    std::deque<std::vector<zmq::message_t>> parked;
    uint64_t parked_bytes = 0;
    uint64_t dropped = 0;  // replies (and requests) dropped since it was last empty
  };
  // Sends what the backlogs hold while their peers take it, and moves to `unparked` the
  // requests of peers whose replies are all out; returns whether any backlog is left.
  bool FlushBacklogs(std::vector<std::pair<size_t, std::vector<zmq::message_t>>>* unparked)
      EXCLUDES(sock_mu_);
  // Keeps `msg` (a request) aside when its peer has replies waiting; returns whether it did.
  bool Park(size_t socket, std::vector<zmq::message_t>& msg) REQUIRES(sock_mu_);
  // Sends `msg` on `router` now, or keeps it in the peer's backlog. REQUIRES the lock.
  void SendOrKeep(size_t socket, std::vector<zmq::message_t> msg) REQUIRES(sock_mu_);
  // Sends [route, frames...] on ROUTER `socket`, from any thread.
  void Post(size_t socket, const std::string& route, std::vector<zmq::message_t> frames)
      EXCLUDES(sock_mu_);
  void Wake();
  void Loop();
  void OnRequest(size_t socket, std::vector<zmq::message_t>& msg);
  // Answers the ZAP requests waiting on zap_; returns whether more may be waiting.
  bool ServeZap();

  Handler handler_;
  zmq::context_t ctx_;
  std::vector<std::string> endpoints_;
  mutable Mutex sock_mu_;
  std::vector<zmq::socket_t> routers_ GUARDED_BY(sock_mu_);
  bool closed_ GUARDED_BY(sock_mu_) = false;
  uint64_t reply_backlog_ = kDefaultReplyBacklog;
  uint64_t reply_backlog_bytes_ = kDefaultReplyBacklogBytes;
  // Per ROUTER, per peer's routing id.
  std::vector<std::map<std::string, Backlog>> backlogs_ GUARDED_BY(sock_mu_);
  size_t backlogged_ GUARDED_BY(sock_mu_) = 0;
  uint64_t backlogged_bytes_ GUARDED_BY(sock_mu_) = 0;
  uint64_t parked_bytes_ GUARDED_BY(sock_mu_) = 0;
  zmq::socket_t zap_;  // the ZAP handler (Note [Principals]); the I/O thread's alone
  CurveServer curve_;
  std::vector<int> router_fds_;  // each ROUTER's ZMQ_FD, polled by the I/O thread
  int wake_fd_ = -1;             // eventfd: wakes the I/O thread (Stop, Note above)
  std::thread io_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> bad_envelopes_{0};
  std::atomic<uint64_t> dropped_replies_{0};
  std::atomic<int64_t> caught_up_ns_{0};
};

// Status <-> wire.
void ToProto(const Status& s, v1::Status* out);
Status FromProto(const v1::Status& s);

}  // namespace salus::server
