#include "exec/kernel_registry.h"

#include <exception>

namespace salus::exec {
namespace {

class NoopKernel : public Kernel {
 public:
  Status Run(const KernelArgs&) override { return OkStatus(); }
};

}  // namespace

std::string DeviceTypeName(DeviceType d) { return d == DeviceType::kCpu ? "cpu" : "cuda"; }

const KernelRegistry& KernelRegistry::Global() {
  static const KernelRegistry* registry = [] {
    auto* r = new KernelRegistry();
    RegisterCpuKernels(r);
    RegisterCpuGradKernels(r);
    return r;
  }();
  return *registry;
}

void KernelRegistry::Register(const std::string& op, DeviceType device, KernelFactory factory) {
  factories_[{op, device}] = std::move(factory);
}

bool KernelRegistry::Has(const std::string& op, DeviceType device) const {
  return factories_.count({op, device}) > 0;
}

StatusOr<std::unique_ptr<Kernel>> KernelRegistry::Create(const Node& node, const Graph& graph,
                                                         DeviceType device) const {
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
    return it->second(node, graph);
  } catch (const std::exception& e) {
    // oneDNN reports unsupported configurations by throwing when a primitive is created.
    return UnimplementedError("node '" + node.name + "': op " + node.op + ": " + e.what());
  }
}

}  // namespace salus::exec
