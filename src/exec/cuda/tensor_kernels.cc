// The CUDA device's kernels of the tensor ops of exported models, with the CPU's op names and
// semantics (cpu_tensor_kernels.cc):
//   - data movement (Gather, Where, Expand, Slice, Trilu) for float, int64 and bool:
//     tensor_ops.cu's kernels over element_math.h's index maps, moving elements by their size;
//     Split: one strided copy (cudaMemcpy2DAsync) per output, no kernel;
//   - elementwise math (Erf, Gelu, Reciprocal, SalusLog1p, SalusExpm1, SalusErfc, Sin, Cos,
//     Atan, Floor, Ceil, Round, Cast, Clip, Min, Max, Mod, the comparisons, And, Or, Not):
//     tensor_ops.cu's kernels over element_math.h's per-element functions, broadcasting
//     through its IndexMap (at most kMaxIndexDims dims once merged);
//   - generators (Range, ConstantOfShape, Shape): small fill kernels, the values passed by value
//     or read from device memory by the kernel;
//   - stateless random numbers (SalusPhiloxKeyCounter, SalusRandomUniform, SalusRandomNormal,
//     SalusRandomTruncatedNormal): philox_math.h's Philox-4x32-10, one thread per group of four
//     outputs; the uniform bits are the CPU's, the normal ones within CUDA's logf and sincosf.
// Scalars the CPU reads when it runs (Clip's bounds, Trilu's k, Range's start and delta) are read
// by the kernels from device memory, never by the host. Two CPU checks of data have no
// counterpart here, since they would need a host read: a Gather index out of range gives zeros
// and an int64 Mod by zero gives 0 (the CPU returns InvalidArgument for both).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/cpu_kernel_helpers.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cuda_util.h"
#include "exec/cuda/tensor_ops_launch.h"
#include "exec/dnnl_kernel.h"
#include "exec/element_math.h"
#include "exec/shape_inference.h"

namespace salus::exec::cuda {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

const Value& In(const Node& n, const Graph& g, size_t i) { return g.value(n.inputs[i]); }
const Value& Out(const Node& n, const Graph& g, size_t i) { return g.value(n.outputs[i]); }

Status Unsupported(const Node& n, DataType t) {
  return UnimplementedError("node '" + n.name + "': op " + n.op + " on " + DataTypeName(t) +
                            " tensors");
}

Status RequireContext(const Node& n, const DeviceContext* ctx) {
  if (ctx == nullptr) return InternalError(n.Describe() + ": no CUDA context to build it with");
  return OkStatus();
}

// The kernels' element type of `t`; Unimplemented for any other.
StatusOr<ElemType> ElemTypeOf(const Node& n, DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ElemType::kFloat32;
    case DataType::kInt64:
      return ElemType::kInt64;
    case DataType::kBool:
      return ElemType::kBool;
    default:
      return Unsupported(n, t);
  }
}

// The size of one element of `t` when the kernels move it (1, 4 or 8 bytes).
StatusOr<int> MovedBytes(const Node& n, DataType t) {
  const size_t bytes = ElementSize(t);
  if (bytes != 1 && bytes != 4 && bytes != 8) return Unsupported(n, t);
  return static_cast<int>(bytes);
}

// The index map of `out` over operands broadcast into it (one or two).
StatusOr<IndexMap> BroadcastMap(const Node& n, const Shape& out,
                                const std::vector<Shape>& operands) {
  std::vector<std::vector<int64_t>> strides;
  for (const Shape& s : operands) strides.push_back(BroadcastStrides(s, out));
  IndexMap map;
  if (!MakeIndexMap(out, strides, &map)) {
    return UnimplementedError(n.Describe() + ": broadcasting into " + ShapeString(out) +
                              " needs more than " + std::to_string(kMaxIndexDims) + " dims");
  }
  return map;
}

StatusOr<IndexMap> BinaryMap(const Node& n, const Graph& g) {
  return BroadcastMap(n, Out(n, g, 0).shape, {In(n, g, 0).shape, In(n, g, 1).shape});
}

// The device pointer of optional input i, null when it is omitted.
const void* OptionalInput(const KernelArgs& a, size_t i) {
  return i < a.inputs.size() ? a.inputs[i] : nullptr;
}

// ---------------------------------------------------------------------------------------------
// Data movement.

