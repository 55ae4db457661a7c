// The inference graph rewrites of exec/fusion.h: each gives the outputs of the graph it
// replaces (the same model compiled with CompileOptions::fuse off), folded constants replace
// the originals in persistent memory exactly, and a fetched intermediate is never fused away.
#include "exec/fusion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

constexpr float kTolerance = 1e-4f;  // relative, as the integration test against onnxruntime

std::string ReadModel(const std::string& name) {
  std::ifstream f(std::string(SALUS_MODELS_DIR) + "/" + name + ".onnx", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Compiled {
  std::unique_ptr<Executable> exe;
  std::vector<HostTensor> outputs;
};

// Compiles `model` (fused or not) and runs it once on `feeds`.
Compiled CompileAndRun(const std::string& model, CompileOptions o,
                       const std::vector<HostTensor>& feeds, bool fuse) {
  o.fuse = fuse;
  Compiled c;
  auto exe = Executable::Compile(model, o);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return c;
  c.exe = std::move(*exe);
  Memory m(*c.exe);
  auto out = RunHost(*c.exe, m, feeds);
  EXPECT_TRUE(out.ok()) << out.status();
  if (out.ok()) c.outputs = std::move(*out);
  return c;
}

void ExpectClose(const HostTensor& got, const HostTensor& want) {
  ASSERT_EQ(got.shape, want.shape);
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const float w = want.floats()[i];
    EXPECT_NEAR(got.floats()[i], w, kTolerance * std::max(1.f, std::abs(w))) << "element " << i;
  }
}

// Fused against unfused: same outputs; returns the fused executable's step count.
size_t ExpectSameOutputs(const std::string& model, const CompileOptions& o,
                         const std::vector<HostTensor>& feeds) {
  Compiled fused = CompileAndRun(model, o, feeds, true);
  Compiled plain = CompileAndRun(model, o, feeds, false);
  if (!fused.exe || !plain.exe) return 0;
  EXPECT_EQ(fused.outputs.size(), plain.outputs.size());
  for (size_t i = 0; i < fused.outputs.size() && i < plain.outputs.size(); ++i) {
    ExpectClose(fused.outputs[i], plain.outputs[i]);
  }
  return fused.exe->num_steps();
}

// Reduces `x` to the scalar graph output "loss" with `reduce`; options that train on it.
CompileOptions TrainOnLoss(ModelBuilder& mb, const std::string& reduce, const std::string& x) {
  auto& r = mb.Node(reduce, {x}, {"loss"});
  ModelBuilder::Attr(r, "keepdims", int64_t{0});
  mb.Output("loss", {});
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  return o;
}

constexpr int64_t kChannels = 4;

// x[2,3,8,8] -> Conv(w[, b]) -> BatchNormalization -> c; the BN's statistics are such that
// folding matters (non-zero mean, variance far from 1).
ModelBuilder ConvBn(bool conv_bias) {
  ModelBuilder mb;
  mb.Input("x", {2, 3, 8, 8});
  mb.Initializer("w", {kChannels, 3, 3, 3}, RandomFloats(108, 1));
  if (conv_bias) mb.Initializer("b", {kChannels}, RandomFloats(kChannels, 2));
  mb.Initializer("scale", {kChannels}, RandomFloats(kChannels, 3, 0.5f, 2.f));
  mb.Initializer("shift", {kChannels}, RandomFloats(kChannels, 4));
  mb.Initializer("mean", {kChannels}, RandomFloats(kChannels, 5));
  mb.Initializer("var", {kChannels}, RandomFloats(kChannels, 6, 0.1f, 3.f));
  std::vector<std::string> in = {"x", "w"};
  if (conv_bias) in.push_back("b");
  auto& conv = mb.Node("Conv", in, {"c"});
  ModelBuilder::Attr(conv, "pads", std::vector<int64_t>{1, 1, 1, 1});
  auto& bn = mb.Node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, {"n"});
  ModelBuilder::Attr(bn, "epsilon", 1e-3f);
  return mb;
}

HostTensor Image(uint32_t seed) {
  return HostTensor::FromFloats({2, 3, 8, 8}, RandomFloats(2 * 3 * 8 * 8, seed));
}

TEST(FusionTest, BatchNormFoldsIntoConvWithOrWithoutBias) {
  for (bool conv_bias : {true, false}) {
    ModelBuilder mb = ConvBn(conv_bias);
    mb.Node("Relu", {"n"}, {"y"});
    mb.Output("y", {2, kChannels, 8, 8});
    // Conv -> BN -> Relu: one Conv.
    EXPECT_EQ(ExpectSameOutputs(mb.Bytes(), {}, {Image(7)}), 1u) << "bias " << conv_bias;
  }
}

