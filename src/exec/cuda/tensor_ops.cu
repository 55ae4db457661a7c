// The hand-written kernels of tensor_kernels.cc (tensor_ops_launch.h): grid-stride loops over
// 64-bit indices whose per-element math and index maps are element_math.h's. Ops that only move
// elements are instantiated per element size (uint8_t, uint32_t, uint64_t), the math per element
// type and op, so the op's switch folds away. No kernel shares an output element between
// threads, so every result is deterministic.
#include <cstdint>
#include <type_traits>

#include "exec/cuda/grid.cuh"
#include "exec/cuda/tensor_ops_launch.h"
#include "exec/element_math.h"
#include "exec/hd.h"
#include "exec/philox_math.h"

namespace salus::exec::cuda {
namespace {

// Launches `kernel` over `count` elements (grid-stride), nothing when count is 0.
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), int64_t count, cudaStream_t stream, Args... args) {
  if (count <= 0) return cudaSuccess;
  kernel<<<BlocksFor(count), kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

// Calls fn with a value of an unsigned type `bytes` wide.
template <typename Fn>
cudaError_t BySize(int bytes, Fn&& fn) {
  switch (bytes) {
    case 1:
      return fn(uint8_t{});
    case 4:
      return fn(uint32_t{});
    case 8:
      return fn(uint64_t{});
  }
  return cudaErrorInvalidValue;
}

// Calls fn with a value of the C++ type holding `t`'s elements (uint8_t for bool).
template <typename Fn>
cudaError_t ByType(ElemType t, Fn&& fn) {
  switch (t) {
    case ElemType::kFloat32:
      return fn(float{});
    case ElemType::kInt64:
      return fn(int64_t{});
    case ElemType::kBool:
      return fn(uint8_t{});
  }
  return cudaErrorInvalidValue;
}

// ---------------------------------------------------------------------------------------------
// Data movement.

template <typename T>
__global__ void MapCopyKernel(IndexMap map, const T* __restrict__ x, T* __restrict__ y,
                              int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    y[e] = x[off[0]];
  }
}

template <typename T>
__global__ void SliceKernel(SliceMap map, const T* __restrict__ x, T* __restrict__ y,
                            int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) y[o] = x[SliceSourceIndex(map, o)];
}

template <typename T>
__global__ void GatherKernel(GatherGeometry g, const T* __restrict__ x,
                             const int64_t* __restrict__ indices, T* __restrict__ y,
                             int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) {
    const int64_t index = indices[(o / g.inner) % g.count];
    const bool valid = index >= -g.axis_dim && index < g.axis_dim;
    y[o] = valid ? x[GatherSourceIndex(g, indices, o)] : T{0};
  }
}

template <typename T>
__global__ void GatherElementsKernel(GatherElementsGeometry g, const T* __restrict__ x,
                                     const int64_t* __restrict__ indices, T* __restrict__ y,
                                     int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) {
    const int64_t k = indices[o];
    const bool valid = k >= -g.axis_dim && k < g.axis_dim;
    y[o] = valid ? x[GatherElementsSourceIndex(g, o, k)] : T{0};
  }
}

// One thread per slice element, applying the updates in order (a repeated index: the last
// wins, deterministically); an index tuple out of range is skipped.
template <typename T>
__global__ void ScatterNDKernel(ScatterNDGeometry g, const int64_t* __restrict__ indices,
                                const T* __restrict__ updates, T* __restrict__ y) {
  for (int64_t s = FirstIndex(); s < g.slice; s += GridStride()) {
    for (int64_t m = 0; m < g.count; ++m) {
      const int64_t at = ScatterNDTarget(g, indices + m * g.k);
      if (at >= 0) y[at * g.slice + s] = updates[m * g.slice + s];
    }
  }
}

template <typename T>
__global__ void WhereKernel(IndexMap cond_x, IndexMap y_map, const uint8_t* __restrict__ cond,
                            const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ z,
                            int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t cx[kMaxIndexOperands], yo[kMaxIndexOperands];
    MapIndex(cond_x, e, cx);
    MapIndex(y_map, e, yo);
    z[e] = cond[cx[0]] != 0 ? x[cx[1]] : y[yo[0]];
  }
}

