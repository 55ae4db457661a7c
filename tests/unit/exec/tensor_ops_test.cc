// The tensor ops of exported models (cpu_tensor_kernels.cc, shape_inference.cc) against
// hand-computed values: through whole models (import, folding of constant nodes, executables)
// at opset 17 and older, and node by node on the CPU kernels for the opsets past what libonnx's
// checker knows (Gelu-20, Split-18, the Reduce ops' axes input from 18).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "exec/kernel_registry.h"
#include "exec/shape_inference.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kInt64 = onnx::TensorProto::INT64;
constexpr int kBool = onnx::TensorProto::BOOL;

void SetOpset(ModelBuilder& m, int opset) { m.proto().mutable_opset_import(0)->set_version(opset); }

// A graph output of the given element type (ModelBuilder's are float).
void TypedOutput(ModelBuilder& m, const std::string& name, const Shape& shape, int type) {
  m.Output(name, shape);
  auto* out = m.proto().mutable_graph()->mutable_output(m.proto().graph().output_size() - 1);
  out->mutable_type()->mutable_tensor_type()->set_elem_type(type);
}

void AttrTensor(onnx::NodeProto& n, const std::string& name, const HostTensor& t) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::TENSOR);
  auto* p = a->mutable_t();
  p->set_data_type(t.type == DataType::kInt64  ? kInt64
                   : t.type == DataType::kBool ? kBool
                                               : kFloat);
  for (int64_t d : t.shape) p->add_dims(d);
  p->set_raw_data(std::string(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size()));
}

HostTensor Bools(Shape s, const std::vector<int>& v) {
  HostTensor t(DataType::kBool, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.bytes[i] = std::byte(v[i] != 0);
  return t;
}

std::vector<float> Floats(const HostTensor& t) {
  return std::vector<float>(t.floats(), t.floats() + t.num_elements());
}
std::vector<int64_t> Int64s(const HostTensor& t) {
  return std::vector<int64_t>(t.int64s(), t.int64s() + t.num_elements());
}
std::vector<int> BoolsOf(const HostTensor& t) {
  std::vector<int> v;
  for (std::byte b : t.bytes) v.push_back(static_cast<int>(b));
  return v;
}

// Compiles an inference executable with the given input shapes and runs it once.
StatusOr<std::vector<HostTensor>> CompileAndRun(const ModelBuilder& m,
                                                const std::vector<std::string>& names,
                                                const std::vector<HostTensor>& feeds) {
  CompileOptions o;
  for (size_t i = 0; i < names.size(); ++i) o.input_shapes[names[i]] = feeds[i].shape;
  SALUS_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, Executable::Compile(m.Bytes(), o));
  Memory mem(*exe);
  return RunHost(*exe, mem, feeds);
}

// ---------------------------------------------------------------------------------------------
// One node on the CPU kernels, outside any model: for opsets libonnx 1.12 cannot check.

struct Arg {
  HostTensor t;
  bool constant = false;
  bool omitted = false;
};
Arg Fed(HostTensor t) { return {std::move(t), false, false}; }
Arg Const(HostTensor t) { return {std::move(t), true, false}; }
Arg Omitted() { return {HostTensor(), false, true}; }

// Outputs: their types and shapes for an engine op (which has no shape rules), or none of
// either (both kUndefined/empty) for shape inference to fill in.
StatusOr<std::vector<HostTensor>> RunNodeWith(
    int opset, const std::string& op, std::map<std::string, Attribute> attrs,
    const std::vector<Arg>& args, const std::vector<std::pair<DataType, Shape>>& outputs) {
  Graph g;
  g.set_opset(opset);
  Node n;
  n.op = op;
  n.name = "n";
  n.attrs = std::move(attrs);
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].omitted) {
      n.inputs.push_back(kNoValue);
      continue;
    }
    Value v;
    v.name = "in" + std::to_string(i);
    v.type = args[i].t.type;
    v.shape = args[i].t.shape;
    v.kind = args[i].constant ? ValueKind::kConstant : ValueKind::kInput;
    if (args[i].constant) v.data = args[i].t;
    n.inputs.push_back(g.AddValue(std::move(v)));
  }
  bool infer = false;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Value v;
    v.name = "out" + std::to_string(i);
    v.type = outputs[i].first;
    v.shape = outputs[i].second;
    infer = infer || v.type == DataType::kUndefined;
    n.outputs.push_back(g.AddValue(std::move(v)));
  }
  const int idx = g.AddNode(std::move(n));
  if (infer) SALUS_RETURN_IF_ERROR(InferNodeShapes(&g, idx));
  const Node& node = g.nodes()[idx];
  SALUS_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> k,
                         KernelRegistry::Global().Create(node, g, DeviceType::kCpu));
  KernelArgs ka;
  for (const Arg& a : args) {
    ka.inputs.push_back(a.omitted ? nullptr : const_cast<std::byte*>(a.t.bytes.data()));
  }
  std::vector<HostTensor> outs;
  for (ValueId o : node.outputs) outs.emplace_back(g.value(o).type, g.value(o).shape);
  for (HostTensor& t : outs) ka.outputs.push_back(t.bytes.data());
  std::vector<std::byte> scratch(k->scratch_bytes() + kAlignment);
  ka.scratch = Memory::Align(scratch);
  SALUS_RETURN_IF_ERROR(k->Run(ka));
  return outs;
}

StatusOr<std::vector<HostTensor>> RunNode(int opset, const std::string& op,
                                          std::map<std::string, Attribute> attrs,
                                          const std::vector<Arg>& args, int outputs = 1) {
  return RunNodeWith(opset, op, std::move(attrs), args,
                     std::vector<std::pair<DataType, Shape>>(outputs, {DataType::kUndefined, {}}));
}

// ---------------------------------------------------------------------------------------------
// Shape arithmetic.

// The pattern exporters emit for x.view(x.size(0), -1)-like reshapes: Shape -> Gather -> Mul ->
// Unsqueeze -> Concat -> Reshape on a fed input. Everything but the Reshape folds at import.
TEST(TensorOpsTest, ShapeArithmeticFoldsIntoReshape) {
  ModelBuilder m;
  m.Input("x", {2, 3, 4});
  m.Int64Initializer("i0", {}, {0});
  m.Int64Initializer("i1", {}, {1});
  m.Int64Initializer("i2", {}, {-1});
  m.Int64Initializer("axes", {1}, {0});
  m.Node("Shape", {"x"}, {"s"});
  m.Node("Gather", {"s", "i0"}, {"batch"});
  m.Node("Gather", {"s", "i1"}, {"d1"});
  m.Node("Gather", {"s", "i2"}, {"d2"});
  m.Node("Mul", {"d1", "d2"}, {"rest"});
  m.Node("Unsqueeze", {"batch", "axes"}, {"ub"});
  m.Node("Unsqueeze", {"rest", "axes"}, {"ur"});
  auto& cat = m.Node("Concat", {"ub", "ur"}, {"shape"});
  ModelBuilder::Attr(cat, "axis", int64_t{0});
  m.Node("Reshape", {"x", "shape"}, {"y"});
  m.Output("y", {2, 12});
  std::vector<float> x(24);
  for (int i = 0; i < 24; ++i) x[i] = static_cast<float>(i);
  CompileOptions o;
  o.input_shapes = {{"x", {2, 3, 4}}};
  auto exe = Executable::Compile(m.Bytes(), o);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->fetches()[0].shape, Shape({2, 12}));
  EXPECT_EQ((*exe)->num_steps(), 1u);  // only the Reshape runs
  Memory mem(**exe);
  auto out = RunHost(**exe, mem, {HostTensor::FromFloats({2, 3, 4}, x)});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Floats((*out)[0]), x);
}

