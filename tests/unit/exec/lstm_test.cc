// The LSTM kernels: the forward op (through a compiled executable) against a reference loop in
// double, and the backward kernel ("SalusLstmGrad", run directly) against central finite
// differences of L = sum(RY * Y) + sum(RH * Y_h) + sum(RC * Y_c) computed with that reference.
// Every direction, both layouts, with and without B and initial states.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "exec/kernel_registry.h"
#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::ModelBuilder;
using testing::RandomFloats;
using testing::RunHost;

struct Config {
  std::string direction = "forward";
  int64_t layout = 0;
  bool bias = false, h0 = false, c0 = false;
  int64_t seq = 3, batch = 2, input = 4, hidden = 3;

  int64_t dirs() const { return direction == "bidirectional" ? 2 : 1; }
  Shape x() const { return layout ? Shape{batch, seq, input} : Shape{seq, batch, input}; }
  Shape w() const { return {dirs(), 4 * hidden, input}; }
  Shape r() const { return {dirs(), 4 * hidden, hidden}; }
  Shape b() const { return {dirs(), 8 * hidden}; }
  Shape state() const {
    return layout ? Shape{batch, dirs(), hidden} : Shape{dirs(), batch, hidden};
  }
  Shape y() const {
    return layout ? Shape{batch, seq, dirs(), hidden} : Shape{seq, dirs(), batch, hidden};
  }
  std::string Label() const {
    return direction + " layout=" + std::to_string(layout) + (bias ? " B" : "") +
           (h0 ? " initial_h" : "") + (c0 ? " initial_c" : "");
  }
};

// The configurations every test runs: each direction and layout, with and without the
// optional inputs.
std::vector<Config> Configs() {
  std::vector<Config> out;
  for (const char* dir : {"forward", "reverse", "bidirectional"}) {
    for (int64_t layout : {0, 1}) {
      for (int extras = 0; extras < 3; ++extras) {
        Config c;
        c.direction = dir;
        c.layout = layout;
        c.bias = extras >= 1;
        c.h0 = extras >= 1;
        c.c0 = extras == 2;  // initial_h without initial_c in case 1
        out.push_back(c);
      }
    }
  }
  return out;
}

struct Params {
  std::vector<double> x, w, r, b, h0, c0;
};

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

Params RandomParams(const Config& c, uint32_t seed) {
  Params p;
  p.x = ToDouble(RandomFloats(NumElements(c.x()), seed));
  p.w = ToDouble(RandomFloats(NumElements(c.w()), seed + 1, -0.6f, 0.6f));
  p.r = ToDouble(RandomFloats(NumElements(c.r()), seed + 2, -0.6f, 0.6f));
  if (c.bias) p.b = ToDouble(RandomFloats(NumElements(c.b()), seed + 3, -0.5f, 0.5f));
  if (c.h0) p.h0 = ToDouble(RandomFloats(NumElements(c.state()), seed + 4));
  if (c.c0) p.c0 = ToDouble(RandomFloats(NumElements(c.state()), seed + 5));
  return p;
}

std::vector<float> ToFloat(const std::vector<double>& v) { return {v.begin(), v.end()}; }

struct Outputs {
  std::vector<double> y, y_h, y_c;
};

double Sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// ONNX LSTM written out directly: gates i, o, f, c; Sigmoid, Tanh, Tanh.
Outputs Reference(const Config& c, const Params& p) {
  const int64_t H = c.hidden, I = c.input, D = c.dirs();
  auto xi = [&](int64_t t, int64_t b, int64_t k) {
    return c.layout ? (b * c.seq + t) * I + k : (t * c.batch + b) * I + k;
  };
  auto si = [&](int64_t d, int64_t b, int64_t j) {
    return c.layout ? (b * D + d) * H + j : (d * c.batch + b) * H + j;
  };
  auto yi = [&](int64_t t, int64_t d, int64_t b, int64_t j) {
    return c.layout ? ((b * c.seq + t) * D + d) * H + j : ((t * D + d) * c.batch + b) * H + j;
  };
  Outputs o;
  o.y.assign(NumElements(c.y()), 0);
  o.y_h.assign(NumElements(c.state()), 0);
  o.y_c.assign(NumElements(c.state()), 0);
  for (int64_t d = 0; d < D; ++d) {
    const bool backwards = d == 1 || c.direction == "reverse";
    for (int64_t b = 0; b < c.batch; ++b) {
      std::vector<double> h(H), cell(H);
      for (int64_t j = 0; j < H; ++j) {
        h[j] = c.h0 ? p.h0[si(d, b, j)] : 0;
        cell[j] = c.c0 ? p.c0[si(d, b, j)] : 0;
      }
      for (int64_t step = 0; step < c.seq; ++step) {
        const int64_t t = backwards ? c.seq - 1 - step : step;
        std::vector<double> z(4 * H);
        for (int64_t g = 0; g < 4 * H; ++g) {
          double v = 0;
          for (int64_t k = 0; k < I; ++k) v += p.x[xi(t, b, k)] * p.w[(d * 4 * H + g) * I + k];
          for (int64_t k = 0; k < H; ++k) v += h[k] * p.r[(d * 4 * H + g) * H + k];
          if (c.bias) v += p.b[d * 8 * H + g] + p.b[d * 8 * H + 4 * H + g];
          z[g] = v;
        }
        for (int64_t j = 0; j < H; ++j) {
          const double i = Sigmoid(z[j]), og = Sigmoid(z[H + j]), f = Sigmoid(z[2 * H + j]);
          const double g = std::tanh(z[3 * H + j]);
          cell[j] = f * cell[j] + i * g;
          h[j] = og * std::tanh(cell[j]);
          o.y[yi(t, d, b, j)] = h[j];
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        o.y_h[si(d, b, j)] = h[j];
        o.y_c[si(d, b, j)] = cell[j];
      }
    }
  }
  return o;
}

std::string LstmModel(const Config& c, const Params& p, const std::vector<std::string>& outputs,
                      int opset = 17) {
  ModelBuilder mb;
  mb.proto().mutable_opset_import(0)->set_version(opset);
  mb.Input("X", c.x());
  mb.Initializer("W", c.w(), ToFloat(p.w)).Initializer("R", c.r(), ToFloat(p.r));
  if (c.bias) mb.Initializer("B", c.b(), ToFloat(p.b));
  if (c.h0) mb.Initializer("H0", c.state(), ToFloat(p.h0));
  if (c.c0) mb.Initializer("C0", c.state(), ToFloat(p.c0));
  auto& n = mb.Node(
      "LSTM", {"X", "W", "R", c.bias ? "B" : "", "", c.h0 ? "H0" : "", c.c0 ? "C0" : ""}, outputs);
  ModelBuilder::Attr(n, "hidden_size", c.hidden);
  ModelBuilder::Attr(n, "direction", c.direction);
  if (c.layout) ModelBuilder::Attr(n, "layout", c.layout);
  const Shape shapes[] = {c.y(), c.state(), c.state()};
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].empty()) mb.Output(outputs[i], shapes[i]);
  }
  return mb.Bytes();
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::abs(want[i])) << what << "[" << i << "]";
  }
}

std::vector<float> Floats(const HostTensor& t) {
  return {t.floats(), t.floats() + NumElements(t.shape)};
}

TEST(LstmTest, ForwardMatchesReference) {
  uint32_t seed = 1;
  for (const Config& c : Configs()) {
    SCOPED_TRACE(c.Label());
    const Params p = RandomParams(c, seed += 10);
    const Outputs want = Reference(c, p);
    auto exe = Executable::Compile(LstmModel(c, p, {"Y", "Y_h", "Y_c"}), CompileOptions{});
    ASSERT_TRUE(exe.ok()) << exe.status();
    Memory mem(**exe);
    auto out = RunHost(**exe, mem, {HostTensor::FromFloats(c.x(), ToFloat(p.x))});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 3u);
    ExpectNear(Floats((*out)[0]), want.y, "Y");
    ExpectNear(Floats((*out)[1]), want.y_h, "Y_h");
    ExpectNear(Floats((*out)[2]), want.y_c, "Y_c");
  }
}

