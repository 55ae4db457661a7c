#include "server/model_factory.h"

#include "server/model_runtime.h"

namespace salus::server {

SessionManager::ModelFactory MakeModelFactory(const std::string& device,
                                              uint64_t max_folded_bytes) {
  auto d = exec::ParseDevice(device);
  if (!d.ok()) return {};  // a device the engine has no kernels for: synthetic sessions only
  return [dev = *d, max_folded_bytes](
             const v1::ModelSpec& spec) -> StatusOr<std::unique_ptr<SessionRuntime>> {
    SALUS_ASSIGN_OR_RETURN(auto rt, ModelRuntime::Create(spec, dev, max_folded_bytes));
    return std::unique_ptr<SessionRuntime>(std::move(rt));
  };
}

uint64_t DefaultMaxFoldedBytes() { return exec::CompileOptions{}.max_folded_bytes; }

}  // namespace salus::server
