// The CUDA device's cuDNN kernels: Conv, ConvTranspose, MaxPool, AveragePool, GlobalAveragePool,
// GlobalMaxPool, BatchNormalization, Softmax and LogSoftmax, with the CPU's semantics
// (cpu_kernels.cc) and the CPU's window geometry (window.h). Descriptors, algorithms and the
// layout of each kernel's scratch are fixed when the kernel is built; Run only queues work on the
// context's stream. What cuDNN cannot express is done by the hand-written kernels of pool_bn.cu.
//
// Note [cuDNN windows]: cuDNN takes one padding per spatial dim, applied at both ends, while an
// ONNX window may pad its ends differently (explicit pads, auto_pad SAME_UPPER/SAME_LOWER with
// an odd total, and the end padding ComputeWindow adds for ceil_mode). So:
//   - Conv with unequal pads copies the input into a zero-padded scratch tensor and convolves
//     that with no padding;
//   - ConvTranspose with unequal pads, negative pads or an output_padding of a stride or more
//     computes the unpadded (full) result into scratch and copies the window of it the output
//     needs, zeros where the window runs past it (the output_padding rows);
//   - pooling goes to cuDNN only when the pads are equal, there is no dilation and every pad is
//     smaller than its kernel (so that no window lies wholly in the padding, where cuDNN's result
//     is not known to be the CPU's); otherwise, to the generic pooling kernel of pool_math.h, which
//     has the CPU's semantics for every window.
// 1-D windows are described to cuDNN as 2-D ones with a unit second dim, matching TensorDesc's
// padding of shapes with trailing 1s.
//
// Note [Convolution algorithms]: a convolution's algorithm is chosen when its kernel is built,
// from cuDNN's heuristics (cudnnGet*Algorithm_v7 through the compiling thread's handle; never the
// timing cudnnFind*, which may choose differently from one compile to the next). The first
// candidate, in cuDNN's order, is taken that
//   - cuDNN reports as supported,
//   - is deterministic: two runs of an iteration, in any lane, give bit-identical results;
//   - is not a tensor-core variant: the descriptor's math type is CUDNN_FMA_MATH, so no TF32;
//   - is not FFT-based or non-fused Winograd, whose transforms round more than a direct
//     convolution and could leave the CPU's results beyond 1e-4 relative. They are
//     deterministic, and faster for larger batches, but their workspaces can grow a lane
//     several-fold; a session admits them with ModelSpec.convolution_transforms (the
//     executable marks its convolution nodes, kConvolutionTransformsAttr), and
//     SALUS_CUDNN_TRANSFORMS=1 in the environment admits them for every session;
//   - needs at most kMaxConvWorkspaceBytes of workspace for these descriptors.
// Failing all, implicit GEMM, which supports every configuration without workspace. The
// workspace is part of the kernel's scratch, so the lane plan (E) includes it.
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/alignment.h"
#include "exec/cpu_kernel_helpers.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cuda_util.h"
#include "exec/cuda/cudnn_helpers.h"
#include "exec/cuda/pool_bn_launch.h"
#include "exec/kernel_registry.h"
#include "exec/window.h"

