// Algorithm 1 (one table case per branch), the admission modes and the admission queue.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace salus::mem {
namespace {

using testing::Harness;
constexpr uint64_t M = kMiB;

// A step of a scenario's set-up: admit (P, E) as session `id` (must be admitted at once), or
// release session `id` (p and e unused).
struct Op {
  enum { kAdmit, kRelease } kind;
  SessionId id;
  uint64_t p = 0;
  uint64_t e = 0;
};

enum class Expect { kNewLane, kJoin, kGrow, kWait };

struct Case {
  std::string name;
  std::vector<Op> setup;
  uint64_t p, e;  // the arriving session
  Expect expect;
  SessionId lane_of = 0;   // kJoin/kGrow: the lane of this set-up session
  uint64_t lane_size = 0;  // the lane's size afterwards
};

class Algorithm1Test : public ::testing::TestWithParam<Case> {};

TEST_P(Algorithm1Test, Decides) {
  const Case& c = GetParam();
  Harness h(100 * M);
  std::map<SessionId, LaneId> lane_of;
  for (const Op& op : c.setup) {
    if (op.kind == Op::kAdmit) {
      lane_of[op.id] = h.AdmitNow(op.id, op.p * M, op.e * M);
    } else {
      ASSERT_TRUE(h.Release(op.id).ok());
    }
  }
  const size_t lanes_before = h.manager->Lanes().size();
  auto g = h.manager->Admit(99, {c.p * M, c.e * M});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(h.manager->CheckInvariants().ok()) << h.manager->CheckInvariants();
  EXPECT_LE(h.manager->CommittedBytes(), 100 * M);
  switch (c.expect) {
    case Expect::kWait:
      EXPECT_FALSE(g->has_value());
      EXPECT_EQ(h.manager->WaitingCount(), 1u);
      EXPECT_EQ(h.manager->Lanes().size(), lanes_before);
      return;
    case Expect::kNewLane:
      ASSERT_TRUE(g->has_value());
      EXPECT_EQ(h.manager->Lanes().size(), lanes_before + 1);
      EXPECT_EQ(h.LaneSize((*g)->lane), c.e * M);
      for (const auto& [s, l] : lane_of) EXPECT_NE(l, (*g)->lane);
      return;
    case Expect::kJoin:
    case Expect::kGrow:
      ASSERT_TRUE(g->has_value());
      EXPECT_EQ(h.manager->Lanes().size(), lanes_before);
      EXPECT_EQ((*g)->lane, lane_of.at(c.lane_of));
      EXPECT_EQ(h.LaneSize((*g)->lane), c.lane_size * M);
      return;
  }
}

// C = 100MiB in every case; sizes in MiB.
INSTANTIATE_TEST_SUITE_P(
    Branches, Algorithm1Test,
    ::testing::Values(
        // Step 1: an empty device opens the first lane.
        Case{"EmptyDeviceOpensALane", {}, 10, 20, Expect::kNewLane},
        // Step 1: 10+20 admitted, 10+20 more still fits beside them: a second lane.
        Case{"RoomForAnotherLane", {{Op::kAdmit, 1, 10, 20}}, 10, 20, Expect::kNewLane},
        // Step 1 at the edge: ΣP + P + ΣL + E = 100 = C exactly.
        Case{"NewLaneFillsTheDeviceExactly", {{Op::kAdmit, 1, 20, 30}}, 20, 30, Expect::kNewLane},
        // Step 2: no room for a lane of 15 (105 > 100); lanes of 30 and 20 both hold 15, the
        // smaller (20) is the best match.
        Case{"JoinsTheSmallestLaneThatHoldsE",
             {{Op::kAdmit, 1, 10, 30}, {Op::kAdmit, 2, 10, 20}},
             20,
             15,
             Expect::kJoin,
             2,
             20},
        // Step 2: a lane of exactly E is a match, and the lane keeps its size.
        Case{"JoinsALaneOfExactlyE",
             {{Op::kAdmit, 1, 10, 30}, {Op::kAdmit, 2, 10, 20}},
             30,
             20,
             Expect::kJoin,
             2,
             20},
        // Step 3: no lane holds 35; growing the 10 lane needs 105, growing the 20 lane 95: it
        // grows to 35.
        Case{"GrowsTheSmallestLaneThatMakesRoom",
             {{Op::kAdmit, 1, 10, 10}, {Op::kAdmit, 2, 10, 20}},
             30,
             35,
             Expect::kGrow,
             2,
             35},
        // Step 3: the smallest lane (10) is enough: 45 + 30 - 10 + 30 = 95.
        Case{"GrowsTheSmallestLaneWhenItSuffices",
             {{Op::kAdmit, 1, 10, 10}, {Op::kAdmit, 2, 10, 20}},
             25,
             30,
             Expect::kGrow,
             1,
             30},
        // Step 4: no lane holds 40 and none can grow to 40 (needs a lane of at least 35).
        Case{"WaitsWhenNoLaneCanGrow",
             {{Op::kAdmit, 1, 30, 30}, {Op::kAdmit, 2, 10, 20}},
             5,
             40,
             Expect::kWait},
        // Step 4: a lane holds E = 5, but P = 30 does not fit beside ΣP + ΣL = 80 (joining
        // would break the safety condition).
        Case{"WaitsWhenPDoesNotFitBesideTheLanes", {{Op::kAdmit, 1, 40, 40}}, 30, 5, Expect::kWait},
        // Footprint: releasing session 2 leaves a 20MiB hole in the persistent region; a P of
        // 20 reuses it and a new lane fits.
        Case{"PersistentHoleIsReused",
             {{Op::kAdmit, 1, 20, 5},
              {Op::kAdmit, 2, 20, 5},
              {Op::kAdmit, 3, 20, 5},
              {Op::kRelease, 2}},
             20,
             5,
             Expect::kNewLane},
        // Footprint: a P of 30 fits no hole and extends the region to 90, so no new lane of 5
        // fits (105 > 100) and it joins a lane of 5 instead.
        Case{"PersistentHoleTooSmallCountsTheFootprint",
             {{Op::kAdmit, 1, 20, 5},
              {Op::kAdmit, 2, 20, 5},
              {Op::kAdmit, 3, 20, 5},
              {Op::kRelease, 2}},
             30,
             5,
             Expect::kJoin,
             1,
             5}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(AdmissionTest, NeverFitsIsRefusedAtOnceInHumanUnits) {
  Harness h(4 * kGiB);
  const auto g = h.manager->Admit(1, {3 * kGiB, 1536 * kMiB});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted);
  const std::string m = g.status().message();
  EXPECT_NE(m.find("P = 3GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("E = 1.5GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("C = 4GiB"), std::string::npos) << m;
  EXPECT_EQ(h.manager->WaitingCount(), 0u);
  // Overflowing sizes are refused, not wrapped.
  EXPECT_EQ(h.manager->Admit(2, {UINT64_MAX, UINT64_MAX}).status().code(),
            StatusCode::kResourceExhausted);
  // Exactly C fits.
  EXPECT_NE(h.AdmitNow(3, 3 * kGiB, kGiB), 0u);
}

TEST(AdmissionTest, SizesAreRoundedToTheArenaAlignment) {
  Harness h(kMiB);
  ASSERT_NE(h.AdmitNow(1, 1, 1000), 0u);
  EXPECT_EQ(h.manager->CommittedBytes(), kArenaAlignment + 1024);
  auto block = h.manager->Persistent(1);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->offset % kArenaAlignment, 0u);
  EXPECT_EQ(block->size, kArenaAlignment);
}

TEST(AdmissionTest, DuplicatesAndUnknownSessions) {
  Harness h(100 * M);
  h.AdmitNow(1, 60 * M, 10 * M);
  h.AdmitWaits(2, 60 * M, 10 * M);
  EXPECT_EQ(h.manager->Admit(1, {M, M}).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(h.manager->Admit(2, {M, M}).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(h.Release(7).code(), StatusCode::kNotFound);
  EXPECT_EQ(h.manager->Persistent(7).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(h.manager->Persistent(2).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.manager->Admit(3, {M, M}, Nanos(-1)).status().code(), StatusCode::kInvalidArgument);
}

TEST(AdmissionTest, CreateRefusesBadOptionsAndNamesTheArenaSize) {
  device::FakeMemoryProvider fake({.device_bytes = 8 * kGiB, .fuse = std::nullopt});
  MemoryManager::Options o;
  o.capacity = kGiB;
  o.rule = sched::PackRule();
  EXPECT_EQ(MemoryManager::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.provider = &fake;
  o.rule = nullptr;
  EXPECT_EQ(MemoryManager::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.rule = sched::PackRule();
  o.overcommit = 0.5;
  EXPECT_EQ(MemoryManager::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.overcommit = 1.0;
  o.capacity = 0;
  EXPECT_EQ(MemoryManager::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.capacity = kGiB + 1;
  EXPECT_EQ(MemoryManager::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.capacity = 16 * kGiB;
  const auto m = MemoryManager::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find("16GiB"), std::string::npos) << m.status();
  // The arena goes back to the provider with the manager.
  o.capacity = 4 * kGiB;
  {
    auto ok = MemoryManager::Create(o);
    ASSERT_TRUE(ok.ok());
    EXPECT_EQ(fake.live_bytes(), 4 * kGiB);
  }
  EXPECT_EQ(fake.live_bytes(), 0u);
}

TEST(AdmissionRuleTest, SingleLaneGrowsToTheLargestE) {
  Harness h(100 * M, sched::SingleLaneRule());
  const LaneId lane = h.AdmitNow(1, 10 * M, 20 * M);
  // ΣP + P + max(L, E) = 20 + 30 = 50: admitted into the same lane, grown to 30.
  EXPECT_EQ(h.AdmitNow(2, 10 * M, 30 * M), lane);
  EXPECT_EQ(h.LaneSize(lane), 30 * M);
  // A smaller E joins without growing.
  EXPECT_EQ(h.AdmitNow(3, 10 * M, 5 * M), lane);
  EXPECT_EQ(h.manager->Lanes().size(), 1u);
  // 30 + 40 + max(30, 40) = 110 > 100: waits, although two lanes of Algorithm 1 would not help.
  h.AdmitWaits(4, 40 * M, 40 * M);
  // 30 + 35 + 35 = 100: fits, growing the lane to 35.
  EXPECT_EQ(h.AdmitNow(5, 35 * M, 35 * M), lane);
  EXPECT_EQ(h.manager->CommittedBytes(), 100 * M);
  EXPECT_TRUE(h.manager->CheckInvariants().ok());
}

TEST(AdmissionRuleTest, ExclusiveAdmitsOneSessionAtATime) {
  Harness h(100 * M, sched::ExclusiveRule());
  const LaneId first = h.AdmitNow(1, 10 * M, 10 * M);
  h.AdmitWaits(2, 10 * M, 10 * M);
  h.AdmitWaits(3, M, M);
  ASSERT_TRUE(h.Release(1).ok());
  // The queue is tried in order: 2 gets the device, 3 still waits.
  ASSERT_EQ(h.admitted.size(), 1u);
  EXPECT_EQ(h.admitted[0].session, 2u);
  EXPECT_NE(h.admitted[0].lane, first);
  EXPECT_EQ(h.manager->WaitingCount(), 1u);
  EXPECT_EQ(h.manager->Lanes().size(), 1u);
}

// Note [Jobs]: the exclusive rule's tenant is the job. A job's sessions share one lane per
// class (grown to the largest E); another job, and a session of no job, wait for all of them.
TEST(AdmissionRuleTest, ExclusiveAdmitsOneJobAtATime) {
  Harness h(100 * M, sched::ExclusiveRule());
  const auto of_job = [](uint64_t p, uint64_t e, uint64_t job, LaneClass cls = LaneClass::kBatch) {
    Requirement r{p * M, e * M, cls};
    r.job = job;
    return r;
  };
  const LaneId lane = h.AdmitNow(1, of_job(10, 10, 7));
  EXPECT_EQ(h.AdmitNow(2, of_job(10, 30, 7)), lane);  // its job's lane, grown to 30
  EXPECT_EQ(h.LaneSize(lane), 30 * M);
  h.AdmitWaits(3, of_job(10, 10, 8));
  h.AdmitWaits(4, of_job(10, 10, 0));
  EXPECT_EQ(h.AdmitNow(5, of_job(5, 5, 7)), lane);  // joins without growing
  // An interactive session of the job gets the job's lane of that class.
  const LaneId interactive = h.AdmitNow(9, of_job(5, 5, 7, LaneClass::kInteractive));
  EXPECT_NE(interactive, lane);
  EXPECT_EQ(h.manager->Lanes().size(), 2u);
  // Its own job still needs the room: F + ΣL - L + max(L, E) = 90 + 35 - 30 + 35 > 100, and
  // stays above 100 while any of the job's sessions is resident.
  h.AdmitWaits(6, of_job(60, 35, 7));
  EXPECT_TRUE(h.manager->CheckInvariants().ok()) << h.manager->CheckInvariants();
  for (const SessionId s : {1, 2, 5, 9}) ASSERT_TRUE(h.Release(s).ok());
  // Job 7 left the device: the queue in order gives it to job 8; the session of no job and
  // job 7's late session wait for it.
  ASSERT_EQ(h.admitted.size(), 1u);
  EXPECT_EQ(h.admitted[0].session, 3u);
  ASSERT_TRUE(h.Release(3).ok());
  ASSERT_EQ(h.admitted.size(), 2u);
  EXPECT_EQ(h.admitted[1].session, 4u);
  ASSERT_TRUE(h.Release(4).ok());
  ASSERT_EQ(h.admitted.size(), 3u);
  EXPECT_EQ(h.admitted[2].session, 6u);
  EXPECT_TRUE(h.manager->CheckInvariants().ok()) << h.manager->CheckInvariants();
}

TEST(AdmissionQueueTest, RetriedInOrderOnEveryRelease) {
  Harness h(100 * M);
  h.AdmitNow(1, 50 * M, 40 * M);  // 90 committed
  h.AdmitWaits(2, 20 * M, 20 * M);
  h.AdmitWaits(3, 15 * M, 30 * M);
  h.AdmitWaits(4, 95 * M, 5 * M);  // can only run alone
  ASSERT_TRUE(h.Release(1).ok());
  // In order: 2 (40) and then 3 (45) fit; 4 does not, and does not block 3.
  ASSERT_EQ(h.admitted.size(), 2u);
  EXPECT_EQ(h.admitted[0].session, 2u);
  EXPECT_EQ(h.admitted[1].session, 3u);
  EXPECT_EQ(h.manager->WaitingCount(), 1u);
  ASSERT_TRUE(h.Release(2).ok());
  EXPECT_EQ(h.admitted.size(), 2u);
  ASSERT_TRUE(h.Release(3).ok());
  ASSERT_EQ(h.admitted.size(), 3u);
  EXPECT_EQ(h.admitted[2].session, 4u);
  EXPECT_TRUE(h.manager->Persistent(4).ok());
  EXPECT_EQ(h.manager->WaitingCount(), 0u);
}

TEST(AdmissionQueueTest, CancelReportsCancelled) {
  Harness h(100 * M);
  h.AdmitNow(1, 90 * M, 10 * M);
  h.AdmitWaits(2, 10 * M, 10 * M);
  h.CancelWaiting(2);
  h.CancelWaiting(2);  // no longer waiting: nothing to report
  h.CancelWaiting(1);  // admitted, not waiting: nothing
  ASSERT_EQ(h.failed.size(), 1u);
  EXPECT_EQ(h.failed[0].first, 2u);
  EXPECT_EQ(h.failed[0].second.code(), StatusCode::kCancelled);
  EXPECT_EQ(h.manager->WaitingCount(), 0u);
  ASSERT_TRUE(h.Release(1).ok());
  EXPECT_TRUE(h.admitted.empty());
  // Release of a waiting session cancels it too.
  h.AdmitNow(3, 90 * M, 10 * M);
  h.AdmitWaits(4, 10 * M, 10 * M);
  EXPECT_TRUE(h.Release(4).ok());
  ASSERT_EQ(h.failed.size(), 2u);
  EXPECT_EQ(h.failed[1].second.code(), StatusCode::kCancelled);
}

TEST(AdmissionQueueTest, TimeoutOnTheInjectedClock) {
  Harness h(100 * M);
  h.AdmitNow(1, 90 * M, 10 * M);
  h.AdmitWaits(2, 10 * M, 10 * M, std::chrono::seconds(5));
  h.AdmitWaits(3, 10 * M, 10 * M);  // no timeout
  h.clock.Advance(std::chrono::seconds(4));
  h.ExpireWaiting();
  EXPECT_TRUE(h.failed.empty());
  h.clock.Advance(std::chrono::seconds(1));
  h.ExpireWaiting();
  ASSERT_EQ(h.failed.size(), 1u);
  EXPECT_EQ(h.failed[0].first, 2u);
  EXPECT_EQ(h.failed[0].second.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(h.manager->WaitingCount(), 1u);
  ASSERT_TRUE(h.Release(1).ok());
  ASSERT_EQ(h.admitted.size(), 1u);
  EXPECT_EQ(h.admitted[0].session, 3u);
}

TEST(AdmissionQueueTest, ARequestPastItsDeadlineIsNotAdmittedByARetry) {
  Harness h(100 * M);
  h.AdmitNow(1, 90 * M, 10 * M);
  h.AdmitWaits(2, 10 * M, 10 * M, std::chrono::seconds(1));
  h.clock.Advance(std::chrono::seconds(2));
  ASSERT_TRUE(h.Release(1).ok());
  EXPECT_TRUE(h.admitted.empty());
  h.ExpireWaiting();
  ASSERT_EQ(h.failed.size(), 1u);
  EXPECT_EQ(h.failed[0].second.code(), StatusCode::kDeadlineExceeded);
}

// Each call returns what it did to the queue, and only that: a cancel its one failure, a
// release the sessions it admitted, in queue order, with their grants.
TEST(AdmissionQueueTest, CallsReturnTheEventsTheyCause) {
  device::FakeMemoryProvider fake;
  MemoryManager::Options o;
  o.provider = &fake;
  o.capacity = 100 * M;
  o.rule = sched::PackRule();
  auto m = std::move(MemoryManager::Create(o)).value();
  ASSERT_TRUE(m->Admit(1, {90 * M, 10 * M}).ok());
  ASSERT_TRUE(m->Admit(2, {10 * M, 10 * M}).ok());
  ASSERT_TRUE(m->Admit(3, {80 * M, 5 * M}).ok());
  ASSERT_TRUE(m->Admit(4, {95 * M, 5 * M}).ok());
  EXPECT_EQ(m->WaitingCount(), 3u);
  AdmissionEvents cancelled = m->CancelWaiting(4);
  EXPECT_TRUE(cancelled.admitted.empty());
  ASSERT_EQ(cancelled.failed.size(), 1u);
  EXPECT_EQ(cancelled.failed[0].first, 4u);
  EXPECT_EQ(cancelled.failed[0].second.code(), StatusCode::kCancelled);
  EXPECT_TRUE(m->CancelWaiting(4).empty());  // no longer waiting: nothing
  auto released = m->Release(1);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_TRUE(released->failed.empty());
  ASSERT_EQ(released->admitted.size(), 2u);
  EXPECT_EQ(released->admitted[0].session, 2u);
  EXPECT_EQ(released->admitted[1].session, 3u);
  for (const Grant& g : released->admitted) {
    EXPECT_NE(g.lane, 0u);
    EXPECT_TRUE(m->Persistent(g.session).ok());
  }
  EXPECT_EQ(m->WaitingCount(), 0u);
  EXPECT_TRUE(m->ExpireWaiting().empty());
}

}  // namespace
}  // namespace salus::mem
