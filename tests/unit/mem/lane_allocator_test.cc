#include "mem/lane_allocator.h"

#include <gtest/gtest.h>

#include <random>

#include "common/units.h"

namespace salus::mem {
namespace {

std::byte* const kBase = reinterpret_cast<std::byte*>(uintptr_t{0x10000000});

TEST(LaneAllocatorTest, PlannedAllocationsAreBasePlusOffsetInsideThePlan) {
  LaneAllocator a;
  a.Reset(kBase, 4 * kMiB);
  ASSERT_TRUE(a.ReservePlan(kMiB).ok());
  auto p = a.AllocatePlanned(4096, 8192);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, kBase + 4096);
  // Leaving the plan but not the lane is a bug in the caller's plan.
  EXPECT_EQ(a.AllocatePlanned(kMiB - 100, 200).status().code(), StatusCode::kInvalidArgument);
  // Leaving the lane: the plan does not fit.
  EXPECT_EQ(a.AllocatePlanned(4 * kMiB - 100, 200).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.AllocatePlanned(UINT64_MAX - 10, 20).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.AllocatePlanned(0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.stats().current_bytes, 8192u);
  EXPECT_EQ(a.stats().allocation_count, 1u);
}

TEST(LaneAllocatorTest, PlanLargerThanTheLaneIsResourceExhausted) {
  LaneAllocator a;
  a.Reset(kBase, kMiB);
  const Status s = a.ReservePlan(2 * kMiB);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("2MiB"), std::string::npos) << s;
}

TEST(LaneAllocatorTest, PlanCannotMoveUnderLiveAllocations) {
  LaneAllocator a;
  a.Reset(kBase, kMiB);
  auto d = a.Allocate(1000);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(a.ReservePlan(kKiB).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.Free(*d).ok());
  EXPECT_TRUE(a.ReservePlan(kKiB).ok());
}

TEST(LaneAllocatorTest, DynamicAllocationsComeAfterThePlanAligned) {
  LaneAllocator a;
  a.Reset(kBase, kMiB);
  ASSERT_TRUE(a.ReservePlan(1000).ok());  // rounded up to 1024 for the dynamic part
  auto d = a.Allocate(10);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->offset, 1024u);
  EXPECT_EQ(d->size, LaneAllocator::kAlignment);
  EXPECT_EQ(d->address, kBase + 1024);
  EXPECT_EQ(a.dynamic_free_bytes(), kMiB - 1024 - LaneAllocator::kAlignment);
}

TEST(LaneAllocatorTest, BestFitPicksTheSmallestHoleThatFits) {
  LaneAllocator a;
  a.Reset(kBase, 64 * kKiB);
  // Holes of 8KiB and 4KiB with live allocations between them.
  auto h1 = a.Allocate(8 * kKiB);
  auto s1 = a.Allocate(kKiB);
  auto h2 = a.Allocate(4 * kKiB);
  auto s2 = a.Allocate(kKiB);
  ASSERT_TRUE(h1.ok() && s1.ok() && h2.ok() && s2.ok());
  ASSERT_TRUE(a.Free(*h1).ok());
  ASSERT_TRUE(a.Free(*h2).ok());
  auto x = a.Allocate(3 * kKiB);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->offset, h2->offset);  // the 4KiB hole, not the 8KiB one nor the tail
  auto y = a.Allocate(6 * kKiB);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->offset, h1->offset);
}

TEST(LaneAllocatorTest, FreeCoalescesWithBothNeighbours) {
  LaneAllocator a;
  a.Reset(kBase, 16 * kKiB);
  auto x = a.Allocate(4 * kKiB);
  auto y = a.Allocate(4 * kKiB);
  auto z = a.Allocate(4 * kKiB);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  ASSERT_TRUE(a.Free(*x).ok());
  ASSERT_TRUE(a.Free(*z).ok());  // merges with the 4KiB tail
  EXPECT_EQ(a.largest_free_range(), 8 * kKiB);
  ASSERT_TRUE(a.Free(*y).ok());  // merges all three into the whole lane
  EXPECT_EQ(a.largest_free_range(), 16 * kKiB);
  auto all = a.Allocate(16 * kKiB);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->offset, 0u);
}

