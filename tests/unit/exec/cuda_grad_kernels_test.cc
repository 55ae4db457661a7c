// The CUDA device's backward and optimizer kernels (cuda/grad_kernels.cc) against the CPU's:
// each case is one op with its inputs as trainable parameters and loss sum(R * y), trained on
// both devices (cuda_parity.h's ExpectTrainingParity). With SGD at learning rate 1, the state
// after one step is the parameters minus their gradients, so the gradients of every backward
// kernel are compared; the optimizer cases run several steps of SGD with momentum, Adam and
// AdamW. The GPU's runs must be bit-identical (one of them moving between lanes). Skipped
// without a usable GPU.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "cuda_parity.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::ExpectTrainingParity;
using testing::ModelBuilder;
using testing::ParityOptions;
using testing::RandomFloats;

struct Param {
  std::string name;
  Shape shape;
  float lo = -1.f, hi = 1.f;
};

struct Case {
  std::string label;
  std::vector<Param> params;
  Shape y_shape;
  std::function<void(ModelBuilder&)> build;       // nodes computing "y" from the params
  std::map<std::string, HostTensor> inputs = {};  // fed, not differentiated
};

std::string CaseModel(const Case& c) {
  ModelBuilder mb;
  uint32_t seed = 1;
  for (const Param& p : c.params) {
    mb.Initializer(p.name, p.shape, RandomFloats(NumElements(p.shape), seed++, p.lo, p.hi));
  }
  for (const auto& [name, t] : c.inputs) {
    mb.Input(name, t.shape,
             t.type == DataType::kInt64 ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT);
  }
  mb.Input("R", c.y_shape);
  c.build(mb);
  mb.Node("Mul", {"y", "R"}, {"t"});
  auto& sum = mb.Node("ReduceSum", {"t"}, {"loss"});
  ModelBuilder::Attr(sum, "keepdims", int64_t{0});
  mb.Output("loss", {});
  return mb.Bytes();
}

CompileOptions Sgd(float lr, float momentum = 0.f) {
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer.learning_rate = lr;
  o.optimizer.momentum = momentum;
  return o;
}

// One SGD step at learning rate 1: the state after it is params - gradients.
void CheckGradients(const Case& c, double rtol = 1e-4) {
  SCOPED_TRACE(c.label);
  ParityOptions p;
  p.rtol = rtol;
  p.feeds = c.inputs;
  ExpectTrainingParity(CaseModel(c), Sgd(1.f), p, 1);
}

Case Unary(const std::string& op, Shape s, float lo = -1.f, float hi = 1.f,
           std::function<void(onnx::NodeProto&)> attrs = {}) {
  return {op, {{"X", s, lo, hi}}, s, [op, attrs](ModelBuilder& mb) {
            auto& n = mb.Node(op, {"X"}, {"y"});
            if (attrs) attrs(n);
          }};
}

TEST(CudaGradKernelsTest, Eltwise) {
  SALUS_REQUIRE_GPU();
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Softplus", "Neg"}) {
    CheckGradients(Unary(op, {3, 4, 5}));
  }
  CheckGradients(Unary("LeakyRelu", {3, 4}, -1.f, 1.f,
                       [](onnx::NodeProto& n) { ModelBuilder::Attr(n, "alpha", 0.1f); }));
  CheckGradients(Unary("Elu", {3, 4}, -1.f, 1.f,
                       [](onnx::NodeProto& n) { ModelBuilder::Attr(n, "alpha", 0.7f); }));
  CheckGradients(Unary("Log", {3, 4}, 0.5f, 2.f));
  CheckGradients(Unary("Sqrt", {3, 4}, 0.5f, 2.f));
  // A large tensor: many blocks of the grid-stride loop.
  CheckGradients(Unary("Tanh", {64, 1000}));
}

TEST(CudaGradKernelsTest, Softmax) {
  SALUS_REQUIRE_GPU();
  CheckGradients(Unary("Softmax", {3, 5}, -1.f, 1.f,
                       [](onnx::NodeProto& n) { ModelBuilder::Attr(n, "axis", int64_t{1}); }));
  CheckGradients(Unary("LogSoftmax", {2, 3, 4}));
  CheckGradients(Unary("Softmax", {2, 7, 3}, -1.f, 1.f,
                       [](onnx::NodeProto& n) { ModelBuilder::Attr(n, "axis", int64_t{1}); }));
}

