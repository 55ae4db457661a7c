// The shared element math of src/exec/element_math.h, run on the host over whole tensors exactly
// as the CUDA kernels of elementwise.cu run it, against the CPU executable and against
// independent references: the GPU runs the same functions, so this is how their logic is checked
// on a machine without one.
//
//   - Index maps: MakeIndexMap's merging, table by table; MapIndex against the CPU's
//     ForEachBroadcast and a plain unravel for random broadcasts and permutations of rank 0 to 9.
//   - Binary ops: every broadcast pattern (same shapes, scalars on either side, rows, columns,
//     middle dims, both sides broadcasting, rank 6, empty) and op, against the CPU.
//   - Unary ops: ApplyUnary over a sweep and the special values, against the CPU's oneDNN.
//   - Special functions: Lgamma, Digamma, Erfinv at known values, poles and out of domain.
//   - Transpose: every permutation of ranks 1 to 5, with and without size-1 dims.
//   - Pad: opset 17's inputs and opset 10's attributes, pads on any dims, empty inputs, a rank
//     the map cannot hold (the CPU's fallback); negative pads are refused at compile time.
//   - DepthToSpace: both modes, against the CPU and the ONNX definition (reshape, transpose).
//   - SoftmaxCrossEntropyLoss: SceRow per row and the final sum in the CUDA kernel's order,
//     against the CPU and a double-precision reference, for every reduction, weights,
//     ignore_index, labels out of range, no classes and no rows.
#include "exec/element_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "exec/dnnl_kernel.h"
#include "exec/shape_inference.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

// ---------------------------------------------------------------------------------------------
// Helpers.

// A graph output of `rank` unknown dims: the engine infers the shape.
void OutputOfRank(ModelBuilder& mb, const std::string& name, size_t rank) {
  auto* out = mb.proto().mutable_graph()->add_output();
  out->set_name(name);
  auto* t = out->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = t->mutable_shape();
  for (size_t i = 0; i < rank; ++i) shape->add_dim();
}

struct CpuResult {
  Status status;
  std::vector<HostTensor> outputs;
};

// Compiles `model` for the CPU (inference) and runs it once on `feeds` (in input order).
CpuResult RunCpu(const std::string& model, const std::vector<HostTensor>& feeds) {
  auto exe = Executable::Compile(model, {});
  if (!exe.ok()) return {exe.status(), {}};
  Memory mem(**exe);
  auto out = RunHost(**exe, mem, feeds);
  if (!out.ok()) return {out.status(), {}};
  return {OkStatus(), *out};
}

HostTensor RandomTensor(const Shape& shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  return HostTensor::FromFloats(shape, RandomFloats(NumElements(shape), seed, lo, hi));
}

std::vector<float> Floats(const HostTensor& t) {
  return std::vector<float>(t.floats(), t.floats() + t.num_elements());
}

// Element by element: bit-identical (NaN matching NaN) when tol is 0, else within
// tol * (1 + |want|) (infinities of the same sign match).
void ExpectSame(const std::vector<float>& want, const std::vector<float>& got, double tol,
                const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float a = want[i], b = got[i];
    bool same;
    if (std::isnan(a) || std::isnan(b)) {
      same = std::isnan(a) && std::isnan(b);
    } else if (tol == 0) {
      same = std::memcmp(&a, &b, sizeof(float)) == 0;
    } else {
      same = a == b || std::abs(static_cast<double>(a) - b) <= tol * (1 + std::abs(a));
    }
    if (!same && ++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: want " << a << " got " << b;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements differ";
}

// The row-major index of element e of `dims`.
std::vector<int64_t> Unravel(int64_t e, const Shape& dims) {
  std::vector<int64_t> idx(dims.size(), 0);
  for (size_t d = dims.size(); d-- > 0;) {
    idx[d] = e % dims[d];
    e /= dims[d];
  }
  return idx;
}

std::vector<int64_t> Dense(const Shape& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) s[d - 1] = s[d] * dims[d];
  return s;
}

std::string Str(const Shape& s) { return ShapeString(s); }

// ---------------------------------------------------------------------------------------------
// Index maps.

std::vector<int64_t> MapDims(const IndexMap& m) { return {m.dims, m.dims + m.rank}; }
std::vector<int64_t> MapStrides(const IndexMap& m, int k) {
  return {m.strides[k], m.strides[k] + m.rank};
}