template <typename T>
__global__ void TriluKernel(int64_t rows, int64_t cols, bool upper, const int64_t* __restrict__ k,
                            const T* __restrict__ x, T* __restrict__ y, int64_t count) {
  const int64_t diagonal = k != nullptr ? k[0] : 0;
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const int64_t c = e % cols, r = (e / cols) % rows;
    y[e] = TriluKeeps(r, c, diagonal, upper) ? x[e] : T{0};
  }
}

template <typename T>
__global__ void FillKernel(T value, T* __restrict__ y, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) y[e] = value;
}

__global__ void WriteInt64sKernel(Int64List list, int64_t* __restrict__ y) {
  for (int64_t i = FirstIndex(); i < list.count; i += GridStride()) y[i] = list.values[i];
}

// ---------------------------------------------------------------------------------------------
// Math.

template <TensorUnaryOp kOp>
__global__ void TensorUnaryKernel(const float* __restrict__ x, float* __restrict__ y,
                                  int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const float v = x[e];
    switch (kOp) {
      case TensorUnaryOp::kErf:
        y[e] = erff(v);
        break;
      case TensorUnaryOp::kGeluErf:
        y[e] = GeluErf(v);
        break;
      case TensorUnaryOp::kGeluTanh:
        y[e] = GeluTanh(v);
        break;
      case TensorUnaryOp::kReciprocal:
        y[e] = 1.f / v;
        break;
      case TensorUnaryOp::kLog1p:
        y[e] = log1pf(v);
        break;
      case TensorUnaryOp::kExpm1:
        y[e] = expm1f(v);
        break;
      case TensorUnaryOp::kErfc:
        y[e] = erfcf(v);
        break;
      case TensorUnaryOp::kSin:
        y[e] = sinf(v);
        break;
      case TensorUnaryOp::kCos:
        y[e] = cosf(v);
        break;
      case TensorUnaryOp::kAtan:
        y[e] = atanf(v);
        break;
      case TensorUnaryOp::kFloor:
        y[e] = floorf(v);
        break;
      case TensorUnaryOp::kCeil:
        y[e] = ceilf(v);
        break;
      case TensorUnaryOp::kRound:
        y[e] = rintf(v);  // half to even
        break;
      case TensorUnaryOp::kLgamma:
        y[e] = Lgamma(v);
        break;
      case TensorUnaryOp::kDigamma:
        y[e] = Digamma(v);
        break;
      case TensorUnaryOp::kErfinv:
        y[e] = Erfinv(v);
        break;
    }
  }
}

__global__ void PolygammaKernel(int order, const float* __restrict__ x, float* __restrict__ y,
                                int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) y[e] = Polygamma(order, x[e]);
}

__global__ void NotKernel(const uint8_t* __restrict__ x, uint8_t* __restrict__ y, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) y[e] = x[e] == 0;
}

template <typename F, typename T>
__device__ __forceinline__ T Convert(F x) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return x != 0;  // NaN is true, as numpy's astype(bool)
  } else if constexpr (std::is_same_v<F, float> && std::is_same_v<T, int64_t>) {
    return FloatToInt64(x);
  } else {
    return static_cast<T>(x);
  }
}

template <typename F, typename T>
__global__ void CastKernel(const F* __restrict__ x, T* __restrict__ y, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) y[e] = Convert<F, T>(x[e]);
}

// The bound of an omitted Clip min or max, as the CPU's: none at all.
template <typename T>
__device__ __forceinline__ T Unbounded(bool upper) {
  if constexpr (std::is_same_v<T, float>) {
    return upper ? INFINITY : -INFINITY;
  } else {
    return upper ? INT64_MAX : INT64_MIN;
  }
}

