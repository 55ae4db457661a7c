// The CUDA device's backward and optimizer kernels: every op autodiff emits for the reference
// models, with the CPU's semantics (cpu_grad_kernels.cc).
//
//   SalusConvGradData      cudnnConvolutionBackwardData
//   SalusConvGradWeights   cudnnConvolutionBackwardFilter; the bias gradient as SalusSumTo
//   SalusSoftmaxGrad       cudnnSoftmaxBackward (Softmax and LogSoftmax)
//   SalusPoolGrad          hand-written, two passes (pool_math.h): max, average, global; with
//                          SalusMaxPool's Taps (its third input) only the second
//   SalusMaxPool           hand-written (pool_math.h): MaxPool's output and each one's tap
//   SalusEltwiseGrad, SalusSumTo, SalusExpand, SalusDepthToSpaceGrad,
//   SalusSoftmaxCrossEntropyGrad, SalusSgdUpdate, SalusAdamUpdate
//                          hand-written (grad.cu; the per-element math is grad_math.h's)
//
// Note [Deterministic gradients]: two runs of an iteration give bit-identical gradients. The
// convolution algorithms are chosen as the forward ones are (Note [Convolution algorithms] in
// cudnn_kernels.cc), which keeps only those cuDNN reports deterministic; the fallbacks
// (BWD_DATA_ALGO_1, BWD_FILTER_ALGO_1) are deterministic too. Every hand-written sum is gathered
// by the thread that owns its result, or by one block's fixed tree (grid.cuh's BlockSum); none
// uses atomics. The bias gradient uses SalusSumTo's kernel for that reason rather than
// cudnnConvolutionBackwardBias, whose summation order cuDNN does not promise.
//
// Unequal pads (Note [cuDNN windows]): the data gradient is computed for the padded input in
// scratch and cropped; the weight gradient reads the input padded into scratch, as Conv does.
// Adam's step count is a device tensor: a one-thread kernel advances it and computes the bias
// corrections, so an iteration never reads device state on the host.
#include <cudnn.h>

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
#include "exec/cuda/cudnn_helpers.h"
#include "exec/cuda/grad_launch.h"
#include "exec/cuda/pool_bn_launch.h"
#include "exec/dnnl_kernel.h"
#include "exec/grad_math.h"
#include "exec/window.h"

