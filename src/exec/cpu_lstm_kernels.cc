// The CPU kernels of the ONNX LSTM op: forward ("LSTM") and backward ("SalusLstmGrad").
//
// Both run on oneDNN's LSTM primitives (Note [LSTM on oneDNN]) where oneDNN takes the
// configuration, and otherwise on the loops below.
//
// Forward, per direction: one sgemm computes the input projections of every time step at once
// (X·W^T, rows in X's order), the biases are added, and then each step runs one sgemm that adds
// the recurrent projection (h·R^T) to that step's rows in place, and a loop over the cell
// (element_math.h's LstmCellForward; Note [LSTM cell rows]).
//
// Backward (Note [LSTM backward]): the kernel recomputes the forward into its scratch, keeping
// every step's activated gates, cell state and previous hidden state, then walks the steps
// backwards (BPTT), overwriting each step's gates with the gradients of their pre-activations
// (dG). With dG of every step in X's row order, dX, dW and dR are one sgemm each over all
// steps, and dB is a column sum. Both loops are deterministic: fixed loop orders, and sgemm
// with a fixed thread count.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "exec/alignment.h"
#include "exec/dnnl_kernel.h"
#include "exec/element_math.h"
#include "exec/kernel_registry.h"
#include "exec/lstm.h"
#include "exec/scratch_layout.h"

namespace salus::exec {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// Row-major C = op(A)·op(B) + beta·C through oneDNN's sgemm; empty products handled here.
Status Sgemm(const std::string& who, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc) {
  if (m == 0 || n == 0) return OkStatus();
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    }
    return OkStatus();
  }
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.f, a,
                                      lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) {
    return InternalError(who + ": dnnl_sgemm failed with status " +
                         std::to_string(static_cast<int>(st)));
  }
  return OkStatus();
}

// Note [LSTM cell rows]
// A step's cell math runs one batch row at a time over the H elements of each gate block, a
// loop the compiler vectorises (Note [LSTM vectorisable math]). The rows of a step are split
// over OpenMP threads once a step has enough elements to pay for it.

// Cell elements per step below which a step's rows run on one thread.
constexpr int64_t kMinParallelCells = 16384;

// One batch row of one forward step: z holds the row's pre-activations (blocks i, o, f, c of
// `hs`) and is overwritten by the activated gates; c and h are updated in place.
void CellForwardRow(int64_t hs, float* z, float* c, float* h) {
  float* zi = z;
  float* zo = z + hs;
  float* zf = z + 2 * hs;
  float* zg = z + 3 * hs;
#pragma omp simd
  for (int64_t j = 0; j < hs; ++j) {
    const LstmCellState cell = LstmCellForward(zi[j], zo[j], zf[j], zg[j], c[j]);
    zi[j] = cell.i;
    zo[j] = cell.o;
    zf[j] = cell.f;
    zg[j] = cell.g;
    c[j] = cell.c;
    h[j] = cell.h;
  }
}

// One batch row of one backward step: z holds the row's activated gates and is overwritten by
// the gradients of their pre-activations; dh is the gradient reaching the row's hidden state,
// dc that reaching its cell state, replaced by the gradient of the previous cell state.
void CellBackwardRow(int64_t hs, float* z, const float* c, const float* c_prev, const float* dh,
                     float* dc) {
  float* zi = z;
  float* zo = z + hs;
  float* zf = z + 2 * hs;
  float* zg = z + 3 * hs;
#pragma omp simd
  for (int64_t j = 0; j < hs; ++j) {
    const LstmCellGrad grad =
        LstmCellBackward(zi[j], zo[j], zf[j], zg[j], c[j], c_prev[j], dh[j], dc[j]);
    zi[j] = grad.zi;
    zo[j] = grad.zo;
    zf[j] = grad.zf;
    zg[j] = grad.zg;
    dc[j] = grad.c_prev;
  }
}

// Gx = X·W_d^T + Wb_d + Rb_d for every row of X: [rows, 4H] in X's row order.
Status InputProjection(const std::string& who, const LstmSpec& s, int64_t d, const float* x,
                       const float* w, const float* bias, float* gx) {
  const int64_t rows = s.seq * s.batch, g4 = 4 * s.hidden;
  SALUS_RETURN_IF_ERROR(Sgemm(who, false, true, rows, g4, s.input, x, s.input, w + d * g4 * s.input,
                              s.input, 0.f, gx, g4));
  if (bias == nullptr) return OkStatus();
  const float* wb = bias + d * 2 * g4;
  const float* rb = wb + g4;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < g4; ++k) gx[r * g4 + k] += wb[k] + rb[k];
  }
  return OkStatus();
}

