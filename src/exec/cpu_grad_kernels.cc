#include "exec/kernel_registry.h"

namespace salus::exec {

void RegisterCpuGradKernels(KernelRegistry* registry) {}

}  // namespace salus::exec
