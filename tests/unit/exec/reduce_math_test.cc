// The index math of the CUDA device's cuBLAS and CUB kernels (src/exec/cuda/reduce_math.h), run
// on the host over whole tensors, against the CPU executable: the GPU runs the same layouts, so
// this is how their logic is checked on a machine without one.
//
//   - Reductions: every op, over every set of axes of tensors of rank 0 to 5 (size-1 dims, empty
//     tensors, negative axes, axes as ReduceSum's input, noop_with_empty_axes), keepdims both
//     ways, computed as the CUDA kernel computes them: the permutation, then the passes of the
//     plan chunk by chunk (long runs cut into chunks), then the finishing step.
//   - Gemm: the column-major cuBLAS call RowMajorGemm describes, emulated, after the C broadcast
//     of GemmBiasSource, for both transposes, alpha and beta, every C shape and the fused Relu.
//   - MatMul: the calls MakeMatMulLayout describes (outer loop, strided batches, folded batches),
//     emulated, for 1-D operands and every pattern of broadcast batch dims.
#include "exec/cuda/reduce_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "exec/shape_inference.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using cuda::ChunkBegin;
using cuda::ChunkEnd;
using cuda::ChunksPerSegment;
using cuda::CublasGemmShape;
using cuda::GemmBias;
using cuda::GemmBiasSource;
using cuda::MatMulLayout;
using cuda::PassOutputs;
using cuda::PermuteSource;
using cuda::ReduceFinish;
using cuda::ReduceInput;
using cuda::ReduceKind;
using cuda::ReduceLayout;
using cuda::ReduceOp;
using cuda::ReducePass;
using testing::MatMulOfStored;
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

// A CPU executable and its single output for `feeds`.
struct CpuRun {
  std::unique_ptr<Executable> exe;
  HostTensor out;
};

::testing::AssertionResult RunCpu(const ModelBuilder& mb, const std::vector<HostTensor>& feeds,
                                  CpuRun* run) {
  auto exe = Executable::Compile(mb.Bytes(), {});
  if (!exe.ok()) return ::testing::AssertionFailure() << "compile: " << exe.status();
  run->exe = std::move(*exe);
  Memory mem(*run->exe);
  auto out = RunHost(*run->exe, mem, feeds);
  if (!out.ok()) return ::testing::AssertionFailure() << "run: " << out.status();
  if (out->size() != 1) return ::testing::AssertionFailure() << out->size() << " outputs";
  run->out = std::move((*out)[0]);
  return ::testing::AssertionSuccess();
}

// |want - got| <= atol + rtol * |want| element by element (NaN matches NaN, infinities match
// themselves); at most a few mismatches reported.
void ExpectClose(const std::vector<float>& want, const float* got, const std::string& what,
                 double rtol = 1e-4, double atol = 1e-5) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = want[i], b = got[i];
    if (std::isnan(a) && std::isnan(b)) continue;
    if (std::isinf(a) && a == b) continue;
    if (std::abs(a - b) <= atol + rtol * std::abs(a)) continue;
    if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: cpu " << b << ", layout " << a;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements differ";
}

std::string ShapeText(const Shape& s) { return ShapeString(s); }

std::string AxesText(const std::vector<int64_t>& a) {
  std::string s = "{";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? "," : "") + std::to_string(a[i]);
  return s + "}";
}

// ---------------------------------------------------------------------------------------------
// Reductions.

const std::vector<std::string>& ReduceOps() {
  static const std::vector<std::string> ops = {"ReduceMean", "ReduceSum",      "ReduceMax",
                                               "ReduceMin",  "ReduceProd",     "ReduceL1",
                                               "ReduceL2",   "ReduceSumSquare"};
  return ops;
}

float Identity(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return 0.f;
    case ReduceOp::kProd:
      return 1.f;
    case ReduceOp::kMax:
      return -std::numeric_limits<float>::infinity();
    case ReduceOp::kMin:
      return std::numeric_limits<float>::infinity();
  }
  return 0.f;
}

float Combine(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMax:
      return (a > b || a != a) ? a : b;
    case ReduceOp::kMin:
      return (a < b || a != a) ? a : b;
  }
  return 0.f;
}

float Transform(ReduceInput input, float v) {
  return input == ReduceInput::kAbs ? std::fabs(v) : input == ReduceInput::kSquare ? v * v : v;
}

