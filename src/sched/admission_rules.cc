// Algorithm 1 (docs/memory.md), with F the persistent footprint once P is placed (= ΣP + P when the
// persistent region has no holes, Note [Persistent footprint] in src/mem) and ΣL the lanes'
// sizes:
//   1. F + ΣL + E ≤ C                        open a new lane of size E;
//   2. F + ΣL ≤ C and some lane has L ≥ E    join the smallest such lane;
//   3. the smallest lane r with F + ΣL - L_r + E ≤ C (all lanes are < E here): grow r to E,
//                                             at its next iteration boundary, and join it;
//   4. otherwise                              wait.
// Every search stays within the session's lane class (a lane holds sessions of one class).
// The single-lane rule keeps at most one lane per class and admits when
// F + ΣL - L + max(L, E) ≤ C, L the class's lane; the exclusive rule admits one job at a time
// (Note [Jobs]).
//
// Note [Jobs]
// ~~~~~~~~~~~
// A job is what a client runs as one: a Keras job's training step, its last short batch,
// evaluate and predict, each a session of its own graph; a PyTorch job's several captured
// graphs. Its sessions carry one job key (CreateSession.job, scoped to the client), and take
// turns, so under the exclusive rule (FIFO: one tenant on the device at a time) the tenant is
// the job, not the session: a session is admitted when no session of another job is resident,
// by the single-lane rule (its job's sessions share one lane per class, growing it to the
// largest E among them, since they run one iteration at a time). Were the tenant the session,
// a job's second session would wait behind its own first one, which waits for the job's next
// step: forever. A session of no job (job 0) is a job of its own. The sharing rules place a
// job's sessions as any others: nothing there waits behind the job itself.
#include "sched/admission_rules.h"

#include <fmt/format.h>

namespace salus::sched {
namespace {

using mem::AdmissionDecision;
using mem::ArenaSnapshot;
using mem::ArenaView;
using mem::Requirement;
using Step = AdmissionDecision::Step;

// A rule whose condition is evaluated over one arena; paging is the same for every rule.
class Rule : public mem::AdmissionRule {
 public:
  AdmissionDecision Decide(const ArenaView& arena, const Requirement& req,
                           std::span<const mem::SessionId> page_out) const final {
    AdmissionDecision d = DecideHere(arena, req);
    if (d.step != Step::kWait || page_out.empty()) return d;
    ArenaSnapshot after = arena.Materialize();
    for (size_t k = 0; k < page_out.size(); ++k) {
      if (!after.PageOut(page_out[k])) return AdmissionDecision::Wait();
      d = DecideHere(after, req);
      if (d.step != Step::kWait) {
        d.page_out.assign(page_out.begin(), page_out.begin() + static_cast<std::ptrdiff_t>(k + 1));
        return d;
      }
    }
    return AdmissionDecision::Wait();
  }

 protected:
  virtual AdmissionDecision DecideHere(const ArenaView& arena, const Requirement& req) const = 0;
};

// F + ΣL + E ≤ C, without overflow.
// The quantities every rule weighs: E, the footprint F once P is placed, C and ΣL.
struct Sizes {
  uint64_t e, f, c, l;
  Sizes(const ArenaView& a, const Requirement& req)
      : e(req.ephemeral_bytes),
        f(a.FootprintWith(req.persistent_bytes)),
        c(a.capacity()),
        l(a.lane_bytes()) {}
  // F + ΣL + E ≤ C, without overflow.
  bool NewLaneFits() const { return f <= c && l <= c - f && e <= c - f - l; }
  // F + ΣL ≤ C.
  bool LanesFit() const { return f <= c && l <= c - f; }
};

class Pack final : public Rule {
 public:
  std::string_view name() const override { return "pack"; }

 protected:
  AdmissionDecision DecideHere(const ArenaView& a, const Requirement& req) const override {
    const Sizes z(a, req);
    const uint64_t e = z.e, f = z.f, c = z.c, l = z.l;
    // 1. A new lane of size E.
    if (z.NewLaneFits()) return {Step::kNewLane, 0, {}};
    // Joining adds P without adding lane bytes; nothing fits unless the lanes fit beside F.
    if (!z.LanesFit()) return AdmissionDecision::Wait();
    // 2. The best match: the smallest lane of the class with L >= E.
    if (const auto best = a.SmallestLane(req.lane_class, e)) return {Step::kJoin, best->id, {}};
    // 3. The smallest lane with F + ΣL - L_r + E ≤ C, i.e. L_r ≥ F + ΣL + E - C. Every lane is
    // smaller than E here (step 2 found none), so growing it to E is the step.
    if (const auto grow = a.SmallestLane(req.lane_class, f + l + e - c)) {
      return {Step::kGrow, grow->id, {}};
    }
    // 4. Wait.
    return AdmissionDecision::Wait();
  }
};

// One lane per class: the class's lane grows to max(L, E) and the other classes' lanes stay.
AdmissionDecision DecideSingleLane(const ArenaView& a, const Requirement& req) {
  const Sizes z(a, req);
  const auto mine = a.SmallestLane(req.lane_class, 0);
  if (!mine) {
    if (z.NewLaneFits()) return {Step::kNewLane, 0, {}};
    return AdmissionDecision::Wait();
  }
  if (!z.LanesFit() || std::max(mine->size, z.e) - mine->size > z.c - z.f - z.l) {
    return AdmissionDecision::Wait();
  }
  return {mine->size >= z.e ? Step::kJoin : Step::kGrow, mine->id, {}};
}

Status CheckOneLanePerClass(const ArenaView& a, std::string_view rule) {
  for (const mem::LaneClass cls : {mem::LaneClass::kBatch, mem::LaneClass::kInteractive}) {
    if (a.LaneCount(cls) > 1) {
      return InternalError(
          fmt::format("memory invariant broken: more than one {} lane under the {} rule",
                      mem::LaneClassName(cls), rule));
    }
  }
  return OkStatus();
}

class SingleLane final : public Rule {
 public:
  std::string_view name() const override { return "single-lane"; }
  Status CheckShape(const ArenaView& a) const override { return CheckOneLanePerClass(a, name()); }

 protected:
  AdmissionDecision DecideHere(const ArenaView& a, const Requirement& req) const override {
    return DecideSingleLane(a, req);
  }
};

// Note [Jobs]: one job resident at a time, its sessions in one lane per class.
class Exclusive final : public Rule {
 public:
  std::string_view name() const override { return "exclusive"; }
  Status CheckShape(const ArenaView& a) const override {
    if (const size_t jobs = a.ResidentJobCount(); jobs > 1) {
      return InternalError(fmt::format(
          "memory invariant broken: {} jobs with {} resident sessions under the exclusive rule",
          jobs, a.resident_sessions()));
    }
    return CheckOneLanePerClass(a, name());
  }

 protected:
  AdmissionDecision DecideHere(const ArenaView& a, const Requirement& req) const override {
    if (a.ResidentOutside(req.job) != 0) return AdmissionDecision::Wait();
    return DecideSingleLane(a, req);
  }
};

}  // namespace

std::shared_ptr<const mem::AdmissionRule> PackRule() {
  static const auto rule = std::make_shared<const Pack>();
  return rule;
}

std::shared_ptr<const mem::AdmissionRule> SingleLaneRule() {
  static const auto rule = std::make_shared<const SingleLane>();
  return rule;
}

std::shared_ptr<const mem::AdmissionRule> ExclusiveRule() {
  static const auto rule = std::make_shared<const Exclusive>();
  return rule;
}

}  // namespace salus::sched
