// The hand-written kernels of norm_lstm_kernels.cc (norm_lstm_launch.h). LayerNormalization runs
// one block per row and sums with grid.cuh's fixed-shape BlockSum; the LSTM kernels are
// grid-stride loops over [batch, hidden] whose cell math is element_math.h's LstmCellForward
// and LstmCellBackward, and the bias gradient is one thread per column summing its rows in
// order. No kernel shares an output element between threads, so every result is deterministic.
#include <cstdint>

#include "exec/cuda/grid.cuh"
#include "exec/cuda/norm_lstm_launch.h"
#include "exec/element_math.h"
#include "exec/hd.h"

namespace salus::exec::cuda {
namespace {

// Each block walks rows blockIdx.x, blockIdx.x + gridDim.x, ...: the row is the same for all of
// a block's threads, so BlockSum's barriers are reached by all of them. Thread t reads elements
// t, t + kThreads, ... of the row (coalesced). y may be x (each element is read before the
// barrier that precedes its write).
__global__ void LayerNormKernel(LayerNormGeometry g, const float* x,
                                const float* __restrict__ scale, const float* __restrict__ bias,
                                float* y, float* __restrict__ mean_out,
                                float* __restrict__ inv_std_out) {
  __shared__ double partial[kThreads];
  const double n = static_cast<double>(g.inner);
  for (int64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
    const float* row = x + r * g.inner;
    double sum = 0;
    for (int64_t i = threadIdx.x; i < g.inner; i += kThreads) sum += row[i];
    const double mu = BlockSum(partial, sum) / n;
    double sq = 0;
    for (int64_t i = threadIdx.x; i < g.inner; i += kThreads) {
      const double d = static_cast<double>(row[i]) - mu;
      sq += d * d;
    }
    const float variance = static_cast<float>(BlockSum(partial, sq) / n);
    const float mean = static_cast<float>(mu);
    const float inv_std = 1.f / sqrtf(variance + g.epsilon);
    float* out = y + r * g.inner;
    for (int64_t i = threadIdx.x; i < g.inner; i += kThreads) {
      const float v = (row[i] - mean) * inv_std * scale[i];
      out[i] = bias != nullptr ? v + bias[i] : v;
    }
    if (threadIdx.x == 0) {
      if (mean_out != nullptr) mean_out[r] = mean;
      if (inv_std_out != nullptr) inv_std_out[r] = inv_std;
    }
  }
}

__global__ void LstmLoadStateKernel(LstmGeometry g, const float* __restrict__ state,
                                    float* __restrict__ buf, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const int64_t b = e / g.hidden, j = e % g.hidden;
    buf[e] = state != nullptr ? state[g.state_base + b * g.state_b + j] : 0.f;
  }
}

__global__ void LstmStoreStateKernel(LstmGeometry g, const float* __restrict__ buf,
                                     float* __restrict__ state, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const int64_t b = e / g.hidden, j = e % g.hidden;
    state[g.state_base + b * g.state_b + j] = buf[e];
  }
}

// Row (t, b) of the per-step buffers kept in X's row order.
__device__ __forceinline__ int64_t LstmRow(const LstmGeometry& g, int64_t t, int64_t b) {
  return t * g.row_t + b * g.row_b;
}

// The cell of unit j of batch row b at time t, from its pre-activations (the CPU's order of
// additions): the forward kernel and the backward kernel's recomputation share it, so they
// agree bit for bit.
__device__ __forceinline__ LstmCellState LstmCellAt(const LstmGeometry& g, int64_t t, int64_t b,
                                                    int64_t j, const float* gx, const float* gh,
                                                    const float* wb, const float* rb,
                                                    float c_prev) {
  const int64_t hs = g.hidden;
  const float* zx = gx + LstmRow(g, t, b) * 4 * hs;
  const float* zh = gh + b * 4 * hs;
  float z[4];
  for (int k = 0; k < 4; ++k) {
    const int64_t at = k * hs + j;
    const float x_part = wb != nullptr ? zx[at] + (wb[at] + rb[at]) : zx[at];
    z[k] = x_part + zh[at];
  }
  return LstmCellForward(z[0], z[1], z[2], z[3], c_prev);
}

__global__ void LstmCellKernel(LstmGeometry g, int64_t t, const float* __restrict__ gx,
                               const float* __restrict__ gh, const float* __restrict__ wb,
                               const float* __restrict__ rb, float* __restrict__ h,
                               float* __restrict__ c, float* __restrict__ y, int64_t count) {
  const int64_t hs = g.hidden;
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const int64_t b = e / hs, j = e % hs;
    const LstmCellState cell = LstmCellAt(g, t, b, j, gx, gh, wb, rb, c[e]);
    c[e] = cell.c;
    h[e] = cell.h;
    if (y != nullptr) y[g.y_base + t * g.y_t + b * g.y_b + j] = cell.h;
  }
}