// What the CUDA Reduce kernel computes for x (dims `shape`) reduced over `axes` (as
// ReductionAxes resolves them), step by step with the same layout and plan.
std::vector<float> ReduceLikeCuda(const std::string& op, const Shape& shape,
                                  const std::vector<int64_t>& axes, const std::vector<float>& x) {
  ReduceKind kind;
  EXPECT_TRUE(cuda::ReduceKindFor(op, &kind)) << op;
  if (shape.empty() || cuda::ReducesNothing(shape, axes)) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = Transform(cuda::NoReductionMap(kind), x[i]);
    return y;
  }
  ReduceLayout layout;
  EXPECT_TRUE(cuda::MakeReduceLayout(shape, axes, &layout));
  std::vector<float> src = x;
  if (layout.permute) {
    EXPECT_EQ(cuda::PermuteCount(layout.perm), static_cast<int64_t>(x.size()));
    for (int64_t o = 0; o < cuda::PermuteCount(layout.perm); ++o) {
      src[o] = x[PermuteSource(layout.perm, o)];
    }
  }
  const std::vector<ReducePass> passes =
      cuda::PlanReducePasses(layout.segments, layout.segment_len);
  for (size_t p = 0; p < passes.size(); ++p) {
    std::vector<float> dst(PassOutputs(passes[p]));
    for (int64_t i = 0; i < PassOutputs(passes[p]); ++i) {
      float acc = Identity(kind.op);
      for (int64_t j = ChunkBegin(passes[p], i); j < ChunkEnd(passes[p], i); ++j) {
        acc = Combine(kind.op, acc, p == 0 ? Transform(kind.input, src[j]) : src[j]);
      }
      dst[i] = acc;
    }
    src = std::move(dst);
  }
  EXPECT_EQ(static_cast<int64_t>(src.size()), layout.segments);
  for (float& v : src) {
    if (kind.finish == ReduceFinish::kDivide) v /= static_cast<float>(layout.segment_len);
    if (kind.finish == ReduceFinish::kSqrt) v = std::sqrt(v);
  }
  return src;
}

struct ReduceCase {
  std::string op;
  Shape shape;
  std::vector<int64_t> axes;  // as written in the model
  bool axes_attr = true;      // false: no axes at all (every axis, or none with noop)
  int64_t keepdims = 1;
  int opset = 17;  // 13 with ReduceSum: axes as an input
  int64_t noop_with_empty_axes = 0;
  float lo = -1.f, hi = 1.f;  // the input's values
  double atol = 1e-5;         // sums of thousands of elements differ more in absolute terms
};

std::string Describe(const ReduceCase& c) {
  return c.op + " of " + ShapeText(c.shape) + " over " +
         (c.axes_attr ? AxesText(c.axes) : std::string("(no axes)")) +
         " keepdims=" + std::to_string(c.keepdims) + " opset " + std::to_string(c.opset) +
         (c.noop_with_empty_axes ? " noop_with_empty_axes" : "");
}

// Builds the model, runs it on the CPU, and compares with ReduceLikeCuda of the axes the
// engine resolves for the node (ReductionAxes: what the CUDA factory uses).
void CheckReduce(const ReduceCase& c, uint32_t seed) {
  SCOPED_TRACE(Describe(c));
  ModelBuilder mb;
  mb.proto().mutable_opset_import(0)->set_version(c.opset);
  mb.Input("x", c.shape);
  const bool axes_input = c.op == "ReduceSum" && c.opset >= 13;
  std::vector<std::string> inputs = {"x"};
  if (axes_input && c.axes_attr) {
    mb.Int64Initializer("axes", {static_cast<int64_t>(c.axes.size())}, c.axes);
    inputs.push_back("axes");
  }
  auto& node = mb.Node(c.op, inputs, {"y"});
  if (!axes_input && c.axes_attr) ModelBuilder::Attr(node, "axes", c.axes);
  ModelBuilder::Attr(node, "keepdims", c.keepdims);
  if (c.noop_with_empty_axes) ModelBuilder::Attr(node, "noop_with_empty_axes", int64_t{1});
  // The output's rank: the engine infers the dims.
  size_t out_rank = c.shape.size();
  if (c.keepdims == 0) {
    std::vector<bool> reduced(c.shape.size(), !c.axes_attr && !c.noop_with_empty_axes);
    for (int64_t a : c.axes) reduced[a < 0 ? a + static_cast<int64_t>(c.shape.size()) : a] = true;
    out_rank = std::count(reduced.begin(), reduced.end(), false);
  }
  OutputOfRank(mb, "y", out_rank);

  HostTensor x(DataType::kFloat32, c.shape);
  const std::vector<float> values = RandomFloats(x.num_elements(), seed, c.lo, c.hi);
  std::copy(values.begin(), values.end(), x.floats());
  CpuRun run;
  ASSERT_TRUE(RunCpu(mb, {x}, &run));

  const Graph& g = run.exe->graph();
  const Node* reduce = nullptr;
  for (const Node& n : g.nodes()) {
    if (n.op == c.op) reduce = &n;
  }
  ASSERT_NE(reduce, nullptr) << "the reduction was folded away";
  auto axes = ReductionAxes(g, *reduce);
  ASSERT_TRUE(axes.ok()) << axes.status();
  const std::vector<float> want = ReduceLikeCuda(c.op, c.shape, *axes, values);
  ASSERT_EQ(static_cast<int64_t>(want.size()), run.out.num_elements());
  ExpectClose(want, run.out.floats(), Describe(c), 1e-4, c.atol);
}

