// Index math of the CUDA device's hand-written window kernels (pool_bn.cu): generic pooling and
// the padding copy. The per-element functions are SALUS_HD, so host tests run exactly the code
// the GPU runs (tests/unit/exec/pool_math_test.cc compares them with the CPU executable).
//
// Geometries are always 3-D: a window of rank r < 3 occupies the last r dims and the leading ones
// have size 1 (kernel 1, stride 1, dilation 1, no padding), so the kernels need no rank loop.
//
// Pooling has the CPU's semantics (oneDNN's pooling_v2 over the window ComputeWindow resolves):
//   - max: taps outside the input are skipped; a tap wins only if it is greater than the best so
//     far, which starts at the lowest float, so NaN taps never win and a window with no tap in
//     the input gives -FLT_MAX;
//   - average excluding padding: the sum of the taps inside the input over their count (the end
//     padding ceil_mode adds counts as padding, as an explicit pad does); windows with no tap
//     are refused when the kernel is built, as the CPU refuses them;
//   - average including padding: the sum over the number of taps of the window (the CPU refuses
//     ceil_mode with count_include_pad, so every tap lies in the input or its explicit padding).
// Sums run over the taps in row-major order, as the CPU's do.
//
// C++17 with no project header beyond hd.h: nvcc compiles pool_bn.cu, which includes this.
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "exec/hd.h"

namespace salus::exec::cuda {

inline constexpr int kMaxWindowDims = 3;

enum class PoolMode : int32_t { kMax, kAverageExcludePad, kAverageIncludePad };

struct PoolGeometry {
  PoolMode mode = PoolMode::kMax;
  int64_t planes = 0;  // N * C: each plane is pooled on its own
  int64_t in[kMaxWindowDims] = {1, 1, 1};
  int64_t out[kMaxWindowDims] = {1, 1, 1};
  int64_t kernel[kMaxWindowDims] = {1, 1, 1};
  int64_t stride[kMaxWindowDims] = {1, 1, 1};
  int64_t dilation[kMaxWindowDims] = {1, 1, 1};
  int64_t pad_begin[kMaxWindowDims] = {0, 0, 0};
};

// Output element j of a plane reads input element j - offset (per dim) of the same plane, or 0
// where that lies outside the input: a positive offset pads, a negative one crops.
struct PadGeometry {
  int64_t planes = 0;
  int64_t in[kMaxWindowDims] = {1, 1, 1};
  int64_t out[kMaxWindowDims] = {1, 1, 1};
  int64_t offset[kMaxWindowDims] = {0, 0, 0};
};

SALUS_HD int64_t PoolOutputCount(const PoolGeometry& g) {
  return g.planes * g.out[0] * g.out[1] * g.out[2];
}

SALUS_HD int64_t PadOutputCount(const PadGeometry& g) {
  return g.planes * g.out[0] * g.out[1] * g.out[2];
}

// Output element `o` (row-major over [planes, out...]) of pooling x ([planes, in...]).
SALUS_HD float PoolAt(const PoolGeometry& g, const float* x, int64_t o) {
  const int64_t o2 = o % g.out[2];
  int64_t rest = o / g.out[2];
  const int64_t o1 = rest % g.out[1];
  rest /= g.out[1];
  const int64_t o0 = rest % g.out[0];
  const int64_t plane = rest / g.out[0];
  const float* p = x + plane * g.in[0] * g.in[1] * g.in[2];
  const int64_t start0 = o0 * g.stride[0] - g.pad_begin[0];
  const int64_t start1 = o1 * g.stride[1] - g.pad_begin[1];
  const int64_t start2 = o2 * g.stride[2] - g.pad_begin[2];
  const bool is_max = g.mode == PoolMode::kMax;
  float acc = is_max ? -FLT_MAX : 0.f;
  int64_t inside = 0;
  for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
    const int64_t i0 = start0 + k0 * g.dilation[0];
    if (i0 < 0 || i0 >= g.in[0]) continue;
    for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
      const int64_t i1 = start1 + k1 * g.dilation[1];
      if (i1 < 0 || i1 >= g.in[1]) continue;
      const float* row = p + (i0 * g.in[1] + i1) * g.in[2];
      for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
        const int64_t i2 = start2 + k2 * g.dilation[2];
        if (i2 < 0 || i2 >= g.in[2]) continue;
        const float v = row[i2];
        if (is_max) {
          if (v > acc) acc = v;
        } else {
          acc += v;
        }
        ++inside;
      }
    }
  }
  if (is_max) return acc;
  const int64_t divisor =
      g.mode == PoolMode::kAverageIncludePad ? g.kernel[0] * g.kernel[1] * g.kernel[2] : inside;
  return acc / static_cast<float>(divisor);
}

// Pooling's gradient, in two passes with no atomics. PoolTap gives, per output element, what
// the second pass needs: for max pooling the in-plane index of the tap PoolAt chose (the first
// greatest; -1 when none beat -FLT_MAX), for average pooling the divisor. PoolGradAt then
// gathers, per input element, the gradients of the outputs whose windows hold it, in a fixed
// order: dy[o] where o chose it (max), dy[o] / divisor[o] (average).
SALUS_HD int64_t PoolTap(const PoolGeometry& g, const float* x, int64_t o) {
  const int64_t o2 = o % g.out[2];
  int64_t rest = o / g.out[2];
  const int64_t o1 = rest % g.out[1];
  rest /= g.out[1];
  const int64_t o0 = rest % g.out[0];
  const int64_t plane = rest / g.out[0];
  const float* p = x + plane * g.in[0] * g.in[1] * g.in[2];
  const int64_t start0 = o0 * g.stride[0] - g.pad_begin[0];
  const int64_t start1 = o1 * g.stride[1] - g.pad_begin[1];
  const int64_t start2 = o2 * g.stride[2] - g.pad_begin[2];
  const bool is_max = g.mode == PoolMode::kMax;
  float best = -FLT_MAX;
  int64_t chosen = -1, inside = 0;
  for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
    const int64_t i0 = start0 + k0 * g.dilation[0];
    if (i0 < 0 || i0 >= g.in[0]) continue;
    for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
      const int64_t i1 = start1 + k1 * g.dilation[1];
      if (i1 < 0 || i1 >= g.in[1]) continue;
      for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
        const int64_t i2 = start2 + k2 * g.dilation[2];
        if (i2 < 0 || i2 >= g.in[2]) continue;
        const int64_t at = (i0 * g.in[1] + i1) * g.in[2] + i2;
        if (is_max && p[at] > best) {
          best = p[at];
          chosen = at;
        }
        ++inside;
      }
    }
  }
  if (is_max) return chosen;
  return g.mode == PoolMode::kAverageIncludePad ? g.kernel[0] * g.kernel[1] * g.kernel[2] : inside;
}

