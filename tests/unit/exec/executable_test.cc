// Compilation, memory planning and relocation of executables, and bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "exec/fusion.h"
#include "exec/kernel_registry.h"
#include "exec/memory_planner.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

std::string ReadModel(const std::string& name) {
  std::ifstream f(std::string(SALUS_MODELS_DIR) + "/" + name + ".onnx", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint64_t Aligned(uint64_t n) { return AlignUp(n); }

// The MLP training with SGD-momentum at batch 4, and a batch for it.
StatusOr<std::unique_ptr<Executable>> MlpTraining() {
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer.momentum = 0.9f;
  o.input_shapes = {{"x", {4, 784}}, {"labels", {4}}};
  return Executable::Compile(ReadModel("mlp"), o);
}

std::vector<HostTensor> MlpBatch(uint32_t seed) {
  return {HostTensor::FromFloats({4, 784}, RandomFloats(4 * 784, seed)),
          HostTensor::FromInt64s({4}, {1, 2, 3, 4})};
}

TEST(MemoryPlannerTest, LiveBuffersNeverOverlapAndPeakIsTight) {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<PlannedBuffer> bufs;
    const int steps = 20;
    for (int i = 0; i < 40; ++i) {
      int a = static_cast<int>(rng() % steps), b = static_cast<int>(rng() % steps);
      bufs.push_back({1 + rng() % 5000, std::min(a, b) - 1, std::max(a, b)});
    }
    MemoryPlan plan = MemoryPlanner::Plan(bufs);
    uint64_t lower = 0;  // the largest set of simultaneously live bytes
    for (int t = -1; t <= steps; ++t) {
      uint64_t live = 0;
      for (const auto& b : bufs) {
        if (b.first <= t && t <= b.last) live += Aligned(b.size);
      }
      lower = std::max(lower, live);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < bufs.size(); ++i) {
      total += Aligned(bufs[i].size);
      EXPECT_EQ(plan.offsets[i] % kAlignment, 0u);
      EXPECT_LE(plan.offsets[i] + bufs[i].size, plan.peak);
      for (size_t j = i + 1; j < bufs.size(); ++j) {
        const bool live_together = bufs[i].first <= bufs[j].last && bufs[j].first <= bufs[i].last;
        const bool disjoint = plan.offsets[i] + bufs[i].size <= plan.offsets[j] ||
                              plan.offsets[j] + bufs[j].size <= plan.offsets[i];
        EXPECT_TRUE(!live_together || disjoint) << "round " << round << " " << i << "," << j;
      }
    }
    EXPECT_GE(plan.peak, lower);
    EXPECT_LE(plan.peak, total);
  }
}

// Note [Planning in n log n]: the indexed search for live neighbours places every buffer
// exactly where a scan of all placed buffers would (the greedy rule of memory_planner.h).
TEST(MemoryPlannerTest, PlacesAsTheScanOfEveryPlacedBufferWould) {
  auto by_scan = [](const std::vector<PlannedBuffer>& bufs) {
    std::vector<size_t> order(bufs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return bufs[a].size > bufs[b].size; });
    std::vector<uint64_t> offsets(bufs.size(), 0);
    std::vector<size_t> placed;
    for (size_t i : order) {
      const uint64_t size = Aligned(bufs[i].size);
      if (size == 0) continue;
      std::vector<std::pair<uint64_t, uint64_t>> busy;
      for (size_t j : placed) {
        if (bufs[j].first <= bufs[i].last && bufs[i].first <= bufs[j].last) {
          busy.emplace_back(offsets[j], offsets[j] + Aligned(bufs[j].size));
        }
      }
      std::sort(busy.begin(), busy.end());
      uint64_t offset = 0;
      for (const auto& [start, end] : busy) {
        if (start >= offset + size) break;
        offset = std::max(offset, end);
      }
      offsets[i] = offset;
      placed.push_back(i);
    }
    return offsets;
  };
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    const int steps = 1 + static_cast<int>(rng() % 300);
    const int count = static_cast<int>(rng() % 400);
    std::vector<PlannedBuffer> bufs;
    for (int i = 0; i < count; ++i) {
      const int a = static_cast<int>(rng() % steps) - 1, b = static_cast<int>(rng() % steps);
      // Sizes repeat (ties keep their order) and are sometimes 0 (not placed).
      bufs.push_back({(rng() % 8) * 64 * (1 + rng() % 3), std::min(a, b), std::max(a, b)});
    }
    EXPECT_EQ(MemoryPlanner::Plan(bufs).offsets, by_scan(bufs)) << "round " << round;
  }
}

