// Backward kernels of the tensor and index ops on the CPU device, all plain loops (oneDNN has
// no primitive for them): Gather's scatter-add into the table, Slice's padding of dY into
// zeros, Concat's split of dY, Pad's crop of dY, and the per-element gradients of Clip,
// Min/Max, Pow, Erf, Gelu and Reciprocal, whose formulas and index maps are element_math.h's,
// shared with the CUDA device. Autodiff composes the other tensor ops' gradients from forward
// ops.
#include <cmath>
#include <cstring>
#include <limits>

#include "exec/cpu_kernel_helpers.h"
#include "exec/dnnl_kernel.h"
#include "exec/element_math.h"
#include "exec/grad_specs.h"
#include "exec/kernel_registry.h"

namespace salus::exec {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// Inputs (indices, dY); output dData. Attribute axis (normalised). dData is zero but for the
// sums of the dY rows gathered from each table row, added in output order, so the result does
// not depend on scheduling (Note [Deterministic scatter-add]).
//
// Note [Deterministic scatter-add]: an embedding table gathers one row many times; its
// gradient sums those rows' gradients. The CPU adds them in the order of the gathered
// elements; a device that parallelises over output elements must not use float atomics, whose
// order varies between runs, but group by target row (or sort the indices) and add in the same
// order to give results that repeat bit for bit.
KernelOr GatherGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const GatherGeometry geo, GatherGradFor(n, g));
  const Shape data = g.value(n.outputs[0]).shape;
  const int64_t data_count = NumElements(data);
  const std::string where = n.Describe();
  return std::unique_ptr<Kernel>(new CheckedLoopKernel([=](const KernelArgs& a) {
    const int64_t* idx = static_cast<const int64_t*>(a.inputs[0]);
    const float* dy = static_cast<const float*>(a.inputs[1]);
    float* dx = static_cast<float*>(a.outputs[0]);
    for (int64_t j = 0; j < geo.count; ++j) {
      if (idx[j] < -geo.axis_dim || idx[j] >= geo.axis_dim) {
        return InvalidArgumentError(where + ": index " + std::to_string(idx[j]) +
                                    " out of range for dim " + std::to_string(geo.axis_dim));
      }
    }
    std::fill(dx, dx + data_count, 0.f);
    // A row of `inner` elements at a time (GatherSourceIndex of its first element), in dY's
    // order: each dData element gets its sums in the order an element-wise loop adds them.
    const int64_t rows = geo.outer * geo.count;
    for (int64_t r = 0; r < rows; ++r) {
      float* to = dx + GatherSourceIndex(geo, idx, r * geo.inner);
      const float* from = dy + r * geo.inner;
      for (int64_t i = 0; i < geo.inner; ++i) to[i] += from[i];
    }
    return OkStatus();
  }));
}

// Input dY; output dX, zero but for the sliced positions. Attributes starts and steps: the
// forward Slice resolved over every dim (SliceFor).
KernelOr SliceGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const SliceGradSpec spec, SliceGradFor(n, g));
  const SliceMap m = spec.map;
  const int64_t x_count = spec.x_count, y_count = SliceOutputCount(m);
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* dy = static_cast<const float*>(a.inputs[0]);
    float* dx = static_cast<float*>(a.outputs[0]);
    std::fill(dx, dx + x_count, 0.f);
    for (int64_t o = 0; o < y_count; ++o) dx[SliceSourceIndex(m, o)] = dy[o];
  }));
}

// Input dY; output dX, the block of dY inside the padding. Attribute pads: Pad's (begins,
// then ends; constant mode, non-negative).
KernelOr PadGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const PadGradSpec spec, PadGradFor(n, g));
  const Shape x = spec.x, ys = spec.y_strides;
  const int64_t base = spec.base;
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* dy = static_cast<const float*>(a.inputs[0]);
    float* dx = static_cast<float*>(a.outputs[0]);
    ForEachBroadcast(x, {ys}, [&](int64_t e, const int64_t* off) { dx[e] = dy[base + off[0]]; });
  }));
}

