// Engine behaviour on a manual clock and the fake memory provider: each test drives the
// engine like a lane worker would, with iterations of known length.
#include "sched/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "common/units.h"
#include "device/memory_provider.h"

namespace salus::sched {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kCapacity = 16 * kGiB;

struct Job {
  Nanos iteration{seconds(1)};
  int64_t iterations_left = 0;
  Nanos turnaround{0};  // a synchronous client: its next request comes this long after a reply
};

class Harness {
 public:
  explicit Harness(std::string_view policy, nlohmann::json options = {},
                   uint64_t capacity = kCapacity) {
    provider_ = std::move(*device::CreateMemoryProvider("fake"));
    Engine::Options o;
    o.clock = &clock_;
    o.policy = std::move(*CreatePolicy(policy, options));
    o.devices =
        std::move(*MakeDevices(*o.policy, &clock_, {{"fake:0", provider_.get(), capacity}}));
    o.on_admitted = [this](SessionId id, LaneId) {
      admitted_later_.push_back(id);
      Request(id);
    };
    engine_ = std::move(*Engine::Create(std::move(o)));
  }

  // Adds a job that requests `iterations` iterations, each `turnaround` after the previous
  // one's end (back to back when 0).
  StatusOr<bool> Add(SessionId id, uint64_t p, uint64_t e, Nanos iteration, int64_t iterations,
                     int priority = 0, Nanos turnaround = Nanos(0),
                     mem::LaneClass lane_class = mem::LaneClass::kBatch) {
    jobs_[id] = Job{iteration, iterations, turnaround};
    SessionSpec spec;
    spec.requirement = {p, e, lane_class};
    spec.priority = priority;
    spec.declared_iterations = iterations;
    spec.iteration_time_hint = iteration;
    auto r = engine_->AddSession(id, spec);
    if (r.ok() && *r) Request(id);
    return r;
  }

  // Starts what can start, checks work conservation, then moves time to the next event (a
  // completion, a client's request, the end of a hold; or `limit`) and applies what happens
  // then: requests first, then completions. Returns false when nothing is left to happen.
  bool Step(Nanos limit = Nanos::max()) {
    for (const Dispatch& d : engine_->DispatchReady()) {
      running_[d.lane] = {d, clock_.Now() + jobs_.at(d.session).iteration};
      concurrent_max_ = std::max(concurrent_max_, running_.size());
      dispatches_.push_back(d);
    }
    CheckWorkConserving();
    Nanos next = Nanos::max();
    for (const auto& [lane, r] : running_) next = std::min(next, r.second);
    if (!requests_.empty()) next = std::min(next, requests_.begin()->first);
    if (auto hold = engine_->NextHoldDeadline()) next = std::min(next, *hold);
    if (next == Nanos::max()) return false;
    if (next > limit) {
      clock_.Set(limit);
      return true;
    }
    clock_.Set(next);
    while (!requests_.empty() && requests_.begin()->first <= next) {
      Request(requests_.begin()->second);
      requests_.erase(requests_.begin());
    }
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->second.second > next) {
        ++it;
        continue;
      }
      const Dispatch d = it->second.first;
      it = running_.erase(it);
      auto rec = engine_->Complete(d);
      EXPECT_TRUE(rec.ok()) << rec.status();
      if (rec.ok()) records_.push_back(*rec);
      Job& job = jobs_.at(d.session);
      if (--job.iterations_left > 0) {
        if (job.turnaround > Nanos(0)) {
          requests_.emplace(next + job.turnaround, d.session);
        } else {
          Request(d.session);
        }
      } else {
        EXPECT_TRUE(engine_->RemoveSession(d.session).ok());
      }
    }
    return true;
  }

  void RunUntil(Nanos t) {
    while (clock_.Now() < t && Step(t)) {
    }
    clock_.Set(t);
  }
  void RunAll() {
    while (Step()) {
    }
  }
  std::vector<SessionId> Order() const {
    std::vector<SessionId> order;
    for (const auto& r : records_) order.push_back(r.session);
    return order;
  }

  // No lane without a running iteration may hold a session with a pending one, unless its
  // memory is held by lanes mid-iteration; and with nothing running, nothing may be blocked
  // (otherwise the engine would never make progress again).
  void CheckWorkConserving() {
    std::map<LaneId, bool> busy, pending;
    for (const SessionInfo& s : engine_->Sessions()) {
      if (s.state != SessionState::kAdmitted && s.state != SessionState::kRunning) continue;
      busy[s.lane] |= s.running;
      pending[s.lane] |= s.pending > 0;
    }
    const std::vector<LaneId> blocked = engine_->BlockedLanes();
    const std::vector<LaneId> held = engine_->HeldLanes();
    for (const auto& [lane, has_pending] : pending) {
      const bool is_blocked = std::find(blocked.begin(), blocked.end(), lane) != blocked.end();
      const bool is_held = std::find(held.begin(), held.end(), lane) != held.end();
      EXPECT_FALSE(has_pending && !busy[lane] && !is_blocked && !is_held)
          << "lane " << lane << " idles with work";
      if (is_blocked) ++blocked_seen_;
    }
    // A hold is bounded: it always ends at a time still to come.
    if (!held.empty()) {
      const auto deadline = engine_->NextHoldDeadline();
      EXPECT_TRUE(deadline.has_value() && *deadline > clock_.Now());
    }
    if (engine_->RunningIterations() == 0) {
      EXPECT_TRUE(blocked.empty()) << "lanes blocked while nothing runs";
    }
  }

  void Request(SessionId id) { ASSERT_TRUE(engine_->RequestIteration(id).ok()); }

  ManualClock clock_;
  std::unique_ptr<device::MemoryProvider> provider_;
  std::unique_ptr<Engine> engine_;
  std::map<SessionId, Job> jobs_;
  std::map<LaneId, std::pair<Dispatch, Nanos>> running_;
  std::vector<IterationRecord> records_;
  std::vector<Dispatch> dispatches_;
  std::multimap<Nanos, SessionId> requests_;  // clients' next requests, by time
  std::vector<SessionId> admitted_later_;
  size_t concurrent_max_ = 0;
  size_t blocked_seen_ = 0;
};