TEST(ExecutableTest, PersistentBytesAreExactlyParametersAndOptimizerState) {
  const std::string mlp = ReadModel("mlp");
  uint64_t params = 0;
  for (uint64_t n : {784 * 512, 512, 512 * 512, 512, 512 * 10, 10}) params += Aligned(n * 4);
  CompileOptions o;
  o.input_shapes = {{"x", {8, 784}}, {"labels", {8}}};
  auto inference = Executable::Compile(mlp, o);
  ASSERT_TRUE(inference.ok()) << inference.status();
  EXPECT_EQ((*inference)->persistent_bytes(), params);
  EXPECT_GT((*inference)->ephemeral_bytes(), 0u);

  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer.momentum = 0.9f;  // one velocity per parameter
  auto sgd = Executable::Compile(mlp, o);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  // Parameters, velocities and the constant gradient seed of the loss.
  EXPECT_EQ((*sgd)->persistent_bytes(), 2 * params + kAlignment);
  o.optimizer.kind = OptimizerOptions::Kind::kAdam;
  auto adam = Executable::Compile(mlp, o);
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_EQ((*adam)->persistent_bytes(), 3 * params + 6 * kAlignment + kAlignment);
  // E grows with the batch; the plan reuses memory, so it is far below the sum of all buffers.
  o.input_shapes = {{"x", {64, 784}}, {"labels", {64}}};
  auto big = Executable::Compile(mlp, o);
  ASSERT_TRUE(big.ok());
  EXPECT_GT((*big)->ephemeral_bytes(), (*adam)->ephemeral_bytes());
}

// Invariant 4: the state can move between iterations. Training on in one place and on a
// copy at other addresses with a different lane gives bit-identical results, and an iteration
// writes nothing outside [lane, lane + E) and [persistent, persistent + P).
TEST(ExecutableTest, RelocatableBetweenIterations) {
  auto exe = MlpTraining();
  ASSERT_TRUE(exe.ok());
  Executable& x = **exe;
  std::vector<HostTensor> feeds = MlpBatch(1);
  Memory a(x);
  ASSERT_TRUE(RunHost(x, a, feeds).ok());

  constexpr size_t kGuard = 4096;
  const size_t p = x.persistent_bytes(), e = x.ephemeral_bytes();
  std::vector<std::byte> pbuf(p + 2 * kGuard + kAlignment, std::byte{0x5a}),
      lbuf(e + 2 * kGuard + kAlignment, std::byte{0x5a});
  std::byte* pb = Memory::Align(pbuf) + kGuard;
  std::byte* lb = Memory::Align(lbuf) + kGuard;
  std::memcpy(pb, a.p(), p);
  auto ra = RunHost(x, a, feeds);
  std::vector<void*> out(1);
  HostTensor loss_b(DataType::kFloat32, {});
  out[0] = loss_b.bytes.data();
  std::vector<const void*> in = {feeds[0].bytes.data(), feeds[1].bytes.data()};
  ASSERT_TRUE(x.Run(pb, lb, in, out).ok());
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(std::memcmp((*ra)[0].bytes.data(), loss_b.bytes.data(), 4), 0);
  EXPECT_EQ(std::memcmp(a.p(), pb, p), 0);
  for (size_t i = 0; i < kGuard; ++i) {
    ASSERT_EQ(pb[-1 - static_cast<ptrdiff_t>(i)], std::byte{0x5a});
    ASSERT_EQ(pb[p + i], std::byte{0x5a});
    ASSERT_EQ(lb[-1 - static_cast<ptrdiff_t>(i)], std::byte{0x5a});
    ASSERT_EQ(lb[e + i], std::byte{0x5a});
  }
}