// Copies direction d's slice of an initial state (or zeros) into a [batch, H] buffer.
void LoadState(const LstmSpec& s, int64_t d, const float* state, float* out) {
  const int64_t h = s.hidden;
  for (int64_t b = 0; b < s.batch; ++b) {
    if (state != nullptr) {
      std::memcpy(out + b * h, state + s.StateOffset(d, b), h * sizeof(float));
    } else {
      std::memset(out + b * h, 0, h * sizeof(float));
    }
  }
}

void StoreState(const LstmSpec& s, int64_t d, const float* in, float* state) {
  if (state == nullptr) return;
  for (int64_t b = 0; b < s.batch; ++b) {
    std::memcpy(state + s.StateOffset(d, b), in + b * s.hidden, s.hidden * sizeof(float));
  }
}

// Inputs (X, W, R, B, sequence_lens, initial_h, initial_c, P); outputs (Y, Y_h, Y_c).
class LstmKernel : public Kernel {
 public:
  LstmKernel(std::string who, const LstmSpec& spec) : who_(std::move(who)), s_(spec) {
    const int64_t g4 = 4 * s_.hidden;
    gx_ = layout_.Add(s_.seq * s_.batch * g4);
    h_ = layout_.Add(s_.batch * s_.hidden);
    c_ = layout_.Add(s_.batch * s_.hidden);
  }
  size_t scratch_bytes() const override { return layout_.bytes(); }

  Status Run(const KernelArgs& a) override {
    const float* x = static_cast<const float*>(a.inputs[0]);
    const float* w = static_cast<const float*>(a.inputs[1]);
    const float* r = static_cast<const float*>(a.inputs[2]);
    const float* bias = s_.has_b ? static_cast<const float*>(a.inputs[3]) : nullptr;
    const float* h0 = s_.has_h0 ? static_cast<const float*>(a.inputs[5]) : nullptr;
    const float* c0 = s_.has_c0 ? static_cast<const float*>(a.inputs[6]) : nullptr;
    auto out = [&](size_t i) {
      return i < a.outputs.size() ? static_cast<float*>(a.outputs[i]) : nullptr;
    };
    float* y = out(0);
    float* gx = ScratchLayout::At(a.scratch, gx_);
    float* h = ScratchLayout::At(a.scratch, h_);
    float* c = ScratchLayout::At(a.scratch, c_);
    const int64_t hs = s_.hidden, g4 = 4 * hs, batch = s_.batch;
    // Rows of gx apart of batch entries b and b+1 at one time step.
    const int64_t ldz = (s_.batch_major ? s_.seq : 1) * g4;
    const bool parallel = batch * hs >= kMinParallelCells;
    for (int64_t d = 0; d < s_.dirs; ++d) {
      SALUS_RETURN_IF_ERROR(InputProjection(who_, s_, d, x, w, bias, gx));
      LoadState(s_, d, h0, h);
      LoadState(s_, d, c0, c);
      const float* rd = r + d * g4 * hs;
      for (int64_t step = 0; step < s_.seq; ++step) {
        const int64_t t = s_.Backwards(d) ? s_.seq - 1 - step : step;
        float* zt = gx + s_.Row(t, 0) * g4;
        SALUS_RETURN_IF_ERROR(Sgemm(who_, false, true, batch, g4, hs, h, hs, rd, hs, 1.f, zt, ldz));
#pragma omp parallel for if (parallel)
        for (int64_t b = 0; b < batch; ++b) {
          CellForwardRow(hs, zt + b * ldz, c + b * hs, h + b * hs);
          if (y != nullptr) std::memcpy(y + s_.YOffset(t, d, b), h + b * hs, hs * sizeof(float));
        }
      }
      StoreState(s_, d, h, out(1));
      StoreState(s_, d, c, out(2));
    }
    return OkStatus();
  }

 private:
  std::string who_;
  LstmSpec s_;
  ScratchLayout layout_;
  size_t gx_, h_, c_;
};

// Note [LSTM backward]
// Scratch, reused by each direction in turn: `act` [rows, 4H] holds the input projections,
// then each step's activated gates (i, o, f, g), then each step's dG; `cs` [rows, H] each
// step's cell state and `hp` [rows, H] each step's previous hidden state, all in X's row order;
// plus [batch, *] buffers for the running states and gradients. A step's gates are overwritten
// by its dG only once its backward step is done with them; the backward step of time t needs
// the cell state of the step before it (from `cs`, or the initial state). The recurrent
// gradient dh_{t-1} = dG_t·R is one sgemm per step over the rows of time t, which are
// contiguous in layout 0 and `seq` rows apart in layout 1. dX accumulates over directions.
//
// Inputs (X, W, R, B, initial_h, initial_c, dY, dY_h, dY_c); outputs (dX, dW, dR, dB,
// d_initial_h, d_initial_c).
class LstmGradKernel : public Kernel {
 public:
  LstmGradKernel(std::string who, const LstmSpec& spec) : who_(std::move(who)), s_(spec) {
    const int64_t rows = s_.seq * s_.batch, g4 = 4 * s_.hidden, hb = s_.batch * s_.hidden;
    act_ = layout_.Add(rows * g4);
    cs_ = layout_.Add(rows * s_.hidden);
    hp_ = layout_.Add(rows * s_.hidden);
    h_ = layout_.Add(hb);
    c_ = layout_.Add(hb);
    dh_ = layout_.Add(hb);
    dc_ = layout_.Add(hb);
    db_sum_ = layout_.Add(2 * g4);  // g4 doubles
  }
  size_t scratch_bytes() const override { return layout_.bytes(); }

