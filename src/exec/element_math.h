// Per-element math of the elementwise-style ops, shared by the CPU kernels (cpu_kernels.cc,
// cpu_kernel_helpers.cc) and the CUDA kernels (cuda/elementwise.cu), so that both devices compute
// each element with one definition:
//   - the unary ops the CUDA device computes by hand (those cuDNN has no activation for) and the
//     broadcasting binary ops;
//   - strided index maps: output element -> offset into each operand, for broadcasting
//     (Add..Pow) and for Transpose; built on the host with size-1 dims dropped and adjacent dims
//     merged where every operand allows, so the common cases (same shapes, a scalar operand) need
//     no division per element;
//   - Pad's map (output element -> input element, or padding) and DepthToSpace's (input element
//     -> output element);
//   - SoftmaxCrossEntropyLoss per row (log-probabilities, the row's loss term and weight) and its
//     final reduction;
//   - the LSTM cell, forward and backward, per element;
//   - the tensor ops of exported models (cpu_tensor_kernels.cc): int64 arithmetic, comparisons,
//     Mod, Cast, Gelu, Clip, Min/Max, and the maps of Gather, Slice and Trilu.
// tests/unit/exec/element_math_test.cc runs these over whole tensors on the host against the CPU
// executable, which is how the CUDA kernels' logic is checked on a machine without a GPU.
//
// C++17 with no project header beyond hd.h: nvcc compiles elementwise.cu, which includes this.
// Host-only builders (plain `inline`, taking std::vector) sit beside the SALUS_HD functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "exec/hd.h"