Case ConvCase(const std::string& label, Shape x, Shape w, bool bias, Shape y,
              std::function<void(onnx::NodeProto&)> attrs) {
  std::vector<Param> params = {{"X", x}, {"W", w}};
  std::vector<std::string> inputs = {"X", "W"};
  if (bias) {
    params.push_back({"B", {w[0]}});
    inputs.push_back("B");
  }
  return {label, params, y, [inputs, attrs](ModelBuilder& mb) {
            auto& n = mb.Node("Conv", inputs, {"y"});
            if (attrs) attrs(n);
          }};
}

TEST(CudaGradKernelsTest, Conv) {
  SALUS_REQUIRE_GPU();
  CheckGradients(ConvCase("grouped strided padded with bias", {2, 4, 6, 6}, {6, 2, 3, 3}, true,
                          {2, 6, 3, 3}, [](onnx::NodeProto& n) {
                            ModelBuilder::Attr(n, "group", int64_t{2});
                            ModelBuilder::Attr(n, "strides", std::vector<int64_t>{2, 2});
                            ModelBuilder::Attr(n, "pads", std::vector<int64_t>{1, 1, 1, 1});
                          }));
  CheckGradients(ConvCase("no bias", {1, 2, 7, 7}, {3, 2, 3, 3}, false, {1, 3, 5, 5}, {}));
  // The bias gradient sums 8 rows of 18 * 18 per channel: long rows, in two parts (Note [Long
  // sums]).
  CheckGradients(ConvCase("bias summed over long rows", {8, 2, 20, 20}, {3, 2, 3, 3}, true,
                          {8, 3, 18, 18}, {}));
  CheckGradients(
      ConvCase("dilated", {1, 2, 7, 7}, {3, 2, 3, 3}, false, {1, 3, 3, 3}, [](onnx::NodeProto& n) {
        ModelBuilder::Attr(n, "dilations", std::vector<int64_t>{2, 2});
      }));
  // Pads that differ at the two ends: the padded-input path of both gradients.
  CheckGradients(ConvCase("unequal pads", {2, 3, 6, 5}, {4, 3, 3, 3}, true, {2, 4, 3, 3},
                          [](onnx::NodeProto& n) {
                            ModelBuilder::Attr(n, "strides", std::vector<int64_t>{2, 2});
                            ModelBuilder::Attr(n, "pads", std::vector<int64_t>{0, 1, 1, 1});
                          }));
  // The shapes of the reference CNNs.
  CheckGradients(ConvCase("resnet block", {8, 16, 16, 16}, {16, 16, 3, 3}, true, {8, 16, 16, 16},
                          [](onnx::NodeProto& n) {
                            ModelBuilder::Attr(n, "pads", std::vector<int64_t>{1, 1, 1, 1});
                          }),
                 1e-3);
}

// A session's convolution_transforms (kConvolutionTransformsAttr on its convolution nodes)
// admits cuDNN's FFT and Winograd algorithms: the gradients still match the CPU's, more loosely
// (the transforms round more), and the lane, which holds the workspaces, is never smaller.
TEST(CudaGradKernelsTest, ConvWithTransformAlgorithms) {
  SALUS_REQUIRE_GPU();
  const Case c = ConvCase("resnet block, batch 64", {64, 16, 16, 16}, {16, 16, 3, 3}, true,
                          {64, 16, 16, 16}, [](onnx::NodeProto& n) {
                            ModelBuilder::Attr(n, "pads", std::vector<int64_t>{1, 1, 1, 1});
                          });
  const std::string model = CaseModel(c);
  CompileOptions o = Sgd(1.f);
  o.convolution_transforms = true;
  ParityOptions p;
  p.rtol = 1e-3;
  p.atol = 1e-3;
  p.feeds = c.inputs;
  ExpectTrainingParity(model, o, p, 1);
  o.device = Device{DeviceType::kCuda, 0};
  CompileOptions plain = Sgd(1.f);
  plain.device = o.device;
  auto with = Executable::Compile(model, o);
  auto without = Executable::Compile(model, plain);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_GE((*with)->ephemeral_bytes(), (*without)->ephemeral_bytes());
}

