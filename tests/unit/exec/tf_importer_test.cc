// The TensorFlow GraphDef importer (tf_importer.h) through Executable::CompileTf: a training
// step written as TensorFlow ops against the same step in plain loops, the shape-folding ops,
// NHWC convolution and pooling and their gradients against direct loops, variable snapshots,
// int32 mapping and refusals. GraphDefs are built with the importer's own wire-compatible
// messages (tf_graph.proto).
#include "exec/tf_importer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "exec/fusion.h"
#include "exec/philox_math.h"
#include "exec/tf_graph.pb.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

namespace tf = ::salus::tfgraph;
using testing::Memory;
using testing::RandomFloats;
using testing::RunHost;

// Builds a GraphDef node by node.
class TfGraph {
 public:
  tf::NodeDef* Node(const std::string& name, const std::string& op,
                    const std::vector<std::string>& inputs = {}) {
    tf::NodeDef* n = gd_.add_node();
    n->set_name(name);
    n->set_op(op);
    for (const std::string& in : inputs) n->add_input(in);
    return n;
  }
  static void Type(tf::NodeDef* n, const std::string& key, tf::DataType t) {
    (*n->mutable_attr())[key].set_type(t);
  }
  static void Bool(tf::NodeDef* n, const std::string& key, bool v) {
    (*n->mutable_attr())[key].set_b(v);
  }
  static void Int(tf::NodeDef* n, const std::string& key, int64_t v) {
    (*n->mutable_attr())[key].set_i(v);
  }
  static void Str(tf::NodeDef* n, const std::string& key, const std::string& v) {
    (*n->mutable_attr())[key].set_s(v);
  }
  static void Ints(tf::NodeDef* n, const std::string& key, const std::vector<int64_t>& v) {
    auto* list = (*n->mutable_attr())[key].mutable_list();
    for (int64_t x : v) list->add_i(x);
  }
  static void ShapeAttr(tf::NodeDef* n, const std::string& key, const Shape& s) {
    auto* shape = (*n->mutable_attr())[key].mutable_shape();
    for (int64_t d : s) shape->add_dim()->set_size(d);
  }

  tf::NodeDef* Placeholder(const std::string& name, tf::DataType t = tf::DT_FLOAT) {
    tf::NodeDef* n = Node(name, "Placeholder");
    Type(n, "dtype", t);
    return n;
  }
  tf::NodeDef* Var(const std::string& name, const Shape& shape, tf::DataType t = tf::DT_FLOAT) {
    tf::NodeDef* n = Node(name, "VarHandleOp");
    Type(n, "dtype", t);
    ShapeAttr(n, "shape", shape);
    return n;
  }
  tf::NodeDef* Read(const std::string& name, const std::string& var,
                    tf::DataType t = tf::DT_FLOAT) {
    tf::NodeDef* n = Node(name, "ReadVariableOp", {var});
    Type(n, "dtype", t);
    return n;
  }
  tf::NodeDef* ConstF(const std::string& name, const Shape& shape,
                      const std::vector<float>& values) {
    tf::NodeDef* n = Node(name, "Const");
    auto* t = (*n->mutable_attr())["value"].mutable_tensor();
    t->set_dtype(tf::DT_FLOAT);
    for (int64_t d : shape) t->mutable_tensor_shape()->add_dim()->set_size(d);
    for (float v : values) t->add_float_val(v);
    Type(n, "dtype", tf::DT_FLOAT);
    return n;
  }
  // int32 values in int_val, or in tensor_content when `content`.
  tf::NodeDef* ConstI(const std::string& name, const Shape& shape,
                      const std::vector<int32_t>& values, bool content = false) {
    tf::NodeDef* n = Node(name, "Const");
    auto* t = (*n->mutable_attr())["value"].mutable_tensor();
    t->set_dtype(tf::DT_INT32);
    for (int64_t d : shape) t->mutable_tensor_shape()->add_dim()->set_size(d);
    if (content) {
      std::string bytes(values.size() * 4, '\0');
      std::memcpy(bytes.data(), values.data(), bytes.size());
      t->set_tensor_content(bytes);
    } else {
      for (int32_t v : values) t->add_int_val(v);
    }
    Type(n, "dtype", tf::DT_INT32);
    return n;
  }
  tf::NodeDef* ConstI64(const std::string& name, const Shape& shape,
                        const std::vector<int64_t>& values) {
    tf::NodeDef* n = Node(name, "Const");
    auto* t = (*n->mutable_attr())["value"].mutable_tensor();
    t->set_dtype(tf::DT_INT64);
    for (int64_t d : shape) t->mutable_tensor_shape()->add_dim()->set_size(d);
    for (int64_t v : values) t->add_int64_val(v);
    Type(n, "dtype", tf::DT_INT64);
    return n;
  }

  std::string Bytes() const { return gd_.SerializeAsString(); }

 private:
  tf::GraphDef gd_;
};

StatusOr<std::unique_ptr<Executable>> Compile(const TfGraph& g,
                                              const std::map<std::string, Shape>& shapes,
                                              const std::vector<std::string>& fetches) {
  CompileOptions o;
  o.input_shapes = shapes;
  o.fetches = fetches;
  return Executable::CompileTf(g.Bytes(), o);
}

#define ASSERT_OK_AND_ASSIGN_TF(lhs, expr)                    \
  auto lhs##_or = (expr);                                     \
  ASSERT_TRUE(lhs##_or.ok()) << lhs##_or.status().ToString(); \
  auto lhs = std::move(lhs##_or).value()

HostTensor Int64Tensor(const Shape& s, const std::vector<int64_t>& v) {
  return HostTensor::FromInt64s(s, v);
}

std::vector<float> Floats(const HostTensor& t) {
  return std::vector<float>(t.floats(), t.floats() + t.num_elements());
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, float tol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1.f + std::fabs(want[i]))) << what << " at " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// A Dense+relu, Dense, sparse cross-entropy training step with SGD, as TensorFlow's gradient
// tape writes it, against the same step in loops.

constexpr int64_t kBatch = 4, kIn = 3, kHidden = 5, kClasses = 3;
constexpr float kLearningRate = 0.1f;

TfGraph MlpStep() {
  TfGraph g;
  g.Placeholder("x");
  g.Placeholder("labels", tf::DT_INT32);
  g.Var("w1", {kIn, kHidden});
  g.Var("b1", {kHidden});
  g.Var("w2", {kHidden, kClasses});
  g.Var("b2", {kClasses});
  g.Var("iterations", {}, tf::DT_INT64);
  for (const char* v : {"w1", "b1", "w2", "b2"}) g.Read(std::string("read_") + v, v);
  g.Node("mm1", "MatMul", {"x", "read_w1"});
  g.Node("pre1", "BiasAdd", {"mm1", "read_b1"});
  g.Node("h", "Relu", {"pre1"});
  g.Node("mm2", "MatMul", {"h", "read_w2"});
  g.Node("logits", "BiasAdd", {"mm2", "read_b2"});
  g.Node("xent", "SparseSoftmaxCrossEntropyWithLogits", {"logits", "labels"});
  g.ConstI("axis0", {1}, {0});
  g.Node("loss", "Mean", {"xent", "axis0"});
  // Gradients of the mean loss.
  g.ConstF("inv_batch", {}, {1.f / kBatch});
  g.Node("dlogits", "Mul", {"xent:1", "inv_batch"});
  TfGraph::Bool(g.Node("dw2", "MatMul", {"h", "dlogits"}), "transpose_a", true);
  g.Node("db2", "BiasAddGrad", {"dlogits"});
  TfGraph::Bool(g.Node("dh", "MatMul", {"dlogits", "read_w2"}), "transpose_b", true);
  g.Node("dpre1", "ReluGrad", {"dh", "h"});
  TfGraph::Bool(g.Node("dw1", "MatMul", {"x", "dpre1"}), "transpose_a", true);
  g.Node("db1", "BiasAddGrad", {"dpre1"});
  g.ConstF("lr", {}, {kLearningRate});
  for (const char* v : {"w1", "b1", "w2", "b2"}) {
    const std::string s(v);
    g.Node("step_" + s, "Mul", {"lr", "d" + s});
    g.Node("update_" + s, "AssignSubVariableOp", {s, "step_" + s});
  }
  g.ConstI64("one", {}, {1});
  g.Node("count", "AssignAddVariableOp", {"iterations", "one"});
  return g;
}

struct Mlp {
  std::vector<float> w1, b1, w2, b2;
  // One SGD step on (x, labels); returns the mean loss before the update.
  float Step(const std::vector<float>& x, const std::vector<int64_t>& labels) {
    std::vector<float> h(kBatch * kHidden), logits(kBatch * kClasses), d(kBatch * kClasses);
    float loss = 0;
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t j = 0; j < kHidden; ++j) {
        float s = b1[j];
        for (int64_t i = 0; i < kIn; ++i) s += x[b * kIn + i] * w1[i * kHidden + j];
        h[b * kHidden + j] = std::max(s, 0.f);
      }
      float mx = -1e30f;
      for (int64_t c = 0; c < kClasses; ++c) {
        float s = b2[c];
        for (int64_t j = 0; j < kHidden; ++j) s += h[b * kHidden + j] * w2[j * kClasses + c];
        logits[b * kClasses + c] = s;
        mx = std::max(mx, s);
      }
      double z = 0;
      for (int64_t c = 0; c < kClasses; ++c) z += std::exp(logits[b * kClasses + c] - mx);
      loss += static_cast<float>(std::log(z) + mx - logits[b * kClasses + labels[b]]);
      for (int64_t c = 0; c < kClasses; ++c) {
        const float p = static_cast<float>(std::exp(logits[b * kClasses + c] - mx) / z);
        d[b * kClasses + c] = (p - (c == labels[b] ? 1.f : 0.f)) / kBatch;
      }
    }
    std::vector<float> dh(kBatch * kHidden, 0.f);
    std::vector<float> gw2(w2.size(), 0.f), gb2(b2.size(), 0.f), gw1(w1.size(), 0.f),
        gb1(b1.size(), 0.f);
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t c = 0; c < kClasses; ++c) {
        gb2[c] += d[b * kClasses + c];
        for (int64_t j = 0; j < kHidden; ++j) {
          gw2[j * kClasses + c] += h[b * kHidden + j] * d[b * kClasses + c];
          dh[b * kHidden + j] += d[b * kClasses + c] * w2[j * kClasses + c];
        }
      }
    }
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t j = 0; j < kHidden; ++j) {
        const float dp = h[b * kHidden + j] > 0 ? dh[b * kHidden + j] : 0.f;
        gb1[j] += dp;
        for (int64_t i = 0; i < kIn; ++i) gw1[i * kHidden + j] += x[b * kIn + i] * dp;
      }
    }
    auto apply = [](std::vector<float>& p, const std::vector<float>& gr) {
      for (size_t i = 0; i < p.size(); ++i) p[i] -= kLearningRate * gr[i];
    };
    apply(w1, gw1);
    apply(b1, gb1);
    apply(w2, gw2);
    apply(b2, gb2);
    return loss / kBatch;
  }
};

