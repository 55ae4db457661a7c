#include "exec/compile_limits.h"

#include <fmt/format.h>

namespace salus::exec {

Status CompileLimits::CheckNodes(int64_t nodes, const std::string& what) const {
  if (nodes > max_nodes) {
    return ResourceExhaustedError(
        fmt::format("{} has {} nodes, over max_nodes={} (the daemon's limits.max_nodes)", what,
                    nodes, max_nodes));
  }
  return OkStatus();
}

Status CompileLimits::CheckDeadline(const char* during) const {
  if (deadline != TimePoint::max() && std::chrono::steady_clock::now() > deadline) {
    return DeadlineExceededError(fmt::format(
        "compilation ran past its deadline while {} (the daemon's limits.compile_seconds)",
        during));
  }
  return OkStatus();
}

}  // namespace salus::exec