// Every subset of the dims of `shape`, written with positive axes, and with negative ones.
std::vector<std::vector<int64_t>> AxisSets(const Shape& shape) {
  const int rank = static_cast<int>(shape.size());
  std::vector<std::vector<int64_t>> sets;
  for (int mask = 1; mask < (1 << rank); ++mask) {
    std::vector<int64_t> axes, negative;
    for (int i = 0; i < rank; ++i) {
      if (mask & (1 << i)) {
        axes.push_back(i);
        negative.push_back(i - rank);
      }
    }
    sets.push_back(axes);
    if (mask % 3 == 0) sets.push_back(negative);  // some, not all: the engine normalises them
  }
  return sets;
}

TEST(ReduceMathTest, KindsMatchTheOps) {
  ReduceKind k;
  ASSERT_TRUE(cuda::ReduceKindFor("ReduceL2", &k));
  EXPECT_EQ(k.op, ReduceOp::kSum);
  EXPECT_EQ(k.input, ReduceInput::kSquare);
  EXPECT_EQ(k.finish, ReduceFinish::kSqrt);
  EXPECT_EQ(cuda::NoReductionMap(k), ReduceInput::kAbs);
  ASSERT_TRUE(cuda::ReduceKindFor("ReduceMean", &k));
  EXPECT_EQ(k.finish, ReduceFinish::kDivide);
  EXPECT_EQ(cuda::NoReductionMap(k), ReduceInput::kPlain);
  ASSERT_TRUE(cuda::ReduceKindFor("ReduceSumSquare", &k));
  EXPECT_EQ(cuda::NoReductionMap(k), ReduceInput::kSquare);
  EXPECT_FALSE(cuda::ReduceKindFor("Relu", &k));
}

// Every op over every set of axes of small tensors, keepdims both ways.
TEST(ReduceMathTest, EveryOpAndAxisSetMatchesTheCpu) {
  const std::vector<Shape> shapes = {{7},          {1},          {3, 4},         {1, 5},
                                     {4, 1},       {2, 3, 4},    {3, 1, 5},      {2, 1, 3, 5},
                                     {3, 1, 1, 4}, {2, 3, 4, 5}, {2, 2, 1, 3, 2}};
  uint32_t seed = 1;
  for (const std::string& op : ReduceOps()) {
    for (const Shape& shape : shapes) {
      for (const std::vector<int64_t>& axes : AxisSets(shape)) {
        for (int64_t keepdims : {0, 1}) {
          ReduceCase c;
          c.op = op;
          c.shape = shape;
          c.axes = axes;
          c.keepdims = keepdims;
          // Products of many values in [-1, 1) vanish; keep them near 1.
          if (op == "ReduceProd") c.lo = 0.5f, c.hi = 1.5f;
          CheckReduce(c, seed++);
        }
      }
    }
  }
}

// No axes: every axis, for every op; a scalar input; and ReduceSum's noop_with_empty_axes.
TEST(ReduceMathTest, DefaultAxesScalarsAndNoop) {
  uint32_t seed = 100;
  for (const std::string& op : ReduceOps()) {
    for (const Shape& shape : {Shape{}, Shape{6}, Shape{2, 3, 4}, Shape{1, 1}}) {
      for (int64_t keepdims : {0, 1}) {
        ReduceCase c;
        c.op = op;
        c.shape = shape;
        c.axes_attr = false;
        c.keepdims = keepdims;
        CheckReduce(c, seed++);
      }
    }
  }
  for (int64_t keepdims : {0, 1}) {
    ReduceCase c;
    c.op = "ReduceSum";
    c.opset = 13;
    c.shape = {2, 3, 4};
    c.axes_attr = false;
    c.noop_with_empty_axes = 1;
    c.keepdims = keepdims;
    CheckReduce(c, seed++);
  }
}

