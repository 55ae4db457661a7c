#include "server/session_runtime.h"

#include <fmt/format.h>

#include "mem/lane_allocator.h"
#include "salus/v1/data_type.h"

namespace salus::server {

StatusOr<uint64_t> TensorBytes(const v1::TensorSpec& spec) {
  const size_t elem = v1::DataTypeSize(spec.dtype());
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

StatusOr<std::byte*> TakePlannedLane(const mem::LaneIteration& lane, uint64_t bytes) {
  if (bytes == 0 || lane.allocator == nullptr) return lane.address;
  SALUS_RETURN_IF_ERROR(lane.allocator->ReservePlan(bytes));
  return lane.allocator->AllocatePlanned(0, bytes);
}

}  // namespace salus::server