namespace salus::exec {

// ---------------------------------------------------------------------------------------------
// Unary and binary elementwise math.

enum class UnaryOp : int32_t { kLeakyRelu, kExp, kLog, kSqrt, kNeg, kAbs, kSoftplus };

// The op of an ONNX unary op name; false for ops computed elsewhere (the cuDNN activations).
inline bool UnaryOpFor(const std::string& name, UnaryOp* op) {
  struct Entry {
    const char* name;
    UnaryOp op;
  };
  static constexpr Entry kOps[] = {
      {"LeakyRelu", UnaryOp::kLeakyRelu}, {"Exp", UnaryOp::kExp}, {"Log", UnaryOp::kLog},
      {"Sqrt", UnaryOp::kSqrt},           {"Neg", UnaryOp::kNeg}, {"Abs", UnaryOp::kAbs},
      {"Softplus", UnaryOp::kSoftplus}};
  for (const Entry& e : kOps) {
    if (name == e.name) {
      *op = e.op;
      return true;
    }
  }
  return false;
}

// `alpha` is LeakyRelu's slope; the other ops ignore it. The results are the CPU's (oneDNN's
// eltwise algorithms) up to rounding, with the same special values:
//   - LeakyRelu is x > 0 ? x : alpha * x, so NaN stays NaN; with alpha 0 oneDNN computes
//     max(x, 0) instead, which turns NaN and -0 into +0, and so does this;
//   - Softplus is log(1 + e^x), computed as max(x, 0) + log1p(e^-|x|), which neither overflows
//     nor loses the small values of large negative x.
SALUS_HD float ApplyUnary(UnaryOp op, float alpha, float x) {
  switch (op) {
    case UnaryOp::kLeakyRelu:
      return x > 0.f ? x : (alpha == 0.f ? 0.f : x * alpha);
    case UnaryOp::kExp:
      return expf(x);
    case UnaryOp::kLog:
      return logf(x);
    case UnaryOp::kSqrt:
      return sqrtf(x);
    case UnaryOp::kNeg:
      return 0.f - x;  // oneDNN's -1 * x + 0: +0 for either zero
    case UnaryOp::kAbs:
      return fabsf(x);
    case UnaryOp::kSoftplus:
      return (x > 0.f ? x : 0.f) + log1pf(expf(-fabsf(x)));
  }
  return x;
}

enum class BinaryOp : int32_t { kAdd, kSub, kMul, kDiv, kPow };

// The op of an ONNX binary op name; false for any other op.
inline bool BinaryOpFor(const std::string& name, BinaryOp* op) {
  struct Entry {
    const char* name;
    BinaryOp op;
  };
  static constexpr Entry kOps[] = {{"Add", BinaryOp::kAdd},
                                   {"Sub", BinaryOp::kSub},
                                   {"Mul", BinaryOp::kMul},
                                   {"Div", BinaryOp::kDiv},
                                   {"Pow", BinaryOp::kPow}};
  for (const Entry& e : kOps) {
    if (name == e.name) {
      *op = e.op;
      return true;
    }
  }
  return false;
}

// powf is std::pow's float overload on the host.
SALUS_HD float ApplyBinary(BinaryOp op, float u, float v) {
  switch (op) {
    case BinaryOp::kAdd:
      return u + v;
    case BinaryOp::kSub:
      return u - v;
    case BinaryOp::kMul:
      return u * v;
    case BinaryOp::kDiv:
      return u / v;
    case BinaryOp::kPow:
      return powf(u, v);
  }
  return u;
}

// ---------------------------------------------------------------------------------------------
// Strided index maps.

// The most dims a map keeps once size-1 dims are dropped and adjacent dims merged, and the most
// operands it maps (a binary op's two inputs).
inline constexpr int kMaxIndexDims = 8;
inline constexpr int kMaxIndexOperands = 2;

// Element e of a row-major index space of `dims` is at offset sum_d(index_d * strides[k][d]) in
// operand k. Rank 0 is a single element at offset 0. Unused operands have zero strides.
struct IndexMap {
  int32_t rank = 0;
  int64_t dims[kMaxIndexDims] = {};
  int64_t strides[kMaxIndexOperands][kMaxIndexDims] = {};
};

SALUS_HD int64_t IndexMapCount(const IndexMap& m) {
  int64_t count = 1;
  for (int d = 0; d < m.rank; ++d) count *= m.dims[d];
  return count;
}

// The offsets of element e in every operand. One dim needs no division: the merged maps of same
// shapes and of a scalar operand take that path.
SALUS_HD void MapIndex(const IndexMap& m, int64_t e, int64_t offsets[kMaxIndexOperands]) {
  for (int k = 0; k < kMaxIndexOperands; ++k) offsets[k] = 0;
  if (m.rank == 1) {
    for (int k = 0; k < kMaxIndexOperands; ++k) offsets[k] = e * m.strides[k][0];
    return;
  }
  for (int d = m.rank - 1; d >= 0; --d) {
    const int64_t i = e % m.dims[d];
    e /= m.dims[d];
    for (int k = 0; k < kMaxIndexOperands; ++k) offsets[k] += i * m.strides[k][d];
  }
}

// The map of the index space `dims` over operands with the given per-dim strides (each as long
// as dims; at most kMaxIndexOperands of them). Size-1 dims are dropped (their index is always 0)
// and a dim is merged into the next inner one when, for every operand, its stride is the inner
// one's stride times the inner one's size, so the pair walks the operand like one dim (both
// broadcast, or laid out one after the other). An empty space is one dim of size 0. False when
// more than kMaxIndexDims dims remain.
inline bool MakeIndexMap(const std::vector<int64_t>& dims,
                         const std::vector<std::vector<int64_t>>& strides, IndexMap* m) {
  *m = IndexMap{};
  const int operands = static_cast<int>(strides.size());
  for (int64_t d : dims) {
    if (d == 0) {
      m->rank = 1;
      return true;
    }
  }
  struct Group {
    int64_t size;
    int64_t stride[kMaxIndexOperands];
  };
  std::vector<Group> groups;  // innermost first
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    if (dims[d] == 1) continue;
    bool merge = !groups.empty();
    for (int k = 0; merge && k < operands; ++k) {
      merge = strides[k][d] == groups.back().stride[k] * groups.back().size;
    }
    if (merge) {
      groups.back().size *= dims[d];
      continue;
    }
    Group g{dims[d], {}};
    for (int k = 0; k < operands; ++k) g.stride[k] = strides[k][d];
    groups.push_back(g);
  }
  if (groups.size() > static_cast<size_t>(kMaxIndexDims)) return false;
  m->rank = static_cast<int32_t>(groups.size());
  for (int d = 0; d < m->rank; ++d) {
    const Group& g = groups[groups.size() - 1 - d];
    m->dims[d] = g.size;
    for (int k = 0; k < operands; ++k) m->strides[k][d] = g.stride[k];
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Pad (constant mode, pads >= 0).

// Output element j (per dim) copies input element j - begin where that lies in the input, and
// is the pad value elsewhere. Both tensors are dense row-major.
struct PadMap {
  int32_t rank = 0;
  int64_t in[kMaxIndexDims] = {};
  int64_t out[kMaxIndexDims] = {};
  int64_t begin[kMaxIndexDims] = {};
};

SALUS_HD int64_t PadOutputCount(const PadMap& m) {
  int64_t count = 1;
  for (int d = 0; d < m.rank; ++d) count *= m.out[d];
  return count;
}

// The input element output element `o` copies, or -1 where it is padding.
SALUS_HD int64_t PadSourceIndex(const PadMap& m, int64_t o) {
  int64_t src = 0, in_stride = 1;
  for (int d = m.rank - 1; d >= 0; --d) {
    const int64_t i = o % m.out[d] - m.begin[d];
    o /= m.out[d];
    if (i < 0 || i >= m.in[d]) return -1;
    src += i * in_stride;
    in_stride *= m.in[d];
  }
  return src;
}

// The map padding `in` by `pads` (ONNX's layout: every dim's begin, then every dim's end; all
// >= 0). A dim is merged into the next inner one when that one is not padded: a row of the
// merged dim is then a contiguous run in both tensors. Unpadded size-1 dims are dropped. False
// when more than kMaxIndexDims dims remain.
inline bool MakePadMap(const std::vector<int64_t>& in, const std::vector<int64_t>& pads,
                       PadMap* m) {
  *m = PadMap{};
  const size_t rank = in.size();
  struct Group {
    int64_t in, out, begin;
  };
  std::vector<Group> groups;  // innermost first
  for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
    const int64_t begin = pads[d], end = pads[d + rank];
    if (in[d] == 1 && begin == 0 && end == 0) continue;
    if (!groups.empty() && groups.back().begin == 0 && groups.back().in == groups.back().out) {
      Group& g = groups.back();
      g.begin = begin * g.in;
      g.out = (in[d] + begin + end) * g.in;
      g.in *= in[d];
      continue;
    }
    groups.push_back({in[d], in[d] + begin + end, begin});
  }
  if (groups.size() > static_cast<size_t>(kMaxIndexDims)) return false;
  m->rank = static_cast<int32_t>(groups.size());
  for (int d = 0; d < m->rank; ++d) {
    const Group& g = groups[groups.size() - 1 - d];
    m->in[d] = g.in;
    m->out[d] = g.out;
    m->begin[d] = g.begin;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace on NCHW: [n, c, h, w] -> [n, c / b^2, h * b, w * b].

struct DepthToSpaceGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;  // the input's dims
  int64_t block = 1;
  bool dcr = true;  // DCR: channel = (i * b + j) * c_out + cc; CRD: (cc * b + i) * b + j
};

SALUS_HD int64_t DepthToSpaceCount(const DepthToSpaceGeometry& g) { return g.n * g.c * g.h * g.w; }

// The output element input element `in` moves to: input channel ci holds the block offset (i, j)
// of output channel cc, in the mode's order.
SALUS_HD int64_t DepthToSpaceTarget(const DepthToSpaceGeometry& g, int64_t in) {
  const int64_t b = g.block, co = g.c / (b * b);
  const int64_t ww = in % g.w;
  int64_t rest = in / g.w;
  const int64_t hh = rest % g.h;
  rest /= g.h;
  const int64_t ci = rest % g.c;
  const int64_t batch = rest / g.c;
  int64_t i, j, cc;
  if (g.dcr) {
    i = ci / (b * co);
    j = (ci / co) % b;
    cc = ci % co;
  } else {
    cc = ci / (b * b);
    i = (ci / b) % b;
    j = ci % b;
  }
  const int64_t row = ((batch * co + cc) * g.h * b + hh * b + i) * g.w * b;
  return row + ww * b + j;
}

// ---------------------------------------------------------------------------------------------
// SoftmaxCrossEntropyLoss.

// Scores [n, c, d...] viewed as [n, c, d] (d the product of the extra dims), labels [n, d].
struct SceSpec {
  int64_t n = 0, c = 0, d = 1;  // batch, classes, product of the extra dims
  bool has_ignore = false;
  int64_t ignore_index = 0;
  int reduction = 0;  // 0 mean, 1 sum, 2 none
};

// One row's loss term and the weight it counts with in the mean.
struct SceTerm {
  float loss = 0.f;
  float weight = 0.f;
};

// Row r = i * d + j (batch i, position j): writes the row's log-probabilities (the c elements
// logp[i*c*d + k*d + j]) and returns its term. The log-sum-exp subtracts the maximum and sums in
// double. A label that is ignored or outside [0, c) gives loss and weight 0; with no classes
// every label is, and neither scores nor logp are touched.
SALUS_HD SceTerm SceRow(const SceSpec& s, const float* scores, const int64_t* labels,
                        const float* weights, float* logp, int64_t r) {
  SceTerm t;
  if (s.c <= 0) return t;
  const int64_t i = r / s.d, j = r % s.d;
  const int64_t label = labels[r];
  const float* x = scores + i * s.c * s.d + j;
  float* lp = logp + i * s.c * s.d + j;
  float mx = -INFINITY;
  for (int64_t k = 0; k < s.c; ++k) {
    const float v = x[k * s.d];
    mx = mx < v ? v : mx;  // std::max: a NaN after the first element is skipped
  }
  double sum = 0;
  for (int64_t k = 0; k < s.c; ++k) sum += exp(static_cast<double>(x[k * s.d] - mx));
  const float lse = mx + static_cast<float>(log(sum));
  for (int64_t k = 0; k < s.c; ++k) lp[k * s.d] = x[k * s.d] - lse;
  if (!(s.has_ignore && label == s.ignore_index) && label >= 0 && label < s.c) {
    t.weight = weights != nullptr ? weights[label] : 1.f;
    t.loss = -t.weight * lp[label * s.d];
  }
  return t;
}

// The reduced loss from the sums of the rows' terms and weights: the mean (0 when no row
// counts) or the sum. Not for reduction none.
SALUS_HD float SceReduce(const SceSpec& s, double total, double weight_sum) {
  if (s.reduction == 1) return static_cast<float>(total);
  return weight_sum > 0 ? static_cast<float>(total / weight_sum) : 0.f;
}

// ---------------------------------------------------------------------------------------------
// LSTM cell (ONNX gate order i, o, f, c; activations Sigmoid, Tanh, Tanh; no peepholes).

// Note [LSTM vectorisable math]
// The cell's exp and tanh are written as branch-free polynomials (Cephes' expf and tanhf, about
// 2 ulp) rather than libm calls, so that a loop over a row of cells vectorises on the host; the
// CUDA kernels share them. NaN propagates; arguments beyond float's exp range are clamped,
// which changes the sigmoid and tanh only below float's resolution.
SALUS_HD float LstmExp(float x) {
  constexpr float kMaxArg = 88.f, kMinArg = -87.3f;                      // 2^n stays a normal float
  const float xc = x < kMaxArg ? (x > kMinArg ? x : kMinArg) : kMaxArg;  // NaN -> kMaxArg
  // e^x = 2^n * e^r with n = round(x * log2(e)) and |r| <= ln(2) / 2; ln(2) split in two.
  const int32_t n = static_cast<int32_t>(xc * 1.44269504088896341f + (xc >= 0.f ? 0.5f : -0.5f));
  const float nf = static_cast<float>(n);
  const float r = (xc - nf * 0.693359375f) + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (n + 127) * (1 << 23);
  float scale;
  memcpy(&scale, &bits, sizeof(scale));
  return x != x ? x : p * scale;
}

SALUS_HD float LstmSigmoid(float x) { return 1.f / (1.f + LstmExp(-x)); }

SALUS_HD float LstmTanh(float x) {
  constexpr float kSmall = 0.625f;  // below: odd polynomial; above: 1 - 2 / (e^2|x| + 1)
  const float ax = fabsf(x);
  const float z = x * x;
  // Horner's scheme, innermost coefficient first.
  float p = -5.70498872745e-3f * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float big = 1.f - 2.f / (LstmExp(2.f * ax) + 1.f);
  return ax < kSmall ? small : (x < 0.f ? -big : big);
}

// One element of one step: the activated gates, the new cell state and the new hidden state.
struct LstmCellState {
  float i, o, f, g, c, h;
};

// z*: the gates' pre-activations (X·W^T + H·R^T + Wb + Rb); c_prev: the previous cell state.
SALUS_HD LstmCellState LstmCellForward(float zi, float zo, float zf, float zg, float c_prev) {
  LstmCellState s;
  s.i = LstmSigmoid(zi);
  s.o = LstmSigmoid(zo);
  s.f = LstmSigmoid(zf);
  s.g = LstmTanh(zg);
  s.c = s.f * c_prev + s.i * s.g;
  s.h = s.o * LstmTanh(s.c);
  return s;
}

// The gradients of one element's gate pre-activations and previous cell state.
struct LstmCellGrad {
  float zi, zo, zf, zg, c_prev;
};

// Given the step's activated gates, its cell state c, the previous c_prev, and the gradients
// reaching its hidden state (dh: from Y and from the next step) and cell state (dc: from the
// next step, or Y_c at the last step).
SALUS_HD LstmCellGrad LstmCellBackward(float i, float o, float f, float g, float c, float c_prev,
                                       float dh, float dc) {
  const float tc = LstmTanh(c);
  const float dct = dc + dh * o * (1.f - tc * tc);
  LstmCellGrad d;
  d.zi = dct * g * i * (1.f - i);
  d.zo = dh * tc * o * (1.f - o);
  d.zf = dct * c_prev * f * (1.f - f);
  d.zg = dct * i * (1.f - g * g);
  d.c_prev = dct * f;
  return d;
}

// ---------------------------------------------------------------------------------------------
// The tensor ops of exported models (cpu_tensor_kernels.cc): int64 arithmetic, comparisons and
// logic, Mod, Cast, Erf, Gelu, Clip, and the index maps of Gather, Slice and Trilu.

// int64 Add, Sub, Mul and Div. Add, Sub and Mul wrap on overflow (two's complement, as numpy's
// int64) where C++ leaves it undefined. Div truncates toward zero (C's integer division, as
// onnxruntime and the ONNX reference's cast of the quotient); a zero divisor, which the kernels
// reject before computing, gives 0, and INT64_MIN / -1 wraps. Pow has no int64 form here.
SALUS_HD int64_t ApplyBinaryInt64(BinaryOp op, int64_t u, int64_t v) {
  const uint64_t a = static_cast<uint64_t>(u), b = static_cast<uint64_t>(v);
  switch (op) {
    case BinaryOp::kAdd:
      return static_cast<int64_t>(a + b);
    case BinaryOp::kSub:
      return static_cast<int64_t>(a - b);
    case BinaryOp::kMul:
      return static_cast<int64_t>(a * b);
    case BinaryOp::kDiv:
      if (v == 0) return 0;
      if (v == -1) return static_cast<int64_t>(uint64_t{0} - a);
      return u / v;
    case BinaryOp::kPow:
      break;
  }
  return 0;
}

// ONNX Mod. fmod = 1: the remainder of truncated division, with the dividend's sign (C's fmod
// and %); fmod = 0 (integers only): the remainder of floored division, with the divisor's sign
// (Python's %). A zero divisor (rejected by the kernels) gives 0.
SALUS_HD int64_t ModInt64(int64_t u, int64_t v, bool fmod) {
  if (v == 0 || v == -1) return 0;  // -1 divides everything; INT64_MIN % -1 would trap
  int64_t r = u % v;
  if (!fmod && r != 0 && ((r < 0) != (v < 0))) r += v;
  return r;
}
SALUS_HD float ModFloat(float u, float v) { return fmodf(u, v); }

enum class CompareOp : int32_t { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual };

// The op of an ONNX comparison op name; false for any other op.
inline bool CompareOpFor(const std::string& name, CompareOp* op) {
  struct Entry {
    const char* name;
    CompareOp op;
  };
  static constexpr Entry kOps[] = {{"Equal", CompareOp::kEqual},
                                   {"Less", CompareOp::kLess},
                                   {"Greater", CompareOp::kGreater},
                                   {"LessOrEqual", CompareOp::kLessOrEqual},
                                   {"GreaterOrEqual", CompareOp::kGreaterOrEqual}};
  for (const Entry& e : kOps) {
    if (name == e.name) {
      *op = e.op;
      return true;
    }
  }
  return false;
}

// IEEE comparisons for floats: every comparison with NaN is false.
template <typename T>
SALUS_HD bool ApplyCompare(CompareOp op, T u, T v) {
  switch (op) {
    case CompareOp::kEqual:
      return u == v;
    case CompareOp::kLess:
      return u < v;
    case CompareOp::kGreater:
      return u > v;
    case CompareOp::kLessOrEqual:
      return u <= v;
    case CompareOp::kGreaterOrEqual:
      return u >= v;
  }
  return false;
}

// Cast of float to int64 truncates toward zero, as C++ does where it is defined; NaN becomes 0
// and values beyond int64's range saturate, where C++ leaves them undefined.
SALUS_HD int64_t FloatToInt64(float x) {
  constexpr float kTwoTo63 = 9223372036854775808.f;
  constexpr int64_t kMax = 0x7fffffffffffffff;
  if (x != x) return 0;
  if (x >= kTwoTo63) return kMax;
  if (x < -kTwoTo63) return -kMax - 1;
  return static_cast<int64_t>(x);
}

// Gelu (opset 20): approximate "none" is x * Phi(x) through erf; "tanh" is the tanh form.
SALUS_HD float GeluErf(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
SALUS_HD float GeluTanh(float x) {
  constexpr float kSqrtTwoOverPi = 0.79788456080286536f;
  return 0.5f * x * (1.f + tanhf(kSqrtTwoOverPi * (x + 0.044715f * x * x * x)));
}

// Special functions of PyTorch's lgamma, digamma and erfinv (SalusLgamma, SalusDigamma,
// SalusErfinv), computed in double and rounded once.

// log|Gamma(x)|: the C library's, reentrant on the host (lgammaf writes the global signgam).
SALUS_HD float Lgamma(float x) {
#ifdef __CUDA_ARCH__
  return lgammaf(x);
#else
  int sign = 0;
  return lgammaf_r(x, &sign);
#endif
}

// Digamma, psi(x) = Gamma'(x) / Gamma(x): -inf at 0 (+inf at -0), NaN at the negative integers;
// negative x through the reflection psi(x) = psi(1 - x) - pi / tan(pi x), then the recurrence
// psi(x) = psi(x + 1) - 1 / x up to x >= 10, where the asymptotic series
// ln x - 1 / (2x) - sum B_2k / (2k x^2k) (five terms) is exact to about 1e-12.
SALUS_HD float Digamma(float xf) {
  constexpr double kPi = 3.14159265358979323846;
  if (xf == 0.f) return copysignf(INFINITY, -xf);
  double x = xf;
  double result = 0.0;
  if (x < 0.0) {
    if (x == floor(x)) return NAN;
    result = -kPi / tan(kPi * x);
    x = 1.0 - x;
  }
  while (x < 10.0) {
    result -= 1.0 / x;
    x += 1.0;
  }
  const double z = 1.0 / (x * x);
  const double series =
      z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132)))));
  return static_cast<float>(result + log(x) - 0.5 / x - series);
}