namespace salus::exec::cuda {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// ---------------------------------------------------------------------------------------------
// Convolution gradients. The window is the forward Conv's (its attributes travel on the node);
// with unequal pads the convolution is described for the padded input with no padding.

struct ConvGradSetup {
  Window win;
  Shape conv_in;        // the input cuDNN sees: x, or x padded
  bool padded = false;  // pads differ: the padded input lives in scratch
  PadGeometry pad;      // x -> padded x
  PadGeometry crop;     // padded dx -> dx
  size_t padded_bytes = 0;
};

StatusOr<ConvGradSetup> SetUpConvGrad(const Node& n, const Shape& xs, const Shape& ws,
                                      const Shape& ys, TensorDesc* x, TensorDesc* y, FilterDesc* w,
                                      ConvDesc* conv) {
  const std::string what = n.Describe();
  SALUS_RETURN_IF_ERROR(RequireConvRank(n, xs, ws));
  SALUS_ASSIGN_OR_RETURN(const int group, GroupOf(n));
  const std::vector<int64_t> spatial(xs.begin() + 2, xs.end());
  const std::vector<int64_t> kernel(ws.begin() + 2, ws.end());
  ConvGradSetup s;
  SALUS_ASSIGN_OR_RETURN(s.win, ComputeWindow(n, spatial, kernel, false));
  s.conv_in = xs;
  s.padded = s.win.pad_begin != s.win.pad_end;
  std::vector<int64_t> pads = s.win.pad_begin;
  if (s.padded) {
    std::vector<int64_t> padded(spatial.size()), crop(spatial.size());
    for (size_t i = 0; i < spatial.size(); ++i) {
      padded[i] = spatial[i] + s.win.pad_begin[i] + s.win.pad_end[i];
      s.conv_in[2 + i] = padded[i];
      crop[i] = -s.win.pad_begin[i];
    }
    pads.assign(spatial.size(), 0);
    s.pad = MakePadGeometry(xs[0] * xs[1], spatial, padded, s.win.pad_begin);
    s.crop = MakePadGeometry(xs[0] * xs[1], padded, spatial, crop);
    s.padded_bytes = AlignUp(NumElements(s.conv_in) * sizeof(float));
  }
  SALUS_RETURN_IF_ERROR(SetTensor(x, s.conv_in, what));
  SALUS_RETURN_IF_ERROR(SetTensor(y, ys, what));
  SALUS_RETURN_IF_ERROR(w->Set(ws, what));
  SALUS_RETURN_IF_ERROR(SetConvolution(conv, pads, s.win.strides, s.win.dilations, group, what));
  SALUS_RETURN_IF_ERROR(CheckForwardShape(*conv, *x, *w, ys, what));
  return s;
}

// Inputs (dY, W); output dX. Attribute x_shape: the forward input's shape.
class ConvGradDataKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx) {
    SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
    SALUS_RETURN_IF_ERROR(RequireCudnn(n, ctx));
    const Shape xs = n.GetInts("x_shape");
    const Shape& ws = g.value(n.inputs[1]).shape;
    const Shape& ys = g.value(n.inputs[0]).shape;
    if (xs != g.value(n.outputs[0]).shape) {
      return InvalidArgumentError(n.Describe() + ": x_shape differs from the output's shape");
    }
    std::unique_ptr<ConvGradDataKernel> k(new ConvGradDataKernel(n.Describe()));
    SALUS_ASSIGN_OR_RETURN(k->setup_,
                           SetUpConvGrad(n, xs, ws, ys, &k->x_, &k->y_, &k->w_, &k->conv_));
    cudnnHandle_t h = ctx->cudnn;
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int returned = 0;
    SALUS_CUDNN_RETURN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                           h, k->w_.d, k->y_.d, k->conv_.d, k->x_.d,
                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf),
                       k->what_ + ": data gradient algorithms");
    const ConvGradDataKernel& kr = *k;
    auto workspace = [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, kr.w_.d, kr.y_.d, kr.conv_.d, kr.x_.d,
                                                          algo, bytes);
    };
    SALUS_ASSIGN_OR_RETURN(
        auto choice,
        PickAlgorithm(perf, returned, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, workspace, n, k->what_));
    k->algo_ = choice.algo;
    k->workspace_bytes_ = choice.workspace_bytes;
    return std::unique_ptr<Kernel>(std::move(k));
  }
  size_t scratch_bytes() const override { return setup_.padded_bytes + workspace_bytes_; }
  Status Run(const KernelArgs& a) override {
    std::byte* scratch = static_cast<std::byte*>(a.scratch);
    void* dx = setup_.padded ? static_cast<void*>(scratch) : a.outputs[0];
    void* workspace = workspace_bytes_ > 0 ? scratch + setup_.padded_bytes : nullptr;
    SALUS_CUDNN_RETURN(
        cudnnConvolutionBackwardData(CudnnOf(a), &kOne, w_.d, a.inputs[1], y_.d, a.inputs[0],
                                     conv_.d, algo_, workspace, workspace_bytes_, &kZero, x_.d, dx),
        what_ + ": data gradient");
    if (setup_.padded) {
      SALUS_CUDA_RETURN(LaunchPadCopy(setup_.crop, F(dx), F(a.outputs[0]), StreamOf(a)),
                        what_ + ": cropping the padded gradient");
    }
    return OkStatus();
  }

 private:
  explicit ConvGradDataKernel(std::string what) : what_(std::move(what)) {}
  std::string what_;
  ConvGradSetup setup_;
  TensorDesc x_, y_;
  FilterDesc w_;
  ConvDesc conv_;
  cudnnConvolutionBwdDataAlgo_t algo_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  size_t workspace_bytes_ = 0;
};