// int64 arithmetic on fed tensors (run time) and on constants (folded): Div truncates toward
// zero, Mod follows fmod, Neg and Concat carry int64.
TEST(TensorOpsTest, Int64ArithmeticAtRunTimeAndFolded) {
  for (bool fed : {true, false}) {
    SCOPED_TRACE(fed ? "fed" : "folded");
    ModelBuilder m;
    const std::vector<int64_t> a = {7, -7, 7, -7, 9}, b = {2, 2, -2, -2, 3};
    if (fed) {
      m.Input("a", {5}, kInt64).Input("b", {5}, kInt64);
    } else {
      m.Int64Initializer("a", {5}, a).Int64Initializer("b", {5}, b);
    }
    m.Int64Initializer("c3", {1}, {3});
    m.Node("Div", {"a", "b"}, {"div"});
    m.Node("Mod", {"a", "c3"}, {"mod"});
    auto& fm = m.Node("Mod", {"a", "b"}, {"fmod"});
    ModelBuilder::Attr(fm, "fmod", int64_t{1});
    m.Node("Sub", {"a", "b"}, {"sub"});
    m.Node("Neg", {"sub"}, {"neg"});
    auto& cat = m.Node("Concat", {"div", "neg"}, {"cat"});
    ModelBuilder::Attr(cat, "axis", int64_t{0});
    for (const char* o : {"div", "mod", "fmod"}) TypedOutput(m, o, {5}, kInt64);
    TypedOutput(m, "cat", {10}, kInt64);
    auto out = fed ? CompileAndRun(m, {"a", "b"},
                                   {HostTensor::FromInt64s({5}, a), HostTensor::FromInt64s({5}, b)})
                   : CompileAndRun(m, {}, {});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Int64s((*out)[0]), std::vector<int64_t>({3, -3, -3, 3, 3}));
    EXPECT_EQ(Int64s((*out)[1]), std::vector<int64_t>({1, 2, 1, 2, 0}));    // Python's %
    EXPECT_EQ(Int64s((*out)[2]), std::vector<int64_t>({1, -1, 1, -1, 0}));  // C's %
    EXPECT_EQ(Int64s((*out)[3]), std::vector<int64_t>({3, -3, -3, 3, 3, -5, 9, -9, 5, -6}));
  }
}

TEST(TensorOpsTest, Int64DivisionByZeroIsAnError) {
  // Folded: the compile fails naming the node.
  ModelBuilder m;
  m.Int64Initializer("a", {2}, {4, 5}).Int64Initializer("b", {2}, {1, 0});
  m.Node("Div", {"a", "b"}, {"y"});
  TypedOutput(m, "y", {2}, kInt64);
  auto exe = Executable::Compile(m.Bytes(), CompileOptions{});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(exe.status().message().find("Div"), std::string::npos) << exe.status();
  EXPECT_NE(exe.status().message().find("division by zero"), std::string::npos);

  // At run time: Run fails naming the node.
  ModelBuilder r;
  r.Input("a", {2}, kInt64).Input("b", {2}, kInt64);
  r.Node("Mod", {"a", "b"}, {"y"});
  TypedOutput(r, "y", {2}, kInt64);
  auto out = CompileAndRun(
      r, {"a", "b"}, {HostTensor::FromInt64s({2}, {4, 5}), HostTensor::FromInt64s({2}, {0, 1})});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("Mod"), std::string::npos) << out.status();
}

TEST(TensorOpsTest, FloatModNeedsFmod) {
  auto ok = RunNode(17, "Mod", {{"fmod", IntAttr(1)}},
                    {Fed(HostTensor::FromFloats({3}, {5.5f, -5.5f, 3.f})),
                     Const(HostTensor::FromFloats({}, {2.f}))});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(Floats((*ok)[0]), std::vector<float>({1.5f, -1.5f, 1.f}));
  auto bad =
      RunNode(17, "Mod", {},
              {Fed(HostTensor::FromFloats({1}, {1.f})), Fed(HostTensor::FromFloats({1}, {2.f}))});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
}

// ---------------------------------------------------------------------------------------------
// Generators, casts, comparisons and selection.

TEST(TensorOpsTest, RangeAndConstantOfShapeFold) {
  ModelBuilder m;
  m.Int64Initializer("s", {}, {10}).Int64Initializer("l", {}, {0}).Int64Initializer("d", {}, {-3});
  m.Initializer("fs", {}, {1.f}).Initializer("fl", {}, {2.f}).Initializer("fd", {}, {0.25f});
  m.Int64Initializer("shape", {2}, {2, 3});
  m.Node("Range", {"s", "l", "d"}, {"r"});
  m.Node("Range", {"fs", "fl", "fd"}, {"fr"});
  auto& c = m.Node("ConstantOfShape", {"shape"}, {"c"});
  AttrTensor(c, "value", HostTensor::FromInt64s({1}, {7}));
  m.Node("ConstantOfShape", {"shape"}, {"z"});
  TypedOutput(m, "r", {4}, kInt64);
  m.Output("fr", {4});
  TypedOutput(m, "c", {2, 3}, kInt64);
  m.Output("z", {2, 3});
  auto out = CompileAndRun(m, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Int64s((*out)[0]), std::vector<int64_t>({10, 7, 4, 1}));
  EXPECT_EQ(Floats((*out)[1]), std::vector<float>({1.f, 1.25f, 1.5f, 1.75f}));
  EXPECT_EQ((*out)[2].shape, Shape({2, 3}));
  EXPECT_EQ(Int64s((*out)[2]), std::vector<int64_t>(6, 7));
  EXPECT_EQ(Floats((*out)[3]), std::vector<float>(6, 0.f));
}