namespace salus::exec::cuda {

// The helpers cudnn_helpers.h declares.

Status RequireCudnn(const Node& n, const DeviceContext* ctx) {
  if (ctx == nullptr || ctx->cudnn == nullptr) {
    return InternalError(n.Describe() + ": no cuDNN handle to build the kernel with");
  }
  return OkStatus();
}

bool TransformAlgorithmsAllowed(const Node& n) {
  static const bool on = [] {
    const char* env = std::getenv("SALUS_CUDNN_TRANSFORMS");
    return env != nullptr && std::string(env) == "1";
  }();
  return on || n.GetInt(kConvolutionTransformsAttr, 0) != 0;
}

Status SetTensor(TensorDesc* desc, const Shape& dims, const std::string& what) {
  int64_t elements = 1;
  for (int64_t d : dims) {
    if (d < 0 || (d > 0 && elements > std::numeric_limits<int32_t>::max() / d)) {
      return UnimplementedError(what + ": a tensor of " + ShapeString(dims) +
                                " is too large for cuDNN");
    }
    elements *= d;
  }
  return desc->Set(dims, what);
}

std::vector<int> WindowInts(const std::vector<int64_t>& values, int fill) {
  std::vector<int> out;
  for (int64_t v : values) out.push_back(static_cast<int>(v));
  while (out.size() < 2) out.push_back(fill);
  return out;
}

Status RequireConvRank(const Node& n, const Shape& xs, const Shape& ws) {
  if (xs.size() != ws.size() || xs.size() < 3) {
    return InvalidArgumentError(n.Describe() + ": bad X/W rank");
  }
  if (xs.size() - 2 > static_cast<size_t>(kMaxWindowDims)) {
    return UnimplementedError(n.Describe() + ": " + std::to_string(xs.size() - 2) +
                              "-D convolution");
  }
  return OkStatus();
}

StatusOr<int> GroupOf(const Node& n) {
  const int64_t group = n.GetInt("group", 1);
  if (group < 1 || group > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(n.Describe() + ": bad group");
  }
  return static_cast<int>(group);
}

Status SetConvolution(ConvDesc* conv, const std::vector<int64_t>& pads,
                      const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                      int group, const std::string& what) {
  const std::vector<int> p = WindowInts(pads, 0);
  const std::vector<int> s = WindowInts(strides, 1);
  const std::vector<int> d = WindowInts(dilations, 1);
  SALUS_CUDNN_RETURN(
      cudnnSetConvolutionNdDescriptor(conv->d, static_cast<int>(p.size()), p.data(), s.data(),
                                      d.data(), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
      what + ": convolution descriptor");
  SALUS_CUDNN_RETURN(cudnnSetConvolutionGroupCount(conv->d, group), what + ": group count");
  SALUS_CUDNN_RETURN(cudnnSetConvolutionMathType(conv->d, CUDNN_FMA_MATH), what + ": math type");
  return OkStatus();
}

Status CheckForwardShape(const ConvDesc& conv, const TensorDesc& x, const FilterDesc& w,
                         const Shape& y, const std::string& what) {
  const std::vector<int> want = CudnnDims(y);
  std::vector<int> got(want.size(), 0);
  SALUS_CUDNN_RETURN(cudnnGetConvolutionNdForwardOutputDim(
                         conv.d, x.d, w.d, static_cast<int>(got.size()), got.data()),
                     what + ": convolution output shape");
  if (got != want) {
    return InternalError(what + ": cuDNN's convolution output shape differs from " +
                         ShapeString(y));
  }
  return OkStatus();
}

StatusOr<PoolWindow> PoolWindowFor(const Node& n, const std::string& op, const Shape& xs,
                                   const Shape& ys) {
  const std::string what = n.Describe();
  if (xs.size() < 3) return InvalidArgumentError(what + ": input rank below 3");
  const std::vector<int64_t> spatial(xs.begin() + 2, xs.end());
  if (spatial.size() > static_cast<size_t>(kMaxWindowDims)) {
    return UnimplementedError(what + ": " + std::to_string(spatial.size()) + "-D pooling");
  }
  const bool global = op == "GlobalAveragePool" || op == "GlobalMaxPool";
  const bool max = op == "MaxPool" || op == "GlobalMaxPool";
  if (!global && !max && op != "AveragePool") {
    return InvalidArgumentError(what + ": " + op + " is not a pooling op");
  }
  Window win;
  PoolMode mode = max ? PoolMode::kMax : PoolMode::kAverageExcludePad;
  if (global) {
    // The CPU's global pooling: a window of the whole input, no padding.
    win.in = spatial;
    win.out.assign(spatial.size(), 1);
    win.kernel = spatial;
    win.strides.assign(spatial.size(), 1);
    win.dilations.assign(spatial.size(), 1);
    win.pad_begin.assign(spatial.size(), 0);
    win.pad_end.assign(spatial.size(), 0);
  } else {
    const bool ceil_mode = n.GetInt("ceil_mode", 0) != 0;
    const bool include_pad = n.GetInt("count_include_pad", 0) != 0;
    if (!max && include_pad) {
      // Refused, as PoolFor (cpu_kernel_helpers.cc) refuses it on the CPU.
      if (ceil_mode) return UnimplementedError(what + ": ceil_mode with count_include_pad");
      mode = PoolMode::kAverageIncludePad;
    }
    SALUS_ASSIGN_OR_RETURN(win, ComputeWindow(n, spatial, n.GetInts("kernel_shape"), ceil_mode));
    if (mode == PoolMode::kAverageExcludePad) {
      // As the CPU (oneDNN) refuses: a window wholly in the padding would average no element.
      for (size_t i = 0; i < win.rank(); ++i) {
        const int64_t span = (win.kernel[i] - 1) * win.dilations[i] + 1;
        if (win.pad_begin[i] >= span || win.pad_end[i] >= span) {
          return UnimplementedError(what + ": average pooling with pads as large as the window");
        }
      }
    }
  }
  Shape want = {xs[0], xs[1]};
  want.insert(want.end(), win.out.begin(), win.out.end());
  if (want != ys) return InternalError(what + ": window output differs from " + ShapeString(ys));
  return PoolWindow{win, mode};
}

namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// ---------------------------------------------------------------------------------------------
// Conv: cudnnConvolutionForward, then the bias (cudnnAddTensor) and the fused Relu or Clip
// with a lower bound of 0 (cudnnActivationForward in place, CUDNN_ACTIVATION_CLIPPED_RELU for
// the Clip) that inference executables fold into a Conv (exec/fusion.h).

class ConvKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx);
  size_t scratch_bytes() const override { return padded_bytes_ + workspace_bytes_; }
  Status Run(const KernelArgs& args) override;