TEST(LstmTest, OptionalOutputs) {
  Config c;
  c.direction = "bidirectional";
  c.seq = 4;
  const Params p = RandomParams(c, 7);
  const Outputs want = Reference(c, p);
  {  // Only Y_h, as ONNX's own LSTM tests write it.
    auto exe = Executable::Compile(LstmModel(c, p, {"", "Y_h"}), CompileOptions{});
    ASSERT_TRUE(exe.ok()) << exe.status();
    Memory mem(**exe);
    auto out = RunHost(**exe, mem, {HostTensor::FromFloats(c.x(), ToFloat(p.x))});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 1u);
    ExpectNear(Floats((*out)[0]), want.y_h, "Y_h");
  }
  {  // Only Y_c.
    auto exe = Executable::Compile(LstmModel(c, p, {"", "", "Y_c"}), CompileOptions{});
    ASSERT_TRUE(exe.ok()) << exe.status();
    Memory mem(**exe);
    auto out = RunHost(**exe, mem, {HostTensor::FromFloats(c.x(), ToFloat(p.x))});
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectNear(Floats((*out)[0]), want.y_c, "Y_c");
  }
}

// Compiling `model` fails with `code` and a message naming the node and containing `what`.
void ExpectRefused(const std::string& model, StatusCode code, const std::string& what) {
  auto exe = Executable::Compile(model, CompileOptions{});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), code) << exe.status();
  EXPECT_NE(exe.status().message().find("LSTM"), std::string::npos) << exe.status();
  EXPECT_NE(exe.status().message().find(what), std::string::npos) << exe.status();
}

TEST(LstmTest, BadInputsAreRefused) {
  Config c;
  const Params p = RandomParams(c, 3);
  {  // W's input size differs from X's.
    Config wide = c;
    wide.input = c.input + 1;
    Params q = RandomParams(wide, 3);
    ModelBuilder mb;
    mb.Input("X", c.x())
        .Initializer("W", wide.w(), ToFloat(q.w))
        .Initializer("R", c.r(), ToFloat(p.r));
    mb.Node("LSTM", {"X", "W", "R"}, {"Y"});
    mb.Output("Y", c.y());
    ExpectRefused(mb.Bytes(), StatusCode::kInvalidArgument, "W must be");
  }
  {  // sequence_lens given (int64 here, since the engine has no int32 tensors; it is refused
     // before its type matters).
    ModelBuilder mb;
    mb.Input("X", c.x())
        .Initializer("W", c.w(), ToFloat(p.w))
        .Initializer("R", c.r(), ToFloat(p.r));
    mb.Int64Initializer("L", {c.batch}, {c.seq, c.seq});
    mb.Node("LSTM", {"X", "W", "R", "", "L"}, {"Y"});
    mb.Output("Y", c.y());
    ExpectRefused(mb.Bytes(), StatusCode::kUnimplemented, "sequence_lens");
  }
  {  // An activation other than the defaults.
    ModelBuilder mb;
    mb.Input("X", c.x())
        .Initializer("W", c.w(), ToFloat(p.w))
        .Initializer("R", c.r(), ToFloat(p.r));
    auto& n = mb.Node("LSTM", {"X", "W", "R"}, {"Y"});
    auto* a = n.add_attribute();
    a->set_name("activations");
    a->set_type(onnx::AttributeProto::STRINGS);
    for (const char* s : {"Sigmoid", "Relu", "Tanh"}) a->add_strings(s);
    mb.Output("Y", c.y());
    ExpectRefused(mb.Bytes(), StatusCode::kUnimplemented, "activations");
  }
  {  // clip.
    ModelBuilder mb;
    mb.Input("X", c.x())
        .Initializer("W", c.w(), ToFloat(p.w))
        .Initializer("R", c.r(), ToFloat(p.r));
    auto& n = mb.Node("LSTM", {"X", "W", "R"}, {"Y"});
    ModelBuilder::Attr(n, "clip", 5.f);
    mb.Output("Y", c.y());
    ExpectRefused(mb.Bytes(), StatusCode::kUnimplemented, "clip");
  }
}

