#include "common/version.h"

#include <fmt/format.h>

namespace salus {

std::string VersionText(const std::string& program) {
  std::string text = fmt::format("{} {} (protocol {})\n", program, kVersion, kProtocolVersion);
  if (kBuiltWithCuda) {
    text += fmt::format("devices: cpu, cuda (CUDA {}, cuDNN {}, compute capabilities {})\n",
                        kCudaVersion, kCudnnVersion, kCudaArchitectures);
  } else {
    text += "devices: cpu (built without CUDA)\n";
  }
  return text;
}

}  // namespace salus
