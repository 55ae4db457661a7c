// Parity of the CUDA device's tensor-op, LayerNormalization and LSTM kernels
// (src/exec/cuda/tensor_kernels.cc, norm_lstm_kernels.cc) with the CPU, op by op (cuda_parity.h):
// float, int64 and bool forms where the CPU has them, broadcasting, optional inputs and the
// opset forms. Ops whose inputs are all constants fold at import and never reach a device, so
// the generators (Range, ConstantOfShape, Shape) run node by node on both devices' kernels.
// Each model case also runs twice on the GPU in lanes at different addresses and must be
// bit-identical. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_parity.h"
#include "exec/kernel_registry.h"
#include "exec/shape_inference.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::ExpectCudaParity;
using testing::ModelBuilder;
using testing::ParityOptions;

constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kInt64 = onnx::TensorProto::INT64;
constexpr int kBool = onnx::TensorProto::BOOL;

// A graph output of `rank` unknown dims and the given element type: the engine infers the shape.
void OutputOfRank(ModelBuilder& mb, const std::string& name, size_t rank, int type = kFloat) {
  auto* out = mb.proto().mutable_graph()->add_output();
  out->set_name(name);
  auto* t = out->mutable_type()->mutable_tensor_type();
  t->set_elem_type(type);
  auto* shape = t->mutable_shape();
  for (size_t i = 0; i < rank; ++i) shape->add_dim();
}

void SetOpset(ModelBuilder& mb, int opset) {
  mb.proto().mutable_opset_import(0)->set_version(opset);
}

ParityOptions Range(float lo, float hi) {
  ParityOptions p;
  p.lo = lo;
  p.hi = hi;
  return p;
}