TEST(LstmTest, ExplicitDefaultActivationsAccepted) {
  Config c;
  const Params p = RandomParams(c, 5);
  ModelBuilder mb;
  mb.Input("X", c.x()).Initializer("W", c.w(), ToFloat(p.w)).Initializer("R", c.r(), ToFloat(p.r));
  auto& n = mb.Node("LSTM", {"X", "W", "R"}, {"Y"});
  auto* a = n.add_attribute();
  a->set_name("activations");
  a->set_type(onnx::AttributeProto::STRINGS);
  for (const char* s : {"Sigmoid", "Tanh", "Tanh"}) a->add_strings(s);
  mb.Output("Y", c.y());
  auto exe = Executable::Compile(mb.Bytes(), CompileOptions{});
  ASSERT_TRUE(exe.ok()) << exe.status();
  Memory mem(**exe);
  auto out = RunHost(**exe, mem, {HostTensor::FromFloats(c.x(), ToFloat(p.x))});
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectNear(Floats((*out)[0]), Reference(c, p).y, "Y");
}

// Which output gradients flow into the backward kernel.
struct Seeds {
  bool y = true, y_h = true, y_c = true;
};

struct GradRun {
  std::vector<float> dx, dw, dr, db, dh0, dc0;
};

// Runs SalusLstmGrad on the host with loss weights ry, rh, rc (the output gradients).
StatusOr<GradRun> RunGradKernel(const Config& c, const Params& p, const Seeds& seeds,
                                const std::vector<double>& ry, const std::vector<double>& rh,
                                const std::vector<double>& rc) {
  Graph g;
  auto add = [&](const std::string& name, const Shape& shape) {
    Value v;
    v.name = name;
    v.shape = shape;
    v.kind = ValueKind::kIntermediate;
    return g.AddValue(std::move(v));
  };
  std::vector<std::vector<float>> in_data = {ToFloat(p.x),
                                             ToFloat(p.w),
                                             ToFloat(p.r),
                                             ToFloat(p.b),
                                             ToFloat(p.h0),
                                             ToFloat(p.c0),
                                             seeds.y ? ToFloat(ry) : std::vector<float>{},
                                             seeds.y_h ? ToFloat(rh) : std::vector<float>{},
                                             seeds.y_c ? ToFloat(rc) : std::vector<float>{}};
  const Shape in_shapes[] = {c.x(),     c.w(), c.r(),     c.b(),    c.state(),
                             c.state(), c.y(), c.state(), c.state()};
  const bool present[] = {true, true, true, c.bias, c.h0, c.c0, seeds.y, seeds.y_h, seeds.y_c};
  Node n;
  n.op = "SalusLstmGrad";
  n.name = "lstm_grad";
  for (size_t i = 0; i < 9; ++i) {
    n.inputs.push_back(present[i] ? add("in" + std::to_string(i), in_shapes[i]) : kNoValue);
  }
  for (size_t i = 0; i < 6; ++i) {
    n.outputs.push_back(present[i] ? add("out" + std::to_string(i), in_shapes[i]) : kNoValue);
  }
  Attribute dir;
  dir.kind = Attribute::Kind::kString;
  dir.s = c.direction;
  n.attrs["direction"] = dir;
  Attribute layout;
  layout.i = c.layout;
  n.attrs["layout"] = layout;
  Attribute hidden;
  hidden.i = c.hidden;
  n.attrs["hidden_size"] = hidden;
  g.AddNode(n);
  SALUS_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> k,
                         KernelRegistry::Global().Create(n, g, DeviceType::kCpu));

  GradRun run;
  std::vector<float>* outs[] = {&run.dx, &run.dw, &run.dr, &run.db, &run.dh0, &run.dc0};
  KernelArgs args;
  for (size_t i = 0; i < 9; ++i) args.inputs.push_back(present[i] ? in_data[i].data() : nullptr);
  for (size_t i = 0; i < 6; ++i) {
    // NaN-filled, so an element the kernel forgets to write shows.
    if (present[i]) outs[i]->assign(NumElements(in_shapes[i]), std::nanf(""));
    args.outputs.push_back(present[i] ? outs[i]->data() : nullptr);
  }
  std::vector<std::byte> scratch(k->scratch_bytes() + kAlignment);
  args.scratch = Memory::Align(scratch);
  SALUS_RETURN_IF_ERROR(k->Run(args));
  return run;
}

