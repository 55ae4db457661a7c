// Per-element math of the backward and optimizer kernels that both devices compute by hand, so
// that the CPU (cpu_grad_kernels.cc) and CUDA (cuda/grad.cu) kernels share one definition:
//   - the eltwise gradients (SalusEltwiseGrad), as oneDNN's eltwise backward from the forward
//     input computes them on the CPU;
//   - SalusSumTo's map (an output element's offset in the input, and the offsets it sums);
//   - the SoftmaxCrossEntropyLoss gradient per element;
//   - the SGD and Adam updates per element.
// tests/unit/exec/grad_math_test.cc runs them over whole tensors on the host against the CPU
// executable, which is how the CUDA kernels' logic is checked on a machine without a GPU.
//
// C++17 with no project header beyond hd.h and element_math.h: nvcc compiles grad.cu, which
// includes this.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/element_math.h"
#include "exec/hd.h"

namespace salus::exec {

// ---------------------------------------------------------------------------------------------
// Eltwise gradients.

enum class EltwiseGradOp : int32_t {
  kRelu,  // and LeakyRelu, with alpha its slope
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kSqrt,
  kAbs,
  kElu,
  kSoftplus
};

// The gradient op of a forward op name (SalusEltwiseGrad's forward_op) and its alpha; false
// for any other op.
inline bool EltwiseGradOpFor(const std::string& forward, float leaky_alpha, float elu_alpha,
                             EltwiseGradOp* op, float* alpha) {
  struct Entry {
    const char* name;
    EltwiseGradOp op;
  };
  static constexpr Entry kOps[] = {
      {"Relu", EltwiseGradOp::kRelu},       {"LeakyRelu", EltwiseGradOp::kRelu},
      {"Sigmoid", EltwiseGradOp::kSigmoid}, {"Tanh", EltwiseGradOp::kTanh},
      {"Exp", EltwiseGradOp::kExp},         {"Log", EltwiseGradOp::kLog},
      {"Sqrt", EltwiseGradOp::kSqrt},       {"Abs", EltwiseGradOp::kAbs},
      {"Elu", EltwiseGradOp::kElu},         {"Softplus", EltwiseGradOp::kSoftplus}};
  for (const Entry& e : kOps) {
    if (forward == e.name) {
      *op = e.op;
      *alpha = forward == "LeakyRelu" ? leaky_alpha : forward == "Elu" ? elu_alpha : 0.f;
      return true;
    }
  }
  return false;
}

// dy times the derivative of the forward op at x. At the kinks the CPU's choices: Relu's
// gradient at 0 is alpha * dy (0 for Relu), Abs's is 0.
SALUS_HD float ApplyEltwiseGrad(EltwiseGradOp op, float alpha, float x, float dy) {
  switch (op) {
    case EltwiseGradOp::kRelu:
      return x > 0.f ? dy : dy * alpha;
    case EltwiseGradOp::kSigmoid: {
      const float s = 1.f / (1.f + expf(-x));
      return dy * s * (1.f - s);
    }
    case EltwiseGradOp::kTanh: {
      const float t = tanhf(x);
      return dy * (1.f - t * t);
    }
    case EltwiseGradOp::kExp:
      return dy * expf(x);
    case EltwiseGradOp::kLog:
      return dy / x;
    case EltwiseGradOp::kSqrt:
      return dy / (2.f * sqrtf(x));
    case EltwiseGradOp::kAbs:
      return x > 0.f ? dy : (x < 0.f ? -dy : 0.f);
    case EltwiseGradOp::kElu:
      return x > 0.f ? dy : dy * alpha * expf(x);
    case EltwiseGradOp::kSoftplus:
      return dy / (1.f + expf(-x));
  }
  return 0.f;
}

// ---------------------------------------------------------------------------------------------
// SalusSumTo: y = scale * (x summed over the dims it was broadcast along).

// `out` walks y's elements in order, giving each one's offset in x (operand 0); `reduced` walks
// the elements summed into it, as offsets from there. Both are IndexMaps over operand 0 only.
struct SumToMap {
  IndexMap out;
  IndexMap reduced;
};

// x of shape `in` summed to `out` (numpy broadcasting: out, padded with leading 1s to in's rank,
// has each dim equal to in's or 1). False when a map needs more than kMaxIndexDims dims.
inline bool MakeSumToMap(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                         SumToMap* m) {
  const size_t rank = in.size();
  std::vector<int64_t> padded(rank, 1);
  for (size_t i = 0; i < out.size() && i < rank; ++i) padded[rank - out.size() + i] = out[i];
  std::vector<int64_t> stride(rank, 1);
  for (int d = static_cast<int>(rank) - 2; d >= 0; --d) stride[d] = stride[d + 1] * in[d + 1];
  std::vector<int64_t> out_strides(rank, 0), red_dims(rank, 1), red_strides(rank, 0);
  for (size_t d = 0; d < rank; ++d) {
    if (padded[d] == in[d]) {
      out_strides[d] = stride[d];
    } else {
      red_dims[d] = in[d];
      red_strides[d] = stride[d];
    }
  }
  return MakeIndexMap(padded, {out_strides}, &m->out) &&
         MakeIndexMap(red_dims, {red_strides}, &m->reduced);
}

// Walks the rows of an index map (every dim but its last, in row-major order) without a
// division: `at` holds the row's index in dims 0..rank-2 (zero to start) and `offset` the
// row's first element's offset in operand 0 (MapIndex(m, row * dims[rank - 1])[0]); both are
// advanced to the next row. The GPU's long sums walk rows this way (Note [Long sums] in
// grad.cu).
SALUS_HD void NextRow(const IndexMap& m, int64_t at[kMaxIndexDims], int64_t* offset) {
  for (int d = m.rank - 2; d >= 0; --d) {
    *offset += m.strides[0][d];
    if (++at[d] < m.dims[d]) return;
    *offset -= m.strides[0][d] * m.dims[d];
    at[d] = 0;
  }
}

// Where NextRow stands after `row` steps from the first row (at zero): the row's index in dims
// 0..rank-2 into `at`, its first element's offset in operand 0 into `offset`. A block that
// starts its walk in the middle of the rows takes these divisions once (Note [Split sums]).
SALUS_HD void RowAt(const IndexMap& m, int64_t row, int64_t at[kMaxIndexDims], int64_t* offset) {
  *offset = 0;
  for (int d = 0; d < kMaxIndexDims; ++d) at[d] = 0;
  for (int d = m.rank - 2; d >= 0; --d) {
    at[d] = row % m.dims[d];
    row /= m.dims[d];
    *offset += at[d] * m.strides[0][d];
  }
}

// Part i of `parts` nearly equal, contiguous parts of [0, n): [*lo, *hi).
SALUS_HD void PartRange(int64_t n, int64_t parts, int64_t i, int64_t* lo, int64_t* hi) {
  *lo = n * i / parts;
  *hi = n * (i + 1) / parts;
}

// Note [Split sums]: how the GPU cuts each output's long sum into parts, each summed by one
// block into a partial, the partials then added in part order by the output's thread. The cut
// depends on the shapes alone (never on the device), so results are bit-identical from run to
// run and between GPUs. By rows (the reduced map's innermost dim holds at least a block's
// worth of elements): row_parts groups of whole rows, each row cut into col_parts column
// ranges, part p = (p / col_parts)-th row group and (p % col_parts)-th column range. Otherwise
// row_parts contiguous ranges of the reduced elements in row-major order (col_parts is 1).
struct SumSplit {
  bool by_rows = false;
  int64_t row_parts = 1;
  int64_t col_parts = 1;
};

// Enough blocks to fill a large GPU several times over, each summing at least
// kSumSplitMinElements elements.
inline constexpr int64_t kSumSplitBlocks = 1024;
inline constexpr int64_t kSumSplitMinElements = 1024;

// The split of `m`'s sums for blocks of `block_threads` threads.
inline SumSplit PlanSumSplit(const SumToMap& m, int64_t block_threads) {
  SumSplit s;
  const int64_t count = IndexMapCount(m.out);
  const int64_t reduced = IndexMapCount(m.reduced);
  if (count <= 0 || reduced <= 0) return s;
  const int64_t inner = m.reduced.rank > 0 ? m.reduced.dims[m.reduced.rank - 1] : 1;
  const int64_t most = reduced / kSumSplitMinElements > 1 ? reduced / kSumSplitMinElements : 1;
  int64_t want = (kSumSplitBlocks + count - 1) / count;
  if (want > most) want = most;
  s.by_rows = inner >= block_threads;
  if (!s.by_rows) {
    s.row_parts = want;
    return s;
  }
  const int64_t rows = reduced / inner;
  s.row_parts = want < rows ? want : rows;
  const int64_t col_most = inner / block_threads;
  const int64_t col_want = (want + s.row_parts - 1) / s.row_parts;
  s.col_parts = col_want < col_most ? col_want : col_most;
  return s;
}

// Output element o: the sum in double over the reduced elements in row-major order, times scale.
SALUS_HD float SumToAt(const SumToMap& m, float scale, const float* x, int64_t o) {
  int64_t base[kMaxIndexOperands], off[kMaxIndexOperands];
  MapIndex(m.out, o, base);
  const int64_t count = IndexMapCount(m.reduced);
  double sum = 0;
  for (int64_t r = 0; r < count; ++r) {
    MapIndex(m.reduced, r, off);
    sum += x[base[0] + off[0]];
  }
  return static_cast<float>(sum) * scale;
}

// ---------------------------------------------------------------------------------------------
// SoftmaxCrossEntropyLoss gradient (SalusSoftmaxCrossEntropyGrad).

// Whether row r's label counts (not ignored, in [0, c)).
SALUS_HD bool SceLabelCounts(const SceSpec& s, int64_t label) {
  return !(s.has_ignore && label == s.ignore_index) && label >= 0 && label < s.c;
}

// The factor of row r's gradient: dLoss (per row for reduction none) times the label's weight,
// over the weight sum for the mean (0 when no row counts); 0 for a row that does not count.
SALUS_HD float SceGradCoef(const SceSpec& s, const int64_t* labels, const float* weights,
                           const float* dloss, double weight_sum, int64_t r) {
  const int64_t l = labels[r];
  if (!SceLabelCounts(s, l)) return 0.f;
  const float w = weights != nullptr ? weights[l] : 1.f;
  if (s.reduction == 2) return dloss[r] * w;
  if (s.reduction == 1) return dloss[0] * w;
  return weight_sum > 0 ? static_cast<float>(dloss[0] * w / weight_sum) : 0.f;
}

// dScores at idx = i*c*d + k*d + j from the log-probabilities: coef * (p - [k == label]).
SALUS_HD float SceGradAt(const SceSpec& s, const float* logp, const int64_t* labels, float coef,
                         int64_t idx) {
  const int64_t j = idx % s.d;
  const int64_t k = (idx / s.d) % s.c;
  const int64_t i = idx / (s.c * s.d);
  const int64_t l = labels[i * s.d + j];
  return coef * (expf(logp[idx]) - (k == l ? 1.f : 0.f));
}

// ---------------------------------------------------------------------------------------------
// Optimizer updates, in place, per element.

struct SgdHyper {
  float momentum = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
};

// p -= lr * d with d = grad + wd * p, through the velocity v when there is momentum (v null
// otherwise); torch.optim.SGD's update.
SALUS_HD void SgdStep(const SgdHyper& h, float lr, float* p, const float* grad, float* v,
                      int64_t i) {
  float d = grad[i] + h.weight_decay * p[i];
  if (v != nullptr) {
    v[i] = h.momentum * v[i] + d;
    d = h.nesterov ? d + h.momentum * v[i] : v[i];
  }
  p[i] -= lr * d;
}

struct AdamHyper {
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  float weight_decay = 0.f;            // L2, added to the gradient (torch.optim.Adam)
  float decoupled_weight_decay = 0.f;  // p -= lr * wd * p first (torch.optim.AdamW)
  bool decoupled = false;
};

// What an Adam step computes once from the step count (already advanced) and the rate.
struct AdamScalars {
  double c1 = 1, c2 = 1;  // the bias corrections 1 - beta^step
  float lr = 0.f;
  float decay = 1.f;  // 1 - lr * decoupled weight decay
};

SALUS_HD AdamScalars AdamScalarsFor(const AdamHyper& h, float step, float lr) {
  AdamScalars s;
  s.c1 = 1.0 - pow(static_cast<double>(h.beta1), static_cast<double>(step));
  s.c2 = 1.0 - pow(static_cast<double>(h.beta2), static_cast<double>(step));
  s.lr = lr;
  s.decay = 1.f - lr * h.decoupled_weight_decay;
  return s;
}

SALUS_HD void AdamStep(const AdamHyper& h, const AdamScalars& s, float* p, const float* grad,
                       float* m, float* v, int64_t i) {
  if (h.decoupled) p[i] *= s.decay;
  const float d = grad[i] + h.weight_decay * p[i];
  m[i] = h.beta1 * m[i] + (1 - h.beta1) * d;
  v[i] = h.beta2 * v[i] + (1 - h.beta2) * d * d;
  const double mh = m[i] / s.c1, vh = v[i] / s.c2;
  p[i] -= static_cast<float>(s.lr * mh / (sqrt(vh) + h.epsilon));
}

}  // namespace salus::exec
