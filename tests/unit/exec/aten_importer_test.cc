// The ATen graph importer (aten_importer.h) through Executable::CompileAten: a hand-written
// SGD step on a linear layer (addmm, relu, mean, the update and its copy_ into state) against
// the same step in plain loops, and the refusals: unknown operators named together, malformed
// indices, a result whose declared shape the lowering does not give, copy_ into non-state.
#include "exec/aten_importer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "exec/executable.h"
#include "model_builder.h"
#include "salus/v1/aten_graph.pb.h"

namespace salus::exec {
namespace {

namespace v1 = ::salus::v1;
using testing::Memory;
using testing::RunHost;

class AtenGraphBuilder {
 public:
  int Value(const std::string& name, Shape shape, v1::AtenDtype t = v1::ATEN_FLOAT32) {
    v1::AtenValue* v = g_.add_values();
    v->set_name(name);
    v->set_dtype(t);
    for (int64_t d : shape) v->add_shape(d);
    return g_.values_size() - 1;
  }
  v1::AtenNode* Node(const std::string& op, std::vector<int> outputs) {
    v1::AtenNode* n = g_.add_nodes();
    n->set_op(op);
    for (int o : outputs) n->add_outputs(o);
    return n;
  }
  static void Tensor(v1::AtenNode* n, const std::string& name, int value) {
    v1::AtenArgument* a = n->add_args();
    a->set_name(name);
    a->set_value(value);
  }
  static void Number(v1::AtenNode* n, const std::string& name, double v) {
    v1::AtenArgument* a = n->add_args();
    a->set_name(name);
    a->set_float_value(v);
  }
  static void Int(v1::AtenNode* n, const std::string& name, int64_t v) {
    v1::AtenArgument* a = n->add_args();
    a->set_name(name);
    a->set_int_value(v);
  }
  static void Ints(v1::AtenNode* n, const std::string& name, std::vector<int64_t> v) {
    v1::AtenArgument* a = n->add_args();
    a->set_name(name);
    for (int64_t x : v) a->mutable_ints()->add_v(x);
  }
  static void Bool(v1::AtenNode* n, const std::string& name, bool v) {
    v1::AtenArgument* a = n->add_args();
    a->set_name(name);
    a->set_bool_value(v);
  }
  v1::AtenGraph& graph() { return g_; }
  std::string Bytes() const { return g_.SerializeAsString(); }

