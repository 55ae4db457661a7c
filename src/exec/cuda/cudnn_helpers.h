// cuDNN helpers shared by the CUDA device's forward (cudnn_kernels.cc) and backward
// (cudnn_grad_kernels.cc) kernels: tensor, filter and convolution descriptors, the window
// values as cuDNN's ints, the choice of a convolution algorithm (Note [Convolution algorithms]
// in cudnn_kernels.cc) and the pooling window of a node (Note [cuDNN windows]).
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/cuda/cuda_util.h"
#include "exec/cuda/pool_math.h"
#include "exec/graph.h"
#include "exec/window.h"

namespace salus::exec::cuda {

// The largest convolution workspace an algorithm may need to be chosen (Note [Convolution
// algorithms]).
inline constexpr size_t kMaxConvWorkspaceBytes = size_t{256} << 20;

// cuDNN's blend factors (y = alpha * op(x) + beta * y), host floats for float tensors.
inline constexpr float kOne = 1.f;
inline constexpr float kZero = 0.f;

Status RequireCudnn(const Node& n, const DeviceContext* ctx);

// Describes a packed float tensor. cuDNN's legacy descriptors hold int strides, so tensors of
// more elements than an int holds are refused before any stride is computed.
Status SetTensor(TensorDesc* desc, const Shape& dims, const std::string& what);

// Per-dim window values as cuDNN's ints, at least 2 of them (Note [cuDNN windows]). window.cc
// bounds every value by 2^30.
std::vector<int> WindowInts(const std::vector<int64_t>& values, int fill);

// Conv and ConvTranspose: X and W of the same rank, 1 to 3 spatial dims.
Status RequireConvRank(const Node& n, const Shape& xs, const Shape& ws);

StatusOr<int> GroupOf(const Node& n);

// A cross-correlation (ONNX's Conv) with the given per-dim pads, strides and dilations, in
// FMA math (Note [Convolution algorithms]).
Status SetConvolution(ConvDesc* conv, const std::vector<int64_t>& pads,
                      const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                      int group, const std::string& what);

// That the forward convolution of x by w has shape `y`, as the graph says; a mismatch would
// have cuDNN read or write outside the planned tensors.
Status CheckForwardShape(const ConvDesc& conv, const TensorDesc& x, const FilterDesc& w,
                         const Shape& y, const std::string& what);

// The window and mode of pooling op `op` (MaxPool, AveragePool, GlobalAveragePool,
// GlobalMaxPool) with n's attributes over x, as the CPU resolves them; refuses what the CPU
// refuses, and checks that the window's output is ys.
struct PoolWindow {
  Window win;
  PoolMode mode = PoolMode::kMax;
};
StatusOr<PoolWindow> PoolWindowFor(const Node& n, const std::string& op, const Shape& xs,
                                   const Shape& ys);

template <typename Algo>
struct AlgoChoice {
  Algo algo;
  size_t workspace_bytes = 0;
};

inline bool RoundsMore(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
inline bool RoundsMore(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}
inline bool RoundsMore(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}

// Whether FFT and non-fused Winograd algorithms may be chosen for node `n`: when it was compiled
// with CompileOptions::convolution_transforms (kConvolutionTransformsAttr), or for every node
// when the environment sets SALUS_CUDNN_TRANSFORMS=1 (read once per process; Note [Convolution
// algorithms]).
bool TransformAlgorithmsAllowed(const Node& n);

// Note [Convolution algorithms]. `perf` holds cuDNN's `count` ranked candidates; `workspace`
// asks cuDNN for an algorithm's workspace with the kernel's descriptors; `node` is the kernel's
// (whether it admits the transform algorithms).
template <typename Perf, typename Algo, typename WorkspaceFn>
StatusOr<AlgoChoice<Algo>> PickAlgorithm(const Perf* perf, int count, Algo fallback,
                                         const WorkspaceFn& workspace, const Node& node,
                                         const std::string& what) {
  const bool transforms = TransformAlgorithmsAllowed(node);
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC) continue;
    if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) {
      continue;
    }
    if (RoundsMore(p.algo) && !transforms) continue;
    size_t bytes = 0;
    if (workspace(p.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kMaxConvWorkspaceBytes) {
      continue;
    }
    return AlgoChoice<Algo>{p.algo, bytes};
  }
  size_t bytes = 0;
  SALUS_CUDNN_RETURN(workspace(fallback, &bytes),
                     what + ": no deterministic convolution algorithm");
  if (bytes > kMaxConvWorkspaceBytes) {
    return UnimplementedError(what +
                              ": every deterministic convolution algorithm needs more than " +
                              std::to_string(kMaxConvWorkspaceBytes >> 20) + " MiB of workspace");
  }
  return AlgoChoice<Algo>{fallback, bytes};
}

}  // namespace salus::exec::cuda
