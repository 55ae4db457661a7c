// The policy registry, PriorityWeight, and the helpers the policies share.
#include "sched/policy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

#include "common/config.h"
#include "sched/fair_policy.h"
#include "sched/fifo_policy.h"
#include "sched/pack_policy.h"
#include "sched/priority_policy.h"
#include "sched/srtf_policy.h"

namespace salus::sched {

void Policy::OrderPageOut(std::span<SessionView> candidates) const {
  std::sort(candidates.begin(), candidates.end(), [](const SessionView& a, const SessionView& b) {
    return std::pair(a.last_ran, a.admit_seq) < std::pair(b.last_ran, b.admit_seq);
  });
}

double PriorityWeight(int priority) {
  return priority >= 0 ? 1.0 + priority : 1.0 / (1.0 - priority);
}

namespace internal {

Status CheckPolicyOptions(std::string_view policy, const nlohmann::json& options,
                          std::initializer_list<std::string_view> known) {
  if (options.is_null()) return OkStatus();
  if (!options.is_object()) {
    return InvalidArgumentError(fmt::format("policy '{}': options must be a JSON object, got {}",
                                            policy, options.type_name()));
  }
  for (const auto& [key, value] : options.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      const std::vector<std::string> names(known.begin(), known.end());
      return InvalidArgumentError(
          fmt::format("policy '{}': unknown option '{}'{}{}", policy, key, DidYouMean(key, names),
                      names.empty() ? std::string(" (it takes none)")
                                    : fmt::format(" (it takes {})", fmt::join(names, ", "))));
    }
  }
  return OkStatus();
}

StatusOr<AnticipationOptions> ParseAnticipation(std::string_view policy,
                                                const nlohmann::json& options) {
  AnticipationOptions a;
  a.max_hold = kDefaultMaxHold;
  if (!options.is_object()) return a;
  auto millis = [&](const char* key, Nanos* out) -> Status {
    if (!options.contains(key)) return OkStatus();
    const nlohmann::json& v = options[key];
    if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > 3.6e6) {
      return InvalidArgumentError(fmt::format(
          "policy '{}': option '{}' must be a number of milliseconds in [0, 3600000], got {}",
          policy, key, v.dump()));
    }
    *out = std::chrono::duration_cast<Nanos>(
        std::chrono::duration<double, std::milli>(v.get<double>()));
    return OkStatus();
  };
  SALUS_RETURN_IF_ERROR(millis("max_hold_ms", &a.max_hold));
  SALUS_RETURN_IF_ERROR(millis("min_hold_ms", &a.min_hold));
  if (a.min_hold > a.max_hold) {
    return InvalidArgumentError(
        fmt::format("policy '{}': min_hold_ms ({} ms) is above max_hold_ms ({} ms)", policy,
                    std::chrono::duration<double, std::milli>(a.min_hold).count(),
                    std::chrono::duration<double, std::milli>(a.max_hold).count()));
  }
  return a;
}

}  // namespace internal

namespace {

struct Entry {
  std::string_view name;
  StatusOr<std::unique_ptr<Policy>> (*create)(const nlohmann::json&);
};

constexpr Entry kRegistry[] = {
    {"fifo", &FifoPolicy::Create},         {"srtf", &SrtfPolicy::Create},
    {"pack", &PackPolicy::Create},         {"fair", &FairPolicy::Create},
    {"priority", &PriorityPolicy::Create},
};

}  // namespace

StatusOr<std::unique_ptr<Policy>> CreatePolicy(std::string_view name,
                                               const nlohmann::json& options) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const Entry& e : kRegistry) {
    if (e.name == lower) return e.create(options);
  }
  return InvalidArgumentError(
      fmt::format("unknown policy '{}' (expected fifo, srtf, pack, fair or priority)", name));
}

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (const Entry& e : kRegistry) names.emplace_back(e.name);
  return names;
}

}  // namespace salus::sched
