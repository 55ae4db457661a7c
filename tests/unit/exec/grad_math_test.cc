// The per-element math of the CUDA device's hand-written backward kernels (grad_math.h, and
// pool_math.h's PoolTap and PoolGradAt), run on the host over whole tensors against the CPU
// executable's gradients: the GPU runs the same functions, so this is how their logic is
// checked on a machine without one. Each case is one op y = f(X) with X a trainable
// parameter and loss sum(R * y); one SGD step at learning rate 1 leaves X - dX, and dX must
// equal the host's computation from X and dL/dy = R.
#include "exec/grad_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "exec/cuda/pool_math.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

struct Grad {
  std::vector<float> x, r, dx;  // the parameter, dL/dy, and the engine's gradient
};

// Trains `build` (nodes computing "y" from the parameter "X" of shape xs) one step on the CPU.
Grad CpuGradient(const Shape& xs, const Shape& ys, uint32_t seed,
                 const std::function<void(ModelBuilder&)>& build,
                 std::vector<std::pair<std::string, HostTensor>> inputs = {}, float lo = -1.f,
                 float hi = 1.f) {
  Grad g;
  g.x = RandomFloats(NumElements(xs), seed, lo, hi);
  g.r = RandomFloats(NumElements(ys), seed + 1000);
  ModelBuilder mb;
  mb.Initializer("X", xs, g.x);
  for (const auto& [name, t] : inputs) {
    mb.Input(name, t.shape,
             t.type == DataType::kInt64 ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT);
  }
  mb.Input("R", ys);
  build(mb);
  mb.Node("Mul", {"y", "R"}, {"t"});
  auto& sum = mb.Node("ReduceSum", {"t"}, {"loss"});
  ModelBuilder::Attr(sum, "keepdims", int64_t{0});
  mb.Output("loss", {});
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer.learning_rate = 1.f;
  auto exe = Executable::Compile(mb.Bytes(), o);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return g;
  inputs.emplace_back("R", HostTensor::FromFloats(ys, g.r));
  std::vector<HostTensor> feeds;
  for (const TensorInfo& info : (*exe)->inputs()) {
    for (const auto& [name, t] : inputs) {
      if (name == info.name) feeds.push_back(t);
    }
  }
  Memory mem(**exe);
  EXPECT_TRUE(RunHost(**exe, mem, feeds).ok());
  auto after = (*exe)->ReadPersistent(mem.p(), "X");
  EXPECT_TRUE(after.ok());
  if (!after.ok()) return g;
  g.dx.resize(g.x.size());
  for (size_t i = 0; i < g.x.size(); ++i) g.dx[i] = g.x[i] - after->floats()[i];
  return g;
}