// Polygamma, the n-th derivative of digamma (Digamma itself for n = 0; NaN for n < 0):
// (-1)^(n+1) n! zeta(n + 1, x) with Hurwitz's zeta. Its terms (x + k)^-(n+1) are summed while
// x + k < 10, then the rest by Euler-Maclaurin: a^-n / n + a^-(n+1) / 2 and seven Bernoulli
// terms B_2j / (2j)! (n+1)(n+2)...(n+2j-1) a^-(n+2j), a = x + k. At 0 and the negative
// integers it is infinite (+inf for odd n, -inf for even n, as PyTorch's); a negative x
// elsewhere needs no reflection, since the summed terms stay finite there.
SALUS_HD float Polygamma(int n, float xf) {
  if (n == 0) return Digamma(xf);
  if (n < 0 || xf != xf) return NAN;
  const double sign = n % 2 == 1 ? 1.0 : -1.0;
  double q = xf;
  if (q <= 0.0 && q == floor(q)) return static_cast<float>(sign * INFINITY);
  const double s = n + 1.0;
  double factorial = 1.0;
  for (int k = 2; k <= n; ++k) factorial *= k;
  double sum = 0.0;
  while (q < 10.0) {
    sum += pow(q, -s);
    q += 1.0;
  }
  // B_2j / (2j)! for j = 1..7.
  constexpr double kBernoulli[7] = {1.0 / 12,           -1.0 / 720,     1.0 / 30240,
                                    -1.0 / 1209600,     1.0 / 47900160, -691.0 / 1307674368000.0,
                                    1.0 / 74724249600.0};
  double tail = pow(q, 1.0 - s) / (s - 1.0) + 0.5 * pow(q, -s);
  double rising = s;                // s (s + 1) ... (s + 2j - 2)
  double power = pow(q, -s - 1.0);  // q^-(s + 2j - 1)
  const double inverse_square = 1.0 / (q * q);
  for (int j = 1; j <= 7; ++j) {
    tail += kBernoulli[j - 1] * rising * power;
    rising *= (s + 2 * j - 1) * (s + 2 * j);
    power *= inverse_square;
  }
  return static_cast<float>(sign * factorial * (sum + tail));
}

