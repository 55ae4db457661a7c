// The CUDA device's kernels, by family. Each Register* adds its ops to the registry
// under DeviceType::kCuda; RegisterCudaKernels (cuda_kernels.cc) calls them all.
//
//   basic_kernels.cc   copies, unary elementwise (cuDNN activations where cuDNN has them),
//                      broadcasting binary ops, Transpose, Concat, DepthToSpace, Pad, the loss
//   cudnn_kernels.cc   Conv, ConvTranspose, pooling, BatchNormalization, Softmax, LogSoftmax
//   blas_kernels.cc    Gemm and MatMul (cuBLAS), reductions (CUB)
//   tensor_kernels.cc  the tensor ops of exported models: Gather, Where, Cast, Expand, Slice,
//                      Split, comparisons and logic, Min, Max, Clip, Mod, Erf, Gelu, Range, ...
//   norm_lstm_kernels.cc  LayerNormalization (hand-written) and LSTM (cuBLAS and a cell kernel)
//   grad_kernels.cc    the backward and optimizer ops autodiff emits (cuDNN and hand-written)
//   train_kernels.cc   the tensor ops' gradients, BatchNorm and Dropout in training, LayerNorm's
//                      gradient (hand-written)
#pragma once

#include "exec/kernel_registry.h"

namespace salus::exec::cuda {

void RegisterBasicKernels(KernelRegistry* registry);
void RegisterCudnnKernels(KernelRegistry* registry);
void RegisterBlasKernels(KernelRegistry* registry);
void RegisterTensorKernels(KernelRegistry* registry);
void RegisterNormLstmKernels(KernelRegistry* registry);
void RegisterGradKernels(KernelRegistry* registry);
void RegisterTrainKernels(KernelRegistry* registry);

}  // namespace salus::exec::cuda