// ReduceSum from opset 13 takes its axes as an input (a constant).
TEST(ReduceMathTest, ReduceSumAxesInput) {
  uint32_t seed = 200;
  const Shape shape = {2, 3, 4, 5};
  for (const std::vector<int64_t>& axes : AxisSets(shape)) {
    for (int64_t keepdims : {0, 1}) {
      ReduceCase c;
      c.op = "ReduceSum";
      c.opset = 13;
      c.shape = shape;
      c.axes = axes;
      c.keepdims = keepdims;
      CheckReduce(c, seed++);
    }
  }
}

// Runs long enough to be cut into chunks, with and without a permutation first.
TEST(ReduceMathTest, LongRunsInChunks) {
  struct Long {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const std::vector<Long> cases = {
      {{3, 10000}, {1}},     // 3 runs of 3 chunks, the last one short
      {{10000, 3}, {0}},     // permuted, then chunked
      {{2, 5000, 2}, {1}},   // permuted, kept dims on both sides
      {{1, 9000}, {0, 1}},   // one run
      {{4096 * 2, 1}, {0}},  // exactly two chunks
      {{1500, 8}, {0}},      // short runs: one chunk each
      {{1100, 5000}, {1}},   // many runs: never chunked
  };
  uint32_t seed = 300;
  for (const Long& l : cases) {
    for (const std::string& op : ReduceOps()) {
      ReduceCase c;
      c.op = op;
      c.shape = l.shape;
      c.axes = l.axes;
      c.keepdims = seed % 2;
      c.atol = 1e-4;
      if (op == "ReduceProd") c.lo = 0.9995f, c.hi = 1.0005f;
      CheckReduce(c, seed++);
    }
  }
}

// Tensors with no elements: runs of length 0 give each op's identity (Mean: 0 / 0), and a kept
// dim of 0 leaves nothing to compute.
TEST(ReduceMathTest, EmptyTensors) {
  uint32_t seed = 400;
  for (const std::string& op : ReduceOps()) {
    for (const auto& [shape, axes] : std::vector<std::pair<Shape, std::vector<int64_t>>>{
             {{0, 3}, {1}}, {{3, 0}, {0}}, {{2, 0, 3}, {0, 2}}, {{3, 0}, {1}}, {{2, 0, 3}, {1}}}) {
      ReduceCase c;
      c.op = op;
      c.shape = shape;
      c.axes = axes;
      CheckReduce(c, seed++);
    }
  }
}

TEST(ReduceMathTest, LayoutOfInnerAxesNeedsNoPermutation) {
  ReduceLayout l;
  ASSERT_TRUE(cuda::MakeReduceLayout({2, 3, 4, 5}, {2, 3}, &l));
  EXPECT_FALSE(l.permute);
  EXPECT_EQ(l.segments, 6);
  EXPECT_EQ(l.segment_len, 20);
  // Size-1 dims do not count: [2, 3, 1, 4] over {1, 3} is [2 | 3 * 4] once the 1 is dropped.
  ASSERT_TRUE(cuda::MakeReduceLayout({2, 3, 1, 4}, {1, 3}, &l));
  EXPECT_FALSE(l.permute);
  ASSERT_TRUE(cuda::MakeReduceLayout({2, 3, 4}, {0}, &l));
  EXPECT_TRUE(l.permute);
  EXPECT_EQ(l.perm.rank, 2);
  EXPECT_EQ(l.perm.out[0], 12);
  EXPECT_EQ(l.perm.in_stride[0], 1);
  EXPECT_EQ(l.perm.out[1], 2);
  EXPECT_EQ(l.perm.in_stride[1], 12);
}

TEST(ReduceMathTest, LayoutRefusesTooManyAlternations) {
  ReduceLayout l;
  // Kept and reduced dims alternating 9 times: more than kMaxReduceDims groups.
  EXPECT_FALSE(cuda::MakeReduceLayout({2, 2, 2, 2, 2, 2, 2, 2, 2}, {1, 3, 5, 7}, &l));
  EXPECT_TRUE(cuda::MakeReduceLayout({2, 2, 2, 2, 2, 2, 2, 2}, {1, 3, 5, 7}, &l));
  EXPECT_TRUE(l.permute);
  EXPECT_EQ(l.perm.rank, 8);
}

// Every pass's chunks tile each run in order, and each pass's outputs are the next one's
// runs, down to one value per run: checked for sizes far beyond what the CPU comparison runs,
// where plans have three passes.
TEST(ReduceMathTest, PassesTileEveryRun) {
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 0},
                                                          {5, 0},
                                                          {1, 1},
                                                          {1, cuda::kReduceChunk},
                                                          {1, cuda::kReduceChunk + 1},
                                                          {3, 100000},
                                                          {1023, 5000},
                                                          {1024, 5000},
                                                          {2, int64_t{1} << 25},
                                                          {1, (int64_t{1} << 24) + 7},
                                                          {1, int64_t{1} << 36}};
  for (const auto& [segments, len] : sizes) {
    SCOPED_TRACE(std::to_string(segments) + " runs of " + std::to_string(len));
    const std::vector<ReducePass> passes = cuda::PlanReducePasses(segments, len);
    ASSERT_FALSE(passes.empty());
    EXPECT_LE(passes.size(), 4u);
    int64_t runs_len = len;
    for (size_t p = 0; p < passes.size(); ++p) {
      const ReducePass& pass = passes[p];
      EXPECT_EQ(pass.segments, segments);
      EXPECT_EQ(pass.len, runs_len);
      const int64_t per = ChunksPerSegment(pass);
      if (segments >= cuda::kFewSegments) {
        EXPECT_EQ(per, 1);
      }
      // Chunks are whole runs, or kReduceChunk long when runs are cut.
      EXPECT_TRUE(pass.chunk == std::max<int64_t>(pass.len, 1) ||
                  (pass.chunk == cuda::kReduceChunk && pass.len > cuda::kReduceChunk));
      // The chunks of the first two and the last run.
      for (int64_t s : std::set<int64_t>{0, std::min<int64_t>(1, segments - 1), segments - 1}) {
        int64_t at = s * pass.len;
        for (int64_t c = 0; c < per; ++c) {
          const int64_t i = s * per + c;
          ASSERT_EQ(ChunkBegin(pass, i), at) << "pass " << p << " output " << i;
          ASSERT_LE(ChunkEnd(pass, i), (s + 1) * pass.len);
          ASSERT_LE(ChunkEnd(pass, i) - ChunkBegin(pass, i), pass.chunk);
          ASSERT_TRUE(ChunkEnd(pass, i) > ChunkBegin(pass, i) || pass.len == 0);
          at = ChunkEnd(pass, i);
        }
        EXPECT_EQ(at, (s + 1) * pass.len);
      }
      runs_len = per;
    }
    EXPECT_EQ(ChunksPerSegment(passes.back()), 1);
    EXPECT_EQ(PassOutputs(passes.back()), segments);
  }
}

