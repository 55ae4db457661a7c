// Parity of the CUDA device's cuBLAS and CUB kernels (src/exec/cuda/blas_kernels.cc) with the
// CPU, op by op (cuda_parity.h): Gemm (both transposes, alpha and beta, every C shape, beta 0,
// the Relu inference fuses), MatMul (1-D operands, plain, batched, every pattern of broadcast
// batch dims up to rank 5, an empty output, operands read transposed), and every reduction over
// several axis sets with keepdims both ways, axes as ReduceSum's input, the no-reduction cases,
// scalars, empty tensors, and long runs reduced in chunks after a permutation. Each case also runs
// twice on the GPU in lanes at different addresses and must be bit-identical. Skipped without a
// usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_parity.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::ExpectCudaParity;
using testing::MatMulOfStored;
using testing::ModelBuilder;
using testing::ParityOptions;

// A graph output of `rank` unknown dims: the engine infers the shape.
void OutputOfRank(ModelBuilder& mb, const std::string& name, size_t rank) {
  auto* out = mb.proto().mutable_graph()->add_output();
  out->set_name(name);
  auto* t = out->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = t->mutable_shape();
  for (size_t i = 0; i < rank; ++i) shape->add_dim();
}

// Sums over hundreds of products or elements, in another order than the CPU's.
ParityOptions LongSums() {
  ParityOptions p;
  p.atol = 1e-4;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Gemm.

struct GemmCase {
  int64_t m = 5, n = 7, k = 3;
  bool ta = false, tb = false;
  float alpha = 1.f, beta = 1.f;
  bool has_c = false;
  Shape c_shape;
  bool relu = false;
};

std::string GemmModel(const GemmCase& c) {
  ModelBuilder mb;
  mb.Input("a", c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k});
  mb.Input("b", c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n});
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
  if (c.relu) mb.Node("Relu", {"g"}, {"y"});  // fused into the Gemm: inference
  mb.Output("y", {c.m, c.n});
  return mb.Bytes();
}

std::string Describe(const GemmCase& c) {
  return "Gemm " + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
         " transA=" + std::to_string(c.ta) + " transB=" + std::to_string(c.tb) +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) +
         (c.has_c ? " C " + ShapeString(c.c_shape) : std::string(" no C")) +
         (c.relu ? " + Relu" : "");
}

TEST(CudaBlasKernelsTest, GemmTransposesAlphaBetaAndEveryC) {
  SALUS_REQUIRE_GPU();
  const std::vector<Shape> c_shapes = {{}, {1}, {7}, {1, 7}, {5, 1}, {5, 7}, {1, 1}};
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      GemmCase base;
      base.ta = ta;
      base.tb = tb;
      {
        SCOPED_TRACE(Describe(base));
        ExpectCudaParity(GemmModel(base));
      }
      for (const Shape& cs : c_shapes) {
        for (const auto& [alpha, beta] :
             std::vector<std::pair<float, float>>{{1.f, 1.f}, {0.5f, 2.f}, {-1.5f, 1.f}}) {
          GemmCase c = base;
          c.has_c = true;
          c.c_shape = cs;
          c.alpha = alpha;
          c.beta = beta;
          SCOPED_TRACE(Describe(c));
          ExpectCudaParity(GemmModel(c));
        }
      }
      // beta 0: C is not read.
      GemmCase zero = base;
      zero.has_c = true;
      zero.c_shape = {5, 7};
      zero.beta = 0.f;
      SCOPED_TRACE(Describe(zero));
      ExpectCudaParity(GemmModel(zero));
    }
  }
}

TEST(CudaBlasKernelsTest, GemmFusedRelu) {
  SALUS_REQUIRE_GPU();
  for (const auto& [has_c, c_shape] : std::vector<std::pair<bool, Shape>>{
           {false, {}}, {true, {7}}, {true, {5, 1}}, {true, {5, 7}}}) {
    for (bool tb : {false, true}) {
      GemmCase c;
      c.has_c = has_c;
      c.c_shape = c_shape;
      c.tb = tb;
      c.relu = true;
      c.alpha = 1.25f;
      SCOPED_TRACE(Describe(c));
      ExpectCudaParity(GemmModel(c));
    }
  }
}

