// Parity of the CUDA device's cuDNN kernels (src/exec/cuda/cudnn_kernels.cc) with the CPU, op by
// op and attribute by attribute (cuda_parity.h): Conv (groups, strides, dilations, every padding
// form, bias, the Relu inference fuses), ConvTranspose (pads, output_padding, output_shape,
// auto_pad, groups, bias), pooling on both the cuDNN and the hand-written paths (Note [cuDNN
// windows]), BatchNormalization (inference with cuDNN's and the hand-written epsilon paths,
// training mode with its running statistics), Softmax and LogSoftmax (axes, opset 11's 2-D
// coercion). Each case also runs twice on the GPU in lanes at different addresses and must be
// bit-identical. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
using testing::RandomFloats;

// A graph output of `rank` unknown dims: the engine infers the shape.
void OutputOfRank(ModelBuilder& mb, const std::string& name, size_t rank) {
  auto* out = mb.proto().mutable_graph()->add_output();
  out->set_name(name);
  auto* t = out->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = t->mutable_shape();
  for (size_t i = 0; i < rank; ++i) shape->add_dim();
}

// Window attributes shared by Conv, ConvTranspose and pooling; empty ones are not set.
struct WindowAttrs {
  std::vector<int64_t> kernel = {};  // pooling's kernel_shape
  std::vector<int64_t> strides = {};
  std::vector<int64_t> pads = {};
  std::vector<int64_t> dilations = {};
  std::string auto_pad = "";
  int64_t group = 1;
  int64_t ceil_mode = 0;
  int64_t count_include_pad = 0;
  std::vector<int64_t> output_padding = {};
  std::vector<int64_t> output_shape = {};
};

void SetWindowAttrs(onnx::NodeProto& n, const WindowAttrs& a) {
  if (!a.kernel.empty()) ModelBuilder::Attr(n, "kernel_shape", a.kernel);
  if (!a.strides.empty()) ModelBuilder::Attr(n, "strides", a.strides);
  if (!a.pads.empty()) ModelBuilder::Attr(n, "pads", a.pads);
  if (!a.dilations.empty()) ModelBuilder::Attr(n, "dilations", a.dilations);
  if (!a.auto_pad.empty()) ModelBuilder::Attr(n, "auto_pad", a.auto_pad);
  if (a.group != 1) ModelBuilder::Attr(n, "group", a.group);
  if (a.ceil_mode != 0) ModelBuilder::Attr(n, "ceil_mode", a.ceil_mode);
  if (a.count_include_pad != 0) ModelBuilder::Attr(n, "count_include_pad", a.count_include_pad);
  if (!a.output_padding.empty()) ModelBuilder::Attr(n, "output_padding", a.output_padding);
  if (!a.output_shape.empty()) ModelBuilder::Attr(n, "output_shape", a.output_shape);
}

// Conv or ConvTranspose of inputs x and w (and b when `bias`), optionally followed by a Relu.
std::string ConvModel(const std::string& op, const Shape& x, const Shape& w, bool bias,
                      const WindowAttrs& a, bool relu = false) {
  ModelBuilder mb;
  mb.Input("x", x);
  mb.Input("w", w);
  std::vector<std::string> inputs = {"x", "w"};
  if (bias) {
    mb.Input("b", {op == "Conv" ? w[0] : w[1] * a.group});
    inputs.push_back("b");
  }
  SetWindowAttrs(mb.Node(op, inputs, {relu ? "c" : "y"}), a);
  if (relu) mb.Node("Relu", {"c"}, {"y"});
  OutputOfRank(mb, "y", x.size());
  return mb.Bytes();
}

std::string PoolModel(const std::string& op, const Shape& x, const WindowAttrs& a) {
  ModelBuilder mb;
  mb.Input("x", x);
  SetWindowAttrs(mb.Node(op, {"x"}, {"y"}), a);
  OutputOfRank(mb, "y", x.size());
  return mb.Bytes();
}

// Parity, or a skip when the CPU itself refuses the model (the engine's shape inference takes
// 2-D and 3-D convolutions and 2-D pooling today; the other cases run once it takes more).
void ParityUnlessTheCpuRefuses(const std::string& model, const ParityOptions& p = {}) {
  auto cpu = Executable::Compile(model, {});
  if (!cpu.ok() && cpu.status().code() == StatusCode::kUnimplemented) {
    GTEST_SKIP() << "the CPU refuses the model: " << cpu.status();
  }
  ExpectCudaParity(model, {}, p);
}