TEST(FusionTest, FoldedPersistentBytesAreTheFoldedWeightsAndBias) {
  ModelBuilder mb = ConvBn(true);
  mb.Output("n", {2, kChannels, 8, 8});
  CompileOptions o;
  auto fused = Executable::Compile(mb.Bytes(), o);
  ASSERT_TRUE(fused.ok()) << fused.status();
  // W' and B' only; the BN's four vectors and the original W and B are gone.
  EXPECT_EQ((*fused)->persistent_bytes(), AlignUp(108 * 4) + AlignUp(kChannels * 4));
  o.fuse = false;
  auto plain = Executable::Compile(mb.Bytes(), o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->persistent_bytes(), AlignUp(108 * 4) + 5 * AlignUp(kChannels * 4));
}

TEST(FusionTest, FoldedValuesAreTheHandComputedOnes) {
  // A 1x1 Conv of one channel: y = (w * x + b - mean) * scale / sqrt(var + eps) + shift.
  ModelBuilder mb;
  mb.Input("x", {1, 1, 1, 2});
  mb.Initializer("w", {1, 1, 1, 1}, {2.f}).Initializer("b", {1}, {1.f});
  mb.Initializer("scale", {1}, {3.f}).Initializer("shift", {1}, {0.5f});
  mb.Initializer("mean", {1}, {4.f}).Initializer("var", {1}, {0.25f});
  mb.Node("Conv", {"x", "w", "b"}, {"c"});
  auto& bn = mb.Node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, {"y"});
  ModelBuilder::Attr(bn, "epsilon", 0.f);
  mb.Output("y", {1, 1, 1, 2});
  Compiled c =
      CompileAndRun(mb.Bytes(), {}, {HostTensor::FromFloats({1, 1, 1, 2}, {1.f, -2.f})}, true);
  ASSERT_EQ(c.outputs.size(), 1u);
  EXPECT_EQ(c.exe->num_steps(), 1u);
  // s = 3 / 0.5 = 6: (2 + 1 - 4) * 6 + 0.5 and (-4 + 1 - 4) * 6 + 0.5.
  EXPECT_FLOAT_EQ(c.outputs[0].floats()[0], -5.5f);
  EXPECT_FLOAT_EQ(c.outputs[0].floats()[1], -41.5f);
}

TEST(FusionTest, AFetchedIntermediateIsNotFusedAway) {
  ModelBuilder mb = ConvBn(true);
  mb.Node("Relu", {"n"}, {"y"});
  mb.Output("y", {2, kChannels, 8, 8});
  CompileOptions o;
  o.fetches = {"y", "c"};  // the Conv's own output: BN cannot fold, nor Relu fuse
  EXPECT_EQ(ExpectSameOutputs(mb.Bytes(), o, {Image(8)}), 3u);
  o.fetches = {"y", "n"};  // the BN's output: it folds, the Relu stays apart
  EXPECT_EQ(ExpectSameOutputs(mb.Bytes(), o, {Image(8)}), 2u);
}

TEST(FusionTest, TrainingKeepsEveryNode) {
  ModelBuilder mb = ConvBn(true);
  mb.Node("Relu", {"n"}, {"y"});
  auto& mean = mb.Node("ReduceMean", {"y"}, {"loss"});
  ModelBuilder::Attr(mean, "keepdims", int64_t{0});
  mb.Output("loss", {});
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  auto exe = Executable::Compile(mb.Bytes(), o);
  ASSERT_TRUE(exe.ok()) << exe.status();
  int relus = 0;
  for (const Node& n : (*exe)->graph().nodes()) {
    relus += n.op == "Relu";
    EXPECT_FALSE(n.Has("fused_activation")) << n.Describe();
  }
  EXPECT_EQ(relus, 1);
}

// x -> Conv -> Clip(lo, hi) -> y, the bounds as constant inputs (opset 11 on).
ModelBuilder ConvClip(float lo, float hi) {
  ModelBuilder mb;
  mb.Input("x", {2, 3, 8, 8});
  mb.Initializer("w", {kChannels, 3, 3, 3}, RandomFloats(108, 11, -2.f, 2.f));
  mb.Initializer("lo", {}, {lo}).Initializer("hi", {}, {hi});
  auto& conv = mb.Node("Conv", {"x", "w"}, {"c"});
  ModelBuilder::Attr(conv, "pads", std::vector<int64_t>{1, 1, 1, 1});
  mb.Node("Clip", {"c", "lo", "hi"}, {"y"});
  mb.Output("y", {2, kChannels, 8, 8});
  return mb;
}

TEST(FusionTest, ClipWithConstantBoundsFusesIntoConv) {
  for (auto [lo, hi] : {std::pair{0.f, 6.f}, std::pair{-0.5f, 0.5f}}) {
    ModelBuilder mb = ConvClip(lo, hi);
    HostTensor x = Image(12);
    EXPECT_EQ(ExpectSameOutputs(mb.Bytes(), {}, {x}), 1u);
    Compiled c = CompileAndRun(mb.Bytes(), {}, {x}, true);
    ASSERT_EQ(c.outputs.size(), 1u);
    int clipped = 0;
    for (int64_t i = 0; i < c.outputs[0].num_elements(); ++i) {
      const float v = c.outputs[0].floats()[i];
      EXPECT_GE(v, lo);
      EXPECT_LE(v, hi);
      clipped += v == lo || v == hi;
    }
    EXPECT_GT(clipped, 0);
  }
}