TEST(LaneAllocatorTest, DoesNotFitIsResourceExhaustedNamingTheSizes) {
  LaneAllocator a;
  a.Reset(kBase, 8 * kKiB);
  auto x = a.Allocate(3 * kKiB);
  auto y = a.Allocate(2 * kKiB);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(a.Free(*x).ok());
  // 6KiB free in total, but in two ranges of 3KiB.
  const auto z = a.Allocate(4 * kKiB);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(z.status().message().find("largest free range is 3KiB of 6KiB"), std::string::npos)
      << z.status();
  EXPECT_EQ(a.Allocate(16 * kKiB).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.Allocate(0).status().code(), StatusCode::kInvalidArgument);
}

TEST(LaneAllocatorTest, FreeOfWhatIsNotLiveIsInvalidArgument) {
  LaneAllocator a;
  a.Reset(kBase, 8 * kKiB);
  auto x = a.Allocate(kKiB);
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(a.Free(*x).ok());
  EXPECT_EQ(a.Free(*x).code(), StatusCode::kInvalidArgument);  // twice
  LaneAllocator::Allocation bogus{77, 0, 256, kBase};
  EXPECT_EQ(a.Free(bogus).code(), StatusCode::kInvalidArgument);
}

TEST(LaneAllocatorTest, ReleaseAllFreesEverythingAndCountsIt) {
  LaneAllocator a;
  a.Reset(kBase, kMiB);
  ASSERT_TRUE(a.ReservePlan(64 * kKiB).ok());
  ASSERT_TRUE(a.AllocatePlanned(0, 32 * kKiB).ok());
  ASSERT_TRUE(a.Allocate(10 * kKiB).ok());
  ASSERT_TRUE(a.Allocate(20 * kKiB).ok());
  EXPECT_EQ(a.iteration_peak_bytes(), 62 * kKiB);
  a.ReleaseAll();
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.current_bytes, 0u);
  EXPECT_EQ(s.allocated_bytes, 62 * kKiB);
  EXPECT_EQ(s.freed_bytes, 62 * kKiB);
  EXPECT_EQ(s.allocation_count, 3u);
  EXPECT_EQ(s.free_count, 3u);
  EXPECT_EQ(s.peak_bytes, 62 * kKiB);
  EXPECT_TRUE(a.LiveRanges().empty());
  // A new iteration starts with the whole lane free.
  a.Reset(kBase, kMiB);
  EXPECT_EQ(a.largest_free_range(), kMiB);
}

// Random allocations and frees never overlap each other or the plan, and the free bytes
// always add up.
TEST(LaneAllocatorTest, RandomAllocationsNeverOverlap) {
  std::mt19937_64 rng(7);
  LaneAllocator a;
  const uint64_t lane = 4 * kMiB;
  a.Reset(kBase, lane);
  ASSERT_TRUE(a.ReservePlan(256 * kKiB).ok());
  std::vector<LaneAllocator::Allocation> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      auto x = a.Allocate(1 + rng() % (64 * kKiB));
      if (x.ok()) live.push_back(*x);
    } else {
      const size_t k = rng() % live.size();
      ASSERT_TRUE(a.Free(live[k]).ok());
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 97 == 0) {
      uint64_t end = 256 * kKiB;
      uint64_t used = 0;
      for (const auto& [o, n] : a.LiveRanges()) {
        ASSERT_GE(o, end) << "overlap at iteration " << i;
        end = o + n;
        used += n;
      }
      ASSERT_LE(end, lane);
      ASSERT_EQ(used + a.dynamic_free_bytes(), lane - 256 * kKiB);
    }
  }
}

}  // namespace
}  // namespace salus::mem