TEST(EngineTest, SrtfSwitchesToShorterArrivalAtNextBoundary) {
  Harness h("srtf");
  ASSERT_TRUE(*h.Add(1, kGiB, 2 * kGiB, seconds(1), 1000));
  h.RunUntil(milliseconds(10500));  // job 1 is mid-iteration 10
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 5));
  h.RunUntil(seconds(20));
  // Iteration 10 of job 1 finishes at 11 s; then job 2 runs 5 iterations, then job 1 resumes.
  std::vector<SessionId> order;
  for (const auto& r : h.records_) order.push_back(r.session);
  ASSERT_GE(order.size(), 17u);
  for (size_t i = 0; i < 11; ++i) EXPECT_EQ(order[i], 1u) << i;
  for (size_t i = 11; i < 16; ++i) EXPECT_EQ(order[i], 2u) << i;
  EXPECT_EQ(order[16], 1u);
  EXPECT_EQ(h.records_[11].started_at, seconds(11));
  EXPECT_EQ(h.records_[11].queue_delay, milliseconds(500));
  // One shared lane: the short job never ran beside the long one.
  EXPECT_EQ(h.concurrent_max_, 1u);
}

TEST(EngineTest, FairGivesEqualJobsEqualServiceInOneLane) {
  Harness h("fair", {{"single_lane", true}});
  for (SessionId id = 1; id <= 3; ++id)
    ASSERT_TRUE(*h.Add(id, kGiB, kGiB, milliseconds(100), 100000));
  h.RunUntil(seconds(300));
  std::vector<double> service;
  for (const SessionInfo& s : h.engine_->Sessions()) service.push_back(ToSeconds(s.total_service));
  ASSERT_EQ(service.size(), 3u);
  const double mean = (service[0] + service[1] + service[2]) / 3;
  EXPECT_NEAR(mean, 100.0, 1.0);
  for (double s : service) EXPECT_LT(std::abs(s - mean) / mean, 0.05) << s;
}

