// RpcFrontend over real ZeroMQ sockets: every request gets exactly one reply, whichever thread
// answers it and however requests and replies interleave (Note [Sending from any thread]).
#include "server/rpc_frontend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

namespace salus::server {
namespace {

using namespace std::chrono_literals;

std::string IpcEndpoint(const std::string& tag) {
  return "ipc://" + (std::filesystem::temp_directory_path() /
                     ("salus-rpc-test-" + std::to_string(getpid()) + "-" + tag))
                        .string();
}

// Answers calls on a pool of threads after a short random delay, or at once on the I/O
// thread, so replies race with requests arriving on the same ROUTER.
class Answerers {
 public:
  explicit Answerers(int threads) {
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this, i] {
        std::mt19937 rng(i);
        while (true) {
          std::optional<Call> call;
          {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;
            call.emplace(std::move(queue_.front()));
            queue_.pop_front();
          }
          if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
          Answer(*call);
        }
      });
    }
  }
  ~Answerers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  void Handle(Call call) {
    // Every third request is answered inline by the I/O thread.
    if (call.request().request_id() % 3 == 0) return Answer(call);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(call));
    }
    cv_.notify_one();
  }
  static void Answer(Call& call) {
    v1::Reply reply;
    reply.mutable_heartbeat();
    std::vector<zmq::message_t> frames;
    for (auto& f : call.frames()) frames.push_back(std::move(f));  // echo the tensor frames
    call.Reply(std::move(reply), std::move(frames));
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

TEST(RpcFrontendTest, EveryRequestGetsExactlyOneReplyUnderConcurrency) {
  Answerers answerers(3);
  auto fe =
      RpcFrontend::Create({IpcEndpoint("a")}, [&](Call c) { answerers.Handle(std::move(c)); });
  ASSERT_TRUE(fe.ok()) << fe.status();
  (*fe)->Start();
  constexpr int kClients = 4, kRequests = 400, kWindow = 8;
  std::vector<std::thread> clients;
  std::vector<int> answered(kClients, 0);
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      zmq::context_t ctx(1);
      zmq::socket_t s(ctx, zmq::socket_type::dealer);
      s.set(zmq::sockopt::linger, 0);
      s.connect((*fe)->endpoints()[0]);
      std::set<uint64_t> outstanding;
      uint64_t next = 1;
      const auto deadline = std::chrono::steady_clock::now() + 60s;
      while ((next <= kRequests || !outstanding.empty()) &&
             std::chrono::steady_clock::now() < deadline) {
        // Keep a window of requests in flight, each with a one-byte tensor frame.
        while (next <= kRequests && outstanding.size() < kWindow) {
          v1::Request req;
          req.set_request_id(next);
          req.mutable_heartbeat();
          std::vector<zmq::message_t> msg;
          msg.emplace_back(req.SerializeAsString());
          msg.emplace_back(&c, 1);
          zmq::send_multipart(s, msg);
          outstanding.insert(next++);
        }
        zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, 5s) == 0) break;  // a lost wake-up hangs here: fail, not hang
        std::vector<zmq::message_t> parts;
        ASSERT_TRUE(zmq::recv_multipart(s, std::back_inserter(parts)));
        ASSERT_EQ(parts.size(), 2u);
        v1::Reply reply;
        ASSERT_TRUE(reply.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size())));
        EXPECT_EQ(reply.status().code(), 0);
        EXPECT_EQ(*static_cast<const unsigned char*>(parts[1].data()), c);
        EXPECT_EQ(outstanding.erase(reply.request_id()), 1u) << "reply " << reply.request_id();
        answered[c]++;
      }
      EXPECT_TRUE(outstanding.empty()) << outstanding.size() << " requests never answered";
    });
  }
  for (auto& t : clients) t.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(answered[c], kRequests) << "client " << c;
  EXPECT_EQ((*fe)->requests_received(), uint64_t{kClients} * kRequests);
  (*fe)->Stop();
}

TEST(RpcFrontendTest, BadEnvelopeIsAnsweredAndAnUnansweredCallAnswersInternal) {
  auto fe = RpcFrontend::Create({IpcEndpoint("b")}, [](Call) {});  // drops every call
  ASSERT_TRUE(fe.ok()) << fe.status();
  (*fe)->Start();
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, 5000);
  s.connect((*fe)->endpoints()[0]);
  auto reply_to = [&](zmq::message_t frame) {
    s.send(std::move(frame), zmq::send_flags::none);
    zmq::message_t r;
    EXPECT_TRUE(s.recv(r));
    v1::Reply reply;
    EXPECT_TRUE(reply.ParseFromArray(r.data(), static_cast<int>(r.size())));
    return reply;
  };
  const v1::Reply bad = reply_to(zmq::message_t(std::string("\xff\xff\xff garbage")));
  EXPECT_EQ(bad.status().code(), static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(bad.status().message().find("not a salus.v1.Request"), std::string::npos);
  v1::Request req;
  req.set_request_id(7);
  req.mutable_heartbeat();
  const v1::Reply dropped = reply_to(zmq::message_t(req.SerializeAsString()));
  EXPECT_EQ(dropped.request_id(), 7u);
  EXPECT_EQ(dropped.status().code(), static_cast<int>(StatusCode::kInternal));
  EXPECT_EQ((*fe)->bad_envelopes(), 1u);
  (*fe)->Stop();
  (*fe)->Stop();  // idempotent
}