TEST(TensorOpsTest, ShapeDeterminingInputsMustBeConstant) {
  struct Case {
    const char* what;
    std::string op;
    std::vector<Arg> args;
  };
  const HostTensor i3 = HostTensor::FromInt64s({}, {3});
  const std::vector<Case> cases = {
      // Range's limit fed at run time.
      {"range", "Range", {Const(HostTensor::FromInt64s({}, {0})), Fed(i3), Const(i3)}},
      // ConstantOfShape of a fed shape.
      {"constant_of_shape", "ConstantOfShape", {Fed(HostTensor::FromInt64s({1}, {3}))}},
      // Expand to a fed shape.
      {"expand",
       "Expand",
       {Fed(HostTensor::FromFloats({1}, {1.f})), Fed(HostTensor::FromInt64s({1}, {3}))}},
      // Slice with fed starts.
      {"slice",
       "Slice",
       {Fed(HostTensor::FromFloats({4}, {1, 2, 3, 4})), Fed(HostTensor::FromInt64s({1}, {1})),
        Const(HostTensor::FromInt64s({1}, {3}))}},
      // Split with fed sizes.
      {"split",
       "Split",
       {Fed(HostTensor::FromFloats({4}, {1, 2, 3, 4})), Fed(HostTensor::FromInt64s({2}, {1, 3}))}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto out = RunNode(17, c.op, {}, c.args, c.op == "Split" ? 2 : 1);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(out.status().message().find(c.op + " 'n'"), std::string::npos) << out.status();
    EXPECT_NE(out.status().message().find("compile-time constant"), std::string::npos);
  }
}

TEST(TensorOpsTest, CastBetweenFloatInt64AndBool) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto to_int = RunNode(17, "Cast", {{"to", IntAttr(kInt64)}},
                        {Fed(HostTensor::FromFloats({5}, {1.7f, -1.7f, 0.f, nan, 1e30f}))});
  ASSERT_TRUE(to_int.ok()) << to_int.status();
  EXPECT_EQ(Int64s((*to_int)[0]),
            std::vector<int64_t>({1, -1, 0, 0, std::numeric_limits<int64_t>::max()}));
  auto to_bool = RunNode(17, "Cast", {{"to", IntAttr(kBool)}},
                         {Fed(HostTensor::FromFloats({4}, {1.7f, -0.5f, 0.f, nan}))});
  ASSERT_TRUE(to_bool.ok()) << to_bool.status();
  EXPECT_EQ(BoolsOf((*to_bool)[0]), std::vector<int>({1, 1, 0, 1}));
  auto to_float = RunNode(17, "Cast", {{"to", IntAttr(kFloat)}}, {Fed(Bools({3}, {1, 0, 1}))});
  ASSERT_TRUE(to_float.ok()) << to_float.status();
  EXPECT_EQ(Floats((*to_float)[0]), std::vector<float>({1.f, 0.f, 1.f}));
  auto from_int = RunNode(17, "Cast", {{"to", IntAttr(kFloat)}},
                          {Fed(HostTensor::FromInt64s({2}, {-3, 1 << 20}))});
  ASSERT_TRUE(from_int.ok()) << from_int.status();
  EXPECT_EQ(Floats((*from_int)[0]), std::vector<float>({-3.f, 1048576.f}));
  auto unsupported = RunNode(17, "Cast", {{"to", IntAttr(onnx::TensorProto::INT32)}},
                             {Fed(HostTensor::FromFloats({1}, {1.f}))});
  EXPECT_EQ(unsupported.status().code(), StatusCode::kUnimplemented) << unsupported.status();
}