// The inverse of erf on (-1, 1): +-inf at +-1, NaN beyond. A closed-form first guess (within
// about 2e-3 relative: ln(1 - y^2) through two square roots, with the constant 0.147), then
// Newton steps on erf, written through erfc where y is near 1 so that the tail keeps its
// digits.
SALUS_HD float Erfinv(float yf) {
  constexpr double kPi = 3.14159265358979323846;
  constexpr double kTwoOverSqrtPi = 1.12837916709551257;
  if (!(yf >= -1.f && yf <= 1.f)) return NAN;
  const double a = fabs(static_cast<double>(yf));
  if (a == 1.0) return copysignf(INFINITY, yf);
  if (a == 0.0) return yf;
  const double l = log((1.0 - a) * (1.0 + a));
  const double b = 2.0 / (kPi * 0.147) + 0.5 * l;
  double x = sqrt(sqrt(b * b - l / 0.147) - b);
  for (int step = 0; step < 4; ++step) {
    const double f = a < 0.5 ? erf(x) - a : (1.0 - a) - erfc(x);
    x -= f / (kTwoOverSqrtPi * exp(-x * x));
  }
  return copysignf(static_cast<float>(x), yf);
}

// Clip: max(x, lo), then min(., hi), so a NaN x stays NaN and lo > hi gives hi everywhere (ONNX's
// rule).
template <typename T>
SALUS_HD T ApplyClip(T x, T lo, T hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}