KernelOr Gather(const Node& n, const Graph& g, DeviceContext*) {
  const Shape& x = In(n, g, 0).shape;
  if (In(n, g, 1).type != DataType::kInt64) return Unsupported(n, In(n, g, 1).type);
  SALUS_ASSIGN_OR_RETURN(int bytes, MovedBytes(n, Out(n, g, 0).type));
  SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), x.size()));
  GatherGeometry geo;
  for (int64_t i = 0; i < axis; ++i) geo.outer *= x[i];
  geo.axis_dim = x[axis];
  for (size_t i = axis + 1; i < x.size(); ++i) geo.inner *= x[i];
  geo.count = NumElements(In(n, g, 1).shape);
  const std::string what = n.Describe();
  return FnKernel([geo, bytes, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchGather(geo, bytes, a.inputs[0], static_cast<const int64_t*>(a.inputs[1]),
                     a.outputs[0], StreamOf(a)),
        what);
  });
}

KernelOr GatherElements(const Node& n, const Graph& g, DeviceContext*) {
  const Shape& x = In(n, g, 0).shape;
  if (In(n, g, 1).type != DataType::kInt64) return Unsupported(n, In(n, g, 1).type);
  SALUS_ASSIGN_OR_RETURN(int bytes, MovedBytes(n, Out(n, g, 0).type));
  SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), x.size()));
  GatherElementsGeometry geo;
  if (!MakeGatherElementsGeometry(x, In(n, g, 1).shape, axis, &geo)) {
    return UnimplementedError(n.Describe() + ": more than " + std::to_string(kMaxIndexDims) +
                              " dims");
  }
  const int64_t count = NumElements(In(n, g, 1).shape);
  const std::string what = n.Describe();
  return FnKernel([geo, count, bytes, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchGatherElements(geo, count, bytes, a.inputs[0],
                             static_cast<const int64_t*>(a.inputs[1]), a.outputs[0], StreamOf(a)),
        what);
  });
}

KernelOr ScatterND(const Node& n, const Graph& g, DeviceContext*) {
  if (In(n, g, 1).type != DataType::kInt64) return Unsupported(n, In(n, g, 1).type);
  SALUS_ASSIGN_OR_RETURN(int bytes, MovedBytes(n, Out(n, g, 0).type));
  ScatterNDGeometry geo;
  if (!MakeScatterNDGeometry(In(n, g, 0).shape, In(n, g, 1).shape, &geo)) {
    return UnimplementedError(n.Describe() + ": index tuples of more than " +
                              std::to_string(kMaxIndexDims) + " entries");
  }
  const int64_t total = NumElements(In(n, g, 0).shape);
  const std::string what = n.Describe();
  return FnKernel([geo, total, bytes, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchScatterND(geo, total, bytes, a.inputs[0], static_cast<const int64_t*>(a.inputs[1]),
                        a.inputs[2], a.outputs[0], StreamOf(a)),
        what);
  });
}

KernelOr Where(const Node& n, const Graph& g, DeviceContext*) {
  if (In(n, g, 0).type != DataType::kBool) return Unsupported(n, In(n, g, 0).type);
  SALUS_ASSIGN_OR_RETURN(int bytes, MovedBytes(n, Out(n, g, 0).type));
  const Shape& out = Out(n, g, 0).shape;
  // IndexMap maps two operands: the condition and X share one map, Y has its own.
  SALUS_ASSIGN_OR_RETURN(IndexMap cond_x,
                         BroadcastMap(n, out, {In(n, g, 0).shape, In(n, g, 1).shape}));
  SALUS_ASSIGN_OR_RETURN(IndexMap y_map, BroadcastMap(n, out, {In(n, g, 2).shape}));
  const std::string what = n.Describe();
  return FnKernel([cond_x, y_map, bytes, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchWhere(cond_x, y_map, bytes, static_cast<const uint8_t*>(a.inputs[0]),
                                  a.inputs[1], a.inputs[2], a.outputs[0], StreamOf(a)),
                      what);
  });
}

KernelOr Expand(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(int bytes, MovedBytes(n, Out(n, g, 0).type));
  SALUS_ASSIGN_OR_RETURN(IndexMap map, BroadcastMap(n, Out(n, g, 0).shape, {In(n, g, 0).shape}));
  const std::string what = n.Describe();
  return FnKernel([map, bytes, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchMapCopy(map, bytes, a.inputs[0], a.outputs[0], StreamOf(a)), what);
  });
}

