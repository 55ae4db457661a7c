// Training forms of BatchNormalization and Dropout, LayerNormalization, and the optimizers'
// weight decay, against values computed here by hand (as PyTorch defines them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "exec/element_math.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  ASSERT_TRUE(tmp.ok()) << tmp.status();          \
  lhs = std::move(*tmp)
#define ASSERT_OK_AND_ASSIGN_CAT(a, b) a##b
#define ASSERT_OK_AND_ASSIGN_NAME(line) ASSERT_OK_AND_ASSIGN_CAT(status_or_, line)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(ASSERT_OK_AND_ASSIGN_NAME(__LINE__), lhs, expr)

CompileOptions Training(std::vector<std::string> fetches = {}) {
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer.learning_rate = 0.f;
  o.fetches = std::move(fetches);
  return o;
}

// loss = sum(y * R), R fed.
void SumLoss(ModelBuilder& mb, const Shape& y_shape) {
  mb.Input("R", y_shape);
  mb.Node("Mul", {"y", "R"}, {"t"});
  auto& sum = mb.Node("ReduceSum", {"t"}, {"loss"});
  ModelBuilder::Attr(sum, "keepdims", int64_t{0});
  mb.Output("loss", {}).Output("y", y_shape);
}

// ---------------------------------------------------------------------------------------------
// BatchNormalization in training.

TEST(BatchNormTrainingTest, NormalisesWithBatchStatisticsAndUpdatesRunningOnes) {
  const Shape xs = {4, 3, 2, 2};
  const int64_t n = 4, c = 3, hw = 4, m = n * hw;
  const std::vector<float> scale = {1.f, 0.5f, 2.f}, bias = {0.f, 1.f, -1.f};
  const std::vector<float> rm0 = {0.1f, 0.2f, 0.3f}, rv0 = {1.f, 2.f, 0.5f};
  ModelBuilder mb;
  mb.Input("X", xs)
      .Initializer("scale", {c}, scale)
      .Initializer("B", {c}, bias)
      .Initializer("rm", {c}, rm0)
      .Initializer("rv", {c}, rv0);
  auto& bn = mb.Node("BatchNormalization", {"X", "scale", "B", "rm", "rv"}, {"y"});
  ModelBuilder::Attr(bn, "momentum", 0.8f);
  ModelBuilder::Attr(bn, "epsilon", 1e-5f);
  SumLoss(mb, xs);
  ASSERT_OK_AND_ASSIGN(auto exe, Executable::Compile(mb.Bytes(), Training({"y", "rm", "rv"})));
  Memory mem(*exe);
  ASSERT_EQ(exe->inputs().size(), 2u);
  const HostTensor r = HostTensor::FromFloats(xs, std::vector<float>(NumElements(xs), 1.f));

  std::vector<double> rm(rm0.begin(), rm0.end()), rv(rv0.begin(), rv0.end());
  for (int it = 0; it < 2; ++it) {
    SCOPED_TRACE(it);
    const HostTensor x = HostTensor::FromFloats(xs, RandomFloats(NumElements(xs), 10 + it, -2, 3));
    std::vector<HostTensor> feeds = {x, r};
    if (exe->inputs()[0].name != "X") std::swap(feeds[0], feeds[1]);
    ASSERT_OK_AND_ASSIGN(std::vector<HostTensor> out, RunHost(*exe, mem, feeds));
    for (int64_t ch = 0; ch < c; ++ch) {
      double sum = 0, sq = 0;
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t i = 0; i < hw; ++i) sum += x.floats()[(b * c + ch) * hw + i];
      }
      const double mean = sum / m;
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t i = 0; i < hw; ++i) {
          const double d = x.floats()[(b * c + ch) * hw + i] - mean;
          sq += d * d;
        }
      }
      const double var = sq / m;
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t i = 0; i < hw; ++i) {
          const int64_t e = (b * c + ch) * hw + i;
          const double y = (x.floats()[e] - mean) / std::sqrt(var + 1e-5) * scale[ch] + bias[ch];
          EXPECT_NEAR(out[0].floats()[e], y, 1e-4) << e;
        }
      }
      // PyTorch: running = (1 - 0.2) * running + 0.2 * batch, the variance unbiased.
      rm[ch] = 0.8 * rm[ch] + 0.2 * mean;
      rv[ch] = 0.8 * rv[ch] + 0.2 * sq / (m - 1);
      EXPECT_NEAR(out[1].floats()[ch], rm[ch], 1e-5) << ch;
      EXPECT_NEAR(out[2].floats()[ch], rv[ch], 1e-5) << ch;
    }
  }
  // The running statistics are state, not parameters: the persistent values hold them too.
  ASSERT_OK_AND_ASSIGN(HostTensor prm, exe->ReadPersistent(mem.p(), "rm"));
  EXPECT_NEAR(prm.floats()[2], rm[2], 1e-5);
  const Graph& g = exe->graph();
  EXPECT_EQ(g.value(g.Find("rm")).kind, ValueKind::kState);
  EXPECT_EQ(g.value(g.Find("scale")).kind, ValueKind::kParameter);
}

