// The CUDA device's forward kernels, by family. Each Register* adds its ops to the registry
// under DeviceType::kCuda; RegisterCudaKernels (cuda_kernels.cc) calls them all.
//
//   basic_kernels.cc   copies, unary elementwise (cuDNN activations where cuDNN has them),
//                      broadcasting binary ops, Transpose, Concat, DepthToSpace, Pad, the loss
//   cudnn_kernels.cc   Conv, ConvTranspose, pooling, BatchNormalization, Softmax, LogSoftmax
//   blas_kernels.cc    Gemm and MatMul (cuBLAS), reductions (CUB)
#pragma once

#include "exec/kernel_registry.h"

namespace salus::exec::cuda {

void RegisterBasicKernels(KernelRegistry* registry);
void RegisterCudnnKernels(KernelRegistry* registry);
void RegisterBlasKernels(KernelRegistry* registry);

}  // namespace salus::exec::cuda