// ---------------------------------------------------------------------------------------------
// Gemm and MatMul: cuBLAS emulated on the host.

// cuBLAS's sgemm, column-major: C = alpha * op(A) op(B) + beta * C, C [m, n]; with beta 0, C is
// not read.
void ColumnMajorSgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.f;
      for (int64_t l = 0; l < k; ++l) {
        const float av = ta ? a[l + i * lda] : a[i + l * lda];
        const float bv = tb ? b[j + l * ldb] : b[l + j * ldb];
        acc += av * bv;
      }
      float& out = c[i + j * ldc];
      out = alpha * acc + (beta == 0.f ? 0.f : beta * out);
    }
  }
}

struct GemmCase {
  int64_t m = 3, n = 5, k = 4;
  bool ta = false, tb = false;
  float alpha = 1.f, beta = 1.f;
  bool has_c = false;
  Shape c_shape;
  bool relu = false;
};

std::string Describe(const GemmCase& c) {
  return "Gemm M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) +
         " K=" + std::to_string(c.k) + " transA=" + std::to_string(c.ta) +
         " transB=" + std::to_string(c.tb) + " alpha=" + std::to_string(c.alpha) +
         " beta=" + std::to_string(c.beta) +
         (c.has_c ? " C " + ShapeText(c.c_shape) : std::string(" no C")) +
         (c.relu ? " + Relu" : "");
}