Case PoolCase(const std::string& op, Shape x, Shape y,
              std::function<void(onnx::NodeProto&)> attrs = {}) {
  return {op, {{"X", x}}, y, [op, attrs](ModelBuilder& mb) {
            auto& n = mb.Node(op, {"X"}, {"y"});
            if (attrs) attrs(n);
          }};
}

TEST(CudaGradKernelsTest, Pooling) {
  SALUS_REQUIRE_GPU();
  CheckGradients(PoolCase("MaxPool", {2, 3, 4, 4}, {2, 3, 2, 2}, [](onnx::NodeProto& n) {
    ModelBuilder::Attr(n, "kernel_shape", std::vector<int64_t>{2, 2});
    ModelBuilder::Attr(n, "strides", std::vector<int64_t>{2, 2});
  }));
  // Overlapping windows: an input gathers from several outputs.
  CheckGradients(PoolCase("MaxPool", {1, 2, 7, 7}, {1, 2, 3, 3}, [](onnx::NodeProto& n) {
    ModelBuilder::Attr(n, "kernel_shape", std::vector<int64_t>{3, 3});
    ModelBuilder::Attr(n, "strides", std::vector<int64_t>{2, 2});
  }));
  CheckGradients(PoolCase("AveragePool", {1, 2, 4, 4}, {1, 2, 4, 4}, [](onnx::NodeProto& n) {
    ModelBuilder::Attr(n, "kernel_shape", std::vector<int64_t>{3, 3});
    ModelBuilder::Attr(n, "pads", std::vector<int64_t>{1, 1, 1, 1});
  }));
  CheckGradients(PoolCase("AveragePool", {1, 2, 5, 5}, {1, 2, 2, 2}, [](onnx::NodeProto& n) {
    ModelBuilder::Attr(n, "kernel_shape", std::vector<int64_t>{3, 3});
    ModelBuilder::Attr(n, "strides", std::vector<int64_t>{2, 2});
    ModelBuilder::Attr(n, "pads", std::vector<int64_t>{0, 0, 1, 1});
    ModelBuilder::Attr(n, "count_include_pad", int64_t{1});
  }));
  CheckGradients(PoolCase("GlobalAveragePool", {2, 3, 3, 2}, {2, 3, 1, 1}));
  CheckGradients(PoolCase("GlobalMaxPool", {2, 3, 5, 4}, {2, 3, 1, 1}));
}

TEST(CudaGradKernelsTest, BroadcastingSumsAndExpands) {
  SALUS_REQUIRE_GPU();
  auto binary = [](const std::string& op, Shape a, Shape b, Shape y, float blo = -1.f) {
    return Case{op, {{"A", a}, {"B", b, blo, 1.f}}, y, [op](ModelBuilder& mb) {
                  mb.Node(op, {"A", "B"}, {"y"});
                }};
  };
  CheckGradients(binary("Add", {3, 4}, {4}, {3, 4}));
  CheckGradients(binary("Sub", {3, 1}, {3, 4}, {3, 4}));
  CheckGradients(binary("Mul", {2, 3, 4, 5}, {3, 1, 5}, {2, 3, 4, 5}));
  CheckGradients(binary("Div", {2, 3}, {3}, {2, 3}, 0.5f));
  // Long sums into few outputs, each cut into parts (Note [Split sums]): one row cut into
  // column ranges, then short rows cut into ranges of elements.
  CheckGradients(binary("Add", {4096, 8}, {8}, {4096, 8}), 1e-3);
  CheckGradients(binary("Add", {512, 3, 16}, {3, 1}, {512, 3, 16}), 1e-3);
  CheckGradients({"reducemean", {{"X", {2, 3, 4}}}, {2, 4}, [](ModelBuilder& mb) {
                    auto& n = mb.Node("ReduceMean", {"X"}, {"y"});
                    ModelBuilder::Attr(n, "axes", std::vector<int64_t>{1});
                    ModelBuilder::Attr(n, "keepdims", int64_t{0});
                  }});
  CheckGradients({"reducesum", {{"X", {2, 3, 4}}}, {1, 3, 1}, [](ModelBuilder& mb) {
                    mb.Int64Initializer("axes", {2}, {0, -1});
                    mb.Node("ReduceSum", {"X", "axes"}, {"y"});
                  }});
  for (const char* mode : {"DCR", "CRD"}) {
    CheckGradients({std::string("depthtospace ") + mode,
                    {{"X", {2, 8, 2, 3}}},
                    {2, 2, 4, 6},
                    [mode](ModelBuilder& mb) {
                      auto& n = mb.Node("DepthToSpace", {"X"}, {"y"});
                      ModelBuilder::Attr(n, "blocksize", int64_t{2});
                      ModelBuilder::Attr(n, "mode", std::string(mode));
                    }});
  }
}

