// One C++ Client shared by several threads, each training its own session with iterations
// submitted ahead, while the client stages feeds in fewer shared buffers than there are
// iterations in flight. Every thread must see exactly the losses of a lone run with frames.
// Also built under TSan (label tsan), where the daemon is a TSan build too.
#include <gtest/gtest.h>

#include <deque>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "daemon_process.h"
#include "salus/client.h"

namespace {

using salus::client::Client;
using salus::client::PendingIteration;
using salus::client::Session;
using salus::client::Tensor;

constexpr int kThreads = 4, kSteps = 10, kInFlight = 2, kBatch = 16;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<Tensor> Batch(int step) {
  std::mt19937 rng(100 + step);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x(kBatch * 784);
  for (float& v : x) v = normal(rng);
  std::vector<int64_t> labels(kBatch);
  for (int64_t& v : labels) v = static_cast<int64_t>(rng() % 10);
  return {Tensor::Floats("x", {kBatch, 784}, x), Tensor::Int64s("labels", {kBatch}, labels)};
}

std::unique_ptr<Session> MlpSession(Client& c) {
  salus::client::SessionOptions o;
  o.model = ReadFile(SALUS_MODELS_DIR "/mlp.onnx");
  o.inputs = {{"x", {kBatch, 784}}, {"labels", {kBatch}}};
  o.loss = "loss";
  o.optimizer.lr = 0.05;
  auto s = c.CreateSession(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// Trains kSteps iterations, kInFlight submitted ahead; the losses in step order.
std::vector<float> Train(Session& s) {
  std::vector<float> losses;
  std::deque<std::unique_ptr<PendingIteration>> inflight;
  for (int step = 0; step < kSteps || !inflight.empty(); ++step) {
    if (step < kSteps) {
      auto p = s.Submit(Batch(step), {"loss"});
      if (!p.ok()) {
        ADD_FAILURE() << p.status().ToString();
        return losses;
      }
      inflight.push_back(std::move(*p));
      if (inflight.size() < kInFlight) continue;
    }
    auto out = inflight.front()->Wait();
    inflight.pop_front();
    if (!out.ok()) {
      ADD_FAILURE() << out.status().ToString();
      return losses;
    }
    losses.push_back(out->at("loss").floats()[0]);
  }
  return losses;
}

TEST(ClientThreads, SharedClientStagingMatchesFrames) {
  salus::testing::DaemonProcess daemon("fair", "salus-threads");
  ASSERT_TRUE(daemon.WaitReady());

  Client::Options frames_only;
  frames_only.stage_feeds_from = 0;
  auto lone = Client::Connect(daemon.endpoint(), frames_only);
  ASSERT_TRUE(lone.ok());
  auto lone_session = MlpSession(**lone);
  ASSERT_NE(lone_session, nullptr);
  const std::vector<float> want = Train(*lone_session);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

  Client::Options staged;
  staged.stage_feeds_from = 1;
  staged.max_staging_buffers = 3;  // fewer than the kThreads * kInFlight iterations in flight
  auto shared = Client::Connect(daemon.endpoint(), staged);
  ASSERT_TRUE(shared.ok());
  std::vector<std::unique_ptr<Session>> sessions;
  for (int t = 0; t < kThreads; ++t) sessions.push_back(MlpSession(**shared));
  std::vector<std::vector<float>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (sessions[t]) got[t] = Train(*sessions[t]);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], want) << "thread " << t;
  EXPECT_TRUE((*shared)->staging());
  EXPECT_EQ((*shared)->staging_buffers(), 3u);
  sessions.clear();
  lone_session.reset();
  shared->reset();
  lone->reset();
  EXPECT_EQ(daemon.Stop(), 0) << "the daemon did not drain cleanly";
}

}  // namespace
