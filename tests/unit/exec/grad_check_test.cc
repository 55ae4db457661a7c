// Gradient checks: for every backward kernel, the gradient the engine derives (autodiff plus
// the backward kernels, read back through one SGD step with learning rate 1) against central
// finite differences of L = sum(R * y) accumulated in float64 from the engine's forward
// outputs. Each case is one op with its inputs as trainable parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

struct Param {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

struct Case {
  std::string label;
  std::vector<Param> params;
  Shape y_shape;
  std::function<void(ModelBuilder&)> build;  // nodes computing "y" from the params
  std::vector<std::pair<std::string, HostTensor>> inputs = {};  // fed, not differentiated
};

Param P(const std::string& name, Shape shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::vector<float> v = RandomFloats(NumElements(shape), seed, lo, hi);
  return {name, shape, v};
}

// Values kept away from 0 (the kink of Relu, Abs and friends).
Param AwayFromZero(const std::string& name, Shape shape, uint32_t seed) {
  Param p = P(name, shape, seed);
  for (float& x : p.values) x = x < 0 ? x - 0.1f : x + 0.1f;
  return p;
}

std::vector<HostTensor> Feeds(const Executable& exe,
                              const std::vector<std::pair<std::string, HostTensor>>& named) {
  std::vector<HostTensor> feeds;
  for (const TensorInfo& info : exe.inputs()) {
    for (const auto& [name, t] : named) {
      if (name == info.name) feeds.push_back(t);
    }
  }
  return feeds;
}

void CheckGradients(const Case& c) {
  SCOPED_TRACE(c.label);
  ModelBuilder mb;
  for (const Param& p : c.params) mb.Initializer(p.name, p.shape, p.values);
  for (const auto& [name, t] : c.inputs) {
    mb.Input(name, t.shape,
             t.type == DataType::kInt64 ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT);
  }
  mb.Input("R", c.y_shape);
  c.build(mb);
  mb.Node("Mul", {"y", "R"}, {"t"});
  auto& sum = mb.Node("ReduceSum", {"t"}, {"loss"});
  ModelBuilder::Attr(sum, "keepdims", int64_t{0});
  mb.Output("loss", {}).Output("y", c.y_shape);
  const std::string bytes = mb.Bytes();

  HostTensor r = HostTensor::FromFloats(c.y_shape, RandomFloats(NumElements(c.y_shape), 99));
  auto named = c.inputs;
  named.emplace_back("R", r);

  CompileOptions train;
  train.mode = Mode::kTraining;
  train.loss = "loss";
  train.optimizer.learning_rate = 1.f;
  auto exe = Executable::Compile(bytes, train);
  ASSERT_TRUE(exe.ok()) << exe.status();
  Memory mem(**exe);
  ASSERT_TRUE(RunHost(**exe, mem, Feeds(**exe, named)).ok());

  CompileOptions probe = train;
  probe.optimizer.learning_rate = 0.f;
  probe.fetches = {"y"};
  auto fwd = Executable::Compile(bytes, probe);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  Memory fmem(**fwd);
  auto loss_at = [&]() {
    auto out = RunHost(**fwd, fmem, Feeds(**fwd, named));
    EXPECT_TRUE(out.ok());
    double l = 0;
    for (int64_t i = 0; i < NumElements(c.y_shape); ++i) {
      l += static_cast<double>(r.floats()[i]) * (*out)[0].floats()[i];
    }
    return l;
  };
  constexpr float kEps = 1e-3f;
  for (const Param& p : c.params) {
    auto after = (*exe)->ReadPersistent(mem.p(), p.name);
    ASSERT_TRUE(after.ok());
    const int64_t n = NumElements(p.shape);
    const int64_t stride = std::max<int64_t>(1, n / 16);
    for (int64_t i = 0; i < n; i += stride) {
      const double analytic = static_cast<double>(p.values[i]) - after->floats()[i];
      HostTensor t = HostTensor::FromFloats(p.shape, p.values);
      t.floats()[i] = p.values[i] + kEps;
      ASSERT_TRUE((*fwd)->WritePersistent(fmem.p(), p.name, t).ok());
      const double up = loss_at();
      t.floats()[i] = p.values[i] - kEps;
      ASSERT_TRUE((*fwd)->WritePersistent(fmem.p(), p.name, t).ok());
      const double down = loss_at();
      t.floats()[i] = p.values[i];
      ASSERT_TRUE((*fwd)->WritePersistent(fmem.p(), p.name, t).ok());
      const double numeric = (up - down) / (2.0 * kEps);
      EXPECT_NEAR(analytic, numeric, 3e-3 + 2e-2 * std::abs(numeric)) << p.name << "[" << i << "]";
    }
  }
}

Case Unary(const std::string& op, Param x, std::function<void(onnx::NodeProto&)> attrs = {}) {
  Shape s = x.shape;
  return {op, {std::move(x)}, s, [op, attrs](ModelBuilder& mb) {
            auto& n = mb.Node(op, {"X"}, {"y"});
            if (attrs) attrs(n);
          }};
}

TEST(GradCheckTest, Eltwise) {
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Softplus", "Neg"}) {
    CheckGradients(Unary(op, AwayFromZero("X", {3, 4}, 1)));
  }
  CheckGradients(Unary("LeakyRelu", AwayFromZero("X", {3, 4}, 2),
                       [](onnx::NodeProto& n) { ModelBuilder::Attr(n, "alpha", 0.1f); }));
  CheckGradients(Unary("Elu", AwayFromZero("X", {3, 4}, 3),
                       [](onnx::NodeProto& n) { ModelBuilder::Attr(n, "alpha", 0.7f); }));
  // Note [Composed ops]: Clip chains; inputs over both bounds and between them.
  CheckGradients(Unary("HardSwish", P("X", {3, 4}, 7, -5.f, 5.f)));
  CheckGradients(Unary("HardSigmoid", P("X", {3, 4}, 8, -4.f, 4.f), [](onnx::NodeProto& n) {
    ModelBuilder::Attr(n, "alpha", 0.3f);
    ModelBuilder::Attr(n, "beta", 0.4f);
  }));
  CheckGradients(Unary("Log", P("X", {3, 4}, 4, 0.5f, 2.f)));
  CheckGradients(Unary("Sqrt", P("X", {3, 4}, 5, 0.5f, 2.f)));
}