// Inputs (X, dY); outputs dW and optionally dB. Attribute w_shape: the weights' shape.
class ConvGradWeightsKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx) {
    SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
    SALUS_RETURN_IF_ERROR(RequireCudnn(n, ctx));
    const Shape& xs = g.value(n.inputs[0]).shape;
    const Shape ws = n.GetInts("w_shape");
    const Shape& ys = g.value(n.inputs[1]).shape;
    if (ws != g.value(n.outputs[0]).shape) {
      return InvalidArgumentError(n.Describe() + ": w_shape differs from the output's shape");
    }
    std::unique_ptr<ConvGradWeightsKernel> k(new ConvGradWeightsKernel(n.Describe()));
    SALUS_ASSIGN_OR_RETURN(k->setup_,
                           SetUpConvGrad(n, xs, ws, ys, &k->x_, &k->y_, &k->w_, &k->conv_));
    cudnnHandle_t h = ctx->cudnn;
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int returned = 0;
    SALUS_CUDNN_RETURN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                           h, k->x_.d, k->y_.d, k->conv_.d, k->w_.d,
                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf),
                       k->what_ + ": weight gradient algorithms");
    const ConvGradWeightsKernel& kr = *k;
    auto workspace = [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, kr.x_.d, kr.y_.d, kr.conv_.d,
                                                            kr.w_.d, algo, bytes);
    };
    SALUS_ASSIGN_OR_RETURN(
        auto choice,
        PickAlgorithm(perf, returned, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, workspace, n, k->what_));
    k->algo_ = choice.algo;
    k->workspace_bytes_ = choice.workspace_bytes;
    k->has_bias_ = n.output(1) != kNoValue;
    if (k->has_bias_) {
      Shape per_channel(ys.size(), 1);
      per_channel[1] = ys[1];
      if (!MakeSumToMap(ys, per_channel, &k->bias_map_)) {
        return UnimplementedError(k->what_ + ": the bias gradient's map");
      }
      k->partials_bytes_ = SumToScratchBytes(k->bias_map_);
    }
    return std::unique_ptr<Kernel>(std::move(k));
  }
  size_t scratch_bytes() const override {
    return partials_bytes_ > 0 ? PartialsAt() + partials_bytes_
                               : setup_.padded_bytes + workspace_bytes_;
  }
  Status Run(const KernelArgs& a) override {
    std::byte* scratch = static_cast<std::byte*>(a.scratch);
    const void* x = a.inputs[0];
    if (setup_.padded) {
      SALUS_CUDA_RETURN(
          LaunchPadCopy(setup_.pad, F(x), reinterpret_cast<float*>(scratch), StreamOf(a)),
          what_ + ": padding the input");
      x = scratch;
    }
    void* workspace = workspace_bytes_ > 0 ? scratch + setup_.padded_bytes : nullptr;
    SALUS_CUDNN_RETURN(cudnnConvolutionBackwardFilter(CudnnOf(a), &kOne, x_.d, x, y_.d, a.inputs[1],
                                                      conv_.d, algo_, workspace, workspace_bytes_,
                                                      &kZero, w_.d, a.outputs[0]),
                       what_ + ": weight gradient");
    if (has_bias_) {
      SALUS_CUDA_RETURN(
          LaunchSumTo(bias_map_, 1.f, F(a.inputs[1]), F(a.outputs[1]),
                      partials_bytes_ > 0 ? scratch + PartialsAt() : nullptr, StreamOf(a)),
          what_ + ": bias gradient");
    }
    return OkStatus();
  }

 private:
  explicit ConvGradWeightsKernel(std::string what) : what_(std::move(what)) {}
  // Scratch: the padded input, cuDNN's workspace, then the bias gradient's partial sums.
  size_t PartialsAt() const { return AlignUp(setup_.padded_bytes + workspace_bytes_); }
  std::string what_;
  ConvGradSetup setup_;
  TensorDesc x_, y_;
  FilterDesc w_;
  ConvDesc conv_;
  cudnnConvolutionBwdFilterAlgo_t algo_ = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  size_t workspace_bytes_ = 0;
  bool has_bias_ = false;
  SumToMap bias_map_;
  size_t partials_bytes_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Softmax and LogSoftmax: inputs (Y, dY), Y the forward output.

class SoftmaxGradKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext* ctx) {
    SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
    SALUS_RETURN_IF_ERROR(RequireCudnn(n, ctx));
    SALUS_ASSIGN_OR_RETURN(SoftmaxSpec spec, SoftmaxFor(n, g));
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < spec.axis; ++i) outer *= spec.shape[i];
    for (size_t i = spec.axis + 1; i < spec.shape.size(); ++i) inner *= spec.shape[i];
    std::unique_ptr<SoftmaxGradKernel> k(new SoftmaxGradKernel(n.Describe()));
    k->algo_ = n.GetString("forward_op", "Softmax") == "LogSoftmax" ? CUDNN_SOFTMAX_LOG
                                                                    : CUDNN_SOFTMAX_ACCURATE;
    SALUS_RETURN_IF_ERROR(SetTensor(&k->desc_, {outer, spec.shape[spec.axis], inner, 1}, k->what_));
    return std::unique_ptr<Kernel>(std::move(k));
  }
  Status Run(const KernelArgs& a) override {
    SALUS_CUDNN_RETURN(
        cudnnSoftmaxBackward(CudnnOf(a), algo_, CUDNN_SOFTMAX_MODE_CHANNEL, &kOne, desc_.d,
                             a.inputs[0], desc_.d, a.inputs[1], &kZero, desc_.d, a.outputs[0]),
        what_ + ": softmax gradient");
    return OkStatus();
  }

 private:
  explicit SoftmaxGradKernel(std::string what) : what_(std::move(what)) {}
  std::string what_;
  cudnnSoftmaxAlgorithm_t algo_ = CUDNN_SOFTMAX_ACCURATE;
  TensorDesc desc_;
};

// ---------------------------------------------------------------------------------------------
// Pooling: inputs (X, dY, optional Taps); output dX. The window is the forward op's (attribute
// forward_op). Taps are SalusMaxPool's: each output's PoolTap (Note [Pooling taps] in
// cpu_kernel_helpers.h; on this device they are the in-plane index of the element chosen).

StatusOr<PoolGeometry> PoolGeometryFor(const Node& n, const std::string& op, const Shape& xs,
                                       const Shape& ys) {
  SALUS_ASSIGN_OR_RETURN(PoolWindow pw, PoolWindowFor(n, op, xs, ys));
  const Window& win = pw.win;
  return MakePoolGeometry(pw.mode, xs[0] * xs[1], win.in, win.out, win.kernel, win.strides,
                          win.dilations, win.pad_begin);
}

KernelOr PoolGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& xs = g.value(n.inputs[0]).shape;
  const Shape& ys = g.value(n.inputs[1]).shape;
  SALUS_ASSIGN_OR_RETURN(PoolGeometry geo,
                         PoolGeometryFor(n, n.GetString("forward_op", ""), xs, ys));
  const std::string what = n.Describe();
  SALUS_RETURN_IF_ERROR(CheckPoolTaps(n, g));
  if (n.input(2) != kNoValue) {
    return FnKernel([geo, what](const KernelArgs& a) -> Status {
      return CudaStatus(
          LaunchPoolGradFromTaps(geo, F(a.inputs[1]), static_cast<const int64_t*>(a.inputs[2]),
                                 F(a.outputs[0]), StreamOf(a)),
          what + ": pooling gradient");
    });
  }
  const size_t tap_bytes = AlignUp(PoolOutputCount(geo) * sizeof(int64_t));
  return FnKernel(
      [geo, what](const KernelArgs& a) -> Status {
        return CudaStatus(
            LaunchPoolGrad(geo, F(a.inputs[0]), F(a.inputs[1]), static_cast<int64_t*>(a.scratch),
                           F(a.outputs[0]), StreamOf(a)),
            what + ": pooling gradient");
      },
      tap_bytes);
}

// Inputs (X); outputs (Y, Taps): MaxPool's Y, and the taps SalusPoolGrad reads.
KernelOr MaxPoolTaps(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_RETURN_IF_ERROR(CheckPoolTaps(n, g));
  const Shape& ys = g.value(n.outputs[0]).shape;
  SALUS_ASSIGN_OR_RETURN(PoolGeometry geo,
                         PoolGeometryFor(n, "MaxPool", g.value(n.inputs[0]).shape, ys));
  const std::string what = n.Describe();
  return FnKernel([geo, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchMaxPoolTaps(geo, F(a.inputs[0]), F(a.outputs[0]),
                                        static_cast<int64_t*>(a.outputs[1]), StreamOf(a)),
                      what + ": max pooling");
  });
}

// ---------------------------------------------------------------------------------------------
// Elementwise, layout and loss gradients.

