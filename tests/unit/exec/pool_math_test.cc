// The index math of the CUDA device's hand-written window kernels (src/exec/cuda/pool_math.h),
// run on the host over whole tensors, against the CPU executable: the GPU runs the same
// functions, so this is how their logic is checked on a machine without one.
//
//   - Pooling: PoolAt (and, for max pooling, PoolAtTap of PoolTap, as SalusMaxPool computes it)
//     over a geometry built as the CUDA pooling kernel builds it (window.h's
//     ComputeWindow of the node), against the CPU's MaxPool/AveragePool for asymmetric pads,
//     SAME_UPPER/SAME_LOWER, ceil_mode, dilations, count_include_pad both ways, NaNs and windows
//     wholly in the padding. The CPU pools 2-D only, so 1-D windows are checked against the CPU
//     pooling the same data as [N, C, L, 1], and 3-D ones against a rank-generic reference that
//     the 2-D and 1-D cases check against the CPU first.
//   - Padding: a Conv with unequal pads equals a Conv without pads of the input PadSource pads;
//     a ConvTranspose with pads, output_padding or output_shape equals the unpadded
//     ConvTranspose cropped (and extended with zeros) by PadSource, plus the bias: the CUDA
//     kernels' decompositions (Note [cuDNN windows] in cudnn_kernels.cc), computed by the CPU.
#include "exec/cuda/pool_math.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "exec/window.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using cuda::MakePadGeometry;
using cuda::MakePoolGeometry;
using cuda::PadGeometry;
using cuda::PadOutputCount;
using cuda::PadSource;
using cuda::PoolAt;
using cuda::PoolGeometry;
using cuda::PoolMode;
using cuda::PoolOutputCount;
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

