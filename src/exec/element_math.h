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
//     final reduction.
// tests/unit/exec/element_math_test.cc runs these over whole tensors on the host against the CPU
// executable, which is how the CUDA kernels' logic is checked on a machine without a GPU.
//
// C++17 with no project header beyond hd.h: nvcc compiles elementwise.cu, which includes this.
// Host-only builders (plain `inline`, taking std::vector) sit beside the SALUS_HD functions.
#pragma once

#include <cmath>
#include <cstdint>
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

}  // namespace salus::exec