TEST(FusionTest, ClipWithAFedBoundIsNotFused) {
  ModelBuilder mb;
  mb.Input("x", {2, 3, 8, 8});
  mb.Input("hi", {});
  mb.Initializer("w", {kChannels, 3, 3, 3}, RandomFloats(108, 13));
  mb.Node("Conv", {"x", "w"}, {"c"});
  mb.Node("Clip", {"c", "", "hi"}, {"y"});
  mb.Output("y", {2, kChannels, 6, 6});
  EXPECT_EQ(ExpectSameOutputs(mb.Bytes(), {}, {Image(14), HostTensor::FromFloats({}, {0.1f})}), 2u);
}

// x -> Conv1 -> a -> Conv2 -> b; Add(b, a) or Add(a, b) -> s [-> Relu -> y].
ModelBuilder Residual(bool b_first, bool relu) {
  ModelBuilder mb;
  mb.Input("x", {2, kChannels, 8, 8});
  mb.Initializer("w1", {kChannels, kChannels, 3, 3}, RandomFloats(144, 21));
  mb.Initializer("w2", {kChannels, kChannels, 3, 3}, RandomFloats(144, 22));
  mb.Initializer("b2", {kChannels}, RandomFloats(kChannels, 23));
  auto& c1 = mb.Node("Conv", {"x", "w1"}, {"a"});
  ModelBuilder::Attr(c1, "pads", std::vector<int64_t>{1, 1, 1, 1});
  auto& c2 = mb.Node("Conv", {"a", "w2", "b2"}, {"b"});
  ModelBuilder::Attr(c2, "pads", std::vector<int64_t>{1, 1, 1, 1});
  mb.Node("Add", b_first ? std::vector<std::string>{"b", "a"} : std::vector<std::string>{"a", "b"},
          {"s"});
  if (relu) mb.Node("Relu", {"s"}, {"y"});
  mb.Output(relu ? "y" : "s", {2, kChannels, 8, 8});
  return mb;
}

HostTensor ResidualInput() {
  return HostTensor::FromFloats({2, kChannels, 8, 8}, RandomFloats(2 * kChannels * 64, 24));
}

TEST(FusionTest, ResidualAddAndReluFuseIntoTheLaterConv) {
  for (bool b_first : {true, false}) {
    for (bool relu : {true, false}) {
      // Conv1 alone, then Conv2 with the sum and the Relu.
      EXPECT_EQ(ExpectSameOutputs(Residual(b_first, relu).Bytes(), {}, {ResidualInput()}), 2u)
          << "b_first " << b_first << " relu " << relu;
    }
  }
}

TEST(FusionTest, ResidualAddOfTwoConvsOfOneInput) {
  // The shape of a downsampling block: Add(Conv1(x), Conv2(x)); Conv2 (later) takes the sum.
  ModelBuilder mb;
  mb.Input("x", {2, kChannels, 8, 8});
  mb.Initializer("w1", {kChannels, kChannels, 1, 1}, RandomFloats(16, 31));
  mb.Initializer("w2", {kChannels, kChannels, 1, 1}, RandomFloats(16, 32));
  mb.Node("Conv", {"x", "w1"}, {"a"});
  mb.Node("Conv", {"x", "w2"}, {"b"});
  mb.Node("Add", {"a", "b"}, {"s"});
  mb.Output("s", {2, kChannels, 8, 8});
  Compiled c = CompileAndRun(mb.Bytes(), {}, {ResidualInput()}, true);
  ASSERT_TRUE(c.exe);
  ASSERT_EQ(c.exe->graph().nodes().size(), 2u);
  EXPECT_EQ(c.exe->graph().nodes()[1].input(3), c.exe->graph().Find("a"));
  EXPECT_EQ(ExpectSameOutputs(mb.Bytes(), {}, {ResidualInput()}), 2u);
}

TEST(FusionTest, AFetchedConvOutputKeepsTheAddApart) {
  CompileOptions o;
  o.fetches = {"y", "b"};
  EXPECT_EQ(ExpectSameOutputs(Residual(true, true).Bytes(), o, {ResidualInput()}), 4u);
  o.fetches = {"y", "s"};  // the sum: the Add fuses, the Relu stays apart
  EXPECT_EQ(ExpectSameOutputs(Residual(true, true).Bytes(), o, {ResidualInput()}), 3u);
}