// Input dY; output k (absent where not needed) the k-th block of `sizes` along `axis`.
KernelOr ConcatGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const ConcatGradSpec spec, ConcatGradFor(n, g));
  const int64_t outer = spec.outer, inner = spec.inner, total = spec.total;
  const std::vector<int64_t> sizes = spec.sizes;
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* dy = static_cast<const float*>(a.inputs[0]);
    const int64_t row = total * inner;
    int64_t offset = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t block = sizes[k] * inner;
      if (k < a.outputs.size() && a.outputs[k] != nullptr) {
        float* out = static_cast<float*>(a.outputs[k]);
        for (int64_t b = 0; b < outer; ++b) {
          std::memcpy(out + b * block, dy + b * row + offset, block * sizeof(float));
        }
      }
      offset += block;
    }
  }));
}

// Inputs (X, min or none, max or none, dY); outputs (each absent where not needed) dX, dMin
// and dMax: dY where X passes, and the sums of dY where min and where max was taken, added in
// element order. Before opset 11 the bounds are the attributes min and max.
KernelOr ClipGrad(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const int64_t count, ClipGradFor(n, g));
  const float lo_attr = n.GetFloat("min", -std::numeric_limits<float>::infinity());
  const float hi_attr = n.GetFloat("max", std::numeric_limits<float>::infinity());
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    const float lo = a.inputs[1] ? *static_cast<const float*>(a.inputs[1]) : lo_attr;
    const float hi = a.inputs[2] ? *static_cast<const float*>(a.inputs[2]) : hi_attr;
    const float* dy = static_cast<const float*>(a.inputs[3]);
    float* dx = static_cast<float*>(a.outputs[0]);
    const bool bounds =
        (a.outputs.size() > 1 && a.outputs[1]) || (a.outputs.size() > 2 && a.outputs[2]);
    if (!bounds) {
      // The common case (ReLU6: constant bounds): a select the compiler vectorises.
      if (dx) {
        // ClipGradTarget(x, lo, hi) == 0, written so the loop vectorises.
        // (lo > hi: every element takes max, none passes.)
        const float l = lo > hi ? std::numeric_limits<float>::infinity() : lo;
#pragma omp simd
        for (int64_t e = 0; e < count; ++e) {
          const float g = dy[e];  // loaded unconditionally, so the select if-converts
          const bool pass = (x[e] >= l) & (x[e] <= hi);
          dx[e] = pass ? g : 0.f;
        }
      }
      return;
    }
    double sums[3] = {0, 0, 0};
    for (int64_t e = 0; e < count; ++e) {
      const int target = ClipGradTarget(x[e], lo, hi);
      if (dx) dx[e] = target == 0 ? dy[e] : 0.f;
      sums[target] += dy[e];
    }
    for (int i = 1; i < 3; ++i) {
      if (a.outputs.size() > static_cast<size_t>(i) && a.outputs[i]) {
        *static_cast<float*>(a.outputs[i]) = static_cast<float>(sums[i]);
      }
    }
  }));
}

// Inputs (X_0 .. X_{k-1}, dY); output (in Y's shape) dY where input `input` is the first to
// attain the min or max (forward_op), 0 elsewhere. Autodiff sums it to the input's shape.
KernelOr MinMaxGrad(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(ExpectInputs(n, 3));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const size_t k = n.inputs.size() - 1;
  const int64_t which = n.GetInt("input", 0);
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, which >= 0 && which < static_cast<int64_t>(k), "input out of range"));
  const bool is_max = n.GetString("forward_op", "") == "Max";
  const Shape out = g.value(n.outputs[0]).shape;
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, g.value(n.inputs[k]).shape == out, "dY does not have the output's shape"));
  std::vector<Shape> strides;
  for (size_t i = 0; i < k; ++i)
    strides.push_back(BroadcastStrides(g.value(n.inputs[i]).shape, out));
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* dy = static_cast<const float*>(a.inputs[k]);
    float* dx = static_cast<float*>(a.outputs[0]);
    ForEachBroadcast(out, strides, [&](int64_t e, const int64_t* off) {
      float best = static_cast<const float*>(a.inputs[0])[off[0]];
      size_t arg = 0;
      for (size_t i = 1; i < k; ++i) {
        const float v = static_cast<const float*>(a.inputs[i])[off[i]];
        if (MinMaxReplaces(is_max, v, best)) {
          best = v;
          arg = i;
        }
      }
      dx[e] = arg == static_cast<size_t>(which) ? dy[e] : 0.f;
    });
  }));
}

