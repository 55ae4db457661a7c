#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "device/cuda_query.h"

namespace salus::device {

CudaAvailability QueryCuda() {
  CudaAvailability out;
  out.compiled = true;
  cudaRuntimeGetVersion(&out.runtime_version);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    out.reason =
        std::string("no GPU: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky error
    return out;
  }
  if (count == 0) {
    out.reason = "no GPU: the driver reports zero CUDA devices";
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDeviceInfo info;
    info.ordinal = i;
    info.name = prop.name;
    info.total_bytes = prop.totalGlobalMem;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      info.free_bytes = free_b;
    }
    out.devices.push_back(info);
  }
  return out;
}

// cuDNN's version, to show the library links; not exported.
[[maybe_unused]] static size_t CudnnVersion() { return cudnnGetVersion(); }

}  // namespace salus::device