template <typename T>
__global__ void ClipKernel(const T* __restrict__ x, const T* __restrict__ lo_at,
                           const T* __restrict__ hi_at, T* __restrict__ y, int64_t count) {
  const T lo = lo_at != nullptr ? lo_at[0] : Unbounded<T>(false);
  const T hi = hi_at != nullptr ? hi_at[0] : Unbounded<T>(true);
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) y[e] = ApplyClip(x[e], lo, hi);
}

__global__ void ClipConstantKernel(float lo, float hi, const float* __restrict__ x,
                                   float* __restrict__ y, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) y[e] = ApplyClip(x[e], lo, hi);
}

// a may be z (in place), so neither is __restrict__.
template <bool kMax, typename T>
__global__ void MinMaxKernel(IndexMap map, const T* a, const T* __restrict__ b, T* z,
                             int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    z[e] = kMax ? ApplyMax(a[off[0]], b[off[1]]) : ApplyMin(a[off[0]], b[off[1]]);
  }
}

template <CompareOp kOp, typename T>
__global__ void CompareKernel(IndexMap map, const T* a, const T* b, uint8_t* __restrict__ z,
                              int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    z[e] = ApplyCompare(kOp, a[off[0]], b[off[1]]);
  }
}

__global__ void BoolEqualKernel(IndexMap map, const uint8_t* a, const uint8_t* b,
                                uint8_t* __restrict__ z, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    z[e] = (a[off[0]] != 0) == (b[off[1]] != 0);
  }
}

template <bool kAnd>
__global__ void LogicKernel(IndexMap map, const uint8_t* a, const uint8_t* b,
                            uint8_t* __restrict__ z, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    const bool u = a[off[0]] != 0, v = b[off[1]] != 0;
    z[e] = kAnd ? (u && v) : (u || v);
  }
}

__global__ void ModFloatKernel(IndexMap map, const float* a, const float* b, float* __restrict__ z,
                               int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    z[e] = ModFloat(a[off[0]], b[off[1]]);
  }
}

__global__ void ModInt64Kernel(IndexMap map, bool fmod, const int64_t* a, const int64_t* b,
                               int64_t* __restrict__ z, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    int64_t off[kMaxIndexOperands];
    MapIndex(map, e, off);
    z[e] = ModInt64(a[off[0]], b[off[1]], fmod);
  }
}

template <typename T>
__global__ void RangeKernel(const T* __restrict__ start_at, const T* __restrict__ delta_at,
                            T* __restrict__ y, int64_t count) {
  const T start = start_at[0], delta = delta_at[0];
  for (int64_t i = FirstIndex(); i < count; i += GridStride()) {
    if constexpr (std::is_same_v<T, int64_t>) {
      // Wraps like numpy rather than overflow, as the CPU's.
      y[i] = static_cast<int64_t>(static_cast<uint64_t>(start) +
                                  static_cast<uint64_t>(i) * static_cast<uint64_t>(delta));
    } else {
      y[i] = start + static_cast<T>(i) * delta;
    }
  }
}

}  // namespace

cudaError_t LaunchMapCopy(const IndexMap& map, int elem_bytes, const void* x, void* y,
                          cudaStream_t stream) {
  return BySize(elem_bytes, [&](auto tag) {
    using T = decltype(tag);
    return Launch(&MapCopyKernel<T>, IndexMapCount(map), stream, map, static_cast<const T*>(x),
                  static_cast<T*>(y), IndexMapCount(map));
  });
}

cudaError_t LaunchSlice(const SliceMap& map, int elem_bytes, const void* x, void* y,
                        cudaStream_t stream) {
  const int64_t count = SliceOutputCount(map);
  return BySize(elem_bytes, [&](auto tag) {
    using T = decltype(tag);
    return Launch(&SliceKernel<T>, count, stream, map, static_cast<const T*>(x), static_cast<T*>(y),
                  count);
  });
}

