// The CUDA device's basic kernels, with the CPU's op names and semantics (cpu_kernels.cc):
//   - copies (Identity, Flatten, Reshape, Squeeze, Unsqueeze, Dropout, SalusReshape):
//     cudaMemcpyAsync, and Dropout's mask of ones by cudaMemsetAsync;
//   - unary ops: cuDNN's activations for Relu, Sigmoid, Tanh and Elu, the hand-written kernel of
//     elementwise.cu for LeakyRelu, Exp, Log, Sqrt, Neg, Abs and Softplus;
//   - broadcasting Add, Sub, Mul, Div, Pow and Transpose: elementwise.cu's kernels over
//     element_math.h's index maps (at most kMaxIndexDims dims once merged);
//   - Concat (of any element type): one strided copy (cudaMemcpy2DAsync) per non-empty input,
//     no kernel;
//   - DepthToSpace, Pad (constant mode) and SoftmaxCrossEntropyLoss: elementwise.cu's kernels.
// The per-element math and index maps are element_math.h's, which the CPU kernels share.
// Everything a kernel needs is fixed when it is built; Run only queues work on the context's
// stream.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/alignment.h"
#include "exec/cpu_kernel_helpers.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cuda_util.h"
#include "exec/cuda/elementwise_launch.h"
#include "exec/dnnl_kernel.h"
#include "exec/element_math.h"
#include "exec/shape_inference.h"