 private:
  explicit ConvKernel(std::string what) : what_(std::move(what)) {}

  std::string what_;
  TensorDesc x_, y_, bias_;
  FilterDesc w_;
  ConvDesc conv_;
  ActivationDesc relu_;  // the fused Relu or clipped Relu
  cudnnConvolutionFwdAlgo_t algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  bool has_bias_ = false;
  bool fuse_relu_ = false;
  bool pad_input_ = false;  // Note [cuDNN windows]
  PadGeometry pad_;
  size_t padded_bytes_ = 0;     // the padded input, at the start of scratch
  size_t workspace_bytes_ = 0;  // cuDNN's workspace, after it
};

KernelOr ConvKernel::Create(const Node& n, const Graph& g, DeviceContext* ctx) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_RETURN_IF_ERROR(RequireCudnn(n, ctx));
  const std::string what = n.Describe();
  const Shape& xs = g.value(n.inputs[0]).shape;
  const Shape& ws = g.value(n.inputs[1]).shape;
  const Shape& ys = g.value(n.outputs[0]).shape;
  SALUS_RETURN_IF_ERROR(RequireConvRank(n, xs, ws));
  SALUS_ASSIGN_OR_RETURN(const int group, GroupOf(n));
  const std::string activation = n.GetString("fused_activation", "");
  const bool clip = activation == "Clip";
  if (!activation.empty() && activation != "Relu" &&
      !(clip && n.GetFloat("fused_min", 0.f) == 0.f)) {
    return UnimplementedError(what + ": fused activation " + activation);
  }
  if (n.input(3) != kNoValue) return UnimplementedError(what + ": fused residual sum");
  const std::vector<int64_t> spatial(xs.begin() + 2, xs.end());
  const std::vector<int64_t> kernel(ws.begin() + 2, ws.end());
  SALUS_ASSIGN_OR_RETURN(Window win, ComputeWindow(n, spatial, kernel, false));

  std::unique_ptr<ConvKernel> k(new ConvKernel(what));
  k->has_bias_ = n.input(2) != kNoValue;
  k->fuse_relu_ = !activation.empty();
  k->pad_input_ = win.pad_begin != win.pad_end;
  Shape conv_in = xs;
  std::vector<int64_t> pads = win.pad_begin;
  if (k->pad_input_) {
    std::vector<int64_t> padded(spatial.size());
    for (size_t i = 0; i < spatial.size(); ++i) {
      padded[i] = spatial[i] + win.pad_begin[i] + win.pad_end[i];
      conv_in[2 + i] = padded[i];
    }
    pads.assign(spatial.size(), 0);
    k->pad_ = MakePadGeometry(xs[0] * xs[1], spatial, padded, win.pad_begin);
  }
  SALUS_RETURN_IF_ERROR(SetTensor(&k->x_, conv_in, what));
  SALUS_RETURN_IF_ERROR(SetTensor(&k->y_, ys, what));
  SALUS_RETURN_IF_ERROR(k->w_.Set(ws, what));
  if (k->pad_input_) k->padded_bytes_ = AlignUp(NumElements(conv_in) * sizeof(float));
  SALUS_RETURN_IF_ERROR(SetConvolution(&k->conv_, pads, win.strides, win.dilations, group, what));
  SALUS_RETURN_IF_ERROR(CheckForwardShape(k->conv_, k->x_, k->w_, ys, what));

  cudnnHandle_t h = ctx->cudnn;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  SALUS_CUDNN_RETURN(
      cudnnGetConvolutionForwardAlgorithm_v7(h, k->x_.d, k->w_.d, k->conv_.d, k->y_.d,
                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf),
      what + ": convolution algorithms");
  const ConvKernel& kr = *k;
  auto workspace = [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, kr.x_.d, kr.w_.d, kr.conv_.d, kr.y_.d, algo,
                                                   bytes);
  };
  SALUS_ASSIGN_OR_RETURN(
      auto choice,
      PickAlgorithm(perf, returned, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, workspace, n, what));
  k->algo_ = choice.algo;
  k->workspace_bytes_ = choice.workspace_bytes;

  if (k->has_bias_) {
    Shape bias_shape(ys.size(), 1);
    bias_shape[1] = ys[1];
    SALUS_RETURN_IF_ERROR(SetTensor(&k->bias_, bias_shape, what));
  }
  if (k->fuse_relu_) {
    // A NaN becomes 0, as in the CPU's fused Relu (oneDNN's max(x, 0)). The clipped Relu is
    // min(max(x, 0), coef).
    SALUS_CUDNN_RETURN(cudnnSetActivationDescriptor(
                           k->relu_.d, clip ? CUDNN_ACTIVATION_CLIPPED_RELU : CUDNN_ACTIVATION_RELU,
                           CUDNN_NOT_PROPAGATE_NAN, clip ? n.GetFloat("fused_max", 0.f) : 0.0),
                       what + ": fused " + activation);
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

Status ConvKernel::Run(const KernelArgs& a) {
  cudnnHandle_t h = CudnnOf(a);
  std::byte* scratch = static_cast<std::byte*>(a.scratch);
  const void* x = a.inputs[0];
  if (pad_input_) {
    float* padded = reinterpret_cast<float*>(scratch);
    SALUS_CUDA_RETURN(
        LaunchPadCopy(pad_, static_cast<const float*>(a.inputs[0]), padded, StreamOf(a)),
        what_ + ": padding the input");
    x = padded;
  }
  void* workspace = workspace_bytes_ > 0 ? scratch + padded_bytes_ : nullptr;
  SALUS_CUDNN_RETURN(
      cudnnConvolutionForward(h, &kOne, x_.d, x, w_.d, a.inputs[1], conv_.d, algo_, workspace,
                              workspace_bytes_, &kZero, y_.d, a.outputs[0]),
      what_ + ": convolution");
  if (has_bias_) {
    SALUS_CUDNN_RETURN(cudnnAddTensor(h, &kOne, bias_.d, a.inputs[2], &kOne, y_.d, a.outputs[0]),
                       what_ + ": bias");
  }
  if (fuse_relu_) {
    SALUS_CUDNN_RETURN(
        cudnnActivationForward(h, relu_.d, &kOne, y_.d, a.outputs[0], &kZero, y_.d, a.outputs[0]),
        what_ + ": fused activation");
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// ConvTranspose: the data gradient of the forward convolution whose filter is W as ONNX stores it
// ([C_in, C_out/group, k...] is cuDNN's [K, C/group, k...] for that convolution), then the bias.

class ConvTransposeKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx);
  size_t scratch_bytes() const override { return full_bytes_ + workspace_bytes_; }
  Status Run(const KernelArgs& args) override;

 private:
  explicit ConvTransposeKernel(std::string what) : what_(std::move(what)) {}

  std::string what_;
  TensorDesc x_;  // the input: the gradient cuDNN reads
  TensorDesc z_;  // what cuDNN writes: the output, or the full result when cropping
  TensorDesc y_, bias_;
  FilterDesc w_;
  ConvDesc conv_;
  cudnnConvolutionBwdDataAlgo_t algo_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  bool has_bias_ = false;
  bool crop_ = false;  // Note [cuDNN windows]
  PadGeometry crop_geometry_;
  size_t full_bytes_ = 0;       // the full result, at the start of scratch, when crop_
  size_t workspace_bytes_ = 0;  // cuDNN's workspace, after it
};

KernelOr ConvTransposeKernel::Create(const Node& n, const Graph& g, DeviceContext* ctx) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_RETURN_IF_ERROR(RequireCudnn(n, ctx));
  const std::string what = n.Describe();
  const Shape& xs = g.value(n.inputs[0]).shape;
  const Shape& ws = g.value(n.inputs[1]).shape;
  const Shape& ys = g.value(n.outputs[0]).shape;
  SALUS_RETURN_IF_ERROR(RequireConvRank(n, xs, ws));
  SALUS_ASSIGN_OR_RETURN(const int group, GroupOf(n));
  const std::vector<int64_t> spatial(xs.begin() + 2, xs.end());
  const std::vector<int64_t> kernel(ws.begin() + 2, ws.end());
  SALUS_ASSIGN_OR_RETURN(Window win, ComputeTransposedWindow(n, spatial, kernel));

  std::unique_ptr<ConvTransposeKernel> k(new ConvTransposeKernel(what));
  k->has_bias_ = n.input(2) != kNoValue;
  // cuDNN writes an output of the forward convolution's input shape: with equal pads p and an
  // output_padding below the stride, that is exactly the output (the output_padding rows get
  // no contribution, so they come out 0).
  for (size_t i = 0; i < spatial.size(); ++i) {
    if (win.pad_begin[i] != win.pad_end[i] || win.pad_begin[i] < 0 ||
        win.output_padding[i] >= win.strides[i]) {
      k->crop_ = true;
    }
  }
  Shape z = ys;
  std::vector<int64_t> pads = win.pad_begin;
  if (k->crop_) {
    std::vector<int64_t> full(spatial.size()), offset(spatial.size());
    for (size_t i = 0; i < spatial.size(); ++i) {
      full[i] = win.strides[i] * (spatial[i] - 1) + (kernel[i] - 1) * win.dilations[i] + 1;
      z[2 + i] = full[i];
      offset[i] = -win.pad_begin[i];
    }
    pads.assign(spatial.size(), 0);
    const std::vector<int64_t> out(ys.begin() + 2, ys.end());
    k->crop_geometry_ = MakePadGeometry(ys[0] * ys[1], full, out, offset);
  }
  SALUS_RETURN_IF_ERROR(SetTensor(&k->x_, xs, what));
  SALUS_RETURN_IF_ERROR(SetTensor(&k->z_, z, what));
  SALUS_RETURN_IF_ERROR(SetTensor(&k->y_, ys, what));
  SALUS_RETURN_IF_ERROR(k->w_.Set(ws, what));
  if (k->crop_) k->full_bytes_ = AlignUp(NumElements(z) * sizeof(float));
  SALUS_RETURN_IF_ERROR(SetConvolution(&k->conv_, pads, win.strides, win.dilations, group, what));
  // The forward convolution of z must give the input's shape.
  SALUS_RETURN_IF_ERROR(CheckForwardShape(k->conv_, k->z_, k->w_, xs, what));

  cudnnHandle_t h = ctx->cudnn;
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int returned = 0;
  SALUS_CUDNN_RETURN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                         h, k->w_.d, k->x_.d, k->conv_.d, k->z_.d,
                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf),
                     what + ": transposed convolution algorithms");
  const ConvTransposeKernel& kr = *k;
  auto workspace = [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, kr.w_.d, kr.x_.d, kr.conv_.d, kr.z_.d,
                                                        algo, bytes);
  };
  // ALGO_1 is the deterministic one of the two that support every configuration.
  SALUS_ASSIGN_OR_RETURN(
      auto choice,
      PickAlgorithm(perf, returned, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, workspace, n, what));
  k->algo_ = choice.algo;
  k->workspace_bytes_ = choice.workspace_bytes;

  if (k->has_bias_) {
    Shape bias_shape(ys.size(), 1);
    bias_shape[1] = ys[1];
    SALUS_RETURN_IF_ERROR(SetTensor(&k->bias_, bias_shape, what));
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

Status ConvTransposeKernel::Run(const KernelArgs& a) {
  cudnnHandle_t h = CudnnOf(a);
  std::byte* scratch = static_cast<std::byte*>(a.scratch);
  void* z = crop_ ? static_cast<void*>(scratch) : a.outputs[0];
  void* workspace = workspace_bytes_ > 0 ? scratch + full_bytes_ : nullptr;
  SALUS_CUDNN_RETURN(
      cudnnConvolutionBackwardData(h, &kOne, w_.d, a.inputs[1], x_.d, a.inputs[0], conv_.d, algo_,
                                   workspace, workspace_bytes_, &kZero, z_.d, z),
      what_ + ": transposed convolution");
  if (crop_) {
    SALUS_CUDA_RETURN(LaunchPadCopy(crop_geometry_, static_cast<const float*>(z),
                                    static_cast<float*>(a.outputs[0]), StreamOf(a)),
                      what_ + ": cropping the output");
  }
  if (has_bias_) {
    SALUS_CUDNN_RETURN(cudnnAddTensor(h, &kOne, bias_.d, a.inputs[2], &kOne, y_.d, a.outputs[0]),
                       what_ + ": bias");
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool: cudnnPoolingForward, or the generic
// pooling kernel (Note [cuDNN windows]).

class PoolKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx);
  Status Run(const KernelArgs& args) override;

 private:
  explicit PoolKernel(std::string what) : what_(std::move(what)) {}
  // Sets up cuDNN for `geometry_`'s window; false (and cuDNN unused) when cuDNN would not compute
  // the CPU's result or does not take the window or the tensors.
  bool SetUpCudnn(const Shape& xs, const Shape& ys, const Window& win);

  std::string what_;
  PoolGeometry geometry_;
  bool use_cudnn_ = false;
  TensorDesc x_, y_;
  PoolDesc pool_;
};

KernelOr PoolKernel::Create(const Node& n, const Graph& g, DeviceContext* ctx) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_RETURN_IF_ERROR(RequireCudnn(n, ctx));
  const Shape& xs = g.value(n.inputs[0]).shape;
  const Shape& ys = g.value(n.outputs[0]).shape;
  SALUS_ASSIGN_OR_RETURN(PoolWindow pw, PoolWindowFor(n, n.op, xs, ys));
  const Window& win = pw.win;
  std::unique_ptr<PoolKernel> k(new PoolKernel(n.Describe()));
  k->geometry_ = MakePoolGeometry(pw.mode, xs[0] * xs[1], win.in, win.out, win.kernel, win.strides,
                                  win.dilations, win.pad_begin);
  k->use_cudnn_ = k->SetUpCudnn(xs, ys, win);
  return std::unique_ptr<Kernel>(std::move(k));
}