// Note [Fetches before the end]: a training step's loss is handed over after its forward
// pass, once, with the value a whole run fetches, while the updates after it have not run yet
// (the parameters are still the old ones).
TEST(ExecutableTest, FetchesAreHandedOverBeforeTheUpdatesRun) {
  auto exe = MlpTraining();
  ASSERT_TRUE(exe.ok()) << exe.status();
  Executable& x = **exe;
  ASSERT_GT(x.fetch_ready_steps(), 0u);
  ASSERT_LT(x.fetch_ready_steps(), x.num_steps());
  std::vector<HostTensor> feeds = MlpBatch(3);
  Memory early(x), late(x);
  const size_t p = x.persistent_bytes();
  const std::vector<std::byte> before(early.p(), early.p() + p);
  std::vector<const void*> in = {feeds[0].bytes.data(), feeds[1].bytes.data()};
  std::vector<HostTensor> fetched;
  std::vector<void*> out;
  for (const TensorInfo& info : x.fetches()) fetched.emplace_back(info.type, info.shape);
  for (HostTensor& t : fetched) out.push_back(t.bytes.data());
  int calls = 0;
  float handed = 0;
  bool state_untouched = false;
  ASSERT_TRUE(x.Run(early.p(), early.l(), in, out, [&] {
                 ++calls;
                 std::memcpy(&handed, fetched[0].bytes.data(), sizeof(float));
                 state_untouched = std::memcmp(early.p(), before.data(), p) == 0;
               }).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(state_untouched) << "the updates ran before the loss was handed over";
  EXPECT_NE(std::memcmp(early.p(), before.data(), p), 0) << "the updates never ran";
  auto whole = RunHost(x, late, feeds);
  ASSERT_TRUE(whole.ok());
  float expected = 0;
  std::memcpy(&expected, (*whole)[0].bytes.data(), sizeof(float));
  EXPECT_EQ(handed, expected);
  EXPECT_EQ(std::memcmp(early.p(), late.p(), p), 0);
}

TEST(ExecutableTest, ConstantSubgraphsAreFolded) {
  ModelBuilder mb;
  mb.Input("x", {2, 6});
  mb.Initializer("a", {2, 6}, RandomFloats(12, 2)).Initializer("b", {6}, RandomFloats(6, 3));
  mb.Node("Add", {"a", "b"}, {"c"});  // both initializers: folded for inference
  auto& shape = mb.Node("Constant", {}, {"shape"});
  auto* attr = shape.add_attribute();
  attr->set_name("value");
  attr->set_type(onnx::AttributeProto::TENSOR);
  attr->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  attr->mutable_t()->add_dims(2);
  attr->mutable_t()->add_int64_data(3);
  attr->mutable_t()->add_int64_data(-1);
  mb.Node("Mul", {"x", "c"}, {"m"});
  mb.Node("Reshape", {"m", "shape"}, {"y"});
  mb.Output("y", {3, 4});
  auto exe = Executable::Compile(mb.Bytes(), {});
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->num_steps(), 2u);  // Mul and Reshape
  EXPECT_EQ((*exe)->fetches()[0].shape, (Shape{3, 4}));
  Memory mem(**exe);
  HostTensor x = HostTensor::FromFloats({2, 6}, RandomFloats(12, 4));
  auto out = RunHost(**exe, mem, {x});
  ASSERT_TRUE(out.ok());
  std::vector<float> a = RandomFloats(12, 2), b = RandomFloats(6, 3);
  for (int i = 0; i < 12; ++i)
    EXPECT_FLOAT_EQ((*out)[0].floats()[i], x.floats()[i] * (a[i] + b[i % 6]));
}

// Folding makes constants at compile time; their bytes are bounded, so a small model cannot
// make compilation take unbounded memory (Note [What folds]).
TEST(ExecutableTest, FoldedBytesAreBounded) {
  ModelBuilder mb;
  mb.Initializer("a", {64, 1}, RandomFloats(64, 1)).Initializer("b", {1, 64}, RandomFloats(64, 2));
  mb.Node("Add", {"a", "b"}, {"c0"});  // 64 x 64 floats: 16 KiB per folded node
  for (int i = 1; i < 8; ++i) {
    mb.Node("Add", {"c" + std::to_string(i - 1), "b"}, {"c" + std::to_string(i)});
  }
  mb.Output("c7", {64, 64});
  CompileOptions o;
  // The two initializers (512 bytes) count too: every constant the compilation holds does.
  o.limits.max_constant_bytes = 512 + 8 * 16384;
  auto fits = Executable::Compile(mb.Bytes(), o);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ((*fits)->num_steps(), 0u);
  o.limits.max_constant_bytes = 512 + 8 * 16384 - 1;
  auto over = Executable::Compile(mb.Bytes(), o);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("Add_8"), std::string::npos) << over.status();
  EXPECT_NE(over.status().message().find("max_constant_bytes=131583"), std::string::npos)
      << over.status();
}

// Note [Compile budgets]: a model with more nodes than max_nodes is refused before any is
// imported; a compilation past its deadline ends DeadlineExceeded.
TEST(ExecutableTest, NodeCountAndDeadlineAreBounded) {
  ModelBuilder mb;
  mb.Input("x", {4});
  std::string last = "x";
  for (int i = 0; i < 600; ++i) {
    const std::string next = "r" + std::to_string(i);
    mb.Node("Relu", {last}, {next});
    last = next;
  }
  mb.Output(last, {4});
  CompileOptions o;
  o.limits.max_nodes = 599;
  auto over = Executable::Compile(mb.Bytes(), o);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("limits.max_nodes"), std::string::npos) << over.status();
  o.limits.max_nodes = 600;
  EXPECT_TRUE(Executable::Compile(mb.Bytes(), o).ok());
  o.limits.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);  // passed
  auto late = Executable::Compile(mb.Bytes(), o);
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.status().message().find("limits.compile_seconds"), std::string::npos)
      << late.status();
}