// ---------------------------------------------------------------------------------------------
// Conv.

struct ConvCase {
  const char* scenario;
  Shape x, w;
  bool bias;
  WindowAttrs attrs;
};

// clang-format off
const ConvCase kConvCases[] = {
    {"3x3, equal pads, bias", {2, 3, 9, 9}, {4, 3, 3, 3}, true, {.pads = {1, 1, 1, 1}}},
    {"3x3, no padding, no bias", {2, 3, 9, 8}, {5, 3, 3, 3}, false, {}},
    {"strides and dilations", {2, 4, 15, 13}, {6, 4, 3, 3}, true,
     {.strides = {2, 2}, .pads = {2, 2, 2, 2}, .dilations = {2, 2}}},
    {"unequal strides and dilations", {1, 3, 14, 16}, {4, 3, 3, 2}, true,
     {.strides = {1, 3}, .pads = {1, 0, 1, 0}, .dilations = {3, 1}}},
    {"groups", {2, 8, 10, 10}, {6, 4, 3, 3}, true, {.pads = {1, 1, 1, 1}, .group = 2}},
    {"depthwise", {2, 6, 11, 11}, {6, 1, 3, 3}, true,
     {.strides = {2, 2}, .pads = {1, 1, 1, 1}, .group = 6}},
    {"depthwise with a channel multiplier", {1, 4, 8, 8}, {8, 1, 5, 5}, false,
     {.pads = {2, 2, 2, 2}, .group = 4}},
    {"asymmetric pads", {2, 3, 9, 8}, {4, 3, 3, 3}, true, {.pads = {0, 1, 2, 1}}},
    {"asymmetric pads, strides, dilations, groups", {2, 6, 13, 12}, {6, 2, 3, 3}, true,
     {.strides = {2, 2}, .pads = {1, 0, 0, 2}, .dilations = {2, 1}, .group = 3}},
    {"SAME_UPPER, odd total", {2, 3, 9, 9}, {5, 3, 4, 4}, true,
     {.strides = {2, 2}, .auto_pad = "SAME_UPPER"}},
    {"SAME_LOWER, odd total", {2, 4, 8, 7}, {3, 4, 3, 2}, false,
     {.strides = {2, 2}, .auto_pad = "SAME_LOWER"}},
    {"SAME_UPPER, even total", {2, 3, 8, 8}, {4, 3, 3, 3}, true, {.auto_pad = "SAME_UPPER"}},
    {"VALID", {2, 3, 10, 9}, {4, 3, 4, 2}, true, {.strides = {3, 2}, .auto_pad = "VALID"}},
    {"1x1, stride 2", {2, 16, 9, 9}, {8, 16, 1, 1}, true, {.strides = {2, 2}}},
    {"1x1, end pads only", {2, 3, 5, 5}, {2, 3, 1, 1}, false, {.pads = {0, 0, 1, 1}}},
    {"kernel as large as the padded input", {1, 2, 4, 5}, {3, 2, 6, 7}, true,
     {.pads = {1, 1, 1, 1}}},
    // Large enough that cuDNN's heuristics pick algorithms with a workspace.
    {"ResNet-sized 3x3", {8, 64, 28, 28}, {64, 64, 3, 3}, true, {.pads = {1, 1, 1, 1}}},
    {"ResNet-sized strided 1x1", {8, 64, 28, 28}, {128, 64, 1, 1}, false, {.strides = {2, 2}}},
    {"stem 7x7", {4, 3, 64, 64}, {32, 3, 7, 7}, true, {.strides = {2, 2}, .pads = {3, 3, 3, 3}}},
};
// clang-format on

TEST(CudaCudnnKernelsTest, Conv) {
  SALUS_REQUIRE_GPU();
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(c.scenario);
    ExpectCudaParity(ConvModel("Conv", c.x, c.w, c.bias, c.attrs));
  }
}