TEST(TfImporterTest, MlpTrainingStepMatchesLoops) {
  ASSERT_OK_AND_ASSIGN_TF(
      exe, Compile(MlpStep(), {{"x", {kBatch, kIn}}, {"labels", {kBatch}}}, {"loss", "logits:0"}));
  ASSERT_EQ(exe->inputs().size(), 2u);
  EXPECT_EQ(exe->inputs()[0].name, "x");
  EXPECT_EQ(exe->inputs()[1].type, DataType::kInt64);  // int32 is carried as int64
  Memory mem(*exe);
  Mlp ref{RandomFloats(kIn * kHidden, 1), RandomFloats(kHidden, 2),
          RandomFloats(kHidden * kClasses, 3), RandomFloats(kClasses, 4)};
  ASSERT_TRUE(
      exe->WritePersistent(mem.p(), "w1", HostTensor::FromFloats({kIn, kHidden}, ref.w1)).ok());
  ASSERT_TRUE(exe->WritePersistent(mem.p(), "b1", HostTensor::FromFloats({kHidden}, ref.b1)).ok());
  ASSERT_TRUE(
      exe->WritePersistent(mem.p(), "w2", HostTensor::FromFloats({kHidden, kClasses}, ref.w2))
          .ok());
  ASSERT_TRUE(exe->WritePersistent(mem.p(), "b2", HostTensor::FromFloats({kClasses}, ref.b2)).ok());
  const std::vector<float> x = RandomFloats(kBatch * kIn, 5);
  const std::vector<int64_t> labels = {0, 2, 1, 2};
  for (int step = 0; step < 3; ++step) {
    const float want = ref.Step(x, labels);
    ASSERT_OK_AND_ASSIGN_TF(
        out, RunHost(*exe, mem,
                     {HostTensor::FromFloats({kBatch, kIn}, x), Int64Tensor({kBatch}, labels)}));
    EXPECT_NEAR(out[0].floats()[0], want, 1e-5f * (1 + std::fabs(want))) << "step " << step;
    EXPECT_EQ(out[1].shape, Shape({kBatch, kClasses}));
  }
  ASSERT_OK_AND_ASSIGN_TF(w1, exe->ReadPersistent(mem.p(), "w1"));
  ASSERT_OK_AND_ASSIGN_TF(b2, exe->ReadPersistent(mem.p(), "b2"));
  ASSERT_OK_AND_ASSIGN_TF(iterations, exe->ReadPersistent(mem.p(), "iterations"));
  ExpectNear(Floats(w1), ref.w1, 1e-5f, "w1");
  ExpectNear(Floats(b2), ref.b2, 1e-5f, "b2");
  EXPECT_EQ(iterations.int64s()[0], 3);
}

// The same step refused in training mode: TensorFlow graphs carry their own gradients.
TEST(TfImporterTest, TrainingModeIsRefused) {
  CompileOptions o;
  o.input_shapes = {{"x", {kBatch, kIn}}, {"labels", {kBatch}}};
  o.mode = Mode::kTraining;
  auto exe = Executable::CompileTf(MlpStep().Bytes(), o);
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Shape arithmetic folds to constants.

StatusOr<Graph> Import(const TfGraph& g, const std::map<std::string, Shape>& shapes) {
  TfImportOptions o;
  o.input_shapes = shapes;
  const std::string bytes = g.Bytes();
  return TfImporter::Import(bytes.data(), bytes.size(), o);
}

std::vector<int64_t> ConstantInts(const Graph& g, const std::string& name) {
  const ValueId id = g.Find(name);
  if (id == kNoValue || g.value(id).kind != ValueKind::kConstant) {
    ADD_FAILURE() << name << " is not a constant";
    return {};
  }
  return g.value(id).data.ToInt64s();
}

TEST(TfImporterTest, ShapeArithmeticFolds) {
  TfGraph g;
  g.Placeholder("x");
  g.Node("shape", "Shape", {"x"});
  g.ConstI("b0", {1}, {0});
  g.ConstI("e1", {1}, {1});
  g.ConstI("s1", {1}, {1});
  TfGraph::Int(g.Node("batch", "StridedSlice", {"shape", "b0", "e1", "s1"}), "shrink_axis_mask", 1);
  g.ConstI("minus1", {}, {-1});
  g.Node("packed", "Pack", {"batch", "minus1"});
  g.Node("flat", "Reshape", {"x", "packed"});
  g.Node("prod", "Prod", {"shape", "b0"});
  g.ConstI("sa", {3}, {2, 3, 4}, /*content=*/true);
  g.ConstI("sb", {2}, {3, 1});
  g.Node("bga", "BroadcastGradientArgs", {"sa", "sb"});
  g.ConstI("multiples", {2}, {2, 3});
  g.ConstF("small", {1, 2}, {1.f, 2.f});
  g.Node("tiled", "Tile", {"small", "multiples"});
  g.ConstI("target", {2}, {3, 2});
  g.Node("bcast", "BroadcastTo", {"small", "target"});
  g.Node("shapes", "ShapeN", {"x", "small"});
  g.Node("size", "Size", {"x"});
  g.Node("rank", "Rank", {"x"});
  ASSERT_OK_AND_ASSIGN_TF(graph, Import(g, {{"x", {2, 3, 4}}}));
  EXPECT_EQ(ConstantInts(graph, "shape"), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(ConstantInts(graph, "batch"), (std::vector<int64_t>{2}));
  EXPECT_EQ(graph.value(graph.Find("batch")).shape, Shape{});
  EXPECT_EQ(ConstantInts(graph, "packed"), (std::vector<int64_t>{2, -1}));
  EXPECT_EQ(graph.value(graph.Find("flat")).shape, Shape({2, 12}));
  EXPECT_EQ(ConstantInts(graph, "prod"), (std::vector<int64_t>{24}));
  EXPECT_EQ(ConstantInts(graph, "bga:0"), (std::vector<int64_t>{}));
  EXPECT_EQ(ConstantInts(graph, "bga:1"), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(ConstantInts(graph, "shapes:1"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ConstantInts(graph, "size"), (std::vector<int64_t>{24}));
  EXPECT_EQ(ConstantInts(graph, "rank"), (std::vector<int64_t>{3}));
  // Tile and BroadcastTo of constants fold too.
  const Value& tiled = graph.value(graph.Find("tiled"));
  ASSERT_EQ(tiled.kind, ValueKind::kConstant);
  EXPECT_EQ(tiled.shape, Shape({2, 6}));
  EXPECT_EQ(Floats(tiled.data), (std::vector<float>{1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2}));
  const Value& bcast = graph.value(graph.Find("bcast:0"));
  ASSERT_EQ(bcast.kind, ValueKind::kConstant);
  EXPECT_EQ(Floats(bcast.data), (std::vector<float>{1, 2, 1, 2, 1, 2}));
}

// StridedSlice with masks on run-time data, against numpy's reading of the same slices.
TEST(TfImporterTest, StridedSliceMasks) {
  TfGraph g;
  g.Placeholder("x");
  struct Case {
    std::string name;
    std::vector<int32_t> begin, end, strides;
    int64_t begin_mask = 0, end_mask = 0, ellipsis = 0, new_axis = 0, shrink = 0;
  };
  const std::vector<Case> cases = {
      // x[1:3, :, ::-2]
      {"a", {1, 0, 0}, {3, 0, 0}, {1, 1, -2}, 0b110, 0b110},
      // x[..., 2]
      {"b", {0, 2}, {0, 3}, {1, 1}, 0, 0, 0b1, 0, 0b10},
      // x[:, tf.newaxis, -1]
      {"c", {0, 0, -1}, {0, 0, 0}, {1, 1, 1}, 0b1, 0b1, 0, 0b10, 0b100},
  };
  std::vector<std::string> fetches;
  for (const Case& c : cases) {
    const int n = static_cast<int>(c.begin.size());
    g.ConstI(c.name + "_b", {n}, c.begin);
    g.ConstI(c.name + "_e", {n}, c.end);
    g.ConstI(c.name + "_s", {n}, c.strides);
    tf::NodeDef* s =
        g.Node(c.name, "StridedSlice", {"x", c.name + "_b", c.name + "_e", c.name + "_s"});
    TfGraph::Int(s, "begin_mask", c.begin_mask);
    TfGraph::Int(s, "end_mask", c.end_mask);
    TfGraph::Int(s, "ellipsis_mask", c.ellipsis);
    TfGraph::Int(s, "new_axis_mask", c.new_axis);
    TfGraph::Int(s, "shrink_axis_mask", c.shrink);
    fetches.push_back(c.name);
  }
  ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g, {{"x", {4, 5, 6}}}, fetches));
  Memory mem(*exe);
  std::vector<float> x(4 * 5 * 6);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return x[(i * 5 + j) * 6 + k]; };
  ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem, {HostTensor::FromFloats({4, 5, 6}, x)}));
  std::vector<float> a, b, c;
  for (int64_t i = 1; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t k = 5; k >= 0; k -= 2) a.push_back(at(i, j, k));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 5; ++j) b.push_back(at(i, j, 2));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t k = 0; k < 6; ++k) c.push_back(at(i, 4, k));
  EXPECT_EQ(out[0].shape, Shape({2, 5, 3}));
  EXPECT_EQ(Floats(out[0]), a);
  EXPECT_EQ(out[1].shape, Shape({4, 5}));
  EXPECT_EQ(Floats(out[1]), b);
  EXPECT_EQ(out[2].shape, Shape({4, 1, 6}));
  EXPECT_EQ(Floats(out[2]), c);
}

// ---------------------------------------------------------------------------------------------
// NHWC convolution and pooling, and their gradients, against direct loops.

