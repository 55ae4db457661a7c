// The sequence-model rewrites of exec/fusion_seq.cc: each gives the outputs of the graph it
// replaces (the same model compiled with CompileOptions::fuse off), for inference and for
// training, and a fetched intermediate is never fused away.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "exec/fusion.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

constexpr float kTolerance = 1e-5f;  // relative; Gelu's erf against the chain's Erf
constexpr int64_t kRows = 4, kCols = 16;

// x[4,16] -> MatMul(w) -> h -> the exporter's erf-GELU -> y -> ReduceMean -> loss.
// `half_first`: (h * 0.5) * (erf + 1) with the operands swapped and h * (1 / sqrt 2);
// otherwise (h * (erf + 1)) * 0.5 with h / sqrt 2.
// A scalar Constant node (a constant in training compiles too, unlike an initializer).
void Scalar(ModelBuilder& mb, const std::string& name, float v) {
  auto* a = mb.Node("Constant", {}, {name}).add_attribute();
  a->set_name("value_float");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}

std::string GeluModel(bool half_first) {
  ModelBuilder mb;
  mb.Input("x", {kRows, kCols});
  mb.Initializer("w", {kCols, kCols}, RandomFloats(kCols * kCols, 3, -2.f, 2.f));
  Scalar(mb, "one", 1.f);
  Scalar(mb, "half", 0.5f);
  mb.Node("MatMul", {"x", "w"}, {"h"});
  if (half_first) {
    Scalar(mb, "rsqrt2", static_cast<float>(std::sqrt(0.5)));
    mb.Node("Mul", {"rsqrt2", "h"}, {"s"});
    mb.Node("Erf", {"s"}, {"e"});
    mb.Node("Add", {"one", "e"}, {"a"});
    mb.Node("Mul", {"half", "h"}, {"hh"});
    mb.Node("Mul", {"a", "hh"}, {"y"});
  } else {
    Scalar(mb, "sqrt2", static_cast<float>(std::sqrt(2.0)));
    mb.Node("Div", {"h", "sqrt2"}, {"s"});
    mb.Node("Erf", {"s"}, {"e"});
    mb.Node("Add", {"e", "one"}, {"a"});
    mb.Node("Mul", {"h", "a"}, {"m"});
    mb.Node("Mul", {"m", "half"}, {"y"});
  }
  auto& mean = mb.Node("ReduceMean", {"y"}, {"loss"});
  ModelBuilder::Attr(mean, "keepdims", int64_t{0});
  mb.Output("y", {kRows, kCols});
  mb.Output("loss", {});
  return mb.Bytes();
}

HostTensor Input() {
  HostTensor x(DataType::kFloat32, {kRows, kCols});
  const std::vector<float> v = RandomFloats(kRows * kCols, 7);
  std::memcpy(x.bytes.data(), v.data(), v.size() * sizeof(float));
  return x;
}

struct Result {
  size_t steps = 0;
  std::vector<std::vector<float>> fetches;  // per iteration, all fetches concatenated
};

Result CompileAndRun(const std::string& model, CompileOptions o, bool fuse, int iterations) {
  o.fuse = fuse;
  Result r;
  auto exe = Executable::Compile(model, o);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return r;
  r.steps = (*exe)->num_steps();
  Memory m(**exe);
  for (int i = 0; i < iterations; ++i) {
    auto out = RunHost(**exe, m, {Input()});
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return r;
    std::vector<float> all;
    for (const HostTensor& t : *out) {
      all.insert(all.end(), t.floats(), t.floats() + t.num_elements());
    }
    r.fetches.push_back(std::move(all));
  }
  return r;
}

// Fused against unfused: the same fetches every iteration; returns both step counts.
std::pair<size_t, size_t> ExpectSame(const std::string& model, const CompileOptions& o,
                                     int iterations) {
  const Result fused = CompileAndRun(model, o, true, iterations);
  const Result plain = CompileAndRun(model, o, false, iterations);
  EXPECT_EQ(fused.fetches.size(), plain.fetches.size());
  for (size_t i = 0; i < fused.fetches.size() && i < plain.fetches.size(); ++i) {
    EXPECT_EQ(fused.fetches[i].size(), plain.fetches[i].size());
    for (size_t j = 0; j < plain.fetches[i].size() && j < fused.fetches[i].size(); ++j) {
      const float w = plain.fetches[i][j];
      EXPECT_NEAR(fused.fetches[i][j], w, kTolerance * std::max(1.f, std::abs(w)))
          << "iteration " << i << " element " << j;
    }
  }
  return {fused.steps, plain.steps};
}

// How many Gelu nodes the fused compile of `model` has (the elementwise chains around a GELU
// that is not formed still fuse, Note [Fused elementwise chains], so step counts do not say).
int Gelus(const std::string& model, CompileOptions o) {
  o.fuse = true;
  auto exe = Executable::Compile(model, o);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return -1;
  int n = 0;
  for (const Node& node : (*exe)->graph().nodes()) n += node.op == "Gelu";
  return n;
}

TEST(FusionSeqTest, GeluInferenceBothOrders) {
  for (bool half_first : {false, true}) {
    SCOPED_TRACE(half_first ? "(h * 0.5) * (erf + 1)" : "(h * (erf + 1)) * 0.5");
    CompileOptions o;
    const auto [fused, plain] = ExpectSame(GeluModel(half_first), o, 1);
    EXPECT_EQ(fused + 4, plain);  // Div, Erf, Add and a Mul gone; the last Mul became Gelu
  }
}

TEST(FusionSeqTest, GeluTrainingMatchesUnfused) {
  for (bool half_first : {false, true}) {
    SCOPED_TRACE(half_first ? "(h * 0.5) * (erf + 1)" : "(h * (erf + 1)) * 0.5");
    CompileOptions o;
    o.mode = Mode::kTraining;
    o.loss = "loss";
    o.optimizer.learning_rate = 0.5f;
    // The loss after each of three SGD steps follows w's updates, so it checks the gradient.
    const auto [fused, plain] = ExpectSame(GeluModel(half_first), o, 3);
    EXPECT_LT(fused, plain);
  }
}

TEST(FusionSeqTest, FetchedIntermediateIsKept) {
  CompileOptions o;
  o.fetches = {"y", "e"};
  ExpectSame(GeluModel(false), o, 1);
  EXPECT_EQ(Gelus(GeluModel(false), o), 0);
}

TEST(FusionSeqTest, OtherConstantsAreNotGelu) {
  // A chain whose scale is not 1 / sqrt 2 stays as it is.
  ModelBuilder mb;
  mb.Input("x", {kRows, kCols});
  mb.Initializer("two", {}, {2.f});
  Scalar(mb, "one", 1.f);
  Scalar(mb, "half", 0.5f);
  mb.Node("Div", {"x", "two"}, {"s"});
  mb.Node("Erf", {"s"}, {"e"});
  mb.Node("Add", {"e", "one"}, {"a"});
  mb.Node("Mul", {"x", "a"}, {"m"});
  mb.Node("Mul", {"m", "half"}, {"y"});
  mb.Output("y", {kRows, kCols});
  CompileOptions o;
  ExpectSame(mb.Bytes(), o, 1);
  EXPECT_EQ(Gelus(mb.Bytes(), o), 0);
}

}  // namespace
}  // namespace salus::exec