TEST(FusionTest, CudaCompilesKeepTheResidualAddApart) {
  ModelBuilder mb = Residual(true, true);
  auto exe = Executable::Compile(mb.Bytes(), {});
  ASSERT_TRUE(exe.ok()) << exe.status();
  Graph g = (*exe)->graph();  // already fused for the CPU: rebuild from the unfused compile
  CompileOptions o;
  o.fuse = false;
  auto plain = Executable::Compile(mb.Bytes(), o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  Graph cuda = (*plain)->graph();
  EXPECT_EQ(FuseResidualAdd(&cuda, FusionOptions{DeviceType::kCuda, {}}), 0);
  EXPECT_EQ(cuda.nodes().size(), 4u);
  Graph cpu = (*plain)->graph();
  EXPECT_EQ(FuseResidualAdd(&cpu, FusionOptions{DeviceType::kCpu, {}}), 2);  // Add and Relu
  EXPECT_EQ(cpu.nodes().size(), g.nodes().size());
}

TEST(FusionTest, CudaCompilesFuseOnlyClipsFromZero) {
  for (auto [lo, fused] : {std::pair{0.f, 1}, std::pair{-1.f, 0}}) {
    CompileOptions o;
    o.fuse = false;
    auto plain = Executable::Compile(ConvClip(lo, 6.f).Bytes(), o);
    ASSERT_TRUE(plain.ok()) << plain.status();
    Graph g = (*plain)->graph();
    EXPECT_EQ(FuseActivations(&g, FusionOptions{DeviceType::kCuda, {}}), fused) << lo;
  }
}

// x -> Conv a -> Conv b -> Conv c (+ a as a fused residual sum) -> y, 16 channels: a value
// between Convs stays channel-blocked (Note [Blocked layouts]) and the result is the row-major
// compile's.
ModelBuilder ConvChain() {
  ModelBuilder mb;
  mb.Input("x", {2, 16, 6, 6});
  for (const char* w : {"wa", "wb", "wc"}) {
    mb.Initializer(w, {16, 16, 3, 3}, RandomFloats(16 * 16 * 9, w[1], -0.2f, 0.2f));
  }
  for (auto [in, w, out] : {std::tuple{"x", "wa", "a"}, {"a", "wb", "b"}, {"b", "wc", "c"}}) {
    auto& conv = mb.Node("Conv", {in, w}, {out});
    ModelBuilder::Attr(conv, "pads", std::vector<int64_t>{1, 1, 1, 1});
  }
  mb.Node("Add", {"c", "a"}, {"y"});
  mb.Output("y", {2, 16, 6, 6});
  return mb;
}

TEST(FusionTest, ValuesBetweenConvsStayBlocked) {
  const std::string model = ConvChain().Bytes();
  const std::vector<HostTensor> feeds = {
      HostTensor::FromFloats({2, 16, 6, 6}, RandomFloats(2 * 16 * 36, 7))};
  CompileOptions o;
  Compiled fused = CompileAndRun(model, o, feeds, true);
  Compiled plain = CompileAndRun(model, o, feeds, false);
  ASSERT_TRUE(fused.exe && plain.exe);
  ExpectClose(fused.outputs[0], plain.outputs[0]);
  int blocked_out = 0, blocked_in = 0;
  for (const Node& n : fused.exe->graph().nodes()) {
    blocked_out += n.GetInt("dst_block", 0) > 0;
    blocked_in += n.GetInt("src_block", 0) > 0;
  }
  // b only: y is a graph output and stays row-major, and so does a, the other operand of the
  // sum that makes y (a fused sum starts from it in y's layout).
  EXPECT_EQ(blocked_out, 1);
  EXPECT_EQ(blocked_in, 1);

  // A fetched value stays row-major, and so does the one it is summed with.
  o.fetches = {"y", "a"};
  Compiled fetched = CompileAndRun(model, o, feeds, true);
  ASSERT_TRUE(fetched.exe);
  ExpectClose(fetched.outputs[0], plain.outputs[0]);
  for (const Node& n : fetched.exe->graph().nodes()) {
    if (n.outputs[0] == fetched.exe->graph().Find("a")) {
      EXPECT_EQ(n.GetInt("dst_block", 0), 0);
    }
  }
}

// The exported CNNs: every rewrite at once, against the unfused compile.
TEST(FusionTest, ExportedCnnsKeepTheirOutputs) {
  for (const char* name : {"resnet18", "mobilenetv2", "mobilenetv3"}) {
    const std::string model = ReadModel(name);
    ASSERT_FALSE(model.empty()) << name;
    CompileOptions o;
    o.input_shapes = {{"x", {2, 3, 32, 32}}, {"labels", {2}}};
    o.fetches = {"logits"};
    auto probe = Executable::Compile(model, o);
    ASSERT_TRUE(probe.ok()) << probe.status();
    std::vector<HostTensor> feeds;
    for (const TensorInfo& in : (*probe)->inputs()) {
      if (in.type == DataType::kInt64) {
        feeds.push_back(
            HostTensor::FromInt64s(in.shape, std::vector<int64_t>(NumElements(in.shape), 1)));
      } else {
        feeds.push_back(HostTensor::FromFloats(in.shape, RandomFloats(NumElements(in.shape), 41)));
      }
    }
    Compiled fused = CompileAndRun(model, o, feeds, true);
    Compiled plain = CompileAndRun(model, o, feeds, false);
    ASSERT_TRUE(fused.exe && plain.exe) << name;
    ASSERT_EQ(fused.outputs.size(), 1u);
    ExpectClose(fused.outputs[0], plain.outputs[0]);
    // Half the steps; a fifth fewer for MobileNetV3, whose hard-swish chains (Note [Composed
    // ops]: four elementwise nodes each) are not fused, only its Conv -> BatchNorm [-> ReLU].
    const bool v3 = std::string(name) == "mobilenetv3";
    EXPECT_LT(fused.exe->num_steps() * (v3 ? 5 : 2), plain.exe->num_steps() * (v3 ? 4 : 1)) << name;
    EXPECT_LT(fused.exe->persistent_bytes(), plain.exe->persistent_bytes()) << name;
    for (const Node& n : fused.exe->graph().nodes()) {
      EXPECT_NE(n.op, "BatchNormalization") << name;
    }
  }
}

// Note [Transposed operands]: a[2,5,3] and b[2,4,5] reach MatMuls transposed, w[4,6] a Gemm;
// `extra` lets another node read a's transpose too.
ModelBuilder TransposedProducts(bool extra) {
  ModelBuilder mb;
  mb.Input("a", {2, 5, 3}).Input("b", {2, 4, 5}).Input("x", {3, 6}).Input("w", {4, 6});
  auto& ta = mb.Node("Transpose", {"a"}, {"at"});
  ModelBuilder::Attr(ta, "perm", std::vector<int64_t>{0, 2, 1});
  auto& tb = mb.Node("Transpose", {"b"}, {"bt"});
  ModelBuilder::Attr(tb, "perm", std::vector<int64_t>{0, 2, 1});
  mb.Node("MatMul", {"at", "bt"}, {"y"});    // [2,3,5] x [2,5,4]
  mb.Node("MatMul", {"at", "a"}, {"gram"});  // [2,3,5] x [2,5,3]
  mb.Node("Transpose", {"w"}, {"wt"});       // ONNX's default perm: the dims reversed
  mb.Node("Gemm", {"x", "wt"}, {"z"});       // [3,6] x [6,4]
  mb.Output("y", {2, 3, 4}).Output("gram", {2, 3, 3}).Output("z", {3, 4});
  if (extra) {
    mb.Node("Relu", {"at"}, {"r"});
    mb.Output("r", {2, 3, 5});
  }
  return mb;
}

std::vector<HostTensor> TransposedFeeds() {
  return {HostTensor::FromFloats({2, 5, 3}, RandomFloats(30, 52)),
          HostTensor::FromFloats({2, 4, 5}, RandomFloats(40, 53)),
          HostTensor::FromFloats({3, 6}, RandomFloats(18, 54)),
          HostTensor::FromFloats({4, 6}, RandomFloats(24, 51))};
}

TEST(FusionTest, LastTwoDimTransposesFoldIntoTheProducts) {
  const std::string model = TransposedProducts(false).Bytes();
  CompileOptions o;
  Compiled fused = CompileAndRun(model, o, TransposedFeeds(), true);
  Compiled plain = CompileAndRun(model, o, TransposedFeeds(), false);
  ASSERT_TRUE(fused.exe && plain.exe);
  ASSERT_EQ(fused.outputs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) ExpectClose(fused.outputs[i], plain.outputs[i]);
  int transposes = 0;
  for (const Node& n : fused.exe->graph().nodes()) {
    transposes += n.op == "Transpose";
    if (n.outputs[0] == fused.exe->graph().Find("y")) {
      EXPECT_EQ(n.GetInt(kMatMulTransA, 0), 1);
      EXPECT_EQ(n.GetInt(kMatMulTransB, 0), 1);
    }
    if (n.outputs[0] == fused.exe->graph().Find("gram")) {
      EXPECT_EQ(n.GetInt(kMatMulTransA, 0), 1);
      EXPECT_EQ(n.GetInt(kMatMulTransB, 0), 0);
    }
    if (n.op == "Gemm") {
      EXPECT_EQ(n.GetInt("transB", 0), 1);
    }
  }
  EXPECT_EQ(transposes, 0);
  EXPECT_EQ(fused.exe->num_steps(), 3u);  // the three products
  EXPECT_GT(plain.exe->num_steps(), fused.exe->num_steps());
}

TEST(FusionTest, ATransposeReadElsewhereOrFetchedStays) {
  CompileOptions o;
  Compiled fused = CompileAndRun(TransposedProducts(true).Bytes(), o, TransposedFeeds(), true);
  Compiled plain = CompileAndRun(TransposedProducts(true).Bytes(), o, TransposedFeeds(), false);
  ASSERT_TRUE(fused.exe && plain.exe);
  ASSERT_EQ(fused.outputs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) ExpectClose(fused.outputs[i], plain.outputs[i]);
  int transposes = 0;
  for (const Node& n : fused.exe->graph().nodes()) transposes += n.op == "Transpose";
  EXPECT_EQ(transposes, 1);  // a's, for the Relu; the MatMuls still read a itself

  o.fetches = {"y", "bt"};
  Compiled fetched = CompileAndRun(TransposedProducts(false).Bytes(), o, TransposedFeeds(), true);
  ASSERT_TRUE(fetched.exe);
  ASSERT_EQ(fetched.outputs.size(), 2u);
  ExpectClose(fetched.outputs[0], plain.outputs[0]);
  EXPECT_EQ(fetched.outputs[1].shape, (Shape{2, 5, 4}));
  EXPECT_EQ(fetched.outputs[1].floats()[1], TransposedFeeds()[1].floats()[5]);  // bt[0,0,1]
}

TEST(FusionTest, TransposeChainsBecomeOneTranspose) {
  ModelBuilder mb;
  mb.Input("x", {2, 3, 4});
  auto& t1 = mb.Node("Transpose", {"x"}, {"t1"});
  ModelBuilder::Attr(t1, "perm", std::vector<int64_t>{2, 0, 1});  // [4,2,3]
  auto& t2 = mb.Node("Transpose", {"t1"}, {"t2"});
  ModelBuilder::Attr(t2, "perm", std::vector<int64_t>{1, 2, 0});  // back to [2,3,4]
  auto& t3 = mb.Node("Transpose", {"t2"}, {"t3"});
  ModelBuilder::Attr(t3, "perm", std::vector<int64_t>{1, 0, 2});  // [3,2,4]
  mb.Node("Relu", {"t3"}, {"y"});
  mb.Output("y", {3, 2, 4});
  const std::vector<HostTensor> feeds = {HostTensor::FromFloats({2, 3, 4}, RandomFloats(24, 55))};
  CompileOptions o;
  Compiled fused = CompileAndRun(mb.Bytes(), o, feeds, true);
  Compiled plain = CompileAndRun(mb.Bytes(), o, feeds, false);
  ASSERT_TRUE(fused.exe && plain.exe);
  ExpectClose(fused.outputs[0], plain.outputs[0]);
  std::vector<const Node*> transposes;
  for (const Node& n : fused.exe->graph().nodes()) {
    if (n.op == "Transpose") transposes.push_back(&n);
  }
  ASSERT_EQ(transposes.size(), 1u);
  EXPECT_EQ(transposes[0]->inputs[0], fused.exe->graph().Find("x"));
  EXPECT_EQ(transposes[0]->GetInts("perm"), (std::vector<int64_t>{1, 0, 2}));
}

// A chain that undoes itself (a layout made contiguous and turned back, as PyTorch's fused
// attention lays out its results) leaves no Transpose: its readers read the chain's input; a
// fetched one stays, and so does a Transpose whose chain does change the layout.
TEST(FusionTest, TransposeChainsThatUndoThemselvesAreReadThrough) {
  ModelBuilder mb;
  mb.Input("x", {2, 3, 4});
  auto& t1 = mb.Node("Transpose", {"x"}, {"t1"});
  ModelBuilder::Attr(t1, "perm", std::vector<int64_t>{0, 2, 1});
  auto& t2 = mb.Node("Transpose", {"t1"}, {"t2"});
  ModelBuilder::Attr(t2, "perm", std::vector<int64_t>{0, 2, 1});  // back to [2,3,4]
  mb.Node("Relu", {"t2"}, {"y"});
  auto& t3 = mb.Node("Transpose", {"t2"}, {"t3"});
  ModelBuilder::Attr(t3, "perm", std::vector<int64_t>{1, 0, 2});  // [3,2,4]
  mb.Node("Relu", {"t3"}, {"z"});
  mb.Output("y", {2, 3, 4});
  mb.Output("z", {3, 2, 4});
  const std::vector<HostTensor> feeds = {HostTensor::FromFloats({2, 3, 4}, RandomFloats(24, 56))};
  CompileOptions o;
  Compiled fused = CompileAndRun(mb.Bytes(), o, feeds, true);
  Compiled plain = CompileAndRun(mb.Bytes(), o, feeds, false);
  ASSERT_TRUE(fused.exe && plain.exe);
  ExpectClose(fused.outputs[0], plain.outputs[0]);
  ExpectClose(fused.outputs[1], plain.outputs[1]);
  const Graph& g = fused.exe->graph();
  std::vector<const Node*> transposes;
  for (const Node& n : g.nodes()) {
    if (n.op == "Transpose") transposes.push_back(&n);
    if (n.op == "Relu" && n.outputs[0] == g.Find("y")) {
      EXPECT_EQ(n.inputs[0], g.Find("x"));
    }
  }
  ASSERT_EQ(transposes.size(), 1u);
  EXPECT_EQ(transposes[0]->inputs[0], g.Find("x"));
  EXPECT_EQ(transposes[0]->GetInts("perm"), (std::vector<int64_t>{1, 0, 2}));

  o.fetches = {"t2", "z"};
  Compiled fetched = CompileAndRun(mb.Bytes(), o, feeds, true);
  ASSERT_TRUE(fetched.exe);
  ASSERT_EQ(fetched.outputs.size(), 2u);
  int kept = 0;
  for (const Node& n : fetched.exe->graph().nodes()) kept += n.op == "Transpose";
  EXPECT_EQ(kept, 2);
  ExpectClose(fetched.outputs[0], feeds[0]);
  ExpectClose(fetched.outputs[1], plain.outputs[1]);
}

// Training: the backward of a batched MatMul reads transposes of its operands; folded, the
// losses are those of the unfused compile.
TEST(FusionTest, TrainingFoldsTheBackwardsTransposes) {
  ModelBuilder mb;
  mb.Input("x", {4, 3, 5});
  mb.Initializer("w", {4, 5, 6}, RandomFloats(120, 56));  // (batched: a 2-D weight's
  mb.Initializer("v", {4, 6, 2}, RandomFloats(48, 57));   // gradients are Gemms already)
  mb.Node("MatMul", {"x", "w"}, {"h"});
  mb.Node("Tanh", {"h"}, {"t"});
  mb.Node("MatMul", {"t", "v"}, {"o"});
  mb.Node("Mul", {"o", "o"}, {"sq"});
  CompileOptions o = TrainOnLoss(mb, "ReduceMean", "sq");
  const std::vector<HostTensor> feeds = {HostTensor::FromFloats({4, 3, 5}, RandomFloats(60, 58))};
  std::vector<float> losses[2];
  size_t steps[2] = {0, 0};
  for (int fuse = 0; fuse < 2; ++fuse) {
    o.fuse = fuse != 0;
    auto exe = Executable::Compile(mb.Bytes(), o);
    ASSERT_TRUE(exe.ok()) << exe.status();
    Memory m(**exe);
    for (int step = 0; step < 3; ++step) {
      auto out = RunHost(**exe, m, feeds);
      ASSERT_TRUE(out.ok()) << out.status();
      losses[fuse].push_back((*out)[0].floats()[0]);
    }
    steps[fuse] = (*exe)->num_steps();
  }
  for (size_t i = 0; i < losses[0].size(); ++i) {
    EXPECT_NEAR(losses[1][i], losses[0][i], kTolerance * std::abs(losses[0][i])) << "step " << i;
  }
  EXPECT_LT(losses[1].back(), losses[1].front());
  EXPECT_LT(steps[1], steps[0]);
}

}  // namespace

