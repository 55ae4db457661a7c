// Launch interface of tensor_ops.cu (C++17: nvcc compiles it): the hand-written kernels behind
// tensor_kernels.cc, the tensor ops of exported models. The per-element math and index maps are
// element_math.h's, which the CPU kernels (cpu_tensor_kernels.cc) share.
//
// Each function queues its kernel on `stream` and returns the launch's error
// (cudaGetLastError); it never waits for it and allocates nothing. Tensors are packed, in device
// memory; bool is one byte per element, read as zero or not. Ops that only move elements take
// the element's size in bytes (1, 4 or 8), so one kernel serves float, int64 and bool. Nothing is
// launched for an empty tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "exec/element_math.h"
#include "exec/philox_math.h"

namespace salus::exec::cuda {

// The element types of the tensor ops' math.
enum class ElemType : int32_t { kFloat32, kInt64, kBool };

// ---------------------------------------------------------------------------------------------
// Data movement.

// y[e] = x[MapIndex(map, e)[0]] for every element of the map (Expand).
cudaError_t LaunchMapCopy(const IndexMap& map, int elem_bytes, const void* x, void* y,
                          cudaStream_t stream);

// y[o] = x[SliceSourceIndex(map, o)] for every element of the slice.
cudaError_t LaunchSlice(const SliceMap& map, int elem_bytes, const void* x, void* y,
                        cudaStream_t stream);

// y[o] = x[GatherSourceIndex(g, indices, o)] for the g.outer * g.count * g.inner elements of y.
// An index outside [-axis_dim, axis_dim) gives zeros (the CPU refuses it when it runs; reporting
// it here would need a host read of device data).
cudaError_t LaunchGather(const GatherGeometry& g, int elem_bytes, const void* x,
                         const int64_t* indices, void* y, cudaStream_t stream);

// y[o] = x[GatherElementsSourceIndex(g, o, indices[o])] for o < count; 0 where the index is out
// of range (a kernel cannot fail; the CPU's reports it).
cudaError_t LaunchGatherElements(const GatherElementsGeometry& g, int64_t count, int elem_bytes,
                                 const void* x, const int64_t* indices, void* y,
                                 cudaStream_t stream);

// y = x (`total` elements) with the slices ScatterNDTarget addresses replaced by the updates,
// in order; an index tuple out of range is skipped (a kernel cannot fail; the CPU's reports it).
cudaError_t LaunchScatterND(const ScatterNDGeometry& g, int64_t total, int elem_bytes,
                            const void* x, const int64_t* indices, const void* updates, void* y,
                            cudaStream_t stream);

// z[e] = cond[c] != 0 ? x[i] : y[j], with (c, i) = MapIndex(cond_x, e) and
// j = MapIndex(y_map, e)[0]; both maps have z's elements.
cudaError_t LaunchWhere(const IndexMap& cond_x, const IndexMap& y_map, int elem_bytes,
                        const uint8_t* cond, const void* x, const void* y, void* z,
                        cudaStream_t stream);

// Trilu over `matrices` row-major matrices of rows x cols: element (r, c) is kept where
// TriluKeeps(r, c, k, upper), zero elsewhere. k is read from device memory (*k), 0 when k is
// null.
cudaError_t LaunchTrilu(int64_t matrices, int64_t rows, int64_t cols, bool upper, const int64_t* k,
                        int elem_bytes, const void* x, void* y, cudaStream_t stream);

// Every one of `count` elements of y is the low elem_bytes bytes of `bits` (little-endian).
cudaError_t LaunchFill(uint64_t bits, int elem_bytes, int64_t count, void* y, cudaStream_t stream);

// A short list of int64 values passed by value (Shape's output).
inline constexpr int kMaxListValues = 16;
struct Int64List {
  int32_t count = 0;
  int64_t values[kMaxListValues] = {};
};

// y[i] = list.values[i] for i < list.count.
cudaError_t LaunchWriteInt64s(const Int64List& list, int64_t* y, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Math.

enum class TensorUnaryOp : int32_t {
  kErf,
  kGeluErf,
  kGeluTanh,
  kReciprocal,
  kLog1p,
  kExpm1,
  kErfc,
  kSin,
  kCos,
  kAtan,
  kFloor,
  kCeil,
  kRound,
  kLgamma,
  kDigamma,
  kErfinv
};

// y = op(x) over `count` floats: erff, element_math.h's GeluErf and GeluTanh, 1 / x.
cudaError_t LaunchTensorUnary(TensorUnaryOp op, const float* x, float* y, int64_t count,
                              cudaStream_t stream);

// y = element_math.h's Polygamma(order, x) over `count` floats.
cudaError_t LaunchPolygamma(int order, const float* x, float* y, int64_t count,
                            cudaStream_t stream);

// y = !x over `count` bools.
cudaError_t LaunchNot(const uint8_t* x, uint8_t* y, int64_t count, cudaStream_t stream);

// y = x converted from `from` to `to` (different types) over `count` elements, as the CPU's
// Cast: to bool is x != 0, float to int64 is FloatToInt64, the rest static_cast.
cudaError_t LaunchCast(ElemType from, ElemType to, const void* x, void* y, int64_t count,
                       cudaStream_t stream);

// y = ApplyClip(x, lo, hi) over `count` elements of type t (float or int64); lo and hi are
// scalars read from device memory, or null for no bound.
cudaError_t LaunchClip(ElemType t, const void* x, const void* lo, const void* hi, void* y,
                       int64_t count, cudaStream_t stream);

// Clip with bounds known when the kernel is built (opset < 11).
cudaError_t LaunchClipConstant(float lo, float hi, const float* x, float* y, int64_t count,
                               cudaStream_t stream);

// z[e] = ApplyMax (is_max) or ApplyMin of (a[off[0]], b[off[1]]), off = MapIndex(map, e). a may
// be z itself when map's operand 0 is z's own dense layout (each element reads only itself).
cudaError_t LaunchMinMax(bool is_max, ElemType t, const IndexMap& map, const void* a, const void* b,
                         void* z, cudaStream_t stream);

// z[e] = ApplyCompare(op, a[off[0]], b[off[1]]) for float and int64; for bool (Equal only)
// (a != 0) == (b != 0).
cudaError_t LaunchCompare(CompareOp op, ElemType t, const IndexMap& map, const void* a,
                          const void* b, uint8_t* z, cudaStream_t stream);

// z[e] = a[off[0]] && b[off[1]] (is_and) or ||, on bools.
cudaError_t LaunchLogic(bool is_and, const IndexMap& map, const uint8_t* a, const uint8_t* b,
                        uint8_t* z, cudaStream_t stream);

// z[e] = ModFloat (float) or ModInt64(., ., fmod) (int64) of (a[off[0]], b[off[1]]).
cudaError_t LaunchMod(ElemType t, bool fmod, const IndexMap& map, const void* a, const void* b,
                      void* z, cudaStream_t stream);

// y[i] = start + i * delta for i < count (float or int64; int64 wraps), start and delta scalars
// read from device memory.
cudaError_t LaunchRange(ElemType t, const void* start, const void* delta, void* y, int64_t count,
                        cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Variables (TensorFlow graphs).

// In place, for `count` elements: variable = x (kSet, any element type), variable + x (kAdd) or
// variable - x (kSub; float32 and int64, int64 wrapping) (SalusAssign).
enum class AssignMode : int32_t { kSet, kAdd, kSub };
cudaError_t LaunchAssign(AssignMode mode, ElemType t, void* variable, const void* x, int64_t count,
                         cudaStream_t stream);

// y[o] = ArgMaxAt(g, x, o) for the g.outer * g.inner outputs; float32 or int64 x (SalusArgMax).
cudaError_t LaunchArgMax(ElemType t, const ArgMaxGeometry& g, const void* x, int64_t* y,
                         cudaStream_t stream);
// SalusSort: each element's rank in its slice (SortsBefore, element_math.h) counted by its own
// thread, which writes the element and its index there; float32 or int64 x.
cudaError_t LaunchSort(ElemType t, const ArgMaxGeometry& g, bool descending, const void* x,
                       void* values, int64_t* indices, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Stateless random numbers (Note [Stateless random numbers] in philox_math.h), TensorFlow's
// uint64 words carried as int64 of the same bits, read by the kernels from device memory.

// key[0], counter[0..1] = PhiloxKeyCounterOfSeed of seed[0], seed[1] read by PhiloxSeedWord
// (SalusPhiloxKeyCounter).
cudaError_t LaunchPhiloxKeyCounter(const int64_t* seed, bool int32_seed, int64_t* key,
                                   int64_t* counter, cudaStream_t stream);

// The `count` floats of distribution d of key[0] and counter[0..1], one thread per group of four
// (SalusRandomUniform, SalusRandomNormal, SalusRandomTruncatedNormal).
cudaError_t LaunchRandom(PhiloxDistribution d, const int64_t* key, const int64_t* counter,
                         int64_t count, float* y, cudaStream_t stream);

}  // namespace salus::exec::cuda