void CheckGemm(const GemmCase& c, uint32_t seed) {
  SCOPED_TRACE(Describe(c));
  const Shape a_shape = c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k};
  const Shape b_shape = c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n};
  ModelBuilder mb;
  mb.Input("a", a_shape).Input("b", b_shape);
  std::vector<std::string> inputs = {"a", "b"};
  if (c.has_c) {
    mb.Input("c", c.c_shape);
    inputs.push_back("c");
  }
  auto& gemm = mb.Node("Gemm", inputs, {c.relu ? "g" : "y"});
  if (c.ta) ModelBuilder::Attr(gemm, "transA", int64_t{1});
  if (c.tb) ModelBuilder::Attr(gemm, "transB", int64_t{1});
  if (c.alpha != 1.f) ModelBuilder::Attr(gemm, "alpha", c.alpha);
  if (c.beta != 1.f) ModelBuilder::Attr(gemm, "beta", c.beta);
  if (c.relu) mb.Node("Relu", {"g"}, {"y"});
  mb.Output("y", {c.m, c.n});

  std::vector<HostTensor> feeds;
  feeds.push_back(HostTensor::FromFloats(a_shape, RandomFloats(c.m * c.k, seed)));
  feeds.push_back(HostTensor::FromFloats(b_shape, RandomFloats(c.k * c.n, seed + 1)));
  if (c.has_c) {
    feeds.push_back(
        HostTensor::FromFloats(c.c_shape, RandomFloats(NumElements(c.c_shape), seed + 2)));
  }
  CpuRun run;
  ASSERT_TRUE(RunCpu(mb, feeds, &run));
  if (c.relu) {
    // Inference fuses the Relu into the Gemm: the CUDA kernel must honour the attribute.
    const Graph& g = run.exe->graph();
    ASSERT_EQ(g.nodes().size(), 1u);
    EXPECT_EQ(g.nodes()[0].GetString("fused_activation", ""), "Relu");
  }

  // The CUDA kernel's steps: beta * C broadcast into Y, then the sgemm (beta 1 onto it, or 0
  // without C), then the Relu.
  const bool has_c = c.has_c && c.beta != 0.f;
  std::vector<float> y(c.m * c.n, std::numeric_limits<float>::quiet_NaN());
  if (has_c) {
    const GemmBias bias = cuda::MakeGemmBias(c.c_shape, c.m, c.n);
    for (int64_t e = 0; e < c.m * c.n; ++e) {
      y[e] = c.beta * feeds[2].floats()[GemmBiasSource(bias, e)];
    }
  } else if (c.k == 0) {
    std::fill(y.begin(), y.end(), 0.f);
  }
  if (c.k > 0 && c.m * c.n > 0) {
    const CublasGemmShape s = cuda::RowMajorGemm(c.m, c.n, c.k, c.ta, c.tb);
    ColumnMajorSgemm(s.trans_first, s.trans_second, s.m, s.n, s.k, c.alpha, feeds[1].floats(),
                     s.ld_first, feeds[0].floats(), s.ld_second, has_c ? 1.f : 0.f, y.data(),
                     s.ld_out);
  }
  if (c.relu) {
    for (float& v : y) v = v < 0.f ? 0.f : v;
  }
  ASSERT_EQ(static_cast<int64_t>(y.size()), run.out.num_elements());
  ExpectClose(y, run.out.floats(), Describe(c));
}

TEST(ReduceMathTest, GemmMatchesTheCpu) {
  const std::vector<Shape> c_shapes = {{}, {1}, {5}, {1, 5}, {3, 1}, {3, 5}, {1, 1}};
  uint32_t seed = 500;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (const auto& [alpha, beta] : std::vector<std::pair<float, float>>{
               {1.f, 1.f}, {0.5f, 2.f}, {-1.5f, 1.f}, {1.f, 0.f}}) {
        for (bool relu : {false, true}) {
          GemmCase none;
          none.ta = ta;
          none.tb = tb;
          none.alpha = alpha;
          none.beta = beta;
          none.relu = relu;
          CheckGemm(none, seed += 3);
          for (const Shape& cs : c_shapes) {
            GemmCase c = none;
            c.has_c = true;
            c.c_shape = cs;
            CheckGemm(c, seed += 3);
          }
        }
      }
    }
  }
}