// Inference fuses a Relu that only consumes a Conv (fused_activation="Relu").
TEST(CudaCudnnKernelsTest, ConvWithFusedRelu) {
  SALUS_REQUIRE_GPU();
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(c.scenario);
    const std::string model = ConvModel("Conv", c.x, c.w, c.bias, c.attrs, /*relu=*/true);
    CompileOptions o;
    o.device = Device{DeviceType::kCuda, 0};
    auto gpu = Executable::Compile(model, o);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    for (const Node& n : (*gpu)->graph().nodes()) {
      EXPECT_NE(n.op, "Relu") << "the Relu was not fused";
      if (n.op == "Conv") {
        EXPECT_EQ(n.GetString("fused_activation", ""), "Relu");
      }
    }
    ExpectCudaParity(model);
  }
}

TEST(CudaCudnnKernelsTest, ConvOneAndThreeDimensional) {
  SALUS_REQUIRE_GPU();
  ParityUnlessTheCpuRefuses(
      ConvModel("Conv", {2, 4, 17}, {6, 2, 3}, true,
                {.strides = {2}, .pads = {1, 2}, .dilations = {2}, .group = 2}));
  ParityUnlessTheCpuRefuses(ConvModel("Conv", {1, 3, 6, 7, 8}, {4, 3, 3, 3, 2}, true,
                                      {.strides = {1, 2, 1}, .pads = {1, 0, 1, 1, 1, 0}}));
}

// ---------------------------------------------------------------------------------------------
// ConvTranspose.

// clang-format off
const ConvCase kConvTransposeCases[] = {
    {"stride 1, no padding", {2, 4, 5, 6}, {4, 3, 3, 3}, true, {}},
    {"stride 2, equal pads, output_padding", {2, 4, 5, 4}, {4, 3, 3, 3}, true,
     {.strides = {2, 2}, .pads = {1, 1, 1, 1}, .output_padding = {1, 1}}},
    {"asymmetric pads", {2, 4, 5, 4}, {4, 3, 3, 3}, false,
     {.strides = {2, 2}, .pads = {1, 0, 0, 2}}},
    {"output_padding with asymmetric pads", {1, 4, 4, 5}, {4, 2, 3, 2}, true,
     {.strides = {2, 3}, .pads = {0, 1, 2, 0}, .output_padding = {1, 2}}},
    {"SAME_UPPER", {2, 4, 5, 4}, {4, 3, 4, 3}, true, {.strides = {2, 2}, .auto_pad = "SAME_UPPER"}},
    {"SAME_LOWER", {2, 4, 5, 4}, {4, 3, 4, 3}, false,
     {.strides = {2, 2}, .auto_pad = "SAME_LOWER"}},
    {"output_shape", {1, 4, 5, 4}, {4, 3, 3, 3}, true,
     {.strides = {2, 2}, .output_shape = {11, 9}}},
    {"dilations, groups, asymmetric pads", {2, 4, 5, 5}, {4, 2, 3, 2}, true,
     {.strides = {2, 1}, .pads = {2, 1, 0, 1}, .dilations = {2, 2}, .group = 2}},
    {"depthwise upsampling", {2, 6, 7, 7}, {6, 1, 4, 4}, true,
     {.strides = {2, 2}, .pads = {1, 1, 1, 1}, .group = 6}},
    {"decoder-sized", {4, 64, 16, 16}, {64, 32, 4, 4}, true,
     {.strides = {2, 2}, .pads = {1, 1, 1, 1}}},
};
// clang-format on

TEST(CudaCudnnKernelsTest, ConvTranspose) {
  SALUS_REQUIRE_GPU();
  for (const ConvCase& c : kConvTransposeCases) {
    SCOPED_TRACE(c.scenario);
    ExpectCudaParity(ConvModel("ConvTranspose", c.x, c.w, c.bias, c.attrs));
  }
}

TEST(CudaCudnnKernelsTest, ConvTransposeOneAndThreeDimensional) {
  SALUS_REQUIRE_GPU();
  ParityUnlessTheCpuRefuses(ConvModel("ConvTranspose", {2, 4, 9}, {4, 3, 3}, true,
                                      {.strides = {2}, .pads = {0, 1}, .output_padding = {1}}));
  ParityUnlessTheCpuRefuses(ConvModel("ConvTranspose", {1, 2, 3, 4, 3}, {2, 2, 2, 3, 2}, true,
                                      {.strides = {2, 1, 2}, .pads = {1, 1, 0, 0, 1, 1}}));
}

// ---------------------------------------------------------------------------------------------
// Pooling.

struct PoolCase {
  const char* scenario;
  std::string op;
  Shape x;
  WindowAttrs attrs;
};