// Note [No external data]: a tensor whose data lives in a file is refused before anything
// looks for the file, with the same answer whether the path exists or not.
TEST(ExecutableTest, ExternalDataIsRefusedWithoutTouchingTheFileSystem) {
  auto model_with = [](const std::string& path) {
    ModelBuilder mb;
    mb.Input("x", {4}).Initializer("w", {4}, {1, 2, 3, 4});
    mb.Node("Add", {"x", "w"}, {"y"});
    mb.Output("y", {4});
    onnx::TensorProto* w = mb.proto().mutable_graph()->mutable_initializer(0);
    w->clear_float_data();
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* entry = w->add_external_data();
    entry->set_key("location");
    entry->set_value(path);
    return mb.Bytes();
  };
  auto exists = Executable::Compile(model_with("/etc/passwd"), CompileOptions{});
  auto missing = Executable::Compile(model_with("/nonexistent/weights.bin"), CompileOptions{});
  auto relative = Executable::Compile(model_with("../../etc/passwd"), CompileOptions{});
  EXPECT_EQ(exists.status().code(), StatusCode::kInvalidArgument) << exists.status();
  EXPECT_EQ(exists.status(), missing.status());
  EXPECT_EQ(exists.status(), relative.status());
  EXPECT_NE(exists.status().message().find("external data"), std::string::npos);
}

// Ops whose work grows with an inner dimension are not folded even on constants: they run
// each iteration, with the same result.
TEST(ExecutableTest, HeavyOpsOnConstantsRunEachIteration) {
  const std::vector<float> a = RandomFloats(6, 1), b = RandomFloats(12, 2);
  ModelBuilder mb;
  mb.Input("x", {2, 4});
  mb.Initializer("a", {2, 3}, a).Initializer("b", {3, 4}, b);
  mb.Node("MatMul", {"a", "b"}, {"ab"});
  mb.Node("Add", {"x", "ab"}, {"y"});
  mb.Output("y", {2, 4});
  auto exe = Executable::Compile(mb.Bytes(), {});
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->num_steps(), 2u);  // MatMul and Add
  Memory mem(**exe);
  HostTensor x = HostTensor::FromFloats({2, 4}, RandomFloats(8, 3));
  auto out = RunHost(**exe, mem, {x});
  ASSERT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      float ab = 0;
      for (int k = 0; k < 3; ++k) ab += a[i * 3 + k] * b[k * 4 + j];
      EXPECT_NEAR((*out)[0].floats()[i * 4 + j], x.floats()[i * 4 + j] + ab, 1e-5f);
    }
  }
}

// No classes: nothing to normalise, every label out of range, the loss is 0 (the fuzzer found
// pointer arithmetic on the empty scores here; UBSan checks it in the sanitizer pass).
TEST(ExecutableTest, SoftmaxCrossEntropyWithNoClassesIsZero) {
  ModelBuilder mb;
  mb.Input("scores", {3, 0, 2}).Input("labels", {3, 2}, onnx::TensorProto::INT64);
  mb.Node("SoftmaxCrossEntropyLoss", {"scores", "labels"}, {"loss"});
  mb.Output("loss", {});
  auto exe = Executable::Compile(mb.Bytes(), {});
  ASSERT_TRUE(exe.ok()) << exe.status();
  Memory mem(**exe);
  auto out = RunHost(**exe, mem,
                     {HostTensor(DataType::kFloat32, {3, 0, 2}),
                      HostTensor::FromInt64s({3, 2}, {0, 1, 0, 1, 0, 1})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].floats()[0], 0.f);
}

// Inference fuses a Relu into the Conv it follows; the result is that of the two ops apart
// (kept apart here by also fetching the Conv's output).
TEST(ExecutableTest, ConvReluFusionKeepsResults) {
  ModelBuilder mb;
  mb.Input("x", {2, 3, 8, 8});
  mb.Initializer("w", {4, 3, 3, 3}, RandomFloats(108, 5)).Initializer("b", {4}, RandomFloats(4, 6));
  auto& conv = mb.Node("Conv", {"x", "w", "b"}, {"c"});
  ModelBuilder::Attr(conv, "pads", std::vector<int64_t>{1, 1, 1, 1});
  mb.Node("Relu", {"c"}, {"y"});
  mb.Output("y", {2, 4, 8, 8});
  HostTensor x = HostTensor::FromFloats({2, 3, 8, 8}, RandomFloats(384, 7));
  auto fused = Executable::Compile(mb.Bytes(), {});
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ((*fused)->num_steps(), 1u);
  CompileOptions apart;
  apart.fetches = {"y", "c"};
  auto separate = Executable::Compile(mb.Bytes(), apart);
  ASSERT_TRUE(separate.ok());
  EXPECT_EQ((*separate)->num_steps(), 2u);
  Memory m1(**fused), m2(**separate);
  auto a = RunHost(**fused, m1, {x});
  auto b = RunHost(**separate, m2, {x});
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t i = 0; i < 2 * 4 * 8 * 8; ++i) {
    EXPECT_NEAR((*a)[0].floats()[i], (*b)[0].floats()[i], 1e-5);
    EXPECT_GE((*a)[0].floats()[i], 0.f);
  }
}