TEST(GradCheckTest, Softmax) {
  CheckGradients(Unary("Softmax", P("X", {3, 5}, 6),
                       [](onnx::NodeProto& n) { ModelBuilder::Attr(n, "axis", int64_t{1}); }));
  CheckGradients(Unary("LogSoftmax", P("X", {2, 3, 4}, 7)));
}

TEST(GradCheckTest, Conv) {
  CheckGradients({"conv grouped strided padded with bias",
                  {P("X", {2, 4, 6, 6}, 8), P("W", {6, 2, 3, 3}, 9), P("B", {6}, 10)},
                  {2, 6, 3, 3},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Conv", {"X", "W", "B"}, {"y"});
                    ModelBuilder::Attr(n, "group", int64_t{2});
                    ModelBuilder::Attr(n, "strides", std::vector<int64_t>{2, 2});
                    ModelBuilder::Attr(n, "pads", std::vector<int64_t>{1, 1, 1, 1});
                  }});
  CheckGradients({"conv without bias",
                  {P("X", {1, 2, 7, 7}, 11), P("W", {3, 2, 3, 3}, 12)},
                  {1, 3, 5, 5},
                  [](ModelBuilder& mb) {
                    mb.Node("Conv", {"X", "W"}, {"y"});
                  }});
  CheckGradients({"conv dilated without bias",
                  {P("X", {1, 2, 7, 7}, 11), P("W", {3, 2, 3, 3}, 12)},
                  {1, 3, 3, 3},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Conv", {"X", "W"}, {"y"});
                    ModelBuilder::Attr(n, "dilations", std::vector<int64_t>{2, 2});
                  }});
  CheckGradients({"3-d conv grouped strided padded dilated with bias",
                  {P("X", {1, 4, 4, 5, 5}, 13), P("W", {4, 2, 2, 3, 3}, 14), P("B", {4}, 15)},
                  {1, 4, 3, 3, 3},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Conv", {"X", "W", "B"}, {"y"});
                    ModelBuilder::Attr(n, "group", int64_t{2});
                    ModelBuilder::Attr(n, "strides", std::vector<int64_t>{2, 2, 1});
                    ModelBuilder::Attr(n, "pads", std::vector<int64_t>{1, 1, 1, 1, 1, 1});
                    ModelBuilder::Attr(n, "dilations", std::vector<int64_t>{1, 1, 2});
                  }});
}

