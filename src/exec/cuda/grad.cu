// The hand-written backward and optimizer kernels of grad_kernels.cc (grad_launch.h):
// grid-stride loops over 64-bit indices whose per-element math is grad_math.h's and
// pool_math.h's. Every sum is gathered by the thread that owns its result, or by one block's
// fixed tree: no atomics, so results are bit-identical from run to run.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "exec/cuda/grad_launch.h"
#include "exec/cuda/grid.cuh"

namespace salus::exec::cuda {
namespace {

template <EltwiseGradOp kOp>
__global__ void EltwiseGradKernel(float alpha, const float* __restrict__ x,
                                  const float* __restrict__ dy, float* __restrict__ dx,
                                  int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) {
    dx[i] = ApplyEltwiseGrad(kOp, alpha, x[i], dy[i]);
  }
}

template <EltwiseGradOp kOp>
cudaError_t Eltwise(float alpha, const float* x, const float* dy, float* dx, int64_t count,
                    cudaStream_t stream) {
  EltwiseGradKernel<kOp><<<BlocksFor(count), kThreads, 0, stream>>>(alpha, x, dy, dx, count);
  return cudaGetLastError();
}

// One thread per output element, summing its elements in order (SumToAt).
__global__ void SumToKernel(SumToMap map, float scale, const float* __restrict__ x,
                            float* __restrict__ y, int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) y[o] = SumToAt(map, scale, x, o);
}

// Note [Long sums]: for few outputs with many elements each, every output's sum is cut into
// parts (Note [Split sums] in grad_math.h) and block b sums part b % parts of output
// b / parts; the block's fixed tree adds its threads' sums. By rows (a convolution's bias
// gradient: N rows of H*W), the block walks its rows in order (RowAt once, then NextRow: no
// division per element, where MapIndex takes one per dim), thread t summing elements
// c0 + t, c0 + t + kThreads, ... of its column range in every row. Otherwise thread t sums
// elements e0 + t, e0 + t + kThreads, ... of its range of reduced elements, each located by
// MapIndex. With one part the block writes the output; with more it writes its partial, and
// SumPartsKernel adds each output's partials in part order. The cut and the order depend on the
// shapes alone, so results are bit-identical from run to run.
__global__ void SumToPartsKernel(SumToMap map, SumSplit split, float scale,
                                 const float* __restrict__ x, float* __restrict__ y,
                                 double* __restrict__ partials, int64_t count) {
  __shared__ double partial[kThreads];
  const IndexMap& red = map.reduced;
  const int64_t reduced = IndexMapCount(red);
  const int last = red.rank - 1;
  const int64_t inner = last >= 0 ? red.dims[last] : 1;
  const int64_t step = last >= 0 ? red.strides[0][last] : 0;
  const int64_t parts = split.row_parts * split.col_parts;
  for (int64_t b = blockIdx.x; b < count * parts; b += gridDim.x) {
    const int64_t o = b / parts;
    const int64_t part = b % parts;
    int64_t base[kMaxIndexOperands], off[kMaxIndexOperands];
    MapIndex(map.out, o, base);
    double sum = 0;
    if (split.by_rows) {
      int64_t r0, r1, c0, c1;
      PartRange(reduced / inner, split.row_parts, part / split.col_parts, &r0, &r1);
      PartRange(inner, split.col_parts, part % split.col_parts, &c0, &c1);
      int64_t at[kMaxIndexDims];
      int64_t row = 0;
      RowAt(red, r0, at, &row);
      for (int64_t q = r0; q < r1; ++q) {
        const float* r = x + base[0] + row;
        for (int64_t i = c0 + threadIdx.x; i < c1; i += kThreads) sum += r[i * step];
        NextRow(red, at, &row);
      }
    } else {
      int64_t e0, e1;
      PartRange(reduced, parts, part, &e0, &e1);
      for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
        MapIndex(red, e, off);
        sum += x[base[0] + off[0]];
      }
    }
    sum = BlockSum(partial, sum);
    if (threadIdx.x == 0) {
      if (parts == 1) {
        y[o] = static_cast<float>(sum) * scale;
      } else {
        partials[b] = sum;
      }
    }
  }
}