// Note [Views share their buffer]: a reshape of a lane value takes no lane bytes of its own
// (E is that of the graph without it), and it and the value it views read the same bytes,
// fetched or read by later steps.
TEST(ExecutableTest, ReshapesOfLaneValuesShareTheirBuffer) {
  auto build = [](bool views) {
    ModelBuilder mb;
    mb.Input("x", {64, 64});
    mb.Node("Relu", {"x"}, {"r"});
    if (views) {
      mb.Node("Identity", {"r"}, {"v"});
      auto& flat = mb.Node("Flatten", {"v"}, {"f"});
      ModelBuilder::Attr(flat, "axis", int64_t{0});
      mb.Node("Neg", {"r"}, {"n"});  // the viewed value read after its views
      auto& flat_n = mb.Node("Flatten", {"n"}, {"nf"});
      ModelBuilder::Attr(flat_n, "axis", int64_t{0});
      mb.Node("Add", {"nf", "f"}, {"y"});
      mb.Output("y", {1, 4096});
    } else {
      mb.Node("Neg", {"r"}, {"n"});
      mb.Node("Add", {"n", "r"}, {"y"});
      mb.Output("y", {64, 64});
    }
    return mb.Bytes();
  };
  CompileOptions unfused;  // without, Neg and Add would be one node (no view between them)
  unfused.fuse = false;
  auto with = Executable::Compile(build(true), unfused);
  auto without = Executable::Compile(build(false), unfused);
  ASSERT_TRUE(with.ok() && without.ok()) << with.status();
  EXPECT_EQ((*with)->ephemeral_bytes(), (*without)->ephemeral_bytes());
  CompileOptions fetched;
  fetched.fetches = {"y", "v", "f", "r"};
  auto all = Executable::Compile(build(true), fetched);
  ASSERT_TRUE(all.ok()) << all.status();
  HostTensor x = HostTensor::FromFloats({64, 64}, RandomFloats(4096, 11));
  Memory m(**all);
  auto out = RunHost(**all, m, {x});
  ASSERT_TRUE(out.ok()) << out.status();
  for (int64_t i = 0; i < 4096; ++i) {
    const float r = std::max(x.floats()[i], 0.f);
    ASSERT_EQ((*out)[3].floats()[i], r) << i;
    ASSERT_EQ((*out)[1].floats()[i], r) << i;
    ASSERT_EQ((*out)[2].floats()[i], r) << i;
    ASSERT_EQ((*out)[0].floats()[i], 0.f) << i;
  }
}

// convolution_transforms only widens a CUDA convolution's choice of algorithms: on the CPU the
// executable is the same, byte for byte in its results.
TEST(ExecutableTest, ConvolutionTransformsChangeNothingOnTheCpu) {
  ModelBuilder mb;
  mb.Input("x", {2, 3, 8, 8});
  mb.Initializer("w", {4, 3, 3, 3}, RandomFloats(108, 5));
  mb.Node("Conv", {"x", "w"}, {"y"});
  mb.Output("y", {2, 4, 6, 6});
  CompileOptions o;
  o.convolution_transforms = true;
  auto with = Executable::Compile(mb.Bytes(), o);
  auto without = Executable::Compile(mb.Bytes(), {});
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ((*with)->persistent_bytes(), (*without)->persistent_bytes());
  EXPECT_EQ((*with)->ephemeral_bytes(), (*without)->ephemeral_bytes());
  HostTensor x = HostTensor::FromFloats({2, 3, 8, 8}, RandomFloats(384, 7));
  Memory m1(**with), m2(**without);
  auto a = RunHost(**with, m1, {x});
  auto b = RunHost(**without, m2, {x});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)[0].bytes, (*b)[0].bytes);
}

TEST(ExecutableTest, GemmReluFusionKeepsResults) {
  for (const Shape& c_shape : {Shape{5}, Shape{3, 5}}) {  // C as oneDNN bias, C by the loop
    ModelBuilder mb;
    mb.Input("a", {3, 4});
    mb.Initializer("b", {5, 4}, RandomFloats(20, 8));
    mb.Initializer("c", c_shape, RandomFloats(NumElements(c_shape), 9));
    auto& gemm = mb.Node("Gemm", {"a", "b", "c"}, {"g"});
    ModelBuilder::Attr(gemm, "transB", int64_t{1});
    mb.Node("Relu", {"g"}, {"y"});
    mb.Output("y", {3, 5});
    HostTensor a = HostTensor::FromFloats({3, 4}, RandomFloats(12, 10));
    auto fused = Executable::Compile(mb.Bytes(), {});
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_EQ((*fused)->num_steps(), 1u);
    CompileOptions apart;
    apart.fetches = {"y", "g"};
    auto separate = Executable::Compile(mb.Bytes(), apart);
    ASSERT_TRUE(separate.ok());
    Memory m1(**fused), m2(**separate);
    auto x = RunHost(**fused, m1, {a});
    auto y = RunHost(**separate, m2, {a});
    ASSERT_TRUE(x.ok() && y.ok());
    int positives = 0;
    for (int64_t i = 0; i < 15; ++i) {
      EXPECT_NEAR((*x)[0].floats()[i], (*y)[0].floats()[i], 1e-5);
      positives += (*y)[1].floats()[i] > 0;
    }
    EXPECT_GT(positives, 0);
    EXPECT_LT(positives, 15);
  }
}