// Inputs (X, dY); output dX. Attribute forward_op, and the forward op's alpha.
KernelOr EltwiseGradK(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const std::string forward = n.GetString("forward_op", "");
  EltwiseGradOp op;
  float alpha = 0.f;
  if (!EltwiseGradOpFor(forward, n.GetFloat("alpha", 0.01f), n.GetFloat("alpha", 1.f), &op,
                        &alpha)) {
    return UnimplementedError(n.Describe() + ": no eltwise gradient of op " + forward);
  }
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const std::string what = n.Describe();
  return FnKernel([op, alpha, count, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchEltwiseGrad(op, alpha, F(a.inputs[0]), F(a.inputs[1]), F(a.outputs[0]),
                                        count, StreamOf(a)),
                      what);
  });
}

// dY -> the sum of dY over the dims it was broadcast along, times attribute `scale`.
KernelOr SumTo(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& in = g.value(n.inputs[0]).shape;
  const Shape& out = g.value(n.outputs[0]).shape;
  SumToMap map;
  if (out.size() > in.size() || !MakeSumToMap(in, out, &map)) {
    return UnimplementedError(n.Describe() + ": summing " + ShapeString(in) + " to " +
                              ShapeString(out));
  }
  const float scale = n.GetFloat("scale", 1.f);
  const std::string what = n.Describe();
  return FnKernel(
      [map, scale, what](const KernelArgs& a) -> Status {
        return CudaStatus(
            LaunchSumTo(map, scale, F(a.inputs[0]), F(a.outputs[0]), a.scratch, StreamOf(a)), what);
      },
      SumToScratchBytes(map));
}

// dY (with the shape of attribute keep_shape) broadcast to the output shape, times `scale`.
KernelOr ExpandGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape keep = n.GetInts("keep_shape");
  const Shape& out = g.value(n.outputs[0]).shape;
  if (NumElements(keep) != NumElements(g.value(n.inputs[0]).shape) || keep.size() > out.size()) {
    return InvalidArgumentError(n.Describe() + ": keep_shape " + ShapeString(keep) +
                                " does not fit the input and output");
  }
  IndexMap map;
  if (!MakeIndexMap(out, {BroadcastStrides(keep, out)}, &map)) {
    return UnimplementedError(n.Describe() + ": broadcasting " + ShapeString(keep) + " to " +
                              ShapeString(out));
  }
  const float scale = n.GetFloat("scale", 1.f);
  const std::string what = n.Describe();
  return FnKernel([map, scale, what](const KernelArgs& a) -> Status {
    return CudaStatus(
        LaunchBroadcastScale(map, scale, F(a.inputs[0]), F(a.outputs[0]), StreamOf(a)), what);
  });
}

KernelOr DepthToSpaceGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& x = g.value(n.outputs[0]).shape;
  if (x.size() != 4) return InvalidArgumentError(n.Describe() + ": the gradient is not 4-D");
  const DepthToSpaceGeometry geo{
      x[0], x[1], x[2], x[3], n.GetInt("blocksize", 1), n.GetString("mode", "DCR") == "DCR"};
  const std::string what = n.Describe();
  return FnKernel([geo, what](const KernelArgs& a) -> Status {
    return CudaStatus(LaunchDepthToSpaceGrad(geo, F(a.inputs[0]), F(a.outputs[0]), StreamOf(a)),
                      what);
  });
}

// Inputs (scores, labels, weights or none, dLoss); output dScores. Scratch: the
// log-probabilities, then the weight sum (a double).
KernelOr SceGrad(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {0, 2, 3}));
  SALUS_ASSIGN_OR_RETURN(SceSpec s, SceFor(n, g));
  const size_t logp_bytes = AlignUp(s.n * s.c * s.d * sizeof(float));
  const std::string what = n.Describe();
  return FnKernel(
      [s, logp_bytes, what](const KernelArgs& a) -> Status {
        std::byte* scratch = static_cast<std::byte*>(a.scratch);
        const float* weights = a.inputs.size() > 2 ? F(a.inputs[2]) : nullptr;
        return CudaStatus(LaunchSceGrad(s, F(a.inputs[0]), static_cast<const int64_t*>(a.inputs[1]),
                                        weights, F(a.inputs[3]), reinterpret_cast<float*>(scratch),
                                        reinterpret_cast<double*>(scratch + logp_bytes),
                                        F(a.outputs[0]), StreamOf(a)),
                          what);
      },
      logp_bytes + AlignUp(sizeof(double)));
}