// Note [Fused bias]: a per-channel Add after a bias-free Conv becomes its bias (and the Relu after
// it its activation); CUDA compiles keep the Add.
TEST(FusionTest, PerChannelAddBecomesTheConvsBias) {
  ModelBuilder mb;
  mb.Input("x", {2, 3, 8, 8});
  mb.Initializer("w", {4, 3, 3, 3}, RandomFloats(108, 71));
  mb.Initializer("b", {4, 1, 1}, RandomFloats(4, 72));
  mb.Node("Conv", {"x", "w"}, {"c"});
  mb.Node("Add", {"c", "b"}, {"a"});
  mb.Node("Relu", {"a"}, {"y"});
  mb.Output("y", {2, 4, 6, 6});
  const std::vector<HostTensor> feeds = {
      HostTensor::FromFloats({2, 3, 8, 8}, RandomFloats(384, 73))};
  CompileOptions o;
  Compiled fused = CompileAndRun(mb.Bytes(), o, feeds, true);
  Compiled plain = CompileAndRun(mb.Bytes(), o, feeds, false);
  ASSERT_TRUE(fused.exe && plain.exe);
  ExpectClose(fused.outputs[0], plain.outputs[0]);
  ASSERT_EQ(fused.exe->num_steps(), 1u);
  const Node& conv = fused.exe->graph().nodes().back();
  EXPECT_EQ(conv.op, "Conv");
  EXPECT_NE(conv.input(2), kNoValue);
  EXPECT_EQ(conv.GetString("fused_activation", ""), "Relu");

  Graph g = plain.exe->graph();  // the unfused nodes, rewritten as a CUDA compile would be
  EXPECT_EQ(FuseConvBias(&g, FusionOptions{DeviceType::kCuda, {}}), 0);
}