TEST(EngineTest, FairSharesDeviceTimeNotIterations) {
  // Iterations of 50, 100 and 200 ms: equal device time means 4:2:1 iterations.
  Harness h("fair", {{"single_lane", true}});
  const Nanos its[] = {milliseconds(50), milliseconds(100), milliseconds(200)};
  for (SessionId id = 1; id <= 3; ++id) ASSERT_TRUE(*h.Add(id, kGiB, kGiB, its[id - 1], 100000));
  h.RunUntil(seconds(120));
  for (const SessionInfo& s : h.engine_->Sessions()) {
    EXPECT_NEAR(ToSeconds(s.total_service), 40.0, 2.0) << "session " << s.id;
  }
}

TEST(EngineTest, FairHonoursPriorityWeights) {
  Harness h("fair", {{"single_lane", true}});
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, milliseconds(100), 100000, /*priority=*/0));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, milliseconds(100), 100000, /*priority=*/2));
  h.RunUntil(seconds(100));
  const double s1 = ToSeconds(h.engine_->Session(1)->total_service);
  const double s2 = ToSeconds(h.engine_->Session(2)->total_service);
  EXPECT_NEAR(s2 / s1, 3.0, 0.15);
}

TEST(EngineTest, FifoNeverInterleavesJobs) {
  Harness h("fifo");
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 5));
  ASSERT_FALSE(*h.Add(2, kGiB, kGiB, seconds(1), 5));  // waits: one job on the device
  ASSERT_FALSE(*h.Add(3, kGiB, kGiB, seconds(1), 5));
  h.RunAll();
  ASSERT_EQ(h.records_.size(), 15u);
  for (size_t i = 0; i < 15; ++i) EXPECT_EQ(h.records_[i].session, i / 5 + 1) << i;
  EXPECT_EQ(h.admitted_later_, (std::vector<SessionId>{2, 3}));
  EXPECT_EQ(h.concurrent_max_, 1u);
}

TEST(EngineTest, PackRunsTwoLanesConcurrently) {
  Harness h("pack");
  ASSERT_TRUE(*h.Add(1, kGiB, 4 * kGiB, seconds(1), 10));
  ASSERT_TRUE(*h.Add(2, kGiB, 4 * kGiB, seconds(1), 10));
  const auto first = h.engine_->DispatchReady();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_NE(first[0].lane, first[1].lane);
  // Feed them back as the harness would: both finish at t = 10 s.
  for (const Dispatch& d : first) h.running_[d.lane] = {d, h.clock_.Now() + seconds(1)};
  h.RunAll();
  EXPECT_EQ(h.clock_.Now(), seconds(10));
  EXPECT_EQ(h.records_.size(), 20u);
}

TEST(EngineTest, PackTimeSharesALaneInRequestOrder) {
  // 10 GiB of lanes cannot open a second 8 GiB lane: job 2 joins job 1's lane.
  Harness h("pack", {}, 12 * kGiB);
  ASSERT_TRUE(*h.Add(1, kGiB, 8 * kGiB, seconds(1), 3));
  ASSERT_TRUE(*h.Add(2, kGiB, 4 * kGiB, seconds(1), 3));
  ASSERT_EQ(h.engine_->Session(1)->lane, h.engine_->Session(2)->lane);
  h.RunAll();
  std::vector<SessionId> order;
  for (const auto& r : h.records_) order.push_back(r.session);
  EXPECT_EQ(order, (std::vector<SessionId>{1, 2, 1, 2, 1, 2}));
  // Back-to-back on one lane: no virtual time between iterations.
  for (const auto& r : h.records_) {
    if (!r.lane_first) {
      EXPECT_EQ(r.switch_gap, Nanos(0));
    }
  }
}