TEST(IndexMapTest, MergesDimsTableByTable) {
  struct Case {
    const char* scenario;
    Shape out;
    std::vector<Shape> strides;
    bool fits;
    std::vector<int64_t> dims;  // when it fits
    std::vector<Shape> merged;
  };
  const Shape d234 = Dense({2, 3, 4});
  const std::vector<Case> cases = {
      {"same shapes are one run", {2, 3, 4}, {d234, d234}, true, {24}, {{1}, {1}}},
      {"a scalar operand is one run of stride 0",
       {2, 3, 4},
       {d234, BroadcastStrides({}, {2, 3, 4})},
       true,
       {24},
       {{1}, {0}}},
      {"a per-channel bias keeps three dims",
       {2, 3, 4, 5},
       {Dense({2, 3, 4, 5}), BroadcastStrides({3, 1, 1}, {2, 3, 4, 5})},
       true,
       {2, 3, 20},
       {{60, 20, 1}, {0, 1, 0}}},
      {"a row broadcast over leading dims",
       {2, 3, 4},
       {d234, BroadcastStrides({4}, {2, 3, 4})},
       true,
       {6, 4},
       {{4, 1}, {0, 1}}},
      {"size-1 dims are dropped", {1, 5, 1}, {Dense({1, 5, 1})}, true, {5}, {{1}}},
      {"all size-1 dims are a single element", {1, 1}, {Dense({1, 1})}, true, {}, {{}}},
      {"an empty space is one dim of size 0", {2, 0, 3}, {Dense({2, 0, 3})}, true, {0}, {{0}}},
      {"a transpose of the two inner dims keeps three",
       {2, 4, 3},
       {{12, 1, 4}},
       true,
       {2, 4, 3},
       {{12, 1, 4}}},
      {"a rotation merges the dims that stay adjacent",
       {3, 4, 2},
       {{4, 1, 12}},
       true,
       {12, 2},
       {{1, 12}}},
      {"rank 9 of one shape merges into one run",
       Shape(9, 2),
       {Dense(Shape(9, 2)), Dense(Shape(9, 2))},
       true,
       {512},
       {{1}, {1}}},
      {"rank 9 alternating broadcasts cannot merge",
       Shape(9, 2),
       {BroadcastStrides({2, 1, 2, 1, 2, 1, 2, 1, 2}, Shape(9, 2)),
        BroadcastStrides({1, 2, 1, 2, 1, 2, 1, 2, 1}, Shape(9, 2))},
       false,
       {},
       {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    IndexMap m;
    ASSERT_EQ(MakeIndexMap(c.out, c.strides, &m), c.fits);
    if (!c.fits) continue;
    EXPECT_EQ(MapDims(m), c.dims);
    for (size_t k = 0; k < c.merged.size(); ++k) EXPECT_EQ(MapStrides(m, k), c.merged[k]);
    EXPECT_EQ(IndexMapCount(m), NumElements(c.out));
  }
}

// A random shape broadcasting to `out`: a suffix of it with some dims replaced by 1.
Shape RandomOperand(const Shape& out, std::mt19937& rng) {
  const size_t rank = std::uniform_int_distribution<size_t>(0, out.size())(rng);
  Shape s(out.end() - rank, out.end());
  for (int64_t& d : s) {
    if (rng() % 3 == 0) d = 1;
  }
  return s;
}

TEST(IndexMapTest, BroadcastOffsetsMatchForEachBroadcast) {
  std::mt19937 rng(7);
  int fitted = 0, refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t rank = std::uniform_int_distribution<size_t>(0, 10)(rng);
    Shape out(rank);
    for (int64_t& d : out) d = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    const Shape a = RandomOperand(out, rng), b = RandomOperand(out, rng);
    SCOPED_TRACE(Str(out) + " from " + Str(a) + " and " + Str(b));
    const std::vector<Shape> strides = {BroadcastStrides(a, out), BroadcastStrides(b, out)};
    IndexMap m;
    if (!MakeIndexMap(out, strides, &m)) {
      // Refused only when more than kMaxIndexDims dims stay apart.
      EXPECT_GT(rank, static_cast<size_t>(kMaxIndexDims));
      ++refused;
      continue;
    }
    ++fitted;
    ASSERT_LE(m.rank, kMaxIndexDims);
    ASSERT_EQ(IndexMapCount(m), NumElements(out));
    int bad = 0;
    ForEachBroadcast(out, strides, [&](int64_t e, const int64_t* want) {
      int64_t got[kMaxIndexOperands];
      MapIndex(m, e, got);
      if ((got[0] != want[0] || got[1] != want[1]) && ++bad <= 3) {
        ADD_FAILURE() << "element " << e << ": want " << want[0] << "," << want[1] << " got "
                      << got[0] << "," << got[1];
      }
    });
    ASSERT_EQ(bad, 0);
  }
  EXPECT_GT(fitted, 2500);
  EXPECT_GT(refused, 0);  // the limit was exercised
}

TEST(IndexMapTest, PermutedOffsetsMatchAnUnravel) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 2000; ++iter) {
    const size_t rank = std::uniform_int_distribution<size_t>(1, 8)(rng);
    Shape x(rank);
    for (int64_t& d : x) d = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    std::vector<int64_t> perm(rank);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    Shape y(rank);
    std::vector<int64_t> source(rank);
    const Shape xs = DenseStrides(x);
    for (size_t j = 0; j < rank; ++j) {
      y[j] = x[perm[j]];
      source[j] = xs[perm[j]];
    }
    SCOPED_TRACE(Str(x) + " permuted to " + Str(y));
    IndexMap m;
    ASSERT_TRUE(MakeIndexMap(y, {source}, &m));
    ASSERT_EQ(IndexMapCount(m), NumElements(y));
    for (int64_t e = 0; e < NumElements(y); ++e) {
      const std::vector<int64_t> j = Unravel(e, y);
      int64_t want = 0;
      for (size_t d = 0; d < rank; ++d) want += j[d] * source[d];
      int64_t got[kMaxIndexOperands];
      MapIndex(m, e, got);
      ASSERT_EQ(got[0], want) << "element " << e;
      ASSERT_EQ(got[1], 0) << "unused operand";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Binary ops against the CPU.

// LaunchBinary's loop on the host.
std::vector<float> HostBinary(BinaryOp op, const HostTensor& a, const HostTensor& b,
                              const Shape& out) {
  IndexMap m;
  EXPECT_TRUE(
      MakeIndexMap(out, {BroadcastStrides(a.shape, out), BroadcastStrides(b.shape, out)}, &m));
  std::vector<float> z(IndexMapCount(m));
  for (int64_t e = 0; e < static_cast<int64_t>(z.size()); ++e) {
    int64_t off[kMaxIndexOperands];
    MapIndex(m, e, off);
    z[e] = ApplyBinary(op, a.floats()[off[0]], b.floats()[off[1]]);
  }
  return z;
}

// Numpy broadcasting by unravelling each output index.
std::vector<float> ReferenceBinary(const std::string& op, const HostTensor& a, const HostTensor& b,
                                   const Shape& out) {
  auto at = [&](const HostTensor& t, const std::vector<int64_t>& j) {
    const size_t skip = out.size() - t.shape.size();
    int64_t off = 0;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      off = off * t.shape[d] + (t.shape[d] == 1 ? 0 : j[skip + d]);
    }
    return t.floats()[off];
  };
  std::vector<float> z(NumElements(out));
  for (int64_t e = 0; e < static_cast<int64_t>(z.size()); ++e) {
    const std::vector<int64_t> j = Unravel(e, out);
    const float u = at(a, j), v = at(b, j);
    z[e] = op == "Add"   ? u + v
           : op == "Sub" ? u - v
           : op == "Mul" ? u * v
           : op == "Div" ? u / v
                         : std::pow(u, v);
  }
  return z;
}

TEST(BinaryTest, EveryBroadcastPatternAndOpMatchesTheCpu) {
  struct Case {
    const char* scenario;
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {"same shapes", {2, 3, 4}, {2, 3, 4}},
      {"scalar on the right", {2, 3, 4}, {}},
      {"scalar on the left", {}, {2, 3, 4}},
      {"both scalars", {}, {}},
      {"a row over a matrix", {4, 5}, {5}},
      {"a row on the left", {5}, {4, 5}},
      {"a column against a row", {4, 1}, {1, 5}},
      {"per-channel middle dim", {2, 3, 4, 5}, {3, 1, 1}},
      {"middle dim of the same rank", {2, 3, 4}, {1, 3, 1}},
      {"the first operand broadcasts in the middle", {2, 1, 4}, {2, 3, 4}},
      {"both sides broadcast", {2, 1, 4}, {1, 3, 1}},
      {"rank 6 with alternating broadcasts", {2, 1, 3, 1, 2, 1}, {1, 2, 1, 3, 1, 2}},
      {"a one-element tensor of rank 3", {1, 1, 1}, {2, 3}},
      {"empty", {0, 3}, {3}},
  };
  for (const std::string op : {"Add", "Sub", "Mul", "Div", "Pow"}) {
    BinaryOp bop;
    ASSERT_TRUE(BinaryOpFor(op, &bop));
    for (const Case& c : cases) {
      SCOPED_TRACE(op + ": " + c.scenario);
      auto out = BroadcastShapes(c.a, c.b);
      ASSERT_TRUE(out.ok()) << out.status();
      ModelBuilder mb;
      mb.Input("a", c.a).Input("b", c.b);
      mb.Node(op, {"a", "b"}, {"z"});
      OutputOfRank(mb, "z", out->size());
      // Pow of a negative base to a fractional power is NaN; keep the bases positive.
      const float lo = op == "Pow" ? 0.25f : -2.f;
      const HostTensor a = RandomTensor(c.a, 3, lo, 2.f);
      HostTensor b = RandomTensor(c.b, 4, -2.f, 2.f);
      // Divisors away from 0, so that a rounding difference stays small.
      if (op == "Div") {
        for (int64_t i = 0; i < b.num_elements(); ++i) {
          b.floats()[i] += b.floats()[i] < 0 ? -0.5f : 0.5f;
        }
      }
      const CpuResult cpu = RunCpu(mb.Bytes(), {a, b});
      ASSERT_TRUE(cpu.status.ok()) << cpu.status;
      const std::vector<float> host = HostBinary(bop, a, b, *out);
      ExpectSame(ReferenceBinary(op, a, b, *out), host, 0, "map against the reference");
      ExpectSame(Floats(cpu.outputs[0]), host, 0, "map against the CPU");
    }
  }
}

TEST(BinaryTest, SpecialValues) {
  const std::vector<float> u = {0.f, -0.f, 1.f, -1.f, INFINITY, -INFINITY, NAN, 2.f, 0.5f, -8.f};
  const std::vector<float> v = {0.f, 0.f, INFINITY, -INFINITY, 0.f, 2.f, 1.f, 0.5f, -3.f, 1.f / 3};
  for (const std::string op : {"Add", "Sub", "Mul", "Div", "Pow"}) {
    SCOPED_TRACE(op);
    BinaryOp bop;
    ASSERT_TRUE(BinaryOpFor(op, &bop));
    const Shape s = {static_cast<int64_t>(u.size())};
    ModelBuilder mb;
    mb.Input("a", s).Input("b", s);
    mb.Node(op, {"a", "b"}, {"z"});
    OutputOfRank(mb, "z", 1);
    const HostTensor a = HostTensor::FromFloats(s, u), b = HostTensor::FromFloats(s, v);
    const CpuResult cpu = RunCpu(mb.Bytes(), {a, b});
    ASSERT_TRUE(cpu.status.ok()) << cpu.status;
    ExpectSame(Floats(cpu.outputs[0]), HostBinary(bop, a, b, s), 0, "map against the CPU");
  }
}

TEST(BinaryTest, OpNames) {
  BinaryOp op;
  EXPECT_FALSE(BinaryOpFor("Max", &op));
  ASSERT_TRUE(BinaryOpFor("Div", &op));
  EXPECT_EQ(op, BinaryOp::kDiv);
}

// ---------------------------------------------------------------------------------------------
// Unary ops against the CPU (oneDNN's eltwise): the same values up to rounding, and the same
// special values.

std::vector<float> UnaryInputs() {
  std::vector<float> v;
  for (int i = -400; i <= 400; ++i) v.push_back(i / 20.f);
  for (float x : {0.f, -0.f, 1e-30f, -1e-30f, 1e-7f, -1e-7f, 30.f, -30.f, 80.f, -80.f, 88.f, -87.f,
                  1e30f, -1e30f, INFINITY, -INFINITY, NAN}) {
    v.push_back(x);
  }
  return v;
}

TEST(UnaryTest, EveryOpMatchesTheCpu) {
  struct Case {
    std::string op;
    std::optional<float> alpha;
  };
  const std::vector<Case> cases = {{"LeakyRelu", std::nullopt}, {"LeakyRelu", 0.2f},
                                   {"LeakyRelu", 0.f},          {"LeakyRelu", -1.5f},
                                   {"Exp", std::nullopt},       {"Log", std::nullopt},
                                   {"Sqrt", std::nullopt},      {"Neg", std::nullopt},
                                   {"Abs", std::nullopt},       {"Softplus", std::nullopt}};
  const std::vector<float> x = UnaryInputs();
  const Shape s = {static_cast<int64_t>(x.size())};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + (c.alpha ? " alpha " + std::to_string(*c.alpha) : ""));
    UnaryOp op;
    ASSERT_TRUE(UnaryOpFor(c.op, &op));
    ModelBuilder mb;
    mb.Input("x", s);
    onnx::NodeProto& n = mb.Node(c.op, {"x"}, {"y"});
    if (c.alpha) ModelBuilder::Attr(n, "alpha", *c.alpha);
    OutputOfRank(mb, "y", 1);
    const CpuResult cpu = RunCpu(mb.Bytes(), {HostTensor::FromFloats(s, x)});
    ASSERT_TRUE(cpu.status.ok()) << cpu.status;
    // As basic_kernels.cc's Unary reads the slope.
    const float alpha = c.op == "LeakyRelu" ? c.alpha.value_or(0.01f) : 0.f;
    std::vector<float> host(x.size());
    for (size_t i = 0; i < x.size(); ++i) host[i] = ApplyUnary(op, alpha, x[i]);
    std::vector<float> want = Floats(cpu.outputs[0]);
    if (c.op == "Exp") {
      // oneDNN's exp gives +inf for NaN; the CUDA device keeps NaN, as ONNX's Exp does.
      EXPECT_EQ(want.back(), INFINITY);
      want.back() = NAN;
    }
    // Sign changes and selections are exact; oneDNN's transcendental functions are
    // approximations (its log is off by up to about 1e-5 relative near 1), within the parity
    // tests' tolerance of the CUDA device's correctly rounded ones.
    const bool exact = c.op == "LeakyRelu" || c.op == "Neg" || c.op == "Abs";
    ExpectSame(want, host, exact ? 0 : 1e-5, "ApplyUnary against the CPU");
  }
}