// The engine's view of an ONNX node's attributes, for window.h.
Node ToNode(const onnx::NodeProto& p) {
  Node n;
  n.op = p.op_type();
  n.name = p.name();
  for (const onnx::AttributeProto& a : p.attribute()) {
    Attribute attr;
    switch (a.type()) {
      case onnx::AttributeProto::INT:
        attr.kind = Attribute::Kind::kInt;
        attr.i = a.i();
        break;
      case onnx::AttributeProto::STRING:
        attr.kind = Attribute::Kind::kString;
        attr.s = a.s();
        break;
      case onnx::AttributeProto::INTS:
        attr.kind = Attribute::Kind::kInts;
        attr.ints.assign(a.ints().begin(), a.ints().end());
        break;
      default:
        ADD_FAILURE() << "attribute " << a.name() << " of an unexpected type";
    }
    n.attrs[a.name()] = attr;
  }
  return n;
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

HostTensor RandomTensor(const Shape& shape, uint32_t seed) {
  return HostTensor::FromFloats(shape, RandomFloats(NumElements(shape), seed));
}

std::vector<float> Floats(const HostTensor& t) {
  return std::vector<float>(t.floats(), t.floats() + t.num_elements());
}

// Element by element: bit-identical (NaN matching NaN) when tol is 0, else within
// tol * (1 + |want|).
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

// ---------------------------------------------------------------------------------------------
// Pooling.

struct PoolCase {
  const char* scenario;
  std::string op;  // MaxPool or AveragePool
  Shape x;         // [N, C, spatial...]
  std::vector<int64_t> kernel;
  std::vector<int64_t> strides = {};
  std::vector<int64_t> pads = {};  // begins, then ends
  std::vector<int64_t> dilations = {};
  std::string auto_pad = "";
  int64_t ceil_mode = 0;
  int64_t count_include_pad = 0;
};

void SetPoolAttrs(onnx::NodeProto& n, const PoolCase& c) {
  ModelBuilder::Attr(n, "kernel_shape", c.kernel);
  if (!c.strides.empty()) ModelBuilder::Attr(n, "strides", c.strides);
  if (!c.pads.empty()) ModelBuilder::Attr(n, "pads", c.pads);
  if (!c.dilations.empty()) ModelBuilder::Attr(n, "dilations", c.dilations);
  if (!c.auto_pad.empty()) ModelBuilder::Attr(n, "auto_pad", c.auto_pad);
  if (c.ceil_mode != 0) ModelBuilder::Attr(n, "ceil_mode", c.ceil_mode);
  if (c.count_include_pad != 0) ModelBuilder::Attr(n, "count_include_pad", c.count_include_pad);
}

std::string PoolModel(const PoolCase& c, Node* node) {
  ModelBuilder mb;
  mb.Input("x", c.x);
  onnx::NodeProto& n = mb.Node(c.op, {"x"}, {"y"});
  SetPoolAttrs(n, c);
  OutputOfRank(mb, "y", c.x.size());
  if (node != nullptr) *node = ToNode(n);
  return mb.Bytes();
}

// The same pooling of a 1-D case's data viewed as [N, C, L, 1].
PoolCase AsTwoD(const PoolCase& c) {
  PoolCase d = c;
  d.x.push_back(1);
  d.kernel = {c.kernel[0], 1};
  if (!c.strides.empty()) d.strides = {c.strides[0], 1};
  if (!c.dilations.empty()) d.dilations = {c.dilations[0], 1};
  if (!c.pads.empty()) d.pads = {c.pads[0], 0, c.pads[1], 0};
  return d;
}

PoolMode ModeOf(const Node& n) {
  if (n.op == "MaxPool" || n.op == "GlobalMaxPool") return PoolMode::kMax;
  return n.GetInt("count_include_pad", 0) != 0 ? PoolMode::kAverageIncludePad
                                               : PoolMode::kAverageExcludePad;
}

// The window of node `n` over x, as the CUDA pooling kernel resolves it.
Window PoolWindow(const Node& n, const Shape& xs) {
  const std::vector<int64_t> spatial(xs.begin() + 2, xs.end());
  if (n.op == "GlobalAveragePool" || n.op == "GlobalMaxPool") {
    Window w;
    w.in = spatial;
    w.kernel = spatial;
    w.out.assign(spatial.size(), 1);
    w.strides.assign(spatial.size(), 1);
    w.dilations.assign(spatial.size(), 1);
    w.pad_begin.assign(spatial.size(), 0);
    w.pad_end.assign(spatial.size(), 0);
    return w;
  }
  auto w = ComputeWindow(n, spatial, n.GetInts("kernel_shape"), n.GetInt("ceil_mode", 0) != 0);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : Window{};
}

PoolGeometry GeometryOf(const Node& n, const Shape& xs, const Window& w) {
  return MakePoolGeometry(ModeOf(n), xs[0] * xs[1], w.in, w.out, w.kernel, w.strides, w.dilations,
                          w.pad_begin);
}

// PoolAt over every output element, as the pooling kernel runs it.
std::vector<float> HostPool(const PoolGeometry& g, const std::vector<float>& x) {
  std::vector<float> y(PoolOutputCount(g));
  for (int64_t o = 0; o < static_cast<int64_t>(y.size()); ++o) y[o] = PoolAt(g, x.data(), o);
  return y;
}

// An independent pooling with the same semantics (pool_math.h's file comment), rank-generic:
// odometers over the output positions and the taps instead of PoolAt's fixed 3-D loops.
std::vector<float> ReferencePool(const std::vector<float>& x, const Shape& xs, const Window& w,
                                 PoolMode mode) {
  const size_t rank = w.rank();
  const int64_t planes = xs[0] * xs[1];
  int64_t plane_in = 1, plane_out = 1, taps = 1;
  for (size_t d = 0; d < rank; ++d) {
    plane_in *= w.in[d];
    plane_out *= w.out[d];
    taps *= w.kernel[d];
  }
  std::vector<float> y;
  for (int64_t p = 0; p < planes; ++p) {
    std::vector<int64_t> o(rank, 0);
    for (int64_t oi = 0; oi < plane_out; ++oi) {
      float best = -FLT_MAX, sum = 0;
      int64_t inside = 0;
      std::vector<int64_t> k(rank, 0);
      for (int64_t t = 0; t < taps; ++t) {
        int64_t offset = 0;
        bool in_input = true;
        for (size_t d = 0; d < rank; ++d) {
          const int64_t i = o[d] * w.strides[d] - w.pad_begin[d] + k[d] * w.dilations[d];
          in_input = in_input && i >= 0 && i < w.in[d];
          offset = offset * w.in[d] + i;
        }
        if (in_input) {
          const float v = x[p * plane_in + offset];
          if (v > best) best = v;
          sum += v;
          ++inside;
        }
        for (size_t d = rank; d-- > 0;) {  // next tap, last dim fastest
          if (++k[d] < w.kernel[d]) break;
          k[d] = 0;
        }
      }
      if (mode == PoolMode::kMax) {
        y.push_back(best);
      } else {
        y.push_back(sum / static_cast<float>(mode == PoolMode::kAverageIncludePad ? taps : inside));
      }
      for (size_t d = rank; d-- > 0;) {  // next output position
        if (++o[d] < w.out[d]) break;
        o[d] = 0;
      }
    }
  }
  return y;
}

// Max pooling picks an element, so it must be bit-identical; averages may divide differently.
double TolOf(PoolMode mode) { return mode == PoolMode::kMax ? 0 : 1e-6; }

// Checks PoolAt against the CPU (directly for 2-D windows, through AsTwoD for 1-D ones) and the
// reference against both; 3-D windows against the reference, and against the CPU too if it
// pools them.
void CheckPoolCase(const PoolCase& c, const std::vector<float>* fixed_input = nullptr) {
  SCOPED_TRACE(c.scenario);
  const size_t rank = c.x.size() - 2;
  Node node;
  const std::string model = PoolModel(c, &node);
  const Window w = PoolWindow(node, c.x);
  const PoolGeometry g = GeometryOf(node, c.x, w);
  const HostTensor x =
      fixed_input != nullptr ? HostTensor::FromFloats(c.x, *fixed_input) : RandomTensor(c.x, 17);
  const std::vector<float> host = HostPool(g, Floats(x));
  const std::vector<float> ref = ReferencePool(Floats(x), c.x, w, g.mode);
  ExpectSame(ref, host, 0, "PoolAt against the reference");
  if (g.mode == PoolMode::kMax) {
    // SalusMaxPool's output from its taps is PoolAt's, to the bit.
    const std::vector<float> xf = Floats(x);
    std::vector<float> from_taps(host.size());
    for (int64_t o = 0; o < static_cast<int64_t>(from_taps.size()); ++o) {
      from_taps[o] = cuda::PoolAtTap(g, xf.data(), cuda::PoolTap(g, xf.data(), o), o);
    }
    ExpectSame(host, from_taps, 0, "PoolAtTap of PoolTap against PoolAt");
  }

  CpuResult cpu;
  if (rank == 1) {
    const PoolCase d = AsTwoD(c);
    HostTensor x2 = x;
    x2.shape = d.x;
    cpu = RunCpu(PoolModel(d, nullptr), {x2});
  } else {
    cpu = RunCpu(model, {x});
  }
  if (rank == 3 && !cpu.status.ok()) {
    // The CPU refuses 3-D pooling; the reference stands in for it.
    EXPECT_EQ(cpu.status.code(), StatusCode::kUnimplemented) << cpu.status;
    return;
  }
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ASSERT_EQ(cpu.outputs.size(), 1u);
  Shape want_shape = {c.x[0], c.x[1]};
  want_shape.insert(want_shape.end(), w.out.begin(), w.out.end());
  if (rank == 1) want_shape.push_back(1);
  EXPECT_EQ(cpu.outputs[0].shape, want_shape);
  ExpectSame(Floats(cpu.outputs[0]), host, TolOf(g.mode), "PoolAt against the CPU");
  ExpectSame(Floats(cpu.outputs[0]), ref, TolOf(g.mode), "reference against the CPU");
}

// clang-format off
const PoolCase kPool2d[] = {
    {.scenario = "max, no padding", .op = "MaxPool", .x = {2, 3, 7, 6}, .kernel = {3, 3}},
    {.scenario = "max, equal pads, stride 2", .op = "MaxPool", .x = {2, 3, 7, 7}, .kernel = {3, 3},
     .strides = {2, 2}, .pads = {1, 1, 1, 1}},
    {.scenario = "max, asymmetric pads", .op = "MaxPool", .x = {2, 3, 7, 8}, .kernel = {3, 3},
     .strides = {2, 2}, .pads = {0, 1, 2, 1}},
    {.scenario = "max, SAME_UPPER with an odd total", .op = "MaxPool", .x = {2, 3, 7, 7},
     .kernel = {2, 2}, .strides = {2, 2}, .auto_pad = "SAME_UPPER"},
    {.scenario = "max, SAME_LOWER with an odd total", .op = "MaxPool", .x = {2, 3, 8, 6},
     .kernel = {3, 3}, .strides = {2, 2}, .auto_pad = "SAME_LOWER"},
    {.scenario = "max, ceil_mode adds an end window", .op = "MaxPool", .x = {2, 3, 8, 8},
     .kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = 1},
    {.scenario = "max, ceil_mode with pads", .op = "MaxPool", .x = {2, 3, 6, 7}, .kernel = {2, 2},
     .strides = {2, 2}, .pads = {1, 1, 1, 1}, .ceil_mode = 1},
    {.scenario = "max, dilations", .op = "MaxPool", .x = {2, 3, 9, 9}, .kernel = {3, 3},
     .pads = {2, 2, 2, 2}, .dilations = {2, 2}},
    {.scenario = "max, unequal dilations, asymmetric pads, ceil_mode", .op = "MaxPool",
     .x = {2, 3, 9, 10}, .kernel = {2, 3}, .strides = {2, 1}, .pads = {1, 0, 0, 2},
     .dilations = {2, 3}, .ceil_mode = 1},
    {.scenario = "max, dilated SAME_UPPER", .op = "MaxPool", .x = {1, 2, 8, 9}, .kernel = {3, 2},
     .strides = {2, 2}, .dilations = {2, 2}, .auto_pad = "SAME_UPPER"},
    {.scenario = "max, 1x1 kernel, stride 2", .op = "MaxPool", .x = {2, 3, 5, 6}, .kernel = {1, 1},
     .strides = {2, 2}},
    {.scenario = "max, kernel larger than the input, padded", .op = "MaxPool", .x = {1, 2, 4, 4},
     .kernel = {5, 5}, .pads = {1, 1, 1, 1}},
    {.scenario = "max, stride beyond the kernel", .op = "MaxPool", .x = {2, 2, 10, 9},
     .kernel = {2, 2}, .strides = {3, 4}},
    {.scenario = "max, rectangular SAME_UPPER", .op = "MaxPool", .x = {2, 3, 6, 9},
     .kernel = {1, 3}, .strides = {1, 2}, .auto_pad = "SAME_UPPER"},
    {.scenario = "average excluding pads, equal pads", .op = "AveragePool", .x = {2, 3, 7, 7},
     .kernel = {3, 3}, .pads = {1, 1, 1, 1}},
    {.scenario = "average including pads, equal pads", .op = "AveragePool", .x = {2, 3, 7, 7},
     .kernel = {3, 3}, .pads = {1, 1, 1, 1}, .count_include_pad = 1},
    {.scenario = "average excluding pads, asymmetric pads", .op = "AveragePool",
     .x = {2, 3, 8, 7}, .kernel = {3, 3}, .strides = {2, 2}, .pads = {2, 0, 1, 1}},
    {.scenario = "average including pads, asymmetric pads", .op = "AveragePool",
     .x = {2, 3, 8, 7}, .kernel = {3, 3}, .strides = {2, 2}, .pads = {2, 0, 1, 1},
     .count_include_pad = 1},
    {.scenario = "average excluding pads, SAME_UPPER", .op = "AveragePool", .x = {2, 3, 9, 9},
     .kernel = {4, 4}, .strides = {2, 2}, .auto_pad = "SAME_UPPER"},
    {.scenario = "average including pads, SAME_LOWER", .op = "AveragePool", .x = {2, 3, 8, 9},
     .kernel = {3, 2}, .strides = {2, 2}, .auto_pad = "SAME_LOWER", .count_include_pad = 1},
    {.scenario = "average including pads, SAME_UPPER", .op = "AveragePool", .x = {2, 3, 9, 8},
     .kernel = {4, 3}, .strides = {2, 3}, .auto_pad = "SAME_UPPER", .count_include_pad = 1},
    {.scenario = "average, ceil_mode's end region is excluded", .op = "AveragePool",
     .x = {2, 3, 8, 8}, .kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = 1},
    {.scenario = "average, ceil_mode with pads", .op = "AveragePool", .x = {2, 3, 7, 8},
     .kernel = {3, 3}, .strides = {2, 2}, .pads = {1, 1, 1, 1}, .ceil_mode = 1},
    {.scenario = "average, ceil_mode with asymmetric pads", .op = "AveragePool",
     .x = {2, 3, 9, 8}, .kernel = {2, 3}, .strides = {3, 2}, .pads = {0, 2, 1, 0}, .ceil_mode = 1},
    {.scenario = "average, stride beyond the kernel", .op = "AveragePool", .x = {2, 2, 10, 9},
     .kernel = {2, 3}, .strides = {3, 2}},
    {.scenario = "average, window of the whole input", .op = "AveragePool", .x = {2, 3, 5, 6},
     .kernel = {5, 6}},
};

const PoolCase kPool1d[] = {
    {.scenario = "1-D max, asymmetric pads", .op = "MaxPool", .x = {2, 3, 11}, .kernel = {3},
     .strides = {2}, .pads = {1, 2}},
    {.scenario = "1-D max, dilated, ceil_mode", .op = "MaxPool", .x = {2, 3, 12}, .kernel = {2},
     .strides = {2}, .dilations = {3}, .ceil_mode = 1},
    {.scenario = "1-D max, SAME_LOWER", .op = "MaxPool", .x = {2, 3, 10}, .kernel = {4},
     .strides = {3}, .auto_pad = "SAME_LOWER"},
    {.scenario = "1-D average excluding pads, SAME_UPPER", .op = "AveragePool", .x = {2, 3, 10},
     .kernel = {4}, .strides = {3}, .auto_pad = "SAME_UPPER"},
    {.scenario = "1-D average including pads", .op = "AveragePool", .x = {2, 3, 9}, .kernel = {3},
     .pads = {2, 1}, .count_include_pad = 1},
    {.scenario = "1-D average, ceil_mode", .op = "AveragePool", .x = {2, 3, 10}, .kernel = {3},
     .strides = {2}, .ceil_mode = 1},
};

const PoolCase kPool3d[] = {
    {.scenario = "3-D max, asymmetric pads", .op = "MaxPool", .x = {1, 2, 5, 6, 7},
     .kernel = {2, 3, 2}, .strides = {2, 1, 2}, .pads = {1, 0, 1, 0, 2, 0}},
    {.scenario = "3-D max, dilated, ceil_mode", .op = "MaxPool", .x = {2, 2, 6, 7, 8},
     .kernel = {2, 2, 3}, .strides = {2, 2, 2}, .dilations = {1, 2, 2}, .ceil_mode = 1},
    {.scenario = "3-D average excluding pads, SAME_LOWER", .op = "AveragePool",
     .x = {1, 3, 5, 6, 7}, .kernel = {3, 3, 2}, .strides = {2, 2, 2}, .auto_pad = "SAME_LOWER"},
    {.scenario = "3-D average including pads", .op = "AveragePool", .x = {2, 2, 5, 5, 6},
     .kernel = {3, 2, 3}, .pads = {1, 1, 0, 1, 0, 2}, .count_include_pad = 1},
    {.scenario = "3-D average, ceil_mode", .op = "AveragePool", .x = {1, 2, 7, 6, 8},
     .kernel = {3, 2, 3}, .strides = {2, 2, 2}, .ceil_mode = 1},
};
// clang-format on

TEST(PoolMathTest, TwoDimensionalWindowsMatchTheCpu) {
  for (const PoolCase& c : kPool2d) CheckPoolCase(c);
}

TEST(PoolMathTest, OneDimensionalWindowsMatchTheCpu) {
  for (const PoolCase& c : kPool1d) CheckPoolCase(c);
}

TEST(PoolMathTest, ThreeDimensionalWindowsMatchTheReference) {
  for (const PoolCase& c : kPool3d) CheckPoolCase(c);
}

TEST(PoolMathTest, GlobalPoolingMatchesTheCpu) {
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    for (const Shape& xs : {Shape{2, 3, 9}, Shape{2, 3, 7, 5}, Shape{1, 4, 3, 4, 5}}) {
      SCOPED_TRACE(std::string(op) + " over " + ShapeString(xs));
      ModelBuilder mb;
      mb.Input("x", xs);
      Node node = ToNode(mb.Node(op, {"x"}, {"y"}));
      OutputOfRank(mb, "y", xs.size());
      const HostTensor x = RandomTensor(xs, 5);
      const PoolGeometry g = GeometryOf(node, xs, PoolWindow(node, xs));
      const CpuResult cpu = RunCpu(mb.Bytes(), {x});
      ASSERT_TRUE(cpu.status.ok()) << cpu.status;
      ExpectSame(Floats(cpu.outputs[0]), HostPool(g, Floats(x)), TolOf(g.mode), "global pooling");
    }
  }
}