bool PoolKernel::SetUpCudnn(const Shape& xs, const Shape& ys, const Window& win) {
  for (size_t i = 0; i < win.rank(); ++i) {
    if (win.pad_begin[i] != win.pad_end[i] || win.dilations[i] != 1 ||
        win.pad_begin[i] >= win.kernel[i]) {
      return false;
    }
  }
  // Max pooling skips NaNs, as the CPU's does (a tap wins only when greater).
  const cudnnPoolingMode_t mode = geometry_.mode == PoolMode::kMax ? CUDNN_POOLING_MAX
                                  : geometry_.mode == PoolMode::kAverageIncludePad
                                      ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                      : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  const std::vector<int> window = WindowInts(win.kernel, 1);
  const std::vector<int> pads = WindowInts(win.pad_begin, 0);
  const std::vector<int> strides = WindowInts(win.strides, 1);
  if (!SetTensor(&x_, xs, what_).ok() || !SetTensor(&y_, ys, what_).ok()) return false;
  if (cudnnSetPoolingNdDescriptor(pool_.d, mode, CUDNN_NOT_PROPAGATE_NAN,
                                  static_cast<int>(window.size()), window.data(), pads.data(),
                                  strides.data()) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  const std::vector<int> want = CudnnDims(ys);
  std::vector<int> got(want.size(), 0);
  if (cudnnGetPoolingNdForwardOutputDim(pool_.d, x_.d, static_cast<int>(got.size()), got.data()) !=
          CUDNN_STATUS_SUCCESS ||
      got != want) {
    return false;
  }
  return true;
}

Status PoolKernel::Run(const KernelArgs& a) {
  if (use_cudnn_) {
    SALUS_CUDNN_RETURN(cudnnPoolingForward(CudnnOf(a), pool_.d, &kOne, x_.d, a.inputs[0], &kZero,
                                           y_.d, a.outputs[0]),
                       what_ + ": pooling");
    return OkStatus();
  }
  return CudaStatus(LaunchPool(geometry_, static_cast<const float*>(a.inputs[0]),
                               static_cast<float*>(a.outputs[0]), StreamOf(a)),
                    what_ + ": pooling");
}

// ---------------------------------------------------------------------------------------------
// BatchNormalization, per channel over [N, C, everything after C]:
//   - inference: cudnnBatchNormalizationForwardInference (SPATIAL); below cuDNN's smallest
//     epsilon, the hand-written normalization;
//   - training_mode=1: cudnnBatchNormalizationForwardTraining normalizes with the batch
//     statistics (biased variance, as the CPU), and writes the batch mean and the unbiased batch
//     variance into scratch (as its running statistics with an average factor of 1, from zero);
//     a small kernel then writes the running outputs as the CPU does, from the biased variance.
//     Below cuDNN's smallest epsilon, or with one element per channel, hand-written statistics
//     and normalization instead.

class BatchNormKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx);
  size_t scratch_bytes() const override { return training_ ? 2 * stat_bytes_ : 0; }
  Status Run(const KernelArgs& args) override;

 private:
  explicit BatchNormKernel(std::string what) : what_(std::move(what)) {}
  Status RunTraining(const KernelArgs& a);

  std::string what_;
  bool training_ = false;
  bool use_cudnn_ = false;
  BnShape shape_;
  float epsilon_ = 1e-5f;
  float momentum_ = 0.9f;
  // Turns the batch variance in scratch into the biased one (LaunchBnRunningUpdate): (m - 1) / m
  // for cuDNN's unbiased variance, 1 for the hand-written statistics.
  float var_scale_ = 1.f;
  TensorDesc x_, params_;
  size_t stat_bytes_ = 0;  // training: batch mean at 0, batch variance at stat_bytes_
};

