// PACK: as many lanes as memory allows, no fairness across them. It measures the sessions it
// packs and unpacks pairs that run slower together than apart (Note [Introspective packing]
// in engine.cc); options {"introspect": true, "min_gain": 1.0, "samples": 3}.
//
// Assumptions: admission is Algorithm 1 (the pack rule), so lanes run in parallel and the
// sessions of one lane time-share it. Algorithm: within a lane, iterations run in the order
// they were requested (the oldest pending request first); ties go to the higher priority,
// then the earlier admitted.
#pragma once

#include "sched/policy.h"

namespace salus::sched {

class PackPolicy final : public Policy {
 public:
  static StatusOr<std::unique_ptr<Policy>> Create(const nlohmann::json& options);
  std::string_view name() const override { return "pack"; }
  std::shared_ptr<const mem::AdmissionRule> admission_rule() const override { return PackRule(); }
  Decision Pick(const LaneSnapshot& snapshot) const override;
  IntrospectionOptions introspection() const override { return introspection_; }

 private:
  explicit PackPolicy(IntrospectionOptions introspection) : introspection_(introspection) {}
  IntrospectionOptions introspection_;
};

}  // namespace salus::sched