  Status Run(const KernelArgs& a) override {
    auto in = [&](size_t i) {
      return i < a.inputs.size() ? static_cast<const float*>(a.inputs[i]) : nullptr;
    };
    auto out = [&](size_t i) {
      return i < a.outputs.size() ? static_cast<float*>(a.outputs[i]) : nullptr;
    };
    const float *x = in(0), *w = in(1), *r = in(2), *bias = in(3), *h0 = in(4), *c0 = in(5);
    const float *dy = in(6), *dy_h = in(7), *dy_c = in(8);
    float *dx = out(0), *dw = out(1), *dr = out(2), *db = out(3), *dh0 = out(4), *dc0 = out(5);
    float* act = ScratchLayout::At(a.scratch, act_);
    float* cs = ScratchLayout::At(a.scratch, cs_);
    float* hp = ScratchLayout::At(a.scratch, hp_);
    float* h = ScratchLayout::At(a.scratch, h_);
    float* c = ScratchLayout::At(a.scratch, c_);
    float* dh = ScratchLayout::At(a.scratch, dh_);
    float* dc = ScratchLayout::At(a.scratch, dc_);
    double* db_sum = reinterpret_cast<double*>(ScratchLayout::At(a.scratch, db_sum_));
    const int64_t hs = s_.hidden, g4 = 4 * hs, rows = s_.seq * s_.batch, batch = s_.batch;
    // Rows apart of batch entries b and b+1 at one time step.
    const int64_t row_stride = s_.batch_major ? s_.seq : 1;
    const int64_t ldz = row_stride * g4;
    const bool parallel = batch * hs >= kMinParallelCells;
    for (int64_t d = 0; d < s_.dirs; ++d) {
      const float* rd = r + d * g4 * hs;
      const bool backwards = s_.Backwards(d);
      auto time_of = [&](int64_t step) { return backwards ? s_.seq - 1 - step : step; };

      // Recompute the forward, keeping what the backward steps need.
      SALUS_RETURN_IF_ERROR(InputProjection(who_, s_, d, x, w, bias, act));
      LoadState(s_, d, h0, h);
      LoadState(s_, d, c0, c);
      for (int64_t step = 0; step < s_.seq; ++step) {
        const int64_t t = time_of(step);
        float* zt = act + s_.Row(t, 0) * g4;
        SALUS_RETURN_IF_ERROR(Sgemm(who_, false, true, batch, g4, hs, h, hs, rd, hs, 1.f, zt, ldz));
#pragma omp parallel for if (parallel)
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t row = s_.Row(t, b);
          float* hb = h + b * hs;
          float* cb = c + b * hs;
          std::memcpy(hp + row * hs, hb, hs * sizeof(float));
          CellForwardRow(hs, act + row * g4, cb, hb);
          std::memcpy(cs + row * hs, cb, hs * sizeof(float));
        }
      }

      // Backpropagate through time.
      LoadState(s_, d, dy_h, dh);
      LoadState(s_, d, dy_c, dc);
      LoadState(s_, d, c0, c);  // the cell state before the first step
      for (int64_t step = s_.seq - 1; step >= 0; --step) {
        const int64_t t = time_of(step);
#pragma omp parallel for if (parallel)
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t row = s_.Row(t, b);
          const float* cprev = step > 0 ? cs + s_.Row(time_of(step - 1), b) * hs : c + b * hs;
          float* dhb = dh + b * hs;
          if (dy != nullptr) {
            const float* dyb = dy + s_.YOffset(t, d, b);
            for (int64_t j = 0; j < hs; ++j) dhb[j] += dyb[j];
          }
          CellBackwardRow(hs, act + row * g4, cs + row * hs, cprev, dhb, dc + b * hs);
        }
        // dh_{t-1} = dG_t·R over the rows of time t.
        SALUS_RETURN_IF_ERROR(Sgemm(who_, false, false, batch, hs, g4, act + s_.Row(t, 0) * g4, ldz,
                                    rd, hs, 0.f, dh, hs));
      }
      StoreState(s_, d, dh, dh0);
      StoreState(s_, d, dc, dc0);