TEST(TfImporterTest, Conv2DAndMaxPoolNhwcWithGradients) {
  constexpr int64_t N = 2, H = 5, W = 5, C = 3, K = 3, O = 4, S = 2, OH = 3, OW = 3, PAD = 1;
  TfGraph g;
  g.Placeholder("x");
  g.Placeholder("f");
  g.Placeholder("dy");
  auto conv_attrs = [](tf::NodeDef* n) {
    TfGraph::Ints(n, "strides", {1, S, S, 1});
    TfGraph::Str(n, "padding", "SAME");
  };
  conv_attrs(g.Node("conv", "Conv2D", {"x", "f"}));
  g.ConstI("x_sizes", {4}, {N, H, W, C});
  g.ConstI("f_sizes", {4}, {K, K, C, O});
  conv_attrs(g.Node("dx", "Conv2DBackpropInput", {"x_sizes", "f", "dy"}));
  conv_attrs(g.Node("df", "Conv2DBackpropFilter", {"x", "f_sizes", "dy"}));
  // 2x2 max pooling, stride 2, VALID, of x: [2, 2, 2, 3].
  auto pool_attrs = [](tf::NodeDef* n) {
    TfGraph::Ints(n, "ksize", {1, 2, 2, 1});
    TfGraph::Ints(n, "strides", {1, 2, 2, 1});
    TfGraph::Str(n, "padding", "VALID");
  };
  pool_attrs(g.Node("pool", "MaxPool", {"x"}));
  g.Placeholder("dpool");
  pool_attrs(g.Node("dxpool", "MaxPoolGrad", {"x", "pool", "dpool"}));
  // Readers of the convolutions' outputs, as a step has (a fetched output stays as it is).
  g.ConstF("one", {}, {1.f});
  g.Node("conv_out", "Mul", {"conv", "one"});
  g.Node("dx_out", "Mul", {"dx", "one"});
  g.Node("pool_out", "Mul", {"pool", "one"});
  g.Node("dxpool_out", "Mul", {"dxpool", "one"});
  ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g,
                                       {{"x", {N, H, W, C}},
                                        {"f", {K, K, C, O}},
                                        {"dy", {N, OH, OW, O}},
                                        {"dpool", {N, 2, 2, C}}},
                                       {"conv_out", "dx_out", "df", "pool_out", "dxpool_out"}));
  Memory mem(*exe);
  const std::vector<float> x = RandomFloats(N * H * W * C, 11), f = RandomFloats(K * K * C * O, 12);
  const std::vector<float> dy = RandomFloats(N * OH * OW * O, 13),
                           dp = RandomFloats(N * 2 * 2 * C, 14);
  ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem,
                                       {HostTensor::FromFloats({N, H, W, C}, x),
                                        HostTensor::FromFloats({K, K, C, O}, f),
                                        HostTensor::FromFloats({N, OH, OW, O}, dy),
                                        HostTensor::FromFloats({N, 2, 2, C}, dp)}));
  auto xi = [&](int64_t n, int64_t h, int64_t w, int64_t c) {
    return ((n * H + h) * W + w) * C + c;
  };
  auto fi = [&](int64_t kh, int64_t kw, int64_t c, int64_t o) {
    return ((kh * K + kw) * C + c) * O + o;
  };
  auto yi = [&](int64_t n, int64_t h, int64_t w, int64_t o) {
    return ((n * OH + h) * OW + w) * O + o;
  };
  std::vector<float> y(N * OH * OW * O, 0.f), dx(x.size(), 0.f), df(f.size(), 0.f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t kh = 0; kh < K; ++kh)
          for (int64_t kw = 0; kw < K; ++kw) {
            const int64_t h = oh * S - PAD + kh, w = ow * S - PAD + kw;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            for (int64_t c = 0; c < C; ++c)
              for (int64_t o = 0; o < O; ++o) {
                y[yi(n, oh, ow, o)] += x[xi(n, h, w, c)] * f[fi(kh, kw, c, o)];
                dx[xi(n, h, w, c)] += dy[yi(n, oh, ow, o)] * f[fi(kh, kw, c, o)];
                df[fi(kh, kw, c, o)] += x[xi(n, h, w, c)] * dy[yi(n, oh, ow, o)];
              }
          }
  ExpectNear(Floats(out[0]), y, 1e-5f, "conv");
  ExpectNear(Floats(out[1]), dx, 1e-5f, "Conv2DBackpropInput");
  ExpectNear(Floats(out[2]), df, 1e-5f, "Conv2DBackpropFilter");
  // On the CPU the three convolutions, the pooling and its gradient read and write NHWC
  // themselves (Note [Channels-last convolutions]): the importer's Transposes around them are
  // left unread.
  // The forward and data gradient read the filter as HWIO; the filter gradient, fetched as
  // HWIO, stays OIHW and Transposed.
  int channels_last = 0, hwio = 0;
  for (const auto& node : exe->graph().nodes()) {
    if (node.GetInt(kChannelsLastAttr, 0) != 0) ++channels_last;
    if (node.GetInt(kFilterHwioAttr, 0) != 0) ++hwio;
  }
  EXPECT_EQ(channels_last, 5);
  EXPECT_EQ(hwio, 2);
  std::vector<float> pool(N * 2 * 2 * C), dxpool(x.size(), 0.f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ph = 0; ph < 2; ++ph)
      for (int64_t pw = 0; pw < 2; ++pw)
        for (int64_t c = 0; c < C; ++c) {
          int64_t best = xi(n, 2 * ph, 2 * pw, c);
          for (int64_t kh = 0; kh < 2; ++kh)
            for (int64_t kw = 0; kw < 2; ++kw) {
              const int64_t at = xi(n, 2 * ph + kh, 2 * pw + kw, c);
              if (x[at] > x[best]) best = at;
            }
          const int64_t o = ((n * 2 + ph) * 2 + pw) * C + c;
          pool[o] = x[best];
          dxpool[best] += dp[o];
        }
  ExpectNear(Floats(out[3]), pool, 0.f, "MaxPool");
  ExpectNear(Floats(out[4]), dxpool, 1e-6f, "MaxPoolGrad");
}

// A Keras CNN's forward pass: Conv2D -> BiasAdd -> Relu -> MaxPool -> Conv2D -> BiasAdd ->
// Relu. On the CPU every convolution and the pool stay NHWC along the chain (Note
// [Channels-last convolutions]: no Transpose runs between the pool and the next Conv), and each
// BiasAdd and Relu fold into their Conv (Note [Fused bias]), the bias read placed after the
// Conv as TensorFlow places it; the results are the unfused graph's.
TEST(TfImporterTest, KerasConvChainStaysChannelsLastWithFusedBias) {
  constexpr int64_t N = 2, H = 9, W = 9, C = 3, O1 = 8, O2 = 16;
  TfGraph g;
  g.Placeholder("x");
  g.Var("f1", {3, 3, C, O1});
  g.Var("b1", {O1});
  g.Var("f2", {3, 3, O1, O2});
  g.Var("b2", {O2});
  auto conv_attrs = [](tf::NodeDef* n) {
    TfGraph::Ints(n, "strides", {1, 1, 1, 1});
    TfGraph::Str(n, "padding", "VALID");
  };
  g.Read("rf1", "f1");
  conv_attrs(g.Node("conv1", "Conv2D", {"x", "rf1"}));
  g.Read("rb1", "b1");  // after the Conv, as Keras' graph orders it
  g.Node("bias1", "BiasAdd", {"conv1", "rb1"});
  g.Node("relu1", "Relu", {"bias1"});
  auto pool = g.Node("pool", "MaxPool", {"relu1"});
  TfGraph::Ints(pool, "ksize", {1, 2, 2, 1});
  TfGraph::Ints(pool, "strides", {1, 2, 2, 1});
  TfGraph::Str(pool, "padding", "VALID");
  g.Read("rf2", "f2");
  conv_attrs(g.Node("conv2", "Conv2D", {"pool", "rf2"}));
  g.Read("rb2", "b2");
  g.Node("bias2", "BiasAdd", {"conv2", "rb2"});
  g.Node("relu2", "Relu", {"bias2"});
  CompileOptions o;
  o.input_shapes = {{"x", {N, H, W, C}}};
  o.fetches = {"relu2"};
  auto fused = Executable::CompileTf(g.Bytes(), o);
  o.fuse = false;
  auto plain = Executable::CompileTf(g.Bytes(), o);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  int convs = 0, biased = 0, channels_last = 0, others = 0;
  for (const Node& n : (*fused)->graph().nodes()) {
    if (n.op == "Conv") {
      ++convs;
      biased += n.input(2) != kNoValue && n.GetString("fused_activation", "") == "Relu";
    }
    channels_last += n.GetInt(kChannelsLastAttr, 0) != 0;
    others += n.op == "Add" || n.op == "Relu";
  }
  EXPECT_EQ(convs, 2);
  EXPECT_EQ(biased, 2);
  EXPECT_EQ(channels_last, 3);  // both Convs and the pool
  EXPECT_EQ(others, 0);
  EXPECT_EQ((*fused)->num_steps(), 3u);  // no Transpose runs
  Memory mf(**fused), mp(**plain);
  for (const auto& [var, shape] : std::vector<std::pair<std::string, Shape>>{
           {"f1", {3, 3, C, O1}}, {"b1", {O1}}, {"f2", {3, 3, O1, O2}}, {"b2", {O2}}}) {
    const HostTensor v = HostTensor::FromFloats(shape, RandomFloats(NumElements(shape), 91));
    ASSERT_TRUE((*fused)->WritePersistent(mf.p(), var, v).ok());
    ASSERT_TRUE((*plain)->WritePersistent(mp.p(), var, v).ok());
  }
  const HostTensor x = HostTensor::FromFloats({N, H, W, C}, RandomFloats(N * H * W * C, 92));
  ASSERT_OK_AND_ASSIGN_TF(a, RunHost(**fused, mf, {x}));
  ASSERT_OK_AND_ASSIGN_TF(b, RunHost(**plain, mp, {x}));
  ASSERT_EQ(a[0].shape, b[0].shape);
  ExpectNear(Floats(a[0]), Floats(b[0]), 1e-5f, "relu2");
}

// Depthwise convolution (depth multiplier 2, stride 2, SAME) and both its gradients, NHWC,
// against loops: output channel c * M + m reads input channel c through filter [kh, kw, c, m].
TEST(TfImporterTest, DepthwiseConvolutionWithGradients) {
  constexpr int64_t N = 2, H = 5, W = 4, C = 3, M = 2, K = 3, S = 2, OH = 3, OW = 2;
  constexpr int64_t PT = 1, PL = 0;  // SAME: height pads 1 + 1, width 0 + 1
  TfGraph g;
  g.Placeholder("x");
  g.Placeholder("f");
  g.Placeholder("dy");
  auto attrs = [](tf::NodeDef* n) {
    TfGraph::Ints(n, "strides", {1, S, S, 1});
    TfGraph::Str(n, "padding", "SAME");
  };
  attrs(g.Node("y", "DepthwiseConv2dNative", {"x", "f"}));
  g.ConstI("x_sizes", {4}, {N, H, W, C});
  g.ConstI("f_sizes", {4}, {K, K, C, M});
  attrs(g.Node("dx", "DepthwiseConv2dNativeBackpropInput", {"x_sizes", "f", "dy"}));
  attrs(g.Node("df", "DepthwiseConv2dNativeBackpropFilter", {"x", "f_sizes", "dy"}));
  ASSERT_OK_AND_ASSIGN_TF(
      exe, Compile(g, {{"x", {N, H, W, C}}, {"f", {K, K, C, M}}, {"dy", {N, OH, OW, C * M}}},
                   {"y", "dx", "df"}));
  Memory mem(*exe);
  const std::vector<float> x = RandomFloats(N * H * W * C, 21), f = RandomFloats(K * K * C * M, 22);
  const std::vector<float> dy = RandomFloats(N * OH * OW * C * M, 23);
  ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem,
                                       {HostTensor::FromFloats({N, H, W, C}, x),
                                        HostTensor::FromFloats({K, K, C, M}, f),
                                        HostTensor::FromFloats({N, OH, OW, C * M}, dy)}));
  std::vector<float> y(dy.size(), 0.f), dx(x.size(), 0.f), df(f.size(), 0.f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t kh = 0; kh < K; ++kh)
          for (int64_t kw = 0; kw < K; ++kw) {
            const int64_t h = oh * S - PT + kh, w = ow * S - PL + kw;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            for (int64_t c = 0; c < C; ++c)
              for (int64_t m = 0; m < M; ++m) {
                const int64_t xi = ((n * H + h) * W + w) * C + c;
                const int64_t fi = ((kh * K + kw) * C + c) * M + m;
                const int64_t yi = ((n * OH + oh) * OW + ow) * C * M + c * M + m;
                y[yi] += x[xi] * f[fi];
                dx[xi] += dy[yi] * f[fi];
                df[fi] += x[xi] * dy[yi];
              }
          }
  ExpectNear(Floats(out[0]), y, 1e-5f, "DepthwiseConv2dNative");
  ExpectNear(Floats(out[1]), dx, 1e-5f, "DepthwiseConv2dNativeBackpropInput");
  ExpectNear(Floats(out[2]), df, 1e-5f, "DepthwiseConv2dNativeBackpropFilter");
}