TEST(GradCheckTest, Pooling) {
  CheckGradients({"maxpool", {P("X", {1, 2, 4, 4}, 13)}, {1, 2, 2, 2}, [](ModelBuilder& mb) {
                    auto& n = mb.Node("MaxPool", {"X"}, {"y"});
                    ModelBuilder::Attr(n, "kernel_shape", std::vector<int64_t>{2, 2});
                    ModelBuilder::Attr(n, "strides", std::vector<int64_t>{2, 2});
                  }});
  CheckGradients(
      {"averagepool padded", {P("X", {1, 2, 4, 4}, 14)}, {1, 2, 4, 4}, [](ModelBuilder& mb) {
         auto& n = mb.Node("AveragePool", {"X"}, {"y"});
         ModelBuilder::Attr(n, "kernel_shape", std::vector<int64_t>{3, 3});
         ModelBuilder::Attr(n, "pads", std::vector<int64_t>{1, 1, 1, 1});
       }});
  CheckGradients(
      {"globalaveragepool", {P("X", {2, 3, 3, 2}, 15)}, {2, 3, 1, 1}, [](ModelBuilder& mb) {
         mb.Node("GlobalAveragePool", {"X"}, {"y"});
       }});
}

TEST(GradCheckTest, BinaryWithBroadcasting) {
  auto binary = [](const std::string& op, Param a, Param b, Shape y) {
    return Case{op, {std::move(a), std::move(b)}, y, [op](ModelBuilder& mb) {
                  mb.Node(op, {"A", "B"}, {"y"});
                }};
  };
  CheckGradients(binary("Add", P("A", {3, 4}, 16), P("B", {4}, 17), {3, 4}));
  CheckGradients(binary("Sub", P("A", {3, 1}, 18), P("B", {3, 4}, 19), {3, 4}));
  CheckGradients(binary("Mul", P("A", {2, 3}, 20), P("B", {3}, 21), {2, 3}));
  CheckGradients(binary("Div", P("A", {2, 3}, 22), P("B", {3}, 23, 0.5f, 2.f), {2, 3}));
}

// A value reaching the loss along several paths: its gradients are summed.
TEST(GradCheckTest, GradientsOfSeveralPathsAreSummed) {
  CheckGradients({"x * x + relu(x)", {AwayFromZero("X", {3, 4}, 40)}, {3, 4}, [](ModelBuilder& mb) {
                    mb.Node("Mul", {"X", "X"}, {"sq"});
                    mb.Node("Relu", {"X"}, {"r"});
                    mb.Node("Add", {"sq", "r"}, {"y"});
                  }});
}

TEST(GradCheckTest, GemmAndMatMul) {
  CheckGradients({"gemm transB with vector C",
                  {P("A", {3, 4}, 24), P("B", {5, 4}, 25), P("C", {5}, 26)},
                  {3, 5},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Gemm", {"A", "B", "C"}, {"y"});
                    ModelBuilder::Attr(n, "transB", int64_t{1});
                    ModelBuilder::Attr(n, "alpha", 0.5f);
                    ModelBuilder::Attr(n, "beta", 2.f);
                  }});
  CheckGradients({"gemm transA with full C",
                  {P("A", {4, 3}, 27), P("B", {4, 5}, 28), P("C", {3, 5}, 29)},
                  {3, 5},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Gemm", {"A", "B", "C"}, {"y"});
                    ModelBuilder::Attr(n, "transA", int64_t{1});
                  }});
  CheckGradients({"matmul", {P("A", {3, 4}, 30), P("B", {4, 2}, 31)}, {3, 2}, [](ModelBuilder& mb) {
                    mb.Node("MatMul", {"A", "B"}, {"y"});
                  }});
}