// ---------------------------------------------------------------------------------------------
// Note [Fused elementwise chains].

bool SameBits(const HostTensor& a, const HostTensor& b) {
  return a.shape == b.shape && a.bytes.size() == b.bytes.size() &&
         std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0;
}

int CountOps(const Executable& exe, const std::string& op) {
  int count = 0;
  for (const Node& n : exe.graph().nodes()) count += n.op == op;
  return count;
}

// out = -((x - y) * s / (sqrt(y * y) + eps)) over `shape`, s and eps scalars: one chain.
ModelBuilder ElementwiseChain(const Shape& shape) {
  ModelBuilder mb;
  mb.Input("x", shape).Input("y", shape);
  mb.Initializer("s", {}, {0.75f});
  mb.Initializer("eps", {1}, {1e-3f});
  mb.Node("Sub", {"x", "y"}, {"d"});
  mb.Node("Mul", {"d", "s"}, {"ds"});
  mb.Node("Mul", {"y", "y"}, {"yy"});
  mb.Node("Sqrt", {"yy"}, {"r"});
  mb.Node("Add", {"r", "eps"}, {"den"});
  mb.Node("Div", {"ds", "den"}, {"q"});
  mb.Node("Neg", {"q"}, {"out"});
  mb.Output("out", shape);
  return mb;
}