// NaNs never win a max (the CPU's comparison is "greater than"), -inf loses to every number, and
// an average takes NaNs in.
TEST(PoolMathTest, NansAndInfinitiesAsTheCpu) {
  const Shape xs = {1, 2, 6, 6};
  std::vector<float> x = RandomFloats(NumElements(xs), 3);
  for (size_t i = 0; i < x.size(); i += 5) x[i] = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 2; i < x.size(); i += 7) x[i] = -std::numeric_limits<float>::infinity();
  x[3] = std::numeric_limits<float>::infinity();
  // A window of NaNs and -infs only gives the lowest float.
  std::vector<float> no_number(NumElements(xs), -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < no_number.size(); i += 2) {
    no_number[i] = std::numeric_limits<float>::quiet_NaN();
  }
  // clang-format off
  CheckPoolCase({.scenario = "max with NaNs", .op = "MaxPool", .x = xs, .kernel = {2, 2},
                 .pads = {1, 0, 0, 1}}, &x);
  CheckPoolCase({.scenario = "average with NaNs", .op = "AveragePool", .x = xs, .kernel = {2, 2},
                 .strides = {2, 2}, .pads = {1, 1, 1, 1}}, &x);
  CheckPoolCase({.scenario = "max of NaNs and -infs", .op = "MaxPool", .x = xs, .kernel = {2, 2},
                 .strides = {2, 2}}, &no_number);
  // clang-format on
}