// y[o] = scale * the sum of output o's `parts` partials, in part order.
__global__ void SumPartsKernel(const double* __restrict__ partials, int64_t parts, float scale,
                               float* __restrict__ y, int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) {
    double sum = 0;
    for (int64_t p = 0; p < parts; ++p) sum += partials[o * parts + p];
    y[o] = static_cast<float>(sum) * scale;
  }
}

__global__ void BroadcastScaleKernel(IndexMap map, float scale, const float* __restrict__ x,
                                     float* __restrict__ y, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    y[e] = scale * x[off[0]];
  }
}

// One thread per element of dx: the writes are coalesced, the reads strided by the block size.
__global__ void DepthToSpaceGradKernel(DepthToSpaceGeometry g, const float* __restrict__ dy,
                                       float* __restrict__ dx, int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) dx[i] = dy[DepthToSpaceTarget(g, i)];
}

__global__ void SceLogProbKernel(SceSpec s, const float* __restrict__ scores,
                                 const int64_t* __restrict__ labels,
                                 const float* __restrict__ weights, float* __restrict__ logp,
                                 int64_t rows) {
  for (int64_t r = FirstIndex(); r < rows; r += GridStride()) {
    SceRow(s, scores, labels, weights, logp, r);
  }
}

// One block: the weights of the counted rows, thread t summing rows t, t + kThreads, ...
__global__ void SceWeightSumKernel(SceSpec s, const int64_t* __restrict__ labels,
                                   const float* __restrict__ weights, double* weight_sum,
                                   int64_t rows) {
  __shared__ double partial[kThreads];
  double sum = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    const int64_t l = labels[r];
    if (SceLabelCounts(s, l)) sum += weights != nullptr ? weights[l] : 1.0;
  }
  sum = BlockSum(partial, sum);
  if (threadIdx.x == 0) *weight_sum = sum;
}

__global__ void SceGradKernel(SceSpec s, const float* __restrict__ logp,
                              const int64_t* __restrict__ labels, const float* __restrict__ weights,
                              const float* __restrict__ dloss,
                              const double* __restrict__ weight_sum, float* __restrict__ dx,
                              int64_t count) {
  const double wsum = *weight_sum;
  for (int64_t idx = FirstIndex(); idx < count; idx += GridStride()) {
    const int64_t row = idx / (s.c * s.d) * s.d + idx % s.d;
    const float coef = SceGradCoef(s, labels, weights, dloss, wsum, row);
    dx[idx] = SceGradAt(s, logp, labels, coef, idx);
  }
}

__global__ void SgdKernel(SgdHyper h, float lr, const float* __restrict__ lr_input,
                          float* __restrict__ p, const float* __restrict__ grad,
                          float* __restrict__ v, int64_t count) {
  const float rate = lr_input != nullptr ? *lr_input : lr;
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) SgdStep(h, rate, p, grad, v, i);
}

__global__ void AdamScalarsKernel(AdamHyper h, float lr, const float* __restrict__ lr_input,
                                  float* step, AdamScalars* scalars) {
  step[0] += 1.f;
  *scalars = AdamScalarsFor(h, step[0], lr_input != nullptr ? *lr_input : lr);
}

__global__ void AdamKernel(AdamHyper h, const AdamScalars* __restrict__ scalars,
                           float* __restrict__ p, const float* __restrict__ grad,
                           float* __restrict__ m, float* __restrict__ v, int64_t count) {
  const AdamScalars s = *scalars;
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) AdamStep(h, s, p, grad, m, v, i);
}

__global__ void PoolTapKernel(PoolGeometry g, const float* __restrict__ x,
                              int64_t* __restrict__ tap, int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) tap[o] = PoolTap(g, x, o);
}