TEST(EngineTest, QueuedSessionAdmittedWhenMemoryReturns) {
  Harness h("pack", {}, 8 * kGiB);
  ASSERT_TRUE(*h.Add(1, 2 * kGiB, 5 * kGiB, seconds(1), 3));
  ASSERT_FALSE(*h.Add(2, 2 * kGiB, 5 * kGiB, seconds(1), 2));
  EXPECT_EQ(h.engine_->Session(2)->state, SessionState::kWaiting);
  h.RunAll();
  EXPECT_EQ(h.admitted_later_, (std::vector<SessionId>{2}));
  EXPECT_EQ(h.records_.size(), 5u);
  EXPECT_EQ(h.records_.back().finished_at, seconds(5));
  EXPECT_EQ(h.engine_->memory().CommittedBytes(), 0u);
}

TEST(EngineTest, RefusesWhatCanNeverFit) {
  Harness h("pack", {}, 8 * kGiB);
  auto r = h.Add(1, 4 * kGiB, 5 * kGiB, seconds(1), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(h.engine_->Sessions().empty());
}

TEST(EngineTest, RemovalDuringIterationWaitsForItsEnd) {
  Harness h("pack", {}, 8 * kGiB);
  ASSERT_TRUE(*h.Add(1, 2 * kGiB, 5 * kGiB, seconds(1), 100));
  ASSERT_FALSE(*h.Add(2, 2 * kGiB, 5 * kGiB, seconds(1), 1));
  auto ds = h.engine_->DispatchReady();
  ASSERT_EQ(ds.size(), 1u);
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  auto dropped = h.engine_->RemoveSession(1);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 1);                  // the queued request is dropped
  EXPECT_TRUE(h.admitted_later_.empty());  // memory still in use by the iteration
  // Closing, not gone: its state says so until the iteration ends.
  EXPECT_EQ(h.engine_->RequestIteration(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.engine_->RemoveSession(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.engine_->Session(1)->state, SessionState::kClosing);
  h.clock_.Advance(seconds(1));
  ASSERT_TRUE(h.engine_->Complete(ds[0]).ok());
  EXPECT_EQ(h.admitted_later_, (std::vector<SessionId>{2}));
  EXPECT_EQ(h.engine_->RequestIteration(1).code(), StatusCode::kNotFound);
}

TEST(EngineTest, ASessionTakenUpFromASnapshotCountsOnFromItsIterations) {
  Harness h("srtf");
  SessionSpec spec;
  spec.requirement = {kGiB, kGiB, mem::LaneClass::kBatch};
  spec.declared_iterations = 10;
  spec.iteration_time_hint = seconds(1);
  spec.iterations_done = 7;
  ASSERT_TRUE(*h.engine_->AddSession(1, spec));
  auto s = h.engine_->Session(1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->iterations_done, 7);
  EXPECT_DOUBLE_EQ(s->remaining_seconds, 3.0);  // SRTF sees what is left, not all of it
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  auto ds = h.engine_->DispatchReady();
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].iteration, 7u);
  spec.iterations_done = -1;
  EXPECT_EQ(h.engine_->AddSession(2, spec).status().code(), StatusCode::kInvalidArgument);
}

TEST(EngineTest, UncountedWorkIsNoIteration) {
  Harness h("srtf");
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 10));
  auto ds = h.engine_->DispatchReady();
  ASSERT_EQ(ds.size(), 1u);
  h.clock_.Advance(seconds(2));
  ASSERT_TRUE(h.engine_->Complete(ds[0]).ok());
  auto s = h.engine_->Session(1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->iterations_done, 1);
  EXPECT_DOUBLE_EQ(s->avg_iteration_seconds, 2.0);
  const double remaining = s->remaining_seconds;
  // A state-only request: it runs on the lane like an iteration, but is none.
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  ds = h.engine_->DispatchReady();
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].iteration, 1u);
  h.clock_.Advance(milliseconds(10));
  auto rec = h.engine_->Complete(ds[0], /*counted=*/false);
  ASSERT_TRUE(rec.ok());
  s = h.engine_->Session(1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->iterations_done, 1);
  EXPECT_DOUBLE_EQ(s->avg_iteration_seconds, 2.0);
  EXPECT_DOUBLE_EQ(s->remaining_seconds, remaining);
  // The next real iteration is still the second.
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  ds = h.engine_->DispatchReady();
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].iteration, 1u);
}

