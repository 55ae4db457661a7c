#include "server/rpc_frontend.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/logging.h"

namespace salus::server {
namespace {

// Requests taken from one ROUTER before the others get a turn.
constexpr int kBurst = 256;
// ZeroMQ's own I/O threads, which read and write the connections (each connection is served by
// one). With one, a client sending a huge message holds up every other client's small ones
// while it is read; two let the others through meanwhile.
constexpr int kIoThreads = 2;
// A connection that has not finished ZeroMQ's handshake by then is dropped.
constexpr int kHandshakeMs = 10000;
// How long the idle I/O thread sleeps at most, and at most while replies are backlogged.
constexpr int kIdlePollMs = 100;
constexpr int kBacklogPollMs = 5;
// Replies ZeroMQ queues for one peer before a send fails and the reply goes to the peer's
// backlog, which is bounded in bytes (Note [Replies a peer does not read]).
constexpr int kRouterSendHwm = 128;
// Parked requests of one peer handled at a time once its replies are out.
constexpr size_t kUnparkBatch = 64;
// What keeping one parked request costs at least, in bytes, against reply_backlog_bytes.
constexpr uint64_t kParkedMessageCost = 256;
// ZAP domains, one per kind of listener (Note [Principals]).
constexpr char kIpcDomain[] = "salus-ipc";
constexpr char kTcpDomain[] = "salus-tcp";
constexpr char kCurveDomain[] = "salus-curve";
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr size_t kCurveKeyBytes = 32;

// "uid:<N>" from libzmq's address of an ipc peer, ":<uid>:<gid>:<pid>" (read with
// SO_PEERCRED); empty when the address carries no credentials.
std::string IpcPrincipal(const std::string& address) {
  const size_t pid = address.rfind(':');
  if (pid == std::string::npos || pid == 0) return "";
  const size_t gid = address.rfind(':', pid - 1);
  if (gid == std::string::npos || gid == 0) return "";
  const size_t uid = address.rfind(':', gid - 1);
  if (uid == std::string::npos) return "";
  const std::string n = address.substr(uid + 1, gid - uid - 1);
  if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) return "";
  return "uid:" + n;
}

// The "User-Id" the ZAP handler gave the message's connection (Note [Principals]), or "" for
// one it did not authenticate (none, once the handler is bound). libzmq attaches the string on
// its own I/O thread and hands it over through queues ThreadSanitizer cannot see: the race it
// reports here is suppressed by name in tests/tsan.supp.
std::string MessageUserId(zmq::message_t& msg) {
  try {
    return msg.gets("User-Id");
  } catch (const zmq::error_t&) {
    return "";
  }
}

}  // namespace

// Note [Principals]
// ZeroMQ asks the context's ZAP handler (RFC 27) about every new connection of a socket that
// has a ZAP domain, before any message from it is delivered; the handler's answer may refuse
// the connection, and the user id it returns is attached to every message the connection
// brings ("User-Id"). The frontend binds that handler in its own context and gives each
// listener a domain that says what kind it is:
// - ipc: libzmq reads the peer's credentials with SO_PEERCRED and appends them to the address
//   as ":uid:gid:pid"; the principal is "uid:<uid>", which the peer cannot forge.
// - plain TCP (loopback only; the server refuses other addresses without CURVE): the
//   principal is "tcp:<address>", one unauthenticated principal per address.
// - CURVE: the handshake has proven the client holds the secret of the public key it shows;
//   a key outside the allow-list is refused (status 400: the client never gets a reply) unless
//   the listener is open; the principal is "curve:<Z85 key>".
// Roles are not decided here: the server maps principals to roles.

void ToProto(const Status& s, v1::Status* out) {
  out->set_code(static_cast<int32_t>(s.code()));
  out->set_message(s.message());
}

Status FromProto(const v1::Status& s) {
  if (s.code() < 0 || s.code() > 16) {
    return UnknownError(fmt::format("status code {}: {}", s.code(), s.message()));
  }
  return Status(static_cast<StatusCode>(s.code()), s.message());
}