 private:
  v1::AtenGraph g_;
};

// y = relu(x @ w^T + b); loss = mean(y); the step also writes w := w - lr * w (a stand-in
// update that exercises copy_ into state without a backward pass).
AtenGraphBuilder LinearStep() {
  AtenGraphBuilder b;
  const int x = b.Value("input0", {4, 3});
  const int w = b.Value("w", {2, 3});
  const int bias = b.Value("b", {2});
  b.graph().add_inputs(x);
  b.graph().add_state(w);
  b.graph().add_state(bias);
  const int wt = b.Value("wt", {3, 2});
  auto* t = b.Node("aten.permute_copy.default", {wt});
  AtenGraphBuilder::Tensor(t, "self", w);
  AtenGraphBuilder::Ints(t, "dims", {1, 0});
  const int mm = b.Value("mm", {4, 2});
  auto* addmm = b.Node("aten.addmm.default", {mm});
  AtenGraphBuilder::Tensor(addmm, "self", bias);
  AtenGraphBuilder::Tensor(addmm, "mat1", x);
  AtenGraphBuilder::Tensor(addmm, "mat2", wt);
  AtenGraphBuilder::Number(addmm, "beta", 1);
  AtenGraphBuilder::Number(addmm, "alpha", 1);
  const int y = b.Value("y", {4, 2});
  AtenGraphBuilder::Tensor(b.Node("aten.relu.default", {y}), "self", mm);
  const int loss = b.Value("loss", {});
  auto* mean = b.Node("aten.mean.dim", {loss});
  AtenGraphBuilder::Tensor(mean, "self", y);
  v1::AtenArgument* none = mean->add_args();
  none->set_name("dim");
  none->set_none(true);
  AtenGraphBuilder::Bool(mean, "keepdim", false);
  const int scaled = b.Value("scaled", {2, 3});
  auto* mul = b.Node("aten.mul.Tensor", {scaled});
  AtenGraphBuilder::Tensor(mul, "self", w);
  AtenGraphBuilder::Number(mul, "other", 0.5);
  const int copied = b.Value("copied", {2, 3});
  auto* copy = b.Node("aten.copy_.default", {copied});
  AtenGraphBuilder::Tensor(copy, "self", w);
  AtenGraphBuilder::Tensor(copy, "src", scaled);
  AtenGraphBuilder::Bool(copy, "non_blocking", false);
  b.graph().add_outputs(loss);
  return b;
}

TEST(AtenImporter, RunsAStepAndWritesItsState) {
  const AtenGraphBuilder b = LinearStep();
  CompileOptions o;
  auto exe_or = Executable::CompileAten(b.Bytes(), o);
  ASSERT_TRUE(exe_or.ok()) << exe_or.status().ToString();
  auto exe = std::move(exe_or).value();
  ASSERT_EQ(exe->fetches().size(), 1u);
  EXPECT_EQ(exe->fetches()[0].name, "output0");
  Memory mem(*exe);
  const std::vector<float> x = {1, 2, 3, -1, -2, -3, 0.5, 0, 1, 2, 2, 2};
  const std::vector<float> w = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f};
  const std::vector<float> bias = {0.05f, -0.1f};
  ASSERT_TRUE(exe->WritePersistent(mem.p(), "w", HostTensor::FromFloats({2, 3}, w)).ok());
  ASSERT_TRUE(exe->WritePersistent(mem.p(), "b", HostTensor::FromFloats({2}, bias)).ok());
  auto out = RunHost(*exe, mem, {HostTensor::FromFloats({4, 3}, x)});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  float want = 0;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j) {
      float acc = bias[j];
      for (int k = 0; k < 3; ++k) acc += x[i * 3 + k] * w[j * 3 + k];
      want += acc > 0 ? acc : 0;
    }
  }
  EXPECT_NEAR((*out)[0].floats()[0], want / 8, 1e-6);
  auto w_after = exe->ReadPersistent(mem.p(), "w");
  ASSERT_TRUE(w_after.ok());
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(w_after->floats()[i], w[i] * 0.5f);
}

TEST(AtenImporter, NamesEveryOperatorItLacks) {
  AtenGraphBuilder b = LinearStep();
  b.graph().mutable_nodes(2)->set_op("aten.frobnicate.default");
  b.graph().mutable_nodes(1)->set_op("aten.quantize.default");
  auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(exe.status().message().find("aten.frobnicate.default"), std::string::npos);
  EXPECT_NE(exe.status().message().find("aten.quantize.default"), std::string::npos);
}

TEST(AtenImporter, RefusesMalformedGraphs) {
  {  // not a graph at all
    auto exe = Executable::CompileAten("\x08\x01garbage", CompileOptions{});
    ASSERT_FALSE(exe.ok());
    EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument);
  }
  {  // a value index out of range
    AtenGraphBuilder b = LinearStep();
    b.graph().mutable_nodes(2)->mutable_args(0)->set_value(99);
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    ASSERT_FALSE(exe.ok());
    EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(exe.status().message().find("aten.relu.default"), std::string::npos);
  }
  {  // a declared shape the lowering does not give
    AtenGraphBuilder b = LinearStep();
    b.graph().mutable_values(5)->set_shape(1, 3);  // "y" declared [4,3]
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    ASSERT_FALSE(exe.ok());
    EXPECT_NE(exe.status().message().find("declares"), std::string::npos);
  }
  {  // copy_ into an input
    AtenGraphBuilder b = LinearStep();
    b.graph().mutable_nodes(5)->mutable_args(0)->set_value(0);
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    ASSERT_FALSE(exe.ok());
    EXPECT_EQ(exe.status().code(), StatusCode::kUnimplemented);
  }
  {  // float64 values
    AtenGraphBuilder b = LinearStep();
    b.graph().mutable_values(0)->set_dtype(v1::ATEN_FLOAT64);
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    ASSERT_FALSE(exe.ok());
    EXPECT_EQ(exe.status().code(), StatusCode::kUnimplemented);
  }
}

