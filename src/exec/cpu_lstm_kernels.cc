// The CPU kernels of the ONNX LSTM op: forward ("LSTM") and backward ("SalusLstmGrad").
//
// Forward, per direction: one sgemm computes the input projections of every time step at once
// (X·W^T, rows in X's order), the biases are added, and then each step runs one sgemm for the
// recurrent projection (h·R^T) and a loop over the cell (element_math.h's LstmCellForward).
//
// Backward (Note [LSTM backward]): the kernel recomputes the forward into its scratch, keeping
// every step's activated gates, cell state and previous hidden state, then walks the steps
// backwards (BPTT), overwriting each step's gates with the gradients of their pre-activations
// (dG). With dG of every step in X's row order, dX, dW and dR are one sgemm each over all
// steps, and dB is a column sum. Both kernels are deterministic: fixed loop orders, and sgemm
// with a fixed thread count.
#include <oneapi/dnnl/dnnl.h>

#include <cstring>
#include <string>

#include "exec/alignment.h"
#include "exec/element_math.h"
#include "exec/kernel_registry.h"
#include "exec/lstm.h"

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

// Float buffers carved out of a kernel's scratch, each aligned to kAlignment.
class ScratchLayout {
 public:
  size_t Add(int64_t floats) {
    const size_t offset = bytes_;
    bytes_ += AlignUp(static_cast<uint64_t>(floats) * sizeof(float));
    return offset;
  }
  size_t bytes() const { return bytes_; }
  static float* At(void* scratch, size_t offset) {
    return reinterpret_cast<float*>(static_cast<std::byte*>(scratch) + offset);
  }

 private:
  size_t bytes_ = 0;
};

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
    gh_ = layout_.Add(s_.batch * g4);
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
    float* gh = ScratchLayout::At(a.scratch, gh_);
    float* h = ScratchLayout::At(a.scratch, h_);
    float* c = ScratchLayout::At(a.scratch, c_);
    const int64_t hs = s_.hidden, g4 = 4 * hs;
    for (int64_t d = 0; d < s_.dirs; ++d) {
      SALUS_RETURN_IF_ERROR(InputProjection(who_, s_, d, x, w, bias, gx));
      LoadState(s_, d, h0, h);
      LoadState(s_, d, c0, c);
      const float* rd = r + d * g4 * hs;
      for (int64_t step = 0; step < s_.seq; ++step) {
        const int64_t t = s_.Backwards(d) ? s_.seq - 1 - step : step;
        SALUS_RETURN_IF_ERROR(
            Sgemm(who_, false, true, s_.batch, g4, hs, h, hs, rd, hs, 0.f, gh, g4));
        for (int64_t b = 0; b < s_.batch; ++b) {
          const float* zx = gx + s_.Row(t, b) * g4;
          const float* zh = gh + b * g4;
          float* hb = h + b * hs;
          float* cb = c + b * hs;
          for (int64_t j = 0; j < hs; ++j) {
            const LstmCellState cell = LstmCellForward(zx[j] + zh[j], zx[hs + j] + zh[hs + j],
                                                       zx[2 * hs + j] + zh[2 * hs + j],
                                                       zx[3 * hs + j] + zh[3 * hs + j], cb[j]);
            cb[j] = cell.c;
            hb[j] = cell.h;
          }
          if (y != nullptr) std::memcpy(y + s_.YOffset(t, d, b), hb, hs * sizeof(float));
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
  size_t gx_, gh_, h_, c_;
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
    gh_ = layout_.Add(s_.batch * g4);
    h_ = layout_.Add(hb);
    c_ = layout_.Add(hb);
    dh_ = layout_.Add(hb);
    dc_ = layout_.Add(hb);
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
    float* gh = ScratchLayout::At(a.scratch, gh_);
    float* h = ScratchLayout::At(a.scratch, h_);
    float* c = ScratchLayout::At(a.scratch, c_);
    float* dh = ScratchLayout::At(a.scratch, dh_);
    float* dc = ScratchLayout::At(a.scratch, dc_);
    const int64_t hs = s_.hidden, g4 = 4 * hs, rows = s_.seq * s_.batch;
    // Rows apart of batch entries b and b+1 at one time step.
    const int64_t row_stride = s_.batch_major ? s_.seq : 1;
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
        SALUS_RETURN_IF_ERROR(
            Sgemm(who_, false, true, s_.batch, g4, hs, h, hs, rd, hs, 0.f, gh, g4));
        for (int64_t b = 0; b < s_.batch; ++b) {
          const int64_t row = s_.Row(t, b);
          float* z = act + row * g4;
          const float* zh = gh + b * g4;
          float* hb = h + b * hs;
          float* cb = c + b * hs;
          std::memcpy(hp + row * hs, hb, hs * sizeof(float));
          for (int64_t j = 0; j < hs; ++j) {
            const LstmCellState cell = LstmCellForward(z[j] + zh[j], z[hs + j] + zh[hs + j],
                                                       z[2 * hs + j] + zh[2 * hs + j],
                                                       z[3 * hs + j] + zh[3 * hs + j], cb[j]);
            z[j] = cell.i;
            z[hs + j] = cell.o;
            z[2 * hs + j] = cell.f;
            z[3 * hs + j] = cell.g;
            cb[j] = cell.c;
            hb[j] = cell.h;
          }
          std::memcpy(cs + row * hs, cb, hs * sizeof(float));
        }
      }

      // Backpropagate through time.
      LoadState(s_, d, dy_h, dh);
      LoadState(s_, d, dy_c, dc);
      LoadState(s_, d, c0, c);  // the cell state before the first step
      for (int64_t step = s_.seq - 1; step >= 0; --step) {
        const int64_t t = time_of(step);
        for (int64_t b = 0; b < s_.batch; ++b) {
          const int64_t row = s_.Row(t, b);
          float* z = act + row * g4;
          const float* cb = cs + row * hs;
          const float* cprev = step > 0 ? cs + s_.Row(time_of(step - 1), b) * hs : c + b * hs;
          const float* dyb = dy != nullptr ? dy + s_.YOffset(t, d, b) : nullptr;
          float* dhb = dh + b * hs;
          float* dcb = dc + b * hs;
          for (int64_t j = 0; j < hs; ++j) {
            const float dh_total = dhb[j] + (dyb != nullptr ? dyb[j] : 0.f);
            const LstmCellGrad grad = LstmCellBackward(
                z[j], z[hs + j], z[2 * hs + j], z[3 * hs + j], cb[j], cprev[j], dh_total, dcb[j]);
            z[j] = grad.zi;
            z[hs + j] = grad.zo;
            z[2 * hs + j] = grad.zf;
            z[3 * hs + j] = grad.zg;
            dcb[j] = grad.c_prev;
          }
        }
        // dh_{t-1} = dG_t·R over the rows of time t.
        SALUS_RETURN_IF_ERROR(Sgemm(who_, false, false, s_.batch, hs, g4, act + s_.Row(t, 0) * g4,
                                    row_stride * g4, rd, hs, 0.f, dh, hs));
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
        float* dbd = db + d * 2 * g4;
        for (int64_t k = 0; k < g4; ++k) {
          double sum = 0;
          for (int64_t row = 0; row < rows; ++row) sum += act[row * g4 + k];
          dbd[k] = static_cast<float>(sum);
          dbd[g4 + k] = static_cast<float>(sum);
        }
      }
    }
    return OkStatus();
  }

 private:
  std::string who_;
  LstmSpec s_;
  ScratchLayout layout_;
  size_t act_, cs_, hp_, gh_, h_, c_, dh_, dc_;
};

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
  return std::unique_ptr<Kernel>(new LstmKernel(n.Describe(), spec));
}