cudaError_t LaunchGather(const GatherGeometry& g, int elem_bytes, const void* x,
                         const int64_t* indices, void* y, cudaStream_t stream) {
  const int64_t count = g.outer * g.count * g.inner;
  return BySize(elem_bytes, [&](auto tag) {
    using T = decltype(tag);
    return Launch(&GatherKernel<T>, count, stream, g, static_cast<const T*>(x), indices,
                  static_cast<T*>(y), count);
  });
}

cudaError_t LaunchGatherElements(const GatherElementsGeometry& g, int64_t count, int elem_bytes,
                                 const void* x, const int64_t* indices, void* y,
                                 cudaStream_t stream) {
  return BySize(elem_bytes, [&](auto tag) {
    using T = decltype(tag);
    return Launch(&GatherElementsKernel<T>, count, stream, g, static_cast<const T*>(x), indices,
                  static_cast<T*>(y), count);
  });
}

cudaError_t LaunchScatterND(const ScatterNDGeometry& g, int64_t total, int elem_bytes,
                            const void* x, const int64_t* indices, const void* updates, void* y,
                            cudaStream_t stream) {
  if (y != x) {
    const cudaError_t copied = cudaMemcpyAsync(y, x, static_cast<size_t>(total) * elem_bytes,
                                               cudaMemcpyDeviceToDevice, stream);
    if (copied != cudaSuccess) return copied;
  }
  return BySize(elem_bytes, [&](auto tag) {
    using T = decltype(tag);
    return Launch(&ScatterNDKernel<T>, g.slice, stream, g, indices, static_cast<const T*>(updates),
                  static_cast<T*>(y));
  });
}

cudaError_t LaunchWhere(const IndexMap& cond_x, const IndexMap& y_map, int elem_bytes,
                        const uint8_t* cond, const void* x, const void* y, void* z,
                        cudaStream_t stream) {
  const int64_t count = IndexMapCount(cond_x);
  return BySize(elem_bytes, [&](auto tag) {
    using T = decltype(tag);
    return Launch(&WhereKernel<T>, count, stream, cond_x, y_map, cond, static_cast<const T*>(x),
                  static_cast<const T*>(y), static_cast<T*>(z), count);
  });
}

cudaError_t LaunchTrilu(int64_t matrices, int64_t rows, int64_t cols, bool upper, const int64_t* k,
                        int elem_bytes, const void* x, void* y, cudaStream_t stream) {
  const int64_t count = matrices * rows * cols;
  return BySize(elem_bytes, [&](auto tag) {
    using T = decltype(tag);
    return Launch(&TriluKernel<T>, count, stream, rows, cols, upper, k, static_cast<const T*>(x),
                  static_cast<T*>(y), count);
  });
}

cudaError_t LaunchFill(uint64_t bits, int elem_bytes, int64_t count, void* y, cudaStream_t stream) {
  return BySize(elem_bytes, [&](auto tag) {
    using T = decltype(tag);
    return Launch(&FillKernel<T>, count, stream, static_cast<T>(bits), static_cast<T*>(y), count);
  });
}

cudaError_t LaunchWriteInt64s(const Int64List& list, int64_t* y, cudaStream_t stream) {
  if (list.count < 0 || list.count > kMaxListValues) return cudaErrorInvalidValue;
  return Launch(&WriteInt64sKernel, list.count, stream, list, y);
}