TEST(UnaryTest, OpNames) {
  UnaryOp op;
  for (const char* cudnn : {"Relu", "Sigmoid", "Tanh", "Elu"}) EXPECT_FALSE(UnaryOpFor(cudnn, &op));
  ASSERT_TRUE(UnaryOpFor("Softplus", &op));
  EXPECT_EQ(op, UnaryOp::kSoftplus);
}

// The CUDA device computes Relu with cuDNN, told not to propagate NaN (basic_kernels.cc), because
// the CPU's Relu turns NaN into 0.
TEST(UnaryTest, CpuReluTurnsNanIntoZero) {
  const Shape s = {4};
  ModelBuilder mb;
  mb.Input("x", s);
  mb.Node("Relu", {"x"}, {"y"});
  OutputOfRank(mb, "y", 1);
  const CpuResult cpu = RunCpu(mb.Bytes(), {HostTensor::FromFloats(s, {NAN, -1.f, 2.f, -0.f})});
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ExpectSame({0.f, 0.f, 2.f, 0.f}, Floats(cpu.outputs[0]), 0, "Relu");
}

// ---------------------------------------------------------------------------------------------
// Transpose against the CPU.

// basic_kernels.cc's Transpose on the host: the input's strides in the output's dim order.
std::vector<float> HostTranspose(const HostTensor& x, const std::vector<int64_t>& perm) {
  Shape y(perm.size());
  std::vector<int64_t> source(perm.size());
  const Shape xs = DenseStrides(x.shape);
  for (size_t j = 0; j < perm.size(); ++j) {
    y[j] = x.shape[perm[j]];
    source[j] = xs[perm[j]];
  }
  IndexMap m;
  EXPECT_TRUE(MakeIndexMap(y, {source}, &m));
  std::vector<float> out(IndexMapCount(m));
  for (int64_t e = 0; e < static_cast<int64_t>(out.size()); ++e) {
    int64_t off[kMaxIndexOperands];
    MapIndex(m, e, off);
    out[e] = x.floats()[off[0]];
  }
  return out;
}

