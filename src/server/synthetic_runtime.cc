#include "server/synthetic_runtime.h"

#include <fmt/format.h>

#include <cmath>
#include <thread>

namespace salus::server {
namespace {

constexpr uint64_t kPageBytes = 4096;
// A synthetic iteration may not claim to last longer than this.
constexpr double kMaxIterationSeconds = 3600;

void TouchPages(std::byte* base, uint64_t bytes, std::byte value) {
  for (uint64_t off = 0; off < bytes; off += kPageBytes) base[off] = value;
}

}  // namespace

StatusOr<std::unique_ptr<SyntheticRuntime>> SyntheticRuntime::Create(
    const v1::SyntheticProfile& profile, bool host_accessible) {
  const double s = profile.iteration_seconds();
  if (!std::isfinite(s) || s < 0 || s > kMaxIterationSeconds) {
    return InvalidArgumentError(
        fmt::format("synthetic profile: iteration_seconds must be in [0, {}], got {}",
                    kMaxIterationSeconds, s));
  }
  return std::unique_ptr<SyntheticRuntime>(new SyntheticRuntime(
      profile.persistent_bytes(), profile.ephemeral_bytes(), FromSeconds(s), host_accessible));
}

Status SyntheticRuntime::Validate(const std::vector<HostTensor>& feeds,
                                  const std::vector<std::string>& fetches, bool state_only) const {
  if (state_only) {
    return InvalidArgumentError("a synthetic session has no state to read or write");
  }
  if (!feeds.empty()) {
    return InvalidArgumentError(
        fmt::format("a synthetic session takes no feeds, got {} (first '{}')", feeds.size(),
                    feeds[0].spec.name()));
  }
  if (!fetches.empty()) {
    return InvalidArgumentError(
        fmt::format("a synthetic session has no outputs to fetch, asked for '{}'", fetches[0]));
  }
  return OkStatus();
}

Status SyntheticRuntime::Run(const sched::Dispatch& d, const std::vector<HostTensor>&,
                             const std::vector<std::string>&, bool, IterationOutputs*) {
  const auto deadline = std::chrono::steady_clock::now() + iteration_;
  // Its E is the lane's plan, touched or not: the lane's statistics count it.
  const uint64_t lane_bytes = std::min(ephemeral_, d.lane_memory.size);
  SALUS_ASSIGN_OR_RETURN(std::byte * lane, TakePlannedLane(d.lane_memory, lane_bytes));
  if (touch_) {
    if (!initialized_ && d.persistent.address != nullptr) {
      TouchPages(d.persistent.address, std::min(persistent_, d.persistent.size), std::byte{1});
    }
    if (lane != nullptr) TouchPages(lane, lane_bytes, static_cast<std::byte>(d.iteration & 0xff));
  }
  initialized_ = true;
  std::this_thread::sleep_until(deadline);
  return OkStatus();
}

}  // namespace salus::server
