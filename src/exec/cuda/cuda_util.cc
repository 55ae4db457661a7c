#include "exec/cuda/cuda_util.h"

#include <fmt/format.h>

namespace salus::exec::cuda {

Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return OkStatus();
  cudaGetLastError();  // clears the error unless it is sticky
  const std::string msg =
      fmt::format("{}: {} ({})", what, cudaGetErrorName(err), cudaGetErrorString(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return UnavailableError(msg);
    default:
      return InternalError(msg);
  }
}

Status CudnnStatus(cudnnStatus_t st, const std::string& what) {
  if (st == CUDNN_STATUS_SUCCESS) return OkStatus();
  const std::string msg = fmt::format("{}: cuDNN {}", what, cudnnGetErrorString(st));
  if (st == CUDNN_STATUS_NOT_SUPPORTED) return UnimplementedError(msg);
  if (st == CUDNN_STATUS_ALLOC_FAILED) return ResourceExhaustedError(msg);
  if (st == CUDNN_STATUS_BAD_PARAM) return InvalidArgumentError(msg);
  return InternalError(msg);
}

Status CublasStatus(cublasStatus_t st, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS) return OkStatus();
  const std::string msg =
      fmt::format("{}: cuBLAS {} ({})", what, cublasGetStatusName(st), cublasGetStatusString(st));
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return UnimplementedError(msg);
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return ResourceExhaustedError(msg);
  if (st == CUBLAS_STATUS_INVALID_VALUE) return InvalidArgumentError(msg);
  return InternalError(msg);
}

Status LaunchStatus(const std::string& what) { return CudaStatus(cudaGetLastError(), what); }

std::vector<int> CudnnDims(const Shape& dims) {
  std::vector<int> out(dims.begin(), dims.end());
  while (out.size() < 4) out.push_back(1);
  return out;
}

std::vector<int> PackedStrides(const std::vector<int>& dims) {
  std::vector<int> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

TensorDesc::TensorDesc() { cudnnCreateTensorDescriptor(&d); }
TensorDesc::~TensorDesc() {
  if (d) cudnnDestroyTensorDescriptor(d);
}
Status TensorDesc::Set(const Shape& dims, const std::string& what) {
  if (dims.size() > CUDNN_DIM_MAX) {
    return UnimplementedError(
        fmt::format("{}: rank {} is more than cuDNN's {}", what, dims.size(), CUDNN_DIM_MAX));
  }
  for (int64_t x : dims) {
    if (x > INT32_MAX) return UnimplementedError(what + ": a dimension does not fit cuDNN's int");
  }
  const std::vector<int> v = CudnnDims(dims);
  const std::vector<int> s = PackedStrides(v);
  return CudnnStatus(cudnnSetTensorNdDescriptor(d, CUDNN_DATA_FLOAT, static_cast<int>(v.size()),
                                                v.data(), s.data()),
                     what);
}

FilterDesc::FilterDesc() { cudnnCreateFilterDescriptor(&d); }
FilterDesc::~FilterDesc() {
  if (d) cudnnDestroyFilterDescriptor(d);
}
Status FilterDesc::Set(const Shape& dims, const std::string& what) {
  const std::vector<int> v = CudnnDims(dims);
  return CudnnStatus(cudnnSetFilterNdDescriptor(d, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                static_cast<int>(v.size()), v.data()),
                     what);
}

ConvDesc::ConvDesc() { cudnnCreateConvolutionDescriptor(&d); }
ConvDesc::~ConvDesc() {
  if (d) cudnnDestroyConvolutionDescriptor(d);
}
PoolDesc::PoolDesc() { cudnnCreatePoolingDescriptor(&d); }
PoolDesc::~PoolDesc() {
  if (d) cudnnDestroyPoolingDescriptor(d);
}
ActivationDesc::ActivationDesc() { cudnnCreateActivationDescriptor(&d); }
ActivationDesc::~ActivationDesc() {
  if (d) cudnnDestroyActivationDescriptor(d);
}

}  // namespace salus::exec::cuda