void CheckTranspose(const Shape& x_shape, const std::vector<int64_t>& perm, bool set_perm) {
  SCOPED_TRACE(Str(x_shape) + " perm " + Str(perm));
  ModelBuilder mb;
  mb.Input("x", x_shape);
  onnx::NodeProto& n = mb.Node("Transpose", {"x"}, {"y"});
  if (set_perm) ModelBuilder::Attr(n, "perm", perm);
  OutputOfRank(mb, "y", x_shape.size());
  const HostTensor x = RandomTensor(x_shape, 5);
  const CpuResult cpu = RunCpu(mb.Bytes(), {x});
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ExpectSame(Floats(cpu.outputs[0]), HostTranspose(x, perm), 0, "map against the CPU");
}

// Lgamma, Digamma and Erfinv (PyTorch's lgamma, digamma and erfinv) at known values, poles and
// outside their domains, and Erfinv as erf's inverse over a sweep.
TEST(SpecialFunctionTest, KnownValuesPolesAndInverse) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_NEAR(Lgamma(0.5f), 0.5723649429f, 1e-6);   // log(sqrt(pi))
  EXPECT_NEAR(Lgamma(-0.5f), 1.2655121235f, 1e-6);  // log(2 sqrt(pi))
  EXPECT_NEAR(Lgamma(30.f), 71.2570389672f, 1e-4);  // log(29!)
  EXPECT_EQ(Lgamma(0.f), kInf);
  EXPECT_NEAR(Digamma(1.f), -0.5772156649f, 1e-6);  // minus the Euler-Mascheroni constant
  EXPECT_NEAR(Digamma(0.5f), -1.9635100260f, 1e-6);
  EXPECT_NEAR(Digamma(10.f), 2.2517525891f, 1e-6);   // the series' first point
  EXPECT_NEAR(Digamma(9.99f), 2.2507020f, 1e-5);     // the recurrence's last one
  EXPECT_NEAR(Digamma(-0.5f), 0.0364899740f, 1e-6);  // the reflection
  EXPECT_EQ(Digamma(0.f), -kInf);
  EXPECT_EQ(Digamma(-0.f), kInf);
  EXPECT_TRUE(std::isnan(Digamma(-2.f)));
  EXPECT_TRUE(std::isnan(Digamma(std::nanf(""))));
  EXPECT_EQ(Digamma(kInf), kInf);
  EXPECT_NEAR(Polygamma(1, 1.f), 1.6449340668f, 1e-6);    // pi^2 / 6
  EXPECT_NEAR(Polygamma(1, 0.5f), 4.9348022005f, 2e-6);   // pi^2 / 2
  EXPECT_NEAR(Polygamma(1, -0.5f), 8.9348022005f, 4e-6);  // pi^2 / 2 + 4, summed from below 0
  EXPECT_NEAR(Polygamma(1, 10.f), 0.1051663357f, 1e-7);   // the tail's first point
  EXPECT_NEAR(Polygamma(1, 1000.f), 0.0010005002f, 1e-9);
  EXPECT_NEAR(Polygamma(2, 1.f), -2.4041138063f, 2e-6);  // -2 zeta(3)
  EXPECT_NEAR(Polygamma(3, 1.f), 6.4939394023f, 4e-6);   // pi^4 / 15
  EXPECT_NEAR(Polygamma(0, 1.f), Digamma(1.f), 0.f);
  EXPECT_EQ(Polygamma(1, 0.f), kInf);
  EXPECT_EQ(Polygamma(2, -1.f), -kInf);
  EXPECT_EQ(Polygamma(1, kInf), 0.f);
  EXPECT_TRUE(std::isnan(Polygamma(-1, 1.f)));
  EXPECT_TRUE(std::isnan(Polygamma(1, std::nanf(""))));
  EXPECT_NEAR(Erfinv(0.5f), 0.4769362762f, 1e-7);
  EXPECT_EQ(Erfinv(1.f), kInf);
  EXPECT_EQ(Erfinv(-1.f), -kInf);
  EXPECT_TRUE(std::isnan(Erfinv(1.5f)));
  EXPECT_TRUE(std::isnan(Erfinv(std::nanf(""))));
  EXPECT_TRUE(std::signbit(Erfinv(-0.f)));
  for (float x = -3.5f; x <= 3.5f; x += 0.0625f) {
    const float y = std::erf(x);
    if (std::fabs(y) == 1.f) continue;
    // erf is flat in the tails: compare where a float y still tells x apart.
    EXPECT_NEAR(std::erf(Erfinv(y)), y, 2e-7f) << x;
    if (std::fabs(x) < 2.f) {
      EXPECT_NEAR(Erfinv(y), x, 4e-6f * std::max(1.f, std::fabs(x))) << x;
    }
  }
}