TEST(BadInputTest, MalformedAndTruncatedModelsAreInvalidArgument) {
  EXPECT_EQ(Executable::Compile("", {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Executable::Compile("\x08\x01garbage\xff\xff", {}).status().code(),
            StatusCode::kInvalidArgument);
  const std::string mlp = ReadModel("mlp");
  CompileOptions o;
  o.input_shapes = {{"x", {2, 784}}, {"labels", {2}}};
  ASSERT_TRUE(Executable::Compile(mlp, o).ok());
  for (size_t cut : {size_t{10}, mlp.size() / 3, mlp.size() - 7}) {
    EXPECT_EQ(Executable::Compile(std::string_view(mlp).substr(0, cut), o).status().code(),
              StatusCode::kInvalidArgument)
        << cut;
  }
  // The batch is symbolic: its shape must be given.
  EXPECT_EQ(Executable::Compile(mlp, {}).status().code(), StatusCode::kInvalidArgument);
  o.mode = Mode::kTraining;
  o.loss = "no_such_output";
  EXPECT_EQ(Executable::Compile(mlp, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(BadInputTest, UnsupportedOpsAndAttributesNameTheNodeAndOp) {
  ModelBuilder mb;
  mb.Input("x", {2, 3});
  auto& n = mb.Node("Hardmax", {"x"}, {"y"});
  n.set_name("my_hardmax");
  mb.Output("y", {2, 3});
  Status st = Executable::Compile(mb.Bytes(), {}).status();
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("my_hardmax"), std::string::npos) << st;
  EXPECT_NE(st.message().find("Hardmax"), std::string::npos) << st;

  ModelBuilder pool;
  pool.Input("x", {1, 1, 4, 4});
  auto& p = pool.Node("MaxPool", {"x"}, {"y"});
  p.set_name("pool1");
  ModelBuilder::Attr(p, "kernel_shape", std::vector<int64_t>{2, 2});
  ModelBuilder::Attr(p, "storage_order", int64_t{1});
  pool.Output("y", {1, 1, 3, 3});
  st = Executable::Compile(pool.Bytes(), {}).status();
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("pool1"), std::string::npos) << st;
  EXPECT_NE(st.message().find("MaxPool"), std::string::npos) << st;

  // A gradient the engine lacks is refused when training is compiled.
  ModelBuilder m;
  m.Input("x", {2, 3});
  m.Initializer("w", {3}, {1, 1, 1});
  m.Node("Mul", {"x", "w"}, {"m"});
  auto& s = m.Node("ReduceMax", {"m"}, {"loss"});
  s.set_name("max1");
  ModelBuilder::Attr(s, "keepdims", int64_t{0});
  m.Output("loss", {});
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  st = Executable::Compile(m.Bytes(), o).status();
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("max1"), std::string::npos) << st;
}

TEST(BadInputTest, InconsistentShapesAreInvalidArgument) {
  ModelBuilder mb;
  mb.Input("a", {2, 3}).Input("b", {4, 5});
  mb.Node("Gemm", {"a", "b"}, {"y"});
  mb.Output("y", {2, 5});
  EXPECT_EQ(Executable::Compile(mb.Bytes(), {}).status().code(), StatusCode::kInvalidArgument);
}

// Inputs the fuzzer found (tests/fuzz/regressions/): each must be refused with a status.
TEST(BadInputTest, FuzzerRegressions) {
  for (const char* name :
       {"convtranspose_weight_without_shape", "convtranspose_short_output_shape"}) {
    std::ifstream f(std::string(SALUS_FUZZ_REGRESSIONS_DIR) + "/" + name + ".onnx",
                    std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    ASSERT_FALSE(ss.str().empty()) << name;
    EXPECT_EQ(Executable::Compile(ss.str(), {}).status().code(), StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(BadInputTest, RunChecksFeedAndFetchCounts) {
  ModelBuilder mb;
  mb.Input("x", {2});
  mb.Node("Relu", {"x"}, {"y"});
  mb.Output("y", {2});
  auto exe = Executable::Compile(mb.Bytes(), {});
  ASSERT_TRUE(exe.ok());
  Memory mem(**exe);
  EXPECT_EQ(RunHost(**exe, mem, {}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace salus::exec

namespace salus::exec {
namespace {

TEST(DeviceTest, ParsesDeviceNames) {
  EXPECT_EQ(ParseDevice("cpu")->name(), "cpu");
  EXPECT_EQ(ParseDevice("cuda")->name(), "cuda:0");
  EXPECT_EQ(ParseDevice("cuda:3")->ordinal, 3);
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999999999"}) {
    auto d = ParseDevice(bad);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find(std::string("'") + bad + "'"), std::string::npos);
  }
}

// Without a usable GPU, compiling for one says why instead of failing later.
TEST(DeviceTest, CompilingForAMissingGpuSaysNoGpu) {
  if (DeviceRuntime::For(Device{DeviceType::kCuda, 0}).ok()) GTEST_SKIP() << "a GPU is present";
  CompileOptions o;
  o.device = Device{DeviceType::kCuda, 0};
  o.input_shapes = {{"x", {2, 784}}, {"labels", {2}}};
  auto exe = Executable::Compile(ReadModel("mlp"), o);
  ASSERT_FALSE(exe.ok());
#ifdef SALUS_HAVE_CUDA
  EXPECT_EQ(exe.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(exe.status().message().find("no GPU"), std::string::npos) << exe.status();
#else
  EXPECT_EQ(exe.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(exe.status().message().find("no CUDA device"), std::string::npos) << exe.status();
#endif
}

TEST(DeviceTest, RunRefusesAContextOfAnotherDevice) {
  CompileOptions o;
  o.input_shapes = {{"x", {2, 784}}, {"labels", {2}}};
  auto exe = Executable::Compile(ReadModel("mlp"), o);
  ASSERT_TRUE(exe.ok()) << exe.status();
  testing::Memory m(**exe);
  DeviceContext gpu;
  gpu.device = Device{DeviceType::kCuda, 1};
  std::vector<HostTensor> feeds = {HostTensor::FromFloats({2, 784}, testing::RandomFloats(1568, 1)),
                                   HostTensor::FromInt64s({2}, {1, 2})};
  std::vector<const void*> in = {feeds[0].bytes.data(), feeds[1].bytes.data()};
  std::vector<HostTensor> outs;
  std::vector<void*> out;
  for (const TensorInfo& f : (*exe)->fetches()) outs.emplace_back(f.type, f.shape);
  for (HostTensor& t : outs) out.push_back(t.bytes.data());
  Status st = (*exe)->Run(&gpu, m.p(), m.l(), in, out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cuda:1"), std::string::npos) << st;
  // The refusal left the executable usable.
  EXPECT_TRUE((*exe)->Run(m.p(), m.l(), in, out).ok());
}

}  // namespace
}  // namespace salus::exec

namespace salus::exec {
namespace {

// A product over an empty inner dimension is beta * C (Gemm) or zeros (MatMul), not a crash.
TEST(ExecutableTest, EmptyInnerDimensionProducts) {
  ModelBuilder mb;
  mb.Input("x", {1});
  mb.Initializer("a", {2, 0}, {}).Initializer("b", {0, 3}, {});
  mb.Initializer("c", {3}, {1.f, -2.f, 3.f});
  auto& gemm = mb.Node("Gemm", {"a", "b", "c"}, {"g"});
  ModelBuilder::Attr(gemm, "beta", 0.5f);
  mb.Node("MatMul", {"a", "b"}, {"m"});
  mb.Node("Relu", {"g"}, {"r"});
  mb.Output("g", {2, 3}).Output("m", {2, 3}).Output("r", {2, 3});
  auto exe = Executable::Compile(mb.Bytes(), {});
  ASSERT_TRUE(exe.ok()) << exe.status();
  Memory m(**exe);
  auto out = RunHost(**exe, m, {HostTensor::FromFloats({1}, {0.f})});
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> want = {0.5f, -1.f, 1.5f, 0.5f, -1.f, 1.5f};
  EXPECT_EQ(std::vector<float>((*out)[0].floats(), (*out)[0].floats() + 6), want);
  EXPECT_EQ(std::vector<float>((*out)[1].floats(), (*out)[1].floats() + 6),
            std::vector<float>(6, 0.f));
  EXPECT_EQ((*out)[2].floats()[1], 0.f);
  EXPECT_EQ((*out)[2].floats()[2], 1.5f);
}

}  // namespace
}  // namespace salus::exec

namespace salus::exec {
namespace {

// A scalar constant reduced over axis 0 is folded at import, before libonnx's cross-check
// refuses the axis: the fold must not write past the scalar's shape (ASan watches this test).
TEST(ExecutableTest, FoldingAScalarReductionOverAxisZeroIsSafe) {
  ModelBuilder mb;
  mb.Input("x", {1});
  mb.Initializer("s", {}, {-4.f});
  auto& r = mb.Node("ReduceMax", {"s"}, {"y"});
  ModelBuilder::Attr(r, "axes", std::vector<int64_t>{0});
  mb.Node("Add", {"x", "y"}, {"z"});
  mb.Output("z", {1});
  auto exe = Executable::Compile(mb.Bytes(), {});
  if (!exe.ok()) {
    EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument) << exe.status();
    return;
  }
  Memory m(**exe);
  auto out = RunHost(**exe, m, {HostTensor::FromFloats({1}, {1.f})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].floats()[0], -3.f);
}

}  // namespace
}  // namespace salus::exec

namespace salus::exec {
namespace {

using testing::ModelBuilder;

// A model as the onnx package of the project's environment writes it: IR version 10,
// default-domain opset 21, newer than the installed ONNX library knows (Note [Model versions]).
std::string AddModel(int64_t ir_version, int64_t opset) {
  ModelBuilder mb;
  mb.proto().set_ir_version(ir_version);
  mb.proto().mutable_opset_import(0)->set_version(opset);
  mb.Input("x", {2, 3});
  mb.Initializer("w", {2, 3}, {1, 2, 3, 4, 5, 6});
  mb.Node("Add", {"x", "w"}, {"y"});
  mb.Output("y", {2, 3});
  return mb.Bytes();
}

TEST(ModelVersionTest, AcceptsIrVersionsUpTo10AndOpsetsUpTo21) {
  for (auto [ir, opset] : {std::pair{8, 17}, std::pair{9, 19}, std::pair{10, 21}}) {
    SCOPED_TRACE("ir " + std::to_string(ir) + " opset " + std::to_string(opset));
    auto exe = Executable::Compile(AddModel(ir, opset), {});
    ASSERT_TRUE(exe.ok()) << exe.status();
    testing::Memory mem(**exe);
    HostTensor x = HostTensor::FromFloats({2, 3}, {10, 20, 30, 40, 50, 60});
    auto out = testing::RunHost(**exe, mem, {x});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(std::vector<float>((*out)[0].floats(), (*out)[0].floats() + 6),
              (std::vector<float>{11, 22, 33, 44, 55, 66}));
  }
}

TEST(ModelVersionTest, RefusesVersionsBeyondTheSupportedRangeNamingThem) {
  Status st = Executable::Compile(AddModel(11, 21), {}).status();
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("IR version 11"), std::string::npos) << st;
  st = Executable::Compile(AddModel(10, 22), {}).status();
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("opset 22"), std::string::npos) << st;
}

}  // namespace
}  // namespace salus::exec

#ifdef SALUS_HAVE_CUDA
namespace salus::exec {
namespace {

// Every op the CPU has, forward and backward (named Salus*, emitted by autodiff), the CUDA
// device has too; except the fused elementwise chain, which only CPU compiles emit (Note [Fused
// elementwise chains]).
TEST(DeviceTest, EveryCpuOpHasACudaKernel) {
  const KernelRegistry& r = KernelRegistry::Global();
  std::set<std::string> missing;
  for (const std::string& op : r.Ops(DeviceType::kCpu)) {
    if (!r.Has(op, DeviceType::kCuda) && op != kFusedElementwiseOp) missing.insert(op);
  }
  EXPECT_EQ(missing, std::set<std::string>{});
}

// Every op of the training graphs (forward, backward and both optimizers) of the reference
// models and of the exported ones, compiled here on the CPU, has a CUDA kernel: so they compile
// for training on cuda:0.
TEST(DeviceTest, ReferenceModelsTrainingOpsHaveCudaKernels) {
  const KernelRegistry& r = KernelRegistry::Global();
  const std::map<std::string, std::map<std::string, Shape>> models = {
      {"mlp", {{"x", {4, 784}}, {"labels", {4}}}},
      {"lenet5", {{"x", {4, 1, 28, 28}}, {"labels", {4}}}},
      {"resnet", {{"x", {4, 3, 32, 32}}, {"labels", {4}}}},
      {"espcn", {{"x", {4, 1, 16, 16}}, {"target", {4, 1, 48, 48}}}},
      {"vae", {{"x", {4, 784}}, {"eps", {4, 20}}}},
      {"resnet18", {{"x", {4, 3, 32, 32}}, {"labels", {4}}}},
      {"mobilenetv2", {{"x", {4, 3, 32, 32}}, {"labels", {4}}}},
      {"mobilenetv3", {{"x", {4, 3, 32, 32}}, {"labels", {4}}}},
      {"transformer", {{"tokens", {4, 32}}, {"labels", {4}}}},
      {"gpt", {{"tokens", {4, 32}}, {"labels", {4, 32}}}},
      {"lstm", {{"tokens", {4, 32}}, {"labels", {4}}}},
      {"hf_gpt2", {{"tokens", {4, 32}}, {"labels", {4, 32}}}},
      {"hf_bert", {{"tokens", {4, 32}}, {"labels", {4}}}}};
  for (const auto& [name, shapes] : models) {
    for (auto kind : {OptimizerOptions::Kind::kSgd, OptimizerOptions::Kind::kAdam}) {
      CompileOptions o;
      o.mode = Mode::kTraining;
      o.loss = "loss";
      o.optimizer.kind = kind;
      o.optimizer.momentum = 0.9f;
      o.input_shapes = shapes;
      auto exe = Executable::Compile(ReadModel(name), o);
      ASSERT_TRUE(exe.ok()) << name << ": " << exe.status();
      std::set<std::string> missing;
      for (const Node& n : (*exe)->graph().nodes()) {
        if (!r.Has(n.op, DeviceType::kCuda)) missing.insert(n.op);
      }
      EXPECT_TRUE(missing.empty()) << name << ": no CUDA kernel for " << *missing.begin();
    }
  }
}

}  // namespace
}  // namespace salus::exec
#endif