// Max and Min propagate NaN (numpy's maximum and minimum).
template <typename T>
SALUS_HD T ApplyMax(T u, T v) {
  return (u > v || u != u) ? u : v;
}
template <typename T>
SALUS_HD T ApplyMin(T u, T v) {
  return (u < v || u != u) ? u : v;
}

// BatchNormalization's view of X: [n, c, s], s the elements of one channel of one sample.
struct BatchNormGeometry {
  int64_t n = 1, c = 1, s = 1;
  SALUS_HD int64_t per_channel() const { return n * s; }
};

// Host-only: the geometry of X of `shape` (N, C, spatial dims...).
inline BatchNormGeometry BatchNormGeometryOf(const std::vector<int64_t>& shape) {
  BatchNormGeometry geo;
  geo.n = shape[0];
  geo.c = shape[1];
  for (size_t d = 2; d < shape.size(); ++d) geo.s *= shape[d];
  return geo;
}

// Gather along one axis: data viewed as [outer, axis_dim, inner], the indices flattened to
// `count`, the output [outer, count, inner].
struct GatherGeometry {
  int64_t outer = 1, axis_dim = 0, inner = 1, count = 0;
};

// The data element output element `o` copies. Negative indices count from the end of the axis;
// the caller has checked every index lies in [-axis_dim, axis_dim).
SALUS_HD int64_t GatherSourceIndex(const GatherGeometry& g, const int64_t* indices, int64_t o) {
  const int64_t i = o % g.inner;
  const int64_t rest = o / g.inner;
  const int64_t j = rest % g.count, b = rest / g.count;
  int64_t index = indices[j];
  if (index < 0) index += g.axis_dim;
  return (b * g.axis_dim + index) * g.inner + i;
}

