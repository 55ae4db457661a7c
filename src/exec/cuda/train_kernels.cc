// The CUDA device's training kernels beyond grad_kernels.cc: the gradients of the tensor ops
// (SalusGatherGrad, SalusSliceGrad, SalusConcatGrad, SalusPadGrad, SalusClipGrad,
// SalusMinMaxGrad, SalusPowGrad, SalusUnaryGrad), BatchNormalization's training
// form and gradient (SalusBatchNormTrain, SalusBatchNormGrad), LayerNormalization's gradient
// and Dropout's training form and gradient, with the CPU's semantics
// (cpu_tensor_grad_kernels.cc, cpu_norm_kernels.cc). All hand-written (train_ops.cu), none with
// atomics (Note [Deterministic gradients] in grad_kernels.cc). The BatchNorm running statistics
// and Dropout's iteration counter live on the device and are updated there.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/alignment.h"
#include "exec/cpu_kernel_helpers.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cuda_util.h"
#include "exec/cuda/train_ops_launch.h"
#include "exec/dnnl_kernel.h"
#include "exec/grad_specs.h"
#include "exec/shape_inference.h"

namespace salus::exec::cuda {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// ---------------------------------------------------------------------------------------------
// Tensor-op gradients.

// Inputs (indices, dY); output dData. Attribute axis (normalised).
KernelOr GatherGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const GatherGeometry geo, GatherGradFor(n, g));
  const std::string what = n.Describe();
  return FnKernel([geo, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchGatherGrad(geo, static_cast<const int64_t*>(a.inputs[0]),
                                       F(a.inputs[1]), F(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

// Input dY; output dX, zero but for the sliced positions (attributes starts and steps).
KernelOr SliceGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const SliceGradSpec spec, SliceGradFor(n, g));
  const SliceMap m = spec.map;
  const int64_t x_count = spec.x_count;
  const std::string what = n.Describe();
  return FnKernel([m, x_count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchSliceGrad(m, x_count, F(a.inputs[0]), F(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

// Input dY; output dX, the block of dY inside the padding (attribute pads).
KernelOr PadGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const PadGradSpec spec, PadGradFor(n, g));
  const int64_t base = spec.base;
  IndexMap map;
  if (!MakeIndexMap(spec.x, {spec.y_strides}, &map)) {
    return UnimplementedError(n.Describe() + ": more than " + std::to_string(kMaxIndexDims) +
                              " dims");
  }
  const std::string what = n.Describe();
  return FnKernel([map, base, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchPadGrad(map, base, F(a.inputs[0]), F(a.outputs[0]), StreamOf(a)), what);
  });
}

// Input dY; output k (absent where not needed) the k-th block of `sizes` along `axis`: one
// strided copy each.
KernelOr ConcatGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const ConcatGradSpec spec, ConcatGradFor(n, g));
  const std::vector<int64_t> sizes = spec.sizes;
  const int64_t outer = spec.outer, inner = spec.inner, total = spec.total;
  const std::string what = n.Describe();
  return FnKernel([sizes, outer, inner, total, what](const KernelArgs& a) -> Status {
    const size_t row = total * inner * sizeof(float);
    size_t offset = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const size_t block = sizes[k] * inner * sizeof(float);
      if (k < a.outputs.size() && a.outputs[k] != nullptr && block > 0 && outer > 0) {
        SALUS_CUDA_RETURN(
            cudaMemcpy2DAsync(a.outputs[k], block, static_cast<const char*>(a.inputs[0]) + offset,
                              row, block, outer, cudaMemcpyDeviceToDevice, StreamOf(a)),
            what + ": block " + std::to_string(k));
      }
      offset += block;
    }
    return OkStatus();
  });
}

// Inputs (X, min or none, max or none, dY); outputs dX, dMin, dMax (each absent where not
// needed). Before opset 11 the bounds are the attributes min and max.
KernelOr ClipGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const int64_t count, ClipGradFor(n, g));
  const float lo = n.GetFloat("min", -std::numeric_limits<float>::infinity());
  const float hi = n.GetFloat("max", std::numeric_limits<float>::infinity());
  const std::string what = n.Describe();
  return FnKernel([count, lo, hi, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchClipGrad(count, F(a.inputs[0]), F(a.inputs[1]), lo, F(a.inputs[2]), hi,
                       F(a.inputs[3]), FloatOut(a, 0), FloatOut(a, 1), FloatOut(a, 2), StreamOf(a)),
        what);
  });
}

