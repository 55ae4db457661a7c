#include "server/model_factory.h"

#include "server/model_runtime.h"

namespace salus::server {

SessionManager::ModelFactory MakeModelFactory(const std::string& device,
                                              uint64_t max_folded_bytes) {
  if (device != "cpu") {
    // The execution engine's kernels are CPU (oneDNN) kernels; CUDA kernels plug into the
    // same registry later. Until then a GPU daemon serves synthetic sessions only.
    return {};
  }
  return
      [max_folded_bytes](const v1::ModelSpec& spec) -> StatusOr<std::unique_ptr<SessionRuntime>> {
        SALUS_ASSIGN_OR_RETURN(
            auto rt, ModelRuntime::Create(spec, exec::DeviceType::kCpu, max_folded_bytes));
        return std::unique_ptr<SessionRuntime>(std::move(rt));
      };
}

uint64_t DefaultMaxFoldedBytes() { return exec::CompileOptions{}.max_folded_bytes; }

}  // namespace salus::server
