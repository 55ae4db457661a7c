// Several client processes train real models through one salus-server at once; each must
// reach exactly the losses of the same executable run in-process (within 1e-6): on the CPU,
// and on cuda:0 where there is a usable GPU (labelled gpu; skipped otherwise).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "daemon_process.h"
#include "exec/device.h"
#include "exec/executable.h"
#include "salus/client.h"

namespace {

constexpr int kSteps = 12;

struct ModelCase {
  const char* file;
  std::map<std::string, std::vector<int64_t>> inputs;
  // Label inputs are int64 in [0, classes); everything else float32 in N(0, 1).
  std::string label_input;
  int classes = 10;
};

const std::vector<ModelCase>& Cases() {
  static const std::vector<ModelCase> cases = {
      {"mlp.onnx", {{"x", {16, 784}}, {"labels", {16}}}, "labels"},
      {"lenet5.onnx", {{"x", {8, 1, 28, 28}}, {"labels", {8}}}, "labels"},
      {"espcn.onnx", {{"x", {4, 1, 16, 16}}, {"target", {4, 1, 48, 48}}}, ""},
  };
  return cases;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The seeded feeds of step `step` of case `c`, identical for the daemon and in-process runs.
std::vector<salus::client::Tensor> Feeds(const ModelCase& c, int step) {
  std::mt19937 rng(7);  // one fixed batch: the model can fit it, so the loss falls
  (void)step;
  std::normal_distribution<float> normal(0, 1);
  std::vector<salus::client::Tensor> out;
  for (const auto& [name, dims] : c.inputs) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    if (name == c.label_input) {
      std::vector<int64_t> v(n);
      for (auto& x : v) x = static_cast<int64_t>(rng() % c.classes);
      out.push_back(salus::client::Tensor::Int64s(name, dims, v));
    } else {
      std::vector<float> v(n);
      for (auto& x : v) x = normal(rng);
      out.push_back(salus::client::Tensor::Floats(name, dims, v));
    }
  }
  return out;
}

salus::client::Optimizer Sgd() {
  salus::client::Optimizer o;
  o.lr = 0.02;
  o.momentum = 0.9;
  return o;
}

std::vector<float> TrainInProcess(const ModelCase& c, const salus::exec::Device& device) {
  salus::exec::CompileOptions o;
  o.device = device;
  for (const auto& [name, dims] : c.inputs) o.input_shapes[name] = dims;
  o.mode = salus::exec::Mode::kTraining;
  o.loss = "loss";
  o.optimizer.learning_rate = 0.02f;
  o.optimizer.momentum = 0.9f;
  auto exe =
      salus::exec::Executable::Compile(ReadFile(std::string(SALUS_MODELS_DIR "/") + c.file), o);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  auto persistent =
      salus::exec::DeviceBuffer::Allocate((*exe)->runtime(), (*exe)->persistent_bytes());
  auto lane = salus::exec::DeviceBuffer::Allocate((*exe)->runtime(), (*exe)->ephemeral_bytes());
  if (!persistent.ok() || !lane.ok()) {
    ADD_FAILURE() << (persistent.ok() ? lane.status() : persistent.status());
    return {};
  }
  if (salus::Status st = (*exe)->InitializePersistent(persistent->get()); !st.ok()) {
    ADD_FAILURE() << st;
    return {};
  }
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    auto feeds = Feeds(c, step);
    std::vector<const void*> ptrs;
    for (const auto& info : (*exe)->inputs()) {
      for (const auto& f : feeds) {
        if (f.name == info.name) ptrs.push_back(f.data.data());
      }
    }
    float loss = 0;
    std::vector<void*> fetches = {&loss};
    EXPECT_TRUE((*exe)->Run(persistent->get(), lane->get(), ptrs, fetches).ok());
    losses.push_back(loss);
  }
  return losses;
}

struct TrainingRun {
  const ModelCase* c;
  bool pipelined;
  uint64_t stage_feeds_from = 0;  // 0: every feed in a frame
  int max_staging_buffers = 4;
  std::string Describe() const {
    return std::string(pipelined ? "pipelined" : "one call at a time") +
           (stage_feeds_from
                ? ", staged in at most " + std::to_string(max_staging_buffers) + " shared buffers"
                : ", frames");
  }
};