KernelOr BatchNormKernel::Create(const Node& n, const Graph& g, DeviceContext* ctx) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_RETURN_IF_ERROR(RequireCudnn(n, ctx));
  const std::string what = n.Describe();
  const Shape& xs = g.value(n.inputs[0]).shape;
  if (xs.size() < 2) return InvalidArgumentError(what + ": input rank below 2");
  std::unique_ptr<BatchNormKernel> k(new BatchNormKernel(what));
  k->shape_.n = xs[0];
  k->shape_.channels = xs[1];
  k->shape_.spatial = 1;
  for (size_t i = 2; i < xs.size(); ++i) k->shape_.spatial *= xs[i];
  k->epsilon_ = n.GetFloat("epsilon", 1e-5f);
  k->momentum_ = n.GetFloat("momentum", 0.9f);
  k->training_ = n.GetInt("training_mode", 0) != 0;
  k->stat_bytes_ = AlignUp(k->shape_.channels * sizeof(float));
  const int64_t m = k->shape_.n * k->shape_.spatial;  // elements per channel
  // cuDNN's running variance is unbiased (over m - 1), undefined for one element per channel:
  // training with that goes to the hand-written statistics, whose variance is the CPU's 0.
  k->use_cudnn_ =
      static_cast<double>(k->epsilon_) >= CUDNN_BN_MIN_EPSILON && (!k->training_ || m > 1);
  if (k->use_cudnn_) {
    SALUS_RETURN_IF_ERROR(
        SetTensor(&k->x_, {k->shape_.n, k->shape_.channels, k->shape_.spatial, 1}, what));
    SALUS_CUDNN_RETURN(
        cudnnDeriveBNTensorDescriptor(k->params_.d, k->x_.d, CUDNN_BATCHNORM_SPATIAL),
        what + ": parameter descriptor");
    if (k->training_) {
      k->var_scale_ = static_cast<float>(static_cast<double>(m - 1) / static_cast<double>(m));
    }
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

Status BatchNormKernel::Run(const KernelArgs& a) {
  if (training_) return RunTraining(a);
  const float* x = static_cast<const float*>(a.inputs[0]);
  float* y = static_cast<float*>(a.outputs[0]);
  if (use_cudnn_) {
    SALUS_CUDNN_RETURN(
        cudnnBatchNormalizationForwardInference(
            CudnnOf(a), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_.d, x, x_.d, y, params_.d,
            a.inputs[1], a.inputs[2], a.inputs[3], a.inputs[4], static_cast<double>(epsilon_)),
        what_ + ": batch normalization");
    return OkStatus();
  }
  return CudaStatus(LaunchBnNormalize(shape_, epsilon_, x, static_cast<const float*>(a.inputs[1]),
                                      static_cast<const float*>(a.inputs[2]),
                                      static_cast<const float*>(a.inputs[3]),
                                      static_cast<const float*>(a.inputs[4]), y, StreamOf(a)),
                    what_ + ": batch normalization");
}

Status BatchNormKernel::RunTraining(const KernelArgs& a) {
  const cudaStream_t stream = StreamOf(a);
  std::byte* scratch = static_cast<std::byte*>(a.scratch);
  float* mean = reinterpret_cast<float*>(scratch);
  float* var = reinterpret_cast<float*>(scratch + stat_bytes_);
  const float* x = static_cast<const float*>(a.inputs[0]);
  const float* scale = static_cast<const float*>(a.inputs[1]);
  const float* bias = static_cast<const float*>(a.inputs[2]);
  float* y = static_cast<float*>(a.outputs[0]);
  if (use_cudnn_) {
    // cuDNN blends its statistics into these (factor 1): they must not hold NaNs.
    SALUS_CUDA_RETURN(cudaMemsetAsync(scratch, 0, 2 * stat_bytes_, stream),
                      what_ + ": clearing the batch statistics");
    SALUS_CUDNN_RETURN(
        cudnnBatchNormalizationForwardTraining(
            CudnnOf(a), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_.d, x, x_.d, y, params_.d, scale,
            bias, 1.0, mean, var, static_cast<double>(epsilon_), nullptr, nullptr),
        what_ + ": batch normalization");
  } else {
    SALUS_CUDA_RETURN(LaunchBnBatchStats(shape_, x, mean, var, stream),
                      what_ + ": batch statistics");
    SALUS_CUDA_RETURN(LaunchBnNormalize(shape_, epsilon_, x, scale, bias, mean, var, y, stream),
                      what_ + ": batch normalization");
  }
  float* out_mean = a.outputs.size() > 1 ? static_cast<float*>(a.outputs[1]) : nullptr;
  float* out_var = a.outputs.size() > 2 ? static_cast<float*>(a.outputs[2]) : nullptr;
  return CudaStatus(LaunchBnRunningUpdate(shape_.channels, momentum_, var_scale_,
                                          static_cast<const float*>(a.inputs[3]),
                                          static_cast<const float*>(a.inputs[4]), mean, var,
                                          out_mean, out_var, stream),
                    what_ + ": running statistics");
}

// ---------------------------------------------------------------------------------------------
// Softmax, LogSoftmax: cudnnSoftmaxForward over the channels of [outer, axis dim, inner, 1],
// SoftmaxFor's shape and axis (the 2-D coercion before opset 13).

class SoftmaxKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx);
  Status Run(const KernelArgs& args) override;

 private:
  explicit SoftmaxKernel(std::string what) : what_(std::move(what)) {}

  std::string what_;
  cudnnSoftmaxAlgorithm_t algo_ = CUDNN_SOFTMAX_ACCURATE;
  TensorDesc desc_;
};