__global__ void MaxPoolTapsKernel(PoolGeometry g, const float* __restrict__ x,
                                  float* __restrict__ y, int64_t* __restrict__ tap, int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) {
    const int64_t t = PoolTap(g, x, o);
    tap[o] = t;
    y[o] = PoolAtTap(g, x, t, o);
  }
}

__global__ void PoolGradKernel(PoolGeometry g, const float* __restrict__ dy,
                               const int64_t* __restrict__ tap, float* __restrict__ dx,
                               int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) dx[i] = PoolGradAt(g, dy, tap, i);
}

}  // namespace

cudaError_t LaunchEltwiseGrad(EltwiseGradOp op, float alpha, const float* x, const float* dy,
                              float* dx, int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  switch (op) {
    case EltwiseGradOp::kRelu:
      return Eltwise<EltwiseGradOp::kRelu>(alpha, x, dy, dx, count, stream);
    case EltwiseGradOp::kSigmoid:
      return Eltwise<EltwiseGradOp::kSigmoid>(alpha, x, dy, dx, count, stream);
    case EltwiseGradOp::kTanh:
      return Eltwise<EltwiseGradOp::kTanh>(alpha, x, dy, dx, count, stream);
    case EltwiseGradOp::kExp:
      return Eltwise<EltwiseGradOp::kExp>(alpha, x, dy, dx, count, stream);
    case EltwiseGradOp::kLog:
      return Eltwise<EltwiseGradOp::kLog>(alpha, x, dy, dx, count, stream);
    case EltwiseGradOp::kSqrt:
      return Eltwise<EltwiseGradOp::kSqrt>(alpha, x, dy, dx, count, stream);
    case EltwiseGradOp::kAbs:
      return Eltwise<EltwiseGradOp::kAbs>(alpha, x, dy, dx, count, stream);
    case EltwiseGradOp::kElu:
      return Eltwise<EltwiseGradOp::kElu>(alpha, x, dy, dx, count, stream);
    case EltwiseGradOp::kSoftplus:
      return Eltwise<EltwiseGradOp::kSoftplus>(alpha, x, dy, dx, count, stream);
  }
  return cudaErrorInvalidValue;
}

namespace {
// Few outputs, each a long sum: blocks per output keep the GPU busy (Note [Long sums]).
bool SumsByBlocks(const SumToMap& map) {
  return IndexMapCount(map.reduced) >= 8 * kThreads && IndexMapCount(map.out) < 4096;
}
}  // namespace

size_t SumToScratchBytes(const SumToMap& map) {
  if (!SumsByBlocks(map)) return 0;
  const SumSplit split = PlanSumSplit(map, kThreads);
  const int64_t parts = split.row_parts * split.col_parts;
  return parts > 1 ? static_cast<size_t>(IndexMapCount(map.out) * parts) * sizeof(double) : 0;
}

cudaError_t LaunchSumTo(const SumToMap& map, float scale, const float* x, float* y, void* scratch,
                        cudaStream_t stream) {
  const int64_t count = IndexMapCount(map.out);
  if (count <= 0) return cudaSuccess;
  if (!SumsByBlocks(map)) {
    SumToKernel<<<BlocksFor(count), kThreads, 0, stream>>>(map, scale, x, y, count);
    return cudaGetLastError();
  }
  const SumSplit split = PlanSumSplit(map, kThreads);
  const int64_t parts = split.row_parts * split.col_parts;
  if (parts > 1 && scratch == nullptr) return cudaErrorInvalidValue;
  double* partials = static_cast<double*>(scratch);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(count * parts, kMaxBlocks));
  SumToPartsKernel<<<blocks, kThreads, 0, stream>>>(map, split, scale, x, y, partials, count);
  if (parts > 1) {
    SumPartsKernel<<<BlocksFor(count), kThreads, 0, stream>>>(partials, parts, scale, y, count);
  }
  return cudaGetLastError();
}

