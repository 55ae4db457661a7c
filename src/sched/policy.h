// Policy: the pure decision function of the iteration scheduler.
//
// At every iteration boundary of a lane, the engine builds a read-only snapshot of the
// lane's runnable sessions and asks the policy which one runs next. A policy holds no
// mutable state and touches nothing: it returns a decision and the engine acts on it
// (docs/architecture.md, rule 6). Each policy also names the admission mode it needs from the
// memory manager, since who is on the device is part of the policy.
//
// Note [Anticipation]
// ~~~~~~~~~~~~~~~~~~~
// A synchronous client (every training loop) has nothing queued while it turns a reply into
// its next request, so at that boundary a policy that prefers it sees only the others and
// hands the lane away for a whole iteration. A policy may therefore *hold* a lane: leave it
// idle for a session of the lane that has just finished an iteration and is expected back
// soon. The engine keeps, per session, the gaps it observed between an iteration's end and
// the session's next request (its last kGapHistory of them), and derives a hold window:
//  - no gap observed yet: max_hold (a session that just ran is presumed to come back);
//  - the median gap above max_hold: 0, the session is not one that comes back soon;
//  - else the p90 gap plus a 25% margin, clamped to [min_hold, max_hold].
// A session is *anticipated* while it has no pending iteration, is not closing, has
// iterations left (or declared none), and its last iteration ended less than its window ago;
// `expected_by` is that end plus the window. The snapshot lists anticipated sessions beside
// the runnable ones; the policy may answer Decision::Hold(session, expected_by), and the
// engine leaves the lane idle. The hold ends at once when that session's request arrives,
// when the clock passes expected_by, or when the session closes: each of those changes the
// snapshot, and the next decision is made over it. The decision stays a pure function of the
// snapshot (docs/architecture.md, rule 6): the window is state the engine keeps, the clock decides.
// A policy whose anticipation() has max_hold 0 never sees anticipated sessions.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "mem/memory_manager.h"
#include "salus/status.h"
#include "sched/admission_rules.h"

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
  // Anticipated sessions only: when a hold for this session would end (Note [Anticipation]).
  Nanos expected_by{0};
  // When its last iteration ended (0: it has not run). Paging's least-recently-run order.
  Nanos last_ran{0};
};

// A lane at an iteration boundary: its runnable sessions (never empty), and those of its
// sessions that are expected back soon (Note [Anticipation]; in no particular order).
struct LaneSnapshot {
  Nanos now{0};
  LaneId lane = 0;
  std::span<const SessionView> runnable;
  std::span<const SessionView> anticipated = {};
};

// Run a runnable session's iteration now, or hold the lane idle for an anticipated one.
struct Decision {
  SessionId next = 0;  // the session to run, or the one the lane is held for
  bool hold = false;   // true: leave the lane idle for `next` until `hold_until`
  Nanos hold_until{0};

  static Decision Run(SessionId session) { return Decision{session, false, Nanos(0)}; }
  static Decision Hold(SessionId session, Nanos until) { return Decision{session, true, until}; }
};

// How long a policy lets the engine hold a lane for one anticipated session.
struct AnticipationOptions {
  Nanos max_hold{0};  // 0: the policy never holds
  Nanos min_hold{0};  // a learned window is never shorter (<= max_hold)
};
// SRTF's and priority's default cap on a hold.
inline constexpr Nanos kDefaultMaxHold = std::chrono::milliseconds(2);

// Introspective packing (Note [Introspective packing] in engine.cc): what two sessions that
// ran at the same time on one device did. Each time is the mean seconds of one iteration with
// the other session running beside it, and without it.
struct PairMeasurement {
  SessionId a = 0, b = 0;
  double a_with = 0, a_without = 0, b_with = 0, b_without = 0;
  // Their combined progress packed, in units of one device's worth of either running alone:
  // a_without / a_with + b_without / b_with. Running them apart (one after the other) gives 1.
  double gain() const { return a_without / a_with + b_without / b_with; }
};

