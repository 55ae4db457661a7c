#include "server/rpc_frontend.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>

#include "common/logging.h"

namespace salus::server {
namespace {

// Internal control frame: one byte, posted by Stop() to wake the I/O thread.
constexpr char kStopFrame[] = "\x00stop";
std::atomic<uint64_t> g_frontend_seq{0};

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

}  // namespace

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
      request_(std::move(o.request_)),
      frames_(std::move(o.frames_)) {
  o.frontend_ = nullptr;
}

Call::~Call() {
  if (frontend_ != nullptr) {
    ReplyError(InternalError("the server dropped this request without an answer"));
  }
}

std::string Call::peer() const { return fmt::format("{}:{}", socket_, Hex(route_)); }

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
}

void Call::ReplyError(const Status& status) {
  v1::Reply reply;
  ToProto(status.ok() ? InternalError("error reply with an OK status") : status,
          reply.mutable_status());
  Reply(std::move(reply));
}

RpcFrontend::RpcFrontend(Handler handler) : handler_(std::move(handler)), ctx_(1) {}

StatusOr<std::unique_ptr<RpcFrontend>> RpcFrontend::Create(
    const std::vector<std::string>& endpoints, Handler handler) {
  if (endpoints.empty()) return InvalidArgumentError("no endpoint to listen on");
  std::unique_ptr<RpcFrontend> fe(new RpcFrontend(std::move(handler)));
  for (const std::string& ep : endpoints) {
    zmq::socket_t s(fe->ctx_, zmq::socket_type::router);
    s.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::router_mandatory, 0);
    try {
      s.bind(ep);
    } catch (const zmq::error_t& e) {
      return UnavailableError(fmt::format("cannot listen on '{}': {}", ep, e.what()));
    }
    fe->endpoints_.push_back(s.get(zmq::sockopt::last_endpoint));
    fe->routers_.push_back(std::move(s));
  }
  fe->inproc_ = fmt::format("inproc://salus-replies-{}", g_frontend_seq++);
  fe->reply_pull_ = zmq::socket_t(fe->ctx_, zmq::socket_type::pull);
  fe->reply_pull_.bind(fe->inproc_);
  {
    MutexLock lock(&fe->push_mu_);
    fe->reply_push_ = zmq::socket_t(fe->ctx_, zmq::socket_type::push);
    fe->reply_push_.set(zmq::sockopt::sndhwm, 0);  // never drop a reply
    fe->reply_push_.connect(fe->inproc_);
  }
  return fe;
}

RpcFrontend::~RpcFrontend() {
  Stop();
  {
    MutexLock lock(&push_mu_);
    reply_push_.close();
  }
  reply_pull_.close();
  for (auto& r : routers_) r.close();
}

void RpcFrontend::Start() {
  if (started_.exchange(true)) return;
  io_ = std::thread([this] { Loop(); });
}

void RpcFrontend::Stop() {
  if (!started_.load() || stopping_.exchange(true)) return;
  {
    MutexLock lock(&push_mu_);
    std::vector<zmq::message_t> msg;
    msg.emplace_back(kStopFrame, sizeof(kStopFrame) - 1);
    zmq::send_multipart(reply_push_, msg);
  }
  if (io_.joinable()) io_.join();
}

void RpcFrontend::Post(size_t socket, const std::string& route,
                       std::vector<zmq::message_t> frames) {
  // Header frame for the I/O thread: the socket index (8 bytes) and the route.
  std::string header(sizeof(uint64_t), '\0');
  const uint64_t idx = socket;
  std::memcpy(header.data(), &idx, sizeof(idx));
  header += route;
  std::vector<zmq::message_t> msg;
  msg.reserve(frames.size() + 1);
  msg.emplace_back(header.data(), header.size());
  for (auto& f : frames) msg.push_back(std::move(f));
  MutexLock lock(&push_mu_);
  zmq::send_multipart(reply_push_, msg);
}

void RpcFrontend::SendDirect(size_t socket, const std::string& route, v1::Reply reply) {
  std::string bytes;
  reply.SerializeToString(&bytes);
  std::vector<zmq::message_t> out;
  out.emplace_back(route.data(), route.size());
  out.emplace_back(bytes.data(), bytes.size());
  zmq::send_multipart(routers_[socket], out, zmq::send_flags::dontwait);
}

void RpcFrontend::OnRequest(size_t socket, std::vector<zmq::message_t>& msg) {
  ++received_;
  // A DEALER's message reaches the ROUTER as [routing id, frames...].
  std::string route = msg.empty() ? std::string() : msg[0].to_string();
  auto bad = [&](uint64_t id, std::string why) {
    ++bad_envelopes_;
    v1::Reply reply;
    reply.set_request_id(id);
    ToProto(InvalidArgumentError(std::move(why)), reply.mutable_status());
    SendDirect(socket, route, std::move(reply));
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
  call.request_ = std::move(req);
  for (size_t i = 2; i < msg.size(); ++i) call.frames_.push_back(std::move(msg[i]));
  handler_(std::move(call));
}

void RpcFrontend::Loop() {
  std::vector<zmq::pollitem_t> items;
  for (auto& r : routers_) items.push_back({r.handle(), 0, ZMQ_POLLIN, 0});
  items.push_back({reply_pull_.handle(), 0, ZMQ_POLLIN, 0});
  const size_t pull_index = items.size() - 1;
  bool stop = false;
  while (!stop) {
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      logging::Get("server")->error("rpc: poll failed: {}", e.what());
      break;
    }
    // Replies first, so answers go out before new work comes in.
    if (items[pull_index].revents & ZMQ_POLLIN) {
      for (int burst = 0; burst < 256; ++burst) {
        std::vector<zmq::message_t> msg;
        if (!zmq::recv_multipart(reply_pull_, std::back_inserter(msg), zmq::recv_flags::dontwait)) {
          break;
        }
        if (msg.size() == 1 &&
            msg[0].to_string_view() == std::string_view(kStopFrame, sizeof(kStopFrame) - 1)) {
          stop = true;
          continue;
        }
        uint64_t idx = 0;
        std::memcpy(&idx, msg[0].data(), sizeof(idx));
        const std::string route(static_cast<const char*>(msg[0].data()) + sizeof(idx),
                                msg[0].size() - sizeof(idx));
        msg[0].rebuild(route.data(), route.size());
        // A peer that went away loses its reply; the ROUTER drops it silently.
        zmq::send_multipart(routers_[idx], msg, zmq::send_flags::dontwait);
      }
    }
    for (size_t i = 0; i < routers_.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      for (int burst = 0; burst < 256; ++burst) {
        std::vector<zmq::message_t> msg;
        if (!zmq::recv_multipart(routers_[i], std::back_inserter(msg), zmq::recv_flags::dontwait)) {
          break;
        }
        OnRequest(i, msg);
      }
    }
  }
}

}  // namespace salus::server