      // Parameter and input gradients over all steps at once.
      if (dx != nullptr) {
        SALUS_RETURN_IF_ERROR(Sgemm(who_, false, false, rows, s_.input, g4, act, g4,
                                    w + d * g4 * s_.input, s_.input, d == 0 ? 0.f : 1.f, dx,
                                    s_.input));
      }
      if (dw != nullptr) {
        SALUS_RETURN_IF_ERROR(Sgemm(who_, true, false, g4, s_.input, rows, act, g4, x, s_.input,
                                    0.f, dw + d * g4 * s_.input, s_.input));
      }
      if (dr != nullptr) {
        SALUS_RETURN_IF_ERROR(
            Sgemm(who_, true, false, g4, hs, rows, act, g4, hp, hs, 0.f, dr + d * g4 * hs, hs));
      }
      if (db != nullptr) {
        // Column sums in double, each column's rows added in order.
        std::fill(db_sum, db_sum + g4, 0.0);
        for (int64_t row = 0; row < rows; ++row) {
          const float* dg = act + row * g4;
          for (int64_t k = 0; k < g4; ++k) db_sum[k] += dg[k];
        }
        float* dbd = db + d * 2 * g4;
        for (int64_t k = 0; k < g4; ++k) {
          dbd[k] = static_cast<float>(db_sum[k]);
          dbd[g4 + k] = static_cast<float>(db_sum[k]);
        }
      }
    }
    return OkStatus();
  }

 private:
  std::string who_;
  LstmSpec s_;
  ScratchLayout layout_;
  size_t act_, cs_, hp_, h_, c_, dh_, dc_, db_sum_;
};

// Note [LSTM on oneDNN]
// oneDNN's vanilla LSTM computes the same cell with its gates in the order i, f, c, o (ONNX's:
// i, o, f, c). The kernels map the operands onto it each run, since W, R and B are trainable:
//  - W [dirs, 4H, I] and R [dirs, 4H, H] are ldgoi with the gate blocks permuted; one copy per
//    gate block puts them in oneDNN's order in a temp buffer (ldgoi), which a reorder turns
//    into the primitive's own weights layout.
//  - B [dirs, 8H] (Wb then Rb) becomes the ldgo bias Wb + Rb, gates permuted.
//  - X is tnc (layout 0) or ntc (layout 1). Y [seq, 1, batch, H] is tnc and Y [batch, seq,
//    dirs, H] is ntc with dirs·H channels, so the primitive reads and writes Y (and dY) in place
//    except in the bidirectional layout 0, [seq, 2, batch, H], which goes through a tnc temp.
//  - initial_h/c and Y_h/c are ldnc [1, dirs, batch, H]; in layout 1 ([batch, dirs, H]) with
//    two directions they go through temps. Absent inputs are zeros, absent outputs temps.
//    The initial states are always bound, zeros where absent: without them, oneDNN 2.6's
//    backward got dR wrong for a left-to-right LSTM in layout 0 (lstm_test's first case).
// The directions map to unidirectional_left2right, unidirectional_right2left ("reverse") and
// bidirectional_concat (its second direction runs right to left, as ONNX's).
//
// Backward: lstm_forward in forward_training recomputes the outputs and fills a workspace,
// then lstm_backward takes them. It accumulates into its weight and bias gradients, which are
// zeroed first; their gate blocks are permuted back into dW and dR, and dB's gradient goes to
// both the Wb and the Rb half.

// ONNX's gate block for each of oneDNN's gates (i, f, c, o).
constexpr std::array<int64_t, 4> kOnnxGate = {0, 2, 3, 1};

using Tag = dnnl::memory::format_tag;

dnnl::memory::desc F32Desc(const dnnl::memory::dims& dims, Tag tag) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, tag);
}

// Copies the gate blocks of [dirs, 4, H, cols] parameters between ONNX's gate order and
// oneDNN's.
void PermuteGates(const LstmSpec& s, int64_t cols, bool to_onnx, const float* from, float* to) {
  const int64_t block = s.hidden * cols;
  for (int64_t d = 0; d < s.dirs; ++d) {
    for (int64_t g = 0; g < 4; ++g) {
      const int64_t onnx = (d * 4 + kOnnxGate[g]) * block, dnnl = (d * 4 + g) * block;
      std::memcpy(to + (to_onnx ? onnx : dnnl), from + (to_onnx ? dnnl : onnx),
                  block * sizeof(float));
    }
  }
}

float* TempAt(std::byte* scratch, size_t offset) {
  return reinterpret_cast<float*>(scratch + offset);
}

