// Parity of the CUDA device's basic kernels (src/exec/cuda/basic_kernels.cc) with the CPU, op by
// op and attribute by attribute (cuda_parity.h): the copies (Dropout's mask included), every
// unary op (cuDNN's activations and the hand-written ones, with special values), the binary ops
// over every broadcast pattern, Transpose, Concat (empty inputs, every axis), DepthToSpace in
// both modes, Pad in its opset forms and SoftmaxCrossEntropyLoss with every reduction and
// option; and the configurations the CUDA device refuses. Each case also runs twice on the GPU
// in lanes at different addresses and must be bit-identical. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cuda_parity.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::ExpectCudaParity;
using testing::ModelBuilder;
using testing::ParityOptions;

// A graph output of `rank` unknown dims and the given element type: the engine infers the shape.
void OutputOfRank(ModelBuilder& mb, const std::string& name, size_t rank,
                  int type = onnx::TensorProto::FLOAT) {
  auto* out = mb.proto().mutable_graph()->add_output();
  out->set_name(name);
  auto* t = out->mutable_type()->mutable_tensor_type();
  t->set_elem_type(type);
  auto* shape = t->mutable_shape();
  for (size_t i = 0; i < rank; ++i) shape->add_dim();
}

// That the CUDA device refuses `model` at compile time with Unimplemented naming `what`.
void ExpectCudaRefuses(const std::string& model, const std::string& what) {
  CompileOptions o;
  o.device = Device{DeviceType::kCuda, 0};
  auto gpu = Executable::Compile(model, o);
  ASSERT_FALSE(gpu.ok()) << "compiled";
  EXPECT_EQ(gpu.status().code(), StatusCode::kUnimplemented) << gpu.status();
  EXPECT_NE(gpu.status().message().find(what), std::string::npos) << gpu.status();
}