KernelOr LstmGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(LstmSpec spec, LstmFor(n, g, n.input(0), n.input(1), n.input(2),
                                                n.input(3), n.input(4), n.input(5)));
  const Shape state = spec.StateShape();
  const Shape grads_in[] = {spec.YShape(), state, state};
  for (size_t i = 0; i < 3; ++i) {
    const ValueId id = n.input(6 + i);
    if (id != kNoValue &&
        (g.value(id).shape != grads_in[i] || g.value(id).type != DataType::kFloat32)) {
      return InvalidArgumentError(n.Describe() + ": gradient input " + std::to_string(6 + i) +
                                  " is " + ShapeString(g.value(id).shape) + ", expected float " +
                                  ShapeString(grads_in[i]));
    }
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] == kNoValue) continue;
    if (n.input(i) == kNoValue) {
      return InvalidArgumentError(n.Describe() + ": output " + std::to_string(i) +
                                  " is the gradient of an absent input");
    }
    if (g.value(n.outputs[i]).shape != g.value(n.input(i)).shape) {
      return InvalidArgumentError(n.Describe() + ": output " + std::to_string(i) + " is " +
                                  ShapeString(g.value(n.outputs[i]).shape) + ", expected " +
                                  ShapeString(g.value(n.input(i)).shape));
    }
  }
  return std::unique_ptr<Kernel>(new LstmGradKernel(n.Describe(), spec));
}

}  // namespace

void RegisterCpuLstmKernels(KernelRegistry* r) {
  r->Register("LSTM", DeviceType::kCpu, HostKernelFactory(Lstm));
  r->Register("SalusLstmGrad", DeviceType::kCpu, HostKernelFactory(LstmGrad));
}

}  // namespace salus::exec