// Builds a DnnlKernel around oneDNN's LSTM primitives: the operand layouts and the copies
// between the graph's tensors and temps that Note [LSTM on oneDNN] describes.
class DnnlLstmBuilder {
 public:
  explicit DnnlLstmBuilder(const LstmSpec& s)
      : s_(s),
        k_(std::make_unique<DnnlKernel>()),
        seq_tag_(s.batch_major ? Tag::ntc : Tag::tnc),
        seq_direct_(s.dirs == 1 || s.batch_major),
        states_direct_(s.dirs == 1 || !s.batch_major),
        x_md_(F32Desc({s.seq, s.batch, s.input}, seq_tag_)),
        y_md_(F32Desc({s.seq, s.batch, s.dirs * s.hidden}, seq_direct_ ? seq_tag_ : Tag::tnc)),
        state_md_(F32Desc({1, s.dirs, s.batch, s.hidden}, Tag::ldnc)),
        w_md_(F32Desc({1, s.dirs, s.input, 4, s.hidden}, Tag::ldgoi)),
        r_md_(F32Desc({1, s.dirs, s.hidden, 4, s.hidden}, Tag::ldgoi)),
        bias_md_(F32Desc({1, s.dirs, 4, s.hidden}, Tag::ldgo)) {}

  DnnlKernel* kernel() { return k_.get(); }
  std::unique_ptr<Kernel> Release() { return std::move(k_); }
  dnnl::rnn_direction direction() const {
    if (s_.dirs == 2) return dnnl::rnn_direction::bidirectional_concat;
    return s_.reverse ? dnnl::rnn_direction::unidirectional_right2left
                      : dnnl::rnn_direction::unidirectional_left2right;
  }
  const dnnl::memory::desc& x_md() const { return x_md_; }
  const dnnl::memory::desc& y_md() const { return y_md_; }
  const dnnl::memory::desc& state_md() const { return state_md_; }
  const dnnl::memory::desc& w_md() const { return w_md_; }
  const dnnl::memory::desc& r_md() const { return r_md_; }
  const dnnl::memory::desc& bias_md() const { return bias_md_; }

  // W, R and B (inputs 1, 2, 3) in oneDNN's gate order, in temps; their slots.
  void AddParams() {
    w_ = k_->AddTemp(w_md_.get_size());
    r_ = k_->AddTemp(r_md_.get_size());
    b_ = k_->AddTemp(bias_md_.get_size());
    k_->AddLoop([s = s_, w = w_, r = r_, bt = b_](const KernelArgs& a, std::byte* scratch) {
      PermuteGates(s, s.input, false, static_cast<const float*>(a.inputs[1]), TempAt(scratch, w));
      PermuteGates(s, s.hidden, false, static_cast<const float*>(a.inputs[2]), TempAt(scratch, r));
      float* bias = TempAt(scratch, bt);
      const int64_t hs = s.hidden, g4 = 4 * hs;
      if (!s.has_b) {
        std::memset(bias, 0, s.dirs * g4 * sizeof(float));
        return;
      }
      const float* b = static_cast<const float*>(a.inputs[3]);
      for (int64_t d = 0; d < s.dirs; ++d) {
        for (int64_t g = 0; g < 4; ++g) {
          const float* wb = b + d * 2 * g4 + kOnnxGate[g] * hs;
          const float* rb = wb + g4;
          float* to = bias + (d * 4 + g) * hs;
          for (int64_t j = 0; j < hs; ++j) to[j] = wb[j] + rb[j];
        }
      }
    });
  }
  Slot w() const { return Slot::Temp(w_); }
  Slot r() const { return Slot::Temp(r_); }
  Slot bias() const { return Slot::Temp(b_); }

