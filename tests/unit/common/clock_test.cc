#include "common/clock.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace salus {
namespace {

using std::chrono::milliseconds;

TEST(ManualClockTest, MovesOnlyWhenTold) {
  ManualClock clock(Nanos(100));
  EXPECT_EQ(clock.Now(), Nanos(100));
  clock.Advance(milliseconds(5));
  EXPECT_EQ(clock.Now(), Nanos(100) + milliseconds(5));
  clock.Set(Nanos(1'000'000'000));
  EXPECT_DOUBLE_EQ(clock.NowSeconds(), 1.0);
}

TEST(ManualClockTest, NeverMovesBackwards) {
  ManualClock clock(Nanos(50));
  clock.Set(Nanos(10));
  EXPECT_EQ(clock.Now(), Nanos(50));
}

TEST(ManualClockTest, ConcurrentAdvancesAllCount) {
  ManualClock clock;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) clock.Advance(Nanos(1));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(clock.Now(), Nanos(40000));
}

TEST(SteadyClockTest, IsMonotonic) {
  Clock* clock = SteadyClock::Get();
  Nanos prev = clock->Now();
  for (int i = 0; i < 1000; ++i) {
    Nanos now = clock->Now();
    ASSERT_GE(now, prev);
    prev = now;
  }
}

TEST(SecondsTest, Converts) {
  EXPECT_EQ(FromSeconds(1.5), Nanos(1'500'000'000));
  EXPECT_DOUBLE_EQ(ToSeconds(milliseconds(250)), 0.25);
}

}  // namespace
}  // namespace salus