TEST(GradCheckTest, ReductionsAndLayout) {
  CheckGradients({"reducemean", {P("X", {2, 3, 4}, 32)}, {2, 4}, [](ModelBuilder& mb) {
                    auto& n = mb.Node("ReduceMean", {"X"}, {"y"});
                    ModelBuilder::Attr(n, "axes", std::vector<int64_t>{1});
                    ModelBuilder::Attr(n, "keepdims", int64_t{0});
                  }});
  CheckGradients({"reducesum", {P("X", {2, 3, 4}, 33)}, {1, 3, 1}, [](ModelBuilder& mb) {
                    mb.Int64Initializer("axes", {2}, {0, -1});
                    mb.Node("ReduceSum", {"X", "axes"}, {"y"});
                  }});
  // Swin V2's cosine attention normalises with ReduceL2.
  CheckGradients({"reducel2", {P("X", {2, 3, 4}, 37)}, {2, 1, 4}, [](ModelBuilder& mb) {
                    auto& n = mb.Node("ReduceL2", {"X"}, {"y"});
                    ModelBuilder::Attr(n, "axes", std::vector<int64_t>{1});
                  }});
  CheckGradients({"reducesumsquare", {P("X", {2, 3, 4}, 38)}, {2, 3}, [](ModelBuilder& mb) {
                    auto& n = mb.Node("ReduceSumSquare", {"X"}, {"y"});
                    ModelBuilder::Attr(n, "axes", std::vector<int64_t>{-1});
                    ModelBuilder::Attr(n, "keepdims", int64_t{0});
                  }});
  for (const char* mode : {"DCR", "CRD"}) {
    CheckGradients({std::string("depthtospace ") + mode,
                    {P("X", {1, 8, 2, 3}, 34)},
                    {1, 2, 4, 6},
                    [mode](ModelBuilder& mb) {
                      auto& n = mb.Node("DepthToSpace", {"X"}, {"y"});
                      ModelBuilder::Attr(n, "blocksize", int64_t{2});
                      ModelBuilder::Attr(n, "mode", std::string(mode));
                    }});
  }
  CheckGradients({"transpose", {P("X", {2, 3, 4}, 35)}, {4, 2, 3}, [](ModelBuilder& mb) {
                    auto& n = mb.Node("Transpose", {"X"}, {"y"});
                    ModelBuilder::Attr(n, "perm", std::vector<int64_t>{2, 0, 1});
                  }});
  CheckGradients({"flatten then reshape", {P("X", {2, 3, 4}, 36)}, {4, 6}, [](ModelBuilder& mb) {
                    auto& f = mb.Node("Flatten", {"X"}, {"f"});
                    ModelBuilder::Attr(f, "axis", int64_t{2});
                    mb.Int64Initializer("shape", {2}, {4, -1});
                    mb.Node("Reshape", {"f", "shape"}, {"y"});
                  }});
}

TEST(GradCheckTest, SoftmaxCrossEntropyLoss) {
  HostTensor labels = HostTensor::FromInt64s({4}, {1, 0, 4, 2});
  CheckGradients({"sce mean",
                  {P("X", {4, 5}, 37)},
                  {},
                  [](ModelBuilder& mb) {
                    mb.Node("SoftmaxCrossEntropyLoss", {"X", "L"}, {"y"});
                  },
                  {{"L", labels}}});
  HostTensor weights = HostTensor::FromFloats({5}, {0.5f, 1.f, 2.f, 1.5f, 0.2f});
  CheckGradients(
      {"sce weighted sum with ignore_index, 3-D",
       {P("X", {4, 5, 2}, 38)},
       {},
       [](ModelBuilder& mb) {
         auto& n = mb.Node("SoftmaxCrossEntropyLoss", {"X", "L", "Wt"}, {"y"});
         ModelBuilder::Attr(n, "reduction", std::string("sum"));
         ModelBuilder::Attr(n, "ignore_index", int64_t{2});
       },
       {{"L", HostTensor::FromInt64s({4, 2}, {1, 0, 4, 2, 2, 3, 0, 1})}, {"Wt", weights}}});
}