// Pads as large as the (dilated) kernel leave windows with no tap in the input; the CUDA device
// sends them to the generic kernel (Note [cuDNN windows]). The CPU gives the lowest float for
// max and 0 for an average including pads, and refuses an average excluding pads (0 / 0); the
// CUDA factory refuses it too.
TEST(PoolMathTest, WindowsWhollyInThePadding) {
  // clang-format off
  const PoolCase cases[] = {
      {.scenario = "max", .op = "MaxPool", .x = {1, 2, 3, 3}, .kernel = {2, 2},
       .pads = {2, 2, 2, 3}},
      {.scenario = "dilated max", .op = "MaxPool", .x = {1, 2, 4, 3}, .kernel = {2, 2},
       .pads = {3, 0, 0, 3}, .dilations = {2, 1}},
      {.scenario = "average including pads", .op = "AveragePool", .x = {1, 2, 3, 3},
       .kernel = {2, 2}, .pads = {2, 2, 2, 3}, .count_include_pad = 1},
  };
  // clang-format on
  for (const PoolCase& c : cases) CheckPoolCase(c);

  const PoolCase exclude = {.scenario = "average excluding pads",
                            .op = "AveragePool",
                            .x = {1, 2, 3, 3},
                            .kernel = {2, 2},
                            .pads = {2, 0, 0, 1}};
  const CpuResult cpu = RunCpu(PoolModel(exclude, nullptr), {RandomTensor(exclude.x, 9)});
  EXPECT_EQ(cpu.status.code(), StatusCode::kUnimplemented) << cpu.status;
}