  // A [1, dirs, batch, H] state read from input `input` (zeros when absent).
  Slot StateIn(bool present, size_t input) {
    if (present && states_direct_) return Slot::In(input);
    const size_t temp = k_->AddTemp(state_md_.get_size());
    k_->AddLoop([s = s_, present, input, temp](const KernelArgs& a, std::byte* scratch) {
      const float* from = present ? static_cast<const float*>(a.inputs[input]) : nullptr;
      for (int64_t d = 0; d < s.dirs; ++d) {
        LoadState(s, d, from, TempAt(scratch, temp) + d * s.batch * s.hidden);
      }
    });
    return Slot::Temp(temp);
  }
  // A [1, dirs, batch, H] state written to output `output` (nowhere when absent) once
  // AddCopiesOut runs.
  Slot StateOut(bool present, size_t output) {
    if (present && states_direct_) return Slot::Out(output);
    const size_t temp = k_->AddTemp(state_md_.get_size());
    if (present) copies_.push_back({Copy::kState, temp, output});
    return Slot::Temp(temp);
  }
  // A [seq, batch, dirs·H] tensor read from input `input` in Y's layout (zeros when absent).
  Slot SeqIn(bool present, size_t input) {
    if (present && seq_direct_) return Slot::In(input);
    const size_t temp = k_->AddTemp(y_md_.get_size());
    k_->AddLoop([s = s_, present, input, temp](const KernelArgs& a, std::byte* scratch) {
      float* to = TempAt(scratch, temp);
      if (!present) {
        std::memset(to, 0, s.seq * s.batch * s.dirs * s.hidden * sizeof(float));
        return;
      }
      const float* from = static_cast<const float*>(a.inputs[input]);
      ForEachTnc(s, [&](int64_t y, int64_t tnc) {
        std::memcpy(to + tnc, from + y, s.hidden * sizeof(float));
      });
    });
    return Slot::Temp(temp);
  }
  // A [seq, batch, dirs·H] tensor written to output `output` in Y's layout (nowhere when
  // absent) once AddCopiesOut runs.
  Slot SeqOut(bool present, size_t output) {
    if (present && seq_direct_) return Slot::Out(output);
    const size_t temp = k_->AddTemp(y_md_.get_size());
    if (present) copies_.push_back({Copy::kSeq, temp, output});
    return Slot::Temp(temp);
  }
  // A temp of `bytes` that holds zeros before the next primitive.
  size_t ZeroedTemp(size_t bytes) {
    const size_t temp = k_->AddTemp(bytes);
    k_->AddLoop([temp, bytes](const KernelArgs&, std::byte* scratch) {
      std::memset(scratch + temp, 0, bytes);
    });
    return temp;
  }
  // Copies the temps of StateOut and SeqOut to their outputs.
  void AddCopiesOut() {
    if (copies_.empty()) return;
    k_->AddLoop([s = s_, copies = copies_](const KernelArgs& a, std::byte* scratch) {
      for (const Copy& c : copies) {
        const float* from = TempAt(scratch, c.temp);
        float* to = static_cast<float*>(a.outputs[c.output]);
        if (c.kind == Copy::kState) {
          for (int64_t d = 0; d < s.dirs; ++d) {
            StoreState(s, d, from + d * s.batch * s.hidden, to);
          }
        } else {
          ForEachTnc(s, [&](int64_t y, int64_t tnc) {
            std::memcpy(to + y, from + tnc, s.hidden * sizeof(float));
          });
        }
      }
    });
    copies_.clear();
  }

 private:
  struct Copy {
    enum Kind { kState, kSeq } kind;
    size_t temp, output;
  };
  // fn(offset in Y, offset in a tnc [seq, batch, dirs·H] buffer) for each row of H.
  template <typename Fn>
  static void ForEachTnc(const LstmSpec& s, Fn&& fn) {
    for (int64_t t = 0; t < s.seq; ++t) {
      for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t d = 0; d < s.dirs; ++d) {
          fn(s.YOffset(t, d, b), ((t * s.batch + b) * s.dirs + d) * s.hidden);
        }
      }
    }
  }

  LstmSpec s_;
  std::unique_ptr<DnnlKernel> k_;
  Tag seq_tag_;
  bool seq_direct_, states_direct_;
  dnnl::memory::desc x_md_, y_md_, state_md_, w_md_, r_md_, bias_md_;
  size_t w_ = 0, r_ = 0, b_ = 0;
  std::vector<Copy> copies_;
};

// Whether to try oneDNN: it takes no empty dimension.
bool DnnlTakes(const LstmSpec& s) {
  return s.seq > 0 && s.batch > 0 && s.input > 0 && s.hidden > 0;
}

bool HasOutput(const Node& n, size_t i) { return i < n.outputs.size() && n.outputs[i] != kNoValue; }

// The forward kernel on oneDNN (Note [LSTM on oneDNN]); Unimplemented where oneDNN refuses it.
// Inputs (X, W, R, B, sequence_lens, initial_h, initial_c, P); outputs (Y, Y_h, Y_c).
KernelOr DnnlLstm(const Node& n, const LstmSpec& s) {
  try {
    DnnlLstmBuilder l(s);
    const auto any_w = F32Desc({1, s.dirs, s.input, 4, s.hidden}, Tag::any);
    const auto any_r = F32Desc({1, s.dirs, s.hidden, 4, s.hidden}, Tag::any);
    dnnl::lstm_forward::desc desc(dnnl::prop_kind::forward_inference, l.direction(), l.x_md(),
                                  l.state_md(), l.state_md(), any_w, any_r, l.bias_md(), l.y_md(),
                                  l.state_md(), l.state_md());
    dnnl::lstm_forward::primitive_desc pd(desc, UserScratchpad(), CpuEngine());
    DnnlKernel* k = l.kernel();
    l.AddParams();
    std::vector<DnnlKernel::Binding> bind;
    bind.push_back({DNNL_ARG_SRC_ITER, l.state_md(), l.StateIn(s.has_h0, 5)});
    bind.push_back({DNNL_ARG_SRC_ITER_C, l.state_md(), l.StateIn(s.has_c0, 6)});
    bind.push_back({DNNL_ARG_SRC_LAYER, l.x_md(), Slot::In(0)});
    bind.push_back(k->Input(DNNL_ARG_WEIGHTS_LAYER, l.w_md(), pd.weights_layer_desc(), l.w()));
    bind.push_back(k->Input(DNNL_ARG_WEIGHTS_ITER, l.r_md(), pd.weights_iter_desc(), l.r()));
    bind.push_back({DNNL_ARG_BIAS, l.bias_md(), l.bias()});
    bind.push_back({DNNL_ARG_DST_LAYER, l.y_md(), l.SeqOut(HasOutput(n, 0), 0)});
    bind.push_back({DNNL_ARG_DST_ITER, l.state_md(), l.StateOut(HasOutput(n, 1), 1)});
    bind.push_back({DNNL_ARG_DST_ITER_C, l.state_md(), l.StateOut(HasOutput(n, 2), 2)});
    k->AddPrimitive(dnnl::lstm_forward(pd), std::move(bind), pd.scratchpad_desc().get_size());
    l.AddCopiesOut();
    return l.Release();
  } catch (const dnnl::error& e) {
    return UnimplementedError(n.Describe() + ": oneDNN LSTM: " + e.what());
  }
}