cudaError_t LaunchBroadcastScale(const IndexMap& map, float scale, const float* x, float* y,
                                 cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  if (count <= 0) return cudaSuccess;
  BroadcastScaleKernel<<<BlocksFor(count), kThreads, 0, stream>>>(map, scale, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchDepthToSpaceGrad(const DepthToSpaceGeometry& g, const float* dy, float* dx,
                                   cudaStream_t stream) {
  const int64_t count = DepthToSpaceCount(g);
  if (count <= 0) return cudaSuccess;
  DepthToSpaceGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(g, dy, dx, count);
  return cudaGetLastError();
}

cudaError_t LaunchSceGrad(const SceSpec& s, const float* scores, const int64_t* labels,
                          const float* weights, const float* dloss, float* logp, double* weight_sum,
                          float* dx, cudaStream_t stream) {
  const int64_t rows = s.n * s.d;
  const int64_t count = rows * s.c;
  if (count <= 0) return cudaSuccess;
  SceLogProbKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(s, scores, labels, weights, logp,
                                                             rows);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SceWeightSumKernel<<<1, kThreads, 0, stream>>>(s, labels, weights, weight_sum, rows);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SceGradKernel<<<BlocksFor(count), kThreads, 0, stream>>>(s, logp, labels, weights, dloss,
                                                           weight_sum, dx, count);
  return cudaGetLastError();
}

cudaError_t LaunchSgdUpdate(const SgdHyper& h, float lr, const float* lr_input, int64_t count,
                            float* p, const float* grad, float* v, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  SgdKernel<<<BlocksFor(count), kThreads, 0, stream>>>(h, lr, lr_input, p, grad, v, count);
  return cudaGetLastError();
}

cudaError_t LaunchAdamUpdate(const AdamHyper& h, float lr, const float* lr_input, int64_t count,
                             float* p, const float* grad, float* m, float* v, float* step,
                             AdamScalars* scalars, cudaStream_t stream) {
  // The step advances even for an empty parameter, as on the CPU.
  AdamScalarsKernel<<<1, 1, 0, stream>>>(h, lr, lr_input, step, scalars);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || count <= 0) return err;
  AdamKernel<<<BlocksFor(count), kThreads, 0, stream>>>(h, scalars, p, grad, m, v, count);
  return cudaGetLastError();
}

cudaError_t LaunchPoolGrad(const PoolGeometry& g, const float* x, const float* dy, int64_t* tap,
                           float* dx, cudaStream_t stream) {
  const int64_t outputs = PoolOutputCount(g);
  const int64_t inputs = g.planes * g.in[0] * g.in[1] * g.in[2];
  if (inputs <= 0) return cudaSuccess;
  if (outputs > 0) {
    PoolTapKernel<<<BlocksFor(outputs), kThreads, 0, stream>>>(g, x, tap, outputs);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return LaunchPoolGradFromTaps(g, dy, tap, dx, stream);
}

cudaError_t LaunchPoolGradFromTaps(const PoolGeometry& g, const float* dy, const int64_t* tap,
                                   float* dx, cudaStream_t stream) {
  const int64_t inputs = g.planes * g.in[0] * g.in[1] * g.in[2];
  if (inputs <= 0) return cudaSuccess;
  PoolGradKernel<<<BlocksFor(inputs), kThreads, 0, stream>>>(g, dy, tap, dx, inputs);
  return cudaGetLastError();
}

cudaError_t LaunchMaxPoolTaps(const PoolGeometry& g, const float* x, float* y, int64_t* tap,
                              cudaStream_t stream) {
  const int64_t outputs = PoolOutputCount(g);
  if (outputs <= 0) return cudaSuccess;
  MaxPoolTapsKernel<<<BlocksFor(outputs), kThreads, 0, stream>>>(g, x, y, tap, outputs);
  return cudaGetLastError();
}

}  // namespace salus::exec::cuda
