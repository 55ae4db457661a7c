// Policy: the pure decision function of the iteration scheduler.
//
// At every iteration boundary of a lane, the engine builds a read-only snapshot of the
// lane's runnable sessions and asks the policy which one runs next. A policy holds no
// mutable state and touches nothing: it returns a decision and the engine acts on it
// (DESIGN.md invariant 6). Each policy also names the admission mode it needs from the
// memory manager, since who is on the device is part of the policy.
#pragma once

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
  int priority = 0;             // higher is more important
  uint64_t admit_seq = 0;       // admission order, 0 first
  Nanos requested_at{0};        // when its pending iteration was requested
  Nanos service{0};             // device time attained since the lane's membership changed
  Nanos total_service{0};       // device time attained since admission
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

// Creates a policy by name ("fifo", "srtf", "pack", "fair"; case-insensitive) with its
// options as a JSON object (may be null or empty for the defaults). Unknown names and
// unknown or mistyped options are INVALID_ARGUMENT naming them.
StatusOr<std::unique_ptr<Policy>> CreatePolicy(std::string_view name,
                                               const nlohmann::json& options = {});

// The registered names, in a stable order.
std::vector<std::string> PolicyNames();

namespace internal {

// The runnable session that is smallest under `less` (a strict total order).
template <typename Less>
Decision PickMin(const LaneSnapshot& s, Less less) {
  const SessionView* best = &s.runnable.front();
  for (const SessionView& v : s.runnable.subspan(1)) {
    if (less(v, *best)) best = &v;
  }
  return Decision{best->id};
}

// INVALID_ARGUMENT if `options` is neither null nor an object, or has a key outside `known`.
Status CheckPolicyOptions(std::string_view policy, const nlohmann::json& options,
                          std::initializer_list<std::string_view> known);

}  // namespace internal

}  // namespace salus::sched