// Note [Compile budgets]: a constant's data is checked against its declaration before anything
// is allocated, and fills are reserved against max_constant_bytes first.
TEST(AtenImporter, DeclarationsAllocateNothingPastTheBudget) {
  for (int64_t elements : {int64_t{1} << 40, int64_t{1} << 28}) {
    AtenGraphBuilder b;
    const int c = b.Value("c", {elements});
    b.graph().mutable_values(c)->set_constant(true);  // and no data
    b.graph().add_outputs(c);
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    ASSERT_FALSE(exe.ok());
    EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument) << exe.status();
  }
  AtenGraphBuilder b;
  const int y = b.Value("y", {1 << 22});  // 16 MiB of floats
  v1::AtenNode* full = b.Node("aten.full.default", {y});
  AtenGraphBuilder::Ints(full, "size", {1 << 22});
  AtenGraphBuilder::Number(full, "fill_value", 1.5);
  b.graph().add_outputs(y);
  CompileOptions o;
  o.limits.max_constant_bytes = (1 << 22) * 4 - 1;
  auto over = Executable::CompileAten(b.Bytes(), o);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("max_constant_bytes"), std::string::npos);
  o.limits.max_constant_bytes = 2 * (1 << 22) * 4;  // the fill, and its copy as the output
  auto fits = Executable::CompileAten(b.Bytes(), o);
  EXPECT_TRUE(fits.ok()) << fits.status();
  o.limits.max_nodes = 0;
  EXPECT_EQ(Executable::CompileAten(b.Bytes(), o).status().code(), StatusCode::kResourceExhausted);
}

// select_scatter (an assignment into a column) lowers as a slice of width 1; an index outside
// the dim is refused naming it.
// A graph of one `op` writing input `src` into input `x`, its output of x's shape the graph's;
// the caller adds the op's other arguments.
v1::AtenNode* ScatterInto(AtenGraphBuilder& b, const std::string& op, const Shape& x_shape,
                          const Shape& src_shape) {
  const int x = b.Value("x", x_shape);
  const int src = b.Value("src", src_shape);
  b.graph().add_inputs(x);
  b.graph().add_inputs(src);
  const int y = b.Value("y", x_shape);
  v1::AtenNode* n = b.Node(op, {y});
  AtenGraphBuilder::Tensor(n, "self", x);
  AtenGraphBuilder::Tensor(n, "src", src);
  b.graph().add_outputs(y);
  return n;
}

TEST(AtenImporter, SelectScatterWritesOneColumnAndRefusesAnIndexOutside) {
  for (int64_t index : {1, -1, 3}) {
    SCOPED_TRACE(index);
    AtenGraphBuilder b;
    v1::AtenNode* n = ScatterInto(b, "aten.select_scatter.default", {2, 3}, {2});
    AtenGraphBuilder::Int(n, "dim", 1);
    AtenGraphBuilder::Int(n, "index", index);
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    if (index == 3) {
      ASSERT_FALSE(exe.ok());
      EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(exe.status().message().find("index 3 is out of range"), std::string::npos)
          << exe.status().message();
      continue;
    }
    ASSERT_TRUE(exe.ok()) << exe.status();
    Memory mem(**exe);
    auto out = RunHost(**exe, mem,
                       {HostTensor::FromFloats({2, 3}, {1, 2, 3, 4, 5, 6}),
                        HostTensor::FromFloats({2}, {-1, -2})});
    ASSERT_TRUE(out.ok()) << out.status();
    const std::vector<float> want = index == 1 ? std::vector<float>{1, -1, 3, 4, -2, 6}
                                               : std::vector<float>{1, 2, -1, 4, 5, -2};
    EXPECT_EQ(std::vector<float>((*out)[0].floats(), (*out)[0].floats() + 6), want);
  }
}