KernelOr Slice(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(int bytes, MovedBytes(n, Out(n, g, 0).type));
  SALUS_ASSIGN_OR_RETURN(SliceSpec spec, SliceFor(g, n));
  SliceMap map;
  if (!MakeSliceMap(In(n, g, 0).shape, spec.starts, spec.steps, spec.out, &map)) {
    return UnimplementedError(n.Describe() + ": more than " + std::to_string(kMaxIndexDims) +
                              " sliced dims");
  }
  const std::string what = n.Describe();
  return FnKernel([map, bytes, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchSlice(map, bytes, a.inputs[0], a.outputs[0], StreamOf(a)), what);
  });
}

// Split: viewed as [outer, dim, inner] around the axis, output i is `outer` rows of
// part_i * inner elements, each copied from its place in the input's rows: one strided copy per
// output, as Concat in reverse.
struct SplitPart {
  size_t output = 0;
  size_t row_bytes = 0;   // part_i * inner elements: the destination pitch and the width
  size_t src_offset = 0;  // bytes from the input's start to the part's first row
};

KernelOr Split(const Node& n, const Graph& g, DeviceContext* ctx) {
  SALUS_RETURN_IF_ERROR(RequireContext(n, ctx));
  int64_t axis = 0;
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, SplitSizes(g, n, &axis));
  const Shape& x = In(n, g, 0).shape;
  const size_t elem = ElementSize(In(n, g, 0).type);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x[d];
  for (size_t d = axis + 1; d < x.size(); ++d) inner *= x[d];
  const size_t src_pitch = static_cast<size_t>(x[axis] * inner) * elem;
  std::vector<SplitPart> parts;
  size_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t row_bytes = static_cast<size_t>(sizes[i] * inner) * elem;
    if (i < n.outputs.size() && n.outputs[i] != kNoValue && row_bytes > 0 && outer > 0) {
      parts.push_back({i, row_bytes, at});
    }
    at += row_bytes;
  }
  // cudaMemcpy2DAsync refuses pitches over the device's limit; rows that long are few, so those
  // are copied one by one.
  int max_pitch = 0;
  SALUS_CUDA_RETURN(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, ctx->device.ordinal),
                    n.Describe() + ": maximum pitch");
  const bool row_by_row = src_pitch > static_cast<size_t>(max_pitch);
  const std::string what = n.Describe();
  return FnKernel([parts, outer, src_pitch, row_by_row, what](const KernelArgs& a) -> Status {
    const std::byte* in = static_cast<const std::byte*>(a.inputs[0]);
    for (const SplitPart& p : parts) {
      std::byte* dst =
          p.output < a.outputs.size() ? static_cast<std::byte*>(a.outputs[p.output]) : nullptr;
      if (dst == nullptr) continue;
      const std::byte* src = in + p.src_offset;
      if (outer == 1) {
        SALUS_CUDA_RETURN(
            cudaMemcpyAsync(dst, src, p.row_bytes, cudaMemcpyDeviceToDevice, StreamOf(a)), what);
      } else if (!row_by_row) {
        SALUS_CUDA_RETURN(
            cudaMemcpy2DAsync(dst, p.row_bytes, src, src_pitch, p.row_bytes,
                              static_cast<size_t>(outer), cudaMemcpyDeviceToDevice, StreamOf(a)),
            what);
      } else {
        for (int64_t r = 0; r < outer; ++r) {
          SALUS_CUDA_RETURN(cudaMemcpyAsync(dst + r * p.row_bytes, src + r * src_pitch, p.row_bytes,
                                            cudaMemcpyDeviceToDevice, StreamOf(a)),
                            what);
        }
      }
    }
    return OkStatus();
  });
}

KernelOr Trilu(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(int bytes, MovedBytes(n, Out(n, g, 0).type));
  const Shape& x = In(n, g, 0).shape;
  if (x.size() < 2) return InvalidArgumentError(n.Describe() + ": input of rank below 2");
  const int64_t rows = x[x.size() - 2], cols = x[x.size() - 1];
  const int64_t matrices = rows * cols > 0 ? NumElements(x) / (rows * cols) : 0;
  const bool upper = n.GetInt("upper", 1) != 0;
  const std::string what = n.Describe();
  return FnKernel([matrices, rows, cols, upper, bytes, what](const KernelArgs& a) -> Status {
    const int64_t* k = static_cast<const int64_t*>(OptionalInput(a, 1));
    return CudaStatus(
        LaunchTrilu(matrices, rows, cols, upper, k, bytes, a.inputs[0], a.outputs[0], StreamOf(a)),
        what);
  });
}