// 3x3 average pooling, stride 2, SAME: each window divided by its part inside the input, as
// TensorFlow does; the gradient spreads dy over the same windows. The gradient's input shape
// comes from Shape(x) for one and a constant for the other: both give the same result.
TEST(TfImporterTest, AvgPoolAndItsGradientCountOnlyTheInput) {
  constexpr int64_t N = 1, H = 4, W = 5, C = 2, K = 3, S = 2, OH = 2, OW = 3;
  TfGraph g;
  g.Placeholder("x");
  g.Placeholder("dy");
  auto attrs = [](tf::NodeDef* n) {
    TfGraph::Ints(n, "ksize", {1, K, K, 1});
    TfGraph::Ints(n, "strides", {1, S, S, 1});
    TfGraph::Str(n, "padding", "SAME");
  };
  attrs(g.Node("y", "AvgPool", {"x"}));
  g.Node("x_shape", "Shape", {"x"});
  attrs(g.Node("dx", "AvgPoolGrad", {"x_shape", "dy"}));
  g.ConstI("x_sizes", {4}, {N, H, W, C});
  attrs(g.Node("dx_const", "AvgPoolGrad", {"x_sizes", "dy"}));
  // Readers, as a step has: on the CPU the pooling and the gradient of x's shape pool NHWC
  // themselves (Note [Channels-last convolutions]); the gradient of a constant shape, whose
  // input is a folded constant, stays NCHW.
  g.ConstF("one", {}, {1.f});
  for (const char* v : {"y", "dx", "dx_const"}) g.Node(std::string(v) + "_out", "Mul", {v, "one"});
  ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g, {{"x", {N, H, W, C}}, {"dy", {N, OH, OW, C}}},
                                       {"y_out", "dx_out", "dx_const_out"}));
  int channels_last = 0;
  for (const auto& node : exe->graph().nodes()) {
    if (node.GetInt(kChannelsLastAttr, 0) != 0) ++channels_last;
  }
  EXPECT_EQ(channels_last, 2);
  Memory mem(*exe);
  const std::vector<float> x = RandomFloats(N * H * W * C, 31), dy = RandomFloats(OH * OW * C, 32);
  ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem,
                                       {HostTensor::FromFloats({N, H, W, C}, x),
                                        HostTensor::FromFloats({N, OH, OW, C}, dy)}));
  // SAME: heights pad 0 + 1 (total 1), widths 1 + 1 (total 2).
  std::vector<float> y(dy.size(), 0.f), dx(x.size(), 0.f);
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow)
      for (int64_t c = 0; c < C; ++c) {
        std::vector<int64_t> inside;
        for (int64_t kh = 0; kh < K; ++kh)
          for (int64_t kw = 0; kw < K; ++kw) {
            const int64_t h = oh * S + kh, w = ow * S - 1 + kw;
            if (h < H && w >= 0 && w < W) inside.push_back((h * W + w) * C + c);
          }
        const int64_t o = (oh * OW + ow) * C + c;
        for (int64_t i : inside) {
          y[o] += x[i] / static_cast<float>(inside.size());
          dx[i] += dy[o] / static_cast<float>(inside.size());
        }
      }
  ExpectNear(Floats(out[0]), y, 1e-6f, "AvgPool");
  ExpectNear(Floats(out[1]), dx, 1e-6f, "AvgPoolGrad");
  ExpectNear(Floats(out[2]), dx, 1e-6f, "AvgPoolGrad of a constant shape");
}

// The data-movement ops Keras models add: Pad, PadV2, Slice, Split, SplitV, Unpack,
// StridedSliceGrad, and the elementwise Relu6, Relu6Grad, Erfc, Floor and float FloorMod.
// Note [Mirror padding]: both modes on two dims of a [2, 3], and the gradient of each, against
// the mirror map written out by hand.
TEST(TfImporterTest, MirrorPadAndItsGradientInBothModes) {
  TfGraph g;
  g.Placeholder("x");   // [2, 3]
  g.Placeholder("dr");  // REFLECT's output [3, 7]
  g.Placeholder("ds");  // SYMMETRIC's output [4, 8]
  g.ConstI("pr", {2, 2}, {1, 0, 2, 2});
  g.ConstI("ps", {2, 2}, {1, 1, 2, 3});
  TfGraph::Str(g.Node("reflect", "MirrorPad", {"x", "pr"}), "mode", "REFLECT");
  TfGraph::Str(g.Node("symmetric", "MirrorPad", {"x", "ps"}), "mode", "SYMMETRIC");
  TfGraph::Str(g.Node("dreflect", "MirrorPadGrad", {"dr", "pr"}), "mode", "REFLECT");
  TfGraph::Str(g.Node("dsymmetric", "MirrorPadGrad", {"ds", "ps"}), "mode", "SYMMETRIC");
  ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g, {{"x", {2, 3}}, {"dr", {3, 7}}, {"ds", {4, 8}}},
                                       {"reflect", "symmetric", "dreflect", "dsymmetric"}));
  Memory mem(*exe);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<float> dr = RandomFloats(21, 41), ds = RandomFloats(32, 42);
  ASSERT_OK_AND_ASSIGN_TF(
      out, RunHost(*exe, mem,
                   {HostTensor::FromFloats({2, 3}, x), HostTensor::FromFloats({3, 7}, dr),
                    HostTensor::FromFloats({4, 8}, ds)}));
  // Rows: REFLECT [1 | 0 1] -> 1 0 1; SYMMETRIC [0 | 0 1 | 1] -> 0 0 1 1. Columns: REFLECT by
  // (2, 2) -> 2 1 | 0 1 2 | 1 0; SYMMETRIC by (2, 3) -> 1 0 | 0 1 2 | 2 1 0.
  const std::vector<int64_t> rr = {1, 0, 1}, rc = {2, 1, 0, 1, 2, 1, 0};
  const std::vector<int64_t> sr = {0, 0, 1, 1}, sc = {1, 0, 0, 1, 2, 2, 1, 0};
  std::vector<float> reflect, symmetric, dx_r(6, 0.f), dx_s(6, 0.f);
  for (size_t i = 0; i < rr.size(); ++i)
    for (size_t j = 0; j < rc.size(); ++j) {
      reflect.push_back(x[rr[i] * 3 + rc[j]]);
      dx_r[rr[i] * 3 + rc[j]] += dr[i * rc.size() + j];
    }
  for (size_t i = 0; i < sr.size(); ++i)
    for (size_t j = 0; j < sc.size(); ++j) {
      symmetric.push_back(x[sr[i] * 3 + sc[j]]);
      dx_s[sr[i] * 3 + sc[j]] += ds[i * sc.size() + j];
    }
  EXPECT_EQ(out[0].shape, Shape({3, 7}));
  ExpectNear(Floats(out[0]), reflect, 0, "MirrorPad REFLECT");
  EXPECT_EQ(out[1].shape, Shape({4, 8}));
  ExpectNear(Floats(out[1]), symmetric, 0, "MirrorPad SYMMETRIC");
  EXPECT_EQ(out[2].shape, Shape({2, 3}));
  ExpectNear(Floats(out[2]), dx_r, 1e-6f, "MirrorPadGrad REFLECT");
  ExpectNear(Floats(out[3]), dx_s, 1e-6f, "MirrorPadGrad SYMMETRIC");
}

TEST(TfImporterTest, MirrorPadWiderThanItsModeAllowsIsRefusedByName) {
  TfGraph g;
  g.Placeholder("x");  // [2, 3]
  g.ConstI("p", {2, 2}, {0, 0, 3, 0});
  TfGraph::Str(g.Node("wide", "MirrorPad", {"x", "p"}), "mode", "REFLECT");
  auto exe = Compile(g, {{"x", {2, 3}}}, {"wide"});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(exe.status().message().find("node 'wide': op MirrorPad"), std::string::npos)
      << exe.status();
  EXPECT_NE(exe.status().message().find("[0, 2]"), std::string::npos) << exe.status();
}