// ---------------------------------------------------------------------------------------------
// Padding and cropping.

// PadSource over every output element, as the padding copy runs it.
std::vector<float> HostPad(const PadGeometry& g, const std::vector<float>& x) {
  std::vector<float> y(PadOutputCount(g));
  for (int64_t o = 0; o < static_cast<int64_t>(y.size()); ++o) {
    const int64_t src = PadSource(g, o);
    y[o] = src < 0 ? 0.f : x[src];
  }
  return y;
}

struct ConvCase {
  const char* scenario;
  Shape x, w;
  int64_t group = 1;
  std::vector<int64_t> strides = {};
  std::vector<int64_t> dilations = {};
  std::vector<int64_t> pads = {};
  std::string auto_pad = "";
  bool bias = false;
  // ConvTranspose only.
  std::vector<int64_t> output_padding = {};
  std::vector<int64_t> output_shape = {};
};

// A Conv or ConvTranspose model of `c` with its padding attributes or (pad = false) without any.
std::string ConvModel(const std::string& op, const ConvCase& c, const Shape& x, bool pad,
                      Node* node) {
  ModelBuilder mb;
  mb.Input("x", x);
  mb.Input("w", c.w);
  std::vector<std::string> inputs = {"x", "w"};
  const bool bias = c.bias && pad;
  if (bias) {
    mb.Input("b", {op == "Conv" ? c.w[0] : c.w[1] * c.group});
    inputs.push_back("b");
  }
  onnx::NodeProto& n = mb.Node(op, inputs, {"y"});
  if (c.group != 1) ModelBuilder::Attr(n, "group", c.group);
  if (!c.strides.empty()) ModelBuilder::Attr(n, "strides", c.strides);
  if (!c.dilations.empty()) ModelBuilder::Attr(n, "dilations", c.dilations);
  if (pad) {
    if (!c.pads.empty()) ModelBuilder::Attr(n, "pads", c.pads);
    if (!c.auto_pad.empty()) ModelBuilder::Attr(n, "auto_pad", c.auto_pad);
    if (!c.output_padding.empty()) ModelBuilder::Attr(n, "output_padding", c.output_padding);
    if (!c.output_shape.empty()) ModelBuilder::Attr(n, "output_shape", c.output_shape);
  }
  OutputOfRank(mb, "y", x.size());
  if (node != nullptr) *node = ToNode(n);
  return mb.Bytes();
}