// ---------------------------------------------------------------------------------------------
// Optimizers, in place.

// Inputs (param, grad, velocity if momentum, then with "lr_input" the learning rate as a
// 1-element tensor, read each run, instead of the "lr" attribute).
KernelOr SgdUpdate(const Node& n, const Graph& g, DeviceContext*) {
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  SgdHyper h;
  h.momentum = n.GetFloat("momentum", 0.f);
  h.weight_decay = n.GetFloat("weight_decay", 0.f);
  h.nesterov = n.GetInt("nesterov", 0) != 0;
  const float lr = n.GetFloat("lr", 0.01f);
  const bool lr_input = n.GetInt("lr_input", 0) != 0;
  const std::string what = n.Describe();
  return FnKernel([h, lr, lr_input, count, what](const KernelArgs& a) -> Status {
    float* v = h.momentum != 0.f ? F(a.inputs[2]) : nullptr;
    const float* rate = lr_input ? F(a.inputs.back()) : nullptr;
    return CudaStatus(
        LaunchSgdUpdate(h, lr, rate, count, F(a.inputs[0]), F(a.inputs[1]), v, StreamOf(a)), what);
  });
}

// Inputs (param, grad, m, v, step, and with "lr_input" the learning rate). Scratch: the step's
// AdamScalars.
KernelOr AdamUpdate(const Node& n, const Graph& g, DeviceContext*) {
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  AdamHyper h;
  h.beta1 = n.GetFloat("beta1", 0.9f);
  h.beta2 = n.GetFloat("beta2", 0.999f);
  h.epsilon = n.GetFloat("epsilon", 1e-8f);
  h.decoupled = n.GetInt("decoupled_weight_decay", 0) != 0;
  const float wd = n.GetFloat("weight_decay", 0.f);
  h.weight_decay = h.decoupled ? 0.f : wd;
  h.decoupled_weight_decay = h.decoupled ? wd : 0.f;
  const float lr = n.GetFloat("lr", 1e-3f);
  const bool lr_input = n.GetInt("lr_input", 0) != 0;
  const std::string what = n.Describe();
  return FnKernel(
      [h, lr, lr_input, count, what](const KernelArgs& a) -> Status {
        const float* rate = lr_input ? F(a.inputs[5]) : nullptr;
        return CudaStatus(LaunchAdamUpdate(h, lr, rate, count, F(a.inputs[0]), F(a.inputs[1]),
                                           F(a.inputs[2]), F(a.inputs[3]), F(a.inputs[4]),
                                           static_cast<AdamScalars*>(a.scratch), StreamOf(a)),
                          what);
      },
      AlignUp(sizeof(AdamScalars)));
}

}  // namespace

void RegisterGradKernels(KernelRegistry* registry) {
  const DeviceType cuda = DeviceType::kCuda;
  registry->Register("SalusConvGradData", cuda, KernelFactory(&ConvGradDataKernel::Create));
  registry->Register("SalusConvGradWeights", cuda, KernelFactory(&ConvGradWeightsKernel::Create));
  registry->Register("SalusSoftmaxGrad", cuda, KernelFactory(&SoftmaxGradKernel::Create));
  registry->Register("SalusPoolGrad", cuda, KernelFactory(&PoolGrad));
  registry->Register("SalusMaxPool", cuda, KernelFactory(&MaxPoolTaps));
  registry->Register("SalusEltwiseGrad", cuda, KernelFactory(&EltwiseGradK));
  registry->Register("SalusSumTo", cuda, KernelFactory(&SumTo));
  registry->Register("SalusExpand", cuda, KernelFactory(&ExpandGrad));
  registry->Register("SalusDepthToSpaceGrad", cuda, KernelFactory(&DepthToSpaceGrad));
  registry->Register("SalusSoftmaxCrossEntropyGrad", cuda, KernelFactory(&SceGrad));
  registry->Register("SalusSgdUpdate", cuda, KernelFactory(&SgdUpdate));
  registry->Register("SalusAdamUpdate", cuda, KernelFactory(&AdamUpdate));
}

}  // namespace salus::exec::cuda