Call::Call(RpcFrontend* frontend, size_t socket, std::string route, uint64_t request_id)
    : frontend_(frontend), socket_(socket), route_(std::move(route)), request_id_(request_id) {}

Call::Call(Call&& o) noexcept
    : frontend_(o.frontend_),
      socket_(o.socket_),
      route_(std::move(o.route_)),
      request_id_(o.request_id_),
      principal_(std::move(o.principal_)),
      on_answered_(std::move(o.on_answered_)),
      request_(std::move(o.request_)),
      frames_(std::move(o.frames_)) {
  o.frontend_ = nullptr;
}

uint64_t Call::message_bytes() const {
  uint64_t bytes = envelope_bytes_;
  for (const zmq::message_t& f : frames_) bytes += f.size();
  return bytes;
}

Call::~Call() {
  if (frontend_ != nullptr) {
    ReplyError(InternalError("the server dropped this request without an answer"));
  }
}

void Call::Reply(v1::Reply reply, std::vector<zmq::message_t> frames) {
  if (frontend_ == nullptr) return;  // answered already: exactly one reply
  reply.set_request_id(request_id_);
  if (!reply.has_status()) reply.mutable_status()->set_code(0);
  std::vector<zmq::message_t> msg;
  msg.reserve(frames.size() + 1);
  std::string bytes;
  reply.SerializeToString(&bytes);
  msg.emplace_back(bytes.data(), bytes.size());
  for (auto& f : frames) msg.push_back(std::move(f));
  RpcFrontend* fe = frontend_;
  frontend_ = nullptr;
  fe->Post(socket_, route_, std::move(msg));
  if (on_answered_) std::exchange(on_answered_, nullptr)();
}

void Call::ReplyError(const Status& status) {
  v1::Reply reply;
  ToProto(status.ok() ? InternalError("error reply with an OK status") : status,
          reply.mutable_status());
  Reply(std::move(reply));
}

RpcFrontend::RpcFrontend(Handler handler) : handler_(std::move(handler)), ctx_(kIoThreads) {}

StatusOr<std::unique_ptr<RpcFrontend>> RpcFrontend::Create(
    const std::vector<std::string>& endpoints, Handler handler) {
  std::vector<Listener> listeners;
  for (const std::string& ep : endpoints) listeners.push_back({ep, false});
  return Create(listeners, CurveServer{}, std::move(handler));
}

StatusOr<std::unique_ptr<RpcFrontend>> RpcFrontend::Create(const std::vector<Listener>& listeners,
                                                           const CurveServer& curve,
                                                           Handler handler, uint64_t reply_backlog,
                                                           uint64_t reply_backlog_bytes) {
  if (listeners.empty()) return InvalidArgumentError("no endpoint to listen on");
  std::unique_ptr<RpcFrontend> fe(new RpcFrontend(std::move(handler)));
  fe->curve_ = curve;
  fe->reply_backlog_ = reply_backlog;
  fe->reply_backlog_bytes_ = reply_backlog_bytes;
  fe->caught_up_ns_ = SteadyClock::Get()->Now().count();
  fe->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fe->wake_fd_ < 0) {
    return InternalError(fmt::format("eventfd for the rpc frontend: {}", std::strerror(errno)));
  }
  // The handler first: a connection that arrives before it would go unauthenticated.
  try {
    fe->zap_ = zmq::socket_t(fe->ctx_, zmq::socket_type::rep);
    fe->zap_.set(zmq::sockopt::linger, 0);
    fe->zap_.bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    return InternalError(fmt::format("the rpc frontend's ZAP handler: {}", e.what()));
  }
  MutexLock lock(&fe->sock_mu_);
  for (const Listener& l : listeners) {
    const std::string& ep = l.endpoint;
    zmq::socket_t s(fe->ctx_, zmq::socket_type::router);
    s.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    s.set(zmq::sockopt::linger, 0);
    // Note [Replies a peer does not read]: a reply that does not fit is kept, not dropped.
    s.set(zmq::sockopt::router_mandatory, 1);
    s.set(zmq::sockopt::sndhwm, kRouterSendHwm);
    s.set(zmq::sockopt::handshake_ivl, kHandshakeMs);
    try {
      if (l.curve) {
        s.set(zmq::sockopt::curve_server, true);
        s.set(zmq::sockopt::curve_secretkey, curve.secret_key);
        s.set(zmq::sockopt::zap_domain, kCurveDomain);
      } else {
        s.set(zmq::sockopt::zap_domain, ep.rfind("ipc://", 0) == 0 ? kIpcDomain : kTcpDomain);
      }
      s.bind(ep);
    } catch (const zmq::error_t& e) {
      return UnavailableError(fmt::format("cannot listen on '{}': {}", ep, e.what()));
    }
    fe->endpoints_.push_back(s.get(zmq::sockopt::last_endpoint));
    fe->router_fds_.push_back(s.get(zmq::sockopt::fd));
    fe->routers_.push_back(std::move(s));
    fe->backlogs_.emplace_back();
  }
  return fe;
}