TEST(CudaGradKernelsTest, GemmAndMatMul) {
  SALUS_REQUIRE_GPU();
  CheckGradients({"gemm transB with vector C",
                  {{"A", {3, 4}}, {"B", {5, 4}}, {"C", {5}}},
                  {3, 5},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Gemm", {"A", "B", "C"}, {"y"});
                    ModelBuilder::Attr(n, "transB", int64_t{1});
                    ModelBuilder::Attr(n, "alpha", 0.5f);
                    ModelBuilder::Attr(n, "beta", 2.f);
                  }});
  CheckGradients({"matmul", {{"A", {3, 4}}, {"B", {4, 2}}}, {3, 2}, [](ModelBuilder& mb) {
                    mb.Node("MatMul", {"A", "B"}, {"y"});
                  }});
}

TEST(CudaGradKernelsTest, SoftmaxCrossEntropyLoss) {
  SALUS_REQUIRE_GPU();
  CheckGradients({"sce mean",
                  {{"X", {4, 5}}},
                  {},
                  [](ModelBuilder& mb) {
                    mb.Node("SoftmaxCrossEntropyLoss", {"X", "L"}, {"y"});
                  },
                  {{"L", HostTensor::FromInt64s({4}, {1, 0, 4, 2})}}});
  CheckGradients({"sce weighted sum with ignore_index, 3-D",
                  {{"X", {4, 5, 2}}},
                  {},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("SoftmaxCrossEntropyLoss", {"X", "L", "Wt"}, {"y"});
                    ModelBuilder::Attr(n, "reduction", std::string("sum"));
                    ModelBuilder::Attr(n, "ignore_index", int64_t{2});
                  },
                  {{"L", HostTensor::FromInt64s({4, 2}, {1, 0, 4, 2, 2, 3, 0, 1})},
                   {"Wt", HostTensor::FromFloats({5}, {0.5f, 1.f, 2.f, 1.5f, 0.2f})}}});
  CheckGradients({"sce none",
                  {{"X", {3, 4}}},
                  {3},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("SoftmaxCrossEntropyLoss", {"X", "L"}, {"y"});
                    ModelBuilder::Attr(n, "reduction", std::string("none"));
                  },
                  {{"L", HostTensor::FromInt64s({3}, {3, 0, 1})}}});
}