TEST(CudaBlasKernelsTest, GemmShapes) {
  SALUS_REQUIRE_GPU();
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {1, 9, 4}, {9, 1, 4}, {33, 17, 65}, {128, 256, 300}}) {
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
        SCOPED_TRACE(Describe(c));
        ExpectCudaParity(GemmModel(c), {}, LongSums());
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// MatMul.

TEST(CudaBlasKernelsTest, MatMul) {
  SALUS_REQUIRE_GPU();
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {{4}, {4}},                       // both 1-D: a scalar
      {{4}, {4, 5}},                    // 1-D A
      {{3, 4}, {4}},                    // 1-D B
      {{3, 4}, {4, 5}},                 // one product
      {{64, 96}, {96, 80}},             // larger
      {{6, 3, 4}, {4, 5}},              // B broadcast: batches folded into rows
      {{6, 3, 4}, {4}},                 // 1-D B over batches
      {{3, 4}, {6, 4, 5}},              // A broadcast: strided batches, A's stride 0
      {{4}, {6, 4, 5}},                 // 1-D A over batches
      {{6, 3, 4}, {6, 4, 5}},           // both batched
      {{2, 1, 3, 4}, {1, 3, 4, 5}},     // [2, 1] x [1, 3]: host loop over the outer batch
      {{2, 3, 3, 4}, {3, 4, 5}},        // rank 4, B broadcast over the outer dim
      {{1, 3, 3, 4}, {2, 1, 4, 5}},     // host loop the other way round
      {{2, 3, 3, 4}, {2, 3, 4, 5}},     // rank 4, both batched
      {{2, 3, 17, 33}, {2, 3, 33, 9}},  // rank 4, odd sizes
      {{2, 1, 3, 3, 4}, {4, 1, 4, 5}},  // rank 5 mixed
      {{1, 3, 4}, {1, 4, 5}},           // size-1 batch dims only
      {{5, 1, 3, 4}, {1, 1, 4, 5}},     // a size-1 batch dim between
      {{3, 0, 4}, {4, 5}},              // no rows
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("MatMul " + ShapeString(c.a) + " x " + ShapeString(c.b));
    ModelBuilder mb;
    mb.Input("a", c.a).Input("b", c.b);
    mb.Node("MatMul", {"a", "b"}, {"y"});
    const size_t rank = std::max<size_t>({c.a.size(), c.b.size(), 2});
    OutputOfRank(mb, "y", rank - (c.a.size() == 1) - (c.b.size() == 1));
    ExpectCudaParity(mb.Bytes(), {}, LongSums());
  }
}