ParityOptions Range(float lo, float hi) {
  ParityOptions p;
  p.lo = lo;
  p.hi = hi;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Copies.

TEST(CudaBasicKernelsTest, Copies) {
  SALUS_REQUIRE_GPU();
  {
    SCOPED_TRACE("Identity");
    ModelBuilder mb;
    mb.Input("x", {3, 5, 7});
    mb.Node("Identity", {"x"}, {"y"});
    OutputOfRank(mb, "y", 3);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("Identity of int64");
    ModelBuilder mb;
    mb.Input("x", {4, 6}, onnx::TensorProto::INT64);
    mb.Node("Identity", {"x"}, {"y"});
    OutputOfRank(mb, "y", 2, onnx::TensorProto::INT64);
    ParityOptions p;
    p.int_hi = 1000;
    ExpectCudaParity(mb.Bytes(), {}, p);
  }
  for (int64_t axis : {0, 1, 2, -1}) {
    SCOPED_TRACE("Flatten axis " + std::to_string(axis));
    ModelBuilder mb;
    mb.Input("x", {2, 3, 4});
    ModelBuilder::Attr(mb.Node("Flatten", {"x"}, {"y"}), "axis", axis);
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("Reshape");
    ModelBuilder mb;
    mb.Input("x", {2, 3, 4});
    mb.Int64Initializer("shape", {3}, {4, -1, 2});
    mb.Node("Reshape", {"x", "shape"}, {"y"});
    OutputOfRank(mb, "y", 3);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("Squeeze then Unsqueeze");
    ModelBuilder mb;
    mb.Input("x", {2, 1, 4, 1});
    mb.Int64Initializer("axes", {2}, {1, 3});
    mb.Int64Initializer("new_axes", {1}, {0});
    mb.Node("Squeeze", {"x", "axes"}, {"s"});
    mb.Node("Unsqueeze", {"s", "new_axes"}, {"y"});
    OutputOfRank(mb, "y", 3);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("an empty tensor");
    ModelBuilder mb;
    mb.Input("x", {0, 4});
    mb.Node("Identity", {"x"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes());
  }
}

TEST(CudaBasicKernelsTest, DropoutPassesThroughWithAMaskOfOnes) {
  SALUS_REQUIRE_GPU();
  struct Case {
    const char* scenario;
    bool mask;
    std::optional<float> ratio;  // as an input
    std::optional<bool> training;
  };
  const Case cases[] = {
      {"no mask", false, std::nullopt, std::nullopt},
      {"mask", true, std::nullopt, std::nullopt},
      {"ratio input, inference", true, 0.3f, false},
      {"training mode with ratio 0", true, 0.f, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    ModelBuilder mb;
    mb.Input("x", {4, 33});
    std::vector<std::string> inputs = {"x"};
    if (c.ratio || c.training) {
      mb.Initializer("ratio", {}, {c.ratio.value_or(0.5f)});
      inputs.push_back("ratio");
    }
    if (c.training) {
      auto* t = mb.proto().mutable_graph()->add_initializer();
      t->set_name("training");
      t->set_data_type(onnx::TensorProto::BOOL);
      t->add_int32_data(*c.training ? 1 : 0);
      inputs.push_back("training");
    }
    std::vector<std::string> outputs = {"y"};
    if (c.mask) outputs.push_back("mask");
    mb.Node("Dropout", inputs, outputs);
    OutputOfRank(mb, "y", 2);
    if (c.mask) OutputOfRank(mb, "mask", 2, onnx::TensorProto::BOOL);
    const std::vector<HostTensor> cpu = ExpectCudaParity(mb.Bytes());
    if (c.mask && cpu.size() == 2) {
      for (std::byte b : cpu[1].bytes) ASSERT_EQ(b, std::byte{1}) << "the CPU's mask";
    }
  }
}

TEST(CudaBasicKernelsTest, RandomDropoutIsRefused) {
  SALUS_REQUIRE_GPU();
  ModelBuilder mb;
  mb.Input("x", {4, 8});
  mb.Initializer("ratio", {}, {0.5f});
  auto* t = mb.proto().mutable_graph()->add_initializer();
  t->set_name("training");
  t->set_data_type(onnx::TensorProto::BOOL);
  t->add_int32_data(1);
  mb.Node("Dropout", {"x", "ratio", "training"}, {"y"});
  OutputOfRank(mb, "y", 2);
  ExpectCudaRefuses(mb.Bytes(), "random dropout");
}

// ---------------------------------------------------------------------------------------------
// Unary ops.

std::string UnaryModel(const std::string& op, const Shape& x, std::optional<float> alpha) {
  ModelBuilder mb;
  mb.Input("x", x);
  onnx::NodeProto& n = mb.Node(op, {"x"}, {"y"});
  if (alpha) ModelBuilder::Attr(n, "alpha", *alpha);
  OutputOfRank(mb, "y", x.size());
  return mb.Bytes();
}

TEST(CudaBasicKernelsTest, UnaryOps) {
  SALUS_REQUIRE_GPU();
  struct Case {
    std::string op;
    std::optional<float> alpha;
    float lo, hi;
  };
  const Case cases[] = {
      // cuDNN's activations.
      {"Relu", std::nullopt, -5.f, 5.f},
      {"Sigmoid", std::nullopt, -8.f, 8.f},
      {"Tanh", std::nullopt, -5.f, 5.f},
      {"Elu", std::nullopt, -5.f, 5.f},
      {"Elu", 0.5f, -5.f, 5.f},
      // Hand-written.
      {"LeakyRelu", std::nullopt, -5.f, 5.f},
      {"LeakyRelu", 0.2f, -5.f, 5.f},
      {"LeakyRelu", 0.f, -5.f, 5.f},
      {"Exp", std::nullopt, -5.f, 5.f},
      {"Log", std::nullopt, 0.01f, 10.f},
      {"Sqrt", std::nullopt, 0.f, 10.f},
      {"Neg", std::nullopt, -5.f, 5.f},
      {"Abs", std::nullopt, -5.f, 5.f},
      {"Softplus", std::nullopt, -10.f, 10.f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + (c.alpha ? " alpha " + std::to_string(*c.alpha) : ""));
    ExpectCudaParity(UnaryModel(c.op, {3, 17, 29}, c.alpha), {}, Range(c.lo, c.hi));
    ExpectCudaParity(UnaryModel(c.op, {}, c.alpha), {}, Range(c.lo, c.hi));  // a scalar
  }
}

// More elements than one grid of the hand-written kernel covers (its grid-stride loop), and a
// large cuDNN activation.
TEST(CudaBasicKernelsTest, LargeUnaryOps) {
  SALUS_REQUIRE_GPU();
  ExpectCudaParity(UnaryModel("Abs", {17, 1024, 1024}, std::nullopt));
  ExpectCudaParity(UnaryModel("Tanh", {17, 1024, 1024}, std::nullopt));
}

// Special values, where the two devices agree (element_math_test.cc checks the hand-written
// ones against the CPU on the host): NaN, infinities, signed zeros, large magnitudes.
TEST(CudaBasicKernelsTest, UnaryOpsOnSpecialValues) {
  SALUS_REQUIRE_GPU();
  const std::vector<float> values = {NAN,  INFINITY, -INFINITY, 0.f,   -0.f,  1e-30f, -1e-30f,
                                     30.f, -30.f,    80.f,      -80.f, 1e30f, -1e30f, 0.5f};
  const Shape s = {static_cast<int64_t>(values.size())};
  // Exp is left out: oneDNN's exp gives +inf for NaN, the CUDA device NaN.
  for (const char* op : {"Relu", "LeakyRelu", "Log", "Sqrt", "Neg", "Abs", "Softplus"}) {
    SCOPED_TRACE(op);
    ParityOptions p;
    p.feeds["x"] = HostTensor::FromFloats(s, values);
    ExpectCudaParity(UnaryModel(op, s, std::nullopt), {}, p);
  }
}

// ---------------------------------------------------------------------------------------------
// Binary ops.

struct BroadcastCase {
  const char* scenario;
  Shape a, b;
};

const BroadcastCase kBroadcastCases[] = {
    {"same shapes", {2, 3, 4}, {2, 3, 4}},
    {"scalar on the right", {2, 3, 4}, {}},
    {"scalar on the left", {}, {2, 3, 4}},
    {"both scalars", {}, {}},
    {"a row over a matrix", {4, 5}, {5}},
    {"a row on the left", {5}, {4, 5}},
    {"a column against a row", {4, 1}, {1, 5}},
    {"per-channel bias", {2, 3, 4, 5}, {3, 1, 1}},
    {"middle dim of the same rank", {2, 3, 4}, {1, 3, 1}},
    {"the first operand broadcasts in the middle", {2, 1, 4}, {2, 3, 4}},
    {"both sides broadcast", {2, 1, 4}, {1, 3, 1}},
    {"rank 6 with alternating broadcasts", {2, 1, 3, 1, 2, 1}, {1, 2, 1, 3, 1, 2}},
    {"rank 8 with alternating broadcasts", {2, 1, 2, 1, 2, 1, 2, 1}, {1, 2, 1, 2, 1, 2, 1, 2}},
    {"a one-element tensor of rank 3", {1, 1, 1}, {2, 3}},
    {"empty", {0, 3}, {3}},
};

std::string BinaryModel(const std::string& op, const Shape& a, const Shape& b, size_t out_rank,
                        int type = onnx::TensorProto::FLOAT) {
  ModelBuilder mb;
  mb.Input("a", a, type).Input("b", b, type);
  mb.Node(op, {"a", "b"}, {"z"});
  OutputOfRank(mb, "z", out_rank, type);
  return mb.Bytes();
}

TEST(CudaBasicKernelsTest, BinaryOpsOverEveryBroadcastPattern) {
  SALUS_REQUIRE_GPU();
  for (const std::string op : {"Add", "Sub", "Mul", "Div", "Pow"}) {
    // Divisors away from 0; Pow's bases positive (a fractional power of a negative is NaN).
    const ParityOptions p = op == "Div" || op == "Pow" ? Range(0.5f, 2.f) : Range(-2.f, 2.f);
    for (const BroadcastCase& c : kBroadcastCases) {
      SCOPED_TRACE(op + ": " + c.scenario);
      ExpectCudaParity(BinaryModel(op, c.a, c.b, std::max(c.a.size(), c.b.size())), {}, p);
    }
  }
}

TEST(CudaBasicKernelsTest, BinaryOpOfATensorWithItself) {
  SALUS_REQUIRE_GPU();
  ModelBuilder mb;
  mb.Input("x", {5, 7});
  mb.Node("Mul", {"x", "x"}, {"z"});
  OutputOfRank(mb, "z", 2);
  ExpectCudaParity(mb.Bytes());
}

// More elements than one grid covers, with the per-channel map of three dims.
TEST(CudaBasicKernelsTest, LargeBroadcast) {
  SALUS_REQUIRE_GPU();
  ExpectCudaParity(BinaryModel("Add", {64, 256, 32, 32}, {256, 1, 1}, 4));
}

TEST(CudaBasicKernelsTest, BinaryOpsOnSpecialValues) {
  SALUS_REQUIRE_GPU();
  const std::vector<float> u = {0.f, -0.f, 1.f, -1.f, INFINITY, -INFINITY, NAN, 2.f, 0.5f, -8.f};
  const std::vector<float> v = {0.f, 0.f, INFINITY, -INFINITY, 0.f, 2.f, 1.f, 0.5f, -3.f, 3.f};
  const Shape s = {static_cast<int64_t>(u.size())};
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow"}) {
    SCOPED_TRACE(op);
    ParityOptions p;
    p.feeds["a"] = HostTensor::FromFloats(s, u);
    p.feeds["b"] = HostTensor::FromFloats(s, v);
    ExpectCudaParity(BinaryModel(op, s, s, 1), {}, p);
  }
}

// int64 Add, Sub and Mul (a PyTorch BatchNorm's step counter) broadcast as the float ops do and
// wrap at the int64 range as the CPU does; int64 Div is refused (its zero divisor is an error).
TEST(CudaBasicKernelsTest, Int64BinaryOps) {
  SALUS_REQUIRE_GPU();
  const int kInt64 = onnx::TensorProto::INT64;
  for (const std::string op : {"Add", "Sub", "Mul"}) {
    ParityOptions p;
    p.int_hi = 1000;
    for (const BroadcastCase& c : kBroadcastCases) {
      SCOPED_TRACE(op + " of int64: " + c.scenario);
      ExpectCudaParity(BinaryModel(op, c.a, c.b, std::max(c.a.size(), c.b.size()), kInt64), {}, p);
    }
    SCOPED_TRACE(op + " of int64 at the range's ends");
    const int64_t big = std::numeric_limits<int64_t>::max(), small = -big - 1;
    const Shape s = {6};
    p.feeds["a"] = HostTensor::FromInt64s(s, {big, small, -1, 3, big, 0});
    p.feeds["b"] = HostTensor::FromInt64s(s, {1, -1, small, -7, big, small});
    ExpectCudaParity(BinaryModel(op, s, s, 1, kInt64), {}, p);
  }
  ExpectCudaRefuses(BinaryModel("Div", {4}, {4}, 1, kInt64), "int64 Div");
}

// Nine dims that cannot merge do not fit the index map.
TEST(CudaBasicKernelsTest, BroadcastOfTooManyDimsIsRefused) {
  SALUS_REQUIRE_GPU();
  ExpectCudaRefuses(BinaryModel("Add", {2, 1, 2, 1, 2, 1, 2, 1, 2}, {1, 2, 1, 2, 1, 2, 1, 2, 1}, 9),
                    "Add");
  // Nine dims that merge do.
  ExpectCudaParity(BinaryModel("Add", Shape(9, 2), Shape(9, 2), 9));
}

// ---------------------------------------------------------------------------------------------
// Transpose.

std::string TransposeModel(const Shape& x, const std::optional<std::vector<int64_t>>& perm) {
  ModelBuilder mb;
  mb.Input("x", x);
  onnx::NodeProto& n = mb.Node("Transpose", {"x"}, {"y"});
  if (perm) ModelBuilder::Attr(n, "perm", *perm);
  OutputOfRank(mb, "y", x.size());
  return mb.Bytes();
}

TEST(CudaBasicKernelsTest, TransposeEveryPermutationUpToRankFour) {
  SALUS_REQUIRE_GPU();
  for (const Shape& dims : {Shape{3, 4, 5, 6}, Shape{1, 4, 1, 6}}) {
    for (size_t rank = 1; rank <= 4; ++rank) {
      const Shape x(dims.begin(), dims.begin() + rank);
      std::vector<int64_t> perm(rank);
      std::iota(perm.begin(), perm.end(), 0);
      do {
        SCOPED_TRACE(ShapeString(x) + " perm " + ShapeString(perm));
        ExpectCudaParity(TransposeModel(x, perm));
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
  }
}

TEST(CudaBasicKernelsTest, TransposeOtherCases) {
  SALUS_REQUIRE_GPU();
  ExpectCudaParity(TransposeModel({2, 3, 4}, std::nullopt));  // reversed by default
  ExpectCudaParity(TransposeModel({2, 3, 4, 5, 6}, std::vector<int64_t>{4, 2, 0, 3, 1}));
  ExpectCudaParity(TransposeModel({2, 3, 4, 5, 6}, std::vector<int64_t>{0, 1, 2, 4, 3}));
  ExpectCudaParity(TransposeModel({2, 3, 4, 5, 6}, std::vector<int64_t>{1, 0, 2, 3, 4}));
  ExpectCudaParity(TransposeModel({}, std::nullopt));                          // a scalar
  ExpectCudaParity(TransposeModel({2, 0, 3}, std::vector<int64_t>{2, 0, 1}));  // empty
  // More elements than one grid covers.
  ExpectCudaParity(TransposeModel({4099, 4101}, std::vector<int64_t>{1, 0}));
}

// ---------------------------------------------------------------------------------------------
// Concat.

std::string ConcatModel(const std::vector<Shape>& inputs, int64_t axis,
                        int type = onnx::TensorProto::FLOAT) {
  ModelBuilder mb;
  std::vector<std::string> names;
  for (size_t i = 0; i < inputs.size(); ++i) {
    names.push_back("x" + std::to_string(i));
    mb.Input(names.back(), inputs[i], type);
  }
  ModelBuilder::Attr(mb.Node("Concat", names, {"y"}), "axis", axis);
  OutputOfRank(mb, "y", inputs[0].size(), type);
  return mb.Bytes();
}

TEST(CudaBasicKernelsTest, Concat) {
  SALUS_REQUIRE_GPU();
  struct Case {
    const char* scenario;
    std::vector<Shape> inputs;
    int64_t axis;
  };
  const Case cases[] = {
      {"rank 1", {{3}, {5}, {1}}, 0},
      {"outermost axis: one contiguous copy each", {{2, 3, 4}, {1, 3, 4}}, 0},
      {"middle axis", {{2, 3, 4}, {2, 1, 4}, {2, 5, 4}}, 1},
      {"innermost axis", {{2, 3, 4}, {2, 3, 7}}, 2},
      {"negative axis", {{2, 3, 4}, {2, 3, 2}}, -1},
      {"an empty input in the middle", {{2, 3, 4}, {2, 0, 4}, {2, 2, 4}}, 1},
      {"an empty first input", {{2, 0, 4}, {2, 3, 4}}, 1},
      {"a single input", {{3, 4}}, 1},
      {"NCHW channels", {{4, 16, 9, 9}, {4, 8, 9, 9}, {4, 24, 9, 9}}, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    ExpectCudaParity(ConcatModel(c.inputs, c.axis));
  }
  // Bytes are copied, so int64 (a top-k's indices, joined from its rounds) takes the same path.
  ParityOptions p;
  p.int_hi = 1000;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.scenario) + ", int64");
    ExpectCudaParity(ConcatModel(c.inputs, c.axis, onnx::TensorProto::INT64), {}, p);
  }
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace.

TEST(CudaBasicKernelsTest, DepthToSpaceBothModes) {
  SALUS_REQUIRE_GPU();
  struct Case {
    Shape x;
    int64_t block;
  };
  const Case cases[] = {
      {{2, 8, 3, 4}, 2}, {{1, 18, 5, 3}, 3}, {{2, 4, 1, 1}, 2}, {{1, 3, 2, 2}, 1}};
  for (const std::string mode : {"DCR", "CRD"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(mode + " " + ShapeString(c.x) + " block " + std::to_string(c.block));
      ModelBuilder mb;
      mb.Input("x", c.x);
      onnx::NodeProto& n = mb.Node("DepthToSpace", {"x"}, {"y"});
      ModelBuilder::Attr(n, "blocksize", c.block);
      ModelBuilder::Attr(n, "mode", mode);
      OutputOfRank(mb, "y", 4);
      ExpectCudaParity(mb.Bytes());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pad.

enum class PadForm { kInputs, kInputsNoValue, kAttributes };

std::string PadModel(const Shape& x, const std::vector<int64_t>& pads, float value, PadForm form) {
  ModelBuilder mb;
  mb.Input("x", x);
  if (form == PadForm::kAttributes) {
    mb.proto().mutable_opset_import(0)->set_version(10);
    onnx::NodeProto& n = mb.Node("Pad", {"x"}, {"y"});
    ModelBuilder::Attr(n, "pads", pads);
    ModelBuilder::Attr(n, "value", value);
  } else {
    mb.Int64Initializer("pads", {static_cast<int64_t>(pads.size())}, pads);
    std::vector<std::string> inputs = {"x", "pads"};
    if (form == PadForm::kInputs) {
      mb.Initializer("value", {}, {value});
      inputs.push_back("value");
    }
    mb.Node("Pad", inputs, {"y"});
  }
  OutputOfRank(mb, "y", x.size());
  return mb.Bytes();
}

TEST(CudaBasicKernelsTest, PadEveryForm) {
  SALUS_REQUIRE_GPU();
  struct Case {
    const char* scenario;
    Shape x;
    std::vector<int64_t> pads;
  };
  const Case cases[] = {
      {"1-D both ends", {5}, {2, 3}},
      {"no padding", {3, 4}, {0, 0, 0, 0}},
      {"2-D asymmetric", {3, 4}, {1, 0, 2, 3}},
      {"outer dim only", {3, 4}, {1, 0, 2, 0}},
      {"NCHW spatial", {2, 3, 8, 7}, {0, 0, 1, 2, 0, 0, 2, 1}},
      {"every dim", {2, 3, 2, 2}, {1, 2, 1, 0, 0, 1, 1, 2}},
      {"rank 5", {2, 1, 3, 2, 2}, {0, 1, 0, 1, 0, 1, 0, 0, 2, 1}},
      {"an empty input is all padding", {0, 3}, {1, 1, 0, 1}},
  };
  for (const PadForm form : {PadForm::kInputs, PadForm::kInputsNoValue, PadForm::kAttributes}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.scenario) + " form " + std::to_string(static_cast<int>(form)));
      ExpectCudaParity(PadModel(c.x, c.pads, -2.5f, form));
    }
  }
  ExpectCudaParity(PadModel({}, {}, 1.f, PadForm::kInputs));  // a scalar
}

TEST(CudaBasicKernelsTest, PadOfTooManyDimsIsRefused) {
  SALUS_REQUIRE_GPU();
  std::vector<int64_t> pads(18, 0);
  for (size_t d = 0; d < 9; ++d) pads[d] = 1;
  ExpectCudaRefuses(PadModel(Shape(9, 2), pads, 0.f, PadForm::kInputs), "Pad");
}

// ---------------------------------------------------------------------------------------------
// SoftmaxCrossEntropyLoss.

struct SceCase {
  const char* scenario;
  Shape scores;
  std::vector<int64_t> labels;  // empty: random in [0, classes)
  std::string reduction = "mean";
  bool weights = false;
  std::optional<int64_t> ignore_index = std::nullopt;
  bool log_prob = false;
};

void CheckSce(const SceCase& c) {
  SCOPED_TRACE(c.scenario);
  Shape label_shape = c.scores;
  label_shape.erase(label_shape.begin() + 1);
  ModelBuilder mb;
  mb.Input("scores", c.scores);
  mb.Input("labels", label_shape, onnx::TensorProto::INT64);
  std::vector<std::string> inputs = {"scores", "labels"};
  ParityOptions p;
  p.lo = -3.f;
  p.hi = 3.f;
  p.int_hi = std::max<int64_t>(c.scores[1], 1);
  if (c.weights) {
    mb.Input("w", {c.scores[1]});
    inputs.push_back("w");
    std::vector<float> w(c.scores[1]);
    for (size_t k = 0; k < w.size(); ++k) w[k] = 0.25f + 0.5f * static_cast<float>(k % 4);
    p.feeds["w"] = HostTensor::FromFloats({c.scores[1]}, w);
  }
  if (!c.labels.empty()) p.feeds["labels"] = HostTensor::FromInt64s(label_shape, c.labels);
  std::vector<std::string> outputs = {"loss"};
  if (c.log_prob) outputs.push_back("log_prob");
  onnx::NodeProto& n = mb.Node("SoftmaxCrossEntropyLoss", inputs, outputs);
  ModelBuilder::Attr(n, "reduction", c.reduction);
  if (c.ignore_index) ModelBuilder::Attr(n, "ignore_index", *c.ignore_index);
  OutputOfRank(mb, "loss", c.reduction == "none" ? label_shape.size() : 0);
  if (c.log_prob) OutputOfRank(mb, "log_prob", c.scores.size());
  ExpectCudaParity(mb.Bytes(), {}, p);
}

TEST(CudaBasicKernelsTest, SoftmaxCrossEntropyLoss) {
  SALUS_REQUIRE_GPU();
  const std::vector<int64_t> six = {0, 4, 2, 1, 3, 0};
  const SceCase cases[] = {
      {"mean", {6, 5}, six},
      {"sum", {6, 5}, six, "sum"},
      {"none", {6, 5}, six, "none"},
      {"mean with weights", {6, 5}, six, "mean", true},
      {"sum with weights and log_prob", {6, 5}, six, "sum", true, std::nullopt, true},
      {"none with weights and log_prob", {6, 5}, six, "none", true, std::nullopt, true},
      {"ignore_index", {6, 5}, six, "mean", true, 0},
      {"a negative ignore_index", {4, 3}, {-1, 2, -1, 0}, "mean", false, -1},
      {"labels out of range are ignored", {5, 3}, {-5, 3, 7, 2, 1}, "mean", true},
      {"every label ignored gives a mean of 0", {3, 4}, {2, 2, 2}, "mean", false, 2},
      {"extra dims, none", {2, 3, 2, 2}, {}, "none", false, std::nullopt, true},
      {"extra dims, mean with weights", {2, 3, 4, 5}, {}, "mean", true, 1},
      {"more rows than the reduction's threads", {1000, 10}, {}, "mean", true, 3, true},
      {"many classes", {64, 1000}, {}, "sum"},
      {"extra dims with many rows", {8, 21, 32, 32}, {}, "mean", false, std::nullopt, true},
      {"no classes, mean", {3, 0}, {0, 1, 2}},
      {"no classes, none", {3, 0}, {0, 1, 2}, "none"},
      {"no rows, mean", {0, 4}, {}},
      {"no rows, sum with log_prob", {0, 4}, {}, "sum", false, std::nullopt, true},
  };
  for (const SceCase& c : cases) CheckSce(c);
}

}  // namespace
}  // namespace salus::exec