// The backward kernel on oneDNN (Note [LSTM on oneDNN]); Unimplemented where oneDNN refuses
// it. Inputs (X, W, R, B, initial_h, initial_c, dY, dY_h, dY_c); outputs (dX, dW, dR, dB,
// d_initial_h, d_initial_c).
KernelOr DnnlLstmGrad(const Node& n, const LstmSpec& s) {
  auto has_in = [&](size_t i) { return i < n.inputs.size() && n.inputs[i] != kNoValue; };
  try {
    DnnlLstmBuilder l(s);
    const auto any_w = F32Desc({1, s.dirs, s.input, 4, s.hidden}, Tag::any);
    const auto any_r = F32Desc({1, s.dirs, s.hidden, 4, s.hidden}, Tag::any);
    const dnnl::memory::desc state = l.state_md();
    dnnl::lstm_forward::desc fwd_desc(dnnl::prop_kind::forward_training, l.direction(), l.x_md(),
                                      state, state, any_w, any_r, l.bias_md(), l.y_md(), state,
                                      state);
    dnnl::lstm_forward::primitive_desc fwd(fwd_desc, UserScratchpad(), CpuEngine());
    dnnl::lstm_backward::desc bwd_desc(dnnl::prop_kind::backward, l.direction(), l.x_md(), state,
                                       state, any_w, any_r, l.bias_md(), l.y_md(), state, state,
                                       l.x_md(), state, state, any_w, any_r, l.bias_md(), l.y_md(),
                                       state, state);
    dnnl::lstm_backward::primitive_desc bwd(bwd_desc, UserScratchpad(), CpuEngine(), fwd);
    DnnlKernel* k = l.kernel();
    l.AddParams();

    // Recompute the forward into temps and the workspace.
    const Slot ws = Slot::Temp(k->AddTemp(fwd.workspace_desc().get_size()));
    const Slot y = Slot::Temp(k->AddTemp(l.y_md().get_size()));
    const Slot h = Slot::Temp(k->AddTemp(state.get_size()));
    const Slot c = Slot::Temp(k->AddTemp(state.get_size()));
    std::vector<DnnlKernel::Binding> common;
    common.push_back({DNNL_ARG_SRC_ITER, state, l.StateIn(s.has_h0, 4)});
    common.push_back({DNNL_ARG_SRC_ITER_C, state, l.StateIn(s.has_c0, 5)});
    common.push_back({DNNL_ARG_SRC_LAYER, l.x_md(), Slot::In(0)});
    common.push_back({DNNL_ARG_BIAS, l.bias_md(), l.bias()});
    common.push_back({DNNL_ARG_DST_LAYER, l.y_md(), y});
    common.push_back({DNNL_ARG_DST_ITER, state, h});
    common.push_back({DNNL_ARG_DST_ITER_C, state, c});
    common.push_back({DNNL_ARG_WORKSPACE, fwd.workspace_desc(), ws});
    std::vector<DnnlKernel::Binding> bind = common;
    bind.push_back(k->Input(DNNL_ARG_WEIGHTS_LAYER, l.w_md(), fwd.weights_layer_desc(), l.w()));
    bind.push_back(k->Input(DNNL_ARG_WEIGHTS_ITER, l.r_md(), fwd.weights_iter_desc(), l.r()));
    k->AddPrimitive(dnnl::lstm_forward(fwd), std::move(bind), fwd.scratchpad_desc().get_size());

    // Backward. The parameter gradients land in ldgoi temps (after a reorder where the
    // primitive wants another layout), zeroed first.
    bind = common;
    bind.push_back(k->Input(DNNL_ARG_WEIGHTS_LAYER, l.w_md(), bwd.weights_layer_desc(), l.w()));
    bind.push_back(k->Input(DNNL_ARG_WEIGHTS_ITER, l.r_md(), bwd.weights_iter_desc(), l.r()));
    bind.push_back({DNNL_ARG_DIFF_DST_LAYER, l.y_md(), l.SeqIn(has_in(6), 6)});
    bind.push_back({DNNL_ARG_DIFF_DST_ITER, state, l.StateIn(has_in(7), 7)});
    bind.push_back({DNNL_ARG_DIFF_DST_ITER_C, state, l.StateIn(has_in(8), 8)});
    if (HasOutput(n, 0)) {
      bind.push_back({DNNL_ARG_DIFF_SRC_LAYER, l.x_md(), Slot::Out(0)});
    } else {
      bind.push_back(
          {DNNL_ARG_DIFF_SRC_LAYER, l.x_md(), Slot::Temp(k->AddTemp(l.x_md().get_size()))});
    }
    bind.push_back({DNNL_ARG_DIFF_SRC_ITER, state, l.StateOut(HasOutput(n, 4), 4)});
    bind.push_back({DNNL_ARG_DIFF_SRC_ITER_C, state, l.StateOut(HasOutput(n, 5), 5)});
    const size_t dw = k->AddTemp(l.w_md().get_size());
    const size_t dr = k->AddTemp(l.r_md().get_size());
    for (auto [arg, user, temp, want] :
         {std::tuple{DNNL_ARG_DIFF_WEIGHTS_LAYER, l.w_md(), dw, bwd.diff_weights_layer_desc()},
          std::tuple{DNNL_ARG_DIFF_WEIGHTS_ITER, l.r_md(), dr, bwd.diff_weights_iter_desc()}}) {
      const DnnlKernel::Binding b = k->Output(arg, user, want, Slot::Temp(temp));
      const size_t bytes = want.get_size();
      k->AddLoop([at = b.slot.index, bytes](const KernelArgs&, std::byte* scratch) {
        std::memset(scratch + at, 0, bytes);
      });
      bind.push_back(b);
    }
    const size_t db = l.ZeroedTemp(l.bias_md().get_size());
    bind.push_back({DNNL_ARG_DIFF_BIAS, l.bias_md(), Slot::Temp(db)});
    k->AddPrimitive(dnnl::lstm_backward(bwd), std::move(bind), bwd.scratchpad_desc().get_size());
    l.AddCopiesOut();

    // Parameter gradients back in ONNX's gate order.
    k->AddLoop([s, dw, dr, db](const KernelArgs& a, std::byte* scratch) {
      auto out = [&](size_t i) {
        return i < a.outputs.size() ? static_cast<float*>(a.outputs[i]) : nullptr;
      };
      if (float* to = out(1)) PermuteGates(s, s.input, true, TempAt(scratch, dw), to);
      if (float* to = out(2)) PermuteGates(s, s.hidden, true, TempAt(scratch, dr), to);
      if (float* to = out(3)) {
        const int64_t hs = s.hidden, g4 = 4 * hs;
        const float* from = TempAt(scratch, db);
        for (int64_t d = 0; d < s.dirs; ++d) {
          for (int64_t g = 0; g < 4; ++g) {
            float* wb = to + d * 2 * g4 + kOnnxGate[g] * hs;
            std::memcpy(wb, from + (d * 4 + g) * hs, hs * sizeof(float));
            std::memcpy(wb + g4, wb, hs * sizeof(float));
          }
        }
      }
    });
    return l.Release();
  } catch (const dnnl::error& e) {
    return UnimplementedError(n.Describe() + ": oneDNN LSTM backward: " + e.what());
  }
}