// The gradients of the tensor and index ops of exported models.
TEST(CudaGradKernelsTest, GatherSliceConcatPad) {
  SALUS_REQUIRE_GPU();
  // An embedding lookup with repeated and negative indices: the rows' gradients add up.
  CheckGradients({"gather embedding",
                  {{"X", {5, 3}}},
                  {2, 3, 3},
                  [](ModelBuilder& mb) {
                    mb.Node("Gather", {"X", "I"}, {"y"});
                  },
                  {{"I", HostTensor::FromInt64s({2, 3}, {0, 4, 0, -1, 2, 0})}}});
  CheckGradients(
      {"gather axis 1 with constant indices", {{"X", {2, 4, 3}}}, {2, 3, 3}, [](ModelBuilder& mb) {
         mb.Int64Initializer("I", {3}, {1, 3, 1});
         auto& n = mb.Node("Gather", {"X", "I"}, {"y"});
         ModelBuilder::Attr(n, "axis", int64_t{1});
       }});
  CheckGradients({"slice with negative and strided steps",
                  {{"X", {4, 5, 6}}},
                  {2, 2, 3},
                  [](ModelBuilder& mb) {
                    mb.Int64Initializer("starts", {3}, {1, 4, 0});
                    mb.Int64Initializer("ends", {3}, {3, 0, 6});
                    mb.Int64Initializer("axes", {3}, {0, 1, 2});
                    mb.Int64Initializer("steps", {3}, {1, -2, 2});
                    mb.Node("Slice", {"X", "starts", "ends", "axes", "steps"}, {"y"});
                  }});
  CheckGradients({"pad", {{"X", {2, 3, 4}}}, {2, 5, 7}, [](ModelBuilder& mb) {
                    mb.Int64Initializer("pads", {6}, {0, 1, 2, 0, 1, 1});
                    mb.Node("Pad", {"X", "pads"}, {"y"});
                  }});
  CheckGradients({"concat along the last axis",
                  {{"A", {2, 3}}, {"B", {2, 1}}, {"C", {2, 2}}},
                  {2, 6},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Concat", {"A", "B", "C"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{-1});
                  }});
  CheckGradients({"concat along axis 1 of 3-D",
                  {{"A", {2, 1, 3}}, {"B", {2, 2, 3}}},
                  {2, 3, 3},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("Concat", {"A", "B"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{1});
                  }});
  CheckGradients({"split with an unused output", {{"X", {2, 6}}}, {2, 4}, [](ModelBuilder& mb) {
                    mb.Int64Initializer("split", {3}, {1, 2, 3});
                    auto& sp = mb.Node("Split", {"X", "split"}, {"a", "b", "c"});
                    ModelBuilder::Attr(sp, "axis", int64_t{1});
                    auto& n = mb.Node("Concat", {"c", "a"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{1});
                  }});
}

