// Policy: the pure decision function of the iteration scheduler.
//
// At every iteration boundary of a lane, the engine builds a read-only snapshot of the
// lane's runnable sessions and asks the policy which one runs next. A policy holds no
// mutable state and touches nothing: it returns a decision and the engine acts on it
// (DESIGN.md invariant 6). Each policy also names the admission mode it needs from the
// memory manager, since who is on the device is part of the policy.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "mem/memory_manager.h"
#include "salus/status.h"

namespace salus::sched {

using mem::LaneId;
using mem::SessionId;

// What a policy may know of one runnable session. Plain data, filled by the engine.
struct SessionView {
  SessionId id = 0;
  int priority = 0;              // higher is more important
  uint64_t admit_seq = 0;        // admission order, 0 first
  Nanos requested_at{0};         // when its pending iteration was requested
  Nanos service{0};              // device time attained since the lane's membership changed
  Nanos total_service{0};        // device time attained since admission
  double remaining_seconds = 0;  // estimated remaining work (see Engine, Note [Remaining time])
  int64_t iterations_done = 0;
};

// A lane at an iteration boundary, with only its runnable sessions (never empty).
struct LaneSnapshot {
  Nanos now{0};
  LaneId lane = 0;
  std::span<const SessionView> runnable;
};

struct Decision {
  SessionId next = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  virtual mem::AdmissionMode admission_mode() const = 0;
  // Precondition: !snapshot.runnable.empty(). Returns one of the runnable sessions.
  virtual Decision Pick(const LaneSnapshot& snapshot) const = 0;
};

// FAIR's weight for a priority: 1 + p for p >= 0, 1 / (1 - p) below; a priority-2 session
// gets three times the service of a priority-0 one.
double PriorityWeight(int priority);
// 1 / PriorityWeight(priority): a table lookup for priorities in [-128, 128], so a decision
// over many sessions does no division.
inline constexpr int kWeightTableRange = 128;
inline constexpr auto kInverseWeights = [] {
  std::array<double, 2 * kWeightTableRange + 1> v{};
  for (int p = -kWeightTableRange; p <= kWeightTableRange; ++p) {
    v[p + kWeightTableRange] = p >= 0 ? 1.0 / (1.0 + p) : 1.0 - p;
  }
  return v;
}();
inline double InversePriorityWeight(int priority) {
  if (priority < -kWeightTableRange || priority > kWeightTableRange) {
    return 1.0 / PriorityWeight(priority);
  }
  return kInverseWeights[priority + kWeightTableRange];
}

// Creates a policy by name ("fifo", "srtf", "pack", "fair"; case-insensitive) with its
// options as a JSON object (may be null or empty for the defaults). Unknown names and
// unknown or mistyped options are INVALID_ARGUMENT naming them.
StatusOr<std::unique_ptr<Policy>> CreatePolicy(std::string_view name,
                                               const nlohmann::json& options = {});

// The registered names, in a stable order.
std::vector<std::string> PolicyNames();

namespace internal {

// Note [Ordered bits]
// For non-negative doubles (+infinity included) the IEEE-754 bit pattern read as an unsigned
// integer orders exactly as the value does. Keys built from service and remaining time (never
// negative) compare as integers this way, which keeps the decision loop on integer compares.
// Adding 0.0 turns a -0.0 into +0.0; NaN never occurs in these quantities.
inline uint64_t OrderedBits(double non_negative) {
  return std::bit_cast<uint64_t>(non_negative + 0.0);
}

// The runnable session whose key is smallest. `key` maps a view to a totally ordered value
// (ending in admit_seq, which is unique) and is computed once per session: one pass, one key
// evaluation per element, the best key kept in registers.
template <typename KeyFn>
Decision PickMinBy(const LaneSnapshot& s, KeyFn key) {
  const SessionView* best = &s.runnable.front();
  auto best_key = key(*best);
  for (const SessionView& v : s.runnable.subspan(1)) {
    auto k = key(v);
    if (k < best_key) {
      best_key = k;
      best = &v;
    }
  }
  return Decision{best->id};
}

// INVALID_ARGUMENT if `options` is neither null nor an object, or has a key outside `known`.
Status CheckPolicyOptions(std::string_view policy, const nlohmann::json& options,
                          std::initializer_list<std::string_view> known);

}  // namespace internal

}  // namespace salus::sched
