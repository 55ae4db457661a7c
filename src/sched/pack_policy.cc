#include "sched/pack_policy.h"

#include <fmt/format.h>

#include <tuple>

namespace salus::sched {

StatusOr<std::unique_ptr<Policy>> PackPolicy::Create(const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(internal::CheckPolicyOptions(
      "pack", options, {"introspect", "min_gain", "samples", "warmup"}));
  IntrospectionOptions o;
  o.enabled = true;
  if (options.is_object()) {
    if (options.contains("introspect")) {
      if (!options["introspect"].is_boolean()) {
        return InvalidArgumentError(
            fmt::format("policy 'pack': option 'introspect' must be true or false, got {}",
                        options["introspect"].dump()));
      }
      o.enabled = options["introspect"].get<bool>();
    }
    if (options.contains("min_gain")) {
      const nlohmann::json& g = options["min_gain"];
      if (!g.is_number() || !(g.get<double>() > 0) || g.get<double>() > 2) {
        return InvalidArgumentError(fmt::format(
            "policy 'pack': option 'min_gain' must be a number in (0, 2], got {}", g.dump()));
      }
      o.min_gain = g.get<double>();
    }
    if (options.contains("samples")) {
      const nlohmann::json& n = options["samples"];
      if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > 1000) {
        return InvalidArgumentError(fmt::format(
            "policy 'pack': option 'samples' must be an integer in [1, 1000], got {}", n.dump()));
      }
      o.samples = n.get<size_t>();
    }
    if (options.contains("warmup")) {
      const nlohmann::json& n = options["warmup"];
      if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > 1000) {
        return InvalidArgumentError(fmt::format(
            "policy 'pack': option 'warmup' must be an integer in [0, 1000], got {}", n.dump()));
      }
      o.warmup = n.get<size_t>();
    }
  }
  return std::unique_ptr<Policy>(new PackPolicy(o));
}

Decision PackPolicy::Pick(const LaneSnapshot& s) const {
  return internal::PickMinBy(s, [](const SessionView& v) {
    return std::tuple(v.requested_at.count(), -v.priority, v.admit_seq);
  });
}

}  // namespace salus::sched