TEST(EngineTest, RejectsBadCalls) {
  Harness h("fair");
  EXPECT_EQ(h.engine_->RequestIteration(42).code(), StatusCode::kNotFound);
  EXPECT_EQ(h.engine_->RemoveSession(42).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 1));
  EXPECT_EQ(h.Add(1, kGiB, kGiB, seconds(1), 1).status().code(), StatusCode::kAlreadyExists);
  Dispatch bogus;
  bogus.session = 1;
  bogus.lane = 99;
  EXPECT_EQ(h.engine_->Complete(bogus).status().code(), StatusCode::kFailedPrecondition);
}

TEST(EngineTest, WorkConservingUnderRandomLoad) {
  // Seeded arrivals and departures under every policy; Step() checks after every dispatch
  // that no lane idles while it has a runnable session.
  // Clients turn replies around in 0-3 ms, some sessions are interactive: holds and lane
  // classes must not break it either.
  for (const char* policy : {"fifo", "srtf", "pack", "fair", "priority"}) {
    Harness h(policy, {}, 16 * kGiB);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> gib(1, 5), iters(1, 20), ms(10, 500), turn_us(0, 3000),
        prio(0, 3), cls(0, 3);
    SessionId next = 1;
    for (int round = 0; round < 40; ++round) {
      const auto lane_class = cls(rng) == 0 ? mem::LaneClass::kInteractive : mem::LaneClass::kBatch;
      auto r = h.Add(next, gib(rng) * kGiB / 2, gib(rng) * kGiB, milliseconds(ms(rng)), iters(rng),
                     prio(rng), std::chrono::microseconds(turn_us(rng)), lane_class);
      ASSERT_TRUE(r.ok()) << r.status();
      ++next;
      h.RunUntil(h.clock_.Now() + milliseconds(ms(rng) * 3));
    }
    h.RunAll();
    EXPECT_TRUE(h.engine_->Sessions().empty()) << policy;
    EXPECT_EQ(h.engine_->memory().CommittedBytes(), 0u) << policy;
    EXPECT_TRUE(h.engine_->memory().CheckInvariants().ok()) << policy;
    const HoldStats holds = h.engine_->Holds();
    const bool may_hold =
        std::string_view(policy) == "srtf" || std::string_view(policy) == "priority";
    if (may_hold) {
      EXPECT_GT(holds.started, 0u) << policy;
    } else {
      EXPECT_EQ(holds.started, 0u) << policy;
    }
    EXPECT_EQ(holds.started, holds.returned + holds.expired) << policy;
  }
}

// -- Note [Anticipation] --------------------------------------------------------------------

TEST(EngineAnticipationTest, WithoutItALongJobOvertakesASynchronousClient) {
  // The short client takes 1 ms to turn a reply around; with holds off, the long job's
  // queued iteration takes the lane at every such gap.
  Harness h("srtf", {{"max_hold_ms", 0}});
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 100));
  h.RunUntil(milliseconds(1500));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 4, 0, milliseconds(1)));
  h.RunUntil(seconds(12));
  EXPECT_EQ(h.Order(), (std::vector<SessionId>{1, 1, 2, 1, 2, 1, 2, 1, 2, 1, 1, 1}));
  EXPECT_EQ(h.engine_->Holds().started, 0u);
}

