#include "server/model_factory.h"

#include "server/model_runtime.h"
#include "server/server.h"

namespace salus::server {

SessionManager::ModelFactory MakeModelFactory(const std::vector<std::string>& devices,
                                              uint64_t max_folded_bytes) {
  std::vector<exec::Device> kernels;
  for (const std::string& name : devices) {
    auto d = exec::ParseDevice(KernelDevice(name));
    if (!d.ok()) return {};  // a device the engine has no kernels for: synthetic sessions only
    kernels.push_back(*d);
  }
  if (kernels.empty()) return {};
  return [kernels, max_folded_bytes](
             const v1::ModelSpec& spec,
             std::optional<size_t> device) -> StatusOr<std::unique_ptr<SessionRuntime>> {
    SALUS_ASSIGN_OR_RETURN(
        auto rt, ModelRuntime::Create(spec, kernels, device.value_or(0), max_folded_bytes));
    return std::unique_ptr<SessionRuntime>(std::move(rt));
  };
}

uint64_t DefaultMaxFoldedBytes() { return exec::CompileOptions{}.max_folded_bytes; }

}  // namespace salus::server