TEST(TfImporterTest, PaddingSlicingSplittingAndElementwiseOps) {
  TfGraph g;
  g.Placeholder("x");  // [2, 3]
  g.ConstI("pads", {2, 2}, {1, 0, 0, 2});
  g.Node("pad", "Pad", {"x", "pads"});
  g.ConstF("minus1", {}, {-1.f});
  g.Node("pad2", "PadV2", {"x", "pads", "minus1"});
  g.ConstI("begin", {2}, {0, 1});
  g.ConstI("size", {2}, {-1, 2});
  g.Node("slice", "Slice", {"x", "begin", "size"});
  g.ConstI("axis1", {}, {1});
  TfGraph::Int(g.Node("split", "Split", {"axis1", "x"}), "num_split", 3);
  g.ConstI("sizes", {2}, {-1, 2});
  g.Node("splitv", "SplitV", {"x", "sizes", "axis1"});
  TfGraph::Int(g.Node("unpack", "Unpack", {"x"}), "num", 2);
  // StridedSlice x[:, ::2] and its gradient.
  g.ConstI("shape", {2}, {2, 3});
  g.ConstI("b", {2}, {0, 0});
  g.ConstI("e", {2}, {0, 0});
  g.ConstI("st", {2}, {1, 2});
  g.Placeholder("dslice");  // [2, 2]
  auto* ssg = g.Node("ssg", "StridedSliceGrad", {"shape", "b", "e", "st", "dslice"});
  TfGraph::Int(ssg, "begin_mask", 3);
  TfGraph::Int(ssg, "end_mask", 3);
  g.Node("relu6", "Relu6", {"x"});
  g.Node("relu6g", "Relu6Grad", {"dslice_like_x", "x"});
  g.Placeholder("dslice_like_x");  // [2, 3]
  g.Node("erfc", "Erfc", {"x"});
  g.Node("floor", "Floor", {"x"});
  g.ConstF("three", {}, {-3.f});
  g.Node("fmod", "FloorMod", {"x", "three"});
  ASSERT_OK_AND_ASSIGN_TF(
      exe, Compile(g, {{"x", {2, 3}}, {"dslice", {2, 2}}, {"dslice_like_x", {2, 3}}},
                   {"pad", "pad2", "slice", "split:0", "split:2", "splitv:0", "splitv:1",
                    "unpack:1", "ssg", "relu6", "relu6g", "erfc", "floor", "fmod"}));
  Memory mem(*exe);
  const std::vector<float> x = {-1.5f, 0.f, 2.5f, 6.f, 7.25f, 4.f};
  ASSERT_OK_AND_ASSIGN_TF(
      out, RunHost(*exe, mem,
                   {HostTensor::FromFloats({2, 3}, x), HostTensor::FromFloats({2, 2}, {1, 2, 3, 4}),
                    HostTensor::FromFloats({2, 3}, {1, 1, 1, 1, 1, 1})}));
  ExpectNear(Floats(out[0]), {0, 0, 0, 0, 0, -1.5f, 0, 2.5f, 0, 0, 6, 7.25f, 4, 0, 0}, 0, "Pad");
  EXPECT_EQ(out[0].shape, Shape({3, 5}));
  ExpectNear(Floats(out[1]), {-1, -1, -1, -1, -1, -1.5f, 0, 2.5f, -1, -1, 6, 7.25f, 4, -1, -1}, 0,
             "PadV2");
  ExpectNear(Floats(out[2]), {0, 2.5f, 7.25f, 4}, 0, "Slice");
  ExpectNear(Floats(out[3]), {-1.5f, 6}, 0, "Split:0");
  ExpectNear(Floats(out[4]), {2.5f, 4}, 0, "Split:2");
  ExpectNear(Floats(out[5]), {-1.5f, 6}, 0, "SplitV:0");
  ExpectNear(Floats(out[6]), {0, 2.5f, 7.25f, 4}, 0, "SplitV:1");
  ExpectNear(Floats(out[7]), {6, 7.25f, 4}, 0, "Unpack:1");
  EXPECT_EQ(out[7].shape, Shape({3}));
  ExpectNear(Floats(out[8]), {1, 0, 2, 3, 0, 4}, 0, "StridedSliceGrad");
  ExpectNear(Floats(out[9]), {0, 0, 2.5f, 6, 6, 4}, 0, "Relu6");
  ExpectNear(Floats(out[10]), {0, 0, 1, 0, 0, 1}, 0, "Relu6Grad");
  std::vector<float> erfc, floors, fmods;
  for (float v : x) {
    erfc.push_back(std::erfc(v));
    floors.push_back(std::floor(v));
  }
  // FloorMod by -3 takes the divisor's sign: -1.5 -> -1.5, 0 -> 0, 2.5 -> -0.5, 6 -> 0,
  // 7.25 -> -1.75, 4 -> -2.
  ExpectNear(Floats(out[11]), erfc, 1e-7f, "Erfc");
  ExpectNear(Floats(out[12]), floors, 0, "Floor");
  ExpectNear(Floats(out[13]), {-1.5f, 0, -0.5f, 0, -1.75f, -2}, 1e-7f, "FloorMod");
}

// ConcatOffset and DynamicStitch of constants fold to constants at import (TensorFlow's
// gradients of Concat and of a reduction over a shape unknown when traced).
TEST(TfImporterTest, ConcatOffsetAndDynamicStitchFold) {
  TfGraph g;
  g.ConstI("axis", {}, {1});
  g.ConstI("s0", {3}, {2, 3, 4});
  g.ConstI("s1", {3}, {2, 5, 4});
  g.ConstI("s2", {3}, {2, 1, 4});
  g.Node("offsets", "ConcatOffset", {"axis", "s0", "s1", "s2"});
  g.ConstI("i0", {2}, {0, 2});
  g.ConstI("i1", {2}, {1, 3});
  g.ConstI("d0", {2}, {7, 9});
  g.ConstI("d1", {2}, {1, 1});
  g.Node("stitch", "DynamicStitch", {"i0", "i1", "d0", "d1"});
  g.Placeholder("x");
  g.Node("reshaped", "Reshape", {"x", "stitch"});
  ASSERT_OK_AND_ASSIGN_TF(graph, Import(g, {{"x", {63}}}));
  EXPECT_EQ(ConstantInts(graph, "offsets"), std::vector<int64_t>({0, 0, 0}));
  EXPECT_EQ(ConstantInts(graph, "offsets:1"), std::vector<int64_t>({0, 3, 0}));
  EXPECT_EQ(ConstantInts(graph, "offsets:2"), std::vector<int64_t>({0, 8, 0}));
  EXPECT_EQ(ConstantInts(graph, "stitch"), std::vector<int64_t>({7, 1, 9, 1}));
  EXPECT_EQ(graph.value(graph.Find("reshaped")).shape, Shape({7, 1, 9, 1}));
}

// ---------------------------------------------------------------------------------------------
// Variables.

// A read placed before an assignment is a snapshot: its consumers see the old value even when
// they run after the assignment; a read after it sees the new value.
TEST(TfImporterTest, ReadVariableIsASnapshot) {
  TfGraph g;
  g.Var("v", {2});
  g.Read("before", "v");
  g.ConstF("inc", {2}, {10.f, 20.f});
  g.Node("assign", "AssignAddVariableOp", {"v", "inc", "^before"});
  g.ConstF("one", {}, {1.f});
  g.Node("consumer", "Mul", {"before", "one", "^assign"});
  g.Read("after", "v")->add_input("^assign");
  ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g, {}, {"consumer", "after:0"}));
  Memory mem(*exe);
  ASSERT_TRUE(exe->WritePersistent(mem.p(), "v", HostTensor::FromFloats({2}, {1.f, 2.f})).ok());
  ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem, {}));
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(Floats(out[1]), (std::vector<float>{11.f, 22.f}));
  ASSERT_OK_AND_ASSIGN_TF(v, exe->ReadPersistent(mem.p(), "v"));
  EXPECT_EQ(Floats(v), (std::vector<float>{11.f, 22.f}));
}

// Keras' Adam as TensorFlow ops: each assignment and the elementwise chain that makes its value
// run as one SalusFusedElementwise node writing the variable in place (Note [Fused elementwise
// chains]); after three steps the variables hold bit for bit what the unfused graph leaves.
TEST(TfImporterTest, AdamsUpdatesFuseIntoTheirAssignments) {
  constexpr int64_t kCount = 40000;  // enough for the kernel to split across threads
  TfGraph g;
  g.Placeholder("grad");
  g.Var("w", {kCount});
  g.Var("m", {kCount});
  g.Var("v", {kCount});
  g.ConstF("one_minus_b1", {}, {0.1f});
  g.ConstF("one_minus_b2", {}, {0.001f});
  g.ConstF("alpha", {}, {0.01f});
  g.ConstF("eps", {}, {1e-7f});
  g.Read("m0", "m");
  g.Node("dm", "Sub", {"grad", "m0"});
  g.Node("sm", "Mul", {"dm", "one_minus_b1"});
  g.Node("assign_m", "AssignAddVariableOp", {"m", "sm"});
  g.Read("v0", "v");
  g.Node("g2", "Square", {"grad"});
  g.Node("dv", "Sub", {"g2", "v0"});
  g.Node("sv", "Mul", {"dv", "one_minus_b2"});
  g.Node("assign_v", "AssignAddVariableOp", {"v", "sv"});
  g.Read("m1", "m")->add_input("^assign_m");
  g.Read("v1", "v")->add_input("^assign_v");
  g.Node("num", "Mul", {"m1", "alpha"});
  g.Node("root", "Sqrt", {"v1"});
  g.Node("den", "AddV2", {"root", "eps"});
  g.Node("step", "RealDiv", {"num", "den"});
  g.Node("assign_w", "AssignSubVariableOp", {"w", "step"});
  CompileOptions o;
  o.input_shapes = {{"grad", {kCount}}};
  o.fuse = true;
  auto fused = Executable::CompileTf(g.Bytes(), o);
  o.fuse = false;
  auto plain = Executable::CompileTf(g.Bytes(), o);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  int assigns = 0, chains = 0;
  for (const Node& n : (*fused)->graph().nodes()) {
    assigns += n.op == "SalusAssign";
    chains += n.op == kFusedElementwiseOp;
  }
  EXPECT_EQ(assigns, 0);
  EXPECT_EQ(chains, 3);
  Memory mf(**fused), mp(**plain);
  for (const char* var : {"w", "m", "v"}) {
    const HostTensor init =
        HostTensor::FromFloats({kCount}, RandomFloats(kCount, 70 + std::string(var)[0]));
    ASSERT_TRUE((*fused)->WritePersistent(mf.p(), var, init).ok());
    ASSERT_TRUE((*plain)->WritePersistent(mp.p(), var, init).ok());
  }
  for (int step = 0; step < 3; ++step) {
    const HostTensor grad = HostTensor::FromFloats({kCount}, RandomFloats(kCount, 80 + step));
    ASSERT_TRUE(RunHost(**fused, mf, {grad}).ok());
    ASSERT_TRUE(RunHost(**plain, mp, {grad}).ok());
  }
  for (const char* var : {"w", "m", "v"}) {
    ASSERT_OK_AND_ASSIGN_TF(a, (*fused)->ReadPersistent(mf.p(), var));
    ASSERT_OK_AND_ASSIGN_TF(b, (*plain)->ReadPersistent(mp.p(), var));
    ASSERT_EQ(a.bytes.size(), b.bytes.size());
    EXPECT_EQ(std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()), 0) << var;
  }
}

// A variable starts at zero; one that is never assigned is read in place (no copy node).
TEST(TfImporterTest, UnassignedVariableIsReadInPlaceAndStartsAtZero) {
  TfGraph g;
  g.Var("v", {3});
  g.Read("r", "v");
  g.Node("y", "Neg", {"r"});
  ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g, {}, {"y"}));
  for (const Node& n : exe->graph().nodes()) EXPECT_NE(n.op, "Identity");
  Memory mem(*exe);
  ASSERT_OK_AND_ASSIGN_TF(zero, RunHost(*exe, mem, {}));
  EXPECT_EQ(Floats(zero[0]), (std::vector<float>{0.f, 0.f, 0.f}));
  ASSERT_TRUE(exe->WritePersistent(mem.p(), "v", HostTensor::FromFloats({3}, {1, 2, 3})).ok());
  ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem, {}));
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{-1.f, -2.f, -3.f}));
}