// Answers every call with its principal as the status message.
void EchoPrincipal(Call call) {
  v1::Reply reply;
  reply.mutable_status()->set_message(call.principal());
  call.Reply(std::move(reply));
}

// The principal the frontend names for one heartbeat from `s`, or nullopt without a reply
// within `wait` (a refused connection never gets one). The send does not block: once a refused
// handshake has dropped the connection's pipe, a DEALER has nowhere to queue the message.
std::optional<std::string> PrincipalOf(zmq::socket_t& s, std::chrono::milliseconds wait) {
  v1::Request req;
  req.set_request_id(1);
  req.mutable_heartbeat();
  if (!s.send(zmq::message_t(req.SerializeAsString()), zmq::send_flags::dontwait)) {
    return std::nullopt;
  }
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, wait) == 0) return std::nullopt;
  zmq::message_t r;
  EXPECT_TRUE(s.recv(r));
  v1::Reply reply;
  EXPECT_TRUE(reply.ParseFromArray(r.data(), static_cast<int>(r.size())));
  return reply.status().message();
}

TEST(RpcFrontendTest, PrincipalIsThePeersUserOverIpcAndItsAddressOverTcp) {
  auto fe = RpcFrontend::Create({IpcEndpoint("p"), "tcp://127.0.0.1:0"}, EchoPrincipal);
  ASSERT_TRUE(fe.ok()) << fe.status();
  (*fe)->Start();
  zmq::context_t ctx(1);
  for (const auto& [ep, want] :
       {std::pair{(*fe)->endpoints()[0], "uid:" + std::to_string(geteuid())},
        std::pair{(*fe)->endpoints()[1], std::string("tcp:127.0.0.1")}}) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(ep);
    EXPECT_EQ(PrincipalOf(s, 20s), want) << ep;
  }
  (*fe)->Stop();
}

TEST(RpcFrontendTest, CurveListenerAdmitsListedKeysOnly) {
  char server_public[41], server_secret[41], listed_public[41], listed_secret[41], other_public[41],
      other_secret[41];
  ASSERT_EQ(zmq_curve_keypair(server_public, server_secret), 0);
  ASSERT_EQ(zmq_curve_keypair(listed_public, listed_secret), 0);
  ASSERT_EQ(zmq_curve_keypair(other_public, other_secret), 0);
  CurveServer curve{server_secret, {listed_public}, false};
  auto fe = RpcFrontend::Create({Listener{"tcp://127.0.0.1:0", true}}, curve, EchoPrincipal);
  ASSERT_TRUE(fe.ok()) << fe.status();
  (*fe)->Start();
  zmq::context_t ctx(1);
  auto client = [&](const char* pub, const char* sec) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    if (pub != nullptr) {
      s.set(zmq::sockopt::curve_serverkey, std::string(server_public));
      s.set(zmq::sockopt::curve_publickey, std::string(pub));
      s.set(zmq::sockopt::curve_secretkey, std::string(sec));
    }
    s.connect((*fe)->endpoints()[0]);
    return s;
  };
  zmq::socket_t listed = client(listed_public, listed_secret);
  EXPECT_EQ(PrincipalOf(listed, 20s), std::string("curve:") + listed_public);
  zmq::socket_t unlisted = client(other_public, other_secret);
  EXPECT_EQ(PrincipalOf(unlisted, 1s), std::nullopt);
  zmq::socket_t plain = client(nullptr, nullptr);
  EXPECT_EQ(PrincipalOf(plain, 1s), std::nullopt);
  EXPECT_EQ((*fe)->requests_received(), 1u);  // nothing from the refused two reached it
  (*fe)->Stop();
}

TEST(RpcFrontendTest, OpenCurveListenerAdmitsAnyKey) {
  char server_public[41], server_secret[41], pub[41], sec[41];
  ASSERT_EQ(zmq_curve_keypair(server_public, server_secret), 0);
  ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
  auto fe = RpcFrontend::Create({Listener{"tcp://127.0.0.1:0", true}},
                                CurveServer{server_secret, {}, true}, EchoPrincipal);
  ASSERT_TRUE(fe.ok()) << fe.status();
  (*fe)->Start();
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::curve_serverkey, std::string(server_public));
  s.set(zmq::sockopt::curve_publickey, std::string(pub));
  s.set(zmq::sockopt::curve_secretkey, std::string(sec));
  s.connect((*fe)->endpoints()[0]);
  EXPECT_EQ(PrincipalOf(s, 20s), std::string("curve:") + pub);
  (*fe)->Stop();
}