// clang-format off
const PoolCase kPoolCases[] = {
    // cuDNN: equal pads, no dilation, pads below the kernel.
    {"max 3x3 stride 2, equal pads", "MaxPool", {2, 8, 15, 15},
     {.kernel = {3, 3}, .strides = {2, 2}, .pads = {1, 1, 1, 1}}},
    {"max 2x2 stride 2", "MaxPool", {2, 8, 16, 14}, {.kernel = {2, 2}, .strides = {2, 2}}},
    {"max, kernel larger than the input", "MaxPool", {1, 2, 4, 4},
     {.kernel = {5, 5}, .pads = {1, 1, 1, 1}}},
    {"max, ceil_mode that adds no window", "MaxPool", {2, 3, 9, 9},
     {.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = 1}},
    {"average excluding pads, equal pads", "AveragePool", {2, 8, 12, 12},
     {.kernel = {3, 3}, .pads = {1, 1, 1, 1}}},
    {"average including pads, equal pads", "AveragePool", {2, 8, 12, 12},
     {.kernel = {3, 3}, .pads = {1, 1, 1, 1}, .count_include_pad = 1}},
    {"average 7x7, no padding", "AveragePool", {4, 16, 7, 7}, {.kernel = {7, 7}}},
    {"average, SAME_UPPER with an even total", "AveragePool", {2, 3, 8, 8},
     {.kernel = {3, 3}, .auto_pad = "SAME_UPPER", .count_include_pad = 1}},
    // Hand-written: unequal pads, dilations, ceil_mode's end padding, pads as large as the kernel.
    {"max, asymmetric pads", "MaxPool", {2, 3, 9, 8},
     {.kernel = {3, 3}, .strides = {2, 2}, .pads = {0, 1, 2, 1}}},
    {"max, SAME_UPPER with an odd total", "MaxPool", {2, 3, 7, 7},
     {.kernel = {2, 2}, .strides = {2, 2}, .auto_pad = "SAME_UPPER"}},
    {"max, SAME_LOWER with an odd total", "MaxPool", {2, 3, 8, 6},
     {.kernel = {3, 3}, .strides = {2, 2}, .auto_pad = "SAME_LOWER"}},
    {"max, ceil_mode", "MaxPool", {2, 3, 8, 8},
     {.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = 1}},
    {"max, ceil_mode with pads", "MaxPool", {2, 3, 6, 7},
     {.kernel = {2, 2}, .strides = {2, 2}, .pads = {1, 1, 1, 1}, .ceil_mode = 1}},
    {"max, dilations", "MaxPool", {2, 3, 11, 11},
     {.kernel = {3, 3}, .pads = {2, 2, 2, 2}, .dilations = {2, 2}}},
    {"max, dilations, asymmetric pads, ceil_mode", "MaxPool", {2, 3, 9, 10},
     {.kernel = {2, 3}, .strides = {2, 1}, .pads = {1, 0, 0, 2}, .dilations = {2, 3},
      .ceil_mode = 1}},
    {"average excluding pads, asymmetric pads", "AveragePool", {2, 3, 8, 7},
     {.kernel = {3, 3}, .strides = {2, 2}, .pads = {2, 0, 1, 1}}},
    {"average including pads, asymmetric pads", "AveragePool", {2, 3, 8, 7},
     {.kernel = {3, 3}, .strides = {2, 2}, .pads = {2, 0, 1, 1}, .count_include_pad = 1}},
    {"average excluding pads, SAME_UPPER with an odd total", "AveragePool", {2, 3, 9, 9},
     {.kernel = {4, 4}, .strides = {2, 2}, .auto_pad = "SAME_UPPER"}},
    {"average including pads, SAME_LOWER", "AveragePool", {2, 3, 8, 9},
     {.kernel = {3, 2}, .strides = {2, 2}, .auto_pad = "SAME_LOWER", .count_include_pad = 1}},
    {"average, ceil_mode", "AveragePool", {2, 3, 8, 8},
     {.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = 1}},
    {"average, ceil_mode with pads", "AveragePool", {2, 3, 7, 8},
     {.kernel = {3, 3}, .strides = {2, 2}, .pads = {1, 1, 1, 1}, .ceil_mode = 1}},
    {"average, pads one below the kernel", "AveragePool", {1, 2, 5, 5},
     {.kernel = {3, 3}, .pads = {2, 1, 1, 2}}},
    // Windows with no tap in the input: the lowest float for max, 0 for an average including
    // pads (both devices refuse an average excluding pads).
    {"max, windows wholly in the padding", "MaxPool", {1, 2, 3, 3},
     {.kernel = {2, 2}, .pads = {2, 2, 2, 3}}},
    {"average including pads, windows wholly in the padding", "AveragePool", {1, 2, 3, 3},
     {.kernel = {2, 2}, .pads = {2, 2, 2, 3}, .count_include_pad = 1}},
};
// clang-format on