// Whether a policy measures the sessions it packs, and how many iterations of each kind it
// wants before it decides.
struct IntrospectionOptions {
  bool enabled = false;
  size_t samples = 3;
  // Each session's first iterations are not measured: they carry one-time costs (a GPU's
  // lazily loaded kernels and library state, first-touch page faults) that would make any
  // pairing look slow.
  size_t warmup = 2;
  double min_gain = 1.0;  // KeepPacked's threshold by default
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // Where sessions go in the arena (src/sched/admission_rules.h).
  virtual std::shared_ptr<const mem::AdmissionRule> admission_rule() const = 0;
  // Precondition: !snapshot.runnable.empty(). Returns Run of one of the runnable sessions,
  // or Hold of one of the anticipated ones until (at most) its expected_by.
  virtual Decision Pick(const LaneSnapshot& snapshot) const = 0;
  // Whether and how long this policy holds lanes (Note [Anticipation]); never, by default.
  virtual AnticipationOptions anticipation() const { return {}; }
  // Paging (overcommit, Note [Paging] in engine.cc): orders resident sessions that may be
  // paged out to make room, the first to go first. By default the least recently run first.
  virtual void OrderPageOut(std::span<SessionView> candidates) const;
  // Introspective packing: off by default.
  virtual IntrospectionOptions introspection() const { return {}; }
  // Whether two measured sessions keep running side by side; by default while packing them
  // gives at least introspection().min_gain.
  virtual bool KeepPacked(const PairMeasurement& m) const {
    return m.gain() >= introspection().min_gain;
  }
};

// A policy that orders the sessions of one lane per class (the single-lane admission rule) and
// holds a lane for a session expected back (Note [Anticipation]): what SRTF and PRIORITY share.
// Create<T>(name, options) reads {"max_hold_ms", "min_hold_ms"} and nothing else.
class AnticipatingPolicy : public Policy {
 public:
  explicit AnticipatingPolicy(AnticipationOptions anticipation) : anticipation_(anticipation) {}
  std::shared_ptr<const mem::AdmissionRule> admission_rule() const override {
    return SingleLaneRule();
  }
  AnticipationOptions anticipation() const override { return anticipation_; }

  template <typename T>
  static StatusOr<std::unique_ptr<Policy>> Create(std::string_view name,
                                                  const nlohmann::json& options);

 private:
  AnticipationOptions anticipation_;
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

// Creates a policy by name ("fifo", "srtf", "pack", "fair", "priority"; case-insensitive) with its
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

// The element of a non-empty `views` whose key is smallest, and that key. `key` maps a view to
// a totally ordered value (ending in admit_seq, which is unique) and is computed once per
// element: one pass, the best key kept in registers.
template <typename KeyFn>
auto MinBy(std::span<const SessionView> views, KeyFn key) {
  const SessionView* best = &views.front();
  auto best_key = key(*best);
  for (const SessionView& v : views.subspan(1)) {
    auto k = key(v);
    if (k < best_key) {
      best_key = k;
      best = &v;
    }
  }
  return std::pair(best, best_key);
}

// The runnable session whose key is smallest.
template <typename KeyFn>
Decision PickMinBy(const LaneSnapshot& s, KeyFn key) {
  return Decision::Run(MinBy(s.runnable, key).first->id);
}

// Note [Anticipation] for a policy ordering sessions by `key` (smallest first): run the best
// runnable session, unless an anticipated session's key is smaller still; then hold the lane
// for the best anticipated one until its expected_by.
template <typename KeyFn>
Decision PickOrHold(const LaneSnapshot& s, KeyFn key) {
  const auto [run, run_key] = MinBy(s.runnable, key);
  if (s.anticipated.empty()) return Decision::Run(run->id);
  const auto [wait, wait_key] = MinBy(s.anticipated, key);
  if (wait_key < run_key) return Decision::Hold(wait->id, wait->expected_by);
  return Decision::Run(run->id);
}

// Sorts `views` so that the one `key` ranks last (largest) comes first: the order a policy
// that picks by smallest key pages sessions out in.
template <typename KeyFn>
void LastPickedFirst(std::span<SessionView> views, KeyFn key) {
  std::sort(views.begin(), views.end(),
            [&](const SessionView& a, const SessionView& b) { return key(b) < key(a); });
}

// Reads {"max_hold_ms": number >= 0, "min_hold_ms": number in [0, max_hold_ms]}, both
// optional (defaults: kDefaultMaxHold, 0). INVALID_ARGUMENT naming the option otherwise.
StatusOr<AnticipationOptions> ParseAnticipation(std::string_view policy,
                                                const nlohmann::json& options);

// INVALID_ARGUMENT if `options` is neither null nor an object, or has a key outside `known`.
Status CheckPolicyOptions(std::string_view policy, const nlohmann::json& options,
                          std::initializer_list<std::string_view> known);

}  // namespace internal

template <typename T>
StatusOr<std::unique_ptr<Policy>> AnticipatingPolicy::Create(std::string_view name,
                                                             const nlohmann::json& options) {
  SALUS_RETURN_IF_ERROR(
      internal::CheckPolicyOptions(name, options, {"max_hold_ms", "min_hold_ms"}));
  SALUS_ASSIGN_OR_RETURN(AnticipationOptions a, internal::ParseAnticipation(name, options));
  return std::unique_ptr<Policy>(new T(a));
}

}  // namespace salus::sched