TEST(RpcFrontendTest, EndpointThatCannotBeBoundIsNamed) {
  auto fe = RpcFrontend::Create({"tcp://256.0.0.1:1"}, [](Call) {});
  ASSERT_FALSE(fe.ok());
  EXPECT_NE(fe.status().message().find("tcp://256.0.0.1:1"), std::string::npos);
}

// Note [Replies a peer does not read]: a client that pipelines more requests than ZeroMQ's
// queues hold before reading any reply gets every reply once it reads; past the backlog, it
// gets the replies that were kept and one notice of how many were dropped.
void PipelineThenRead(uint64_t backlog, uint64_t backlog_bytes, int requests, int* replies,
                      int* notices) {
  auto fe = RpcFrontend::Create(
      {Listener{IpcEndpoint("hwm" + std::to_string(backlog) + "-" + std::to_string(backlog_bytes)),
                false}},
      CurveServer{}, [](Call c) { Answerers::Answer(c); }, backlog, backlog_bytes);
  ASSERT_TRUE(fe.ok()) << fe.status();
  (*fe)->Start();
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvhwm, 10);  // the client's own queue holds little
  s.connect((*fe)->endpoints()[0]);
  for (int i = 1; i <= requests; ++i) {
    v1::Request req;
    req.set_request_id(static_cast<uint64_t>(i));
    req.mutable_heartbeat();
    // A frame of 16 KiB that comes back in the reply: more than the sockets' buffers hold.
    std::vector<zmq::message_t> msg;
    msg.emplace_back(req.SerializeAsString());
    msg.emplace_back(std::string(16 * 1024, 'x'));
    zmq::send_multipart(s, msg);
  }
  // Read nothing until every request was answered (kept or dropped).
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while ((*fe)->requests_received() < static_cast<uint64_t>(requests) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ((*fe)->requests_received(), static_cast<uint64_t>(requests));
  // Reads until every request is accounted for, answered or dropped (and, when any was
  // dropped, the notice came): no wait for silence, whose length a busy machine can change.
  std::set<uint64_t> seen;
  auto settled = [&] {
    const uint64_t dropped = (*fe)->dropped_replies();
    return seen.size() + dropped == static_cast<uint64_t>(requests) &&
           (dropped == 0 || *notices > 0);
  };
  const auto read_until = std::chrono::steady_clock::now() + 60s;
  while (!settled() && std::chrono::steady_clock::now() < read_until) {
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, 100ms) == 0) continue;
    std::vector<zmq::message_t> parts;
    ASSERT_TRUE(zmq::recv_multipart(s, std::back_inserter(parts)));
    v1::Reply reply;
    ASSERT_TRUE(reply.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size())));
    if (reply.request_id() == 0) {
      EXPECT_EQ(reply.status().code(), static_cast<int>(StatusCode::kResourceExhausted));
      EXPECT_NE(reply.status().message().find("limits.reply_backlog"), std::string::npos);
      ++*notices;
      continue;
    }
    EXPECT_TRUE(seen.insert(reply.request_id()).second) << "twice: " << reply.request_id();
  }
  *replies = static_cast<int>(seen.size());
  EXPECT_EQ(static_cast<uint64_t>(*replies) + (*fe)->dropped_replies(),
            static_cast<uint64_t>(requests));
  (*fe)->Stop();
}

TEST(RpcFrontendTest, RepliesAPeerDoesNotReadAreKeptUntilItDoes) {
  int replies = 0, notices = 0;
  PipelineThenRead(kDefaultReplyBacklog, kDefaultReplyBacklogBytes, 3000, &replies, &notices);
  EXPECT_EQ(replies, 3000);
  EXPECT_EQ(notices, 0);
}

TEST(RpcFrontendTest, PastTheBacklogRepliesAreDroppedAndThePeerIsTold) {
  int replies = 0, notices = 0;
  PipelineThenRead(5, kDefaultReplyBacklogBytes, 3000, &replies, &notices);
  EXPECT_LT(replies, 3000);
  EXPECT_EQ(notices, 1);
}

TEST(RpcFrontendTest, TheBacklogIsBoundedInBytesToo) {
  int replies = 0, notices = 0;
  PipelineThenRead(kDefaultReplyBacklog, 1 << 20, 3000, &replies, &notices);  // 64 replies
  EXPECT_LT(replies, 3000);
  EXPECT_EQ(notices, 1);
}

}  // namespace
}  // namespace salus::server