RpcFrontend::~RpcFrontend() {
  Stop();
  {
    MutexLock lock(&sock_mu_);
    closed_ = true;
    for (auto& r : routers_) r.close();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void RpcFrontend::Start() {
  if (started_.exchange(true)) return;
  io_ = std::thread([this] { Loop(); });
}

void RpcFrontend::Stop() {
  if (!started_.load() || stopping_.exchange(true)) return;
  Wake();
  if (io_.joinable()) io_.join();
}

void RpcFrontend::Wake() {
  const uint64_t one = 1;
  // A full counter (never in practice) still leaves the descriptor readable: the wake is kept.
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

// Note [Sending from any thread]
// The I/O thread sleeps in poll() on each ROUTER's ZMQ_FD, which is edge-triggered: it turns
// readable when commands (such as "a message arrived") reach the socket's mailbox, and any
// operation on the socket - a send included - may process those commands and so consume the
// edge. A worker that sends a reply could therefore swallow the wake-up for a request that
// arrived meanwhile. So every sender, still holding the lock, asks the socket for ZMQ_EVENTS
// after sending; when a message is waiting it wakes the I/O thread through the eventfd.
// Anything arriving after that check signals ZMQ_FD anew. The I/O thread itself drains each
// ROUTER and checks ZMQ_EVENTS before it sleeps.
// Note [Replies a peer does not read]
// ZeroMQ queues a bounded number of messages for each peer (its high-water mark); a ROUTER that
// finds a peer's queue full drops the message, silently unless ROUTER_MANDATORY is set. A
// client that pipelines thousands of requests before reading any reply would so lose replies
// and wait forever for them. With ROUTER_MANDATORY the send fails with EAGAIN instead, and the
// reply is kept in the peer's backlog, after which every later reply to that peer queues too,
// in order; the I/O thread sends the backlog on as the peer reads (it looks every few
// milliseconds while any is kept). ZeroMQ's own queue per peer is kept short (kRouterSendHwm
// messages, of any size), and a backlog holds at most `reply_backlog` replies and
// `reply_backlog_bytes` (all backlogs 64 times as many replies and 4 times the bytes): past it,
// replies to that peer are dropped and counted, and once its backlog has drained the peer is sent
// one error reply (request id 0, RESOURCE_EXHAUSTED) saying how many were dropped, so a client that
// reads nothing for long costs the daemon a bounded amount of memory and learns, when it reads
// again, that it lost replies. While a peer has replies waiting, its new requests are parked, not
// handled (at most `reply_backlog_bytes` of them, counting each as at least kParkedMessageCost, and
// 4 times that for all peers; past it they are dropped as replies are), and handled in order once
// its replies are out: a client that sends faster than it reads is slowed to its reading, rather
// than made to lose replies produced faster than it takes them. A peer that has gone (EHOSTUNREACH)
// cannot be answered; its replies and parked requests are dropped.
constexpr uint64_t kBacklogPeersInAll = 64;
constexpr uint64_t kBacklogBytesPeersInAll = 4;

uint64_t MessageBytes(const std::vector<zmq::message_t>& msg) {
  uint64_t bytes = 0;
  for (const zmq::message_t& part : msg) bytes += part.size();
  return bytes;
}

void RpcFrontend::SendOrKeep(size_t socket, std::vector<zmq::message_t> msg) {
  zmq::socket_t& router = routers_[socket];
  auto& backlogs = backlogs_[socket];
  // Most replies find no backlog at all: the route is looked up only when there is one.
  auto it = backlogs.empty() ? backlogs.end() : backlogs.find(msg.front().to_string());
  if (it == backlogs.end()) {
    try {
      if (zmq::send_multipart(router, msg, zmq::send_flags::dontwait)) return;
    } catch (const zmq::error_t& e) {
      if (e.num() != EHOSTUNREACH) {
        logging::Get("server")->error("rpc: sending a reply failed: {}", e.what());
      }
      return;  // the peer has gone
    }
    it = backlogs.try_emplace(msg.front().to_string()).first;  // its queue is full: keep it
  }
  Backlog& b = it->second;
  const uint64_t bytes = MessageBytes(msg);
  if (b.replies.size() >= reply_backlog_ || backlogged_ >= reply_backlog_ * kBacklogPeersInAll ||
      b.bytes + bytes > reply_backlog_bytes_ ||
      backlogged_bytes_ + bytes > reply_backlog_bytes_ * kBacklogBytesPeersInAll) {
    if (b.dropped++ == 0) {
      logging::Event("server", "replies_dropped",
                     {{"backlog", b.replies.size()}, {"limit", reply_backlog_}});
    }
    ++dropped_replies_;
    return;
  }
  b.replies.push_back(std::move(msg));
  b.bytes += bytes;
  ++backlogged_;
  backlogged_bytes_ += bytes;
}

bool RpcFrontend::Park(size_t socket, std::vector<zmq::message_t>& msg) {
  if (msg.empty() || backlogs_[socket].empty()) return false;
  auto it = backlogs_[socket].find(msg.front().to_string());
  if (it == backlogs_[socket].end()) return false;
  Backlog& b = it->second;
  // A parked request costs its bytes, and at least what keeping a message costs.
  const uint64_t bytes = std::max(MessageBytes(msg), kParkedMessageCost);
  if (b.parked_bytes + bytes > reply_backlog_bytes_ ||
      parked_bytes_ + bytes > reply_backlog_bytes_ * kBacklogBytesPeersInAll) {
    if (b.dropped++ == 0) {
      logging::Event(
          "server", "replies_dropped",
          {{"backlog", b.replies.size()}, {"parked", b.parked.size()}, {"limit", reply_backlog_}});
    }
    ++dropped_replies_;  // the request is dropped unanswered: its reply is lost as above
    return true;
  }
  b.parked_bytes += bytes;
  parked_bytes_ += bytes;
  b.parked.push_back(std::move(msg));
  return true;
}

bool RpcFrontend::FlushBacklogs(
    std::vector<std::pair<size_t, std::vector<zmq::message_t>>>* unparked) {
  MutexLock lock(&sock_mu_);
  bool any = false;
  for (const auto& per_socket : backlogs_) any = any || !per_socket.empty();
  if (!any) return false;
  for (size_t socket = 0; socket < backlogs_.size(); ++socket) {
    zmq::socket_t& router = routers_[socket];
    for (auto it = backlogs_[socket].begin(); it != backlogs_[socket].end();) {
      Backlog& b = it->second;
      bool gone = false;
      while (!b.replies.empty()) {
        try {
          if (!zmq::send_multipart(router, b.replies.front(), zmq::send_flags::dontwait)) break;
        } catch (const zmq::error_t&) {
          gone = true;  // the peer has gone: nothing more can reach it
        }
        const uint64_t bytes = MessageBytes(b.replies.front());
        b.bytes -= bytes;
        backlogged_bytes_ -= bytes;
        b.replies.pop_front();
        --backlogged_;
        if (gone) break;
      }
      if (gone) {
        backlogged_ -= b.replies.size();
        backlogged_bytes_ -= b.bytes;
        parked_bytes_ -= b.parked_bytes;
        it = backlogs_[socket].erase(it);
        continue;
      }
      if (!b.replies.empty()) {
        ++it;
        continue;
      }
      if (!b.parked.empty()) {
        // Its replies are out: a batch of its parked requests is handled now, in order.
        for (size_t n = 0; n < kUnparkBatch && !b.parked.empty(); ++n) {
          const uint64_t bytes = std::max(MessageBytes(b.parked.front()), kParkedMessageCost);
          b.parked_bytes -= bytes;
          parked_bytes_ -= bytes;
          unparked->emplace_back(socket, std::move(b.parked.front()));
          b.parked.pop_front();
        }
        ++it;
        continue;
      }
      if (b.dropped > 0) {
        // Drained: tell the peer what it lost, once it can take it.
        v1::Reply notice;
        notice.set_request_id(0);
        ToProto(ResourceExhaustedError(fmt::format(
                    "{} replies to this connection were dropped: it did not read its replies "
                    "while more than limits.reply_backlog={} (or limits.reply_backlog_bytes={}) "
                    "were waiting",
                    b.dropped, reply_backlog_, reply_backlog_bytes_)),
                notice.mutable_status());
        std::vector<zmq::message_t> msg;
        msg.emplace_back(it->first.data(), it->first.size());
        msg.emplace_back(notice.SerializeAsString());
        try {
          if (!zmq::send_multipart(router, msg, zmq::send_flags::dontwait)) {
            ++it;
            continue;
          }
        } catch (const zmq::error_t&) {
        }
      }
      it = backlogs_[socket].erase(it);
    }
  }
  return std::any_of(backlogs_.begin(), backlogs_.end(), [](const auto& m) { return !m.empty(); });
}

size_t RpcFrontend::backlogged_replies() const {
  MutexLock lock(&sock_mu_);
  return backlogged_;
}

void RpcFrontend::Post(size_t socket, const std::string& route,
                       std::vector<zmq::message_t> frames) {
  std::vector<zmq::message_t> msg;
  msg.reserve(frames.size() + 1);
  msg.emplace_back(route.data(), route.size());
  for (auto& f : frames) msg.push_back(std::move(f));
  bool wake = false;
  {
    MutexLock lock(&sock_mu_);
    if (closed_) return;
    SendOrKeep(socket, std::move(msg));
    try {
      wake = (routers_[socket].get(zmq::sockopt::events) & ZMQ_POLLIN) != 0 ||
             !backlogs_[socket].empty();
    } catch (const zmq::error_t&) {
      wake = true;  // let the I/O thread look at the socket again
    }
  }
  if (wake) Wake();
}

void RpcFrontend::OnRequest(size_t socket, std::vector<zmq::message_t>& msg) {
  // A DEALER's message reaches the ROUTER as [routing id, frames...].
  std::string route = msg.empty() ? std::string() : msg[0].to_string();
  auto bad = [&](uint64_t id, std::string why) {
    ++bad_envelopes_;
    Call(this, socket, route, id).ReplyError(InvalidArgumentError(std::move(why)));
  };
  if (msg.size() < 2) return bad(0, "empty message: expected a salus.v1.Request envelope frame");
  zmq::message_t& env = msg[1];
  if (env.size() > kMaxEnvelopeBytes) {
    return bad(0, fmt::format("envelope of {} bytes exceeds the limit of {} bytes", env.size(),
                              kMaxEnvelopeBytes));
  }
  v1::Request req;
  if (env.size() == 0 || !req.ParseFromArray(env.data(), static_cast<int>(env.size()))) {
    return bad(0, fmt::format("frame 0 ({} bytes) is not a salus.v1.Request", env.size()));
  }
  Call call(this, socket, route, req.request_id());
  call.principal_ = MessageUserId(env);
  call.envelope_bytes_ = env.size();
  call.request_ = std::move(req);
  for (size_t i = 2; i < msg.size(); ++i) call.frames_.push_back(std::move(msg[i]));
  handler_(std::move(call));
}

bool RpcFrontend::ServeZap() {
  int served = 0;
  for (; served < kBurst; ++served) {
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(zap_, std::back_inserter(req), zmq::recv_flags::dontwait)) break;
    // version, request id, domain, address, routing id, mechanism, credentials...
    std::string code = "200", text = "OK", user;
    if (req.size() < 6) {
      code = "500";
      text = "malformed ZAP request";
    } else {
      const std::string domain = req[2].to_string(), address = req[3].to_string();
      const std::string mechanism = req[5].to_string();
      if (mechanism == "CURVE" && req.size() >= 7 && req[6].size() == kCurveKeyBytes) {
        char z85[kCurveKeyBytes * 5 / 4 + 1];
        zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), kCurveKeyBytes);
        const bool listed =
            std::find(curve_.allowed.begin(), curve_.allowed.end(), z85) != curve_.allowed.end();
        if (curve_.open || listed) {
          user = fmt::format("curve:{}", z85);
        } else {
          code = "400";
          text = "this key is not allowed";
          logging::Get("server")->debug("rpc: refused CURVE key {} from {}", z85, address);
        }
      } else if (mechanism == "NULL" && domain == kIpcDomain) {
        user = IpcPrincipal(address);
      } else if (mechanism == "NULL" && domain == kTcpDomain) {
        user = fmt::format("tcp:{}", address);
      } else {
        code = "400";
        text = "this listener does not accept that mechanism";
      }
    }
    std::vector<zmq::message_t> reply;
    reply.emplace_back(std::string_view("1.0"));
    reply.push_back(req.size() > 1 ? std::move(req[1]) : zmq::message_t());
    reply.emplace_back(code);
    reply.emplace_back(text);
    reply.emplace_back(user);
    reply.emplace_back();
    try {
      zmq::send_multipart(zap_, reply, zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      logging::Get("server")->error("rpc: answering ZAP failed: {}", e.what());
    }
  }
  return served == kBurst || (zap_.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
}

void RpcFrontend::Loop() {
  std::vector<pollfd> fds;
  for (int fd : router_fds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({zap_.get(zmq::sockopt::fd), POLLIN, 0});
  fds.push_back({wake_fd_, POLLIN, 0});
  std::vector<std::pair<size_t, std::vector<zmq::message_t>>> batch;
  while (!stopping_.load()) {
    bool more = false;
    const Nanos pass = SteadyClock::Get()->Now();
    {
      MutexLock lock(&sock_mu_);
      for (size_t i = 0; i < routers_.size(); ++i) {
        int burst = 0;
        for (; burst < kBurst; ++burst) {
          std::vector<zmq::message_t> msg;
          if (!zmq::recv_multipart(routers_[i], std::back_inserter(msg),
                                   zmq::recv_flags::dontwait)) {
            break;
          }
          ++received_;
          if (!Park(i, msg)) batch.emplace_back(i, std::move(msg));
        }
        // Note [Sending from any thread]: sleep only when nothing is waiting.
        if (burst == kBurst || (routers_[i].get(zmq::sockopt::events) & ZMQ_POLLIN) != 0) {
          more = true;
        }
      }
    }
    if (ServeZap()) more = true;
    // Handlers reply through Post, which takes the lock: call them outside it.
    for (auto& [socket, msg] : batch) OnRequest(socket, msg);
    batch.clear();
    // Everything that had arrived when this pass began has been read (Note [Leases and stalls]).
    if (!more) caught_up_ns_.store(pass.count());
    const bool backlog = FlushBacklogs(&batch);
    if (!batch.empty()) {  // requests parked while their peers' replies waited
      for (auto& [socket, msg] : batch) OnRequest(socket, msg);
      batch.clear();
      more = true;
    }
    if (more) continue;
    // Asleep, the thread still wakes now and then: to mark its progress, and to send backlogs
    // on (Note [Replies a peer does not read]).
    if (poll(fds.data(), fds.size(), backlog ? kBacklogPollMs : kIdlePollMs) < 0) {
      if (errno == EINTR) continue;
      logging::Get("server")->error("rpc: poll failed: {}", std::strerror(errno));
      break;
    }
    if (fds.back().revents & POLLIN) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof(count));
    }
  }
}

}  // namespace salus::server