// GatherElements: the output has the indices' shape, and its element at coordinates c reads the
// data at c with c[axis] replaced by the index there.
struct GatherElementsGeometry {
  int32_t rank = 0;
  int32_t axis = 0;
  int64_t axis_dim = 0;
  int64_t out[kMaxIndexDims] = {};     // the indices' (the output's) dims
  int64_t stride[kMaxIndexDims] = {};  // the data's dense strides
};

// False past kMaxIndexDims dims.
inline bool MakeGatherElementsGeometry(const std::vector<int64_t>& data,
                                       const std::vector<int64_t>& indices, int64_t axis,
                                       GatherElementsGeometry* g) {
  if (data.size() > static_cast<size_t>(kMaxIndexDims) || indices.size() != data.size()) {
    return false;
  }
  g->rank = static_cast<int32_t>(data.size());
  g->axis = static_cast<int32_t>(axis);
  g->axis_dim = data[axis];
  int64_t stride = 1;
  for (int d = g->rank - 1; d >= 0; --d) {
    g->out[d] = indices[d];
    g->stride[d] = stride;
    stride *= data[d];
  }
  return true;
}

// The data element output element `o` copies, for its index `k` in [-axis_dim, axis_dim)
// (negative from the end of the axis; the caller checks the range).
SALUS_HD int64_t GatherElementsSourceIndex(const GatherElementsGeometry& g, int64_t o, int64_t k) {
  if (k < 0) k += g.axis_dim;
  int64_t from = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    const int64_t c = o % g.out[d];
    o /= g.out[d];
    from += (d == g.axis ? k : c) * g.stride[d];
  }
  return from;
}