// Inputs (X, E, dY); output (in Y's shape) dY times the derivative of X^E with respect to
// input `input` (0: X, 1: E). E may be int64. Autodiff sums it to the input's shape.
KernelOr PowGrad(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(ExpectInputs(n, 3));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {0, 2}));
  const DataType et = g.value(n.inputs[1]).type;
  if (et != DataType::kFloat32 && et != DataType::kInt64) {
    return UnimplementedError(n.Describe() + ": exponent of type " + DataTypeName(et));
  }
  const bool wrt_exponent = n.GetInt("input", 0) == 1;
  const Shape out = g.value(n.outputs[0]).shape;
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, g.value(n.inputs[2]).shape == out, "dY does not have the output's shape"));
  const std::vector<Shape> strides = {BroadcastStrides(g.value(n.inputs[0]).shape, out),
                                      BroadcastStrides(g.value(n.inputs[1]).shape, out)};
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    const float* dy = static_cast<const float*>(a.inputs[2]);
    float* dx = static_cast<float*>(a.outputs[0]);
    ForEachBroadcast(out, strides, [&](int64_t e, const int64_t* off) {
      const float p = et == DataType::kInt64
                          ? static_cast<float>(static_cast<const int64_t*>(a.inputs[1])[off[1]])
                          : static_cast<const float*>(a.inputs[1])[off[1]];
      const float d = wrt_exponent ? PowGradExponent(x[off[0]], p) : PowGradBase(x[off[0]], p);
      dx[e] = dy[e] * d;
    });
  }));
}

// Inputs (X, dY); output dX of Erf, Gelu (attribute approximate; oneDNN's eltwise backward)
// or Reciprocal (forward_op).
KernelOr UnaryGradKernel(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const UnaryGradOp op, UnaryGradFor(n, g));
  if (op == UnaryGradOp::kGeluErf || op == UnaryGradOp::kGeluTanh) {
    // oneDNN's, vectorised: the loop below calls erff and expf one element at a time, at
    // several times the cost.
    SALUS_ASSIGN_OR_RETURN(EltwiseSpec spec, EltwiseFor(n));
    return EltwiseBackwardKernel(spec, g.value(n.inputs[0]).shape);
  }
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  return std::unique_ptr<Kernel>(new LoopKernel([=](const KernelArgs& a) {
    const float* x = static_cast<const float*>(a.inputs[0]);
    const float* dy = static_cast<const float*>(a.inputs[1]);
    float* dx = static_cast<float*>(a.outputs[0]);
    for (int64_t e = 0; e < count; ++e) dx[e] = UnaryGrad(op, x[e], dy[e]);
  }));
}

}  // namespace

void RegisterCpuTensorGradKernels(KernelRegistry* r) {
  const DeviceType cpu = DeviceType::kCpu;
  r->Register("SalusGatherGrad", cpu, GatherGrad);
  r->Register("SalusSliceGrad", cpu, SliceGrad);
  r->Register("SalusConcatGrad", cpu, ConcatGrad);
  r->Register("SalusPadGrad", cpu, PadGrad);
  r->Register("SalusClipGrad", cpu, ClipGrad);
  r->Register("SalusMinMaxGrad", cpu, MinMaxGrad);
  r->Register("SalusPowGrad", cpu, PowGrad);
  r->Register("SalusUnaryGrad", cpu, UnaryGradKernel);
}

}  // namespace salus::exec