TEST(EngineAnticipationTest, SrtfHoldsTheLaneForTheShorterJob) {
  Harness h("srtf");  // max_hold 2 ms by default
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 100));
  h.RunUntil(milliseconds(1500));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 4, 0, milliseconds(1)));
  h.RunUntil(seconds(12));
  // The short job runs its 4 iterations back to back; the long one resumes after its last.
  EXPECT_EQ(h.Order(), (std::vector<SessionId>{1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1}));
  // Job 2's iterations start 1 ms (its turnaround) after the previous ends: the lane idled
  // exactly that long each time, and job 1 (its request queued all along) waited.
  const HoldStats holds = h.engine_->Holds();
  EXPECT_EQ(holds.started, 3u);
  EXPECT_EQ(holds.returned, 3u);
  EXPECT_EQ(holds.expired, 0u);
  EXPECT_EQ(holds.idle, milliseconds(3));
  for (size_t i = 3; i < 6; ++i) EXPECT_EQ(h.records_[i].switch_gap, milliseconds(1)) << i;
  // After its last declared iteration job 2 is not expected back: no hold, job 1 runs at once.
  EXPECT_EQ(h.records_[6].session, 1u);
  EXPECT_EQ(h.records_[6].started_at, h.records_[5].finished_at);
  // The window followed the observed gaps: 1 ms each.
  EXPECT_EQ(h.engine_->Session(2).status().code(), StatusCode::kNotFound);  // closed
}

TEST(EngineAnticipationTest, WindowIsLearnedFromTheSessionsGaps) {
  Harness h("srtf", {{"max_hold_ms", 10}});
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 1000));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 100, 0, milliseconds(3)));
  // No gap observed yet: the window is the cap.
  EXPECT_EQ(h.engine_->Session(2)->hold_window, milliseconds(10));
  h.RunUntil(seconds(30));
  const auto info = h.engine_->Session(2);
  ASSERT_TRUE(info.ok());
  EXPECT_GE(info->gaps_observed, 10u);
  EXPECT_EQ(info->hold_window, microseconds(3750));  // p90 of gaps of 3 ms, plus 25%
}

TEST(EngineAnticipationTest, MinHoldWidensTheWindow) {
  Harness h("srtf", {{"max_hold_ms", 10}, {"min_hold_ms", 5}});
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 1000));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 100, 0, milliseconds(3)));
  h.RunUntil(seconds(30));
  EXPECT_EQ(h.engine_->Session(2)->hold_window, milliseconds(5));
}

TEST(EngineAnticipationTest, HoldExpiresForASlowClientAndStopsAfterLearning) {
  // Turnaround 10 ms, cap 2 ms: the first hold (window = cap, nothing learned yet) expires;
  // once the median gap is above the cap the session is no longer held for.
  Harness h("srtf");
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 1000));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 5, 0, milliseconds(10)));
  h.RunUntil(seconds(20));
  const HoldStats holds = h.engine_->Holds();
  EXPECT_EQ(holds.started, 1u);
  EXPECT_EQ(holds.expired, 1u);
  EXPECT_EQ(holds.returned, 0u);
  EXPECT_EQ(holds.idle, milliseconds(2));
  // Job 2 ran first (shorter), then job 1 got the lane 2 ms later and every gap after it.
  EXPECT_EQ(h.records_[0].session, 2u);
  EXPECT_EQ(h.records_[1].session, 1u);
  EXPECT_EQ(h.records_[1].started_at, seconds(1) + milliseconds(2));
  EXPECT_EQ(h.records_[2].session, 2u);
  EXPECT_EQ(h.records_[3].session, 1u);
  EXPECT_EQ(h.records_[3].started_at, h.records_[2].finished_at);  // no hold any more
}

TEST(EngineAnticipationTest, HoldEndsWhenTheSessionCloses) {
  Harness h("srtf", {{"max_hold_ms", 1000}});
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 100));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 10, 0, seconds(100)));  // never back in time
  auto first = h.engine_->DispatchReady();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].session, 2u);
  h.clock_.Advance(seconds(1));
  ASSERT_TRUE(h.engine_->Complete(first[0]).ok());
  EXPECT_TRUE(h.engine_->DispatchReady().empty());  // held for job 2
  EXPECT_EQ(h.engine_->HeldLanes().size(), 1u);
  EXPECT_EQ(h.engine_->NextHoldDeadline(), seconds(2));
  h.clock_.Advance(milliseconds(5));
  ASSERT_TRUE(h.engine_->RemoveSession(2).ok());
  auto next = h.engine_->DispatchReady();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].session, 1u);
  EXPECT_EQ(next[0].started_at, seconds(1) + milliseconds(5));
  EXPECT_FALSE(h.engine_->NextHoldDeadline().has_value());
  EXPECT_EQ(h.engine_->Holds().expired, 1u);
}