// Max pooling's output `o` from its tap (PoolTap's value): the input element chosen, or
// -FLT_MAX where no element beat it; equal to PoolAt's. SalusMaxPool writes both at once.
SALUS_HD float PoolAtTap(const PoolGeometry& g, const float* x, int64_t tap, int64_t o) {
  if (tap < 0) return -FLT_MAX;
  const int64_t plane = o / (g.out[0] * g.out[1] * g.out[2]);
  return x[plane * g.in[0] * g.in[1] * g.in[2] + tap];
}

// Input element `i` (row-major over [planes, in...]) of the gradient, from dy and PoolTap's
// values for every output element.
SALUS_HD float PoolGradAt(const PoolGeometry& g, const float* dy, const int64_t* tap, int64_t i) {
  const int64_t i2 = i % g.in[2];
  int64_t rest = i / g.in[2];
  const int64_t i1 = rest % g.in[1];
  rest /= g.in[1];
  const int64_t i0 = rest % g.in[0];
  const int64_t plane = rest / g.in[0];
  const int64_t at = (i0 * g.in[1] + i1) * g.in[2] + i2;
  const bool is_max = g.mode == PoolMode::kMax;
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
    const int64_t s0 = i0 + g.pad_begin[0] - k0 * g.dilation[0];
    if (s0 < 0 || s0 % g.stride[0] != 0 || s0 / g.stride[0] >= g.out[0]) continue;
    for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
      const int64_t s1 = i1 + g.pad_begin[1] - k1 * g.dilation[1];
      if (s1 < 0 || s1 % g.stride[1] != 0 || s1 / g.stride[1] >= g.out[1]) continue;
      for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
        const int64_t s2 = i2 + g.pad_begin[2] - k2 * g.dilation[2];
        if (s2 < 0 || s2 % g.stride[2] != 0 || s2 / g.stride[2] >= g.out[2]) continue;
        const int64_t o =
            ((plane * g.out[0] + s0 / g.stride[0]) * g.out[1] + s1 / g.stride[1]) * g.out[2] +
            s2 / g.stride[2];
        if (is_max) {
          if (tap[o] == at) acc += dy[o];
        } else {
          acc += dy[o] / static_cast<float>(tap[o]);
        }
      }
    }
  }
  return acc;
}

// The input element output element `o` copies, or -1 where it is padding.
SALUS_HD int64_t PadSource(const PadGeometry& g, int64_t o) {
  const int64_t j2 = o % g.out[2];
  int64_t rest = o / g.out[2];
  const int64_t j1 = rest % g.out[1];
  rest /= g.out[1];
  const int64_t j0 = rest % g.out[0];
  const int64_t plane = rest / g.out[0];
  const int64_t i0 = j0 - g.offset[0];
  const int64_t i1 = j1 - g.offset[1];
  const int64_t i2 = j2 - g.offset[2];
  if (i0 < 0 || i0 >= g.in[0] || i1 < 0 || i1 >= g.in[1] || i2 < 0 || i2 >= g.in[2]) return -1;
  return ((plane * g.in[0] + i0) * g.in[1] + i1) * g.in[2] + i2;
}

// Host-side builders from per-dim vectors of one window rank (1 to kMaxWindowDims; the caller
// checks): the dims go last, as the file comment says.
inline void PlaceWindowDims(const std::vector<int64_t>& v, int64_t* dst) {
  const size_t skip = kMaxWindowDims - v.size();
  for (size_t i = 0; i < v.size(); ++i) dst[skip + i] = v[i];
}

inline PoolGeometry MakePoolGeometry(PoolMode mode, int64_t planes, const std::vector<int64_t>& in,
                                     const std::vector<int64_t>& out,
                                     const std::vector<int64_t>& kernel,
                                     const std::vector<int64_t>& stride,
                                     const std::vector<int64_t>& dilation,
                                     const std::vector<int64_t>& pad_begin) {
  PoolGeometry g;
  g.mode = mode;
  g.planes = planes;
  PlaceWindowDims(in, g.in);
  PlaceWindowDims(out, g.out);
  PlaceWindowDims(kernel, g.kernel);
  PlaceWindowDims(stride, g.stride);
  PlaceWindowDims(dilation, g.dilation);
  PlaceWindowDims(pad_begin, g.pad_begin);
  return g;
}

inline PadGeometry MakePadGeometry(int64_t planes, const std::vector<int64_t>& in,
                                   const std::vector<int64_t>& out,
                                   const std::vector<int64_t>& offset) {
  PadGeometry g;
  g.planes = planes;
  PlaceWindowDims(in, g.in);
  PlaceWindowDims(out, g.out);
  PlaceWindowDims(offset, g.offset);
  return g;
}

}  // namespace salus::exec::cuda
