#include "server/session_runtime.h"

#include <fmt/format.h>

namespace salus::server {

size_t DataTypeSize(v1::DataType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
    case v1::INT32:
      return 4;
    case v1::INT64:
    case v1::FLOAT64:
      return 8;
    case v1::UINT8:
    case v1::BOOL:
      return 1;
    default:
      return 0;
  }
}

StatusOr<uint64_t> TensorBytes(const v1::TensorSpec& spec) {
  const size_t elem = DataTypeSize(spec.dtype());
  if (elem == 0) {
    return InvalidArgumentError(fmt::format("tensor '{}': unsupported dtype {}", spec.name(),
                                            static_cast<int>(spec.dtype())));
  }
  uint64_t count = 1;
  for (int64_t d : spec.shape()) {
    if (d < 0) {
      return InvalidArgumentError(
          fmt::format("tensor '{}': negative dimension {}", spec.name(), d));
    }
    if (d != 0 && count > UINT64_MAX / static_cast<uint64_t>(d) / elem) {
      return InvalidArgumentError(fmt::format("tensor '{}': shape is too large", spec.name()));
    }
    count *= static_cast<uint64_t>(d);
  }
  return count * elem;
}

Status CheckFrame(const v1::TensorSpec& spec, size_t frame_bytes) {
  SALUS_ASSIGN_OR_RETURN(const uint64_t need, TensorBytes(spec));
  if (need != frame_bytes) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': frame has {} bytes but its dtype and shape need {}", spec.name(),
                    frame_bytes, need));
  }
  return OkStatus();
}

}  // namespace salus::server