TEST(TransposeTest, EveryPermutationOfRanksOneToFive) {
  const Shape distinct = {2, 3, 4, 5, 6};
  const Shape with_ones = {1, 3, 1, 4, 2};
  for (size_t rank = 1; rank <= 5; ++rank) {
    for (const Shape& dims : {distinct, with_ones}) {
      const Shape x(dims.begin(), dims.begin() + rank);
      std::vector<int64_t> perm(rank);
      std::iota(perm.begin(), perm.end(), 0);
      do {
        CheckTranspose(x, perm, true);
        if (::testing::Test::HasFatalFailure()) return;
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
  }
}

TEST(TransposeTest, DefaultPermReversesAndEmptyTensors) {
  CheckTranspose({2, 3, 4}, {2, 1, 0}, false);
  CheckTranspose({2, 0, 3}, {1, 2, 0}, true);
}

// ---------------------------------------------------------------------------------------------
// Pad against the CPU.

// LaunchPad's loop on the host.
std::vector<float> HostPad(const PadMap& m, float value, const HostTensor& x) {
  std::vector<float> y(PadOutputCount(m));
  for (int64_t o = 0; o < static_cast<int64_t>(y.size()); ++o) {
    const int64_t src = PadSourceIndex(m, o);
    y[o] = src < 0 ? value : x.floats()[src];
  }
  return y;
}

// Per output element, per dim: the input index is the output's less the begin pad.
std::vector<float> ReferencePad(const HostTensor& x, const std::vector<int64_t>& pads,
                                float value) {
  const size_t rank = x.shape.size();
  Shape out = x.shape;
  for (size_t d = 0; d < rank; ++d) out[d] += pads[d] + pads[d + rank];
  std::vector<float> y(NumElements(out));
  for (int64_t e = 0; e < static_cast<int64_t>(y.size()); ++e) {
    const std::vector<int64_t> j = Unravel(e, out);
    int64_t src = 0;
    bool inside = true;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t i = j[d] - pads[d];
      inside = inside && i >= 0 && i < x.shape[d];
      src = src * x.shape[d] + i;
    }
    y[e] = inside ? x.floats()[src] : value;
  }
  return y;
}

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

TEST(PadTest, MatchesTheCpuAndTheReference) {
  struct Case {
    const char* scenario;
    Shape x;
    std::vector<int64_t> pads;  // begins, then ends
  };
  const std::vector<Case> cases = {
      {"1-D both ends", {5}, {2, 3}},
      {"1-D no padding", {5}, {0, 0}},
      {"2-D asymmetric", {3, 4}, {1, 0, 2, 3}},
      {"2-D only the outer dim (merges with the inner)", {3, 4}, {1, 0, 2, 0}},
      {"2-D only the inner dim", {3, 4}, {0, 2, 0, 1}},
      {"NCHW spatial pads", {2, 3, 4, 5}, {0, 0, 1, 2, 0, 0, 2, 1}},
      {"NCHW every dim", {2, 3, 2, 2}, {1, 2, 1, 0, 0, 1, 1, 2}},
      {"size-1 dims padded", {1, 3, 1}, {1, 0, 2, 0, 0, 1}},
      {"rank 5", {2, 1, 3, 2, 2}, {0, 1, 0, 1, 0, 1, 0, 0, 2, 1}},
      {"an empty input is all padding", {0, 3}, {1, 1, 0, 1}},
      {"a scalar", {}, {}},
      {"rows split over threads", {8, 64, 130}, {0, 1, 2, 0, 2, 3}},
  };
  for (const PadForm form : {PadForm::kInputs, PadForm::kInputsNoValue, PadForm::kAttributes}) {
    const float value = form == PadForm::kInputsNoValue ? 0.f : -7.5f;
    for (const Case& c : cases) {
      // The checker wants a non-empty pads attribute.
      if (form == PadForm::kAttributes && c.x.empty()) continue;
      SCOPED_TRACE(std::string(c.scenario) + " form " + std::to_string(static_cast<int>(form)));
      PadMap m;
      ASSERT_TRUE(MakePadMap(c.x, c.pads, &m));
      const HostTensor x = RandomTensor(c.x, 9);
      const std::vector<float> host = HostPad(m, value, x);
      ExpectSame(ReferencePad(x, c.pads, value), host, 0, "map against the reference");
      const CpuResult cpu = RunCpu(PadModel(c.x, c.pads, value, form), {x});
      ASSERT_TRUE(cpu.status.ok()) << cpu.status;
      ExpectSame(Floats(cpu.outputs[0]), host, 0, "map against the CPU");
    }
  }
}

TEST(PadTest, MapMergesUnpaddedInnerDims) {
  PadMap m;
  ASSERT_TRUE(MakePadMap({2, 3, 4, 5}, {0, 0, 1, 0, 0, 0, 2, 0}, &m));
  // [2, 3] and [4, 5] each merge: the inner dim of each pair is unpadded.
  ASSERT_EQ(m.rank, 2);
  EXPECT_EQ(std::vector<int64_t>(m.in, m.in + 2), (std::vector<int64_t>{6, 20}));
  EXPECT_EQ(std::vector<int64_t>(m.out, m.out + 2), (std::vector<int64_t>{6, 35}));
  EXPECT_EQ(std::vector<int64_t>(m.begin, m.begin + 2), (std::vector<int64_t>{0, 5}));
  ASSERT_TRUE(MakePadMap({2, 3}, {0, 0, 0, 0}, &m));
  EXPECT_EQ(m.rank, 1);
}

// Nine padded dims do not fit the map: the CUDA device refuses them, the CPU falls back to its
// scatter, which must still pad correctly.
TEST(PadTest, RankTheMapCannotHold) {
  const Shape x(9, 2);
  std::vector<int64_t> pads(18, 0);
  for (size_t d = 0; d < 9; ++d) pads[d] = 1;
  PadMap m;
  EXPECT_FALSE(MakePadMap(x, pads, &m));
  const HostTensor t = RandomTensor(x, 10);
  const CpuResult cpu = RunCpu(PadModel(x, pads, 1.5f, PadForm::kInputs), {t});
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ExpectSame(ReferencePad(t, pads, 1.5f), Floats(cpu.outputs[0]), 0, "CPU against the reference");
}

// Negative pads (cropping) never reach a kernel.
TEST(PadTest, NegativePadsAreRefused) {
  auto exe = Executable::Compile(PadModel({3, 4}, {0, -1, 0, 0}, 0.f, PadForm::kInputs), {});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), StatusCode::kUnimplemented) << exe.status();
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace against the CPU and the ONNX definition.