// Operands stored transposed: Transpose -> MatMul folds into one MatMul reading the stored
// tensor (Note [Transposed operands] in exec/fusion.h) on both devices.
TEST(CudaBlasKernelsTest, MatMulOfTransposedOperands) {
  SALUS_REQUIRE_GPU();
  struct Case {
    Shape a, b;  // as stored
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{4, 3}, {4, 5}, true, false},                // one product, A transposed
      {{3, 4}, {5, 4}, false, true},                // B transposed
      {{96, 64}, {80, 96}, true, true},             // both, larger
      {{6, 4, 3}, {4, 5}, true, false},             // B broadcast, A transposed: not folded
      {{6, 3, 4}, {5, 4}, false, true},             // B broadcast and transposed: folded
      {{3, 4}, {6, 5, 4}, false, true},             // A broadcast
      {{2, 3, 33, 17}, {2, 3, 9, 33}, true, true},  // rank 4, odd sizes
      {{2, 1, 4, 3}, {1, 3, 4, 5}, true, false},    // host loop over the outer batch
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("MatMul " + ShapeString(c.a) + (c.ta ? "^T" : "") + " x " + ShapeString(c.b) +
                 (c.tb ? "^T" : ""));
    ModelBuilder mb;
    MatMulOfStored(mb, c.a, c.b, c.ta, c.tb);
    OutputOfRank(mb, "y", std::max(c.a.size(), c.b.size()));
    ExpectCudaParity(mb.Bytes(), {}, LongSums());
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions.

const std::vector<std::string>& ReduceOps() {
  static const std::vector<std::string> ops = {"ReduceMean", "ReduceSum",      "ReduceMax",
                                               "ReduceMin",  "ReduceProd",     "ReduceL1",
                                               "ReduceL2",   "ReduceSumSquare"};
  return ops;
}

struct ReduceCase {
  std::string op;
  Shape shape;
  std::vector<int64_t> axes;
  bool axes_given = true;  // false: no axes (every axis, or none with noop_with_empty_axes)
  int64_t keepdims = 1;
  int opset = 17;  // 13 with ReduceSum: axes as an input
  int64_t noop_with_empty_axes = 0;
};

std::string ReduceModel(const ReduceCase& c) {
  ModelBuilder mb;
  mb.proto().mutable_opset_import(0)->set_version(c.opset);
  mb.Input("x", c.shape);
  const bool axes_input = c.op == "ReduceSum" && c.opset >= 13;
  std::vector<std::string> inputs = {"x"};
  if (axes_input && c.axes_given) {
    mb.Int64Initializer("axes", {static_cast<int64_t>(c.axes.size())}, c.axes);
    inputs.push_back("axes");
  }
  auto& node = mb.Node(c.op, inputs, {"y"});
  if (!axes_input && c.axes_given) ModelBuilder::Attr(node, "axes", c.axes);
  ModelBuilder::Attr(node, "keepdims", c.keepdims);
  if (c.noop_with_empty_axes) ModelBuilder::Attr(node, "noop_with_empty_axes", int64_t{1});
  size_t out_rank = c.shape.size();
  if (c.keepdims == 0) {
    std::vector<bool> reduced(c.shape.size(), !c.axes_given && !c.noop_with_empty_axes);
    for (int64_t a : c.axes) reduced[a < 0 ? a + static_cast<int64_t>(c.shape.size()) : a] = true;
    out_rank = std::count(reduced.begin(), reduced.end(), false);
  }
  OutputOfRank(mb, "y", out_rank);
  return mb.Bytes();
}

std::string Describe(const ReduceCase& c) {
  std::string axes = "{";
  for (size_t i = 0; i < c.axes.size(); ++i) axes += (i ? "," : "") + std::to_string(c.axes[i]);
  axes += "}";
  return c.op + " of " + ShapeString(c.shape) + " over " +
         (c.axes_given ? axes : std::string("(no axes)")) +
         " keepdims=" + std::to_string(c.keepdims) + " opset " + std::to_string(c.opset) +
         (c.noop_with_empty_axes ? " noop_with_empty_axes" : "");
}

void CheckReduce(const ReduceCase& c, ParityOptions p = {}) {
  SCOPED_TRACE(Describe(c));
  // Products of many values in [-1, 1) vanish; keep them near 1.
  if (c.op == "ReduceProd") p.lo = 0.5f, p.hi = 1.5f;
  ExpectCudaParity(ReduceModel(c), {}, p);
}

TEST(CudaBlasKernelsTest, ReductionsOverAxisSets) {
  SALUS_REQUIRE_GPU();
  const std::vector<std::vector<int64_t>> axis_sets = {
      {0}, {1}, {3}, {-1}, {1, 2}, {0, 2}, {0, 3}, {1, 3}, {0, 1, 2}, {0, 1, 2, 3}, {2, -1}};
  for (const std::string& op : ReduceOps()) {
    for (const std::vector<int64_t>& axes : axis_sets) {
      for (int64_t keepdims : {0, 1}) {
        ReduceCase c;
        c.op = op;
        c.shape = {2, 3, 4, 5};
        c.axes = axes;
        c.keepdims = keepdims;
        CheckReduce(c);
      }
    }
    // No axes: all of them; and a shape with size-1 dims between reduced ones.
    for (int64_t keepdims : {0, 1}) {
      ReduceCase all;
      all.op = op;
      all.shape = {3, 1, 4, 1, 2};
      all.axes_given = false;
      all.keepdims = keepdims;
      CheckReduce(all);
      ReduceCase some = all;
      some.axes_given = true;
      some.axes = {0, 1, 4};
      CheckReduce(some);
    }
  }
}

// ReduceSum from opset 13 takes its axes as an input; noop_with_empty_axes.
TEST(CudaBlasKernelsTest, ReduceSumAxesInput) {
  SALUS_REQUIRE_GPU();
  for (const std::vector<int64_t>& axes :
       std::vector<std::vector<int64_t>>{{0}, {2}, {-1}, {0, 2}, {1, 2, 3}}) {
    for (int64_t keepdims : {0, 1}) {
      ReduceCase c;
      c.op = "ReduceSum";
      c.opset = 13;
      c.shape = {2, 3, 4, 5};
      c.axes = axes;
      c.keepdims = keepdims;
      CheckReduce(c);
    }
  }
  ReduceCase noop;
  noop.op = "ReduceSum";
  noop.opset = 13;
  noop.shape = {2, 3, 4};
  noop.axes_given = false;
  noop.noop_with_empty_axes = 1;
  CheckReduce(noop);
  noop.noop_with_empty_axes = 0;
  CheckReduce(noop);
}

// Reduced dims of size 1 only, and scalars: a copy, absolute value or square.
TEST(CudaBlasKernelsTest, ReductionsOfNothing) {
  SALUS_REQUIRE_GPU();
  for (const std::string& op : ReduceOps()) {
    ReduceCase ones;
    ones.op = op;
    ones.shape = {3, 1, 4, 1};
    ones.axes = {1, 3};
    CheckReduce(ones);
    ones.keepdims = 0;
    CheckReduce(ones);
    ReduceCase scalar;
    scalar.op = op;
    scalar.shape = {};
    scalar.axes_given = false;
    CheckReduce(scalar);
  }
}

// Long runs, cut into chunks and reduced in two passes, with and without a permutation; many
// short runs; empty tensors.
TEST(CudaBlasKernelsTest, ReductionsLongRunsAndEmptyTensors) {
  SALUS_REQUIRE_GPU();
  struct Long {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const std::vector<Long> cases = {
      {{3, 10000}, {1}},      // 3 runs of 3 chunks
      {{10000, 3}, {0}},      // permuted, then chunked
      {{2, 5000, 2}, {1}},    // permuted, kept dims on both sides
      {{1, 100000}, {0, 1}},  // one run of 25 chunks
      {{1100, 700}, {1}},     // many runs: one block each
      {{700, 1100}, {0}},     // many runs after a permutation
      {{0, 3}, {1}},          // no output
      {{3, 0}, {1}},          // empty runs: each op's identity
      {{2, 0, 3}, {0, 2}},    // no output
  };
  for (const Long& l : cases) {
    for (const std::string& op : ReduceOps()) {
      ReduceCase c;
      c.op = op;
      c.shape = l.shape;
      c.axes = l.axes;
      ParityOptions p = LongSums();
      SCOPED_TRACE(Describe(c));
      if (op == "ReduceProd") {
        p.lo = 0.9995f;
        p.hi = 1.0005f;
        ExpectCudaParity(ReduceModel(c), {}, p);
      } else {
        CheckReduce(c, p);
      }
    }
  }
}

}  // namespace
}  // namespace salus::exec