// The CUDA Conv's unequal-pads path: pad the input with PadSource, convolve without padding.
TEST(PoolMathTest, ConvOfThePaddedInputMatchesThePaddedConv) {
  // clang-format off
  const ConvCase cases[] = {
      {.scenario = "asymmetric pads", .x = {2, 3, 7, 6}, .w = {4, 3, 3, 3},
       .pads = {0, 1, 2, 1}},
      {.scenario = "asymmetric pads, strides, dilations, groups", .x = {2, 6, 9, 8},
       .w = {6, 2, 3, 3}, .group = 3, .strides = {2, 2}, .dilations = {2, 1},
       .pads = {1, 0, 0, 2}, .bias = true},
      {.scenario = "SAME_UPPER with an odd total", .x = {2, 3, 9, 9}, .w = {5, 3, 4, 4},
       .strides = {2, 2}, .auto_pad = "SAME_UPPER", .bias = true},
      {.scenario = "SAME_LOWER with an odd total", .x = {1, 4, 8, 7}, .w = {3, 4, 3, 2},
       .strides = {2, 2}, .auto_pad = "SAME_LOWER"},
      {.scenario = "dilated SAME_UPPER", .x = {1, 2, 10, 9}, .w = {2, 2, 3, 3},
       .dilations = {2, 3}, .auto_pad = "SAME_UPPER"},
      {.scenario = "1x1 kernel, end pads only", .x = {2, 3, 5, 5}, .w = {2, 3, 1, 1},
       .pads = {0, 0, 1, 1}},
      {.scenario = "equal pads", .x = {2, 3, 6, 6}, .w = {4, 3, 3, 3}, .pads = {1, 1, 1, 1}},
  };
  // clang-format on
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.scenario);
    Node node;
    const std::string padded_model = ConvModel("Conv", c, c.x, true, &node);
    const std::vector<int64_t> spatial(c.x.begin() + 2, c.x.end());
    const std::vector<int64_t> kernel(c.w.begin() + 2, c.w.end());
    auto win = ComputeWindow(node, spatial, kernel, false);
    ASSERT_TRUE(win.ok()) << win.status();
    Shape xp = c.x;
    std::vector<int64_t> padded(spatial.size());
    for (size_t i = 0; i < spatial.size(); ++i) {
      padded[i] = spatial[i] + win->pad_begin[i] + win->pad_end[i];
      xp[2 + i] = padded[i];
    }
    const PadGeometry g = MakePadGeometry(c.x[0] * c.x[1], spatial, padded, win->pad_begin);
    const HostTensor x = RandomTensor(c.x, 11), w = RandomTensor(c.w, 12);
    std::vector<HostTensor> feeds = {x, w};
    if (c.bias) feeds.push_back(RandomTensor({c.w[0]}, 13));
    const CpuResult want = RunCpu(padded_model, feeds);
    ASSERT_TRUE(want.status.ok()) << want.status;

    feeds[0] = HostTensor::FromFloats(xp, HostPad(g, Floats(x)));
    ConvCase unpadded = c;
    unpadded.bias = false;
    feeds.resize(2);
    const CpuResult got = RunCpu(ConvModel("Conv", unpadded, xp, false, nullptr), feeds);
    ASSERT_TRUE(got.status.ok()) << got.status;
    std::vector<float> y = Floats(got.outputs[0]);
    if (c.bias) {
      const std::vector<float> b = RandomFloats(c.w[0], 13);
      const int64_t plane = NumElements(got.outputs[0].shape) / (c.x[0] * c.w[0]);
      for (size_t i = 0; i < y.size(); ++i) y[i] += b[(i / plane) % c.w[0]];
    }
    EXPECT_EQ(want.outputs[0].shape, got.outputs[0].shape);
    ExpectSame(Floats(want.outputs[0]), y, 1e-5, "padded input, unpadded conv");
  }
}