TEST(EngineAnticipationTest, FairAndPackNeverHold) {
  for (const char* policy : {"fair", "pack"}) {
    Harness h(policy, {}, 12 * kGiB);  // one lane of 8 GiB: both share it
    ASSERT_TRUE(*h.Add(1, kGiB, 8 * kGiB, seconds(1), 20));
    ASSERT_TRUE(*h.Add(2, kGiB, 4 * kGiB, seconds(1), 5, 0, milliseconds(1)));
    h.RunAll();
    EXPECT_EQ(h.engine_->Holds().started, 0u) << policy;
    EXPECT_EQ(h.engine_->Session(1).status().code(), StatusCode::kNotFound);
  }
}

// -- Priority and latency classes -----------------------------------------------------------

TEST(EnginePriorityTest, StrictPriorityWithinTheBatchLane) {
  Harness h("priority");
  ASSERT_TRUE(*h.Add(1, kGiB, kGiB, seconds(1), 3, /*priority=*/0));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 6, /*priority=*/0));
  ASSERT_TRUE(*h.Add(3, kGiB, kGiB, seconds(1), 10, /*priority=*/1));
  h.RunAll();
  // Level 1 first (however long), then level 0 shortest first.
  std::vector<SessionId> expect(10, 3);
  expect.insert(expect.end(), 3, 1);
  expect.insert(expect.end(), 6, 2);
  EXPECT_EQ(h.Order(), expect);
  EXPECT_EQ(h.concurrent_max_, 1u);
}

TEST(EnginePriorityTest, InteractiveSessionsGetTheirOwnLane) {
  for (const char* policy : {"priority", "srtf", "pack", "fair"}) {
    Harness h(policy, {}, 12 * kGiB);
    ASSERT_TRUE(*h.Add(1, kGiB, 2 * kGiB, seconds(1), 5));
    ASSERT_TRUE(*h.Add(2, kGiB, 2 * kGiB, seconds(1), 5));
    ASSERT_TRUE(*h.Add(3, kGiB, kGiB, milliseconds(10), 5, 0, milliseconds(50),
                       mem::LaneClass::kInteractive));
    const auto s1 = *h.engine_->Session(1), s3 = *h.engine_->Session(3);
    EXPECT_NE(s1.lane, s3.lane) << policy;
    EXPECT_EQ(s3.lane_class, mem::LaneClass::kInteractive);
    for (const mem::LaneInfo& l : h.engine_->memory().Lanes()) {
      for (SessionId m : l.sessions) {
        EXPECT_EQ(l.lane_class, h.engine_->Session(m)->lane_class) << policy;
      }
    }
    h.RunAll();
    // The interactive iterations never waited for a batch one: each started when requested.
    for (const IterationRecord& r : h.records_) {
      if (r.session == 3) {
        EXPECT_EQ(r.queue_delay, Nanos(0)) << policy;
        EXPECT_EQ(r.lane_class, mem::LaneClass::kInteractive);
      }
    }
  }
}

TEST(EnginePriorityTest, SecondInteractiveSessionJoinsTheInteractiveLaneUnderSingleLane) {
  Harness h("priority", {}, 12 * kGiB);
  ASSERT_TRUE(*h.Add(1, kGiB, 2 * kGiB, seconds(1), 5));
  ASSERT_TRUE(*h.Add(2, kGiB, kGiB, seconds(1), 5, 0, Nanos(0), mem::LaneClass::kInteractive));
  ASSERT_TRUE(*h.Add(3, kGiB, 3 * kGiB, seconds(1), 5, 0, Nanos(0), mem::LaneClass::kInteractive));
  EXPECT_EQ(h.engine_->Session(2)->lane, h.engine_->Session(3)->lane);
  EXPECT_EQ(h.engine_->memory().Lanes().size(), 2u);
  EXPECT_TRUE(h.engine_->memory().CheckInvariants().ok());
  h.RunAll();
}

}  // namespace
}  // namespace salus::sched
