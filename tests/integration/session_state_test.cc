// A session's persistent state through the C++ client: Session::state() lists it,
// SyncState writes and reads it without running (or counting) an iteration, Run's feeds and
// fetches may name it, and bad requests are INVALID_ARGUMENT naming the tensor. Also the
// CreateSession checks of TensorFlow-graph models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "daemon_process.h"
#include "salus/client.h"

namespace {

using salus::StatusCode;
using salus::client::Client;
using salus::client::DType;
using salus::client::Session;
using salus::client::SessionOptions;
using salus::client::Tensor;

constexpr int64_t kBatch = 16;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

SessionOptions Mlp() {
  SessionOptions o;
  o.model = ReadFile(SALUS_MODELS_DIR "/mlp.onnx");
  o.inputs = {{"x", {kBatch, 784}}, {"labels", {kBatch}}};
  o.loss = "loss";
  o.optimizer.lr = 0.05;
  return o;
}

std::vector<Tensor> Batch() {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x(kBatch * 784);
  for (float& v : x) v = normal(rng);
  std::vector<int64_t> labels(kBatch);
  for (int64_t& v : labels) v = static_cast<int64_t>(rng() % 10);
  return {Tensor::Floats("x", {kBatch, 784}, x), Tensor::Int64s("labels", {kBatch}, labels)};
}

float Loss(Session& s, std::vector<Tensor> feeds) {
  auto out = s.Run(feeds, {"loss"});
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? out->at("loss").floats()[0] : NAN;
}

int64_t IterationsDone(Client& c, const Session& s) {
  auto list = c.ListSessions();
  EXPECT_TRUE(list.ok());
  for (const auto& i : *list) {
    if (i.id == s.id()) return i.iterations_done;
  }
  return -1;
}

TEST(SessionState, ReadWriteAndErrors) {
  salus::testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.WaitReady());
  auto client = Client::Connect(daemon.endpoint());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Client& c = **client;

  auto session = c.CreateSession(Mlp());
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  Session& s = **session;
  // The parameters are listed with their dtype and shape.
  const auto& state = s.state();
  auto w1 =
      std::find_if(state.begin(), state.end(), [](const auto& t) { return t.name == "fc_w1"; });
  ASSERT_NE(w1, state.end());
  EXPECT_EQ(w1->dtype, DType::kFloat32);
  EXPECT_EQ(w1->shape, (std::vector<int64_t>{512, 784}));
  EXPECT_EQ(s.inputs().size(), 2u);

  const auto batch = Batch();
  const float first = Loss(s, batch);
  auto before = s.SyncState({}, {"fc_w1", "fc_b10"});
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_EQ(before->at("fc_w1").shape, (std::vector<int64_t>{512, 784}));
  Loss(s, batch);
  auto after = s.SyncState({}, {"fc_w1"});
  ASSERT_TRUE(after.ok());
  EXPECT_NE(after->at("fc_w1").data, before->at("fc_w1").data);  // trained
  EXPECT_EQ(s.last_stats().iteration, 1u);                       // SyncState leaves it alone

  // Zero weights: zero logits, so the loss is ln(10).
  std::vector<Tensor> zeros;
  for (const auto& t : state) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    zeros.push_back(Tensor::Floats(t.name, t.shape, std::vector<float>(n, 0.f)));
  }
  auto wrote = s.SyncState(zeros, {"fc_b10"});
  ASSERT_TRUE(wrote.ok()) << wrote.status().ToString();
  EXPECT_EQ(wrote->at("fc_b10").data, std::vector<std::byte>(10 * sizeof(float)));
  EXPECT_NEAR(Loss(s, batch), std::log(10.f), 1e-5);
  EXPECT_NE(first, std::log(10.f));
  EXPECT_EQ(IterationsDone(c, s), 3);

  // Errors name the tensor, and change nothing.
  struct Case {
    const char* what;
    std::vector<Tensor> writes;
    std::vector<std::string> reads;
    const char* name;
  };
  const std::vector<Case> cases = {
      {"unknown read", {}, {"nope"}, "'nope'"},
      {"unknown write", {Tensor::Floats("nope", {1}, {0.f})}, {}, "'nope'"},
      {"wrong shape", {Tensor::Floats("fc_b10", {11}, std::vector<float>(11))}, {}, "'fc_b10'"},
      {"wrong dtype", {Tensor::Int64s("fc_b10", {10}, std::vector<int64_t>(10))}, {}, "'fc_b10'"},
      {"an input", {batch[0]}, {}, "'x'"},
      {"an output", {}, {"loss"}, "'loss'"},
  };
  for (const Case& k : cases) {
    auto r = s.SyncState(k.writes, k.reads);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.what;
    EXPECT_NE(r.status().message().find(k.name), std::string::npos)
        << k.what << ": " << r.status().ToString();
  }
  auto unchanged = s.SyncState({}, {"fc_b10"});
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(IterationsDone(c, s), 3);
  EXPECT_LT(Loss(s, batch), std::log(10.f) + 1e-3);  // still trains

  // TensorFlow graphs: exactly one of onnx and tf_graph, and the tensors to fetch.
  SessionOptions both = Mlp();
  both.tf_graph = std::string("\x0a\x00", 2);
  both.outputs = {"y:0"};
  EXPECT_EQ(c.CreateSession(both).status().code(), StatusCode::kInvalidArgument);
  SessionOptions no_outputs;
  no_outputs.tf_graph = std::string("\x0a\x00", 2);
  EXPECT_EQ(c.CreateSession(no_outputs).status().code(), StatusCode::kInvalidArgument);
  SessionOptions twice = no_outputs;
  twice.outputs = {"y:0", "y:0"};
  EXPECT_EQ(c.CreateSession(twice).status().code(), StatusCode::kInvalidArgument);
  auto listed = c.ListSessions();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 1u);

  ASSERT_TRUE(s.Close().ok());
  session->reset();
  client->reset();  // unregisters its staging buffers while the daemon still answers
  EXPECT_EQ(daemon.Stop(), 0);
}

// reply_when_fetched: the loss is replied before the step ends (stats say so) and equals a
// twin session's replied at the end; a state read after it sees the step's updates.
TEST(SessionState, RepliesWhenFetchedMatchAndReadsFollowTheWholeStep) {
  salus::testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.WaitReady());
  auto client = Client::Connect(daemon.endpoint());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto early = (*client)->CreateSession(Mlp());
  auto late = (*client)->CreateSession(Mlp());
  ASSERT_TRUE(early.ok() && late.ok());
  const auto batch = Batch();
  for (int step = 0; step < 2; ++step) {
    auto a = (*early)->Run(batch, {"loss"}, /*reply_when_fetched=*/true);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_TRUE((*early)->last_stats().early);
    auto read_a = (*early)->SyncState({}, {"fc_w1"});
    auto b = (*late)->Run(batch, {"loss"});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_FALSE((*late)->last_stats().early);
    auto read_b = (*late)->SyncState({}, {"fc_w1"});
    ASSERT_TRUE(read_a.ok() && read_b.ok());
    EXPECT_EQ(a->at("loss").data, b->at("loss").data) << "step " << step;
    EXPECT_EQ(read_a->at("fc_w1").data, read_b->at("fc_w1").data) << "step " << step;
  }
  early->reset();
  late->reset();
  client->reset();
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