void ExpectNear(const std::vector<float>& want, const std::vector<float>& got,
                const std::string& what, double rtol = 1e-4, double atol = 1e-5) {
  ASSERT_EQ(want.size(), got.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::abs(want[i] - got[i]) <= atol + rtol * std::abs(want[i])) continue;
    if (++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: cpu " << want[i] << ", host " << got[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(GradMathTest, EltwiseGradientsMatchTheCpu) {
  struct Op {
    const char* name;
    float lo, hi, alpha;
  };
  for (const Op& op :
       {Op{"Relu", -1, 1, 0}, Op{"LeakyRelu", -1, 1, 0.1f}, Op{"Sigmoid", -3, 3, 0},
        Op{"Tanh", -3, 3, 0}, Op{"Exp", -2, 2, 0}, Op{"Log", 0.5f, 2, 0}, Op{"Sqrt", 0.5f, 2, 0},
        Op{"Abs", -1, 1, 0}, Op{"Elu", -2, 2, 0.7f}, Op{"Softplus", -3, 3, 0}}) {
    SCOPED_TRACE(op.name);
    const Shape s = {4, 25};
    const std::string name = op.name;
    const float alpha = op.alpha;
    Grad g = CpuGradient(
        s, s, 11,
        [&](ModelBuilder& mb) {
          auto& n = mb.Node(name, {"X"}, {"y"});
          if (name == "LeakyRelu" || name == "Elu") ModelBuilder::Attr(n, "alpha", alpha);
        },
        {}, op.lo, op.hi);
    EltwiseGradOp gop;
    float a = 0;
    ASSERT_TRUE(EltwiseGradOpFor(name, alpha, alpha, &gop, &a));
    std::vector<float> host(g.x.size());
    for (size_t i = 0; i < host.size(); ++i) host[i] = ApplyEltwiseGrad(gop, a, g.x[i], g.r[i]);
    ExpectNear(g.dx, host, name);
  }
  EltwiseGradOp gop;
  float a;
  EXPECT_FALSE(EltwiseGradOpFor("Gemm", 0, 0, &gop, &a));
}

// Add's gradient of its broadcast operand is SalusSumTo: with A the parameter of full shape and
// X the broadcast one, dX is R summed to X's shape.
TEST(GradMathTest, SumToMatchesTheCpu) {
  const std::vector<std::pair<Shape, Shape>> cases = {{{3, 4}, {4}},
                                                      {{3, 4}, {3, 1}},
                                                      {{2, 3, 4, 5}, {3, 1, 5}},
                                                      {{2, 3, 4, 5}, {1}},
                                                      {{2, 3, 4, 5}, {2, 1, 4, 1}},
                                                      {{6, 1, 7}, {1, 7}},
                                                      {{4096, 8}, {8}},
                                                      {{5, 6}, {5, 6}}};
  uint32_t seed = 20;
  for (const auto& [full, small] : cases) {
    SCOPED_TRACE(ShapeString(full) + " to " + ShapeString(small));
    Grad g = CpuGradient(small, full, seed++,
                         [&](ModelBuilder& mb) {
                           mb.Node("Add", {"A", "X"}, {"y"});
                         },
                         {{"A", HostTensor::FromFloats(full, RandomFloats(NumElements(full), 5))}});
    SumToMap map;
    ASSERT_TRUE(MakeSumToMap(full, small, &map));
    ASSERT_EQ(IndexMapCount(map.out), NumElements(small));
    std::vector<float> host(g.x.size());
    for (size_t o = 0; o < host.size(); ++o) host[o] = SumToAt(map, 1.f, g.r.data(), o);
    ExpectNear(g.dx, host, "sum", 1e-4, 1e-4);
  }
}

// The GPU's long sums walk a map's rows with NextRow: each row starts where MapIndex puts the
// row's first element.
TEST(GradMathTest, NextRowVisitsTheRowsMapIndexLocates) {
  const std::vector<std::pair<Shape, Shape>> cases = {{{256, 16, 32, 32}, {16, 1, 1}},
                                                      {{2, 3, 4, 5}, {3, 1, 5}},
                                                      {{2, 3, 4, 5}, {1}},
                                                      {{3, 2, 5, 7, 2}, {2, 1, 1, 1}},
                                                      {{7}, {1}}};
  for (const auto& [full, small] : cases) {
    SCOPED_TRACE(ShapeString(full) + " to " + ShapeString(small));
    SumToMap map;
    ASSERT_TRUE(MakeSumToMap(full, small, &map));
    const IndexMap& red = map.reduced;
    ASSERT_GE(red.rank, 1);
    const int64_t inner = red.dims[red.rank - 1];
    int64_t at[kMaxIndexDims] = {};
    int64_t row = 0;
    for (int64_t q = 0; q < IndexMapCount(red) / inner; ++q) {
      int64_t off[kMaxIndexOperands];
      MapIndex(red, q * inner, off);
      ASSERT_EQ(row, off[0]) << "row " << q;
      NextRow(red, at, &row);
    }
    EXPECT_EQ(row, 0) << "the walk returns to the first row after the last";
  }
}

// A walk may start at any row: RowAt gives the state NextRow reaches by then.
TEST(GradMathTest, RowAtIsWhereNextRowArrives) {
  SumToMap map;
  ASSERT_TRUE(MakeSumToMap({3, 2, 5, 7, 2}, {2, 1, 1, 1}, &map));
  const IndexMap& red = map.reduced;
  const int64_t rows = IndexMapCount(red) / red.dims[red.rank - 1];
  int64_t at[kMaxIndexDims] = {};
  int64_t row = 0;
  for (int64_t q = 0; q < rows; ++q) {
    int64_t at_q[kMaxIndexDims];
    int64_t row_q = -1;
    RowAt(red, q, at_q, &row_q);
    ASSERT_EQ(row_q, row) << "row " << q;
    for (int d = 0; d < red.rank - 1; ++d) ASSERT_EQ(at_q[d], at[d]) << "row " << q << " dim " << d;
    NextRow(red, at, &row);
  }
}

// Note [Split sums]: the GPU's cut of long sums into parts. Each case is cut as expected, and
// the parts, walked as the GPU's blocks walk them, visit every input element exactly once and
// add up to SumToAt's sums.
TEST(GradMathTest, SplitSumsCoverEveryElementOnce) {
  struct Case {
    Shape in, out;
    bool by_rows;
    int64_t row_parts, col_parts;
  };
  const int64_t threads = 256;  // the GPU's block
  const std::vector<Case> cases = {
      {{256, 16, 32, 32}, {16, 1, 1}, true, 64, 1},  // a convolution's bias gradient
      {{8, 3, 18, 18}, {3, 1, 1}, true, 2, 1},       // rows of 324 elements
      {{4096, 8}, {8}, true, 1, 4},                  // one row, cut into column ranges
      {{512, 3, 16}, {3, 1}, false, 8, 1},           // short rows: ranges of elements
      {{64, 1000}, {1}, true, 1, 62},                // every element into one output
      {{6, 5}, {5}, false, 1, 1},                    // too short to cut
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ShapeString(c.in) + " to " + ShapeString(c.out));
    SumToMap map;
    ASSERT_TRUE(MakeSumToMap(c.in, c.out, &map));
    const SumSplit split = PlanSumSplit(map, threads);
    EXPECT_EQ(split.by_rows, c.by_rows);
    EXPECT_EQ(split.row_parts, c.row_parts);
    EXPECT_EQ(split.col_parts, c.col_parts);
    const std::vector<float> x = RandomFloats(NumElements(c.in), 7);
    std::vector<int> visits(x.size(), 0);
    const IndexMap& red = map.reduced;
    const int64_t reduced = IndexMapCount(red);
    const int64_t inner = red.dims[red.rank - 1];
    const int64_t step = red.strides[0][red.rank - 1];
    for (int64_t o = 0; o < IndexMapCount(map.out); ++o) {
      int64_t base[kMaxIndexOperands], off[kMaxIndexOperands];
      MapIndex(map.out, o, base);
      double sum = 0;
      for (int64_t p = 0; p < split.row_parts * split.col_parts; ++p) {
        auto add = [&](int64_t at) {
          ++visits[at];
          sum += x[at];
        };
        if (split.by_rows) {
          int64_t r0, r1, c0, c1, at[kMaxIndexDims], row;
          PartRange(reduced / inner, split.row_parts, p / split.col_parts, &r0, &r1);
          PartRange(inner, split.col_parts, p % split.col_parts, &c0, &c1);
          RowAt(red, r0, at, &row);
          for (int64_t q = r0; q < r1; ++q, NextRow(red, at, &row)) {
            for (int64_t i = c0; i < c1; ++i) add(base[0] + row + i * step);
          }
        } else {
          int64_t e0, e1;
          PartRange(reduced, split.row_parts, p, &e0, &e1);
          for (int64_t e = e0; e < e1; ++e) {
            MapIndex(red, e, off);
            add(base[0] + off[0]);
          }
        }
      }
      EXPECT_NEAR(static_cast<float>(sum), SumToAt(map, 1.f, x.data(), o), 1e-4) << "output " << o;
    }
    EXPECT_TRUE(std::all_of(visits.begin(), visits.end(), [](int v) { return v == 1; }));
  }
}