// int32 placeholders, constants (int_val and tensor_content) and casts are int64 in the engine;
// ArgMax's int32 output too.
TEST(TfImporterTest, Int32IsCarriedAsInt64) {
  TfGraph g;
  g.Placeholder("i", tf::DT_INT32);
  g.ConstI("c", {3}, {1, -2, 3}, /*content=*/true);
  g.Node("sum", "AddV2", {"i", "c"});
  TfGraph::Type(g.Node("f", "Cast", {"sum"}), "DstT", tf::DT_FLOAT);
  g.ConstI("axis", {}, {0});
  g.Node("argmax", "ArgMax", {"f", "axis"});
  ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g, {{"i", {3}}}, {"sum", "f", "argmax"}));
  EXPECT_EQ(exe->inputs()[0].type, DataType::kInt64);
  Memory mem(*exe);
  ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem, {Int64Tensor({3}, {10, 20, -30})}));
  EXPECT_EQ(out[0].type, DataType::kInt64);
  EXPECT_EQ(out[0].ToInt64s(), (std::vector<int64_t>{11, 18, -27}));
  EXPECT_EQ(Floats(out[1]), (std::vector<float>{11.f, 18.f, -27.f}));
  EXPECT_EQ(out[2].ToInt64s(), (std::vector<int64_t>{1}));
}

// Einsum against direct loops: attention's scores ("aecd,abcd->acbe"), a projection with a
// summed-out label ("abc,cde->abde"), and one operand ("abc->ca": sum over b, transpose).
TEST(TfImporterTest, EinsumMatchesLoops) {
  constexpr int64_t A = 2, B = 3, C = 4, D = 5, E = 3;
  TfGraph g;
  g.Placeholder("q");
  g.Placeholder("k");
  g.Placeholder("x");
  g.Placeholder("w");
  TfGraph::Str(g.Node("scores", "Einsum", {"k", "q"}), "equation", "aecd,abcd->acbe");
  TfGraph::Str(g.Node("proj", "Einsum", {"x", "w"}), "equation", "abc,cde->abde");
  TfGraph::Str(g.Node("sum", "Einsum", {"x"}), "equation", "abc->ca");
  ASSERT_OK_AND_ASSIGN_TF(
      exe,
      Compile(g, {{"q", {A, B, C, D}}, {"k", {A, E, C, D}}, {"x", {A, B, C}}, {"w", {C, D, E}}},
              {"scores", "proj", "sum"}));
  const std::vector<float> q = RandomFloats(A * B * C * D, 1), k = RandomFloats(A * E * C * D, 2),
                           x = RandomFloats(A * B * C, 3), w = RandomFloats(C * D * E, 4);
  Memory mem(*exe);
  ASSERT_OK_AND_ASSIGN_TF(
      out,
      RunHost(*exe, mem,
              {HostTensor::FromFloats({A, B, C, D}, q), HostTensor::FromFloats({A, E, C, D}, k),
               HostTensor::FromFloats({A, B, C}, x), HostTensor::FromFloats({C, D, E}, w)}));
  ASSERT_EQ(out[0].shape, (Shape{A, C, B, E}));
  const std::vector<float> scores = Floats(out[0]), proj = Floats(out[1]), sum = Floats(out[2]);
  for (int64_t a = 0; a < A; ++a) {
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t e = 0; e < E; ++e) {
          double want = 0;
          for (int64_t d = 0; d < D; ++d) {
            want += k[((a * E + e) * C + c) * D + d] * q[((a * B + b) * C + c) * D + d];
          }
          EXPECT_NEAR(scores[((a * C + c) * B + b) * E + e], want, 1e-4);
        }
      }
    }
  }
  ASSERT_EQ(out[1].shape, (Shape{A, B, D, E}));
  for (int64_t a = 0; a < A; ++a) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t e = 0; e < E; ++e) {
          double want = 0;
          for (int64_t c = 0; c < C; ++c) want += x[(a * B + b) * C + c] * w[(c * D + d) * E + e];
          EXPECT_NEAR(proj[((a * B + b) * D + d) * E + e], want, 1e-4);
        }
      }
    }
  }
  ASSERT_EQ(out[2].shape, (Shape{C, A}));
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t a = 0; a < A; ++a) {
      double want = 0;
      for (int64_t b = 0; b < B; ++b) want += x[(a * B + b) * C + c];
      EXPECT_NEAR(sum[c * A + a], want, 1e-4);
    }
  }
  TfGraph bad;
  bad.Placeholder("x");
  TfGraph::Str(bad.Node("diag", "Einsum", {"x"}), "equation", "aa->a");
  EXPECT_EQ(Import(bad, {{"x", {3, 3}}}).status().code(), StatusCode::kUnimplemented);
}

// ---------------------------------------------------------------------------------------------
// Refusals: each names the node.

Status ImportStatus(const TfGraph& g, const std::map<std::string, Shape>& shapes = {}) {
  return Import(g, shapes).status();
}

// ---------------------------------------------------------------------------------------------
// Stateless random numbers (Keras 3's Dropout: StatelessRandomGetKeyCounter and
// StatelessRandomUniformV2) bit for bit against TensorFlow 2.21's CPU kernels. The reference
// values were printed by tf.raw_ops.StatelessRandomGetKeyCounter and StatelessRandomUniformV2
// (tensorflow-cpu 2.21): the key and counter of each seed, the bits of the [5, 7] output (a [3]
// output is its prefix: the values do not depend on the shape, only on the element's place),
// and FNV-1a hashes of the bits of the [1031] and [33, 37] outputs.

struct RandomReference {
  bool int32_seed;
  int64_t seed0, seed1;
  uint64_t key, counter0, counter1;
  std::vector<uint32_t> bits_5x7;
  uint64_t hash_1031, hash_33x37;
};

const std::vector<RandomReference>& RandomReferences() {
  static const std::vector<RandomReference> refs = {
      {true,
       0LL,
       0LL,
       0xdf7a3ef6dd5b9083ULL,
       0x0000000000000000ULL,
       0xff2f51a833da8054ULL,
       {0x3e581470, 0x3f34bd12, 0x3f4cd0f4, 0x3f4552a4, 0x3ec6f518, 0x3f5ecfe0, 0x3f4ee560,
        0x3e49aae0, 0x3f5969ce, 0x3f0a48fa, 0x3e0b59e0, 0x3de3bb30, 0x3f3f41c2, 0x3e4a1a40,
        0x3eb72a40, 0x3f053244, 0x3eda2ed0, 0x3e585340, 0x3e5ed220, 0x3e22a190, 0x3e27e4e8,
        0x3f7f5446, 0x3ed38028, 0x3e4d1720, 0x3f386880, 0x3d947a60, 0x3e90b8f4, 0x3e443eb8,
        0x3d40f3c0, 0x3f2e6ac8, 0x3e2dffe0, 0x3ed1ed7c, 0x3cb7a100, 0x3f3847a2, 0x3e741770},
       0x3529e3e6b73a8cdbULL,
       0xc4ea39e724c65c25ULL},
      {true,
       1LL,
       2LL,
       0x908502c96d2f7fbaULL,
       0x0000000000000000ULL,
       0xf7734320619cb60bULL,
       {0x3f581458, 0x3e44a788, 0x3f7f087c, 0x3e243c98, 0x3e8b424c, 0x3f263b8a, 0x3ddb05b0,
        0x3d8573e0, 0x3ee0f2ac, 0x3dad9af0, 0x3e4dca90, 0x3e0e8ca0, 0x3ef4ef5c, 0x3e333d20,
        0x3f46d83c, 0x3c80c680, 0x3f1adf36, 0x3ea73d0c, 0x3eb48db8, 0x3eaf2fc4, 0x3f173416,
        0x3f2045fa, 0x3f6c1016, 0x3ea36794, 0x3f26e874, 0x3eedf3bc, 0x3d335e20, 0x3f754818,
        0x3f141b5c, 0x3dbbf0d0, 0x3f4a97bc, 0x3ed19b4c, 0x3ef3cdc4, 0x3f17658e, 0x3f4d8dda},
       0x5a9feb5bcfee0ee7ULL,
       0x16ef5cd78c25c511ULL},
      {true,
       -1LL,
       7LL,
       0xc09838a15a2485d4ULL,
       0x0000000000000000ULL,
       0x591f8f0b765f34bbULL,
       {0x3f7bca32, 0x3f42d3ec, 0x3ea71d30, 0x3e85bdf4, 0x3f499b6c, 0x3dc20af0, 0x3ef340c4,
        0x3e525538, 0x3ea4cfd0, 0x3e981368, 0x3eb8bcc4, 0x3e975664, 0x3eb74e88, 0x3e2d9098,
        0x3f319880, 0x3e0f5ff8, 0x3f0c41c0, 0x3f5a654e, 0x3e34e210, 0x3f666700, 0x3eae9cf4,
        0x3f2e936e, 0x3eac0ca0, 0x3ef0b8a0, 0x3f08c7a8, 0x3e572280, 0x3f47c940, 0x3d1ec2e0,
        0x3f574700, 0x3f4ce35c, 0x3f625f90, 0x3cb44dc0, 0x3ed3be74, 0x3f59711c, 0x3ea502bc},
       0xc1e14c310c41255fULL,
       0x55ff23700b0dd56fULL},
      {true,
       1337LL,
       42LL,
       0x9c53ebbaaad94bc5ULL,
       0x0000000000000000ULL,
       0x76e44a44185f5f72ULL,
       {0x3f705cb2, 0x3ea1f300, 0x3f16aade, 0x3f319976, 0x3f0b592c, 0x3f0d0fba, 0x3f18c1a2,
        0x3f0b40f4, 0x3f7c477a, 0x3f6b1c32, 0x3ce1dd40, 0x3ecd22b0, 0x3d1d9700, 0x3f72ab9c,
        0x3f6bf524, 0x3f43a5a8, 0x3f6a165e, 0x3f06ea64, 0x3f6335ae, 0x3f39ab82, 0x3ea024d0,
        0x3dc0c260, 0x3e70f5a8, 0x3f691d7e, 0x3e80c918, 0x3df51c60, 0x3f1772c2, 0x3ec59bb8,
        0x3f141302, 0x3ef66b74, 0x3f62f666, 0x3e010480, 0x3f7d7ff8, 0x3f1e97ee, 0x3f6b7e6c},
       0xc8490794593dce6bULL,
       0x5510cf9fd653fa4dULL},
      {false,
       123456789LL,
       -987654321LL,
       0xdc11dfd4062e6e97ULL,
       0x0000000000000000ULL,
       0x6925378a83dbf6f1ULL,
       {0x3e014da8, 0x3f47e7d6, 0x3e040048, 0x3ec7ccc8, 0x3f100ec2, 0x3f360532, 0x3ea00b6c,
        0x3f6ecb72, 0x3f657d3e, 0x3f2818dc, 0x3f6fb588, 0x3e71fe68, 0x3f1765bc, 0x3f375cc4,
        0x3f6473aa, 0x3f39d52a, 0x3f6d8a20, 0x3da7d7c0, 0x3f5dff1c, 0x3f4de96a, 0x3eb90924,
        0x3e236610, 0x3e563b70, 0x3f70f34a, 0x3efc0194, 0x3e9351ac, 0x3f657f24, 0x3f724456,
        0x3d6c8de0, 0x3f107bac, 0x3f46fcb8, 0x3f2e1ee4, 0x3f4361bc, 0x3ec53660, 0x3e17e038},
       0x21c1b3c1d00194afULL,
       0xd0e805b71ceeeb21ULL},
      {false,
       1099511627781LL,
       -1125899906842624LL,
       0x3ebcd445c7b3eefeULL,
       0x0000000000000000ULL,
       0x43908223bebdeed1ULL,
       {0x3f4fa1c2, 0x3f12c140, 0x3f268f6c, 0x3e9b8bd8, 0x3e252208, 0x3f001eb0, 0x3ee5ff4c,
        0x3d06abe0, 0x3f4eef7a, 0x3e84778c, 0x3f2f9a86, 0x3e5deae8, 0x3f1419ca, 0x3e793728,
        0x3f3cf7c8, 0x3dc5d8d0, 0x3f44ccdc, 0x3f4170aa, 0x3f6fd8b4, 0x3ee12e3c, 0x3f0a1a26,
        0x3ef766b0, 0x3e8f19e4, 0x3f509922, 0x3e3171c8, 0x3f78ffac, 0x3f674748, 0x3ed1d478,
        0x3d8fccc0, 0x3f623a5e, 0x3f217696, 0x3f309568, 0x3eb7b960, 0x3f102454, 0x3f1cc8a8},
       0x16c67427a6514897ULL,
       0x996e336111269fcbULL},
  };
  return refs;
}