ParityOptions Ints(int64_t hi) {
  ParityOptions p;
  p.int_hi = hi;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Data movement.

// A gather of `indices` from `data` along `axis`, of element type `type`.
struct GatherCase {
  const char* scenario;
  Shape data, indices;
  int64_t axis;
  int type;
};

TEST(CudaTensorKernelsTest, Gather) {
  SALUS_REQUIRE_GPU();
  const GatherCase cases[] = {
      {"rows of a table", {7, 5}, {3}, 0, kFloat},
      {"2-D indices", {7, 5}, {2, 3}, 0, kFloat},
      {"middle axis", {2, 6, 3}, {4}, 1, kFloat},
      {"last axis, negative", {2, 3, 6}, {5}, -1, kFloat},
      {"scalar index", {6, 4}, {}, 0, kFloat},
      {"int64 data", {6, 4}, {3}, 1, kInt64},
      {"bool data", {6, 4}, {2, 2}, 0, kBool},
  };
  for (const GatherCase& c : cases) {
    SCOPED_TRACE(c.scenario);
    ModelBuilder mb;
    mb.Input("x", c.data, c.type);
    mb.Input("i", c.indices, kInt64);
    ModelBuilder::Attr(mb.Node("Gather", {"x", "i"}, {"y"}), "axis", c.axis);
    OutputOfRank(mb, "y", c.data.size() + c.indices.size() - 1, c.type);
    ParityOptions p = Ints(4);  // indices in [0, 4): inside every case's axis
    ExpectCudaParity(mb.Bytes(), {}, p);
  }
  {
    SCOPED_TRACE("negative indices");
    ModelBuilder mb;
    mb.Input("x", {5, 3});
    mb.Input("i", {4}, kInt64);
    mb.Node("Gather", {"x", "i"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ParityOptions p;
    p.feeds["i"] = HostTensor::FromInt64s({4}, {-1, 0, -5, 4});
    ExpectCudaParity(mb.Bytes(), {}, p);
  }
}

TEST(CudaTensorKernelsTest, GatherElements) {
  SALUS_REQUIRE_GPU();
  const GatherCase cases[] = {
      {"last axis", {4, 6}, {4, 3}, 1, kFloat},
      {"first axis, fewer columns", {5, 6}, {4, 2}, 0, kFloat},
      {"middle axis of 3-D", {2, 5, 3}, {2, 4, 3}, -2, kFloat},
      {"int64 data", {3, 6}, {3, 6}, 1, kInt64},
  };
  for (const GatherCase& c : cases) {
    SCOPED_TRACE(c.scenario);
    ModelBuilder mb;
    mb.Input("x", c.data, c.type);
    mb.Input("i", c.indices, kInt64);
    ModelBuilder::Attr(mb.Node("GatherElements", {"x", "i"}, {"y"}), "axis", c.axis);
    OutputOfRank(mb, "y", c.indices.size(), c.type);
    ExpectCudaParity(mb.Bytes(), {}, Ints(3));  // indices in [0, 3): inside every axis
  }
}

TEST(CudaTensorKernelsTest, ScatterND) {
  SALUS_REQUIRE_GPU();
  ModelBuilder mb;
  mb.Input("x", {4, 3, 5});
  mb.Int64Initializer("i", {3, 2}, {0, 1, 3, -1, 0, 1});  // the first slice written twice
  mb.Input("u", {3, 5});
  mb.Node("ScatterND", {"x", "i", "u"}, {"y"});
  OutputOfRank(mb, "y", 3);
  ExpectCudaParity(mb.Bytes(), {}, ParityOptions{});
}

TEST(CudaTensorKernelsTest, PadInt64) {
  SALUS_REQUIRE_GPU();
  ModelBuilder mb;
  mb.Input("x", {3, 5}, kInt64);
  mb.Int64Initializer("pads", {4}, {1, 0, 0, 2});
  mb.Int64Initializer("value", {}, {-100});
  mb.Node("Pad", {"x", "pads", "value"}, {"y"});
  OutputOfRank(mb, "y", 2, kInt64);
  ExpectCudaParity(mb.Bytes(), {}, Ints(1000));
}

TEST(CudaTensorKernelsTest, Where) {
  SALUS_REQUIRE_GPU();
  struct Case {
    const char* scenario;
    Shape cond, x, y;
    int type;
  };
  const Case cases[] = {
      {"same shapes", {3, 4}, {3, 4}, {3, 4}, kFloat},
      {"broadcast all three", {3, 1, 4}, {1, 5, 4}, {}, kFloat},
      {"causal mask", {1, 1, 6, 6}, {2, 3, 6, 6}, {1}, kFloat},
      {"int64", {4, 1}, {4, 3}, {3}, kInt64},
      {"bool", {2, 3}, {2, 3}, {1, 3}, kBool},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    ModelBuilder mb;
    mb.Input("c", c.cond, kBool);
    mb.Input("x", c.x, c.type);
    mb.Input("y", c.y, c.type);
    mb.Node("Where", {"c", "x", "y"}, {"z"});
    size_t rank = std::max({c.cond.size(), c.x.size(), c.y.size()});
    OutputOfRank(mb, "z", rank, c.type);
    ExpectCudaParity(mb.Bytes(), {}, Ints(1000));
  }
}

TEST(CudaTensorKernelsTest, Expand) {
  SALUS_REQUIRE_GPU();
  for (int type : {kFloat, kInt64, kBool}) {
    SCOPED_TRACE("type " + std::to_string(type));
    ModelBuilder mb;
    mb.Input("x", {3, 1}, type);
    mb.Int64Initializer("shape", {3}, {2, 1, 4});
    mb.Node("Expand", {"x", "shape"}, {"y"});
    OutputOfRank(mb, "y", 3, type);
    ExpectCudaParity(mb.Bytes(), {}, Ints(1000));
  }
}

TEST(CudaTensorKernelsTest, Slice) {
  SALUS_REQUIRE_GPU();
  struct Case {
    const char* scenario;
    std::vector<int64_t> starts, ends, axes, steps;
    int type;
  };
  const Case cases[] = {
      {"one axis", {1}, {4}, {1}, {1}, kFloat},
      {"every axis", {0, 1, 2}, {2, 5, 7}, {0, 1, 2}, {1, 2, 2}, kFloat},
      {"negative step", {-1}, {-100}, {2}, {-1}, kFloat},
      {"negative bounds", {-3, 1}, {-1, 1000}, {-1, 0}, {1, 1}, kFloat},
      {"int64", {1}, {3}, {1}, {1}, kInt64},
      {"bool", {0}, {6}, {2}, {3}, kBool},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    ModelBuilder mb;
    mb.Input("x", {3, 6, 8}, c.type);
    const int64_t k = static_cast<int64_t>(c.starts.size());
    mb.Int64Initializer("starts", {k}, c.starts);
    mb.Int64Initializer("ends", {k}, c.ends);
    mb.Int64Initializer("axes", {k}, c.axes);
    mb.Int64Initializer("steps", {k}, c.steps);
    mb.Node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"});
    OutputOfRank(mb, "y", 3, c.type);
    ExpectCudaParity(mb.Bytes(), {}, Ints(1000));
  }
}

TEST(CudaTensorKernelsTest, Split) {
  SALUS_REQUIRE_GPU();
  for (int64_t axis : {0, 1, -1}) {
    SCOPED_TRACE("sizes input, axis " + std::to_string(axis));
    ModelBuilder mb;
    mb.Input("x", {6, 6, 6});
    mb.Int64Initializer("split", {3}, {1, 2, 3});
    ModelBuilder::Attr(mb.Node("Split", {"x", "split"}, {"a", "b", "c"}), "axis", axis);
    for (const char* o : {"a", "b", "c"}) OutputOfRank(mb, o, 3);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("int64, equal parts");
    ModelBuilder mb;
    mb.Input("x", {4, 6}, kInt64);
    ModelBuilder::Attr(mb.Node("Split", {"x"}, {"a", "b"}), "axis", int64_t{1});
    OutputOfRank(mb, "a", 2, kInt64);
    OutputOfRank(mb, "b", 2, kInt64);
    ExpectCudaParity(mb.Bytes(), {}, Ints(1000));
  }
  {
    SCOPED_TRACE("opset 18 num_outputs, uneven parts");
    ModelBuilder mb;
    SetOpset(mb, 18);
    mb.Input("x", {2, 5});
    auto& n = mb.Node("Split", {"x"}, {"a", "b", "c"});
    ModelBuilder::Attr(n, "axis", int64_t{1});
    ModelBuilder::Attr(n, "num_outputs", int64_t{3});
    for (const char* o : {"a", "b", "c"}) OutputOfRank(mb, o, 2);
    ExpectCudaParity(mb.Bytes());
  }
}

TEST(CudaTensorKernelsTest, Trilu) {
  SALUS_REQUIRE_GPU();
  for (int64_t upper : {0, 1}) {
    for (int type : {kFloat, kInt64}) {
      SCOPED_TRACE("upper " + std::to_string(upper) + " type " + std::to_string(type));
      ModelBuilder mb;
      mb.Input("x", {2, 5, 4}, type);
      mb.Input("k", {}, kInt64);
      ModelBuilder::Attr(mb.Node("Trilu", {"x", "k"}, {"y"}), "upper", upper);
      OutputOfRank(mb, "y", 3, type);
      ParityOptions p = Ints(1000);
      p.feeds["k"] = HostTensor::FromInt64s({}, {upper ? -1 : 2});
      ExpectCudaParity(mb.Bytes(), {}, p);
    }
  }
  {
    SCOPED_TRACE("no k");
    ModelBuilder mb;
    mb.Input("x", {6, 3});
    mb.Node("Trilu", {"x"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes());
  }
}

// ---------------------------------------------------------------------------------------------
// Elementwise math.

TEST(CudaTensorKernelsTest, FloatUnary) {
  SALUS_REQUIRE_GPU();
  {
    SCOPED_TRACE("Erf");
    ModelBuilder mb;
    mb.Input("x", {4, 33});
    mb.Node("Erf", {"x"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes(), {}, Range(-4.f, 4.f));
  }
  for (const char* op : {"Sin", "Cos", "Atan", "Floor", "Ceil", "Round"}) {
    SCOPED_TRACE(op);
    ModelBuilder mb;
    mb.Input("x", {4, 33});
    mb.Node(op, {"x"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes(), {}, Range(-100.f, 100.f));
  }
  for (const char* approximate : {"none", "tanh"}) {
    SCOPED_TRACE(std::string("Gelu ") + approximate);
    ModelBuilder mb;
    SetOpset(mb, 20);
    mb.Input("x", {4, 33});
    ModelBuilder::Attr(mb.Node("Gelu", {"x"}, {"y"}), "approximate", std::string(approximate));
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes(), {}, Range(-5.f, 5.f));
  }
  {
    SCOPED_TRACE("Reciprocal");
    ModelBuilder mb;
    mb.Input("x", {4, 33});
    mb.Node("Reciprocal", {"x"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes(), {}, Range(0.25f, 4.f));
  }
}

TEST(CudaTensorKernelsTest, Cast) {
  SALUS_REQUIRE_GPU();
  struct Case {
    int from, to;
  };
  const Case cases[] = {{kFloat, kInt64}, {kInt64, kFloat}, {kFloat, kBool}, {kBool, kFloat},
                        {kInt64, kBool},  {kBool, kInt64},  {kFloat, kFloat}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.from) + " to " + std::to_string(c.to));
    ModelBuilder mb;
    mb.Input("x", {3, 7}, c.from);
    ModelBuilder::Attr(mb.Node("Cast", {"x"}, {"y"}), "to", int64_t{c.to});
    OutputOfRank(mb, "y", 2, c.to);
    ParityOptions p = Range(-100.f, 100.f);
    p.int_hi = 3;  // zeros among the int64s
    ExpectCudaParity(mb.Bytes(), {}, p);
  }
}

TEST(CudaTensorKernelsTest, Clip) {
  SALUS_REQUIRE_GPU();
  {
    SCOPED_TRACE("both bounds");
    ModelBuilder mb;
    mb.Input("x", {5, 9});
    mb.Initializer("lo", {}, {-0.5f});
    mb.Initializer("hi", {}, {0.25f});
    mb.Node("Clip", {"x", "lo", "hi"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("max only, fed");
    ModelBuilder mb;
    mb.Input("x", {5, 9});
    mb.Input("hi", {});
    mb.Node("Clip", {"x", "", "hi"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("no bounds");
    ModelBuilder mb;
    mb.Input("x", {5, 9});
    mb.Node("Clip", {"x"}, {"y"});
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("int64");
    ModelBuilder mb;
    mb.Input("x", {5, 9}, kInt64);
    mb.Int64Initializer("lo", {}, {10});
    mb.Int64Initializer("hi", {}, {90});
    mb.Node("Clip", {"x", "lo", "hi"}, {"y"});
    OutputOfRank(mb, "y", 2, kInt64);
    ExpectCudaParity(mb.Bytes(), {}, Ints(100));
  }
  {
    SCOPED_TRACE("opset 6 attributes");
    ModelBuilder mb;
    SetOpset(mb, 6);
    mb.Input("x", {5, 9});
    auto& n = mb.Node("Clip", {"x"}, {"y"});
    ModelBuilder::Attr(n, "min", -0.3f);
    ModelBuilder::Attr(n, "max", 0.6f);
    OutputOfRank(mb, "y", 2);
    ExpectCudaParity(mb.Bytes());
  }
}

TEST(CudaTensorKernelsTest, MinMax) {
  SALUS_REQUIRE_GPU();
  for (const char* op : {"Min", "Max"}) {
    {
      SCOPED_TRACE(std::string(op) + " of three, broadcast");
      ModelBuilder mb;
      mb.Input("a", {3, 1, 5});
      mb.Input("b", {4, 1});
      mb.Input("c", {5});
      mb.Node(op, {"a", "b", "c"}, {"y"});
      OutputOfRank(mb, "y", 3);
      ExpectCudaParity(mb.Bytes());
    }
    {
      SCOPED_TRACE(std::string(op) + " of one");
      ModelBuilder mb;
      mb.Input("a", {3, 5});
      mb.Node(op, {"a"}, {"y"});
      OutputOfRank(mb, "y", 2);
      ExpectCudaParity(mb.Bytes());
    }
    {
      SCOPED_TRACE(std::string(op) + " of int64");
      ModelBuilder mb;
      mb.Input("a", {3, 5}, kInt64);
      mb.Input("b", {1, 5}, kInt64);
      mb.Node(op, {"a", "b"}, {"y"});
      OutputOfRank(mb, "y", 2, kInt64);
      ExpectCudaParity(mb.Bytes(), {}, Ints(1000));
    }
  }
}

TEST(CudaTensorKernelsTest, Comparisons) {
  SALUS_REQUIRE_GPU();
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    for (int type : {kFloat, kInt64}) {
      SCOPED_TRACE(std::string(op) + " type " + std::to_string(type));
      ModelBuilder mb;
      mb.Input("a", {3, 1, 6}, type);
      mb.Input("b", {4, 6}, type);
      mb.Node(op, {"a", "b"}, {"y"});
      OutputOfRank(mb, "y", 3, kBool);
      ExpectCudaParity(mb.Bytes(), {}, Ints(3));  // int64s equal often
    }
  }
  {
    SCOPED_TRACE("Equal of bools");
    ModelBuilder mb;
    mb.Input("a", {2, 7}, kBool);
    mb.Input("b", {7}, kBool);
    mb.Node("Equal", {"a", "b"}, {"y"});
    OutputOfRank(mb, "y", 2, kBool);
    ExpectCudaParity(mb.Bytes());
  }
}

TEST(CudaTensorKernelsTest, Logic) {
  SALUS_REQUIRE_GPU();
  for (const char* op : {"And", "Or"}) {
    SCOPED_TRACE(op);
    ModelBuilder mb;
    mb.Input("a", {3, 1, 6}, kBool);
    mb.Input("b", {5, 6}, kBool);
    mb.Node(op, {"a", "b"}, {"y"});
    OutputOfRank(mb, "y", 3, kBool);
    ExpectCudaParity(mb.Bytes());
  }
  {
    SCOPED_TRACE("Not");
    ModelBuilder mb;
    mb.Input("a", {4, 9}, kBool);
    mb.Node("Not", {"a"}, {"y"});
    OutputOfRank(mb, "y", 2, kBool);
    ExpectCudaParity(mb.Bytes());
  }
}

TEST(CudaTensorKernelsTest, Mod) {
  SALUS_REQUIRE_GPU();
  {
    SCOPED_TRACE("float fmod");
    ModelBuilder mb;
    mb.Input("a", {4, 6});
    mb.Input("b", {6});
    ModelBuilder::Attr(mb.Node("Mod", {"a", "b"}, {"y"}), "fmod", int64_t{1});
    OutputOfRank(mb, "y", 2);
    ParityOptions p = Range(-10.f, 10.f);
    p.feeds["b"] = HostTensor::FromFloats({6}, {3.f, -3.f, 0.5f, 7.f, -1.25f, 2.f});
    ExpectCudaParity(mb.Bytes(), {}, p);
  }
  for (int64_t fmod : {0, 1}) {
    SCOPED_TRACE("int64 fmod " + std::to_string(fmod));
    ModelBuilder mb;
    mb.Input("a", {4, 6}, kInt64);
    mb.Input("b", {6}, kInt64);
    ModelBuilder::Attr(mb.Node("Mod", {"a", "b"}, {"y"}), "fmod", fmod);
    OutputOfRank(mb, "y", 2, kInt64);
    ParityOptions p = Ints(100);
    p.feeds["b"] = HostTensor::FromInt64s({6}, {3, -3, 7, -1, 10, -8});
    ExpectCudaParity(mb.Bytes(), {}, p);
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNormalization and LSTM.

TEST(CudaTensorKernelsTest, LayerNormalization) {
  SALUS_REQUIRE_GPU();
  struct Case {
    const char* scenario;
    Shape x;
    int64_t axis;
    bool bias, stats;
  };
  const Case cases[] = {
      {"last axis with bias", {4, 7, 64}, -1, true, false},
      {"two axes, no bias", {3, 5, 6}, 1, false, false},
      {"long rows and statistics", {2, 1000}, -1, true, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    ModelBuilder mb;
    mb.Input("x", c.x);
    int64_t inner = 1;
    const int64_t axis = c.axis < 0 ? c.axis + static_cast<int64_t>(c.x.size()) : c.axis;
    Shape param(c.x.begin() + axis, c.x.end());
    for (int64_t d : param) inner *= d;
    mb.Initializer("scale", param, testing::RandomFloats(inner, 7, 0.5f, 1.5f));
    std::vector<std::string> inputs = {"x", "scale"};
    if (c.bias) {
      mb.Initializer("bias", param, testing::RandomFloats(inner, 8));
      inputs.push_back("bias");
    }
    std::vector<std::string> outputs = {"y"};
    if (c.stats) outputs = {"y", "mean", "inv_std"};
    auto& n = mb.Node("LayerNormalization", inputs, outputs);
    ModelBuilder::Attr(n, "axis", c.axis);
    ModelBuilder::Attr(n, "epsilon", 1e-3f);
    OutputOfRank(mb, "y", c.x.size());
    if (c.stats) {
      OutputOfRank(mb, "mean", c.x.size());
      OutputOfRank(mb, "inv_std", c.x.size());
    }
    ExpectCudaParity(mb.Bytes(), {}, Range(-3.f, 5.f));
  }
}

TEST(CudaTensorKernelsTest, Lstm) {
  SALUS_REQUIRE_GPU();
  struct Case {
    const char* scenario;
    std::string direction;
    int64_t layout;
    bool bias, initial;
  };
  const Case cases[] = {
      {"forward", "forward", 0, true, true},
      {"reverse without bias or states", "reverse", 0, false, false},
      {"bidirectional", "bidirectional", 0, true, true},
      {"bidirectional, batch-major", "bidirectional", 1, true, true},
  };
  const int64_t seq = 5, batch = 3, input = 4, hidden = 6;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    const int64_t dirs = c.direction == "bidirectional" ? 2 : 1;
    ModelBuilder mb;
    SetOpset(mb, 14);
    mb.Input("x", c.layout == 0 ? Shape{seq, batch, input} : Shape{batch, seq, input});
    mb.Input("w", {dirs, 4 * hidden, input});
    mb.Input("r", {dirs, 4 * hidden, hidden});
    std::vector<std::string> inputs = {"x", "w", "r"};
    if (c.bias || c.initial) {
      if (c.bias) mb.Input("b", {dirs, 8 * hidden});
      inputs.push_back(c.bias ? "b" : "");
    }
    if (c.initial) {
      const Shape state = c.layout == 0 ? Shape{dirs, batch, hidden} : Shape{batch, dirs, hidden};
      mb.Input("h0", state);
      mb.Input("c0", state);
      inputs.insert(inputs.end(), {"", "h0", "c0"});
    }
    auto& n = mb.Node("LSTM", inputs, {"y", "y_h", "y_c"});
    ModelBuilder::Attr(n, "hidden_size", hidden);
    ModelBuilder::Attr(n, "direction", c.direction);
    ModelBuilder::Attr(n, "layout", c.layout);
    OutputOfRank(mb, "y", 4);
    OutputOfRank(mb, "y_h", 3);
    OutputOfRank(mb, "y_c", 3);
    ExpectCudaParity(mb.Bytes());
  }
}

// ---------------------------------------------------------------------------------------------
// Generators, node by node: their inputs are constants, so in a model they fold at import.

// Runs node `op` of `opset` with constant inputs `args` on the CPU and on cuda:0 and expects the
// same bytes from each output.
void ExpectNodeParity(int opset, const std::string& op, std::map<std::string, Attribute> attrs,
                      const std::vector<HostTensor>& args) {
  Graph g;
  g.set_opset(opset);
  Node n;
  n.op = op;
  n.name = "n";
  n.attrs = std::move(attrs);
  for (size_t i = 0; i < args.size(); ++i) {
    Value v;
    v.name = "in" + std::to_string(i);
    v.type = args[i].type;
    v.shape = args[i].shape;
    v.kind = ValueKind::kConstant;
    v.data = args[i];
    n.inputs.push_back(g.AddValue(std::move(v)));
  }
  Value out;
  out.name = "out";
  out.type = DataType::kUndefined;
  n.outputs.push_back(g.AddValue(std::move(out)));
  const int idx = g.AddNode(std::move(n));
  ASSERT_TRUE(InferNodeShapes(&g, idx).ok());
  const Node& node = g.nodes()[idx];
  const Value& result = g.value(node.outputs[0]);

  auto cpu = KernelRegistry::Global().Create(node, g, DeviceType::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  KernelArgs ca;
  for (const HostTensor& t : args) ca.inputs.push_back(const_cast<std::byte*>(t.bytes.data()));
  HostTensor want(result.type, result.shape);
  ca.outputs.push_back(want.bytes.data());
  ASSERT_EQ((*cpu)->scratch_bytes(), 0u);
  ASSERT_TRUE((*cpu)->Run(ca).ok());

  auto rt = DeviceRuntime::For(Device{DeviceType::kCuda, 0});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto ctx = (*rt)->ThreadContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto gpu = KernelRegistry::Global().Create(node, g, DeviceType::kCuda, *ctx);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<DeviceBuffer> buffers;
  KernelArgs ga;
  ga.ctx = *ctx;
  for (const HostTensor& t : args) {
    auto b = DeviceBuffer::Allocate(*rt, std::max<size_t>(t.bytes.size(), 1));
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE((*rt)->CopyToDevice(*ctx, b->get(), t.bytes.data(), t.bytes.size()).ok());
    ga.inputs.push_back(b->get());
    buffers.push_back(std::move(*b));
  }
  auto y = DeviceBuffer::Allocate(*rt, std::max<size_t>(want.bytes.size(), 1));
  ASSERT_TRUE(y.ok()) << y.status();
  ga.outputs.push_back(y->get());
  ASSERT_TRUE((*gpu)->Run(ga).ok());
  HostTensor got(result.type, result.shape);
  ASSERT_TRUE((*rt)->CopyToHost(*ctx, got.bytes.data(), y->get(), got.bytes.size()).ok());
  ASSERT_TRUE((*rt)->Synchronize(*ctx).ok());
  EXPECT_EQ(want.bytes, got.bytes);
}

Attribute TensorAttr(HostTensor t) {
  Attribute a;
  a.kind = Attribute::Kind::kTensor;
  a.t = std::move(t);
  return a;
}

TEST(CudaTensorKernelsTest, Generators) {
  SALUS_REQUIRE_GPU();
  {
    SCOPED_TRACE("Range of int64");
    ExpectNodeParity(17, "Range", {},
                     {HostTensor::FromInt64s({}, {-7}), HostTensor::FromInt64s({}, {40}),
                      HostTensor::FromInt64s({}, {3})});
  }
  {
    SCOPED_TRACE("Range of float, descending");
    ExpectNodeParity(17, "Range", {},
                     {HostTensor::FromFloats({}, {2.5f}), HostTensor::FromFloats({}, {-3.f}),
                      HostTensor::FromFloats({}, {-0.25f})});
  }
  {
    SCOPED_TRACE("ConstantOfShape, default zeros");
    ExpectNodeParity(17, "ConstantOfShape", {}, {HostTensor::FromInt64s({2}, {3, 5})});
  }
  {
    SCOPED_TRACE("ConstantOfShape of int64");
    ExpectNodeParity(17, "ConstantOfShape",
                     {{"value", TensorAttr(HostTensor::FromInt64s({1}, {-42}))}},
                     {HostTensor::FromInt64s({3}, {2, 3, 4})});
  }
  {
    SCOPED_TRACE("ConstantOfShape of float");
    ExpectNodeParity(17, "ConstantOfShape",
                     {{"value", TensorAttr(HostTensor::FromFloats({1}, {1.5f}))}},
                     {HostTensor::FromInt64s({1}, {7})});
  }
  {
    SCOPED_TRACE("Shape");
    ExpectNodeParity(17, "Shape", {}, {HostTensor(DataType::kFloat32, {2, 3, 4, 5})});
  }
  {
    SCOPED_TRACE("Shape with start");
    ExpectNodeParity(17, "Shape", {{"start", IntAttr(1)}},
                     {HostTensor(DataType::kFloat32, {2, 3, 4, 5})});
  }
}

}  // namespace
}  // namespace salus::exec