// Child process: trains a run's case through the daemon and writes its losses to `fd`.
// Pipelined, it keeps three iterations submitted ahead of the one it collects.
int TrainThroughDaemon(const std::string& endpoint, const TrainingRun& run, int fd) {
  const ModelCase& c = *run.c;
  const bool pipelined = run.pipelined;
  salus::client::Client::Options options;
  options.stage_feeds_from = run.stage_feeds_from;
  options.max_staging_buffers = run.max_staging_buffers;
  auto client = salus::client::Client::Connect(endpoint, options);
  if (!client.ok()) return 10;
  salus::client::SessionOptions o;
  o.model = ReadFile(std::string(SALUS_MODELS_DIR "/") + c.file);
  o.inputs = c.inputs;
  o.loss = "loss";
  o.optimizer = Sgd();
  o.name = c.file;
  auto session = (*client)->CreateSession(o);
  if (!session.ok()) return 11;
  std::deque<std::unique_ptr<salus::client::PendingIteration>> inflight;
  for (int step = 0; step < kSteps || !inflight.empty(); ++step) {
    salus::StatusOr<std::map<std::string, salus::client::Tensor>> out =
        salus::UnknownError("no iteration");
    if (!pipelined) {
      out = (*session)->Run(Feeds(c, step), {"loss"});
    } else {
      if (step < kSteps) {
        auto p = (*session)->Submit(Feeds(c, step), {"loss"});
        if (!p.ok()) return 15;
        inflight.push_back(std::move(*p));
      }
      if (inflight.size() < 4 && step < kSteps) continue;
      out = inflight.front()->Wait();
      inflight.pop_front();
    }
    if (!out.ok()) return 12;
    const float loss = out->at("loss").floats()[0];
    if (write(fd, &loss, sizeof(loss)) != sizeof(loss)) return 13;
  }
  if (run.stage_feeds_from > 0) {
    // Staging was never refused, and filled every staging buffer the client may hold (with
    // four iterations in flight), each one registered with the daemon.
    if (!(*client)->staging()) return 16;
    if ((*client)->staging_buffers() != static_cast<size_t>(run.max_staging_buffers)) return 17;
    auto stats = (*client)->StatsJson();
    const auto at = stats.ok() ? stats->find("\"shared_buffers\":") : std::string::npos;
    if (at == std::string::npos) return 18;
    if (std::stoul(stats->substr(at + 17)) < (*client)->staging_buffers()) return 19;
  }
  return (*session)->Close().ok() ? 0 : 14;
}

// The runs of ConcurrentClientsMatchInProcessLosses on a daemon of `device`, each compared
// with the same executable trained in-process on `device`.
void ExpectDaemonMatchesInProcess(const salus::exec::Device& device) {
  salus::testing::DaemonProcess daemon("pack", "salus-it", device.name().c_str());
  ASSERT_TRUE(daemon.WaitReady());
  struct Child {
    pid_t pid;
    int fd;
  };
  std::vector<Child> children;
  // Every case one call at a time, and the first again with iterations submitted ahead: with
  // frames, with every feed staged, and with fewer staging buffers than iterations in flight.
  std::vector<TrainingRun> runs;
  for (const ModelCase& c : Cases()) runs.push_back({&c, false});
  runs.push_back({&Cases()[0], true});
  runs.push_back({&Cases()[0], true, 1, 4});
  runs.push_back({&Cases()[0], true, 1, 2});
  for (const TrainingRun& run : runs) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      _exit(TrainThroughDaemon(daemon.endpoint(), run, fds[1]));
    }
    close(fds[1]);
    children.push_back({pid, fds[0]});
  }
  std::vector<std::vector<float>> remote(children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    float v;
    while (read(children[i].fd, &v, sizeof(v)) == sizeof(v)) remote[i].push_back(v);
    close(children[i].fd);
    int status = 0;
    waitpid(children[i].pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << runs[i].c->file << ", " << runs[i].Describe() << ": client exited with "
        << WEXITSTATUS(status);
  }
  for (size_t i = 0; i < children.size(); ++i) {
    const ModelCase& c = *runs[i].c;
    SCOPED_TRACE(runs[i].Describe());
    const std::vector<float> local = TrainInProcess(c, device);
    ASSERT_EQ(remote[i].size(), static_cast<size_t>(kSteps)) << c.file;
    ASSERT_EQ(local.size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(remote[i][s], local[s], 1e-6 * std::max(1.0f, std::abs(local[s])))
          << c.file << " step " << s;
    }
    EXPECT_LT(local.back(), local.front()) << c.file << " did not learn";
  }
  EXPECT_EQ(daemon.Stop(), 0) << "the daemon did not drain cleanly";
}

TEST(TrainingThroughDaemon, ConcurrentClientsMatchInProcessLosses) {
  ExpectDaemonMatchesInProcess(salus::exec::Device{});
}

TEST(TrainingThroughDaemon, CudaDaemonMatchesInProcessOnCuda) {
  const salus::exec::Device gpu{salus::exec::DeviceType::kCuda, 0};
  auto rt = salus::exec::DeviceRuntime::For(gpu);
  if (!rt.ok()) GTEST_SKIP() << "needs a GPU: " << rt.status();
  if (auto ctx = (*rt)->ThreadContext(); !ctx.ok()) GTEST_SKIP() << "needs a GPU: " << ctx.status();
  ExpectDaemonMatchesInProcess(gpu);
}

}  // namespace