// The map of the elements of `out` over operands of shapes a and b broadcast to it.
StatusOr<IndexMap> PairMap(const Node& n, const Shape& out, const Shape& a, const Shape& b) {
  IndexMap map;
  if (!MakeIndexMap(out, {BroadcastStrides(a, out), BroadcastStrides(b, out)}, &map)) {
    return UnimplementedError(n.Describe() + ": more than " + std::to_string(kMaxIndexDims) +
                              " dims");
  }
  return map;
}

// Inputs (A, B, dY) with dY in the output's shape: the map of the output's elements over A
// and B broadcast to it.
StatusOr<IndexMap> OperandsMap(const Node& n, const Graph& g) {
  const Shape& out = g.value(n.outputs[0]).shape;
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, g.value(n.inputs[2]).shape == out, "dY does not have the output's shape"));
  return PairMap(n, out, g.value(n.inputs[0]).shape, g.value(n.inputs[1]).shape);
}

// Inputs (X_0 .. X_{k-1}, dY); output (in Y's shape) dY where input `input` is the first to
// attain the min or max (forward_op), 0 elsewhere. Two inputs take one kernel; more take an
// arg scan over the inputs in order (LaunchMinMaxArgStep) into the scratch (the extreme so far
// and its input, each in the output's shape), then the selection.
KernelOr MinMaxGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(ExpectInputs(n, 3));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const size_t k = n.inputs.size() - 1;
  const int which = static_cast<int>(n.GetInt("input", 0));
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, which >= 0 && static_cast<size_t>(which) < k, "input out of range"));
  const bool is_max = n.GetString("forward_op", "") == "Max";
  const std::string what = n.Describe();
  if (k == 2) {
    SALUS_ASSIGN_OR_RETURN(const IndexMap map, OperandsMap(n, g));
    return FnKernel([map, is_max, which, what](const KernelArgs& a) -> Status {
      return CudaStatus(LaunchMinMaxGrad(map, is_max, which, F(a.inputs[0]), F(a.inputs[1]),
                                         F(a.inputs[2]), F(a.outputs[0]), StreamOf(a)),
                        what);
    });
  }
  const Shape& out = g.value(n.outputs[0]).shape;
  SALUS_RETURN_IF_ERROR(
      ExpectNode(n, g.value(n.inputs[k]).shape == out, "dY does not have the output's shape"));
  std::vector<IndexMap> steps;  // step i - 1 combines the extreme so far with input i
  for (size_t i = 1; i < k; ++i) {
    SALUS_ASSIGN_OR_RETURN(IndexMap map, PairMap(n, out, i == 1 ? g.value(n.inputs[0]).shape : out,
                                                 g.value(n.inputs[i]).shape));
    steps.push_back(map);
  }
  const int64_t count = NumElements(out);
  const size_t arg_offset = AlignUp(static_cast<uint64_t>(count) * sizeof(float));
  const size_t scratch = arg_offset + AlignUp(static_cast<uint64_t>(count) * sizeof(int32_t));
  return FnKernel(
      [steps, is_max, which, k, count, arg_offset, what](const KernelArgs& a) -> Status {
        float* best = F(a.scratch);
        auto* arg = reinterpret_cast<int32_t*>(static_cast<std::byte*>(a.scratch) + arg_offset);
        for (size_t i = 1; i < k; ++i) {
          SALUS_CUDA_RETURN(LaunchMinMaxArgStep(steps[i - 1], is_max, static_cast<int>(i),
                                                i == 1 ? F(a.inputs[0]) : best, F(a.inputs[i]),
                                                best, arg, StreamOf(a)),
                            what);
        }
        return CudaStatus(
            LaunchMinMaxArgGrad(count, which, arg, F(a.inputs[k]), F(a.outputs[0]), StreamOf(a)),
            what);
      },
      scratch);
}