double Loss(const Config& c, const Params& p, const Seeds& s, const std::vector<double>& ry,
            const std::vector<double>& rh, const std::vector<double>& rc) {
  const Outputs o = Reference(c, p);
  double l = 0;
  for (size_t i = 0; s.y && i < o.y.size(); ++i) l += ry[i] * o.y[i];
  for (size_t i = 0; s.y_h && i < o.y_h.size(); ++i) l += rh[i] * o.y_h[i];
  for (size_t i = 0; s.y_c && i < o.y_c.size(); ++i) l += rc[i] * o.y_c[i];
  return l;
}

void CheckGrad(const Config& c, const Seeds& seeds, uint32_t seed) {
  const Params p = RandomParams(c, seed);
  const std::vector<double> ry = ToDouble(RandomFloats(NumElements(c.y()), seed + 20));
  const std::vector<double> rh = ToDouble(RandomFloats(NumElements(c.state()), seed + 21));
  const std::vector<double> rc = ToDouble(RandomFloats(NumElements(c.state()), seed + 22));
  auto run = RunGradKernel(c, p, seeds, ry, rh, rc);
  ASSERT_TRUE(run.ok()) << run.status();
  auto again = RunGradKernel(c, p, seeds, ry, rh, rc);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(0, std::memcmp(run->dw.data(), again->dw.data(), run->dw.size() * sizeof(float)))
      << "not deterministic";

  struct Target {
    const char* name;
    std::vector<double> Params::*field;
    const std::vector<float>* grad;
  };
  const Target targets[] = {
      {"X", &Params::x, &run->dx},           {"W", &Params::w, &run->dw},
      {"R", &Params::r, &run->dr},           {"B", &Params::b, &run->db},
      {"initial_h", &Params::h0, &run->dh0}, {"initial_c", &Params::c0, &run->dc0}};
  constexpr double kEps = 1e-5;
  for (const Target& t : targets) {
    const std::vector<double>& base = p.*(t.field);
    ASSERT_EQ(base.size(), t.grad->size()) << t.name;
    for (size_t i = 0; i < base.size(); ++i) {
      Params q = p;
      (q.*(t.field))[i] = base[i] + kEps;
      const double up = Loss(c, q, seeds, ry, rh, rc);
      (q.*(t.field))[i] = base[i] - kEps;
      const double down = Loss(c, q, seeds, ry, rh, rc);
      const double numeric = (up - down) / (2 * kEps);
      EXPECT_NEAR((*t.grad)[i], numeric, 1e-4 + 1e-4 * std::abs(numeric))
          << t.name << "[" << i << "]";
    }
  }
}

TEST(LstmTest, BackwardMatchesFiniteDifferences) {
  uint32_t seed = 100;
  for (const Config& c : Configs()) {
    SCOPED_TRACE(c.Label());
    CheckGrad(c, Seeds{}, seed += 30);
  }
}

TEST(LstmTest, BackwardWithSomeOutputGradients) {
  Config c;
  c.direction = "bidirectional";
  c.layout = 1;
  c.bias = c.h0 = c.c0 = true;
  for (Seeds s : {Seeds{true, false, false}, Seeds{false, true, false}, Seeds{false, false, true},
                  Seeds{false, true, true}}) {
    SCOPED_TRACE(std::to_string(s.y) + std::to_string(s.y_h) + std::to_string(s.y_c));
    CheckGrad(c, s, 500);
  }
}

TEST(LstmTest, BackwardSingleStepAndLongerSequence) {
  Config one;
  one.seq = 1;
  one.bias = one.h0 = one.c0 = true;
  CheckGrad(one, Seeds{}, 600);
  Config longer;
  longer.seq = 7;
  longer.batch = 3;
  longer.direction = "reverse";
  longer.layout = 1;
  CheckGrad(longer, Seeds{}, 700);
}

}  // namespace
}  // namespace salus::exec
