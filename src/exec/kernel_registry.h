// The kernel registry: factories keyed by (op, device).
//
// The CPU device registers its oneDNN and loop kernels here; a CUDA device adds its own under
// the same op names. Backward and optimizer ops (emitted by autodiff) are ops like any other;
// their names start with "Salus" so they never collide with ONNX ops.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/graph.h"
#include "exec/kernel.h"
#include "salus/status.h"

namespace salus::exec {

// A node attribute the executable sets (to 1) on convolution nodes when compiled with
// CompileOptions::convolution_transforms; CUDA's factories then admit cuDNN's transform
// algorithms (Note [Convolution algorithms] in cuda/cudnn_kernels.cc).
inline constexpr char kConvolutionTransformsAttr[] = "salus_convolution_transforms";

// A factory gets the compiling thread's context of the device (Note [Device contexts]):
// CUDA factories query cuDNN and CUB through it to choose algorithms and size workspaces.
using KernelFactory = std::function<StatusOr<std::unique_ptr<Kernel>>(
    const Node& node, const Graph& graph, DeviceContext* ctx)>;
// The CPU's factories need no context.
using HostKernelFactory =
    std::function<StatusOr<std::unique_ptr<Kernel>>(const Node& node, const Graph& graph)>;

class KernelRegistry {
 public:
  // The process-wide registry with every built-in device's kernels registered.
  static const KernelRegistry& Global();

  void Register(const std::string& op, DeviceType device, KernelFactory factory);
  void Register(const std::string& op, DeviceType device, HostKernelFactory factory);
  bool Has(const std::string& op, DeviceType device) const;
  // The ops with a kernel on `device`, sorted.
  std::vector<std::string> Ops(DeviceType device) const;
  // Unimplemented naming the node and op when no kernel is registered, or whatever the
  // factory says about the node's attributes and types. `ctx` may be null on the CPU.
  StatusOr<std::unique_ptr<Kernel>> Create(const Node& node, const Graph& graph, DeviceType device,
                                           DeviceContext* ctx = nullptr) const;

 private:
  std::map<std::pair<std::string, DeviceType>, KernelFactory> factories_;
};

// Defined in cpu_kernels.cc, cpu_grad_kernels.cc and cpu_lstm_kernels.cc.
void RegisterCpuKernels(KernelRegistry* registry);
void RegisterCpuGradKernels(KernelRegistry* registry);
void RegisterCpuTensorGradKernels(KernelRegistry* registry);  // cpu_tensor_grad_kernels.cc
void RegisterCpuTensorKernels(KernelRegistry* registry);      // cpu_tensor_kernels.cc
void RegisterCpuNormKernels(KernelRegistry* registry);        // cpu_norm_kernels.cc
void RegisterCpuLstmKernels(KernelRegistry* registry);
void RegisterCpuRandomKernels(KernelRegistry* registry);  // cpu_random_kernels.cc
void RegisterCpuFusedKernels(KernelRegistry* registry);   // cpu_fused_kernels.cc
// Defined in cuda/cuda_kernels.cc; only in CUDA builds.
void RegisterCudaKernels(KernelRegistry* registry);

}  // namespace salus::exec