// ---------------------------------------------------------------------------------------------
// Elementwise math.

// The unary kernel's case for each op registered with FloatUnary (Gelu's depends on its
// approximation).
const std::map<std::string, TensorUnaryOp>& UnaryOps() {
  static const auto* ops =
      new std::map<std::string, TensorUnaryOp>{{"Erf", TensorUnaryOp::kErf},
                                               {"Gelu", TensorUnaryOp::kGeluErf},
                                               {"Reciprocal", TensorUnaryOp::kReciprocal},
                                               {"SalusLog1p", TensorUnaryOp::kLog1p},
                                               {"SalusExpm1", TensorUnaryOp::kExpm1},
                                               {"SalusErfc", TensorUnaryOp::kErfc},
                                               {"Sin", TensorUnaryOp::kSin},
                                               {"Cos", TensorUnaryOp::kCos},
                                               {"Atan", TensorUnaryOp::kAtan},
                                               {"Floor", TensorUnaryOp::kFloor},
                                               {"Ceil", TensorUnaryOp::kCeil},
                                               {"Round", TensorUnaryOp::kRound},
                                               {"SalusLgamma", TensorUnaryOp::kLgamma},
                                               {"SalusDigamma", TensorUnaryOp::kDigamma},
                                               {"SalusErfinv", TensorUnaryOp::kErfinv}};
  return *ops;
}

KernelOr FloatUnary(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  TensorUnaryOp op = UnaryOps().at(n.op);
  if (n.op == "Gelu" && n.GetString("approximate", "none") == "tanh") {
    op = TensorUnaryOp::kGeluTanh;
  }
  const int64_t count = NumElements(In(n, g, 0).shape);
  const std::string what = n.Describe();
  return FnKernel([op, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchTensorUnary(op, static_cast<const float*>(a.inputs[0]),
                                        static_cast<float*>(a.outputs[0]), count, StreamOf(a)),
                      what);
  });
}

KernelOr Polygamma(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const int order = static_cast<int>(n.GetInt("n", 0));
  const int64_t count = NumElements(In(n, g, 0).shape);
  const std::string what = n.Describe();
  return FnKernel([order, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchPolygamma(order, static_cast<const float*>(a.inputs[0]),
                                      static_cast<float*>(a.outputs[0]), count, StreamOf(a)),
                      what);
  });
}

KernelOr Cast(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(ElemType from, ElemTypeOf(n, In(n, g, 0).type));
  SALUS_ASSIGN_OR_RETURN(ElemType to, ElemTypeOf(n, Out(n, g, 0).type));
  const int64_t count = NumElements(In(n, g, 0).shape);
  const size_t bytes = In(n, g, 0).bytes();
  const std::string what = n.Describe();
  if (from == to) {
    return FnKernel([bytes, what](const KernelArgs& a) -> Status {
      if (bytes == 0 || a.outputs[0] == a.inputs[0]) return OkStatus();
      return CudaStatus(
          cudaMemcpyAsync(a.outputs[0], a.inputs[0], bytes, cudaMemcpyDeviceToDevice, StreamOf(a)),
          what);
    });
  }
  return FnKernel([from, to, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchCast(from, to, a.inputs[0], a.outputs[0], count, StreamOf(a)), what);
  });
}