TEST(ReduceMathTest, GemmEdgeShapes) {
  uint32_t seed = 700;
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {1, 7, 3}, {6, 1, 2}, {2, 3, 1}, {17, 9, 33}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        GemmCase c;
        c.m = m;
        c.n = n;
        c.k = k;
        c.ta = ta;
        c.tb = tb;
        c.has_c = true;
        c.c_shape = {n};
        c.alpha = 0.75f;
        CheckGemm(c, seed += 3);
        c.has_c = false;
        CheckGemm(c, seed += 3);
      }
    }
  }
}

// What the CUDA MatMul kernel computes, call by call: `a_shape` and `b_shape` as stored, `ta`
// / `tb` when an operand is read with its last two dims swapped.
std::vector<float> MatMulLikeCuda(Shape a_shape, Shape b_shape, const std::vector<float>& a,
                                  const std::vector<float>& b, int64_t out_count, bool ta = false,
                                  bool tb = false) {
  if (ta) std::swap(a_shape[a_shape.size() - 2], a_shape.back());
  if (tb) std::swap(b_shape[b_shape.size() - 2], b_shape.back());
  const cuda::MatMulPlan p = cuda::MakeMatMulPlan(a_shape, b_shape, ta, tb);
  const MatMulLayout& l = p.layout;
  const CublasGemmShape& s = p.gemm;
  std::vector<float> y(out_count, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(l.outer * l.inner * l.m * l.n, out_count);
  if (out_count == 0) return y;
  if (l.k == 0) return std::vector<float>(out_count, 0.f);
  for (int64_t o = 0; o < l.outer; ++o) {
    int64_t a_at = 0, b_at = 0;
    l.OuterOffsets(o, &a_at, &b_at);
    for (int64_t i = 0; i < p.batch; ++i) {
      ColumnMajorSgemm(s.trans_first, s.trans_second, s.m, s.n, s.k, 1.f,
                       b.data() + b_at + i * l.b_stride, s.ld_first,
                       a.data() + a_at + i * l.a_stride, s.ld_second, 0.f,
                       y.data() + o * l.inner * l.m * l.n + i * l.m * l.n, s.ld_out);
    }
  }
  return y;
}

TEST(ReduceMathTest, MatMulMatchesTheCpu) {
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {{4}, {4}},                       // both 1-D: a scalar
      {{4}, {4, 5}},                    // 1-D A
      {{3, 4}, {4}},                    // 1-D B
      {{3, 4}, {4, 5}},                 // plain
      {{6, 3, 4}, {4, 5}},              // B broadcast: folded into one product
      {{6, 3, 4}, {4}},                 // 1-D B over batches: folded
      {{3, 4}, {6, 4, 5}},              // A broadcast: strided with stride 0
      {{4}, {6, 4, 5}},                 // 1-D A over batches
      {{6, 3, 4}, {6, 4, 5}},           // both batched
      {{2, 1, 3, 4}, {1, 3, 4, 5}},     // outer loop: [2, 1] x [1, 3]
      {{2, 3, 3, 4}, {3, 4, 5}},        // rank 4 with B broadcast over the outer dim
      {{1, 3, 3, 4}, {2, 1, 4, 5}},     // outer loop the other way round
      {{2, 3, 3, 4}, {2, 3, 4, 5}},     // rank 4, both batched
      {{2, 1, 3, 3, 4}, {4, 1, 4, 5}},  // rank 5 mixed
      {{1, 3, 4}, {1, 4, 5}},           // size-1 batch dims only
      {{2, 3, 1, 4}, {2, 1, 4, 5}},     // m = 1: outer loop over [2], inner [3] A-only
      {{5, 1, 3, 4}, {1, 1, 4, 5}},     // size-1 batch dim between
      {{3, 0, 4}, {4, 5}},              // no rows
  };
  uint32_t seed = 900;
  for (const Case& c : cases) {
    SCOPED_TRACE("MatMul " + ShapeText(c.a) + " x " + ShapeText(c.b));
    ModelBuilder mb;
    mb.Input("a", c.a).Input("b", c.b);
    mb.Node("MatMul", {"a", "b"}, {"y"});
    // numpy's rule: 1-D operands count as matrices, and their added dim is dropped again.
    const size_t rank = std::max<size_t>({c.a.size(), c.b.size(), 2});
    OutputOfRank(mb, "y", rank - (c.a.size() == 1) - (c.b.size() == 1));
    const std::vector<float> a = RandomFloats(NumElements(c.a), seed++);
    const std::vector<float> b = RandomFloats(NumElements(c.b), seed++);
    CpuRun run;
    ASSERT_TRUE(RunCpu(mb, {HostTensor::FromFloats(c.a, a), HostTensor::FromFloats(c.b, b)}, &run));
    const std::vector<float> want = MatMulLikeCuda(c.a, c.b, a, b, run.out.num_elements());
    ExpectClose(want, run.out.floats(), "MatMul " + ShapeText(c.a) + " x " + ShapeText(c.b));
  }
}

