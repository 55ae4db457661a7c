#include "exec/kernel_registry.h"

#include <exception>

namespace salus::exec {
namespace {

class NoopKernel : public Kernel {
 public:
  Status Run(const KernelArgs&) override { return OkStatus(); }
};

}  // namespace

const KernelRegistry& KernelRegistry::Global() {
  static const KernelRegistry* registry = [] {
    auto* r = new KernelRegistry();
    RegisterCpuKernels(r);
    RegisterCpuTensorKernels(r);
    RegisterCpuGradKernels(r);
    RegisterCpuTensorGradKernels(r);
    RegisterCpuNormKernels(r);
    RegisterCpuLstmKernels(r);
    RegisterCpuRandomKernels(r);
    RegisterCpuFusedKernels(r);
#ifdef SALUS_HAVE_CUDA
    RegisterCudaKernels(r);
#endif
    return r;
  }();
  return *registry;
}

void KernelRegistry::Register(const std::string& op, DeviceType device, KernelFactory factory) {
  factories_[{op, device}] = std::move(factory);
}

void KernelRegistry::Register(const std::string& op, DeviceType device, HostKernelFactory factory) {
  factories_[{op, device}] = [f = std::move(factory)](const Node& n, const Graph& g,
                                                      DeviceContext*) { return f(n, g); };
}

std::vector<std::string> KernelRegistry::Ops(DeviceType device) const {
  std::vector<std::string> out;
  for (const auto& [key, factory] : factories_) {
    if (key.second == device) out.push_back(key.first);
  }
  return out;
}

bool KernelRegistry::Has(const std::string& op, DeviceType device) const {
  return factories_.count({op, device}) > 0;
}

StatusOr<std::unique_ptr<Kernel>> KernelRegistry::Create(const Node& node, const Graph& graph,
                                                         DeviceType device,
                                                         DeviceContext* ctx) const {
  auto it = factories_.find({node.op, device});
  if (it == factories_.end()) {
    return UnimplementedError("node '" + node.name + "': op " + node.op + " has no " +
                              DeviceTypeName(device) + " kernel");
  }
  bool empty = !node.outputs.empty();
  for (ValueId o : node.outputs) {
    if (o != kNoValue && NumElements(graph.value(o).shape) != 0) empty = false;
  }
  if (empty) return std::unique_ptr<Kernel>(new NoopKernel());
  try {
    return it->second(node, graph, ctx);
  } catch (const std::exception& e) {
    // oneDNN reports unsupported configurations by throwing when a primitive is created.
    return UnimplementedError("node '" + node.name + "': op " + node.op + ": " + e.what());
  }
}

}  // namespace salus::exec