cudaError_t LaunchTensorUnary(TensorUnaryOp op, const float* x, float* y, int64_t count,
                              cudaStream_t stream) {
  switch (op) {
    case TensorUnaryOp::kErf:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kErf>, count, stream, x, y, count);
    case TensorUnaryOp::kGeluErf:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kGeluErf>, count, stream, x, y, count);
    case TensorUnaryOp::kGeluTanh:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kGeluTanh>, count, stream, x, y, count);
    case TensorUnaryOp::kReciprocal:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kReciprocal>, count, stream, x, y, count);
    case TensorUnaryOp::kLog1p:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kLog1p>, count, stream, x, y, count);
    case TensorUnaryOp::kExpm1:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kExpm1>, count, stream, x, y, count);
    case TensorUnaryOp::kErfc:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kErfc>, count, stream, x, y, count);
    case TensorUnaryOp::kSin:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kSin>, count, stream, x, y, count);
    case TensorUnaryOp::kCos:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kCos>, count, stream, x, y, count);
    case TensorUnaryOp::kAtan:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kAtan>, count, stream, x, y, count);
    case TensorUnaryOp::kFloor:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kFloor>, count, stream, x, y, count);
    case TensorUnaryOp::kCeil:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kCeil>, count, stream, x, y, count);
    case TensorUnaryOp::kRound:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kRound>, count, stream, x, y, count);
    case TensorUnaryOp::kLgamma:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kLgamma>, count, stream, x, y, count);
    case TensorUnaryOp::kDigamma:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kDigamma>, count, stream, x, y, count);
    case TensorUnaryOp::kErfinv:
      return Launch(&TensorUnaryKernel<TensorUnaryOp::kErfinv>, count, stream, x, y, count);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchPolygamma(int order, const float* x, float* y, int64_t count,
                            cudaStream_t stream) {
  return Launch(&PolygammaKernel, count, stream, order, x, y, count);
}

cudaError_t LaunchNot(const uint8_t* x, uint8_t* y, int64_t count, cudaStream_t stream) {
  return Launch(&NotKernel, count, stream, x, y, count);
}

cudaError_t LaunchCast(ElemType from, ElemType to, const void* x, void* y, int64_t count,
                       cudaStream_t stream) {
  return ByType(from, [&](auto from_tag) {
    using F = decltype(from_tag);
    return ByType(to, [&](auto to_tag) {
      using T = decltype(to_tag);
      return Launch(&CastKernel<F, T>, count, stream, static_cast<const F*>(x), static_cast<T*>(y),
                    count);
    });
  });
}

