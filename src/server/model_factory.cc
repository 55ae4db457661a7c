#include "server/model_factory.h"

#include <chrono>

#include "server/model_runtime.h"
#include "server/server.h"

namespace salus::server {

SessionManager::ModelFactory MakeModelFactory(const std::vector<std::string>& devices,
                                              const exec::CompileLimits& limits,
                                              Nanos compile_time) {
  std::vector<exec::Device> kernels;
  for (const std::string& name : devices) {
    auto d = exec::ParseDevice(KernelDevice(name));
    if (!d.ok()) return {};  // a device the engine has no kernels for: synthetic sessions only
    kernels.push_back(*d);
  }
  if (kernels.empty()) return {};
  return [kernels, limits, compile_time](
             const v1::ModelSpec& spec,
             std::optional<size_t> device) -> StatusOr<std::unique_ptr<SessionRuntime>> {
    exec::CompileLimits bounded = limits;
    if (compile_time > Nanos(0)) {
      bounded.deadline =
          std::chrono::steady_clock::now() +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(compile_time);
    }
    SALUS_ASSIGN_OR_RETURN(auto rt,
                           ModelRuntime::Create(spec, kernels, device.value_or(0), bounded));
    return std::unique_ptr<SessionRuntime>(std::move(rt));
  };
}

}  // namespace salus::server