// Inputs (X, E, dY); output (in Y's shape) dY times d(X^E)/d(input `input`). E may be int64.
KernelOr PowGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(ExpectNode(n, n.inputs.size() == 3, "expects X, E and dY"));
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {0, 2}));
  const DataType et = g.value(n.inputs[1]).type;
  if (et != DataType::kFloat32 && et != DataType::kInt64) {
    return UnimplementedError(n.Describe() + ": exponent of type " + DataTypeName(et));
  }
  const bool wrt_exponent = n.GetInt("input", 0) == 1;
  SALUS_ASSIGN_OR_RETURN(const IndexMap map, OperandsMap(n, g));
  const bool p_int64 = et == DataType::kInt64;
  const std::string what = n.Describe();
  return FnKernel([map, wrt_exponent, p_int64, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchPowGrad(map, wrt_exponent, F(a.inputs[0]), a.inputs[1], p_int64,
                                    F(a.inputs[2]), F(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

// Inputs (X, dY); output dX of Erf, Gelu (attribute approximate) or Reciprocal (forward_op).
KernelOr UnaryGradK(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const UnaryGradOp op, UnaryGradFor(n, g));
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const std::string what = n.Describe();
  return FnKernel([op, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchUnaryGrad(op, F(a.inputs[0]), F(a.inputs[1]), F(a.outputs[0]), count, StreamOf(a)),
        what);
  });
}

// ---------------------------------------------------------------------------------------------
// Normalisation and dropout in training.

// Inputs (X, scale, B, running_mean, running_var); outputs (Y, batch mean, batch variance,
// optional copies of the updated running statistics).
KernelOr BatchNormTrain(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& x = g.value(n.inputs[0]).shape;
  SALUS_RETURN_IF_ERROR(ExpectNode(n,
                                   x.size() >= 2 && n.inputs.size() == 5 && n.outputs.size() >= 3,
                                   "expects X of rank 2 or more, 5 inputs and 3 outputs"));
  const BatchNormGeometry geo = BatchNormGeometryOf(x);
  const float eps = n.GetFloat("epsilon", 1e-5f);
  const float momentum = n.GetFloat("momentum", 0.9f);
  const int64_t m = geo.n * geo.s;
  const float unbias = static_cast<float>(m) / static_cast<float>(std::max<int64_t>(m - 1, 1));
  const std::string what = n.Describe();
  return FnKernel([geo, eps, momentum, unbias, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchBnTrain(geo, eps, momentum, unbias, F(a.inputs[0]), F(a.inputs[1]), F(a.inputs[2]),
                      F(a.inputs[3]), F(a.inputs[4]), FloatOut(a, 0), FloatOut(a, 1),
                      FloatOut(a, 2), FloatOut(a, 3), FloatOut(a, 4), StreamOf(a)),
        what);
  });
}

// Inputs (X, scale, batch mean, batch variance, dY); outputs (dX, dScale, dBias).
KernelOr BatchNormGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& x = g.value(n.inputs[0]).shape;
  SALUS_RETURN_IF_ERROR(ExpectNode(n, x.size() >= 2 && n.inputs.size() == 5,
                                   "expects X of rank 2 or more, 5 inputs"));
  const BatchNormGeometry geo = BatchNormGeometryOf(x);
  const float eps = n.GetFloat("epsilon", 1e-5f);
  const std::string what = n.Describe();
  return FnKernel([geo, eps, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchBnGrad(geo, eps, F(a.inputs[0]), F(a.inputs[1]), F(a.inputs[2]), F(a.inputs[3]),
                     F(a.inputs[4]), FloatOut(a, 0), FloatOut(a, 1), FloatOut(a, 2), StreamOf(a)),
        what);
  });
}