// ScatterND (reduction none): `count` index tuples of `k` entries each address slices of
// `slice` elements of the data (its dims past the first k); update m replaces slice m's target.
struct ScatterNDGeometry {
  int32_t k = 0;
  int64_t dims[kMaxIndexDims] = {};  // the data's first k dims
  int64_t slice = 1;
  int64_t count = 0;
};

// False past kMaxIndexDims index entries.
inline bool MakeScatterNDGeometry(const std::vector<int64_t>& data,
                                  const std::vector<int64_t>& indices, ScatterNDGeometry* g) {
  if (indices.empty()) return false;
  const int64_t k = indices.back();
  if (k < 0 || k > static_cast<int64_t>(data.size()) || k > kMaxIndexDims) return false;
  g->k = static_cast<int32_t>(k);
  g->slice = 1;
  for (size_t d = 0; d < data.size(); ++d) {
    if (static_cast<int64_t>(d) < k) {
      g->dims[d] = data[d];
    } else {
      g->slice *= data[d];
    }
  }
  g->count = 1;
  for (size_t d = 0; d + 1 < indices.size(); ++d) g->count *= indices[d];
  return true;
}

// The slice index tuple `index` (k entries, negative from the end of their dims) addresses, or
// -1 when an entry is out of range.
SALUS_HD int64_t ScatterNDTarget(const ScatterNDGeometry& g, const int64_t* index) {
  int64_t at = 0;
  for (int d = 0; d < g.k; ++d) {
    int64_t i = index[d];
    if (i < -g.dims[d] || i >= g.dims[d]) return -1;
    if (i < 0) i += g.dims[d];
    at = at * g.dims[d] + i;
  }
  return at;
}

// Slice with every start clamped into its dim and the output dims computed (shape inference):
// output index i of a dim reads input index start + i * step of it.
struct SliceMap {
  int32_t rank = 0;
  int64_t base = 0;  // input offset of output element 0
  int64_t out[kMaxIndexDims] = {};
  int64_t step[kMaxIndexDims] = {};  // input elements per output step, per dim
};

SALUS_HD int64_t SliceOutputCount(const SliceMap& m) {
  int64_t count = 1;
  for (int d = 0; d < m.rank; ++d) count *= m.out[d];
  return count;
}

SALUS_HD int64_t SliceSourceIndex(const SliceMap& m, int64_t o) {
  int64_t src = m.base;
  for (int d = m.rank - 1; d >= 0; --d) {
    src += (o % m.out[d]) * m.step[d];
    o /= m.out[d];
  }
  return src;
}

// The map of a slice of `in` (dense row-major) from `starts` by `steps` to `out` dims. Output
// dims of size 1 fold into the base offset; a dim with step 1 merges into the next inner one
// when that one is read whole and contiguously. An empty output is one dim of size 0. False when
// more than kMaxIndexDims dims remain.
inline bool MakeSliceMap(const std::vector<int64_t>& in, const std::vector<int64_t>& starts,
                         const std::vector<int64_t>& steps, const std::vector<int64_t>& out,
                         SliceMap* m) {
  *m = SliceMap{};
  for (int64_t d : out) {
    if (d == 0) {
      m->rank = 1;
      return true;
    }
  }
  struct Group {
    int64_t in, out, start, step, stride;  // stride: input elements per index of the group
  };
  std::vector<Group> groups;  // innermost first
  int64_t stride = 1;
  for (int d = static_cast<int>(in.size()) - 1; d >= 0; --d) {
    if (out[d] == 1) {
      m->base += starts[d] * stride;
    } else if (!groups.empty() && steps[d] == 1 && groups.back().start == 0 &&
               groups.back().step == 1 && groups.back().out == groups.back().in &&
               groups.back().stride * groups.back().in == stride) {
      Group& g = groups.back();
      g.start = starts[d] * g.in;
      g.out *= out[d];
      g.in *= in[d];
    } else {
      groups.push_back({in[d], out[d], starts[d], steps[d], stride});
    }
    stride *= in[d];
  }
  if (groups.size() > static_cast<size_t>(kMaxIndexDims)) return false;
  m->rank = static_cast<int32_t>(groups.size());
  for (int d = 0; d < m->rank; ++d) {
    const Group& g = groups[groups.size() - 1 - d];
    m->base += g.start * g.stride;
    m->out[d] = g.out;
    m->step[d] = g.step * g.stride;
  }
  return true;
}

// Trilu keeps element (row, col) of each matrix when it lies on or above diagonal k (upper) or
// on or below it (lower); the rest is zero.
SALUS_HD bool TriluKeeps(int64_t row, int64_t col, int64_t k, bool upper) {
  return upper ? col - row >= k : col - row <= k;
}

// ---------------------------------------------------------------------------------------------
// Dropout's mask in training.
//
// Note [Dropout mask]: element e of a Dropout node's output in iteration t is kept unless a
// counter-based hash of (seed, stream, t, e) falls below the ratio; `stream` numbers the
// model's Dropout nodes in graph order. The mask is a pure function of those four numbers, so
// any device computes it for any element in any order, runs with the same seed repeat exactly,
// and nothing but the iteration counter (persistent memory, incremented by the kernel) carries
// over between iterations. The hash is splitmix64's finaliser chained over the four keys.