// slice_scatter with a step (x[:, 1::2]'s gradient): src's columns land at 1 and 3.
TEST(AtenImporter, SliceScatterWithAStep) {
  AtenGraphBuilder b;
  v1::AtenNode* n = ScatterInto(b, "aten.slice_scatter.default", {2, 5}, {2, 2});
  for (const auto& [name, v] : std::vector<std::pair<std::string, int64_t>>{
           {"dim", 1}, {"start", 1}, {"end", 5}, {"step", 2}}) {
    AtenGraphBuilder::Int(n, name, v);
  }
  auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
  ASSERT_TRUE(exe.ok()) << exe.status();
  Memory mem(**exe);
  auto out = RunHost(**exe, mem,
                     {HostTensor::FromFloats({2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}),
                      HostTensor::FromFloats({2, 2}, {-1, -2, -3, -4})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::vector<float>((*out)[0].floats(), (*out)[0].floats() + 10),
            std::vector<float>({0, -1, 2, -2, 4, 5, -3, 7, -4, 9}));
}

// Note [Strided views]: x of 12 elements; the view [2, 3] with strides [1, 2] from offset 4 is
// the block x[4:10] read column-major, and the scatter writes src back there; strides that
// overlap are refused naming them.
TEST(AtenImporter, AsStridedViewsOfADenseBlock) {
  const HostTensor x = HostTensor::FromFloats({3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  auto view_args = [](v1::AtenNode* n, std::vector<int64_t> stride) {
    AtenGraphBuilder::Ints(n, "size", {2, 3});
    AtenGraphBuilder::Ints(n, "stride", std::move(stride));
    AtenGraphBuilder::Int(n, "storage_offset", 4);
  };
  {
    AtenGraphBuilder b;
    const int in = b.Value("x", {3, 4});
    b.graph().add_inputs(in);
    const int y = b.Value("y", {2, 3});
    v1::AtenNode* n = b.Node("aten.as_strided_copy.default", {y});
    AtenGraphBuilder::Tensor(n, "self", in);
    view_args(n, {1, 2});
    b.graph().add_outputs(y);
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    ASSERT_TRUE(exe.ok()) << exe.status();
    Memory mem(**exe);
    auto out = RunHost(**exe, mem, {x});
    ASSERT_TRUE(out.ok()) << out.status();
    // y[i][j] = storage[4 + i + 2j].
    EXPECT_EQ(std::vector<float>((*out)[0].floats(), (*out)[0].floats() + 6),
              std::vector<float>({4, 6, 8, 5, 7, 9}));
  }
  {
    AtenGraphBuilder b;
    v1::AtenNode* n = ScatterInto(b, "aten.as_strided_scatter.default", {3, 4}, {2, 3});
    view_args(n, {1, 2});
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    ASSERT_TRUE(exe.ok()) << exe.status();
    Memory mem(**exe);
    auto out = RunHost(**exe, mem, {x, HostTensor::FromFloats({2, 3}, {-1, -2, -3, -4, -5, -6})});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(std::vector<float>((*out)[0].floats(), (*out)[0].floats() + 12),
              std::vector<float>({0, 1, 2, 3, -1, -4, -2, -5, -3, -6, 10, 11}));
  }
  {
    AtenGraphBuilder b;
    v1::AtenNode* n = ScatterInto(b, "aten.as_strided_scatter.default", {3, 4}, {2, 3});
    view_args(n, {1, 1});  // overlapping: not a dense block
    auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
    ASSERT_FALSE(exe.ok());
    EXPECT_EQ(exe.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(exe.status().message().find("stride [1, 1]"), std::string::npos)
        << exe.status().message();
  }
}

// cumsum along a dim over 2048 runs in blocks: exact for integers in float.
TEST(AtenImporter, CumsumAlongALongDimInBlocks) {
  constexpr int64_t kLong = 5000;
  AtenGraphBuilder b;
  const int x = b.Value("x", {2, kLong});
  b.graph().add_inputs(x);
  const int y = b.Value("y", {2, kLong});
  auto* n = b.Node("aten.cumsum.default", {y});
  AtenGraphBuilder::Tensor(n, "self", x);
  v1::AtenArgument* dim = n->add_args();
  dim->set_name("dim");
  dim->set_int_value(-1);
  b.graph().add_outputs(y);
  auto exe = Executable::CompileAten(b.Bytes(), CompileOptions{});
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::vector<float> v(2 * kLong);
  for (int64_t i = 0; i < 2 * kLong; ++i) v[i] = static_cast<float>(i % 7) - 2.f;
  Memory mem(**exe);
  auto out = RunHost(**exe, mem, {HostTensor::FromFloats({2, kLong}, v)});
  ASSERT_TRUE(out.ok()) << out.status();
  const float* got = (*out)[0].floats();
  for (int64_t row = 0; row < 2; ++row) {
    float sum = 0;
    for (int64_t i = 0; i < kLong; ++i) {
      sum += v[row * kLong + i];
      ASSERT_EQ(got[row * kLong + i], sum) << row << ", " << i;
    }
  }
}

// p, buf (state); g, lr (inputs); salus.sgd_update then the copy_ writes the tracer emits.
AtenGraphBuilder SgdStep(bool read_after) {
  AtenGraphBuilder b;
  const int p = b.Value("p", {3}), buf = b.Value("buf", {3});
  const int g = b.Value("input0", {3}), lr = b.Value("lr.0", {1});
  b.graph().add_state(p);
  b.graph().add_state(buf);
  b.graph().add_inputs(g);
  b.graph().add_inputs(lr);
  const int p2 = b.Value("p2", {3}), buf2 = b.Value("buf2", {3});
  auto* u = b.Node("salus.sgd_update.default", {p2, buf2});
  AtenGraphBuilder::Tensor(u, "param", p);
  AtenGraphBuilder::Tensor(u, "grad", g);
  AtenGraphBuilder::Tensor(u, "buf", buf);
  AtenGraphBuilder::Tensor(u, "lr", lr);
  AtenGraphBuilder::Number(u, "momentum", 0.9);
  AtenGraphBuilder::Number(u, "weight_decay", 0.1);
  AtenGraphBuilder::Bool(u, "nesterov", false);
  const int out = b.Value("out", {3});
  AtenGraphBuilder::Tensor(b.Node("aten.relu.default", {out}), "self", read_after ? p : p2);
  for (auto [dst, src] : {std::pair{p, p2}, std::pair{buf, buf2}}) {
    const int done = b.Value("done" + std::to_string(dst), {3});
    auto* c = b.Node("aten.copy_.default", {done});
    AtenGraphBuilder::Tensor(c, "self", dst);
    AtenGraphBuilder::Tensor(c, "src", src);
    AtenGraphBuilder::Bool(c, "non_blocking", false);
  }
  b.graph().add_outputs(out);
  return b;
}

TEST(AtenImporter, FusedSgdUpdateWritesStateInPlaceWithTheFedLearningRate) {
  auto exe_or = Executable::CompileAten(SgdStep(false).Bytes(), CompileOptions{});
  ASSERT_TRUE(exe_or.ok()) << exe_or.status().ToString();
  auto exe = std::move(exe_or).value();
  Memory mem(*exe);
  const std::vector<float> p = {1, -2, 3}, buf = {0.5f, 0, -1}, g = {0.1f, 0.2f, -0.3f};
  ASSERT_TRUE(exe->WritePersistent(mem.p(), "p", HostTensor::FromFloats({3}, p)).ok());
  ASSERT_TRUE(exe->WritePersistent(mem.p(), "buf", HostTensor::FromFloats({3}, buf)).ok());
  for (float lr : {0.5f, 0.25f}) {  // a scheduler's change is seen at once
    auto before = exe->ReadPersistent(mem.p(), "p");
    auto vel = exe->ReadPersistent(mem.p(), "buf");
    ASSERT_TRUE(before.ok() && vel.ok());
    auto out =
        RunHost(*exe, mem, {HostTensor::FromFloats({3}, g), HostTensor::FromFloats({1}, {lr})});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    auto after = exe->ReadPersistent(mem.p(), "p");
    ASSERT_TRUE(after.ok());
    for (int i = 0; i < 3; ++i) {
      const float d = g[i] + 0.1f * before->floats()[i];
      const float v = 0.9f * vel->floats()[i] + d;
      const float want = before->floats()[i] - lr * v;
      EXPECT_FLOAT_EQ(after->floats()[i], want);
      EXPECT_FLOAT_EQ((*out)[0].floats()[i], want > 0 ? want : 0);  // reads the new value
    }
  }
}

TEST(AtenImporter, RefusesAnUpdateWhoseOldValueIsReadAfterIt) {
  auto exe = Executable::CompileAten(SgdStep(true).Bytes(), CompileOptions{});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(exe.status().message().find("read after"), std::string::npos);
}

TEST(AtenImporter, ListsItsOperators) {
  const std::vector<std::string> ops = AtenImporter::SupportedOps();
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  EXPECT_NE(std::find(ops.begin(), ops.end(), "aten.convolution_backward.default"), ops.end());
}

}  // namespace
}  // namespace salus::exec