std::vector<uint32_t> Bits(const HostTensor& t) {
  std::vector<uint32_t> bits(t.num_elements());
  std::memcpy(bits.data(), t.floats(), bits.size() * 4);
  return bits;
}

uint64_t Fnv1a(const std::vector<uint32_t>& words) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint32_t w : words) {
    h ^= w;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The seed as a runtime input: key, counter and four uniform outputs.
TfGraph RandomGraph(tf::DataType seed_type) {
  TfGraph g;
  g.Placeholder("seed", seed_type);
  TfGraph::Type(g.Node("kc", "StatelessRandomGetKeyCounter", {"seed"}), "Tseed", seed_type);
  g.ConstI("alg", {}, {1});
  const std::vector<std::pair<std::string, Shape>> outputs = {
      {"u3", {3}}, {"u5x7", {5, 7}}, {"u1031", {1031}}, {"u33x37", {33, 37}}};
  for (const auto& [name, shape] : outputs) {
    std::vector<int32_t> dims(shape.begin(), shape.end());
    g.ConstI(name + "/shape", {static_cast<int64_t>(dims.size())}, dims);
    tf::NodeDef* n =
        g.Node(name, "StatelessRandomUniformV2", {name + "/shape", "kc", "kc:1", "alg"});
    TfGraph::Type(n, "dtype", tf::DT_FLOAT);
    TfGraph::Type(n, "Tshape", tf::DT_INT32);
  }
  return g;
}

TEST(TfImporterTest, StatelessRandomUniformIsTensorFlowsBitForBit) {
  for (tf::DataType seed_type : {tf::DT_INT32, tf::DT_INT64}) {
    ASSERT_OK_AND_ASSIGN_TF(exe, Compile(RandomGraph(seed_type), {{"seed", {2}}},
                                         {"kc:0", "kc:1", "u3", "u5x7", "u1031", "u33x37"}));
    // The seed is a runtime value: the ops run as kernels.
    int uniforms = 0;
    for (const Node& n : exe->graph().nodes()) uniforms += n.op == "SalusRandomUniform" ? 1 : 0;
    EXPECT_EQ(uniforms, 4);
    Memory mem(*exe);
    for (const RandomReference& r : RandomReferences()) {
      if (r.int32_seed != (seed_type == tf::DT_INT32)) continue;
      const std::string what =
          "seed (" + std::to_string(r.seed0) + ", " + std::to_string(r.seed1) + ")";
      ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem, {Int64Tensor({2}, {r.seed0, r.seed1})}));
      ASSERT_EQ(out[0].shape, (Shape{1}));
      ASSERT_EQ(out[1].shape, (Shape{2}));
      EXPECT_EQ(static_cast<uint64_t>(out[0].int64s()[0]), r.key) << what;
      EXPECT_EQ(static_cast<uint64_t>(out[1].int64s()[0]), r.counter0) << what;
      EXPECT_EQ(static_cast<uint64_t>(out[1].int64s()[1]), r.counter1) << what;
      EXPECT_EQ(Bits(out[2]), std::vector<uint32_t>(r.bits_5x7.begin(), r.bits_5x7.begin() + 3))
          << what;
      EXPECT_EQ(Bits(out[3]), r.bits_5x7) << what;
      EXPECT_EQ(Fnv1a(Bits(out[4])), r.hash_1031) << what;
      EXPECT_EQ(out[5].shape, (Shape{33, 37}));
      EXPECT_EQ(Fnv1a(Bits(out[5])), r.hash_33x37) << what;
      for (float v : Floats(out[5])) {
        EXPECT_TRUE(v >= 0.f && v < 1.f) << what;
      }
      if (r.int32_seed && r.seed0 == -1) {
        // An int32 seed counts its low 32 bits only, sign-extended, as TensorFlow reads it.
        ASSERT_OK_AND_ASSIGN_TF(
            wide, RunHost(*exe, mem, {Int64Tensor({2}, {int64_t{0xffffffff}, r.seed1})}));
        EXPECT_EQ(static_cast<uint64_t>(wide[0].int64s()[0]), r.key);
        EXPECT_EQ(Bits(wide[3]), r.bits_5x7);
      }
    }
  }
}

// StatelessRandomNormalV2 and StatelessTruncatedNormalV2 (keras.random.normal and
// truncated_normal) bit for bit against TensorFlow 2.21's CPU kernels, for int32 seeds (1, 2)
// and (1337, 42): the first seven elements' bits of the [5, 7] output and FNV-1a hashes of the
// bits of the [5, 7] and [1031] outputs, printed by tf.raw_ops (tensorflow-cpu 2.21).
TEST(TfImporterTest, StatelessNormalDrawsAreTensorFlowsBitForBit) {
  struct Reference {
    int64_t seed0, seed1;
    const char* op;
    std::vector<uint32_t> first7;
    uint64_t hash_5x7, hash_1031;
  };
  const std::vector<Reference> refs = {
      {1,
       2,
       "StatelessRandomNormalV2",
       {0x3f0b4acd, 0x3e545b81, 0x3d96a8e4, 0x3d3e3228, 0xbfa69a7f, 0xbf742ff1, 0x3f577b86},
       0x3b46d5ff857dd5fbULL,
       0xf1adbd09246ea95bULL},
      {1,
       2,
       "StatelessTruncatedNormalV2",
       {0x3f0b4acd, 0x3e545b81, 0x3d96a8e4, 0x3d3e3228, 0x3e2c3e2c, 0xbfd7af2c, 0x3e77d657},
       0xbd3a1d3295914d87ULL,
       0xf81b9b0a6fa79280ULL},
      {1337,
       42,
       "StatelessRandomNormalV2",
       {0x3ea63ca9, 0xbe1320b2, 0xbf774ccc, 0xbeb679a4, 0xbeb1f0c5, 0xbf85fad6, 0xbe8de3b1},
       0x04bb08bb217fc6eeULL,
       0x4b935224e8423f18ULL},
      {1337,
       42,
       "StatelessTruncatedNormalV2",
       {0x3ea63ca9, 0xbe1320b2, 0xbf774ccc, 0xbeb679a4, 0xbed6aee4, 0x3f2f9650, 0x3f4fc4c0},
       0xe08a49ebf4a3d4c6ULL,
       0x238c83a46919dd4cULL},
  };
  for (const char* op : {"StatelessRandomNormalV2", "StatelessTruncatedNormalV2"}) {
    TfGraph g;
    g.Placeholder("seed", tf::DT_INT32);
    TfGraph::Type(g.Node("kc", "StatelessRandomGetKeyCounter", {"seed"}), "Tseed", tf::DT_INT32);
    g.ConstI("alg", {}, {1});
    g.ConstI("s5x7/shape", {2}, {5, 7});
    g.ConstI("s1031/shape", {1}, {1031});
    for (const char* name : {"s5x7", "s1031"}) {
      TfGraph::Type(g.Node(name, op, {std::string(name) + "/shape", "kc", "kc:1", "alg"}), "dtype",
                    tf::DT_FLOAT);
    }
    ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g, {{"seed", {2}}}, {"s5x7", "s1031"}));
    Memory mem(*exe);
    for (const Reference& r : refs) {
      if (std::string(r.op) != op) continue;
      const std::string what = std::string(op) + " of seed (" + std::to_string(r.seed0) + ", " +
                               std::to_string(r.seed1) + ")";
      ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem, {Int64Tensor({2}, {r.seed0, r.seed1})}));
      const std::vector<uint32_t> bits = Bits(out[0]);
      EXPECT_EQ(std::vector<uint32_t>(bits.begin(), bits.begin() + 7), r.first7) << what;
      EXPECT_EQ(Fnv1a(bits), r.hash_5x7) << what;
      EXPECT_EQ(Fnv1a(Bits(out[1])), r.hash_1031) << what;
      if (std::string(op) == "StatelessTruncatedNormalV2") {
        for (float v : Floats(out[1])) EXPECT_LT(std::fabs(v), 2.f) << what;
      }
    }
    // Run eagerly (an initializer drawn on the device), the op's key and counter arrive as
    // uint64 inputs of their own.
    TfGraph eager;
    eager.Placeholder("key", tf::DT_UINT64);
    eager.Placeholder("counter", tf::DT_UINT64);
    eager.ConstI("alg", {}, {1});
    eager.ConstI("shape", {1}, {9});
    TfGraph::Type(eager.Node("y", op, {"shape", "key", "counter", "alg"}), "dtype", tf::DT_FLOAT);
    const Status st = ImportStatus(eager, {{"key", {1}}, {"counter", {2}}});
    EXPECT_TRUE(st.ok()) << op << ": " << st.ToString();
  }
}

