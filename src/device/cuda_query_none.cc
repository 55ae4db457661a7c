// The CUDA query of a build without the CUDA device (SALUS_WITH_CUDA=OFF, or AUTO on a
// machine without nvcc and cuDNN).
#include "device/cuda_query.h"

namespace salus::device {

CudaAvailability QueryCuda() {
  CudaAvailability out;
  out.reason =
      "no GPU: this build has no CUDA device (configured with SALUS_WITH_CUDA=OFF or "
      "without the CUDA toolkit and cuDNN)";
  return out;
}

}  // namespace salus::device