KernelOr Clip(const Node& n, const Graph& g, DeviceContext*) {
  const DataType t = Out(n, g, 0).type;
  const int64_t count = NumElements(In(n, g, 0).shape);
  const std::string what = n.Describe();
  if (g.opset() < 11) {
    SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
    // Clip-6's defaults are float's finite limits, as the CPU's.
    const float lo = n.GetFloat("min", std::numeric_limits<float>::lowest());
    const float hi = n.GetFloat("max", std::numeric_limits<float>::max());
    return FnKernel([lo, hi, count, what](const KernelArgs& a) -> Status {
      return CudaStatus(LaunchClipConstant(lo, hi, static_cast<const float*>(a.inputs[0]),
                                           static_cast<float*>(a.outputs[0]), count, StreamOf(a)),
                        what);
    });
  }
  if (t != DataType::kFloat32 && t != DataType::kInt64) return Unsupported(n, t);
  SALUS_ASSIGN_OR_RETURN(ElemType type, ElemTypeOf(n, t));
  // From opset 11 the bounds are optional scalar inputs, read by the kernel.
  return FnKernel([type, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchClip(type, a.inputs[0], OptionalInput(a, 1), OptionalInput(a, 2),
                                 a.outputs[0], count, StreamOf(a)),
                      what);
  });
}

// Min and Max: the first two inputs broadcast into the output, then each further input is
// combined into it in place, as the CPU's; a single input is combined with itself.
KernelOr MinMax(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(ElemType type, ElemTypeOf(n, Out(n, g, 0).type));
  const Shape out = Out(n, g, 0).shape;
  const bool is_max = n.op == "Max";
  const size_t inputs = n.inputs.size();
  std::vector<IndexMap> maps;  // step k combines (input 0 or the output) with input k + 1
  for (size_t k = 0; k + 1 < std::max<size_t>(inputs, 2); ++k) {
    const Shape& y = In(n, g, inputs == 1 ? 0 : k + 1).shape;
    SALUS_ASSIGN_OR_RETURN(IndexMap map,
                           BroadcastMap(n, out, {k == 0 ? In(n, g, 0).shape : out, y}));
    maps.push_back(map);
  }
  const std::string what = n.Describe();
  return FnKernel([maps, is_max, type, inputs, what](const KernelArgs& a) -> Status {
    for (size_t k = 0; k < maps.size(); ++k) {
      const void* x = k == 0 ? a.inputs[0] : a.outputs[0];
      const void* y = a.inputs[inputs == 1 ? 0 : k + 1];
      SALUS_CUDA_RETURN(LaunchMinMax(is_max, type, maps[k], x, y, a.outputs[0], StreamOf(a)), what);
    }
    return OkStatus();
  });
}

