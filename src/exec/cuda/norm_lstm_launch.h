// Launch interface of norm_lstm.cu (C++17: nvcc compiles it): the hand-written kernels behind
// norm_lstm_kernels.cc, LayerNormalization and the LSTM's per-step work. The LSTM cell is
// element_math.h's LstmCellForward, which the CPU kernel shares.
//
// Each function queues its kernel on `stream` and returns the launch's error; it never waits for
// it and allocates nothing. Tensors are packed float32 in device memory. Nothing is launched for
// an empty tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace salus::exec::cuda {

// X viewed as [rows, inner]; Scale and B hold `inner` values.
struct LayerNormGeometry {
  int64_t rows = 0, inner = 0;
  float epsilon = 1e-5f;
};

// One block per row (grid-stride over rows): the row's mean, then its (biased) variance about
// the mean, each summed in double by a fixed-shape tree; then
// y = (x - mean) * inv_std * scale (+ bias) with inv_std = 1 / sqrt(variance + epsilon).
// bias, mean and inv_std may be null (mean and inv_std: the optional outputs, `rows` floats).
// Deterministic: no atomics, a fixed order of additions.
cudaError_t LaunchLayerNorm(const LayerNormGeometry& g, const float* x, const float* scale,
                            const float* bias, float* y, float* mean, float* inv_std,
                            cudaStream_t stream);

// Where one direction's per-step rows lie. Every offset is linear in its indices, so each is a
// base plus strides (in floats): row (t, b) of the input projections is t * row_t + b * row_b;
// Y's (t, b) slice starts at y_base + t * y_t + b * y_b; a state's b slice (initial_h, Y_h, ...)
// at state_base + b * state_b.
struct LstmGeometry {
  int64_t batch = 0, hidden = 0;
  int64_t row_t = 0, row_b = 0;
  int64_t y_base = 0, y_t = 0, y_b = 0;
  int64_t state_base = 0, state_b = 0;
};

// buf[b * hidden + j] = state[state_base + b * state_b + j], or 0 where state is null.
cudaError_t LaunchLstmLoadState(const LstmGeometry& g, const float* state, float* buf,
                                cudaStream_t stream);

// state[state_base + b * state_b + j] = buf[b * hidden + j].
cudaError_t LaunchLstmStoreState(const LstmGeometry& g, const float* buf, float* state,
                                 cudaStream_t stream);

// One time step t of one direction, for every batch b and unit j: the gates' pre-activations are
// z_k = (gx[row(t, b) * 4H + k * H + j] + (wb[k * H + j] + rb[k * H + j])) + gh[b * 4H + k * H + j]
// (the CPU's order of additions; no bias when wb is null), and LstmCellForward of them and
// c[b * H + j] updates c and h in place and writes h to Y (when y is not null).
cudaError_t LaunchLstmCell(const LstmGeometry& g, int64_t t, const float* gx, const float* gh,
                           const float* wb, const float* rb, float* h, float* c, float* y,
                           cudaStream_t stream);

// The backward kernel's recomputation of step t (SalusLstmGrad, Note [LSTM backward on cuda]):
// LaunchLstmCell's math, keeping what the backward steps need, all in rows (t, b) of X's row
// order: the activated gates i, o, f, g overwrite that row's input projections in gx
// ([rows, 4H]), the previous hidden state goes to hp and the new cell state to cs ([rows, H]).
cudaError_t LaunchLstmCellTrain(const LstmGeometry& g, int64_t t, float* gx, const float* gh,
                                const float* wb, const float* rb, float* h, float* c, float* hp,
                                float* cs, cudaStream_t stream);

// One backward step at time t: for every batch b and unit j, LstmCellBackward of row (t, b)'s
// activated gates in act, its cell state in cs, the previous cell state (cs at row (t_prev, b),
// or c0[b * H + j] when t_prev < 0), dh[b * H + j] plus Y's gradient at (t, b) when dy is not
// null, and dc[b * H + j]. The gates' pre-activation gradients overwrite the gates in act; dc
// becomes the previous cell state's gradient. dh is left for the recurrent product to replace.
cudaError_t LaunchLstmCellBackward(const LstmGeometry& g, int64_t t, int64_t t_prev, float* act,
                                   const float* cs, const float* c0, const float* dy, float* dh,
                                   float* dc, cudaStream_t stream);

// db[k] = db[g4 + k] = the sum over rows r of dg[r * g4 + k], in double with the rows in order
// (the gradient of B's Wb and Rb halves).
cudaError_t LaunchLstmBiasGrad(int64_t rows, int64_t g4, const float* dg, float* db,
                               cudaStream_t stream);

}  // namespace salus::exec::cuda