// As PyTorch exports a model in train mode: training_mode 1 and the running statistics as
// outputs, which receive the updated values.
TEST(BatchNormTrainingTest, ExportedTrainingModeOutputsTheUpdatedStatistics) {
  ModelBuilder mb;
  mb.Input("X", {3, 2})
      .Initializer("scale", {2}, {1.f, 1.f})
      .Initializer("B", {2}, {0.f, 0.f})
      .Initializer("rm", {2}, {0.f, 0.f})
      .Initializer("rv", {2}, {1.f, 1.f});
  auto& bn =
      mb.Node("BatchNormalization", {"X", "scale", "B", "rm", "rv"}, {"y", "rm_out", "rv_out"});
  ModelBuilder::Attr(bn, "training_mode", int64_t{1});
  ModelBuilder::Attr(bn, "momentum", 0.5f);
  SumLoss(mb, {3, 2});
  ASSERT_OK_AND_ASSIGN(auto exe, Executable::Compile(mb.Bytes(), Training({"rm_out", "rv_out"})));
  Memory mem(*exe);
  const HostTensor x = HostTensor::FromFloats({3, 2}, {1.f, 0.f, 2.f, 0.f, 6.f, 3.f});
  const HostTensor r = HostTensor::FromFloats({3, 2}, std::vector<float>(6, 1.f));
  std::vector<HostTensor> feeds = {x, r};
  if (exe->inputs()[0].name != "X") std::swap(feeds[0], feeds[1]);
  ASSERT_OK_AND_ASSIGN(auto out, RunHost(*exe, mem, feeds));
  // Channel 0: mean 3, unbiased variance 7; channel 1: mean 1, unbiased variance 3.
  EXPECT_NEAR(out[0].floats()[0], 1.5f, 1e-5);
  EXPECT_NEAR(out[0].floats()[1], 0.5f, 1e-5);
  EXPECT_NEAR(out[1].floats()[0], 4.f, 1e-5);
  EXPECT_NEAR(out[1].floats()[1], 2.f, 1e-5);
}

TEST(BatchNormTrainingTest, InferenceKeepsRunningStatistics) {
  ModelBuilder mb;
  mb.Input("X", {2, 2})
      .Initializer("scale", {2}, {1.f, 1.f})
      .Initializer("B", {2}, {0.f, 0.f})
      .Initializer("rm", {2}, {1.f, 2.f})
      .Initializer("rv", {2}, {4.f, 1.f});
  mb.Node("BatchNormalization", {"X", "scale", "B", "rm", "rv"}, {"y"});
  mb.Output("y", {2, 2});
  CompileOptions o;
  ASSERT_OK_AND_ASSIGN(auto exe, Executable::Compile(mb.Bytes(), o));
  Memory mem(*exe);
  ASSERT_OK_AND_ASSIGN(auto out,
                       RunHost(*exe, mem, {HostTensor::FromFloats({2, 2}, {3.f, 2.f, 1.f, 4.f})}));
  EXPECT_NEAR(out[0].floats()[0], (3.f - 1.f) / std::sqrt(4.f + 1e-5f), 1e-5);
  EXPECT_NEAR(out[0].floats()[3], (4.f - 2.f) / std::sqrt(1.f + 1e-5f), 1e-5);
}