// Every element as the separate nodes compute it, bit for bit, whether the count is a multiple
// of the kernel's block or not, and whether the threads split it (40,000 elements) or not.
TEST(FusionTest, ElementwiseChainsRunAsOneNodeBitForBit) {
  for (const Shape& shape : {Shape{3, 7}, Shape{4, 10000}}) {
    const int64_t count = NumElements(shape);
    const std::vector<HostTensor> feeds = {HostTensor::FromFloats(shape, RandomFloats(count, 61)),
                                           HostTensor::FromFloats(shape, RandomFloats(count, 62))};
    CompileOptions o;
    Compiled fused = CompileAndRun(ElementwiseChain(shape).Bytes(), o, feeds, true);
    Compiled plain = CompileAndRun(ElementwiseChain(shape).Bytes(), o, feeds, false);
    ASSERT_TRUE(fused.exe && plain.exe);
    ASSERT_EQ(fused.outputs.size(), 1u);
    EXPECT_TRUE(SameBits(fused.outputs[0], plain.outputs[0])) << ShapeString(shape);
    EXPECT_EQ(fused.exe->num_steps(), 1u);
    EXPECT_EQ(CountOps(*fused.exe, kFusedElementwiseOp), 1);
    EXPECT_EQ(plain.exe->num_steps(), 7u);
  }
}