// The CUDA ConvTranspose's cropping path: the unpadded ConvTranspose (the full result, of
// stride * (in - 1) + dilated kernel per dim), cropped by PadSource with offset -pad_begin, zeros
// past its end, plus the bias.
TEST(PoolMathTest, CroppedFullConvTransposeMatchesTheConvTranspose) {
  // clang-format off
  const ConvCase cases[] = {
      {.scenario = "asymmetric pads", .x = {2, 4, 5, 4}, .w = {4, 3, 3, 3}, .strides = {2, 2},
       .pads = {1, 0, 0, 2}},
      {.scenario = "output_padding with equal pads", .x = {2, 4, 5, 4}, .w = {4, 3, 3, 3},
       .strides = {2, 2}, .pads = {1, 1, 1, 1}, .bias = true, .output_padding = {1, 1}},
      {.scenario = "output_padding with asymmetric pads", .x = {1, 4, 4, 5}, .w = {4, 2, 3, 2},
       .strides = {2, 3}, .pads = {0, 1, 2, 0}, .output_padding = {1, 2}},
      {.scenario = "SAME_UPPER", .x = {2, 4, 5, 4}, .w = {4, 3, 4, 3}, .strides = {2, 2},
       .auto_pad = "SAME_UPPER", .bias = true},
      {.scenario = "SAME_LOWER", .x = {2, 4, 5, 4}, .w = {4, 3, 4, 3}, .strides = {2, 2},
       .auto_pad = "SAME_LOWER"},
      {.scenario = "output_shape", .x = {1, 4, 5, 4}, .w = {4, 3, 3, 3}, .strides = {2, 2},
       .output_shape = {11, 9}},
      {.scenario = "dilations, groups, asymmetric pads", .x = {2, 4, 5, 5}, .w = {4, 2, 3, 2},
       .group = 2, .strides = {2, 1}, .dilations = {2, 2}, .pads = {2, 1, 0, 1}, .bias = true},
  };
  // clang-format on
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.scenario);
    Node node;
    const std::string padded_model = ConvModel("ConvTranspose", c, c.x, true, &node);
    const std::vector<int64_t> spatial(c.x.begin() + 2, c.x.end());
    const std::vector<int64_t> kernel(c.w.begin() + 2, c.w.end());
    auto win = ComputeTransposedWindow(node, spatial, kernel);
    ASSERT_TRUE(win.ok()) << win.status();
    const HostTensor x = RandomTensor(c.x, 21), w = RandomTensor(c.w, 22);
    const int64_t channels = c.w[1] * c.group;
    std::vector<HostTensor> feeds = {x, w};
    if (c.bias) feeds.push_back(RandomTensor({channels}, 23));
    const CpuResult want = RunCpu(padded_model, feeds);
    ASSERT_TRUE(want.status.ok()) << want.status;

    feeds.resize(2);
    const CpuResult full = RunCpu(ConvModel("ConvTranspose", c, c.x, false, nullptr), feeds);
    ASSERT_TRUE(full.status.ok()) << full.status;
    const Shape& zs = full.outputs[0].shape;
    std::vector<int64_t> z(spatial.size()), offset(spatial.size());
    for (size_t i = 0; i < spatial.size(); ++i) {
      z[i] = win->strides[i] * (spatial[i] - 1) + (kernel[i] - 1) * win->dilations[i] + 1;
      EXPECT_EQ(zs[2 + i], z[i]) << "full size of dim " << i;
      offset[i] = -win->pad_begin[i];
    }
    const Shape& ys = want.outputs[0].shape;
    const std::vector<int64_t> out(ys.begin() + 2, ys.end());
    EXPECT_EQ(out, win->out);
    const PadGeometry g = MakePadGeometry(ys[0] * ys[1], z, out, offset);
    std::vector<float> y = HostPad(g, Floats(full.outputs[0]));
    if (c.bias) {
      const std::vector<float> b = RandomFloats(channels, 23);
      const int64_t plane = NumElements(ys) / (ys[0] * ys[1]);
      for (size_t i = 0; i < y.size(); ++i) y[i] += b[(i / plane) % channels];
    }
    ExpectSame(Floats(want.outputs[0]), y, 1e-5, "cropped full transposed convolution");
  }
}