cuda::PoolGeometry Geometry(cuda::PoolMode mode, const Shape& x, const Shape& y,
                            std::vector<int64_t> kernel, std::vector<int64_t> stride,
                            std::vector<int64_t> pad) {
  const std::vector<int64_t> in(x.begin() + 2, x.end()), out(y.begin() + 2, y.end());
  return cuda::MakePoolGeometry(mode, x[0] * x[1], in, out, kernel, stride,
                                std::vector<int64_t>(in.size(), 1), pad);
}

TEST(GradMathTest, PoolingGradientsMatchTheCpu) {
  struct Case {
    std::string op;
    Shape x, y;
    std::vector<int64_t> kernel, stride, pads;  // pads: ONNX's begins then ends
    bool include_pad = false;
  };
  const std::vector<Case> cases = {
      {"MaxPool", {2, 3, 4, 4}, {2, 3, 2, 2}, {2, 2}, {2, 2}, {0, 0, 0, 0}},
      {"MaxPool", {1, 2, 7, 7}, {1, 2, 3, 3}, {3, 3}, {2, 2}, {0, 0, 0, 0}},
      {"MaxPool", {1, 2, 5, 5}, {1, 2, 3, 3}, {3, 3}, {2, 2}, {1, 1, 1, 1}},
      {"AveragePool", {1, 2, 4, 4}, {1, 2, 4, 4}, {3, 3}, {1, 1}, {1, 1, 1, 1}},
      {"AveragePool", {1, 2, 5, 5}, {1, 2, 2, 2}, {3, 3}, {2, 2}, {0, 0, 1, 1}, true},
  };
  uint32_t seed = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + " " + ShapeString(c.x));
    Grad g = CpuGradient(c.x, c.y, seed++, [&](ModelBuilder& mb) {
      auto& n = mb.Node(c.op, {"X"}, {"y"});
      ModelBuilder::Attr(n, "kernel_shape", c.kernel);
      ModelBuilder::Attr(n, "strides", c.stride);
      ModelBuilder::Attr(n, "pads", c.pads);
      if (c.include_pad) ModelBuilder::Attr(n, "count_include_pad", int64_t{1});
    });
    const cuda::PoolMode mode = c.op == "MaxPool" ? cuda::PoolMode::kMax
                                : c.include_pad   ? cuda::PoolMode::kAverageIncludePad
                                                  : cuda::PoolMode::kAverageExcludePad;
    const std::vector<int64_t> begin(c.pads.begin(), c.pads.begin() + c.kernel.size());
    const cuda::PoolGeometry geo = Geometry(mode, c.x, c.y, c.kernel, c.stride, begin);
    std::vector<int64_t> tap(cuda::PoolOutputCount(geo));
    ASSERT_EQ(static_cast<int64_t>(tap.size()), NumElements(c.y));
    for (size_t o = 0; o < tap.size(); ++o) tap[o] = cuda::PoolTap(geo, g.x.data(), o);
    std::vector<float> host(g.x.size());
    for (size_t i = 0; i < host.size(); ++i) {
      host[i] = cuda::PoolGradAt(geo, g.r.data(), tap.data(), i);
    }
    ExpectNear(g.dx, host, c.op);
  }
  // Global pooling: one window of the whole plane.
  Grad g = CpuGradient({2, 3, 3, 2}, {2, 3, 1, 1}, 60,
                       [](ModelBuilder& mb) { mb.Node("GlobalAveragePool", {"X"}, {"y"}); });
  const cuda::PoolGeometry geo = Geometry(cuda::PoolMode::kAverageExcludePad, {2, 3, 3, 2},
                                          {2, 3, 1, 1}, {3, 2}, {1, 1}, {0, 0});
  std::vector<int64_t> tap(6);
  for (size_t o = 0; o < tap.size(); ++o) tap[o] = cuda::PoolTap(geo, g.x.data(), o);
  std::vector<float> host(g.x.size());
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = cuda::PoolGradAt(geo, g.r.data(), tap.data(), i);
  ExpectNear(g.dx, host, "GlobalAveragePool");
}