cudaError_t LaunchClip(ElemType t, const void* x, const void* lo, const void* hi, void* y,
                       int64_t count, cudaStream_t stream) {
  switch (t) {
    case ElemType::kFloat32:
      return Launch(&ClipKernel<float>, count, stream, static_cast<const float*>(x),
                    static_cast<const float*>(lo), static_cast<const float*>(hi),
                    static_cast<float*>(y), count);
    case ElemType::kInt64:
      return Launch(&ClipKernel<int64_t>, count, stream, static_cast<const int64_t*>(x),
                    static_cast<const int64_t*>(lo), static_cast<const int64_t*>(hi),
                    static_cast<int64_t*>(y), count);
    case ElemType::kBool:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchClipConstant(float lo, float hi, const float* x, float* y, int64_t count,
                               cudaStream_t stream) {
  return Launch(&ClipConstantKernel, count, stream, lo, hi, x, y, count);
}

cudaError_t LaunchMinMax(bool is_max, ElemType t, const IndexMap& map, const void* a, const void* b,
                         void* z, cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  return ByType(t, [&](auto tag) {
    using T = decltype(tag);
    const T* u = static_cast<const T*>(a);
    const T* v = static_cast<const T*>(b);
    T* w = static_cast<T*>(z);
    return is_max ? Launch(&MinMaxKernel<true, T>, count, stream, map, u, v, w, count)
                  : Launch(&MinMaxKernel<false, T>, count, stream, map, u, v, w, count);
  });
}

namespace {

template <typename T>
cudaError_t CompareOf(CompareOp op, const IndexMap& map, const T* a, const T* b, uint8_t* z,
                      int64_t count, cudaStream_t stream) {
  switch (op) {
    case CompareOp::kEqual:
      return Launch(&CompareKernel<CompareOp::kEqual, T>, count, stream, map, a, b, z, count);
    case CompareOp::kLess:
      return Launch(&CompareKernel<CompareOp::kLess, T>, count, stream, map, a, b, z, count);
    case CompareOp::kGreater:
      return Launch(&CompareKernel<CompareOp::kGreater, T>, count, stream, map, a, b, z, count);
    case CompareOp::kLessOrEqual:
      return Launch(&CompareKernel<CompareOp::kLessOrEqual, T>, count, stream, map, a, b, z, count);
    case CompareOp::kGreaterOrEqual:
      return Launch(&CompareKernel<CompareOp::kGreaterOrEqual, T>, count, stream, map, a, b, z,
                    count);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchCompare(CompareOp op, ElemType t, const IndexMap& map, const void* a,
                          const void* b, uint8_t* z, cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  switch (t) {
    case ElemType::kFloat32:
      return CompareOf(op, map, static_cast<const float*>(a), static_cast<const float*>(b), z,
                       count, stream);
    case ElemType::kInt64:
      return CompareOf(op, map, static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), z,
                       count, stream);
    case ElemType::kBool:
      if (op != CompareOp::kEqual) break;
      return Launch(&BoolEqualKernel, count, stream, map, static_cast<const uint8_t*>(a),
                    static_cast<const uint8_t*>(b), z, count);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchLogic(bool is_and, const IndexMap& map, const uint8_t* a, const uint8_t* b,
                        uint8_t* z, cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  return is_and ? Launch(&LogicKernel<true>, count, stream, map, a, b, z, count)
                : Launch(&LogicKernel<false>, count, stream, map, a, b, z, count);
}

cudaError_t LaunchMod(ElemType t, bool fmod, const IndexMap& map, const void* a, const void* b,
                      void* z, cudaStream_t stream) {
  const int64_t count = IndexMapCount(map);
  switch (t) {
    case ElemType::kFloat32:
      return Launch(&ModFloatKernel, count, stream, map, static_cast<const float*>(a),
                    static_cast<const float*>(b), static_cast<float*>(z), count);
    case ElemType::kInt64:
      return Launch(&ModInt64Kernel, count, stream, map, fmod, static_cast<const int64_t*>(a),
                    static_cast<const int64_t*>(b), static_cast<int64_t*>(z), count);
    case ElemType::kBool:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchRange(ElemType t, const void* start, const void* delta, void* y, int64_t count,
                        cudaStream_t stream) {
  switch (t) {
    case ElemType::kFloat32:
      return Launch(&RangeKernel<float>, count, stream, static_cast<const float*>(start),
                    static_cast<const float*>(delta), static_cast<float*>(y), count);
    case ElemType::kInt64:
      return Launch(&RangeKernel<int64_t>, count, stream, static_cast<const int64_t*>(start),
                    static_cast<const int64_t*>(delta), static_cast<int64_t*>(y), count);
    case ElemType::kBool:
      break;
  }
  return cudaErrorInvalidValue;
}

// ---------------------------------------------------------------------------------------------
// Variables.

namespace {

template <typename T>
__global__ void AssignKernel(AssignMode mode, T* __restrict__ v, const T* __restrict__ x,
                             int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    v[e] = mode == AssignMode::kAdd ? v[e] + x[e] : v[e] - x[e];
  }
}

template <typename T>
__global__ void ArgMaxKernel(ArgMaxGeometry g, const T* __restrict__ x, int64_t* __restrict__ y,
                             int64_t count) {
  for (int64_t o = FirstIndex(); o < count; o += GridStride()) y[o] = ArgMaxAt(g, x, o);
}

template <typename T>
__global__ void SortKernel(ArgMaxGeometry g, bool descending, const T* __restrict__ x,
                           T* __restrict__ values, int64_t* __restrict__ indices, int64_t count) {
  for (int64_t e = FirstIndex(); e < count; e += GridStride()) {
    const int64_t i = e % g.inner, a = (e / g.inner) % g.axis_dim;
    const int64_t base = (e / (g.inner * g.axis_dim)) * g.axis_dim * g.inner + i;
    const T v = x[e];
    int64_t rank = 0;
    for (int64_t b = 0; b < g.axis_dim; ++b) {
      rank += SortsBefore(x[base + b * g.inner], b, v, a, descending) ? 1 : 0;
    }
    values[base + rank * g.inner] = v;
    indices[base + rank * g.inner] = a;
  }
}

__global__ void PhiloxKeyCounterKernel(const int64_t* __restrict__ seed, bool int32_seed,
                                       int64_t* __restrict__ key, int64_t* __restrict__ counter) {
  uint64_t k = 0;
  uint64_t c[2] = {0, 0};
  PhiloxKeyCounterOfSeed(PhiloxSeedWord(seed[0], int32_seed), PhiloxSeedWord(seed[1], int32_seed),
                         &k, c);
  key[0] = static_cast<int64_t>(k);
  counter[0] = static_cast<int64_t>(c[0]);
  counter[1] = static_cast<int64_t>(c[1]);
}

__global__ void RandomKernel(PhiloxDistribution d, const int64_t* __restrict__ key,
                             const int64_t* __restrict__ counter, int64_t count, int64_t groups,
                             float* __restrict__ y) {
  const auto k = static_cast<uint64_t>(key[0]);
  const auto lo = static_cast<uint64_t>(counter[0]);
  const auto hi = static_cast<uint64_t>(counter[1]);
  for (int64_t g = FirstIndex(); g < groups; g += GridStride()) {
    PhiloxGroup(d, k, lo, hi, g, count, y);
  }
}

}  // namespace

cudaError_t LaunchAssign(AssignMode mode, ElemType t, void* variable, const void* x, int64_t count,
                         cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (mode == AssignMode::kSet) {
    const size_t bytes = static_cast<size_t>(count) * (t == ElemType::kBool    ? 1
                                                       : t == ElemType::kInt64 ? 8
                                                                               : 4);
    if (variable == x) return cudaSuccess;
    return cudaMemcpyAsync(variable, x, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  switch (t) {
    case ElemType::kFloat32:
      return Launch(&AssignKernel<float>, count, stream, mode, static_cast<float*>(variable),
                    static_cast<const float*>(x), count);
    case ElemType::kInt64:
      // Wrapping, as TensorFlow's integer arithmetic.
      return Launch(&AssignKernel<uint64_t>, count, stream, mode, static_cast<uint64_t*>(variable),
                    static_cast<const uint64_t*>(x), count);
    case ElemType::kBool:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchArgMax(ElemType t, const ArgMaxGeometry& g, const void* x, int64_t* y,
                         cudaStream_t stream) {
  const int64_t count = g.outer * g.inner;
  switch (t) {
    case ElemType::kFloat32:
      return Launch(&ArgMaxKernel<float>, count, stream, g, static_cast<const float*>(x), y, count);
    case ElemType::kInt64:
      return Launch(&ArgMaxKernel<int64_t>, count, stream, g, static_cast<const int64_t*>(x), y,
                    count);
    case ElemType::kBool:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSort(ElemType t, const ArgMaxGeometry& g, bool descending, const void* x,
                       void* values, int64_t* indices, cudaStream_t stream) {
  const int64_t count = g.outer * g.axis_dim * g.inner;
  switch (t) {
    case ElemType::kFloat32:
      return Launch(&SortKernel<float>, count, stream, g, descending, static_cast<const float*>(x),
                    static_cast<float*>(values), indices, count);
    case ElemType::kInt64:
      return Launch(&SortKernel<int64_t>, count, stream, g, descending,
                    static_cast<const int64_t*>(x), static_cast<int64_t*>(values), indices, count);
    case ElemType::kBool:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchPhiloxKeyCounter(const int64_t* seed, bool int32_seed, int64_t* key,
                                   int64_t* counter, cudaStream_t stream) {
  return Launch(&PhiloxKeyCounterKernel, 1, stream, seed, int32_seed, key, counter);
}

cudaError_t LaunchRandom(PhiloxDistribution d, const int64_t* key, const int64_t* counter,
                         int64_t count, float* y, cudaStream_t stream) {
  const int64_t groups = (count + 3) / 4;
  return Launch(&RandomKernel, groups, stream, d, key, counter, count, groups, y);
}

}  // namespace salus::exec::cuda