TEST(CudaCudnnKernelsTest, Pooling) {
  SALUS_REQUIRE_GPU();
  for (const PoolCase& c : kPoolCases) {
    SCOPED_TRACE(c.scenario);
    ExpectCudaParity(PoolModel(c.op, c.x, c.attrs));
  }
}

TEST(CudaCudnnKernelsTest, PoolingOneAndThreeDimensional) {
  SALUS_REQUIRE_GPU();
  ParityUnlessTheCpuRefuses(
      PoolModel("MaxPool", {2, 3, 11}, {.kernel = {3}, .strides = {2}, .pads = {1, 1}}));
  ParityUnlessTheCpuRefuses(PoolModel("AveragePool", {2, 3, 10},
                                      {.kernel = {4}, .strides = {3}, .auto_pad = "SAME_UPPER"}));
  ParityUnlessTheCpuRefuses(PoolModel("MaxPool", {1, 2, 6, 7, 8},
                                      {.kernel = {2, 2, 3}, .strides = {2, 2, 2}, .ceil_mode = 1}));
  ParityUnlessTheCpuRefuses(
      PoolModel("AveragePool", {1, 2, 5, 6, 7},
                {.kernel = {3, 3, 3}, .pads = {1, 1, 1, 1, 1, 1}, .count_include_pad = 1}));
}

TEST(CudaCudnnKernelsTest, GlobalPooling) {
  SALUS_REQUIRE_GPU();
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    for (const Shape& x :
         {Shape{2, 3, 9}, Shape{4, 32, 7, 7}, Shape{2, 8, 56, 56}, Shape{1, 4, 3, 4, 5}}) {
      SCOPED_TRACE(std::string(op) + " over " + ShapeString(x));
      ModelBuilder mb;
      mb.Input("x", x);
      mb.Node(op, {"x"}, {"y"});
      OutputOfRank(mb, "y", x.size());
      ExpectCudaParity(mb.Bytes());
    }
  }
}

// Max pooling skips NaNs on both devices; on the cuDNN path (equal pads) and the hand-written
// one (unequal pads).
TEST(CudaCudnnKernelsTest, MaxPoolingWithNans) {
  SALUS_REQUIRE_GPU();
  const Shape xs = {2, 3, 8, 8};
  std::vector<float> x = RandomFloats(NumElements(xs), 4);
  for (size_t i = 0; i < x.size(); i += 5) x[i] = std::numeric_limits<float>::quiet_NaN();
  ParityOptions p;
  p.feeds["x"] = HostTensor::FromFloats(xs, x);
  ExpectCudaParity(PoolModel("MaxPool", xs, {.kernel = {3, 3}, .pads = {1, 1, 1, 1}}), {}, p);
  ExpectCudaParity(PoolModel("MaxPool", xs, {.kernel = {3, 3}, .pads = {0, 1, 2, 1}}), {}, p);
}

// ---------------------------------------------------------------------------------------------
// BatchNormalization.

// BatchNormalization of x with parameters scale, bias, mean, var; in training mode, also the
// running statistics as outputs.
std::string BatchNormModel(const Shape& x, float epsilon, bool training, float momentum = 0.9f) {
  ModelBuilder mb;
  mb.Input("x", x);
  for (const char* p : {"scale", "bias", "mean", "var"}) mb.Input(p, {x[1]});
  std::vector<std::string> outputs = {"y"};
  if (training) outputs = {"y", "running_mean", "running_var"};
  onnx::NodeProto& n =
      mb.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, outputs);
  ModelBuilder::Attr(n, "epsilon", epsilon);
  if (momentum != 0.9f) ModelBuilder::Attr(n, "momentum", momentum);
  if (training) ModelBuilder::Attr(n, "training_mode", int64_t{1});
  OutputOfRank(mb, "y", x.size());
  if (training) {
    OutputOfRank(mb, "running_mean", 1);
    OutputOfRank(mb, "running_var", 1);
  }
  return mb.Bytes();
}

