// The reference models (benchmarks/models/*.onnx) on the CUDA device: inference of each, at a
// batch of one and at the batch the models test trains with, fetching every graph output as the
// daemon does (the loss too), must match the CPU within 1e-4 relative and be bit-identical when
// run again in another lane (cuda_parity.h). Executables of one model running concurrently on
// threads of their own (each with its own stream) must each reproduce their own first result
// bit for bit. The five reference models train on cuda:0 as on the CPU. Skipped without a
// usable GPU.
//
// The models are read from $SALUS_MODELS_DIR when it is set (a copy of the test binary run in
// another checkout), else from the source tree's benchmarks/models.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_parity.h"

namespace salus::exec {
namespace {

using testing::ExpectCudaParity;
using testing::ParityOptions;
using testing::RandomFeeds;
using testing::RunOnce;

constexpr int kClasses = 10;  // the classifiers' labels are in [0, kClasses)

std::string ModelsDir() {
  const char* env = std::getenv("SALUS_MODELS_DIR");
  return env != nullptr && *env != '\0' ? env : SALUS_MODELS_DIR;
}

std::string ReadModel(const std::string& name) {
  std::ifstream f(ModelsDir() + "/" + name + ".onnx", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Input shapes of a reference model at batch `n` (make_models.py, make_torch_models.py).
std::map<std::string, Shape> InputShapes(const std::string& model, int64_t n) {
  if (model == "mlp") return {{"x", {n, 784}}, {"labels", {n}}};
  if (model == "lenet5") return {{"x", {n, 1, 28, 28}}, {"labels", {n}}};
  if (model == "resnet") return {{"x", {n, 3, 32, 32}}, {"labels", {n}}};
  if (model == "espcn") return {{"x", {n, 1, 16, 16}}, {"target", {n, 1, 48, 48}}};
  if (model == "vae") return {{"x", {n, 784}}, {"eps", {n, 20}}};
  // make_torch_models.py: images or 32 tokens, and labels.
  if (model == "resnet18" || model == "mobilenetv2" || model == "mobilenetv3") {
    return {{"x", {n, 3, 32, 32}}, {"labels", {n}}};
  }
  if (model == "transformer" || model == "lstm" || model == "hf_bert") {
    return {{"tokens", {n, 32}}, {"labels", {n}}};
  }
  if (model == "gpt" || model == "hf_gpt2") return {{"tokens", {n, 32}}, {"labels", {n, 32}}};
  ADD_FAILURE() << "unknown model " << model;
  return {};
}

CompileOptions Inference(const std::string& model, int64_t batch) {
  CompileOptions o;
  o.mode = Mode::kInference;
  o.input_shapes = InputShapes(model, batch);
  return o;  // fetches: every graph output, as the daemon compiles inference sessions
}

// Training with SGD (rate 0.01, momentum 0.9) on a batch of `batch`, minimising "loss".
CompileOptions SgdTraining(const std::string& model, int64_t batch) {
  CompileOptions o = Inference(model, batch);
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer.learning_rate = 0.01f;
  o.optimizer.momentum = 0.9f;
  return o;
}

// Losses and parameters within 1e-3 relative of the CPU's, the optimizer state within
// `state_norm_rtol` of its norm.
ParityOptions TrainingParity(double state_norm_rtol) {
  ParityOptions p;
  p.int_hi = kClasses;
  p.rtol = 1e-3;
  p.atol = 1e-4;
  p.state_norm_rtol = state_norm_rtol;
  return p;
}

struct ModelCase {
  std::string model;
  int64_t batch;
};

std::string CaseName(const ::testing::TestParamInfo<ModelCase>& info) {
  return info.param.model + "_batch" + std::to_string(info.param.batch);
}

class CudaModelsTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(CudaModelsTest, InferenceMatchesCpu) {
  SALUS_REQUIRE_GPU();
  const ModelCase& c = GetParam();
  const std::string bytes = ReadModel(c.model);
  ASSERT_FALSE(bytes.empty()) << "cannot read " << ModelsDir() << "/" << c.model << ".onnx";
  ParityOptions p;
  p.int_hi = kClasses;
  const std::vector<HostTensor> cpu = ExpectCudaParity(bytes, Inference(c.model, c.batch), p);
  EXPECT_FALSE(cpu.empty());
}

// Every reference model at a batch of one (cuBLAS's and cuDNN's small-problem paths) and at the
// batch of the models test (exec_models_test).
INSTANTIATE_TEST_SUITE_P(ReferenceModels, CudaModelsTest,
                         ::testing::Values(ModelCase{"mlp", 1}, ModelCase{"mlp", 32},
                                           ModelCase{"lenet5", 1}, ModelCase{"lenet5", 32},
                                           ModelCase{"resnet", 1}, ModelCase{"resnet", 32},
                                           ModelCase{"espcn", 1}, ModelCase{"espcn", 8},
                                           ModelCase{"vae", 1}, ModelCase{"vae", 32}),
                         CaseName);

// The models exported by PyTorch (BatchNorm folded, ReLU6, attention, embeddings, an LSTM);
// token inputs and labels are small indices.
INSTANTIATE_TEST_SUITE_P(ExportedModels, CudaModelsTest,
                         ::testing::Values(ModelCase{"resnet18", 1}, ModelCase{"resnet18", 8},
                                           ModelCase{"mobilenetv2", 1}, ModelCase{"mobilenetv2", 8},
                                           ModelCase{"mobilenetv3", 1}, ModelCase{"mobilenetv3", 8},
                                           ModelCase{"transformer", 1}, ModelCase{"transformer", 8},
                                           ModelCase{"gpt", 1}, ModelCase{"gpt", 8},
                                           ModelCase{"lstm", 1}, ModelCase{"lstm", 8},
                                           ModelCase{"hf_gpt2", 1}, ModelCase{"hf_gpt2", 8},
                                           ModelCase{"hf_bert", 1}, ModelCase{"hf_bert", 8}),
                         CaseName);

// One executable per thread, each thread on its own device context (its own stream and library
// handles), all running iterations at once: each must reproduce its first result bit for bit,
// and that result must match the CPU's.
TEST(CudaModelsConcurrencyTest, ConcurrentExecutablesOnTheirOwnStreams) {
  SALUS_REQUIRE_GPU();
  constexpr int kThreads = 4;
  constexpr int kIterations = 10;
  for (const char* name : {"mlp", "resnet"}) {
    const std::string model = name;
    SCOPED_TRACE(model);
    const std::string bytes = ReadModel(model);
    ASSERT_FALSE(bytes.empty());
    ParityOptions p;
    p.int_hi = kClasses;
    CompileOptions o = Inference(model, 16);
    const std::vector<HostTensor> want = ExpectCudaParity(bytes, o, p);
    ASSERT_FALSE(want.empty());
    o.device = Device{DeviceType::kCuda, 0};
    std::vector<std::unique_ptr<Executable>> exes;
    for (int t = 0; t < kThreads; ++t) {
      auto exe = Executable::Compile(bytes, o);
      ASSERT_TRUE(exe.ok()) << exe.status().ToString();
      exes.push_back(std::move(*exe));
    }
    const std::vector<HostTensor> feeds = RandomFeeds(*exes[0], p);
    std::vector<std::vector<HostTensor>> first(kThreads);
    std::vector<int> mismatches(kThreads, 0);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Executable& exe = *exes[t];
        auto persistent = DeviceBuffer::Allocate(exe.runtime(), exe.persistent_bytes());
        auto lane = DeviceBuffer::Allocate(exe.runtime(), exe.ephemeral_bytes());
        if (!persistent.ok() || !lane.ok()) {
          errors[t] = (persistent.ok() ? lane.status() : persistent.status()).ToString();
          return;
        }
        if (Status st = exe.InitializePersistent(persistent->get()); !st.ok()) {
          errors[t] = st.ToString();
          return;
        }
        for (int i = 0; i < kIterations; ++i) {
          std::vector<HostTensor> out = RunOnce(exe, persistent->get(), lane->get(), feeds);
          if (i == 0) {
            first[t] = std::move(out);
            continue;
          }
          for (size_t k = 0; k < out.size() && k < first[t].size(); ++k) {
            if (out[k].bytes != first[t][k].bytes) ++mismatches[t];
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_EQ(errors[t], "") << "thread " << t;
      EXPECT_EQ(mismatches[t], 0) << "thread " << t << ": an iteration differed from its first";
      ASSERT_EQ(first[t].size(), want.size()) << "thread " << t;
      for (size_t k = 0; k < want.size(); ++k) {
        testing::ExpectClose(want[k], first[t][k],
                             "thread " + std::to_string(t) + " " + exes[t]->fetches()[k].name, p);
      }
    }
  }
}

// The reference models train on cuda:0 as on the CPU: 20 steps of SGD with momentum (and of
// Adam for two of them) on a fixed random batch: every step's loss and the final parameters
// within 1e-3 relative of the CPU's, the optimizer state within 1e-2 of its norm (cuda_parity.h,
// state_norm_rtol); two GPU runs, one moving between lanes every other step, bit-identical.
TEST(CudaModelsTrainingTest, TrainingMatchesCpu) {
  SALUS_REQUIRE_GPU();
  constexpr int kSteps = 20;
  for (const char* name : {"mlp", "lenet5", "resnet", "espcn", "vae"}) {
    const std::string model = name;
    const std::string bytes = ReadModel(model);
    ASSERT_FALSE(bytes.empty()) << "cannot read " << ModelsDir() << "/" << model << ".onnx";
    const ParityOptions p = TrainingParity(1e-2);
    CompileOptions o = SgdTraining(model, 8);
    {
      SCOPED_TRACE(model + " sgd");
      const testing::Trained cpu = testing::ExpectTrainingParity(bytes, o, p, kSteps);
      EXPECT_EQ(cpu.steps.size(), static_cast<size_t>(kSteps));
    }
    if (model == "mlp" || model == "lenet5") {
      SCOPED_TRACE(model + " adam");
      o.optimizer.kind = OptimizerOptions::Kind::kAdam;
      o.optimizer.learning_rate = 1e-3f;
      testing::ExpectTrainingParity(bytes, o, p, kSteps);
    }
  }
}

// The models exported by PyTorch train on cuda:0 as on the CPU: BatchNorm (ResNet-18,
// MobileNetV2 with ReLU6), attention with embeddings, LayerNorm and GELU (the Transformer
// encoder, GPT), and the LSTM classifier (SalusLstmGrad). 10 steps of SGD with momentum at
// batch 4, as TrainingMatchesCpu compares; MobileNetV2 5 steps: at batch 4 its BatchNorms
// normalise as few as 4 values per channel, and its trajectory is chaotic past that. Two CPU
// runs differing only in their thread count (1 and 4) already disagree on 461 of its 51,402
// parameters beyond 1e-3 after 10 steps, and on none after 5.
TEST(CudaModelsTrainingTest, ExportedModelsTrainingMatchesCpu) {
  SALUS_REQUIRE_GPU();
  for (const char* name : {"resnet18", "mobilenetv2", "mobilenetv3", "transformer", "gpt", "lstm",
                           "hf_gpt2", "hf_bert"}) {
    const std::string model = name;
    SCOPED_TRACE(model);
    const std::string bytes = ReadModel(model);
    ASSERT_FALSE(bytes.empty()) << "cannot read " << ModelsDir() << "/" << model << ".onnx";
    const int steps = model == "mobilenetv2" || model == "mobilenetv3" ? 5 : 10;
    testing::ExpectTrainingParity(bytes, SgdTraining(model, 4), TrainingParity(3e-2), steps);
  }
}

// Swapping activations to host memory on the GPU (Note [Swapping in the executable]): each model
// trains 4 steps unswapped and at the lowest ephemeral size the swap planner offers, the
// swapped run moving between lanes; its losses and whole persistent state stay bit-identical
// to the unswapped run's, and its lane is smaller.
TEST(CudaSwapTest, LowestPointTrainsBitIdentically) {
  SALUS_REQUIRE_GPU();
  for (const char* name : {"mlp", "lenet5", "resnet", "espcn"}) {
    const std::string model = name;
    SCOPED_TRACE(model);
    const std::string bytes = ReadModel(model);
    CompileOptions o = SgdTraining(model, 8);
    o.device = Device{DeviceType::kCuda, 0};
    auto plain = Executable::Compile(bytes, o);
    auto swapped = Executable::Compile(bytes, o);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_TRUE(swapped.ok()) << swapped.status();
    const size_t points = (*swapped)->SwapPoints().size();
    ASSERT_GE(points, 2u) << "nothing to swap";
    ASSERT_TRUE((*swapped)->SelectSwapPoint(points - 1).ok());
    EXPECT_LT((*swapped)->ephemeral_bytes(), (*plain)->ephemeral_bytes());
    ParityOptions p;
    p.int_hi = kClasses;
    const std::vector<HostTensor> feeds = RandomFeeds(**plain, p);
    testing::ExpectBitIdentical(testing::TrainOn(**plain, feeds, 4, false),
                                testing::TrainOn(**swapped, feeds, 4, true));
  }
}

// Note [Device graphs]: an executable replaying its captured iteration gives, bit for bit, what
// one launching kernel by kernel gives: in the lane it was captured in, after the lane moved
// (the graph updated in place or captured again), and back. Inference of two models and 5
// training steps of two more, the training runs moving between two lanes every step.
TEST(CudaGraphsTest, ReplayIsBitIdenticalToKernelLaunches) {
  SALUS_REQUIRE_GPU();
  for (const char* name : {"mlp", "resnet", "lenet5", "espcn"}) {
    const std::string model = name;
    SCOPED_TRACE(model);
    const bool training = model == "lenet5" || model == "espcn";
    CompileOptions o = Inference(model, 8);
    o.device = Device{DeviceType::kCuda, 0};
    if (training) {
      o.mode = Mode::kTraining;
      o.loss = "loss";
      o.optimizer.momentum = 0.9f;
    }
    const std::string bytes = ReadModel(model);
    o.device_graphs = false;
    auto launched = Executable::Compile(bytes, o);
    o.device_graphs = true;
    auto replayed = Executable::Compile(bytes, o);
    ASSERT_TRUE(launched.ok() && replayed.ok());
    ParityOptions p;
    p.int_hi = kClasses;
    const std::vector<HostTensor> feeds = RandomFeeds(**launched, p);
    if (training) {
      testing::ExpectBitIdentical(testing::TrainOn(**launched, feeds, 5, true),
                                  testing::TrainOn(**replayed, feeds, 5, true));
      const GraphStats g = (*replayed)->graph_stats();
      EXPECT_FALSE(g.off);
      EXPECT_EQ(g.replays, 5u);
      EXPECT_EQ(g.captures + g.updates, 5u);  // the lane moved every step
      EXPECT_EQ((*launched)->graph_stats().replays, 0u);
      continue;
    }
    Executable& a = **launched;
    Executable& b = **replayed;
    auto pa = DeviceBuffer::Allocate(a.runtime(), a.persistent_bytes());
    auto pb = DeviceBuffer::Allocate(b.runtime(), b.persistent_bytes());
    auto l1 = DeviceBuffer::Allocate(b.runtime(), b.ephemeral_bytes());
    auto l2 = DeviceBuffer::Allocate(b.runtime(), b.ephemeral_bytes() + kAlignment);
    ASSERT_TRUE(pa.ok() && pb.ok() && l1.ok() && l2.ok());
    ASSERT_TRUE(a.InitializePersistent(pa->get()).ok());
    ASSERT_TRUE(b.InitializePersistent(pb->get()).ok());
    const std::vector<HostTensor> want = RunOnce(a, pa->get(), l1->get(), feeds);
    std::byte* lanes[] = {l1->get(), l1->get(), l2->get() + kAlignment, l1->get()};
    for (int i = 0; i < 4; ++i) {
      const std::vector<HostTensor> got = RunOnce(b, pb->get(), lanes[i], feeds);
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(got[k].bytes, want[k].bytes) << "run " << i << " " << b.fetches()[k].name;
      }
    }
    const GraphStats g = b.graph_stats();
    EXPECT_FALSE(g.off);
    EXPECT_EQ(g.replays, 4u);
    EXPECT_EQ(g.captures + g.updates, 3u);  // first run, the move, the move back
  }
}

// An instantiated graph's device memory is counted in the runtime's reserved bytes while the
// graph lives, and given back with it.
TEST(CudaGraphsTest, AGraphsMemoryIsReservedWhileItLives) {
  SALUS_REQUIRE_GPU();
  auto rt = DeviceRuntime::For(Device{DeviceType::kCuda, 0});
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_TRUE((*rt)->ThreadContext().ok());  // this thread's context first: it is reserved too
  const uint64_t before = (*rt)->reserved_bytes();
  {
    CompileOptions o = Inference("resnet", 8);
    o.device = Device{DeviceType::kCuda, 0};
    o.device_graphs = true;
    auto exe = Executable::Compile(ReadModel("resnet"), o);
    ASSERT_TRUE(exe.ok()) << exe.status();
    Executable& b = **exe;
    auto p = DeviceBuffer::Allocate(b.runtime(), b.persistent_bytes());
    auto l = DeviceBuffer::Allocate(b.runtime(), b.ephemeral_bytes());
    ASSERT_TRUE(p.ok() && l.ok());
    ASSERT_TRUE(b.InitializePersistent(p->get()).ok());
    ParityOptions po;
    po.int_hi = kClasses;
    RunOnce(b, p->get(), l->get(), RandomFeeds(b, po));
    EXPECT_EQ(b.graph_stats().captures, 1u);
    const uint64_t during = (*rt)->reserved_bytes();
    EXPECT_GE(during, before);
    std::printf("resnet (batch 8) inference graph: %llu bytes reserved\n",
                static_cast<unsigned long long>(during - before));
  }
  EXPECT_EQ((*rt)->reserved_bytes(), before);
}

}  // namespace
}  // namespace salus::exec