// Inputs (X, Scale, dY); outputs (dX, dScale, dBias?). Scratch: each row's mean and 1/std.
KernelOr LayerNormGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_ASSIGN_OR_RETURN(LayerNormSpec s, LayerNormFor(g, n));
  const std::string what = n.Describe();
  return FnKernel(
      [s, what](const KernelArgs& a) -> Status {
        return CudaStatus(
            LaunchLayerNormGrad(s.outer, s.inner, s.epsilon, F(a.inputs[0]), F(a.inputs[1]),
                                F(a.inputs[2]), FloatOut(a, 0), FloatOut(a, 1), FloatOut(a, 2),
                                F(a.scratch), StreamOf(a)),
            what);
      },
      AlignUp(2 * s.outer * sizeof(float)));
}

// Inputs (X, iteration counter: int64 in persistent memory); outputs (Y, bool mask).
KernelOr DropoutTrain(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireDropoutTrainTypes(n, g));
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const float ratio = n.GetFloat("ratio", 0.5f);
  const uint64_t seed = static_cast<uint64_t>(n.GetInt("seed", 0));
  const uint64_t stream_id = static_cast<uint64_t>(n.GetInt("stream", 0));
  const std::string what = n.Describe();
  return FnKernel([count, ratio, seed, stream_id, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchDropoutTrain(count, ratio, seed, stream_id, F(a.inputs[0]),
                                         static_cast<int64_t*>(a.inputs[1]), F(a.outputs[0]),
                                         static_cast<bool*>(a.outputs[1]), StreamOf(a)),
                      what);
  });
}

// Inputs (dY, mask); output dX = dY * mask / (1 - ratio).
KernelOr DropoutGrad(const Node& n, const Graph& g, DeviceContext*) {
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const float scale = DropoutScale(n.GetFloat("ratio", 0.5f));
  const std::string what = n.Describe();
  return FnKernel([count, scale, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchDropoutGrad(count, scale, F(a.inputs[0]), static_cast<const bool*>(a.inputs[1]),
                          F(a.outputs[0]), StreamOf(a)),
        what);
  });
}

}  // namespace

void RegisterTrainKernels(KernelRegistry* registry) {
  const DeviceType cuda = DeviceType::kCuda;
  registry->Register("SalusGatherGrad", cuda, KernelFactory(&GatherGrad));
  registry->Register("SalusSliceGrad", cuda, KernelFactory(&SliceGrad));
  registry->Register("SalusConcatGrad", cuda, KernelFactory(&ConcatGrad));
  registry->Register("SalusPadGrad", cuda, KernelFactory(&PadGrad));
  registry->Register("SalusClipGrad", cuda, KernelFactory(&ClipGrad));
  registry->Register("SalusMinMaxGrad", cuda, KernelFactory(&MinMaxGrad));
  registry->Register("SalusPowGrad", cuda, KernelFactory(&PowGrad));
  registry->Register("SalusUnaryGrad", cuda, KernelFactory(&UnaryGradK));
  registry->Register("SalusBatchNormTrain", cuda, KernelFactory(&BatchNormTrain));
  registry->Register("SalusBatchNormGrad", cuda, KernelFactory(&BatchNormGrad));
  registry->Register("SalusLayerNormGrad", cuda, KernelFactory(&LayerNormGrad));
  registry->Register("SalusDropoutTrain", cuda, KernelFactory(&DropoutTrain));
  registry->Register("SalusDropoutGrad", cuda, KernelFactory(&DropoutGrad));
}

}  // namespace salus::exec::cuda