TEST(GradMathTest, SoftmaxCrossEntropyGradientMatchesTheCpu) {
  struct Case {
    std::string reduction;
    Shape x;
    std::vector<int64_t> labels;
    bool weighted, ignore;
  };
  const std::vector<Case> cases = {
      {"mean", {4, 5}, {1, 0, 4, 2}, false, false},
      {"sum", {4, 5, 2}, {1, 0, 4, 2, 2, 3, 0, 1}, true, true},
      {"mean", {4, 5, 2}, {1, 0, 4, 2, 2, 3, 0, 1}, true, true},
      {"none", {3, 4}, {3, 0, 1}, false, false},
  };
  uint32_t seed = 70;
  const std::vector<float> weights = {0.5f, 1.f, 2.f, 1.5f, 0.2f};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reduction + " " + ShapeString(c.x));
    Shape ls = {c.x[0]};
    if (c.x.size() > 2) ls.push_back(c.x[2]);
    Shape ys = c.reduction == "none" ? ls : Shape{};
    std::vector<std::pair<std::string, HostTensor>> inputs = {
        {"L", HostTensor::FromInt64s(ls, c.labels)}};
    if (c.weighted) inputs.push_back({"Wt", HostTensor::FromFloats({5}, weights)});
    Grad g = CpuGradient(
        c.x, ys, seed++,
        [&](ModelBuilder& mb) {
          std::vector<std::string> in = {"X", "L"};
          if (c.weighted) in.push_back("Wt");
          auto& n = mb.Node("SoftmaxCrossEntropyLoss", in, {"y"});
          ModelBuilder::Attr(n, "reduction", c.reduction);
          if (c.ignore) ModelBuilder::Attr(n, "ignore_index", int64_t{2});
        },
        inputs);
    SceSpec s;
    s.n = c.x[0];
    s.c = c.x[1];
    s.d = c.x.size() > 2 ? c.x[2] : 1;
    s.has_ignore = c.ignore;
    s.ignore_index = 2;
    s.reduction = c.reduction == "mean" ? 0 : c.reduction == "sum" ? 1 : 2;
    const float* w = c.weighted ? weights.data() : nullptr;
    std::vector<float> logp(g.x.size());
    double wsum = 0;
    for (int64_t r = 0; r < s.n * s.d; ++r) {
      SceRow(s, g.x.data(), c.labels.data(), w, logp.data(), r);
      if (SceLabelCounts(s, c.labels[r])) wsum += w != nullptr ? w[c.labels[r]] : 1.0;
    }
    std::vector<float> host(g.x.size());
    for (size_t idx = 0; idx < host.size(); ++idx) {
      const int64_t row = idx / (s.c * s.d) * s.d + idx % s.d;
      const float coef = SceGradCoef(s, c.labels.data(), w, g.r.data(), wsum, row);
      host[idx] = SceGradAt(s, logp.data(), c.labels.data(), coef, idx);
    }
    ExpectNear(g.dx, host, "sce");
  }
}

}  // namespace
}  // namespace salus::exec