// A value another node reads, a fetched one, and an operand that broadcasts along a dim (not a
// scalar) end a chain; the chains on either side still fuse, and the results stay exact.
TEST(FusionTest, SharedFetchedOrBroadcastValuesEndAChain) {
  const Shape shape = {6, 50};
  ModelBuilder mb;
  mb.Input("x", shape).Input("y", shape).Input("row", {50});
  mb.Node("Sub", {"x", "y"}, {"a"});
  mb.Node("Mul", {"a", "a"}, {"b"});    // a is read twice here ...
  mb.Node("Relu", {"a"}, {"c"});        // ... and by a node outside the set
  mb.Node("Add", {"b", "row"}, {"e"});  // row broadcasts: not a chain member
  mb.Node("Sqrt", {"e"}, {"f"});
  mb.Node("Neg", {"f"}, {"g"});
  mb.Node("Mul", {"g", "c"}, {"out"});
  mb.Output("out", shape);
  const std::vector<HostTensor> feeds = {HostTensor::FromFloats(shape, RandomFloats(300, 63)),
                                         HostTensor::FromFloats(shape, RandomFloats(300, 64)),
                                         HostTensor::FromFloats({50}, RandomFloats(50, 65))};
  CompileOptions o;
  Compiled fused = CompileAndRun(mb.Bytes(), o, feeds, true);
  Compiled plain = CompileAndRun(mb.Bytes(), o, feeds, false);
  ASSERT_TRUE(fused.exe && plain.exe);
  EXPECT_TRUE(SameBits(fused.outputs[0], plain.outputs[0]));
  // Sub, Mul (a*a), Relu and Add stay; Sqrt, Neg and the last Mul become one node.
  EXPECT_EQ(CountOps(*fused.exe, "Sub"), 1);
  EXPECT_EQ(CountOps(*fused.exe, "Relu"), 1);
  EXPECT_EQ(CountOps(*fused.exe, "Add"), 1);
  EXPECT_EQ(CountOps(*fused.exe, kFusedElementwiseOp), 1);
  EXPECT_EQ(fused.exe->num_steps(), 5u);

  o.fetches = {"out", "f"};  // f fetched: Sqrt ends its chain, Neg and Mul still fuse
  Compiled fetched = CompileAndRun(mb.Bytes(), o, feeds, true);
  ASSERT_TRUE(fetched.exe);
  EXPECT_TRUE(SameBits(fetched.outputs[0], plain.outputs[0]));
  EXPECT_EQ(CountOps(*fetched.exe, "Sqrt"), 1);
  EXPECT_EQ(CountOps(*fetched.exe, kFusedElementwiseOp), 1);
}

// Training compiles keep every node (the backward pass reads the intermediates).
TEST(FusionTest, TrainingCompilesKeepElementwiseNodes) {
  ModelBuilder mb;
  mb.Input("x", {4, 8});
  mb.Initializer("w", {4, 8}, RandomFloats(32, 66));
  mb.Node("Sub", {"x", "w"}, {"d"});
  mb.Node("Mul", {"d", "d"}, {"sq"});
  CompileOptions o = TrainOnLoss(mb, "ReduceSum", "sq");
  auto exe = Executable::Compile(mb.Bytes(), o);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ(CountOps(**exe, kFusedElementwiseOp), 0);
}

}  // namespace salus::exec