TEST(BatchNormTrainingTest, OneValuePerChannelIsRefused) {
  ModelBuilder mb;
  mb.Input("X", {1, 2})
      .Initializer("scale", {2}, {1.f, 1.f})
      .Initializer("B", {2}, {0.f, 0.f})
      .Initializer("rm", {2}, {0.f, 0.f})
      .Initializer("rv", {2}, {1.f, 1.f});
  mb.Node("BatchNormalization", {"X", "scale", "B", "rm", "rv"}, {"y"});
  SumLoss(mb, {1, 2});
  auto exe = Executable::Compile(mb.Bytes(), Training());
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument) << exe.status();
  EXPECT_NE(exe.status().ToString().find("BatchNormalization"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// LayerNormalization.

TEST(LayerNormTest, ForwardOutputsMatchHandComputed) {
  const Shape xs = {2, 3, 4};
  const std::vector<float> x = RandomFloats(24, 3, -2, 2);
  const std::vector<float> scale = RandomFloats(12, 4), bias = RandomFloats(12, 5);
  ModelBuilder mb;
  mb.Input("X", xs).Initializer("scale", {3, 4}, scale).Initializer("B", {3, 4}, bias);
  auto& ln = mb.Node("LayerNormalization", {"X", "scale", "B"}, {"y", "mean", "invstd"});
  ModelBuilder::Attr(ln, "axis", int64_t{1});
  ModelBuilder::Attr(ln, "epsilon", 1e-3f);
  mb.Output("y", xs).Output("mean", {2, 1, 1}).Output("invstd", {2, 1, 1});
  ASSERT_OK_AND_ASSIGN(auto exe, Executable::Compile(mb.Bytes(), CompileOptions{}));
  ASSERT_EQ(exe->fetches()[1].shape, (Shape{2, 1, 1}));
  Memory mem(*exe);
  ASSERT_OK_AND_ASSIGN(auto out, RunHost(*exe, mem, {HostTensor::FromFloats(xs, x)}));
  for (int r = 0; r < 2; ++r) {
    double sum = 0, sq = 0;
    for (int i = 0; i < 12; ++i) sum += x[r * 12 + i];
    const double mean = sum / 12;
    for (int i = 0; i < 12; ++i) sq += (x[r * 12 + i] - mean) * (x[r * 12 + i] - mean);
    const double invstd = 1 / std::sqrt(sq / 12 + 1e-3);
    EXPECT_NEAR(out[1].floats()[r], mean, 1e-5);
    EXPECT_NEAR(out[2].floats()[r], invstd, 1e-4);
    for (int i = 0; i < 12; ++i) {
      EXPECT_NEAR(out[0].floats()[r * 12 + i], (x[r * 12 + i] - mean) * invstd * scale[i] + bias[i],
                  1e-4);
    }
  }
}

TEST(LayerNormTest, ScaleOfTheWrongShapeIsInvalid) {
  ModelBuilder mb;
  mb.Input("X", {2, 4}).Initializer("scale", {3}, {1.f, 1.f, 1.f});
  mb.Node("LayerNormalization", {"X", "scale"}, {"y"});
  mb.Output("y", {2, 4});
  auto exe = Executable::Compile(mb.Bytes(), CompileOptions{});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument) << exe.status();
}

// ---------------------------------------------------------------------------------------------
// Dropout in training.

struct DropoutRun {
  std::vector<float> y;
  std::vector<uint8_t> mask;
  std::vector<float> x_after;  // after one SGD step with learning rate 1
};

constexpr float kRatio = 0.3f;
const Shape kDropShape = {64, 32};

std::string DropoutModel() {
  ModelBuilder mb;
  mb.Initializer("X", kDropShape, RandomFloats(NumElements(kDropShape), 21, 0.5f, 1.5f));
  mb.Initializer("ratio", {}, {kRatio});
  mb.Node("Dropout", {"X", "ratio"}, {"y", "mask"});
  SumLoss(mb, kDropShape);
  return mb.Bytes();
}

void RunDropout(uint64_t seed, int iterations, DropoutRun* run) {
  CompileOptions o = Training({"y", "mask"});
  o.seed = seed;
  o.optimizer.learning_rate = 1.f;
  ASSERT_OK_AND_ASSIGN(auto exe, Executable::Compile(DropoutModel(), o));
  Memory mem(*exe);
  const HostTensor r = HostTensor::FromFloats(kDropShape, RandomFloats(2048, 22));
  for (int i = 0; i < iterations; ++i) {
    ASSERT_OK_AND_ASSIGN(auto out, RunHost(*exe, mem, {r}));
    if (i > 0) continue;
    run->y.assign(out[0].floats(), out[0].floats() + 2048);
    run->mask.resize(2048);
    std::memcpy(run->mask.data(), out[1].bytes.data(), 2048);
    ASSERT_OK_AND_ASSIGN(HostTensor after, exe->ReadPersistent(mem.p(), "X"));
    run->x_after.assign(after.floats(), after.floats() + 2048);
  }
  if (iterations > 1) {
    ASSERT_OK_AND_ASSIGN(auto out, RunHost(*exe, mem, {r}));
    std::vector<uint8_t> later(2048);
    std::memcpy(later.data(), out[1].bytes.data(), 2048);
    EXPECT_NE(later, run->mask) << "each iteration draws a new mask";
  }
}

TEST(DropoutTrainingTest, SameSeedSameMaskOtherSeedOtherMask) {
  DropoutRun a, b, c;
  RunDropout(7, 2, &a);
  RunDropout(7, 1, &b);
  RunDropout(8, 1, &c);
  EXPECT_EQ(a.mask, b.mask);
  EXPECT_EQ(a.y, b.y);
  EXPECT_NE(a.mask, c.mask);
  // The mask is element_math.h's hash of (seed, node, iteration, element), which any device
  // computes alike: the first Dropout node is stream 0, the first iteration 0.
  const uint64_t key = DropoutKey(7, 0, 0);
  for (uint64_t e = 0; e < a.mask.size(); ++e) {
    ASSERT_EQ(a.mask[e] != 0, DropoutKeeps(key, e, kRatio)) << e;
  }
}

TEST(DropoutTrainingTest, DropsTheRatioAndScalesAndDifferentiates) {
  DropoutRun run;
  RunDropout(0, 1, &run);
  const std::vector<float> x = RandomFloats(2048, 21, 0.5f, 1.5f);
  const std::vector<float> r = RandomFloats(2048, 22);
  int dropped = 0;
  for (int e = 0; e < 2048; ++e) {
    const float keep = run.mask[e] ? 1.f / (1.f - kRatio) : 0.f;
    dropped += run.mask[e] ? 0 : 1;
    EXPECT_FLOAT_EQ(run.y[e], x[e] * keep) << e;
    // dL/dX = R * mask / (1 - ratio); SGD with learning rate 1 subtracts it.
    EXPECT_NEAR(run.x_after[e], x[e] - r[e] * keep, 1e-6) << e;
  }
  // 2048 draws: the standard deviation of the fraction is about 0.01.
  EXPECT_NEAR(dropped / 2048.0, kRatio, 0.04);
}

TEST(DropoutTrainingTest, InferenceIsIdentity) {
  CompileOptions o;
  o.fetches = {"y"};
  ASSERT_OK_AND_ASSIGN(auto exe, Executable::Compile(DropoutModel(), o));
  Memory mem(*exe);
  const HostTensor r = HostTensor::FromFloats(kDropShape, RandomFloats(2048, 22));
  const std::vector<HostTensor> feeds(exe->inputs().size(), r);
  ASSERT_OK_AND_ASSIGN(auto out, RunHost(*exe, mem, feeds));
  const std::vector<float> x = RandomFloats(2048, 21, 0.5f, 1.5f);
  for (int e = 0; e < 2048; ++e) EXPECT_EQ(out[0].floats()[e], x[e]);
}

// ---------------------------------------------------------------------------------------------
// Optimizers: two steps of loss = sum(p * g) (gradient g) against torch.optim's formulas.

std::vector<float> Steps(const OptimizerOptions& opt, const std::vector<float>& p0,
                         const std::vector<float>& g, int steps) {
  ModelBuilder mb;
  mb.Initializer("p", {3}, p0);
  mb.Input("G", {3});
  mb.Node("Mul", {"p", "G"}, {"t"});
  auto& sum = mb.Node("ReduceSum", {"t"}, {"loss"});
  ModelBuilder::Attr(sum, "keepdims", int64_t{0});
  mb.Output("loss", {});
  CompileOptions o = Training();
  o.optimizer = opt;
  auto exe = Executable::Compile(mb.Bytes(), o);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  Memory mem(**exe);
  for (int i = 0; i < steps; ++i) {
    auto out = RunHost(**exe, mem, {HostTensor::FromFloats({3}, g)});
    EXPECT_TRUE(out.ok()) << out.status();
  }
  auto p = (*exe)->ReadPersistent(mem.p(), "p");
  EXPECT_TRUE(p.ok());
  if (!p.ok()) return {};
  return std::vector<float>(p->floats(), p->floats() + 3);
}

const std::vector<float> kP0 = {0.5f, -1.f, 2.f}, kGrad = {0.1f, -0.3f, 0.02f};

TEST(OptimizerTest, AdamWDecaysTheParameterItself) {
  OptimizerOptions opt;
  opt.kind = OptimizerOptions::Kind::kAdamW;
  opt.learning_rate = 0.1f;
  opt.weight_decay = 0.05f;
  const std::vector<float> got = Steps(opt, kP0, kGrad, 2);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    double p = kP0[i], m = 0, v = 0;
    for (int t = 1; t <= 2; ++t) {
      p *= 1 - 0.1 * 0.05;
      m = 0.9 * m + 0.1 * kGrad[i];
      v = 0.999 * v + 0.001 * kGrad[i] * kGrad[i];
      const double mh = m / (1 - std::pow(0.9, t)), vh = v / (1 - std::pow(0.999, t));
      p -= 0.1 * mh / (std::sqrt(vh) + 1e-8);
    }
    EXPECT_NEAR(got[i], p, 1e-5) << i;
  }
}