// 1-D and 3-D padding and cropping against an independent per-dim loop.
TEST(PoolMathTest, PadSourceInOneAndThreeDims) {
  struct PadCase {
    std::vector<int64_t> in, out, offset;
  };
  const PadCase cases[] = {
      {{7}, {10}, {1}},                     // pad 1 before, 2 after
      {{10}, {6}, {-3}},                    // crop
      {{5}, {8}, {-1}},                     // crop 1, then 4 zeros past the end
      {{3, 4, 5}, {5, 7, 6}, {1, 2, 0}},    // pad
      {{6, 5, 7}, {4, 6, 3}, {-1, 0, -2}},  // crop, pad and extend
  };
  const int64_t planes = 3;
  for (const PadCase& c : cases) {
    const PadGeometry g = MakePadGeometry(planes, c.in, c.out, c.offset);
    int64_t in_plane = 1, out_plane = 1;
    for (int64_t v : c.in) in_plane *= v;
    for (int64_t v : c.out) out_plane *= v;
    const std::vector<float> x = RandomFloats(planes * in_plane, 31);
    std::vector<float> want;
    const size_t rank = c.in.size();
    for (int64_t p = 0; p < planes; ++p) {
      for (int64_t j = 0; j < out_plane; ++j) {
        // Position of j in the output, then the input element it copies.
        std::vector<int64_t> pos(rank);
        int64_t rest = j;
        for (size_t d = rank; d-- > 0;) {
          pos[d] = rest % c.out[d];
          rest /= c.out[d];
        }
        int64_t src = 0;
        bool inside = true;
        for (size_t d = 0; d < rank; ++d) {
          const int64_t i = pos[d] - c.offset[d];
          inside = inside && i >= 0 && i < c.in[d];
          src = src * c.in[d] + i;
        }
        want.push_back(inside ? x[p * in_plane + src] : 0.f);
      }
    }
    ExpectSame(want, HostPad(g, x), 0, "padding of " + std::to_string(rank) + "-D planes");
  }
}

}  // namespace
}  // namespace salus::exec
