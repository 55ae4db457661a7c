// Helpers of the CUDA device's host code (compiled as C++20 by the host compiler; the .cu files
// never include this: they see only launch.h).
//
// Every CUDA, cuDNN and cuBLAS call that can fail goes through one of the *Status helpers, so a
// failure becomes a Status naming what was being done (a kernel passes its node's Describe()).
// Descriptors are owned by small RAII holders, created when a kernel is built and only read
// when it runs.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "exec/kernel.h"
#include "exec/tensor.h"
#include "salus/status.h"

namespace salus::exec::cuda {

// OK for cudaSuccess; otherwise Internal (Unavailable for errors that mean there is no usable
// GPU, ResourceExhausted for out of memory) "<what>: <error name> (<error string>)".
// Clears the non-sticky error state.
Status CudaStatus(cudaError_t err, const std::string& what);
Status CudnnStatus(cudnnStatus_t st, const std::string& what);
Status CublasStatus(cublasStatus_t st, const std::string& what);

// The error of the last kernel launch on this thread (launch configuration, missing image for
// this GPU), named after `what`. Does not wait for the kernel.
Status LaunchStatus(const std::string& what);

#define SALUS_CUDA_RETURN(expr, what) \
  SALUS_RETURN_IF_ERROR(::salus::exec::cuda::CudaStatus((expr), (what)))
#define SALUS_CUDNN_RETURN(expr, what) \
  SALUS_RETURN_IF_ERROR(::salus::exec::cuda::CudnnStatus((expr), (what)))
#define SALUS_CUBLAS_RETURN(expr, what) \
  SALUS_RETURN_IF_ERROR(::salus::exec::cuda::CublasStatus((expr), (what)))

// The stream, cuDNN and cuBLAS handles of a kernel's run.
inline cudaStream_t StreamOf(const KernelArgs& a) { return a.ctx->stream; }
inline cudnnHandle_t CudnnOf(const KernelArgs& a) { return a.ctx->cudnn; }
inline cublasHandle_t CublasOf(const KernelArgs& a) { return a.ctx->cublas; }

// The cuBLAS workspace at the start of the scratch of a kernel calling cuBLAS (Note [cuBLAS
// workspace] in blas_kernels.cc says why 4 MiB).
constexpr size_t kCublasWorkspaceBytes = size_t{4} << 20;

// Runs `calls` (cuBLAS calls on the handle it is given) with host scalars and the first
// kCublasWorkspaceBytes of the kernel's scratch as the handle's workspace, reset after them: the
// handle is the context's, shared by every kernel (Note [cuBLAS workspace]).
template <typename Calls>
Status WithCublasWorkspace(const KernelArgs& args, const std::string& what, Calls calls) {
  cublasHandle_t handle = CublasOf(args);
  // alpha and beta are host values; set every time, as the mode belongs to the shared handle.
  SALUS_CUBLAS_RETURN(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST),
                      what + ": cuBLAS pointer mode");
  SALUS_CUBLAS_RETURN(cublasSetWorkspace(handle, args.scratch, kCublasWorkspaceBytes),
                      what + ": cuBLAS workspace");
  const Status done = calls(handle);
  const Status reset =
      CublasStatus(cublasSetWorkspace(handle, nullptr, 0), what + ": cuBLAS workspace reset");
  SALUS_RETURN_IF_ERROR(done);
  return reset;
}

// RAII cuDNN descriptors.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc();
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  // A packed float tensor of `dims` (rank 1..8; cuDNN wants at least 4, so shorter shapes are
  // padded with trailing 1s).
  Status Set(const Shape& dims, const std::string& what);
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc();
  ~FilterDesc();
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  Status Set(const Shape& dims, const std::string& what);
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc();
  ~ConvDesc();
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};
struct PoolDesc {
  cudnnPoolingDescriptor_t d = nullptr;
  PoolDesc();
  ~PoolDesc();
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
};
struct ActivationDesc {
  cudnnActivationDescriptor_t d = nullptr;
  ActivationDesc();
  ~ActivationDesc();
  ActivationDesc(const ActivationDesc&) = delete;
  ActivationDesc& operator=(const ActivationDesc&) = delete;
};

// cuDNN's dims and strides for a packed tensor, padded with trailing 1s to at least 4 dims.
std::vector<int> CudnnDims(const Shape& dims);
std::vector<int> PackedStrides(const std::vector<int>& dims);

// A kernel whose Run is a function of the args; the CUDA analogue of LoopKernel.
class CudaFnKernel : public Kernel {
 public:
  using Fn = std::function<Status(const KernelArgs& args)>;
  explicit CudaFnKernel(Fn fn, size_t scratch = 0) : fn_(std::move(fn)), scratch_(scratch) {}
  size_t scratch_bytes() const override { return scratch_; }
  Status Run(const KernelArgs& args) override { return fn_(args); }

 private:
  Fn fn_;
  size_t scratch_;
};

// A CudaFnKernel of `fn`, as the factories return it.
inline std::unique_ptr<Kernel> FnKernel(CudaFnKernel::Fn fn, size_t scratch = 0) {
  return std::make_unique<CudaFnKernel>(std::move(fn), scratch);
}

// A kernel argument (KernelArgs' void pointers) as the float tensor it is.
inline const float* F(const void* p) { return static_cast<const float*>(p); }
inline float* F(void* p) { return static_cast<float*>(p); }

// Input or output i as a float tensor, or null where the run has none at i (an absent optional
// argument past the last one bound).
inline const float* FloatIn(const KernelArgs& a, size_t i) {
  return i < a.inputs.size() ? static_cast<const float*>(a.inputs[i]) : nullptr;
}
inline float* FloatOut(const KernelArgs& a, size_t i) {
  return i < a.outputs.size() ? static_cast<float*>(a.outputs[i]) : nullptr;
}

}  // namespace salus::exec::cuda
