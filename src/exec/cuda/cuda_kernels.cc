#include "exec/cuda/cuda_kernels.h"

namespace salus::exec {

void RegisterCudaKernels(KernelRegistry* registry) {
  cuda::RegisterBasicKernels(registry);
  cuda::RegisterCudnnKernels(registry);
  cuda::RegisterBlasKernels(registry);
  cuda::RegisterTensorKernels(registry);
  cuda::RegisterNormLstmKernels(registry);
  cuda::RegisterGradKernels(registry);
  cuda::RegisterTrainKernels(registry);
}

}  // namespace salus::exec