TEST(OptimizerTest, AdamWeightDecayIsL2) {
  OptimizerOptions opt;
  opt.kind = OptimizerOptions::Kind::kAdam;
  opt.learning_rate = 0.1f;
  opt.weight_decay = 0.05f;
  const std::vector<float> got = Steps(opt, kP0, kGrad, 2);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    double p = kP0[i], m = 0, v = 0;
    for (int t = 1; t <= 2; ++t) {
      const double d = kGrad[i] + 0.05 * p;
      m = 0.9 * m + 0.1 * d;
      v = 0.999 * v + 0.001 * d * d;
      const double mh = m / (1 - std::pow(0.9, t)), vh = v / (1 - std::pow(0.999, t));
      p -= 0.1 * mh / (std::sqrt(vh) + 1e-8);
    }
    EXPECT_NEAR(got[i], p, 1e-5) << i;
  }
}

TEST(OptimizerTest, SgdWeightDecayWithNesterovMomentum) {
  OptimizerOptions opt;
  opt.kind = OptimizerOptions::Kind::kSgd;
  opt.learning_rate = 0.1f;
  opt.momentum = 0.9f;
  opt.nesterov = true;
  opt.weight_decay = 0.05f;
  const std::vector<float> got = Steps(opt, kP0, kGrad, 2);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    // torch.optim.SGD: d = g + wd p; buf = d on the first step, mom buf + d after;
    // nesterov: d += mom buf; p -= lr d.
    double p = kP0[i], buf = 0;
    for (int t = 1; t <= 2; ++t) {
      double d = kGrad[i] + 0.05 * p;
      buf = t == 1 ? d : 0.9 * buf + d;
      d += 0.9 * buf;
      p -= 0.1 * d;
    }
    EXPECT_NEAR(got[i], p, 1e-6) << i;
  }
}

}  // namespace
}  // namespace salus::exec