SALUS_HD uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The key of one node's mask in one iteration; DropoutKeeps hashes it with the element index.
SALUS_HD uint64_t DropoutKey(uint64_t seed, uint64_t stream, uint64_t iteration) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ stream) ^ iteration);
}

// Whether element `e` survives: its hash as a uniform in [0, 1) with 24 bits, against `ratio`.
SALUS_HD bool DropoutKeeps(uint64_t key, uint64_t e, float ratio) {
  const float u = static_cast<float>(SplitMix64(key ^ e) >> 40) * (1.0f / 16777216.0f);
  return u >= ratio;
}

// The scale of kept elements, 1 / (1 - ratio); 0 when everything is dropped (ratio 1).
SALUS_HD float DropoutScale(float ratio) { return ratio < 1.f ? 1.f / (1.f - ratio) : 0.f; }

// ---------------------------------------------------------------------------------------------
// Gradients of the tensor ops (cpu_tensor_grad_kernels.cc), per element.

enum class UnaryGradOp : int32_t { kErf, kGeluErf, kGeluTanh, kReciprocal };

// dy times the derivative of the op at x.
SALUS_HD float UnaryGrad(UnaryGradOp op, float x, float dy) {
  constexpr float kTwoOverSqrtPi = 1.12837916709551257f;
  constexpr float kInvSqrtTwoPi = 0.39894228040143268f;
  constexpr float kSqrtTwoOverPi = 0.79788456080286536f;
  switch (op) {
    case UnaryGradOp::kErf:
      return dy * kTwoOverSqrtPi * expf(-x * x);
    case UnaryGradOp::kGeluErf: {
      const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
      return dy * (cdf + x * kInvSqrtTwoPi * expf(-0.5f * x * x));
    }
    case UnaryGradOp::kGeluTanh: {
      const float t = tanhf(kSqrtTwoOverPi * (x + 0.044715f * x * x * x));
      const float du = kSqrtTwoOverPi * (1.f + 3.f * 0.044715f * x * x);
      return dy * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du);
    }
    case UnaryGradOp::kReciprocal:
      return -dy / (x * x);
  }
  return 0.f;
}

// Which input of Clip an element's gradient goes to: 0 (X) where x lies in [lo, hi] (bounds
// included, as torch.clamp), 1 (min) below, 2 (max) above or everywhere where lo > hi (ONNX's
// output is then max).
SALUS_HD int ClipGradTarget(float x, float lo, float hi) {
  if (lo > hi || x > hi) return 2;
  return x < lo ? 1 : 0;
}

// Min/Max route the gradient to the first input attaining the extreme: whether `v` replaces
// the best so far.
SALUS_HD bool MinMaxReplaces(bool is_max, float v, float best) {
  return is_max ? v > best : v < best;
}

// d(x^e)/dx = e * x^(e-1), 0 where e is 0 (x^0 is constant, 0^0 included).
SALUS_HD float PowGradBase(float x, float e) { return e == 0.f ? 0.f : e * powf(x, e - 1.f); }
// d(x^e)/de = x^e * ln(x) for x > 0; 0 elsewhere, where x^e is real only at integral e.
SALUS_HD float PowGradExponent(float x, float e) { return x > 0.f ? powf(x, e) * logf(x) : 0.f; }

// ArgMax along one axis of x seen as [outer, axis_dim, inner] (SalusArgMax, TensorFlow's
// ArgMax): output element o = (outer index, inner index) is the first index along the axis of
// the largest element; a NaN counts as the largest (the first NaN wins).
struct ArgMaxGeometry {
  int64_t outer = 1, axis_dim = 1, inner = 1;
};
template <typename T>
SALUS_HD int64_t ArgMaxAt(const ArgMaxGeometry& g, const T* x, int64_t o) {
  const int64_t i = o % g.inner, base = (o / g.inner) * g.axis_dim * g.inner + i;
  int64_t best = 0;
  T best_value = x[base];
  for (int64_t a = 1; a < g.axis_dim; ++a) {
    const T v = x[base + a * g.inner];
    if (best_value != best_value) break;  // NaN already
    if (v > best_value || v != v) {
      best = a;
      best_value = v;
    }
  }
  return best;
}

// SalusSort's order, PyTorch's stable sort: a NaN is the largest value, and equal values keep
// their order along the axis. Element (a, ia) comes before (b, ib) when its value is smaller
// (larger if descending), or equal with the smaller index. The order is strict and total, so
// each element's rank is the number of elements before it: the CPU sorts by it, the CUDA
// kernel counts it (no two elements share a rank, so results are exact and repeat).
template <typename T>
SALUS_HD bool SortsAbove(T a, T b) {  // a > b, a NaN above every number
  return a != a ? b == b : (b == b && a > b);
}
template <typename T>
SALUS_HD bool SortsBefore(T a, int64_t ia, T b, int64_t ib, bool descending) {
  if (descending ? SortsAbove(a, b) : SortsAbove(b, a)) return true;
  if (descending ? SortsAbove(b, a) : SortsAbove(a, b)) return false;
  return ia < ib;
}

}  // namespace salus::exec