// gx is read and written by the same thread at the same elements (its own unit's four gates).
__global__ void LstmCellTrainKernel(LstmGeometry g, int64_t t, float* gx,
                                    const float* __restrict__ gh, const float* __restrict__ wb,
                                    const float* __restrict__ rb, float* __restrict__ h,
                                    float* __restrict__ c, float* __restrict__ hp,
                                    float* __restrict__ cs, int64_t count) {
  const int64_t hs = g.hidden;
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const int64_t b = e / hs, j = e % hs;
    const LstmCellState cell = LstmCellAt(g, t, b, j, gx, gh, wb, rb, c[e]);
    const int64_t row = LstmRow(g, t, b);
    float* act = gx + row * 4 * hs;
    act[j] = cell.i;
    act[hs + j] = cell.o;
    act[2 * hs + j] = cell.f;
    act[3 * hs + j] = cell.g;
    hp[row * hs + j] = h[e];
    cs[row * hs + j] = cell.c;
    c[e] = cell.c;
    h[e] = cell.h;
  }
}

__global__ void LstmCellBackwardKernel(LstmGeometry g, int64_t t, int64_t t_prev, float* act,
                                       const float* __restrict__ cs, const float* __restrict__ c0,
                                       const float* __restrict__ dy, float* __restrict__ dh,
                                       float* __restrict__ dc, int64_t count) {
  const int64_t hs = g.hidden;
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const int64_t b = e / hs, j = e % hs;
    const int64_t row = LstmRow(g, t, b);
    const float c_prev = t_prev >= 0 ? cs[LstmRow(g, t_prev, b) * hs + j] : c0[e];
    float dh_e = dh[e];
    if (dy != nullptr) dh_e += dy[g.y_base + t * g.y_t + b * g.y_b + j];
    float* z = act + row * 4 * hs;
    const LstmCellGrad d = LstmCellBackward(z[j], z[hs + j], z[2 * hs + j], z[3 * hs + j],
                                            cs[row * hs + j], c_prev, dh_e, dc[e]);
    z[j] = d.zi;
    z[hs + j] = d.zo;
    z[2 * hs + j] = d.zf;
    z[3 * hs + j] = d.zg;
    dc[e] = d.c_prev;
  }
}

__global__ void LstmBiasGradKernel(int64_t rows, int64_t g4, const float* __restrict__ dg,
                                   float* __restrict__ db) {
  for (int64_t k = FirstIndex(); k < g4; k += GridStride()) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += dg[r * g4 + k];
    db[k] = static_cast<float>(sum);
    db[g4 + k] = static_cast<float>(sum);
  }
}

}  // namespace

cudaError_t LaunchLayerNorm(const LayerNormGeometry& g, const float* x, const float* scale,
                            const float* bias, float* y, float* mean, float* inv_std,
                            cudaStream_t stream) {
  if (g.rows <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(g.rows, kMaxBlocks));
  LayerNormKernel<<<blocks, kThreads, 0, stream>>>(g, x, scale, bias, y, mean, inv_std);
  return cudaGetLastError();
}

cudaError_t LaunchLstmLoadState(const LstmGeometry& g, const float* state, float* buf,
                                cudaStream_t stream) {
  const int64_t count = g.batch * g.hidden;
  if (count <= 0) return cudaSuccess;
  LstmLoadStateKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, state, buf, count);
  return cudaGetLastError();
}

cudaError_t LaunchLstmStoreState(const LstmGeometry& g, const float* buf, float* state,
                                 cudaStream_t stream) {
  const int64_t count = g.batch * g.hidden;
  if (count <= 0) return cudaSuccess;
  LstmStoreStateKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, buf, state, count);
  return cudaGetLastError();
}

cudaError_t LaunchLstmCell(const LstmGeometry& g, int64_t t, const float* gx, const float* gh,
                           const float* wb, const float* rb, float* h, float* c, float* y,
                           cudaStream_t stream) {
  const int64_t count = g.batch * g.hidden;
  if (count <= 0) return cudaSuccess;
  LstmCellKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, t, gx, gh, wb, rb, h, c, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchLstmCellTrain(const LstmGeometry& g, int64_t t, float* gx, const float* gh,
                                const float* wb, const float* rb, float* h, float* c, float* hp,
                                float* cs, cudaStream_t stream) {
  const int64_t count = g.batch * g.hidden;
  if (count <= 0) return cudaSuccess;
  LstmCellTrainKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, t, gx, gh, wb, rb, h, c, hp, cs,
                                                                 count);
  return cudaGetLastError();
}

cudaError_t LaunchLstmCellBackward(const LstmGeometry& g, int64_t t, int64_t t_prev, float* act,
                                   const float* cs, const float* c0, const float* dy, float* dh,
                                   float* dc, cudaStream_t stream) {
  const int64_t count = g.batch * g.hidden;
  if (count <= 0) return cudaSuccess;
  LstmCellBackwardKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, t, t_prev, act, cs, c0, dy,
                                                                    dh, dc, count);
  return cudaGetLastError();
}

cudaError_t LaunchLstmBiasGrad(int64_t rows, int64_t g4, const float* dg, float* db,
                               cudaStream_t stream) {
  if (g4 <= 0) return cudaSuccess;
  LstmBiasGradKernel<<<BlocksFor(g4), kThreads, 0, stream>>>(rows, g4, dg, db);
  return cudaGetLastError();
}

}  // namespace salus::exec::cuda