// A positive running variance.
ParityOptions PositiveVariance(int64_t channels) {
  ParityOptions p;
  p.feeds["var"] = HostTensor::FromFloats({channels}, RandomFloats(channels, 8, 0.5f, 1.5f));
  return p;
}

TEST(CudaCudnnKernelsTest, BatchNormalizationInference) {
  SALUS_REQUIRE_GPU();
  for (const Shape& x : {Shape{4, 8, 6, 6}, Shape{16, 10}, Shape{4, 6, 20}, Shape{2, 3, 4, 5, 6}}) {
    // 1e-5 (the default), a tiny epsilon, 0, and a negative one cuDNN refuses (hand-written).
    for (float epsilon : {1e-5f, 1e-9f, 0.f, -1e-6f}) {
      SCOPED_TRACE(ShapeString(x) + " epsilon " + std::to_string(epsilon));
      ExpectCudaParity(BatchNormModel(x, epsilon, false), {}, PositiveVariance(x[1]));
    }
  }
}

TEST(CudaCudnnKernelsTest, BatchNormalizationTrainingMode) {
  SALUS_REQUIRE_GPU();
  for (const Shape& x : {Shape{4, 8, 6, 6}, Shape{16, 10}, Shape{4, 6, 20}, Shape{8, 32, 28, 28},
                         Shape{2, 3, 4, 5, 6}}) {
    for (float epsilon : {1e-5f, 1e-9f, -1e-6f}) {
      for (float momentum : {0.9f, 0.3f}) {
        SCOPED_TRACE(ShapeString(x) + " epsilon " + std::to_string(epsilon) + " momentum " +
                     std::to_string(momentum));
        ExpectCudaParity(BatchNormModel(x, epsilon, true, momentum), {}, PositiveVariance(x[1]));
      }
    }
  }
}

// One element per channel: the batch variance is 0 and y is the bias.
TEST(CudaCudnnKernelsTest, BatchNormalizationTrainingModeOnOneElementPerChannel) {
  SALUS_REQUIRE_GPU();
  ExpectCudaParity(BatchNormModel({1, 5}, 1e-5f, true), {}, PositiveVariance(5));
}

// ---------------------------------------------------------------------------------------------
// Softmax, LogSoftmax.

std::string SoftmaxModel(const std::string& op, const Shape& x, std::optional<int64_t> axis,
                         int opset = 17) {
  ModelBuilder mb;
  mb.proto().mutable_opset_import(0)->set_version(opset);
  mb.Input("x", x);
  onnx::NodeProto& n = mb.Node(op, {"x"}, {"y"});
  if (axis) ModelBuilder::Attr(n, "axis", *axis);
  OutputOfRank(mb, "y", x.size());
  return mb.Bytes();
}

TEST(CudaCudnnKernelsTest, SoftmaxAndLogSoftmax) {
  SALUS_REQUIRE_GPU();
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    SCOPED_TRACE(op);
    ExpectCudaParity(SoftmaxModel(op, {7}, std::nullopt));
    ExpectCudaParity(SoftmaxModel(op, {32, 10}, std::nullopt));
    ExpectCudaParity(SoftmaxModel(op, {32, 1000}, 1));
    for (int64_t axis : {-1, 0, 1, 2, 3, -3}) {
      SCOPED_TRACE("axis " + std::to_string(axis));
      ExpectCudaParity(SoftmaxModel(op, {3, 4, 5, 6}, axis));
    }
    // Opset 11: the input is coerced to 2-D at the axis (1 by default).
    for (std::optional<int64_t> axis : {std::optional<int64_t>{}, std::optional<int64_t>{0},
                                        std::optional<int64_t>{2}, std::optional<int64_t>{-1}}) {
      SCOPED_TRACE("opset 11, axis " + (axis ? std::to_string(*axis) : std::string("default")));
      ExpectCudaParity(SoftmaxModel(op, {3, 4, 5, 6}, axis, 11));
    }
    // Large logits: both devices subtract the maximum first.
    ParityOptions wide;
    wide.lo = -80.f;
    wide.hi = 80.f;
    ExpectCudaParity(SoftmaxModel(op, {16, 64}, -1), {}, wide);
  }
}

}  // namespace
}  // namespace salus::exec