// Gradients of the tensor and index ops of exported models.
TEST(GradCheckTest, GatherSliceConcatSplit) {
  // An embedding lookup with repeated and negative indices: the rows' gradients add up.
  CheckGradients({"gather embedding",
                  {P("X", {5, 3}, 50)},
                  {2, 3, 3},
                  [](ModelBuilder& mb) {
                    mb.Node("Gather", {"X", "I"}, {"y"});
                  },
                  {{"I", HostTensor::FromInt64s({2, 3}, {0, 4, 0, -1, 2, 0})}}});
  CheckGradients({"gather axis 1 with constant indices",
                  {P("X", {2, 4, 3}, 51)},
                  {2, 3, 3},
                  [](ModelBuilder& mb) {
                    mb.Int64Initializer("I", {3}, {1, 3, 1});
                    auto& n = mb.Node("Gather", {"X", "I"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{1});
                  }});
  CheckGradients({"slice with negative and strided steps",
                  {P("X", {4, 5, 6}, 52)},
                  {2, 2, 3},
                  [](ModelBuilder& mb) {
                    mb.Int64Initializer("starts", {3}, {1, 4, 0});
                    mb.Int64Initializer("ends", {3}, {3, 0, 6});
                    mb.Int64Initializer("axes", {3}, {0, 1, 2});
                    mb.Int64Initializer("steps", {3}, {1, -2, 2});
                    mb.Node("Slice", {"X", "starts", "ends", "axes", "steps"}, {"y"});
                  }});
  CheckGradients(
      {"slice of the last axis to the end", {P("X", {3, 4}, 53)}, {3, 3}, [](ModelBuilder& mb) {
         mb.Int64Initializer("starts", {1}, {1});
         mb.Int64Initializer("ends", {1}, {INT64_MAX});
         mb.Int64Initializer("axes", {1}, {-1});
         mb.Node("Slice", {"X", "starts", "ends", "axes"}, {"y"});
       }});
  CheckGradients({"pad", {P("X", {2, 3, 4}, 49)}, {2, 5, 7}, [](ModelBuilder& mb) {
                    mb.Int64Initializer("pads", {6}, {0, 1, 2, 0, 1, 1});
                    mb.Node("Pad", {"X", "pads"}, {"y"});
                  }});
  CheckGradients({"concat along the last axis",
                  {P("A", {2, 3}, 54), P("B", {2, 1}, 55), P("C", {2, 2}, 56)},
                  {2, 6},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Concat", {"A", "B", "C"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{-1});
                  }});
  CheckGradients({"concat along axis 1 of 3-D",
                  {P("A", {2, 1, 3}, 57), P("B", {2, 2, 3}, 58)},
                  {2, 3, 3},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Concat", {"A", "B"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{1});
                  }});
  // Output 1 carries no gradient: zeros take its place.
  CheckGradients(
      {"split with an unused output", {P("X", {2, 6}, 59)}, {2, 4}, [](ModelBuilder& mb) {
         mb.Int64Initializer("split", {3}, {1, 2, 3});
         auto& s = mb.Node("Split", {"X", "split"}, {"a", "b", "c"});
         ModelBuilder::Attr(s, "axis", int64_t{1});
         auto& n = mb.Node("Concat", {"c", "a"}, {"y"});
         ModelBuilder::Attr(n, "axis", int64_t{1});
       }});
  // Output 0 carries no gradient: the node is still differentiated.
  CheckGradients(
      {"split with only later outputs used", {P("X", {3, 6}, 60)}, {3, 2}, [](ModelBuilder& mb) {
         auto& s = mb.Node("Split", {"X"}, {"a", "b", "c"});
         ModelBuilder::Attr(s, "axis", int64_t{1});
         mb.Node("Mul", {"b", "c"}, {"y"});
       }});
}

TEST(GradCheckTest, BroadcastingTensorOps) {
  CheckGradients({"expand", {P("X", {3, 1}, 61)}, {2, 3, 4}, [](ModelBuilder& mb) {
                    mb.Int64Initializer("shape", {3}, {2, 1, 4});
                    mb.Node("Expand", {"X", "shape"}, {"y"});
                  }});
  // The condition comes from a fed input; X broadcasts, Y is a trainable scalar.
  CheckGradients({"where",
                  {P("X", {4}, 62), P("Y", {}, 63)},
                  {3, 4},
                  [](ModelBuilder& mb) {
                    mb.Initializer("zero", {}, {0.f});
                    mb.Node("Greater", {"C", "zero"}, {"cond"});
                    mb.Node("Where", {"cond", "X", "Y"}, {"y"});
                  },
                  {{"C", HostTensor::FromFloats({3, 4}, RandomFloats(12, 64))}}});
  CheckGradients({"max of three with broadcasting",
                  {P("A", {3, 4}, 65), P("B", {4}, 66), P("C", {3, 1}, 67)},
                  {3, 4},
                  [](ModelBuilder& mb) {
                    mb.Node("Max", {"A", "B", "C"}, {"y"});
                  }});
  CheckGradients(
      {"min of two", {P("A", {2, 3}, 68), P("B", {2, 3}, 69)}, {2, 3}, [](ModelBuilder& mb) {
         mb.Node("Min", {"A", "B"}, {"y"});
       }});
  CheckGradients({"min of one", {P("A", {2, 3}, 70)}, {2, 3}, [](ModelBuilder& mb) {
                    mb.Node("Min", {"A"}, {"y"});
                  }});
  CheckGradients({"pow with a broadcast exponent",
                  {P("X", {3, 4}, 71, 0.5f, 2.f), P("E", {4}, 72, 0.5f, 2.5f)},
                  {3, 4},
                  [](ModelBuilder& mb) {
                    mb.Node("Pow", {"X", "E"}, {"y"});
                  }});
  CheckGradients({"pow with a trainable scalar exponent",
                  {P("X", {3, 4}, 73, 0.2f, 1.5f), P("E", {}, 74, 2.f, 2.f)},
                  {3, 4},
                  [](ModelBuilder& mb) {
                    mb.Node("Pow", {"X", "E"}, {"y"});
                  }});
  // A fed (not differentiated) integral exponent over negative bases.
  CheckGradients({"pow of negative bases",
                  {P("X", {3, 4}, 96)},
                  {3, 4},
                  [](ModelBuilder& mb) {
                    mb.Node("Pow", {"X", "E"}, {"y"});
                  },
                  {{"E", HostTensor::FromFloats({}, {3.f})}}});
  // Both bounds trainable: their gradients sum dY where they were taken.
  CheckGradients({"clip with min and max",
                  {P("X", {4, 5}, 75), P("lo", {}, 76, -0.5f, -0.5f), P("hi", {}, 77, 0.4f, 0.4f)},
                  {4, 5},
                  [](ModelBuilder& mb) {
                    mb.Node("Clip", {"X", "lo", "hi"}, {"y"});
                  }});
  CheckGradients({"clip with max only",
                  {P("X", {4, 5}, 78), P("hi", {}, 79, 0.3f, 0.3f)},
                  {4, 5},
                  [](ModelBuilder& mb) {
                    mb.Node("Clip", {"X", "", "hi"}, {"y"});
                  }});
}