KernelOr SoftmaxKernel::Create(const Node& n, const Graph& g, DeviceContext* ctx) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_RETURN_IF_ERROR(RequireCudnn(n, ctx));
  const std::string what = n.Describe();
  SALUS_ASSIGN_OR_RETURN(SoftmaxSpec spec, SoftmaxFor(n, g));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < spec.axis; ++i) outer *= spec.shape[i];
  for (size_t i = spec.axis + 1; i < spec.shape.size(); ++i) inner *= spec.shape[i];
  std::unique_ptr<SoftmaxKernel> k(new SoftmaxKernel(what));
  // Both subtract the maximum first, as the CPU's do.
  k->algo_ = n.op == "LogSoftmax" ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE;
  SALUS_RETURN_IF_ERROR(SetTensor(&k->desc_, {outer, spec.shape[spec.axis], inner, 1}, what));
  return std::unique_ptr<Kernel>(std::move(k));
}

Status SoftmaxKernel::Run(const KernelArgs& a) {
  SALUS_CUDNN_RETURN(cudnnSoftmaxForward(CudnnOf(a), algo_, CUDNN_SOFTMAX_MODE_CHANNEL, &kOne,
                                         desc_.d, a.inputs[0], &kZero, desc_.d, a.outputs[0]),
                     what_ + ": softmax");
  return OkStatus();
}

}  // namespace

void RegisterCudnnKernels(KernelRegistry* registry) {
  const DeviceType cuda = DeviceType::kCuda;
  registry->Register("Conv", cuda, KernelFactory(&ConvKernel::Create));
  registry->Register("ConvTranspose", cuda, KernelFactory(&ConvTransposeKernel::Create));
  for (const char* op : {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}) {
    registry->Register(op, cuda, KernelFactory(&PoolKernel::Create));
  }
  registry->Register("BatchNormalization", cuda, KernelFactory(&BatchNormKernel::Create));
  registry->Register("Softmax", cuda, KernelFactory(&SoftmaxKernel::Create));
  registry->Register("LogSoftmax", cuda, KernelFactory(&SoftmaxKernel::Create));
}

}  // namespace salus::exec::cuda