// StatelessRandomUniform (the seed in, no key and counter), StatelessRandomGetKeyCounterAlg and
// alg 3 (auto-select: Philox); with a constant seed the ops fold into constants.
TEST(TfImporterTest, StatelessRandomFoldsWithConstantSeed) {
  const RandomReference& r = RandomReferences()[1];  // int32 seed (1, 2)
  ASSERT_TRUE(r.int32_seed && r.seed0 == 1 && r.seed1 == 2);
  TfGraph g;
  g.ConstI("seed", {2}, {1, 2});
  g.ConstI("shape", {2}, {5, 7});
  tf::NodeDef* v1 = g.Node("v1", "StatelessRandomUniform", {"shape", "seed"});
  TfGraph::Type(v1, "dtype", tf::DT_FLOAT);
  TfGraph::Type(v1, "Tseed", tf::DT_INT32);
  TfGraph::Type(g.Node("kca", "StatelessRandomGetKeyCounterAlg", {"seed"}), "Tseed", tf::DT_INT32);
  TfGraph::Type(g.Node("v2", "StatelessRandomUniformV2", {"shape", "kca", "kca:1", "kca:2"}),
                "dtype", tf::DT_FLOAT);
  g.ConstI("auto", {}, {3});
  TfGraph::Type(g.Node("v3", "StatelessRandomUniformV2", {"shape", "kca", "kca:1", "auto"}),
                "dtype", tf::DT_FLOAT);
  ASSERT_OK_AND_ASSIGN_TF(graph, Import(g, {}));
  for (const Node& n : graph.nodes()) EXPECT_EQ(n.op.rfind("SalusRandom", 0), std::string::npos);
  ASSERT_OK_AND_ASSIGN_TF(exe, Compile(g, {}, {"v1", "v2", "v3", "kca:2"}));
  Memory mem(*exe);
  ASSERT_OK_AND_ASSIGN_TF(out, RunHost(*exe, mem, {}));
  EXPECT_EQ(Bits(out[0]), r.bits_5x7);
  EXPECT_EQ(Bits(out[1]), r.bits_5x7);
  EXPECT_EQ(Bits(out[2]), r.bits_5x7);
  EXPECT_EQ(out[3].ToInt64s(), (std::vector<int64_t>{1}));
}

// The shared per-group math (philox_math.h, which the CUDA kernels run too) where the counter
// carries across its 32- and 64-bit words and wraps at 2^128, against
// tf.raw_ops.StatelessRandomUniformV2 of these uint64 keys and counters, shape [10].
TEST(TfImporterTest, PhiloxCounterCarriesAsTensorFlows) {
  struct Case {
    uint64_t key, counter0, counter1;
    std::vector<uint32_t> bits;
  };
  const std::vector<Case> cases = {
      {0x0000000000000005ULL,
       0xfffffffffffffffeULL,
       0x0000000000000003ULL,
       {0x3e324218, 0x3f1110b8, 0x3eb19a80, 0x3f3f1bf8, 0x3d253b60, 0x3ea6ade0, 0x3f7a6f5c,
        0x3f4b95e4, 0x3f5701d0, 0x3f769904}},
      {0x800000000000000bULL,
       0xffffffffffffffffULL,
       0xffffffffffffffffULL,
       {0x3e37a210, 0x3dfcd3d0, 0x3e3d1e70, 0x3f3b9668, 0x3f10be64, 0x3e862efc, 0x3f64910a,
        0x3eeeea68, 0x3dad8cf0, 0x3d2f8e40}},
      {0x0000000000000000ULL,
       0x00000000fffffffdULL,
       0x0000000000000000ULL,
       {0x3e5d8608, 0x3f6f475c, 0x3dcc3af0, 0x3efaf91c, 0x3f086ea8, 0x3efa2930, 0x3f1cff42,
        0x3f42fc24, 0x3ec82a74, 0x3ed3b138}},
  };
  for (const Case& c : cases) {
    std::vector<float> y(10);
    for (int64_t group = 0; group < 3; ++group) {
      PhiloxUniformGroup(c.key, c.counter0, c.counter1, group, 10, y.data());
    }
    std::vector<uint32_t> bits(10);
    std::memcpy(bits.data(), y.data(), 40);
    EXPECT_EQ(bits, c.bits) << "counter " << c.counter0 << ", " << c.counter1;
  }
}

TEST(TfImporterTest, StatelessRandomRefusals) {
  auto graph = [](int32_t alg, tf::DataType dtype, bool const_shape) {
    TfGraph g;
    g.Placeholder("seed", tf::DT_INT64);
    g.Node("kc", "StatelessRandomGetKeyCounter", {"seed"});
    if (const_shape) {
      g.ConstI("shape", {1}, {4});
    } else {
      g.Placeholder("shape", tf::DT_INT32);
    }
    g.ConstI("alg", {}, {alg});
    TfGraph::Type(g.Node("u", "StatelessRandomUniformV2", {"shape", "kc", "kc:1", "alg"}), "dtype",
                  dtype);
    return g;
  };
  std::map<std::string, Shape> shapes = {{"seed", {2}}, {"shape", {1}}};
  Status st = ImportStatus(graph(2, tf::DT_FLOAT, true), shapes);  // ThreeFry
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.ToString();
  EXPECT_NE(st.message().find("node 'u'"), std::string::npos) << st.ToString();
  st = ImportStatus(graph(1, tf::DT_DOUBLE, true), shapes);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.ToString();
  st = ImportStatus(graph(1, tf::DT_FLOAT, false), shapes);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("compile-time constant"), std::string::npos) << st.ToString();
  st = ImportStatus(graph(1, tf::DT_FLOAT, true), {{"seed", {3}}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("node 'kc'"), std::string::npos) << st.ToString();
}

TEST(TfImporterTest, Refusals) {
  {
    TfGraph g;
    g.Placeholder("x");
    g.Node("weird", "Bar", {"x"});
    Status st = ImportStatus(g, {{"x", {2}}});
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
    EXPECT_NE(st.message().find("node 'weird': op Bar is not supported"), std::string::npos)
        << st.ToString();
  }
  {
    TfGraph g;
    g.Placeholder("x");
    Status st = ImportStatus(g);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("'x'"), std::string::npos) << st.ToString();
  }
  {
    TfGraph g;
    g.Node("a", "Neg", {"b"});
    g.Node("b", "Neg", {"a"});
    Status st = ImportStatus(g);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("cycle"), std::string::npos) << st.ToString();
  }
  {
    TfGraph g;
    g.Node("a", "Neg", {"nowhere:0"});
    Status st = ImportStatus(g);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("node 'a'"), std::string::npos) << st.ToString();
  }
  {
    TfGraph g;
    tf::NodeDef* v = g.Node("v", "VarHandleOp");
    TfGraph::Type(v, "dtype", tf::DT_FLOAT);
    auto* shape = (*v->mutable_attr())["shape"].mutable_shape();
    shape->add_dim()->set_size(-1);
    Status st = ImportStatus(g);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("node 'v'"), std::string::npos) << st.ToString();
  }
  {
    // Wrong arity and a non-constant shape argument.
    TfGraph g;
    g.Placeholder("x");
    g.Node("neg", "Neg", {"x", "x"});
    Status st = ImportStatus(g, {{"x", {2}}});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("node 'neg'"), std::string::npos) << st.ToString();
    TfGraph h;
    h.Placeholder("x");
    h.Placeholder("s", tf::DT_INT32);
    h.Node("r", "Reshape", {"x", "s"});
    st = ImportStatus(h, {{"x", {2}}, {"s", {1}}});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("node 'r'"), std::string::npos) << st.ToString();
  }
  {
    // Element types the engine lacks.
    TfGraph g;
    g.Placeholder("d", tf::DT_DOUBLE);
    Status st = ImportStatus(g, {{"d", {2}}});
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
    EXPECT_NE(st.message().find("DT_DOUBLE"), std::string::npos) << st.ToString();
  }
  {
    // Garbage bytes.
    const std::string junk = "\xff\xff\xff\xff not a graph";
    TfImportOptions o;
    EXPECT_EQ(TfImporter::Import(junk.data(), junk.size(), o).status().code(),
              StatusCode::kInvalidArgument);
  }
}

// Every op of the Keras 3 MLP and CNN training steps is mapped.
// Note [Compile budgets]: a Const of one value repeated over a large shape is reserved against
// max_constant_bytes before it is allocated.
TEST(TfImporterTest, RepeatedConstantsCountAgainstTheBudget) {
  TfGraph g;
  g.ConstF("c", {1 << 22}, {2.5f});  // 16 MiB from one value
  g.Node("y", "Identity", {"c"});
  CompileOptions o;
  o.fetches = {"y:0"};
  o.limits.max_constant_bytes = (1 << 22) * 4 - 1;
  auto over = Executable::CompileTf(g.Bytes(), o);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("max_constant_bytes"), std::string::npos);
  o.limits.max_nodes = 1;
  EXPECT_EQ(Executable::CompileTf(g.Bytes(), o).status().code(), StatusCode::kResourceExhausted);
}

TEST(TfImporterTest, SupportsKerasTrainingStepOps) {
  const std::vector<std::string> ops = TfImporter::SupportedOps();
  for (const char* op :
       {"AddV2", "ArgMax", "AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp",
        "BiasAdd", "BiasAddGrad", "Bitcast", "BitwiseAnd", "BroadcastTo", "Cast", "Const",
        "DivNoNan", "Equal", "ExpandDims", "Identity", "IdentityN", "Less", "LogicalAnd", "MatMul",
        "Mul", "Neg", "NoOp", "Pack", "Placeholder", "Pow", "Prod", "Range", "ReadVariableOp",
        "RealDiv", "Relu", "ReluGrad", "Reshape", "SelectV2", "Shape", "Softmax",
        "SparseSoftmaxCrossEntropyWithLogits", "Sqrt", "Square", "StridedSlice", "Sub", "Sum",
        "Tile", "AddN", "BroadcastGradientArgs", "Conv2D", "Conv2DBackpropFilter",
        "Conv2DBackpropInput", "FloorMod", "GatherV2", "GreaterEqual", "MaxPool", "MaxPoolGrad",
        "Mean", "Rsqrt", "RsqrtGrad", "SquaredDifference", "Squeeze", "StopGradient", "ShapeN",
        "StatelessRandomGetKeyCounter", "StatelessRandomUniformV2", "VarHandleOp",
        // keras.applications' ops beyond those.
        "AvgPool", "AvgPoolGrad", "ConcatOffset", "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput",
        "DynamicStitch", "Erfc", "Pad", "Relu6", "Relu6Grad", "Slice", "StridedSliceGrad"}) {
    EXPECT_TRUE(std::binary_search(ops.begin(), ops.end(), op)) << op;
  }
}

}  // namespace
}  // namespace salus::exec

// The adaptor registers and captures exactly the ops the importer maps (tf_ops.inc).
namespace salus::exec {

TEST(TfImporterTest, AdaptorOpListIsTheImportersOps) {
  std::vector<std::string> listed = {
      "Placeholder",
      "VarHandleOp",
#define SALUS_TF_OP(name) #name,
#include "exec/tf_ops.inc"
#undef SALUS_TF_OP
  };
  std::vector<std::string> supported = TfImporter::SupportedOps();
  std::sort(listed.begin(), listed.end());
  std::sort(supported.begin(), supported.end());
  EXPECT_EQ(listed, supported);
}

}  // namespace salus::exec