TEST(GradCheckTest, BatchedMatMul) {
  auto matmul = [](const std::string& label, Shape a, Shape b, Shape y, uint32_t seed) {
    return Case{label, {P("A", a, seed), P("B", b, seed + 1)}, y, [](ModelBuilder& mb) {
                  mb.Node("MatMul", {"A", "B"}, {"y"});
                }};
  };
  CheckGradients(matmul("3-D by 2-D", {2, 3, 4}, {4, 5}, {2, 3, 5}, 80));
  CheckGradients(matmul("4-D by 2-D", {2, 2, 3, 4}, {4, 5}, {2, 2, 3, 5}, 98));
  CheckGradients(matmul("2-D by 3-D", {3, 4}, {2, 4, 5}, {2, 3, 5}, 99));
  CheckGradients(matmul("4-D by 3-D broadcast", {2, 1, 3, 4}, {3, 4, 2}, {2, 3, 3, 2}, 82));
  CheckGradients(matmul("1-D by 3-D", {4}, {2, 4, 3}, {2, 3}, 84));
  CheckGradients(matmul("3-D by 1-D", {2, 3, 4}, {4}, {2, 3}, 86));
  CheckGradients(matmul("1-D by 2-D", {4}, {4, 3}, {3}, 88));
  CheckGradients(matmul("1-D by 1-D", {4}, {4}, {}, 90));
}

TEST(GradCheckTest, UnaryTensorOps) {
  CheckGradients(Unary("Erf", P("X", {3, 4}, 91, -2.f, 2.f)));
  CheckGradients(Unary("Reciprocal", AwayFromZero("X", {3, 4}, 92)));
  for (const char* approximate : {"none", "tanh"}) {
    Case c = Unary("Gelu", P("X", {3, 4}, 93, -3.f, 3.f), [approximate](onnx::NodeProto& n) {
      ModelBuilder::Attr(n, "approximate", std::string(approximate));
    });
    c.label += std::string(" ") + approximate;
    auto build = c.build;
    c.build = [build](ModelBuilder& mb) {
      mb.proto().mutable_opset_import(0)->set_version(20);
      build(mb);
    };
    CheckGradients(c);
  }
  CheckGradients(Unary("Trilu", P("X", {2, 3, 4}, 97),
                       [](onnx::NodeProto& n) { ModelBuilder::Attr(n, "upper", int64_t{0}); }));
  CheckGradients({"trilu with k", {P("X", {3, 4}, 98)}, {3, 4}, [](ModelBuilder& mb) {
                    mb.Int64Initializer("k", {}, {1});
                    mb.Node("Trilu", {"X", "k"}, {"y"});
                  }});
  // Float to float is the identity.
  CheckGradients(Unary("Cast", P("X", {3, 4}, 94), [](onnx::NodeProto& n) {
    ModelBuilder::Attr(n, "to", int64_t{onnx::TensorProto::FLOAT});
  }));
  // A mask from a comparison carries no gradient.
  CheckGradients({"x * cast(x > 0)", {AwayFromZero("X", {3, 4}, 99)}, {3, 4}, [](ModelBuilder& mb) {
                    mb.Initializer("zero", {}, {0.f});
                    mb.Node("Greater", {"X", "zero"}, {"pos"});
                    auto& c = mb.Node("Cast", {"pos"}, {"mask"});
                    ModelBuilder::Attr(c, "to", int64_t{onnx::TensorProto::FLOAT});
                    mb.Node("Mul", {"X", "mask"}, {"y"});
                  }});
  // An integer cast stops the gradient of its path; the other path still gets one.
  CheckGradients(
      {"cast through int64", {P("X", {3, 4}, 95, -3.f, 3.f)}, {3, 4}, [](ModelBuilder& mb) {
         auto& c = mb.Node("Cast", {"X"}, {"i"});
         ModelBuilder::Attr(c, "to", int64_t{onnx::TensorProto::INT64});
         auto& f = mb.Node("Cast", {"i"}, {"f"});
         ModelBuilder::Attr(f, "to", int64_t{onnx::TensorProto::FLOAT});
         mb.Node("Mul", {"X", "f"}, {"y"});
       }});
}