TEST(CudaGradKernelsTest, ClipMinMaxPowAndUnaryTensorOps) {
  SALUS_REQUIRE_GPU();
  CheckGradients(
      {"max of two with broadcasting", {{"A", {3, 4}}, {"B", {4}}}, {3, 4}, [](ModelBuilder& mb) {
         mb.Node("Max", {"A", "B"}, {"y"});
       }});
  CheckGradients({"min of two", {{"A", {2, 3}}, {"B", {2, 3}}}, {2, 3}, [](ModelBuilder& mb) {
                    mb.Node("Min", {"A", "B"}, {"y"});
                  }});
  CheckGradients({"max of three with broadcasting",
                  {{"A", {3, 4}}, {"B", {4}}, {"C", {3, 1}}},
                  {3, 4},
                  [](ModelBuilder& mb) {
                    mb.Node("Max", {"A", "B", "C"}, {"y"});
                  }});
  CheckGradients({"min of four",
                  {{"A", {2, 3}}, {"B", {2, 3}}, {"C", {2, 3}}, {"D", {2, 3}}},
                  {2, 3},
                  [](ModelBuilder& mb) {
                    mb.Node("Min", {"A", "B", "C", "D"}, {"y"});
                  }});
  CheckGradients({"pow with a broadcast exponent",
                  {{"X", {3, 4}, 0.5f, 2.f}, {"E", {4}, 0.5f, 2.5f}},
                  {3, 4},
                  [](ModelBuilder& mb) {
                    mb.Node("Pow", {"X", "E"}, {"y"});
                  }});
  CheckGradients({"pow of negative bases",
                  {{"X", {3, 4}}},
                  {3, 4},
                  [](ModelBuilder& mb) {
                    mb.Node("Pow", {"X", "E"}, {"y"});
                  },
                  {{"E", HostTensor::FromFloats({}, {3.f})}}});
  CheckGradients({"clip with min and max",
                  {{"X", {4, 5}}, {"lo", {}, -0.5f, -0.5f}, {"hi", {}, 0.4f, 0.4f}},
                  {4, 5},
                  [](ModelBuilder& mb) {
                    mb.Node("Clip", {"X", "lo", "hi"}, {"y"});
                  }});
  CheckGradients(
      {"clip with max only", {{"X", {4, 5}}, {"hi", {}, 0.3f, 0.3f}}, {4, 5}, [](ModelBuilder& mb) {
         mb.Node("Clip", {"X", "", "hi"}, {"y"});
       }});
  CheckGradients(Unary("Erf", {3, 4}, -2.f, 2.f));
  CheckGradients(Unary("Reciprocal", {3, 4}, 0.5f, 2.f));
  for (const char* approximate : {"none", "tanh"}) {
    Case c = Unary("Gelu", {3, 4}, -3.f, 3.f, [approximate](onnx::NodeProto& n) {
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
}

// SalusLstmGrad (Note [LSTM backward on cuda]): every input of the LSTM a parameter, in each
// direction and both layouts, with and without B and the initial states; y is Y, or Y_h + Y_c
// (the gradients of the final states).
TEST(CudaGradKernelsTest, Lstm) {
  SALUS_REQUIRE_GPU();
  struct Config {
    std::string direction;
    int64_t layout;
    bool bias_and_states;
  };
  constexpr int64_t kSeq = 5, kBatch = 3, kInput = 4, kHidden = 6;
  for (const Config& c :
       {Config{"forward", 0, true}, Config{"reverse", 1, false}, Config{"bidirectional", 0, true},
        Config{"bidirectional", 1, true}, Config{"forward", 1, false}}) {
    const int64_t dirs = c.direction == "bidirectional" ? 2 : 1;
    const Shape x = c.layout ? Shape{kBatch, kSeq, kInput} : Shape{kSeq, kBatch, kInput};
    const Shape state = c.layout ? Shape{kBatch, dirs, kHidden} : Shape{dirs, kBatch, kHidden};
    const Shape y =
        c.layout ? Shape{kBatch, kSeq, dirs, kHidden} : Shape{kSeq, dirs, kBatch, kHidden};
    // The recurrence weights are "Wr": "R" weighs the loss (CaseModel).
    std::vector<Param> params = {{"X", x},
                                 {"W", {dirs, 4 * kHidden, kInput}, -0.5f, 0.5f},
                                 {"Wr", {dirs, 4 * kHidden, kHidden}, -0.5f, 0.5f}};
    std::vector<std::string> inputs = {"X", "W", "Wr"};
    if (c.bias_and_states) {
      params.push_back({"B", {dirs, 8 * kHidden}, -0.5f, 0.5f});
      params.push_back({"h0", state});
      params.push_back({"c0", state});
      inputs.insert(inputs.end(), {"B", "", "h0", "c0"});
    }
    const std::string label = "LSTM " + c.direction + " layout " + std::to_string(c.layout) +
                              (c.bias_and_states ? " with B and initial states" : "");
    auto lstm = [c, inputs](ModelBuilder& mb, const std::vector<std::string>& outputs) {
      auto& n = mb.Node("LSTM", inputs, outputs);
      ModelBuilder::Attr(n, "hidden_size", kHidden);
      ModelBuilder::Attr(n, "direction", c.direction);
      ModelBuilder::Attr(n, "layout", c.layout);
    };
    CheckGradients({label + ", Y", params, y, [lstm](ModelBuilder& mb) { lstm(mb, {"y"}); }}, 1e-3);
    CheckGradients({label + ", Y_h + Y_c", params, state,
                    [lstm](ModelBuilder& mb) {
                      lstm(mb, {"", "yh", "yc"});
                      mb.Node("Add", {"yh", "yc"}, {"y"});
                    }},
                   1e-3);
  }
}

// BatchNormalization in training (batch statistics, the running statistics updated on the
// device), LayerNormalization's gradient and Dropout's mask (the same on both devices).
TEST(CudaGradKernelsTest, NormalizationAndDropout) {
  SALUS_REQUIRE_GPU();
  for (const Shape& xs : {Shape{4, 3, 2, 2}, Shape{5, 4}, Shape{8, 16, 8, 8}}) {
    const int64_t c = xs[1];
    CheckGradients(
        {"BatchNormalization " + ShapeString(xs),
         {{"X", xs}, {"scale", {c}, 0.5f, 1.5f}, {"B", {c}}},
         xs,
         [c](ModelBuilder& mb) {
           mb.Initializer("rm", {c}, RandomFloats(c, 64));
           mb.Initializer("rv", {c}, RandomFloats(c, 65, 0.5f, 2.f));
           auto& n = mb.Node("BatchNormalization", {"X", "scale", "B", "rm", "rv"}, {"y"});
           ModelBuilder::Attr(n, "epsilon", 1e-3f);
         }},
        1e-3);
  }
  CheckGradients({"LayerNormalization axis -1",
                  {{"X", {3, 2, 5}}, {"scale", {5}, 0.5f, 1.5f}, {"B", {5}}},
                  {3, 2, 5},
                  [](ModelBuilder& mb) {
                    mb.Node("LayerNormalization", {"X", "scale", "B"}, {"y"});
                  }});
  CheckGradients({"LayerNormalization axis 1, no B",
                  {{"X", {3, 2, 5}}, {"scale", {2, 5}, 0.5f, 1.5f}},
                  {3, 2, 5},
                  [](ModelBuilder& mb) {
                    auto& n = mb.Node("LayerNormalization", {"X", "scale"}, {"y"});
                    ModelBuilder::Attr(n, "axis", int64_t{1});
                    ModelBuilder::Attr(n, "epsilon", 1e-3f);
                  }});
  CheckGradients({"LayerNormalization of long rows",
                  {{"X", {64, 768}}, {"scale", {768}, 0.5f, 1.5f}, {"B", {768}}},
                  {64, 768},
                  [](ModelBuilder& mb) {
                    mb.Node("LayerNormalization", {"X", "scale", "B"}, {"y"});
                  }},
                 1e-3);
  // Several steps: the mask follows the iteration counter on both devices.
  ParityOptions p;
  const Case dropout = Unary("Dropout", {16, 64});
  ExpectTrainingParity(CaseModel(dropout), Sgd(0.1f), p, 3);
}

// Several steps of each optimizer on a small two-layer network: the state (parameters,
// velocities, Adam's moments and its step count, which lives on the device) tracks the CPU's.
TEST(CudaGradKernelsTest, Optimizers) {
  SALUS_REQUIRE_GPU();
  const Case net{"net",
                 {{"W1", {8, 6}}, {"B1", {6}}, {"W2", {6, 3}}},
                 {5, 3},
                 [](ModelBuilder& mb) {
                   mb.Node("Gemm", {"X", "W1", "B1"}, {"h"});
                   mb.Node("Tanh", {"h"}, {"a"});
                   mb.Node("MatMul", {"a", "W2"}, {"y"});
                 },
                 {{"X", HostTensor::FromFloats({5, 8}, RandomFloats(40, 7))}}};
  const std::string model = CaseModel(net);
  ParityOptions p;
  p.feeds = net.inputs;
  p.rtol = 1e-4;
  {
    SCOPED_TRACE("sgd momentum nesterov weight decay");
    CompileOptions o = Sgd(0.1f, 0.9f);
    o.optimizer.nesterov = true;
    o.optimizer.weight_decay = 0.01f;
    ExpectTrainingParity(model, o, p, 5);
  }
  {
    SCOPED_TRACE("adam");
    CompileOptions o = Sgd(0.01f);
    o.optimizer.kind = OptimizerOptions::Kind::kAdam;
    ExpectTrainingParity(model, o, p, 5);
  }
  {
    SCOPED_TRACE("adamw");
    CompileOptions o = Sgd(0.01f);
    o.optimizer.kind = OptimizerOptions::Kind::kAdamW;
    o.optimizer.weight_decay = 0.1f;
    ExpectTrainingParity(model, o, p, 5);
  }
}

}  // namespace
}  // namespace salus::exec