KernelOr Compare(const Node& n, const Graph& g, DeviceContext*) {
  CompareOp op = CompareOp::kEqual;
  if (!CompareOpFor(n.op, &op)) return UnimplementedError(n.Describe() + ": not a comparison");
  const DataType t = In(n, g, 0).type;
  SALUS_ASSIGN_OR_RETURN(ElemType type, ElemTypeOf(n, t));
  if (type == ElemType::kBool && op != CompareOp::kEqual) return Unsupported(n, t);
  SALUS_ASSIGN_OR_RETURN(IndexMap map, BinaryMap(n, g));
  const std::string what = n.Describe();
  return FnKernel([op, type, map, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchCompare(op, type, map, a.inputs[0], a.inputs[1],
                                    static_cast<uint8_t*>(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

KernelOr Logic(const Node& n, const Graph& g, DeviceContext*) {
  for (ValueId id : n.inputs) {
    if (g.value(id).type != DataType::kBool) return Unsupported(n, g.value(id).type);
  }
  const std::string what = n.Describe();
  if (n.op == "Not") {
    const int64_t count = NumElements(In(n, g, 0).shape);
    return FnKernel([count, what](const KernelArgs& a) -> Status {
      return CudaStatus(LaunchNot(static_cast<const uint8_t*>(a.inputs[0]),
                                  static_cast<uint8_t*>(a.outputs[0]), count, StreamOf(a)),
                        what);
    });
  }
  const bool is_and = n.op == "And";
  SALUS_ASSIGN_OR_RETURN(IndexMap map, BinaryMap(n, g));
  return FnKernel([is_and, map, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchLogic(is_and, map, static_cast<const uint8_t*>(a.inputs[0]),
                                  static_cast<const uint8_t*>(a.inputs[1]),
                                  static_cast<uint8_t*>(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

// Mod: float (the remainder of truncated division whatever fmod says, as the CPU's) and int64.
KernelOr Mod(const Node& n, const Graph& g, DeviceContext*) {
  const DataType t = Out(n, g, 0).type;
  if (t != DataType::kFloat32 && t != DataType::kInt64) return Unsupported(n, t);
  SALUS_ASSIGN_OR_RETURN(ElemType type, ElemTypeOf(n, t));
  const bool fmod = n.GetInt("fmod", 0) != 0;
  SALUS_ASSIGN_OR_RETURN(IndexMap map, BinaryMap(n, g));
  const std::string what = n.Describe();
  return FnKernel([type, fmod, map, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchMod(type, fmod, map, a.inputs[0], a.inputs[1], a.outputs[0], StreamOf(a)), what);
  });
}

// ---------------------------------------------------------------------------------------------
// Generators.

// Element i is start + i * delta; the count is fixed by shape inference.
KernelOr Range(const Node& n, const Graph& g, DeviceContext*) {
  const DataType t = Out(n, g, 0).type;
  if (t != DataType::kFloat32 && t != DataType::kInt64) return Unsupported(n, t);
  SALUS_ASSIGN_OR_RETURN(ElemType type, ElemTypeOf(n, t));
  const int64_t count = NumElements(Out(n, g, 0).shape);
  const std::string what = n.Describe();
  return FnKernel([type, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchRange(type, a.inputs[0], a.inputs[2], a.outputs[0], count, StreamOf(a)),
                      what);
  });
}

KernelOr ConstantOfShape(const Node& n, const Graph& g, DeviceContext*) {
  const Value& out = g.value(n.outputs[0]);
  SALUS_ASSIGN_OR_RETURN(int bytes, MovedBytes(n, out.type));
  uint64_t bits = 0;  // zero of every type when no value is given
  if (n.Has("value")) {
    const HostTensor& v = n.attrs.at("value").t;
    if (v.type != out.type || v.bytes.size() != static_cast<size_t>(bytes)) {
      return InvalidArgumentError(n.Describe() + ": bad value");
    }
    std::memcpy(&bits, v.bytes.data(), v.bytes.size());  // little-endian: the low bytes
  }
  const int64_t count = NumElements(out.shape);
  const std::string what = n.Describe();
  return FnKernel([bits, bytes, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchFill(bits, bytes, count, a.outputs[0], StreamOf(a)), what);
  });
}

// Shapes are fixed at compile time, so a Shape node writes constants (the importer folds it).
KernelOr ShapeOf(const Node& n, const Graph& g, DeviceContext*) {
  const Shape& x = In(n, g, 0).shape;
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t start = n.GetInt("start", 0);
  if (start < 0) start += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  const int64_t count = NumElements(Out(n, g, 0).shape);
  if (count < 0 || start + count > rank) {
    return InvalidArgumentError(n.Describe() + ": output does not fit the input's rank");
  }
  if (count > kMaxListValues) {
    return UnimplementedError(n.Describe() + ": more than " + std::to_string(kMaxListValues) +
                              " dims");
  }
  Int64List list;
  list.count = static_cast<int32_t>(count);
  for (int64_t i = 0; i < count; ++i) list.values[i] = x[start + i];
  const std::string what = n.Describe();
  return FnKernel([list, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchWriteInt64s(list, static_cast<int64_t*>(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

// ---------------------------------------------------------------------------------------------
// Variables (TensorFlow graphs): in-place assignment and ArgMax, as cpu_tensor_kernels.cc's;
// and SalusSort.

KernelOr Assign(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const std::string mode_name, AssignModeFor(g, n));
  const Value& var = In(n, g, 0);
  SALUS_ASSIGN_OR_RETURN(ElemType t, ElemTypeOf(n, var.type));
  const AssignMode mode = mode_name == "add"   ? AssignMode::kAdd
                          : mode_name == "sub" ? AssignMode::kSub
                                               : AssignMode::kSet;
  if (mode != AssignMode::kSet && t == ElemType::kBool) return Unsupported(n, var.type);
  const int64_t count = NumElements(var.shape);
  const std::string what = n.Describe();
  return FnKernel([mode, t, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchAssign(mode, t, a.inputs[0], a.inputs[1], count, StreamOf(a)), what);
  });
}

KernelOr ArgMax(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const ArgMaxGeometry geo, ArgMaxFor(g, n));
  SALUS_ASSIGN_OR_RETURN(ElemType t, ElemTypeOf(n, In(n, g, 0).type));
  const std::string what = n.Describe();
  return FnKernel([t, geo, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchArgMax(t, geo, a.inputs[0], static_cast<int64_t*>(a.outputs[0]), StreamOf(a)), what);
  });
}

// Each element counts its rank over its whole slice, so slices are bounded: 4096 elements are
// 16M comparisons per slice.
constexpr int64_t kMaxSortedSlice = 4096;

KernelOr Sort(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const ArgMaxGeometry geo, SortFor(g, n));
  if (geo.axis_dim > kMaxSortedSlice) {
    return UnimplementedError(n.Describe() + ": sorting " + std::to_string(geo.axis_dim) +
                              " elements along the axis (at most " +
                              std::to_string(kMaxSortedSlice) + " on the GPU)");
  }
  SALUS_ASSIGN_OR_RETURN(ElemType t, ElemTypeOf(n, In(n, g, 0).type));
  const bool descending = n.GetInt("descending", 0) != 0;
  const std::string what = n.Describe();
  return FnKernel([t, geo, descending, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchSort(t, geo, descending, a.inputs[0], a.outputs[0],
                                 static_cast<int64_t*>(a.outputs[1]), StreamOf(a)),
                      what);
  });
}

// ---------------------------------------------------------------------------------------------
// Stateless random numbers, as cpu_random_kernels.cc's (philox_math.h).

KernelOr PhiloxKeyCounter(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const bool int32_seed, PhiloxKeyCounterFor(g, n));
  const std::string what = n.Describe();
  return FnKernel([int32_seed, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchPhiloxKeyCounter(static_cast<const int64_t*>(a.inputs[0]), int32_seed,
                                             static_cast<int64_t*>(a.outputs[0]),
                                             static_cast<int64_t*>(a.outputs[1]), StreamOf(a)),
                      what);
  });
}

KernelOr Random(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const PhiloxDraw draw, PhiloxDrawFor(g, n));
  const std::string what = n.Describe();
  return FnKernel([draw, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchRandom(draw.distribution, static_cast<const int64_t*>(a.inputs[0]),
                                   static_cast<const int64_t*>(a.inputs[1]), draw.count,
                                   static_cast<float*>(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

}  // namespace

void RegisterTensorKernels(KernelRegistry* registry) {
  const DeviceType cuda = DeviceType::kCuda;
  registry->Register("Gather", cuda, KernelFactory(&Gather));
  registry->Register("GatherElements", cuda, KernelFactory(&GatherElements));
  registry->Register("ScatterND", cuda, KernelFactory(&ScatterND));
  registry->Register("Where", cuda, KernelFactory(&Where));
  registry->Register("Expand", cuda, KernelFactory(&Expand));
  registry->Register("Slice", cuda, KernelFactory(&Slice));
  registry->Register("Split", cuda, KernelFactory(&Split));
  registry->Register("Trilu", cuda, KernelFactory(&Trilu));
  for (const auto& [op, unused] : UnaryOps()) {
    registry->Register(op, cuda, KernelFactory(&FloatUnary));
  }
  registry->Register("SalusPolygamma", cuda, KernelFactory(&Polygamma));
  registry->Register("Cast", cuda, KernelFactory(&Cast));
  registry->Register("Clip", cuda, KernelFactory(&Clip));
  registry->Register("Min", cuda, KernelFactory(&MinMax));
  registry->Register("Max", cuda, KernelFactory(&MinMax));
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    registry->Register(op, cuda, KernelFactory(&Compare));
  }
  for (const char* op : {"And", "Or", "Not"}) registry->Register(op, cuda, KernelFactory(&Logic));
  registry->Register("Mod", cuda, KernelFactory(&Mod));
  registry->Register("Range", cuda, KernelFactory(&Range));
  registry->Register("ConstantOfShape", cuda, KernelFactory(&ConstantOfShape));
  registry->Register("Shape", cuda, KernelFactory(&ShapeOf));
  registry->Register("SalusAssign", cuda, KernelFactory(&Assign));
  registry->Register("SalusArgMax", cuda, KernelFactory(&ArgMax));
  registry->Register("SalusSort", cuda, KernelFactory(&Sort));
  registry->Register("SalusPhiloxKeyCounter", cuda, KernelFactory(&PhiloxKeyCounter));
  for (const char* op : {"SalusRandomUniform", "SalusRandomNormal", "SalusRandomTruncatedNormal"}) {
    registry->Register(op, cuda, KernelFactory(&Random));
  }
}

}  // namespace salus::exec::cuda