TEST(GradCheckTest, Lstm) {
  constexpr int64_t kSeq = 3, kBatch = 2, kIn = 4, kHidden = 3;
  auto params = [&](uint32_t seed) {
    return std::vector<Param>{P("X", {kSeq, kBatch, kIn}, seed),
                              P("W", {1, 4 * kHidden, kIn}, seed + 1),
                              P("Rw", {1, 4 * kHidden, kHidden}, seed + 2),
                              P("B", {1, 8 * kHidden}, seed + 3),
                              P("h0", {1, kBatch, kHidden}, seed + 4),
                              P("c0", {1, kBatch, kHidden}, seed + 5)};
  };
  auto lstm = [](ModelBuilder& mb, const std::vector<std::string>& outputs) {
    auto& n = mb.Node("LSTM", {"X", "W", "Rw", "B", "", "h0", "c0"}, outputs);
    ModelBuilder::Attr(n, "hidden_size", kHidden);
  };
  CheckGradients(
      {"lstm through Y", params(100), {kSeq, 1, kBatch, kHidden}, [lstm](ModelBuilder& mb) {
         lstm(mb, {"y"});
       }});
  // Output Y omitted: the gradient comes through Y_h and Y_c only.
  CheckGradients(
      {"lstm through Y_h and Y_c", params(110), {1, kBatch, kHidden}, [lstm](ModelBuilder& mb) {
         lstm(mb, {"", "yh", "yc"});
         mb.Node("Add", {"yh", "yc"}, {"y"});
       }});
}

// Reverse and bidirectional LSTMs in both layouts, without B and initial states.
TEST(GradCheckTest, LstmDirectionsAndLayouts) {
  constexpr int64_t kSeq = 3, kBatch = 2, kIn = 3, kHidden = 2;
  for (const char* direction : {"reverse", "bidirectional"}) {
    for (int64_t layout : {0, 1}) {
      const int64_t dirs = std::string(direction) == "bidirectional" ? 2 : 1;
      const Shape x = layout ? Shape{kBatch, kSeq, kIn} : Shape{kSeq, kBatch, kIn};
      const Shape y =
          layout ? Shape{kBatch, kSeq, dirs, kHidden} : Shape{kSeq, dirs, kBatch, kHidden};
      CheckGradients({std::string("lstm ") + direction + " layout " + std::to_string(layout),
                      {P("X", x, 120), P("W", {dirs, 4 * kHidden, kIn}, 121),
                       P("Rec", {dirs, 4 * kHidden, kHidden}, 122)},
                      y,
                      [direction, layout](ModelBuilder& mb) {
                        auto& n = mb.Node("LSTM", {"X", "W", "Rec"}, {"y"});
                        ModelBuilder::Attr(n, "direction", std::string(direction));
                        ModelBuilder::Attr(n, "layout", layout);
                      }});
    }
  }
}