// An attention-mask pattern: compare a fed tensor with a broadcast constant, combine masks, and
// select with Where.
TEST(TensorOpsTest, ComparisonsLogicAndWhereBroadcast) {
  ModelBuilder m;
  m.Input("x", {2, 3});
  m.Initializer("t", {3}, {0.f, 1.f, 2.f});
  m.Initializer("fill", {}, {-9.f});
  m.Node("Less", {"x", "t"}, {"lt"});
  m.Node("GreaterOrEqual", {"x", "t"}, {"ge"});
  m.Node("Equal", {"x", "t"}, {"eq"});
  m.Node("Not", {"eq"}, {"ne"});
  m.Node("And", {"ge", "ne"}, {"gt"});
  m.Node("Or", {"lt", "eq"}, {"le"});
  m.Node("Where", {"gt", "x", "fill"}, {"y"});
  for (const char* o : {"lt", "gt", "le"}) TypedOutput(m, o, {2, 3}, kBool);
  m.Output("y", {2, 3});
  SetOpset(m, 13);
  auto out = CompileAndRun(m, {"x"}, {HostTensor::FromFloats({2, 3}, {1, 1, 1, -1, 5, 2})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(BoolsOf((*out)[0]), std::vector<int>({0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(BoolsOf((*out)[1]), std::vector<int>({1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(BoolsOf((*out)[2]), std::vector<int>({0, 1, 1, 1, 0, 1}));
  EXPECT_EQ(Floats((*out)[3]), std::vector<float>({1, -9, -9, -9, 5, -9}));

  auto bad = RunNode(17, "Where", {},
                     {Fed(Bools({2}, {1, 0})), Fed(HostTensor::FromFloats({3}, {1, 2, 3})),
                      Fed(HostTensor::FromFloats({1}, {0}))});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("Where 'n'"), std::string::npos) << bad.status();
}

// Note [Broadcasts oneDNN runs slowly] (cpu_kernels.cc): every broadcast of either operand, the
// row statistics oneDNN has no fast kernel for among them, gives each element its own pair.
TEST(TensorOpsTest, BinaryOpsBroadcastAlongAnyDims) {
  const Shape full = {2, 3, 4, 5};
  const std::vector<Shape> partial = {{2, 3, 4, 1}, {2, 1, 4, 5}, {1, 3, 1, 5}, {3, 4, 1}, {1}};
  auto index = [](const Shape& s, const Shape& out, int64_t e) {
    int64_t offset = 0, stride = 1;
    for (int d = static_cast<int>(out.size()) - 1; d >= 0; --d) {
      const int64_t i = e % out[d];
      e /= out[d];
      const int k = d - static_cast<int>(out.size() - s.size());
      if (k < 0) continue;
      if (s[k] != 1) offset += i * stride;
      stride *= s[k];
    }
    return offset;
  };
  const HostTensor big = HostTensor::FromFloats(full, RandomFloats(120, 1));
  for (const Shape& small_shape : partial) {
    int64_t n = 1;
    for (int64_t d : small_shape) n *= d;
    std::vector<float> values = RandomFloats(n, 2);
    for (float& v : values) v += std::copysign(2.f, v);  // (no division by nearly 0)
    const HostTensor small = HostTensor::FromFloats(small_shape, values);
    for (const char* op : {"Sub", "Div", "Add", "Mul"}) {
      for (bool small_first : {false, true}) {
        const HostTensor& a = small_first ? small : big;
        const HostTensor& b = small_first ? big : small;
        auto out = RunNode(17, op, {}, {Fed(a), Fed(b)});
        ASSERT_TRUE(out.ok()) << op << ": " << out.status();
        ASSERT_EQ((*out)[0].shape, full);
        const float* z = (*out)[0].floats();
        for (int64_t e = 0; e < 120; ++e) {
          const float x = a.floats()[index(a.shape, full, e)];
          const float y = b.floats()[index(b.shape, full, e)];
          const float want = op[0] == 'S'   ? x - y
                             : op[0] == 'D' ? x / y
                             : op[0] == 'A' ? x + y
                                            : x * y;
          ASSERT_FLOAT_EQ(z[e], want)
              << op << " element " << e << " of shape " << small_shape.size();
        }
      }
    }
  }
}

// Hugging Face's exports: GPT-2 pads its int64 labels (the shift of a next-token loss) and BERT
// gathers its token types with GatherElements.
TEST(TensorOpsTest, Int64PadAndGatherElements) {
  ModelBuilder m;
  m.Input("labels", {2, 3}, onnx::TensorProto::INT64);
  m.Input("data", {2, 3});
  m.Input("idx", {2, 2}, onnx::TensorProto::INT64);
  m.Int64Initializer("pads", {4}, {0, 0, 0, 1});
  m.Int64Initializer("fill", {}, {-100});
  m.Int64Initializer("rows", {2, 2}, {1, 0, -1, 1});
  m.Node("Pad", {"labels", "pads", "fill"}, {"padded"});
  auto& ge = m.Node("GatherElements", {"data", "idx"}, {"picked"});
  ModelBuilder::Attr(ge, "axis", int64_t{1});
  auto& ge0 = m.Node("GatherElements", {"labels", "rows"}, {"picked0"});
  ModelBuilder::Attr(ge0, "axis", int64_t{0});
  m.Output("padded", {2, 4}).Output("picked", {2, 2}).Output("picked0", {2, 2});
  const HostTensor labels = HostTensor::FromInt64s({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor data = HostTensor::FromFloats({2, 3}, {10, 11, 12, 20, 21, 22});
  auto out = CompileAndRun(m, {"labels", "data", "idx"},
                           {labels, data, HostTensor::FromInt64s({2, 2}, {2, 0, -1, 1})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Int64s((*out)[0]), std::vector<int64_t>({1, 2, 3, -100, 4, 5, 6, -100}));
  EXPECT_EQ(Floats((*out)[1]), std::vector<float>({12, 10, 22, 21}));
  // Axis 0: y[i][j] = labels[rows[i][j]][j]; -1 is the last row.
  EXPECT_EQ(Int64s((*out)[2]), std::vector<int64_t>({4, 2, 4, 5}));
  // An index past the axis, fed: the iteration fails naming the node.
  auto bad = CompileAndRun(m, {"labels", "data", "idx"},
                           {labels, data, HostTensor::FromInt64s({2, 2}, {0, 3, 0, 0})});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("GatherElements"), std::string::npos) << bad.status();
}

// ScatterND as torchvision's Swin Transformer exports its shifted-window mask: slices replaced
// in order (a repeated index: the last wins), negative indices from the end; an index tuple
// out of range fails the iteration naming the node.
TEST(TensorOpsTest, ScatterND) {
  ModelBuilder m;
  m.Input("data", {3, 2});
  m.Input("idx", {3, 1}, onnx::TensorProto::INT64);
  m.Input("upd", {3, 2});
  m.Node("ScatterND", {"data", "idx", "upd"}, {"y"});
  m.Output("y", {3, 2});
  const HostTensor data = HostTensor::FromFloats({3, 2}, {1, 2, 3, 4, 5, 6});
  const HostTensor upd = HostTensor::FromFloats({3, 2}, {-1, -2, -3, -4, -5, -6});
  auto out = CompileAndRun(m, {"data", "idx", "upd"},
                           {data, HostTensor::FromInt64s({3, 1}, {2, -3, 0}), upd});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Floats((*out)[0]), std::vector<float>({-5, -6, 3, 4, -1, -2}));
  auto bad = CompileAndRun(m, {"data", "idx", "upd"},
                           {data, HostTensor::FromInt64s({3, 1}, {0, 3, 1}), upd});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("ScatterND"), std::string::npos) << bad.status();
}

// Note [Composed ops]: HardSigmoid and HardSwish import as Clip chains of the same values.
TEST(TensorOpsTest, HardSigmoidAndHardSwish) {
  ModelBuilder m;
  m.Input("x", {7});
  auto& sig = m.Node("HardSigmoid", {"x"}, {"s"});
  ModelBuilder::Attr(sig, "alpha", 0.25f);
  ModelBuilder::Attr(sig, "beta", 0.4f);
  m.Node("HardSigmoid", {"x"}, {"d"});  // alpha 0.2, beta 0.5
  m.Node("HardSwish", {"x"}, {"w"});
  m.Output("s", {7}).Output("d", {7}).Output("w", {7});
  const std::vector<float> x = {-5.f, -3.f, -1.f, 0.f, 0.5f, 3.f, 6.f};
  auto out = CompileAndRun(m, {"x"}, {HostTensor::FromFloats({7}, x)});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  const auto gate = [](float v, float a, float b) { return std::clamp(a * v + b, 0.f, 1.f); };
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR((*out)[0].floats()[i], gate(x[i], 0.25f, 0.4f), 1e-7) << i;
    EXPECT_NEAR((*out)[1].floats()[i], gate(x[i], 0.2f, 0.5f), 1e-7) << i;
    // PyTorch's hardswish: x * relu6(x + 3) / 6.
    EXPECT_NEAR((*out)[2].floats()[i], x[i] * std::clamp(x[i] + 3.f, 0.f, 6.f) / 6.f, 1e-6) << i;
  }
}

TEST(TensorOpsTest, MinMaxClipAndUnaryMath) {
  auto max =
      RunNode(17, "Max", {},
              {Fed(HostTensor::FromFloats({2, 1}, {1, 5})),
               Fed(HostTensor::FromFloats({3}, {0, 2, 6})), Fed(HostTensor::FromFloats({}, {3}))});
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(Floats((*max)[0]), std::vector<float>({3, 3, 6, 5, 5, 6}));
  auto min = RunNode(
      17, "Min", {},
      {Fed(HostTensor::FromInt64s({3}, {4, -2, 9})), Fed(HostTensor::FromInt64s({1}, {3}))});
  ASSERT_TRUE(min.ok()) << min.status();
  EXPECT_EQ(Int64s((*min)[0]), std::vector<int64_t>({3, -2, 3}));
  auto one = RunNode(17, "Max", {}, {Fed(HostTensor::FromFloats({2}, {1, -1}))});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(Floats((*one)[0]), std::vector<float>({1, -1}));

  const float inf = std::numeric_limits<float>::infinity();
  const HostTensor x = HostTensor::FromFloats({4}, {-inf, -1.f, 0.5f, 4.f});
  // Opset 11+: min and max inputs, either omitted.
  auto clip = RunNode(17, "Clip", {}, {Fed(x), Omitted(), Const(HostTensor::FromFloats({}, {1}))});
  ASSERT_TRUE(clip.ok()) << clip.status();
  EXPECT_EQ(Floats((*clip)[0]), std::vector<float>({-inf, -1.f, 0.5f, 1.f}));
  // Opset 6..10: attributes; an omitted min is float's lowest.
  Attribute hi;
  hi.kind = Attribute::Kind::kFloat;
  hi.f = 2.f;
  auto clip6 = RunNode(9, "Clip", {{"max", hi}}, {Fed(x)});
  ASSERT_TRUE(clip6.ok()) << clip6.status();
  EXPECT_EQ(Floats((*clip6)[0]),
            std::vector<float>({std::numeric_limits<float>::lowest(), -1.f, 0.5f, 2.f}));
  auto clip_int =
      RunNode(13, "Clip", {},
              {Fed(HostTensor::FromInt64s({3}, {-5, 0, 5})), Fed(HostTensor::FromInt64s({}, {-1})),
               Fed(HostTensor::FromInt64s({}, {2}))});
  ASSERT_TRUE(clip_int.ok()) << clip_int.status();
  EXPECT_EQ(Int64s((*clip_int)[0]), std::vector<int64_t>({-1, 0, 2}));

  const HostTensor v = HostTensor::FromFloats({3}, {-1.f, 0.f, 2.f});
  auto erf = RunNode(17, "Erf", {}, {Fed(v)});
  ASSERT_TRUE(erf.ok()) << erf.status();
  EXPECT_NEAR((*erf)[0].floats()[0], -0.8427008f, 1e-6);
  EXPECT_EQ((*erf)[0].floats()[1], 0.f);
  EXPECT_NEAR((*erf)[0].floats()[2], 0.9953223f, 1e-6);
  auto sin = RunNode(7, "Sin", {}, {Fed(v)});
  ASSERT_TRUE(sin.ok()) << sin.status();
  EXPECT_EQ(Floats((*sin)[0]), std::vector<float>({std::sin(-1.f), 0.f, std::sin(2.f)}));
  auto cos = RunNode(7, "Cos", {}, {Fed(v)});
  ASSERT_TRUE(cos.ok()) << cos.status();
  EXPECT_EQ(Floats((*cos)[0]), std::vector<float>({std::cos(-1.f), 1.f, std::cos(2.f)}));
  auto atan = RunNode(7, "Atan", {}, {Fed(v)});
  ASSERT_TRUE(atan.ok()) << atan.status();
  EXPECT_EQ(Floats((*atan)[0]), std::vector<float>({std::atan(-1.f), 0.f, std::atan(2.f)}));
  const HostTensor halves = HostTensor::FromFloats({5}, {-2.5f, -0.7f, 0.5f, 1.5f, 2.2f});
  for (const auto& [op, want] : std::vector<std::pair<std::string, std::vector<float>>>{
           {"Floor", {-3.f, -1.f, 0.f, 1.f, 2.f}},
           {"Ceil", {-2.f, -0.f, 1.f, 2.f, 3.f}},
           {"Round", {-2.f, -1.f, 0.f, 2.f, 2.f}}}) {  // halves to even
    auto r = RunNode(11, op, {}, {Fed(halves)});
    ASSERT_TRUE(r.ok()) << op << ": " << r.status();
    EXPECT_EQ(Floats((*r)[0]), want) << op;
  }
  auto rec = RunNode(17, "Reciprocal", {}, {Fed(HostTensor::FromFloats({3}, {-4.f, 0.5f, 8.f}))});
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(Floats((*rec)[0]), std::vector<float>({-0.25f, 2.f, 0.125f}));
  // Gelu is opset 20's: x * Phi(x), or the tanh approximation.
  auto gelu = RunNode(20, "Gelu", {}, {Fed(v)});
  ASSERT_TRUE(gelu.ok()) << gelu.status();
  EXPECT_NEAR((*gelu)[0].floats()[0], -0.15865525f, 1e-5);
  EXPECT_NEAR((*gelu)[0].floats()[2], 1.9544997f, 1e-5);
  auto gelu_tanh = RunNode(20, "Gelu", {{"approximate", StringAttr("tanh")}}, {Fed(v)});
  ASSERT_TRUE(gelu_tanh.ok()) << gelu_tanh.status();
  EXPECT_NEAR((*gelu_tanh)[0].floats()[0], -0.15880801f, 1e-5);
  EXPECT_NEAR((*gelu_tanh)[0].floats()[2], 1.9545977f, 1e-5);
  auto old_gelu = RunNode(17, "Gelu", {}, {Fed(v)});
  EXPECT_EQ(old_gelu.status().code(), StatusCode::kInvalidArgument) << old_gelu.status();
}

// ---------------------------------------------------------------------------------------------
// Indexing and data movement.

TEST(TensorOpsTest, GatherAnyAxisAndEmbeddingLookup) {
  // Axis 1 with a negative index: [2, 3] -> [2, 1, 2].
  auto cols = RunNode(17, "Gather", {{"axis", IntAttr(-1)}},
                      {Fed(HostTensor::FromFloats({2, 3}, {1, 2, 3, 4, 5, 6})),
                       Const(HostTensor::FromInt64s({1, 2}, {-1, 0}))});
  ASSERT_TRUE(cols.ok()) << cols.status();
  EXPECT_EQ((*cols)[0].shape, Shape({2, 1, 2}));
  EXPECT_EQ(Floats((*cols)[0]), std::vector<float>({3, 1, 6, 4}));
  // A scalar index drops the axis; int64 and bool data.
  auto scalar = RunNode(
      17, "Gather", {},
      {Fed(HostTensor::FromInt64s({3}, {10, 20, 30})), Fed(HostTensor::FromInt64s({}, {2}))});
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ((*scalar)[0].shape, Shape({}));
  EXPECT_EQ(Int64s((*scalar)[0]), std::vector<int64_t>({30}));
  auto bools = RunNode(17, "Gather", {},
                       {Fed(Bools({3}, {1, 0, 1})), Fed(HostTensor::FromInt64s({2}, {1, 2}))});
  ASSERT_TRUE(bools.ok()) << bools.status();
  EXPECT_EQ(BoolsOf((*bools)[0]), std::vector<int>({0, 1}));

  // An embedding: a weight [4, 2] and fed token ids [2, 2].
  ModelBuilder m;
  m.Input("ids", {2, 2}, kInt64);
  m.Initializer("emb", {4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  m.Node("Gather", {"emb", "ids"}, {"y"});
  m.Output("y", {2, 2, 2});
  auto out = CompileAndRun(m, {"ids"}, {HostTensor::FromInt64s({2, 2}, {3, 0, -1, 2})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Floats((*out)[0]), std::vector<float>({30, 31, 0, 1, 30, 31, 20, 21}));
  // An id out of range when the iteration runs.
  auto bad = CompileAndRun(m, {"ids"}, {HostTensor::FromInt64s({2, 2}, {3, 0, 4, 2})});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("index 4 out of range"), std::string::npos) << bad.status();
}

// int64 Transpose (sampled indices, labels.T): moved as pairs of 32-bit halves, values beyond
// 32 bits and negative ones intact.
TEST(TensorOpsTest, TransposeOfInt64) {
  std::vector<int64_t> values(24);
  for (int64_t i = 0; i < 24; ++i) values[i] = (i % 2 ? -1 : 1) * ((int64_t{1} << 40) + i);
  auto out = RunNode(13, "Transpose", {{"perm", IntsAttr({2, 0, 1})}},
                     {Fed(HostTensor::FromInt64s({2, 3, 4}, values))});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ((*out)[0].shape, Shape({4, 2, 3}));
  const std::vector<int64_t> got = Int64s((*out)[0]);
  for (int64_t a = 0; a < 2; ++a) {
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(got[c * 6 + a * 3 + b], values[a * 12 + b * 4 + c]);
    }
  }
}

TEST(TensorOpsTest, GatherBadInputIsInvalidArgument) {
  // A constant index out of range is found at compile time.
  auto oob = RunNode(
      17, "Gather", {},
      {Fed(HostTensor::FromFloats({3}, {1, 2, 3})), Const(HostTensor::FromInt64s({2}, {0, -4}))});
  ASSERT_FALSE(oob.ok());
  EXPECT_EQ(oob.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(oob.status().message().find("Gather 'n': index -4 out of range"), std::string::npos)
      << oob.status();
  // Axis beyond the data's rank.
  auto axis =
      RunNode(17, "Gather", {{"axis", IntAttr(2)}},
              {Fed(HostTensor::FromFloats({3}, {1, 2, 3})), Fed(HostTensor::FromInt64s({1}, {0}))});
  EXPECT_EQ(axis.status().code(), StatusCode::kInvalidArgument) << axis.status();
  // Scalar data has no axis to gather along.
  auto scalar =
      RunNode(17, "Gather", {},
              {Fed(HostTensor::FromFloats({}, {1})), Fed(HostTensor::FromInt64s({1}, {0}))});
  EXPECT_EQ(scalar.status().code(), StatusCode::kInvalidArgument) << scalar.status();
}

TEST(TensorOpsTest, SliceStepsAxesAndOpsets) {
  std::vector<float> x(12);
  for (int i = 0; i < 12; ++i) x[i] = static_cast<float>(i);
  const HostTensor x34 = HostTensor::FromFloats({3, 4}, x);
  auto i64 = [](std::vector<int64_t> v) {
    return Const(HostTensor::FromInt64s({static_cast<int64_t>(v.size())}, v));
  };
  // Rows reversed, every second column from the end: x[::-1, ::-2].
  auto rev = RunNode(17, "Slice", {},
                     {Fed(x34), i64({-1, -1}), i64({std::numeric_limits<int64_t>::min(), -100}),
                      i64({0, 1}), i64({-1, -2})});
  ASSERT_TRUE(rev.ok()) << rev.status();
  EXPECT_EQ((*rev)[0].shape, Shape({3, 2}));
  EXPECT_EQ(Floats((*rev)[0]), std::vector<float>({11, 9, 7, 5, 3, 1}));
  // Only axis 1 (negative), ends past the dim clamp: x[:, 1:100].
  auto cols = RunNode(17, "Slice", {}, {Fed(x34), i64({1}), i64({100}), i64({-1})});
  ASSERT_TRUE(cols.ok()) << cols.status();
  EXPECT_EQ(Floats((*cols)[0]), std::vector<float>({1, 2, 3, 5, 6, 7, 9, 10, 11}));
  // An empty result: start after end with a positive step.
  auto empty = RunNode(17, "Slice", {}, {Fed(x34), i64({2}), i64({1})});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)[0].shape, Shape({0, 4}));
  // Opset 9: starts/ends/axes attributes.
  auto v9 = RunNode(
      9, "Slice",
      {{"starts", IntsAttr({1, 0})}, {"ends", IntsAttr({3, 2})}, {"axes", IntsAttr({0, 1})}},
      {Fed(x34)});
  ASSERT_TRUE(v9.ok()) << v9.status();
  EXPECT_EQ(Floats((*v9)[0]), std::vector<float>({4, 5, 8, 9}));
  // int64 data through a model (opset 17), folded.
  ModelBuilder m;
  m.Int64Initializer("d", {5}, {0, 1, 2, 3, 4});
  m.Int64Initializer("s", {1}, {-2})
      .Int64Initializer("e", {1}, {0})
      .Int64Initializer("a", {1}, {0});
  m.Int64Initializer("st", {1}, {-1});
  m.Node("Slice", {"d", "s", "e", "a", "st"}, {"y"});
  TypedOutput(m, "y", {3}, kInt64);
  auto out = CompileAndRun(m, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Int64s((*out)[0]), std::vector<int64_t>({3, 2, 1}));
  // Bad: a zero step, a repeated axis.
  auto zero = RunNode(17, "Slice", {}, {Fed(x34), i64({0}), i64({2}), i64({0}), i64({0})});
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument) << zero.status();
  auto twice = RunNode(17, "Slice", {}, {Fed(x34), i64({0, 0}), i64({1, 1}), i64({1, -1})});
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument) << twice.status();
}

TEST(TensorOpsTest, SlicesAndConcatsOfLongRowsCopyWholeRows) {
  // Note [Slices by rows], Note [Concatenation by blocks]: x is 3 x 4 x 5 x 16; rows of 16
  // (and merged rows of 80) are copied whole, against an element-by-element reference.
  const Shape shape = {3, 4, 5, 16};
  const std::vector<float> x = RandomFloats(960, 7);
  auto at = [&](int64_t a, int64_t b, int64_t c, int64_t d) {
    return x[((a * 4 + b) * 5 + c) * 16 + d];
  };
  auto i64 = [](std::vector<int64_t> v) {
    return Const(HostTensor::FromInt64s({static_cast<int64_t>(v.size())}, v));
  };
  const HostTensor xt = HostTensor::FromFloats(shape, x);
  // x[1:3, :, 1:5:2, 2:14]: rows of 12, a stepped middle dim.
  auto rows = RunNode(17, "Slice", {},
                      {Fed(xt), i64({1, 1, 2}), i64({3, 5, 14}), i64({0, 2, 3}), i64({1, 2, 1})});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ((*rows)[0].shape, Shape({2, 4, 2, 12}));
  const float* r = (*rows)[0].floats();
  for (int64_t a = 0; a < 2; ++a) {
    for (int64_t b = 0; b < 4; ++b) {
      for (int64_t c = 0; c < 2; ++c) {
        for (int64_t d = 0; d < 12; ++d) {
          ASSERT_EQ(r[((a * 4 + b) * 2 + c) * 12 + d], at(a + 1, b, 1 + 2 * c, d + 2));
        }
      }
    }
  }
  // x[:, 2, :, ::2]: a step in the last dim, element by element.
  auto stepped =
      RunNode(17, "Slice", {}, {Fed(xt), i64({2, 0}), i64({3, 16}), i64({1, 3}), i64({1, 2})});
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  ASSERT_EQ((*stepped)[0].shape, Shape({3, 1, 5, 8}));
  EXPECT_EQ((*stepped)[0].floats()[5 * 8 + 3], at(1, 2, 0, 6));
  // Concat along axis 0 (one block of 960 or 1920 floats per input: copied by blocks) and
  // axis 2 (blocks of 80 and 160 floats: oneDNN's).
  const std::vector<float> y = RandomFloats(960 * 2, 8);
  const HostTensor wide = HostTensor::FromFloats({3, 4, 10, 16}, y);
  for (int64_t axis : {0, 2}) {
    const HostTensor other = axis == 0 ? HostTensor::FromFloats({6, 4, 5, 16}, y) : wide;
    auto cat = RunNode(17, "Concat", {{"axis", IntAttr(axis)}}, {Fed(xt), Fed(other)});
    ASSERT_TRUE(cat.ok()) << cat.status();
    const Shape& s = (*cat)[0].shape;
    const float* z = (*cat)[0].floats();
    int64_t e = 0;
    for (int64_t a = 0; a < s[0]; ++a) {
      for (int64_t b = 0; b < s[1]; ++b) {
        for (int64_t c = 0; c < s[2]; ++c) {
          for (int64_t d = 0; d < s[3]; ++d, ++e) {
            const bool first = axis == 0 ? a < 3 : c < 5;
            const float want = first       ? at(a, b, c, d)
                               : axis == 0 ? y[(((a - 3) * 4 + b) * 5 + c) * 16 + d]
                                           : y[((a * 4 + b) * 10 + (c - 5)) * 16 + d];
            ASSERT_EQ(z[e], want) << "axis " << axis << " element " << e;
          }
        }
      }
    }
  }
}

TEST(TensorOpsTest, SplitAcrossOpsets) {
  std::vector<float> x(10);
  for (int i = 0; i < 10; ++i) x[i] = static_cast<float>(i);
  const HostTensor x25 = HostTensor::FromFloats({2, 5}, x);
  auto sizes = [](std::vector<int64_t> v) {
    return Const(HostTensor::FromInt64s({static_cast<int64_t>(v.size())}, v));
  };
  // Opset 13: the split input.
  auto s13 = RunNode(13, "Split", {{"axis", IntAttr(1)}}, {Fed(x25), sizes({2, 3})}, 2);
  ASSERT_TRUE(s13.ok()) << s13.status();
  EXPECT_EQ(Floats((*s13)[0]), std::vector<float>({0, 1, 5, 6}));
  EXPECT_EQ(Floats((*s13)[1]), std::vector<float>({2, 3, 4, 7, 8, 9}));
  // Opset 11: the split attribute.
  auto s11 =
      RunNode(11, "Split", {{"axis", IntAttr(-1)}, {"split", IntsAttr({4, 1})}}, {Fed(x25)}, 2);
  ASSERT_TRUE(s11.ok()) << s11.status();
  EXPECT_EQ(Floats((*s11)[1]), std::vector<float>({4, 9}));
  // Equal parts along axis 0.
  auto halves = RunNode(17, "Split", {}, {Fed(x25)}, 2);
  ASSERT_TRUE(halves.ok()) << halves.status();
  EXPECT_EQ(Floats((*halves)[1]), std::vector<float>({5, 6, 7, 8, 9}));
  // Opset 18: num_outputs, the last chunk smaller (5 = 2 + 2 + 1).
  auto s18 =
      RunNode(18, "Split", {{"axis", IntAttr(1)}, {"num_outputs", IntAttr(3)}}, {Fed(x25)}, 3);
  ASSERT_TRUE(s18.ok()) << s18.status();
  EXPECT_EQ((*s18)[2].shape, Shape({2, 1}));
  EXPECT_EQ(Floats((*s18)[2]), std::vector<float>({4, 9}));
  // Bad: sizes not summing to the dim; an uneven equal split.
  auto sum = RunNode(13, "Split", {{"axis", IntAttr(1)}}, {Fed(x25), sizes({2, 2})}, 2);
  EXPECT_EQ(sum.status().code(), StatusCode::kInvalidArgument) << sum.status();
  auto uneven = RunNode(17, "Split", {{"axis", IntAttr(1)}}, {Fed(x25)}, 2);
  EXPECT_EQ(uneven.status().code(), StatusCode::kInvalidArgument) << uneven.status();
}

TEST(TensorOpsTest, ExpandAndTrilu) {
  auto expand = RunNode(17, "Expand", {},
                        {Fed(HostTensor::FromInt64s({3, 1}, {1, 2, 3})),
                         Const(HostTensor::FromInt64s({3}, {2, 1, 2}))});
  ASSERT_TRUE(expand.ok()) << expand.status();
  EXPECT_EQ((*expand)[0].shape, Shape({2, 3, 2}));
  EXPECT_EQ(Int64s((*expand)[0]), std::vector<int64_t>({1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  // Whole rows of X repeated over a middle dim; a scalar over a vector; a scalar as a scalar.
  auto rows = RunNode(17, "Expand", {},
                      {Fed(HostTensor::FromFloats({2, 1, 3}, {1, 2, 3, 4, 5, 6})),
                       Const(HostTensor::FromInt64s({3}, {2, 2, 3}))});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(Floats((*rows)[0]), std::vector<float>({1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}));
  auto scalar =
      RunNode(17, "Expand", {},
              {Fed(HostTensor::FromFloats({}, {7})), Const(HostTensor::FromInt64s({1}, {3}))});
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(Floats((*scalar)[0]), std::vector<float>({7, 7, 7}));
  auto same =
      RunNode(17, "Expand", {},
              {Fed(HostTensor::FromFloats({}, {7})), Const(HostTensor::FromInt64s({0}, {}))});
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(Floats((*same)[0]), std::vector<float>({7}));
  auto bad = RunNode(
      17, "Expand", {},
      {Fed(HostTensor::FromFloats({3}, {1, 2, 3})), Const(HostTensor::FromInt64s({1}, {2}))});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();

  std::vector<float> x(9);
  for (int i = 0; i < 9; ++i) x[i] = static_cast<float>(i + 1);
  const HostTensor x33 = HostTensor::FromFloats({3, 3}, x);
  auto upper = RunNode(14, "Trilu", {}, {Fed(x33)});
  ASSERT_TRUE(upper.ok()) << upper.status();
  EXPECT_EQ(Floats((*upper)[0]), std::vector<float>({1, 2, 3, 0, 5, 6, 0, 0, 9}));
  // The causal mask form: lower, k = -1 (strictly below the diagonal).
  auto lower = RunNode(14, "Trilu", {{"upper", IntAttr(0)}},
                       {Fed(x33), Fed(HostTensor::FromInt64s({}, {-1}))});
  ASSERT_TRUE(lower.ok()) << lower.status();
  EXPECT_EQ(Floats((*lower)[0]), std::vector<float>({0, 0, 0, 4, 0, 0, 7, 8, 0}));
  auto rank1 = RunNode(14, "Trilu", {}, {Fed(HostTensor::FromFloats({3}, {1, 2, 3}))});
  EXPECT_EQ(rank1.status().code(), StatusCode::kInvalidArgument) << rank1.status();
}

// From opset 18 every Reduce op takes its axes as an input (ReduceSum from 13);
// noop_with_empty_axes still applies.
TEST(TensorOpsTest, ReduceAxesInputFromOpset18) {
  const HostTensor x = HostTensor::FromFloats({2, 3}, {1, 2, 3, 4, 5, 6});
  auto mean = RunNode(18, "ReduceMean", {{"keepdims", IntAttr(0)}},
                      {Fed(x), Const(HostTensor::FromInt64s({1}, {-1}))});
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_EQ(Floats((*mean)[0]), std::vector<float>({2, 5}));
  auto max17 = RunNode(17, "ReduceMax", {{"axes", IntsAttr({0})}}, {Fed(x)});
  ASSERT_TRUE(max17.ok()) << max17.status();
  EXPECT_EQ(Floats((*max17)[0]), std::vector<float>({4, 5, 6}));
  auto noop = RunNode(18, "ReduceMax", {{"noop_with_empty_axes", IntAttr(1)}}, {Fed(x)});
  ASSERT_TRUE(noop.ok()) << noop.status();
  EXPECT_EQ(Floats((*noop)[0]), std::vector<float>({1, 2, 3, 4, 5, 6}));
  auto fed = RunNode(18, "ReduceMax", {}, {Fed(x), Fed(HostTensor::FromInt64s({1}, {0}))});
  EXPECT_EQ(fed.status().code(), StatusCode::kUnimplemented) << fed.status();
}

// A whole model past the opsets libonnx 1.12 knows: Gelu-20, Split-18's num_outputs and
// ReduceMean-18's axes input.
TEST(TensorOpsTest, Opset20Model) {
  ModelBuilder m;
  SetOpset(m, 20);
  m.Input("x", {2, 4});
  m.Int64Initializer("axes", {1}, {1});
  m.Node("Gelu", {"x"}, {"g"});
  auto& split = m.Node("Split", {"g"}, {"a", "b"});
  ModelBuilder::Attr(split, "axis", int64_t{1});
  ModelBuilder::Attr(split, "num_outputs", int64_t{2});
  auto& mean = m.Node("ReduceMean", {"a", "axes"}, {"y"});
  ModelBuilder::Attr(mean, "keepdims", int64_t{0});
  m.Output("y", {2});
  m.Output("b", {2, 2});
  auto out = CompileAndRun(m, {"x"}, {HostTensor::FromFloats({2, 4}, {-1, 2, 0, 1, 2, 2, -1, -1})});
  ASSERT_TRUE(out.ok()) << out.status();
  const float gelu_m1 = -0.15865525f, gelu_1 = 0.84134475f, gelu_2 = 1.9544997f;
  EXPECT_NEAR((*out)[0].floats()[0], (gelu_m1 + gelu_2) / 2, 1e-5);
  EXPECT_NEAR((*out)[0].floats()[1], gelu_2, 1e-5);
  const std::vector<float> b = {0.f, gelu_1, gelu_m1, gelu_m1};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR((*out)[1].floats()[i], b[i], 1e-5) << i;
}

TEST(TensorOpsTest, OpsNewerThanTheModelsOpsetAreRefused) {
  auto range =
      RunNode(10, "Range", {},
              {Const(HostTensor::FromInt64s({}, {0})), Const(HostTensor::FromInt64s({}, {3})),
               Const(HostTensor::FromInt64s({}, {1}))});
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("needs opset 11"), std::string::npos) << range.status();
}

// SalusMaxPool is MaxPool plus taps, and SalusPoolGrad reading them gives what it gives finding
// the maxima again (Note [Pooling taps]): oneDNN's workspace in the taps (3x3 windows, a byte
// each), and a workspace that does not fit in them (16x16 windows over one channel: an int per
// output in an 8- or 16-channel block), where both kernels fall back alike. Taps that do not
// match the gradient's pooling are refused.
TEST(TensorOpsTest, MaxPoolTapsGiveTheGradientOfTheMaximaFoundAgain) {
  struct Case {
    Shape x;
    std::vector<int64_t> kernel, strides, pads;
    int64_t ceil = 0;
  };
  const std::vector<Case> cases = {{{2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1, 1, 1}},
                                   {{1, 2, 8, 7}, {3, 2}, {2, 2}, {0, 1, 0, 1}, 1},
                                   {{1, 1, 32, 32}, {16, 16}, {16, 16}, {0, 0, 0, 0}}};
  uint32_t seed = 5;
  for (const Case& c : cases) {
    SCOPED_TRACE(ShapeString(c.x));
    std::map<std::string, Attribute> attrs = {{"kernel_shape", IntsAttr(c.kernel)},
                                              {"strides", IntsAttr(c.strides)},
                                              {"pads", IntsAttr(c.pads)},
                                              {"ceil_mode", IntAttr(c.ceil)}};
    // Ties too: the first maximum of a window gets its gradient.
    std::vector<float> xv = RandomFloats(NumElements(c.x), seed++);
    for (size_t i = 0; i < xv.size(); i += 5) xv[i] = 0.5f;
    const HostTensor x = HostTensor::FromFloats(c.x, xv);
    auto plain = RunNode(17, "MaxPool", attrs, {Fed(x)});
    ASSERT_TRUE(plain.ok()) << plain.status();
    const Shape ys = (*plain)[0].shape;
    auto tapped = RunNodeWith(17, "SalusMaxPool", attrs, {Fed(x)},
                              {{DataType::kFloat32, ys}, {DataType::kInt64, ys}});
    ASSERT_TRUE(tapped.ok()) << tapped.status();
    EXPECT_EQ(Floats((*tapped)[0]), Floats((*plain)[0]));

    const HostTensor dy = HostTensor::FromFloats(ys, RandomFloats(NumElements(ys), seed++));
    std::map<std::string, Attribute> grad = attrs;
    grad["forward_op"] = StringAttr("MaxPool");
    auto again =
        RunNodeWith(17, "SalusPoolGrad", grad, {Fed(x), Fed(dy)}, {{DataType::kFloat32, c.x}});
    ASSERT_TRUE(again.ok()) << again.status();
    auto read = RunNodeWith(17, "SalusPoolGrad", grad, {Fed(x), Fed(dy), Fed((*tapped)[1])},
                            {{DataType::kFloat32, c.x}});
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(Floats((*read)[0]), Floats((*again)[0]));
    float sum = 0, dy_sum = 0;
    for (float v : Floats((*read)[0])) sum += v;
    for (float v : Floats(dy)) dy_sum += v;
    EXPECT_NEAR(sum, dy_sum, 1e-3f);  // every output's gradient lands on one input

    const HostTensor wrong(DataType::kInt64, {1, 1, 1, 1});
    auto bad = RunNodeWith(17, "SalusPoolGrad", grad, {Fed(x), Fed(dy), Fed(wrong)},
                           {{DataType::kFloat32, c.x}});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(bad.status().message()).find("taps"), std::string::npos);
  }
  std::map<std::string, Attribute> average = {{"kernel_shape", IntsAttr({2, 2})},
                                              {"strides", IntsAttr({2, 2})},
                                              {"forward_op", StringAttr("AveragePool")}};
  const HostTensor x(DataType::kFloat32, {1, 1, 4, 4}), dy(DataType::kFloat32, {1, 1, 2, 2});
  const HostTensor taps(DataType::kInt64, {1, 1, 2, 2});
  auto bad = RunNodeWith(17, "SalusPoolGrad", average, {Fed(x), Fed(dy), Fed(taps)},
                         {{DataType::kFloat32, {1, 1, 4, 4}}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace salus::exec