// ONNX's definition: DCR reshapes x to [n, b, b, c', h, w] and transposes (0, 3, 4, 1, 5, 2);
// CRD reshapes to [n, c', b, b, h, w] and transposes (0, 1, 4, 2, 5, 3).
std::vector<float> ReferenceDepthToSpace(const HostTensor& x, int64_t b, bool dcr) {
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  const int64_t co = c / (b * b);
  const Shape out = {n, co, h * b, w * b};
  std::vector<float> y(NumElements(out));
  for (int64_t e = 0; e < static_cast<int64_t>(y.size()); ++e) {
    const std::vector<int64_t> j = Unravel(e, out);
    const int64_t cc = j[1], hh = j[2] / b, i = j[2] % b, ww = j[3] / b, jj = j[3] % b;
    const int64_t ci = dcr ? (i * b + jj) * co + cc : (cc * b + i) * b + jj;
    y[e] = x.floats()[((j[0] * c + ci) * h + hh) * w + ww];
  }
  return y;
}

TEST(DepthToSpaceTest, BothModesMatchTheCpuAndTheDefinition) {
  struct Case {
    Shape x;
    int64_t block;
  };
  const std::vector<Case> cases = {{{2, 8, 3, 4}, 2},
                                   {{1, 18, 2, 3}, 3},
                                   {{2, 4, 1, 1}, 2},
                                   {{1, 3, 2, 2}, 1},
                                   {{3, 16, 2, 1}, 2}};
  for (const std::string mode : {"DCR", "CRD"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(mode + " " + Str(c.x) + " block " + std::to_string(c.block));
      const DepthToSpaceGeometry g{c.x[0], c.x[1], c.x[2], c.x[3], c.block, mode == "DCR"};
      const HostTensor x = RandomTensor(c.x, 12);
      // LaunchDepthToSpace's loop on the host; every output element is written exactly once.
      std::vector<float> host(DepthToSpaceCount(g), NAN);
      std::vector<int> writes(host.size(), 0);
      for (int64_t i = 0; i < DepthToSpaceCount(g); ++i) {
        const int64_t o = DepthToSpaceTarget(g, i);
        ASSERT_TRUE(o >= 0 && o < static_cast<int64_t>(host.size())) << i << " -> " << o;
        host[o] = x.floats()[i];
        ++writes[o];
      }
      EXPECT_TRUE(std::all_of(writes.begin(), writes.end(), [](int n) { return n == 1; }));
      ExpectSame(ReferenceDepthToSpace(x, c.block, mode == "DCR"), host, 0,
                 "map against the definition");
      ModelBuilder mb;
      mb.Input("x", c.x);
      onnx::NodeProto& n = mb.Node("DepthToSpace", {"x"}, {"y"});
      ModelBuilder::Attr(n, "blocksize", c.block);
      ModelBuilder::Attr(n, "mode", mode);
      OutputOfRank(mb, "y", 4);
      const CpuResult cpu = RunCpu(mb.Bytes(), {x});
      ASSERT_TRUE(cpu.status.ok()) << cpu.status;
      ExpectSame(Floats(cpu.outputs[0]), host, 0, "map against the CPU");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// SoftmaxCrossEntropyLoss.

struct SceCase {
  const char* scenario;
  Shape scores;
  std::vector<int64_t> labels;  // shape: scores without dim 1
  std::string reduction = "mean";
  bool weights = false;
  std::optional<int64_t> ignore_index = std::nullopt;
  bool log_prob = false;
};

Shape LabelShape(const Shape& scores) {
  Shape l = scores;
  l.erase(l.begin() + 1);
  return l;
}

std::string SceModel(const SceCase& c) {
  ModelBuilder mb;
  mb.Input("scores", c.scores);
  mb.Input("labels", LabelShape(c.scores), onnx::TensorProto::INT64);
  std::vector<std::string> inputs = {"scores", "labels"};
  if (c.weights) {
    mb.Input("w", {c.scores[1]});
    inputs.push_back("w");
  }
  std::vector<std::string> outputs = {"loss"};
  if (c.log_prob) outputs.push_back("log_prob");
  onnx::NodeProto& n = mb.Node("SoftmaxCrossEntropyLoss", inputs, outputs);
  ModelBuilder::Attr(n, "reduction", c.reduction);
  if (c.ignore_index) ModelBuilder::Attr(n, "ignore_index", *c.ignore_index);
  OutputOfRank(mb, "loss", c.reduction == "none" ? c.scores.size() - 1 : 0);
  if (c.log_prob) OutputOfRank(mb, "log_prob", c.scores.size());
  return mb.Bytes();
}

SceSpec SpecOf(const SceCase& c) {
  SceSpec s;
  s.n = c.scores[0];
  s.c = c.scores[1];
  for (size_t i = 2; i < c.scores.size(); ++i) s.d *= c.scores[i];
  s.has_ignore = c.ignore_index.has_value();
  s.ignore_index = c.ignore_index.value_or(0);
  s.reduction = c.reduction == "mean" ? 0 : c.reduction == "sum" ? 1 : 2;
  return s;
}

// The sum in SceReduceKernel's order (elementwise.cu): 256 threads, thread t adding rows t,
// t + 256, ..., then a halving tree over the threads' sums.
float ReduceInKernelOrder(const SceSpec& s, const std::vector<SceTerm>& terms) {
  constexpr size_t kThreads = 256;
  std::vector<double> loss(kThreads, 0), weight(kThreads, 0);
  for (size_t t = 0; t < kThreads; ++t) {
    for (size_t r = t; r < terms.size(); r += kThreads) {
      loss[t] += terms[r].loss;
      weight[t] += terms[r].weight;
    }
  }
  for (size_t half = kThreads / 2; half > 0; half /= 2) {
    for (size_t t = 0; t < half; ++t) {
      loss[t] += loss[t + half];
      weight[t] += weight[t + half];
    }
  }
  return SceReduce(s, loss[0], weight[0]);
}

// ONNX's definition in double: loss, and the log-probabilities.
std::pair<std::vector<float>, std::vector<float>> ReferenceSce(const SceSpec& s,
                                                               const HostTensor& scores,
                                                               const std::vector<int64_t>& labels,
                                                               const float* weights) {
  std::vector<float> logp(s.n * s.c * s.d), none(s.n * s.d, 0.f);
  double total = 0, weight_sum = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    for (int64_t j = 0; j < s.d; ++j) {
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < s.c; ++k)
        mx = std::max<double>(mx, scores.floats()[(i * s.c + k) * s.d + j]);
      for (int64_t k = 0; k < s.c; ++k)
        sum += std::exp(scores.floats()[(i * s.c + k) * s.d + j] - mx);
      for (int64_t k = 0; k < s.c; ++k) {
        logp[(i * s.c + k) * s.d + j] =
            static_cast<float>(scores.floats()[(i * s.c + k) * s.d + j] - mx - std::log(sum));
      }
      const int64_t l = labels[i * s.d + j];
      if ((s.has_ignore && l == s.ignore_index) || l < 0 || l >= s.c) continue;
      const double w = weights != nullptr ? weights[l] : 1.0;
      const double term = -w * logp[(i * s.c + l) * s.d + j];
      none[i * s.d + j] = static_cast<float>(term);
      total += term;
      weight_sum += w;
    }
  }
  if (s.reduction == 2) return {none, logp};
  if (s.reduction == 1) return {{static_cast<float>(total)}, logp};
  return {{weight_sum > 0 ? static_cast<float>(total / weight_sum) : 0.f}, logp};
}

void CheckSce(const SceCase& c) {
  SCOPED_TRACE(c.scenario);
  const SceSpec s = SpecOf(c);
  const HostTensor scores = RandomTensor(c.scores, 21, -3.f, 3.f);
  ASSERT_EQ(static_cast<int64_t>(c.labels.size()), s.n * s.d);
  const HostTensor labels = HostTensor::FromInt64s(LabelShape(c.scores), c.labels);
  const HostTensor w = RandomTensor({c.scores[1]}, 22, 0.25f, 2.f);
  const float* weights = c.weights ? w.floats() : nullptr;

  // LaunchSoftmaxCrossEntropy on the host: SceRow per row, then the kernel's sum.
  std::vector<float> logp(s.n * s.c * s.d, NAN);
  std::vector<SceTerm> terms;
  std::vector<float> loss;
  for (int64_t r = 0; r < s.n * s.d; ++r) {
    terms.push_back(SceRow(s, scores.floats(), labels.int64s(), weights, logp.data(), r));
    loss.push_back(terms.back().loss);
  }
  if (s.reduction != 2) loss = {ReduceInKernelOrder(s, terms)};

  const auto [ref_loss, ref_logp] = ReferenceSce(s, scores, c.labels, weights);
  ExpectSame(ref_loss, loss, 1e-5, "loss against the reference");
  ExpectSame(ref_logp, logp, 1e-5, "log_prob against the reference");

  std::vector<HostTensor> feeds = {scores, labels};
  if (c.weights) feeds.push_back(w);
  const CpuResult cpu = RunCpu(SceModel(c), feeds);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  // Only the order of the final sum differs.
  ExpectSame(Floats(cpu.outputs[0]), loss, 1e-6, "loss against the CPU");
  if (c.log_prob) ExpectSame(Floats(cpu.outputs[1]), logp, 0, "log_prob against the CPU");
}

std::vector<int64_t> RandomLabels(size_t n, int64_t lo, int64_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(lo, hi);
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = d(rng);
  return v;
}

TEST(SceTest, EveryReductionAndOptionMatchesTheCpu) {
  const std::vector<int64_t> six = {0, 4, 2, 1, 3, 0};
  const std::vector<SceCase> cases = {
      {"mean", {6, 5}, six},
      {"sum", {6, 5}, six, "sum"},
      {"none", {6, 5}, six, "none"},
      {"mean with weights", {6, 5}, six, "mean", true},
      {"sum with weights", {6, 5}, six, "sum", true},
      {"none with weights and log_prob", {6, 5}, six, "none", true, std::nullopt, true},
      {"ignore_index counts neither loss nor weight", {6, 5}, six, "mean", true, 0},
      {"a negative ignore_index", {4, 3}, {-1, 2, -1, 0}, "mean", false, -1},
      {"labels out of range are ignored", {5, 3}, {-5, 3, 7, 2, 1}, "mean", true},
      {"every label ignored gives a mean of 0", {3, 4}, {2, 2, 2}, "mean", false, 2},
      {"extra dims, none",
       {2, 3, 2, 2},
       RandomLabels(8, 0, 2, 1),
       "none",
       false,
       std::nullopt,
       true},
      {"extra dims, mean with weights", {2, 3, 2, 2}, RandomLabels(8, 0, 2, 2), "mean", true},
      {"more rows than the kernel's threads",
       {300, 7},
       RandomLabels(300, -1, 7, 3),
       "mean",
       true,
       3},
      {"more rows over extra dims, sum", {5, 4, 70}, RandomLabels(350, 0, 3, 4), "sum"},
      {"no classes, mean", {3, 0}, {0, 1, 2}},
      {"no classes, sum", {3, 0}, {0, 1, 2}, "sum"},
      {"no classes, none", {3, 0}, {0, 1, 2}, "none"},
      {"no rows, mean", {0, 4}, {}},
      {"no rows, sum with log_prob", {0, 4}, {}, "sum", false, std::nullopt, true},
  };
  for (const SceCase& c : cases) CheckSce(c);
}

// Row by row, the terms the reduction sums: with no classes neither scores nor logp are read
// or written (null pointers would fault).
TEST(SceTest, NoClassesTouchesNothing) {
  SceSpec s;
  s.n = 2;
  s.c = 0;
  const int64_t labels[2] = {0, 0};
  const SceTerm t = SceRow(s, nullptr, labels, nullptr, nullptr, 1);
  EXPECT_EQ(t.loss, 0.f);
  EXPECT_EQ(t.weight, 0.f);
  EXPECT_EQ(SceReduce(s, 0, 0), 0.f);
}

}  // namespace
}  // namespace salus::exec