// y = W * X, loss = sum(y): the gradient of W is X, so the updates can be computed by hand.
class OptimizerTest : public ::testing::Test {
 protected:
  std::vector<float> Train(const OptimizerOptions& opt, int steps) {
    ModelBuilder mb;
    mb.Initializer("W", {3}, w0_).Input("X", {3});
    mb.Node("Mul", {"W", "X"}, {"y"});
    auto& s = mb.Node("ReduceSum", {"y"}, {"loss"});
    ModelBuilder::Attr(s, "keepdims", int64_t{0});
    mb.Output("loss", {});
    CompileOptions o;
    o.mode = Mode::kTraining;
    o.loss = "loss";
    o.optimizer = opt;
    auto exe = Executable::Compile(mb.Bytes(), o);
    EXPECT_TRUE(exe.ok()) << exe.status();
    Memory mem(**exe);
    for (int i = 0; i < steps; ++i)
      EXPECT_TRUE(RunHost(**exe, mem, {HostTensor::FromFloats({3}, x_)}).ok());
    auto w = (*exe)->ReadPersistent(mem.p(), "W");
    return std::vector<float>(w->floats(), w->floats() + 3);
  }
  std::vector<float> w0_ = {1.f, -2.f, 0.5f};
  std::vector<float> x_ = {0.3f, -0.7f, 2.f};
};

TEST_F(OptimizerTest, SgdMomentumNesterovWeightDecay) {
  OptimizerOptions opt;
  opt.learning_rate = 0.1f;
  opt.momentum = 0.9f;
  opt.weight_decay = 0.01f;
  for (bool nesterov : {false, true}) {
    opt.nesterov = nesterov;
    std::vector<float> got = Train(opt, 3);
    for (int i = 0; i < 3; ++i) {
      double w = w0_[i], v = 0;
      for (int s = 0; s < 3; ++s) {
        double d = x_[i] + 0.01 * w;
        v = 0.9 * v + d;
        w -= 0.1 * (nesterov ? d + 0.9 * v : v);
      }
      EXPECT_NEAR(got[i], w, 1e-5) << "nesterov=" << nesterov << " i=" << i;
    }
  }
}

TEST_F(OptimizerTest, Adam) {
  OptimizerOptions opt;
  opt.kind = OptimizerOptions::Kind::kAdam;
  opt.learning_rate = 0.05f;
  std::vector<float> got = Train(opt, 4);
  for (int i = 0; i < 3; ++i) {
    double w = w0_[i], m = 0, v = 0;
    for (int t = 1; t <= 4; ++t) {
      const double g = x_[i];
      m = 0.9 * m + 0.1 * g;
      v = 0.999 * v + 0.001 * g * g;
      w -= 0.05 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
    }
    EXPECT_NEAR(got[i], w, 1e-5) << i;
  }
}

// Normalisation in training: BatchNormalization with the batch's statistics (its running
// statistics are state, not parameters) and LayerNormalization.
TEST(GradCheckTest, BatchNormTraining) {
  for (const Shape& xs : {Shape{4, 3, 2, 2}, Shape{5, 4}}) {
    const int64_t c = xs[1];
    CheckGradients(
        {"BatchNormalization " + ShapeString(xs),
         {P("X", xs, 61), P("scale", {c}, 62, 0.5f, 1.5f), P("B", {c}, 63)},
         xs,
         [c](ModelBuilder& mb) {
           mb.Initializer("rm", {c}, RandomFloats(c, 64));
           mb.Initializer("rv", {c}, RandomFloats(c, 65, 0.5f, 2.f));
           auto& n = mb.Node("BatchNormalization", {"X", "scale", "B", "rm", "rv"}, {"y"});
           ModelBuilder::Attr(n, "epsilon", 1e-3f);
         }});
  }
}

TEST(GradCheckTest, LayerNormalization) {
  // Last axis with B; the last two axes without B; every axis of a 2-D input.
  CheckGradients({"LayerNormalization axis -1",
                  {P("X", {3, 2, 5}, 71), P("scale", {5}, 72, 0.5f, 1.5f), P("B", {5}, 73)},
                  {3, 2, 5},
                  [](ModelBuilder& mb) {
                    mb.Node("LayerNormalization", {"X", "scale", "B"}, {"y"});
                  }});
  CheckGradients({"LayerNormalization axis 1, no B",
                  {P("X", {3, 2, 5}, 74), P("scale", {2, 5}, 75, 0.5f, 1.5f)},
                  {3, 2, 5},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("LayerNormalization", {"X", "scale"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{1});
                    ModelBuilder::Attr(n, "epsilon", 1e-3f);
                  }});
  CheckGradients({"LayerNormalization axis 0",
                  {P("X", {4, 3}, 76), P("scale", {4, 3}, 77, 0.5f, 1.5f), P("B", {4, 3}, 78)},
                  {4, 3},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("LayerNormalization", {"X", "scale", "B"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{0});
                  }});
}

}  // namespace
}  // namespace salus::exec