namespace salus::exec::cuda {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// cuDNN's blend factors (y = alpha * op(x) + beta * y), host floats for float tensors.
constexpr float kOne = 1.f;
constexpr float kZero = 0.f;

// Elements of one cudnnActivationForward call: cuDNN's legacy descriptors hold int dims and
// strides, so larger tensors are processed in chunks of this many elements.
constexpr int64_t kActivationChunk = int64_t{1} << 30;

Status RequireContext(const Node& n, const DeviceContext* ctx) {
  if (ctx == nullptr) return InternalError(n.Describe() + ": no CUDA context to build it with");
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Copies: the output is the input's bytes (a new shape, or Dropout outside training).

KernelOr Copy(const Node& n, const Graph& g, DeviceContext*) {
  if (n.op == "Dropout") SALUS_RETURN_IF_ERROR(RequireDropoutIsIdentity(n, g));
  const size_t bytes = g.value(n.inputs[0]).bytes();
  const bool mask = n.op == "Dropout" && n.output(1) != kNoValue;
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const std::string what = n.Describe();
  return FnKernel([bytes, mask, count, what](const KernelArgs& a) -> Status {
    if (bytes > 0 && a.outputs[0] != a.inputs[0]) {
      SALUS_CUDA_RETURN(
          cudaMemcpyAsync(a.outputs[0], a.inputs[0], bytes, cudaMemcpyDeviceToDevice, StreamOf(a)),
          what);
    }
    if (mask && count > 0) {
      // The mask is bool, one byte per element: all kept.
      SALUS_CUDA_RETURN(cudaMemsetAsync(a.outputs[1], 1, static_cast<size_t>(count), StreamOf(a)),
                        what + ": mask");
    }
    return OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// Unary ops.

// Relu, Sigmoid, Tanh and Elu by cudnnActivationForward over the tensor as a flat vector, in
// chunks of kActivationChunk elements.
class ActivationKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx);
  Status Run(const KernelArgs& args) override;

 private:
  explicit ActivationKernel(std::string what) : what_(std::move(what)) {}

  std::string what_;
  ActivationDesc activation_;
  TensorDesc chunk_;  // kActivationChunk elements, or all of them when fewer
  TensorDesc tail_;   // the elements after the last full chunk, if any
  int64_t count_ = 0;
  int64_t chunk_elements_ = 0;
  int64_t tail_elements_ = 0;
};

KernelOr ActivationKernel::Create(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const std::string what = n.Describe();
  cudnnActivationMode_t mode;
  double coef = 0.0;
  // Relu turns NaN into 0, as the CPU's (oneDNN's relu with alpha 0 is max(x, 0)).
  cudnnNanPropagation_t nan = CUDNN_PROPAGATE_NAN;
  if (n.op == "Relu") {
    mode = CUDNN_ACTIVATION_RELU;
    nan = CUDNN_NOT_PROPAGATE_NAN;
  } else if (n.op == "Sigmoid") {
    mode = CUDNN_ACTIVATION_SIGMOID;
  } else if (n.op == "Tanh") {
    mode = CUDNN_ACTIVATION_TANH;
  } else if (n.op == "Elu") {
    mode = CUDNN_ACTIVATION_ELU;
    coef = n.GetFloat("alpha", 1.f);
  } else {
    return UnimplementedError(what + ": not a cuDNN activation");
  }
  std::unique_ptr<ActivationKernel> k(new ActivationKernel(what));
  SALUS_CUDNN_RETURN(cudnnSetActivationDescriptor(k->activation_.d, mode, nan, coef),
                     what + ": activation descriptor");
  k->count_ = NumElements(g.value(n.inputs[0]).shape);
  if (k->count_ > 0) {
    k->chunk_elements_ = std::min(k->count_, kActivationChunk);
    SALUS_RETURN_IF_ERROR(k->chunk_.Set({k->chunk_elements_}, what));
    k->tail_elements_ = k->count_ % k->chunk_elements_;
    if (k->tail_elements_ > 0) SALUS_RETURN_IF_ERROR(k->tail_.Set({k->tail_elements_}, what));
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

Status ActivationKernel::Run(const KernelArgs& a) {
  const float* x = static_cast<const float*>(a.inputs[0]);
  float* y = static_cast<float*>(a.outputs[0]);
  for (int64_t done = 0; done < count_;) {
    const bool tail = count_ - done < chunk_elements_;
    const TensorDesc& desc = tail ? tail_ : chunk_;
    SALUS_CUDNN_RETURN(cudnnActivationForward(CudnnOf(a), activation_.d, &kOne, desc.d, x + done,
                                              &kZero, desc.d, y + done),
                       what_ + ": activation");
    done += tail ? tail_elements_ : chunk_elements_;
  }
  return OkStatus();
}

// LeakyRelu, Exp, Log, Sqrt, Neg, Abs and Softplus by elementwise.cu's kernel.
KernelOr Unary(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  UnaryOp op;
  if (!UnaryOpFor(n.op, &op)) return UnimplementedError(n.Describe() + ": not a unary op");
  // ONNX's default slope, as the CPU's EltwiseFor reads it.
  const float alpha = op == UnaryOp::kLeakyRelu ? n.GetFloat("alpha", 0.01f) : 0.f;
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const std::string what = n.Describe();
  return FnKernel([op, alpha, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchUnary(op, alpha, static_cast<const float*>(a.inputs[0]),
                                  static_cast<float*>(a.outputs[0]), count, StreamOf(a)),
                      what);
  });
}

// ---------------------------------------------------------------------------------------------
// Broadcasting binary ops and Transpose: index maps.

// An int64 binary op (a BatchNorm's num_batches_tracked += 1 in a PyTorch step): those
// HasInt64Kernel names run, others are refused.
bool IsInt64Binary(const Node& n, const Graph& g) {
  return g.value(n.outputs[0]).type == DataType::kInt64 &&
         g.value(n.inputs[0]).type == DataType::kInt64 &&
         g.value(n.inputs[1]).type == DataType::kInt64;
}

KernelOr Binary(const Node& n, const Graph& g, DeviceContext*) {
  const bool int64 = IsInt64Binary(n, g);
  const std::string what = n.Describe();
  BinaryOp op;
  if (!BinaryOpFor(n.op, &op)) return UnimplementedError(what + ": not a binary op");
  if (int64 && !HasInt64Kernel(op)) {
    return UnimplementedError(what + ": int64 " + n.op +
                              " on the GPU (int64 Add, Sub and Mul are)");
  }
  if (!int64) SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& a = g.value(n.inputs[0]).shape;
  const Shape& b = g.value(n.inputs[1]).shape;
  const Shape& out = g.value(n.outputs[0]).shape;
  IndexMap map;
  if (!MakeIndexMap(out, {BroadcastStrides(a, out), BroadcastStrides(b, out)}, &map)) {
    return UnimplementedError(what + ": broadcasting " + ShapeString(a) + " with " +
                              ShapeString(b) + " needs more than " + std::to_string(kMaxIndexDims) +
                              " dims");
  }
  if (int64) {
    return FnKernel([op, map, what](const KernelArgs& args) -> Status {
      return CudaStatus(LaunchBinaryInt64(op, map, static_cast<const int64_t*>(args.inputs[0]),
                                          static_cast<const int64_t*>(args.inputs[1]),
                                          static_cast<int64_t*>(args.outputs[0]), StreamOf(args)),
                        what);
    });
  }
  return FnKernel([op, map, what](const KernelArgs& args) -> Status {
    return CudaStatus(LaunchBinary(op, map, static_cast<const float*>(args.inputs[0]),
                                   static_cast<const float*>(args.inputs[1]),
                                   static_cast<float*>(args.outputs[0]), StreamOf(args)),
                      what);
  });
}

// Transpose: a gather by an index map. An int64 tensor moves as pairs of floats' bits (a
// trailing dim of 2 that stays in place; loads and stores copy bits).
KernelOr Transpose(const Node& n, const Graph& g, DeviceContext* ctx) {
  const bool int64 = g.value(n.inputs[0]).type == DataType::kInt64;
  if (!int64) SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const std::string what = n.Describe();
  Shape x = g.value(n.inputs[0]).shape;
  Shape y = g.value(n.outputs[0]).shape;
  if (x.empty()) return Copy(n, g, ctx);
  std::vector<int64_t> perm = n.GetInts("perm");
  if (perm.empty()) {
    for (int64_t i = static_cast<int64_t>(x.size()) - 1; i >= 0; --i) perm.push_back(i);
  }
  if (int64) {
    x.push_back(2);
    y.push_back(2);
    perm.push_back(static_cast<int64_t>(perm.size()));
  }
  // Output dim j runs over input dim perm[j].
  const Shape dense = DenseStrides(x);
  std::vector<int64_t> source(perm.size());
  for (size_t j = 0; j < perm.size(); ++j) source[j] = dense[perm[j]];
  IndexMap map;
  if (!MakeIndexMap(y, {source}, &map)) {
    return UnimplementedError(what + ": transposing " + ShapeString(x) + " needs more than " +
                              std::to_string(kMaxIndexDims) + " dims");
  }
  // A permutation that moves only size-1 dims leaves the elements in order: a copy.
  if (map.rank == 0 || (map.rank == 1 && map.strides[0][0] == 1)) return Copy(n, g, ctx);
  return FnKernel([map, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchGather(map, static_cast<const float*>(a.inputs[0]),
                                   static_cast<float*>(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

// ---------------------------------------------------------------------------------------------
// Concat: viewed as [outer, dim, inner] around the axis, input i is `outer` rows of
// dim_i * inner elements, each copied to its place in the output's rows of dim * inner: one
// strided copy per input.

struct ConcatPart {
  size_t input = 0;
  size_t row_bytes = 0;   // dim_i * inner elements: the source pitch and the width
  size_t dst_offset = 0;  // bytes from the output's start to the input's first row
};

KernelOr Concat(const Node& n, const Graph& g, DeviceContext* ctx) {
  SALUS_RETURN_IF_ERROR(RequireContext(n, ctx));
  const std::string what = n.Describe();
  // Bytes are copied, so any element type will do (shape inference made the inputs' types the
  // output's).
  const size_t elem = ElementSize(g.value(n.outputs[0]).type);
  const Shape& y = g.value(n.outputs[0]).shape;
  SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), y.size()));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= y[d];
  for (size_t d = axis + 1; d < y.size(); ++d) inner *= y[d];
  const size_t dst_pitch = static_cast<size_t>(y[axis] * inner) * elem;
  std::vector<ConcatPart> parts;
  int64_t at = 0;  // along the axis
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& s = g.value(n.inputs[i]).shape;
    if (NumElements(s) > 0) {
      parts.push_back(
          {i, static_cast<size_t>(s[axis] * inner) * elem, static_cast<size_t>(at * inner) * elem});
    }
    at += s[axis];
  }
  // cudaMemcpy2DAsync refuses pitches over the device's limit; rows that long are few (the
  // output holds `outer` of them), so those are copied one by one.
  int max_pitch = 0;
  SALUS_CUDA_RETURN(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, ctx->device.ordinal),
                    what + ": maximum pitch");
  const bool row_by_row = dst_pitch > static_cast<size_t>(max_pitch);
  return FnKernel([parts, outer, dst_pitch, row_by_row, what](const KernelArgs& a) -> Status {
    std::byte* out = static_cast<std::byte*>(a.outputs[0]);
    for (const ConcatPart& p : parts) {
      const std::byte* src = static_cast<const std::byte*>(a.inputs[p.input]);
      std::byte* dst = out + p.dst_offset;
      if (outer == 1) {
        SALUS_CUDA_RETURN(
            cudaMemcpyAsync(dst, src, p.row_bytes, cudaMemcpyDeviceToDevice, StreamOf(a)), what);
      } else if (!row_by_row) {
        SALUS_CUDA_RETURN(
            cudaMemcpy2DAsync(dst, dst_pitch, src, p.row_bytes, p.row_bytes,
                              static_cast<size_t>(outer), cudaMemcpyDeviceToDevice, StreamOf(a)),
            what);
      } else {
        for (int64_t r = 0; r < outer; ++r) {
          SALUS_CUDA_RETURN(cudaMemcpyAsync(dst + r * dst_pitch, src + r * p.row_bytes, p.row_bytes,
                                            cudaMemcpyDeviceToDevice, StreamOf(a)),
                            what);
        }
      }
    }
    return OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace, Pad and the loss.

KernelOr DepthToSpace(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& x = g.value(n.inputs[0]).shape;
  const DepthToSpaceGeometry geo{
      x[0], x[1], x[2], x[3], n.GetInt("blocksize", 1), n.GetString("mode", "DCR") == "DCR"};
  const std::string what = n.Describe();
  return FnKernel([geo, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchDepthToSpace(geo, static_cast<const float*>(a.inputs[0]),
                                         static_cast<float*>(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

KernelOr Pad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(const PadSpec p, PadSpecOf(n, g));
  const std::string what = n.Describe();
  PadMap map;
  if (!MakePadMap(g.value(n.inputs[0]).shape, p.pads, &map)) {
    return UnimplementedError(what + ": padding " + ShapeString(g.value(n.inputs[0]).shape) +
                              " needs more than " + std::to_string(kMaxIndexDims) + " dims");
  }
  if (p.int64) {
    return FnKernel([map, value = p.int_value, what](const KernelArgs& a) -> Status {
      return CudaStatus(LaunchPad(map, value, static_cast<const int64_t*>(a.inputs[0]),
                                  static_cast<int64_t*>(a.outputs[0]), StreamOf(a)),
                        what);
    });
  }
  return FnKernel([map, value = p.float_value, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchPad(map, value, static_cast<const float*>(a.inputs[0]),
                                static_cast<float*>(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

// Scratch: the log-probabilities when the log_prob output is not taken, then (mean and sum)
// each row's loss term and weight.
KernelOr SoftmaxCrossEntropy(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {0, 2}));
  SALUS_ASSIGN_OR_RETURN(SceSpec s, SceFor(n, g));
  const std::string what = n.Describe();
  const bool want_logp = n.output(1) != kNoValue;
  const uint64_t rows = static_cast<uint64_t>(s.n * s.d);
  const uint64_t logp_bytes =
      want_logp ? 0 : AlignUp(static_cast<uint64_t>(s.n * s.c * s.d) * sizeof(float));
  const uint64_t terms_bytes = s.reduction == 2 ? 0 : AlignUp(rows * sizeof(float));
  const size_t scratch_bytes = logp_bytes + 2 * terms_bytes;
  return FnKernel(
      [s, want_logp, logp_bytes, terms_bytes, what](const KernelArgs& a) -> Status {
        std::byte* scratch = static_cast<std::byte*>(a.scratch);
        float* logp =
            want_logp ? static_cast<float*>(a.outputs[1]) : reinterpret_cast<float*>(scratch);
        float* row_loss =
            terms_bytes > 0 ? reinterpret_cast<float*>(scratch + logp_bytes) : nullptr;
        float* row_weight = terms_bytes > 0
                                ? reinterpret_cast<float*>(scratch + logp_bytes + terms_bytes)
                                : nullptr;
        const float* weights =
            a.inputs.size() > 2 ? static_cast<const float*>(a.inputs[2]) : nullptr;
        return CudaStatus(LaunchSoftmaxCrossEntropy(s, static_cast<const float*>(a.inputs[0]),
                                                    static_cast<const int64_t*>(a.inputs[1]),
                                                    weights, logp, row_loss, row_weight,
                                                    static_cast<float*>(a.outputs[0]), StreamOf(a)),
                          what);
      },
      scratch_bytes);
}

}  // namespace

void RegisterBasicKernels(KernelRegistry* registry) {
  const DeviceType cuda = DeviceType::kCuda;
  for (const char* op :
       {"Identity", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Dropout", "SalusReshape"}) {
    registry->Register(op, cuda, KernelFactory(&Copy));
  }
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Elu"}) {
    registry->Register(op, cuda, KernelFactory(&ActivationKernel::Create));
  }
  for (const char* op : {"LeakyRelu", "Exp", "Log", "Sqrt", "Neg", "Abs", "Softplus"}) {
    registry->Register(op, cuda, KernelFactory(&Unary));
  }
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow"}) {
    registry->Register(op, cuda, KernelFactory(&Binary));
  }
  registry->Register("Transpose", cuda, KernelFactory(&Transpose));
  registry->Register("Concat", cuda, KernelFactory(&Concat));
  registry->Register("DepthToSpace", cuda, KernelFactory(&DepthToSpace));
  registry->Register("Pad", cuda, KernelFactory(&Pad));
  registry->Register("SoftmaxCrossEntropyLoss", cuda, KernelFactory(&SoftmaxCrossEntropy));
}

}  // namespace salus::exec::cuda