KernelOr Lstm(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(LstmSpec spec, LstmForwardSpec(n, g));
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] == kNoValue) continue;
    const Shape want = i == 0 ? spec.YShape() : spec.StateShape();
    if (g.value(n.outputs[i]).shape != want) {
      return InvalidArgumentError(n.Describe() + ": output " + std::to_string(i) + " is " +
                                  ShapeString(g.value(n.outputs[i]).shape) + ", expected " +
                                  ShapeString(want));
    }
  }
  if (DnnlTakes(spec)) {
    KernelOr dnnl_kernel = DnnlLstm(n, spec);
    if (dnnl_kernel.ok()) return dnnl_kernel;
  }
  return std::unique_ptr<Kernel>(new LstmKernel(n.Describe(), spec));
}

KernelOr LstmGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(LstmSpec spec, LstmGradSpec(n, g));
  if (DnnlTakes(spec)) {
    KernelOr dnnl_kernel = DnnlLstmGrad(n, spec);
    if (dnnl_kernel.ok()) return dnnl_kernel;
  }
  return std::unique_ptr<Kernel>(new LstmGradKernel(n.Describe(), spec));
}

}  // namespace

void RegisterCpuLstmKernels(KernelRegistry* r) {
  r->Register("LSTM", DeviceType::kCpu, HostKernelFactory(Lstm));
  r->Register("SalusLstmGrad", DeviceType::kCpu, HostKernelFactory(LstmGrad));
}

}  // namespace salus::exec