// Operands stored transposed (Note [Transposed operands] in exec/fusion.h): the CPU runs
// Transpose -> MatMul folded into one MatMul; the CUDA calls read the stored operands.
TEST(ReduceMathTest, MatMulOfTransposedOperandsMatchesTheCpu) {
  struct Case {
    Shape a, b;  // as stored
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{4, 3}, {4, 5}, true, false},              // plain, A transposed
      {{3, 4}, {5, 4}, false, true},              // plain, B transposed
      {{4, 3}, {5, 4}, true, true},               // both
      {{6, 4, 3}, {4, 5}, true, false},           // B broadcast: not folded, A being transposed
      {{6, 3, 4}, {5, 4}, false, true},           // B broadcast and transposed: folded
      {{3, 4}, {6, 5, 4}, false, true},           // A broadcast
      {{2, 3, 4, 3}, {3, 5, 4}, true, true},      // rank 4, B broadcast over the outer dim
      {{2, 1, 4, 3}, {1, 3, 4, 5}, true, false},  // outer loop
      {{3, 0, 4}, {5, 4}, false, true},           // no rows
  };
  uint32_t seed = 950;
  for (const Case& c : cases) {
    SCOPED_TRACE("MatMul " + ShapeText(c.a) + (c.ta ? "^T" : "") + " x " + ShapeText(c.b) +
                 (c.tb ? "^T" : ""));
    ModelBuilder mb;
    MatMulOfStored(mb, c.a, c.b, c.ta, c.tb);
    OutputOfRank(mb, "y", std::max(c.a.size(), c.b.size()));
    const std::vector<float> a = RandomFloats(NumElements(c.a), seed++);
    const std::vector<float> b = RandomFloats(NumElements(c.b), seed++);
    CpuRun run;
    ASSERT_TRUE(RunCpu(mb, {HostTensor::FromFloats(c.a, a), HostTensor::FromFloats(c.b, b)}, &run));
    int transposes = 0;
    for (const Node& n : run.exe->graph().nodes()) transposes += n.op == "Transpose";
    EXPECT_EQ(transposes, 0) << "folded into the MatMul";
    const std::vector<float> want =
        MatMulLikeCuda(c.a, c.b, a, b, run.out.num_elements(), c.ta, c.tb);
    ExpectClose(want, run.out.floats(), "MatMul");
  }
}

TEST(ReduceMathTest, MatMulLayouts) {
  // Plain: one product.
  MatMulLayout l = cuda::MakeMatMulLayout({3, 4}, {4, 5});
  EXPECT_EQ(l.outer, 1);
  EXPECT_EQ(l.inner, 1);
  // B broadcast over A's batches: folded.
  l = cuda::MakeMatMulLayout({2, 6, 3, 4}, {4, 5});
  EXPECT_EQ(l.outer, 1);
  EXPECT_EQ(l.inner, 12);
  EXPECT_EQ(l.a_stride, 12);
  EXPECT_EQ(l.b_stride, 0);
  EXPECT_TRUE(cuda::FoldsInnerBatch(l));
  // A broadcast: strided batches, not folded.
  l = cuda::MakeMatMulLayout({3, 4}, {6, 4, 5});
  EXPECT_EQ(l.inner, 6);
  EXPECT_EQ(l.a_stride, 0);
  EXPECT_EQ(l.b_stride, 20);
  EXPECT_FALSE(cuda::FoldsInnerBatch(l));
  // [2, 1] x [1, 3]: the inner batch is B's dim, the outer loop A's.
  l = cuda::MakeMatMulLayout({2, 1, 3, 4}, {1, 3, 4, 5});
  EXPECT_EQ(l.outer, 2);
  EXPECT_EQ(l.inner, 3);
  EXPECT_EQ(l.a_stride, 0);
  EXPECT_EQ(l.b_stride, 20);
  int64_t a_at = 0, b_at = 0;
  l.OuterOffsets(1, &a_at, &b_at);
  EXPECT_EQ(a_at, 12);
  EXPECT_EQ(b_at, 0);
}

}  // namespace
}  // namespace salus::exec
