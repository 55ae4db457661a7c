// Lanes over their life: grow and shrink at the next boundary, close, slide down, and the
// physical hazards that make BeginIteration and Persistent wait (Note [Lane placement]).
#include <gtest/gtest.h>

#include "mem/lane_allocator.h"
#include "test_util.h"

namespace salus::mem {
namespace {

using testing::Harness;
constexpr uint64_t M = kMiB;

TEST(LaneLifecycleTest, GrowIsCommittedAtOnceAndAppliedAtTheNextBoundary) {
  Harness h(100 * M);
  const LaneId a = h.AdmitNow(1, 10 * M, 10 * M);
  h.AdmitNow(2, 10 * M, 20 * M);  // lane b
  auto it = h.manager->BeginIteration(a);
  ASSERT_TRUE(it.ok()) << it.status();
  EXPECT_EQ(it->size, 10 * M);
  // Algorithm 1 step 3: no room for a new lane of 30 (105 > 100) and no lane holds 30;
  // growing lane a, the smallest, gives 45 + 30 - 10 + 30 = 95: a grows to 30.
  ASSERT_EQ(h.AdmitNow(3, 25 * M, 30 * M), a);
  EXPECT_EQ(h.LaneSize(a), 30 * M);
  EXPECT_EQ(h.manager->CommittedBytes(), 45 * M + 50 * M);
  // The running iteration keeps its place and size.
  EXPECT_EQ(it->allocator->size(), 10 * M);
  EXPECT_EQ(it->allocator->Allocate(11 * M).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(h.manager->EndIteration(a).ok());
  auto next = h.manager->BeginIteration(a);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->size, 30 * M);
  EXPECT_TRUE(next->allocator->Allocate(30 * M).ok());
  ASSERT_TRUE(h.manager->EndIteration(a).ok());
}

TEST(LaneLifecycleTest, ShrinksToTheLargestRemainingEAndClosesWhenEmpty) {
  Harness h(100 * M);
  const LaneId a = h.AdmitNow(1, 40 * M, 30 * M);
  ASSERT_EQ(h.AdmitNow(2, 25 * M, 10 * M), a);  // 65 + 30 + 10 > 100: joins
  ASSERT_TRUE(h.Release(1).ok());
  EXPECT_EQ(h.LaneSize(a), 10 * M);
  EXPECT_EQ(h.manager->CommittedBytes(), 35 * M);
  auto it = h.manager->BeginIteration(a);
  ASSERT_TRUE(it.ok());
  EXPECT_EQ(it->size, 10 * M);
  ASSERT_TRUE(h.manager->EndIteration(a).ok());
  ASSERT_TRUE(h.Release(2).ok());
  EXPECT_TRUE(h.manager->Lanes().empty());
  EXPECT_EQ(h.manager->CommittedBytes(), 0u);
  EXPECT_EQ(h.manager->BeginIteration(a).status().code(), StatusCode::kNotFound);
}

TEST(LaneLifecycleTest, LanesAboveAClosedLaneSlideDownAtTheirNextBoundary) {
  Harness h(100 * M);
  const LaneId a = h.AdmitNow(1, 0, 10 * M);
  const LaneId b = h.AdmitNow(2, 0, 20 * M);
  const LaneId c = h.AdmitNow(3, 0, 30 * M);
  EXPECT_EQ(h.LaneOffset(b), 10 * M);
  EXPECT_EQ(h.LaneOffset(c), 30 * M);
  auto ib = h.manager->BeginIteration(b);
  auto ic = h.manager->BeginIteration(c);
  ASSERT_TRUE(ib.ok() && ic.ok());
  EXPECT_EQ(ib->base, 10 * M);
  EXPECT_EQ(ic->base, 30 * M);
  ASSERT_TRUE(h.Release(1).ok());  // lane a closes
  (void)a;
  EXPECT_EQ(h.LaneOffset(b), 0u);
  EXPECT_EQ(h.LaneOffset(c), 20 * M);
  // b slides to 0 at its next boundary; c is still running at 30, which b no longer touches.
  ASSERT_TRUE(h.manager->EndIteration(b).ok());
  ib = h.manager->BeginIteration(b);
  ASSERT_TRUE(ib.ok()) << ib.status();
  EXPECT_EQ(ib->base, 0u);
  ASSERT_TRUE(h.manager->EndIteration(c).ok());
  ic = h.manager->BeginIteration(c);
  ASSERT_TRUE(ic.ok()) << ic.status();
  EXPECT_EQ(ic->base, 20 * M);
  EXPECT_EQ(ic->address, ib->address + 20 * M);
  // The free ephemeral space is one range again: [50, 100).
  const nlohmann::json map = h.manager->MemoryMap();
  ASSERT_EQ(map["free_ranges"].size(), 1u) << map.dump();
  EXPECT_EQ(map["free_ranges"][0]["offset"], 50 * M);
  ASSERT_TRUE(h.manager->EndIteration(b).ok());
  ASSERT_TRUE(h.manager->EndIteration(c).ok());
}

TEST(LaneLifecycleTest, BeginIsUnavailableWhileALaneMidIterationHoldsTheRange) {
  Harness h(100 * M);
  h.AdmitNow(1, 0, 10 * M);                   // lane a [0, 10)
  const LaneId b = h.AdmitNow(2, 0, 20 * M);  // lane b [10, 30)
  ASSERT_TRUE(h.manager->BeginIteration(b).ok());
  ASSERT_TRUE(h.Release(1).ok());             // b's layout place is now [0, 20)
  const LaneId c = h.AdmitNow(3, 0, 15 * M);  // c's layout place [20, 35) overlaps b's run
  const auto ic = h.manager->BeginIteration(c);
  ASSERT_FALSE(ic.ok());
  EXPECT_EQ(ic.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(ic.status().message().find("lane " + std::to_string(b)), std::string::npos)
      << ic.status();
  ASSERT_TRUE(h.manager->EndIteration(b).ok());
  auto ok = h.manager->BeginIteration(c);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->base, 20 * M);
  // b now starts at its new place, clear of c.
  auto ib = h.manager->BeginIteration(b);
  ASSERT_TRUE(ib.ok()) << ib.status();
  EXPECT_EQ(ib->base, 0u);
  EXPECT_TRUE(h.manager->CheckInvariants().ok());
}

TEST(LaneLifecycleTest, BlockInSpaceALaneStillRunsInWaitsForItsIterationToEnd) {
  Harness h(100 * M);
  h.AdmitNow(1, 0, 50 * M);                   // lane a [0, 50)
  const LaneId b = h.AdmitNow(2, 0, 40 * M);  // lane b [50, 90)
  ASSERT_TRUE(h.manager->BeginIteration(b).ok());
  ASSERT_TRUE(h.Release(1).ok());  // 50 free, but at [0, 50) until b slides down
  // 50 + 40 + 10 = 100: admitted; its block [50, 100) is where b runs now.
  const LaneId c = h.AdmitNow(3, 50 * M, 10 * M);
  const auto block = h.manager->Persistent(3);
  ASSERT_FALSE(block.ok());
  EXPECT_EQ(block.status().code(), StatusCode::kUnavailable) << block.status();
  EXPECT_EQ(h.manager->BeginIteration(c, 3).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(h.manager->MemoryMap()["persistent_blocks"][0]["state"], "pending");
  EXPECT_TRUE(h.manager->CheckInvariants().ok()) << h.manager->CheckInvariants();
  ASSERT_TRUE(h.manager->EndIteration(b).ok());
  auto placed = h.manager->Persistent(3);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->offset, 50 * M);
  EXPECT_TRUE(h.manager->BeginIteration(c, 3).ok());
  auto ib = h.manager->BeginIteration(b);
  ASSERT_TRUE(ib.ok()) << ib.status();
  EXPECT_EQ(ib->base, 0u);
}

TEST(LaneLifecycleTest, ReleaseMidIterationKeepsTheBlockAndLaneUntilTheIterationEnds) {
  Harness h(100 * M);
  const LaneId a = h.AdmitNow(1, 60 * M, 40 * M);
  auto it = h.manager->BeginIteration(a, 1);
  ASSERT_TRUE(it.ok());
  ASSERT_TRUE(it->allocator->Allocate(M).ok());
  ASSERT_TRUE(h.Release(1).ok());
  EXPECT_TRUE(h.manager->Lanes().empty());
  EXPECT_EQ(h.manager->CommittedBytes(), 0u);
  // The same sizes are admitted at once, into the places still in use.
  const LaneId b = h.AdmitNow(2, 60 * M, 40 * M);
  EXPECT_EQ(h.manager->Persistent(2).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(h.manager->BeginIteration(b).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(h.manager->BeginIteration(a).status().code(), StatusCode::kFailedPrecondition);
  const nlohmann::json map = h.manager->MemoryMap();
  EXPECT_EQ(map["lanes"].size(), 2u) << map.dump();  // b, and a draining
  ASSERT_TRUE(h.manager->EndIteration(a).ok());
  EXPECT_TRUE(h.manager->Persistent(2).ok());
  EXPECT_TRUE(h.manager->BeginIteration(b).ok());
  EXPECT_EQ(h.manager->EndIteration(a).code(), StatusCode::kNotFound);
  // The closed lane's allocations stay in the ephemeral region's statistics.
  const MemoryStatsSnapshot s = h.manager->StatsSnapshot();
  EXPECT_EQ(s.ephemeral.allocated_bytes, M);
  EXPECT_EQ(s.ephemeral.freed_bytes, M);
  EXPECT_TRUE(h.manager->CheckInvariants().ok());
}

TEST(LaneLifecycleTest, OneIterationPerLaneAtATime) {
  Harness h(100 * M);
  const LaneId a = h.AdmitNow(1, 0, 10 * M);
  h.AdmitNow(2, 0, 10 * M);
  EXPECT_EQ(h.manager->EndIteration(a).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(h.manager->BeginIteration(a).ok());
  EXPECT_EQ(h.manager->BeginIteration(a).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.manager->BeginIteration(a, 2).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(h.manager->EndIteration(a).ok());
  EXPECT_EQ(h.manager->BeginIteration(a, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.manager->BeginIteration(77).status().code(), StatusCode::kNotFound);
}

TEST(LaneLifecycleTest, EndIterationReleasesEverything) {
  Harness h(100 * M);
  const LaneId a = h.AdmitNow(1, 10 * M, 20 * M);
  auto it = h.manager->BeginIteration(a, 1);
  ASSERT_TRUE(it.ok());
  ASSERT_TRUE(it->allocator->ReservePlan(8 * M).ok());
  ASSERT_TRUE(it->allocator->AllocatePlanned(0, 4 * M).ok());
  ASSERT_TRUE(it->allocator->Allocate(12 * M).ok());
  EXPECT_EQ(it->allocator->Allocate(M).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(h.manager->EndIteration(a).ok());
  it = h.manager->BeginIteration(a, 1);
  ASSERT_TRUE(it.ok());
  EXPECT_TRUE(it->allocator->Allocate(20 * M).ok());
  ASSERT_TRUE(h.manager->EndIteration(a).ok());

  const MemoryStatsSnapshot s = h.manager->StatsSnapshot();
  ASSERT_EQ(s.sessions.size(), 1u);
  EXPECT_EQ(s.sessions[0].ephemeral.allocated_bytes, 36 * M);
  EXPECT_EQ(s.sessions[0].ephemeral.freed_bytes, 36 * M);
  EXPECT_EQ(s.sessions[0].ephemeral.allocation_count, 3u);
  EXPECT_EQ(s.sessions[0].ephemeral.peak_bytes, 20 * M);
  EXPECT_EQ(s.sessions[0].persistent.current_bytes, 10 * M);
  ASSERT_EQ(s.lanes.size(), 1u);
  EXPECT_EQ(s.lanes[0].ephemeral.peak_bytes, 20 * M);
  EXPECT_EQ(s.lanes[0].ephemeral.current_bytes, 0u);
  EXPECT_EQ(s.ephemeral.peak_bytes, 20 * M);
  EXPECT_EQ(s.persistent.current_bytes, 10 * M);
}

TEST(LaneLifecycleTest, StatsAndMemoryMapAsJson) {
  Harness h(100 * M);
  const LaneId a = h.AdmitNow(1, 10 * M, 20 * M);
  h.AdmitNow(2, 5 * M, 30 * M);
  auto it = h.manager->BeginIteration(a);
  ASSERT_TRUE(it.ok());
  ASSERT_TRUE(it->allocator->Allocate(M).ok());

  const nlohmann::json stats = h.manager->Stats();
  EXPECT_EQ(stats["capacity"], 100 * M);
  EXPECT_EQ(stats["committed_bytes"], 65 * M);
  EXPECT_EQ(stats["regions"]["persistent"]["current_bytes"], 15 * M);
  EXPECT_EQ(stats["regions"]["ephemeral"]["current_bytes"], M);
  EXPECT_EQ(stats["lanes"].size(), 2u);
  EXPECT_EQ(stats["sessions"][1]["persistent"]["allocation_count"], 1u);

  const nlohmann::json map = h.manager->MemoryMap();
  EXPECT_EQ(map["capacity"], 100 * M);
  EXPECT_EQ(map["regions"]["ephemeral"]["size"], 50 * M);
  EXPECT_EQ(map["regions"]["persistent"]["offset"], 85 * M);
  ASSERT_EQ(map["lanes"].size(), 2u);
  EXPECT_EQ(map["lanes"][1]["offset"], 20 * M);
  EXPECT_EQ(map["lanes"][1]["sessions"], nlohmann::json::array({2}));
  EXPECT_EQ(map["lanes"][0]["in_iteration"], true);
  ASSERT_EQ(map["persistent_blocks"].size(), 2u);
  EXPECT_EQ(map["persistent_blocks"][0]["offset"], 90 * M);
  ASSERT_EQ(map["free_ranges"].size(), 1u);
  EXPECT_EQ(map["free_ranges"][0], (nlohmann::json{{"offset", 50 * M}, {"size", 35 * M}}));
  ASSERT_TRUE(h.manager->EndIteration(a).ok());
}

}  // namespace
}  // namespace salus::mem
