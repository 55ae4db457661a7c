// RequestPacer on the manual clock: a second's worth at once, then the rate, per key, in order.
#include "server/request_pacer.h"

#include <gtest/gtest.h>

namespace salus::server {
namespace {

using namespace std::chrono_literals;

TEST(RequestPacerTest, BurstThenRatePerKeyInOrder) {
  ManualClock clock;
  RequestPacer pacer(&clock, 10);
  std::vector<int> ran;
  for (int i = 0; i < 15; ++i) EXPECT_TRUE(pacer.Offer("a", [&ran, i] { ran.push_back(i); }));
  EXPECT_EQ(ran.size(), 10u) << "a second's worth runs at once";
  EXPECT_EQ(pacer.held(), 5u);
  // another key is not held back by a
  EXPECT_TRUE(pacer.Offer("b", [&ran] { ran.push_back(100); }));
  EXPECT_EQ(ran.back(), 100);
  EXPECT_EQ(pacer.Release(), 0u) << "no time passed, no tokens";
  clock.Advance(300ms);
  EXPECT_EQ(pacer.Release(), 3u);
  clock.Advance(1s);
  EXPECT_EQ(pacer.Release(), 2u);
  const std::vector<int> want = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 10, 11, 12, 13, 14};
  EXPECT_EQ(ran, want);
  EXPECT_EQ(pacer.held(), 0u);
}

TEST(RequestPacerTest, WorkArrivingBehindHeldWorkWaitsItsTurn) {
  ManualClock clock;
  RequestPacer pacer(&clock, 2);
  std::vector<int> ran;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(pacer.Offer("a", [&ran, i] { ran.push_back(i); }));
  clock.Advance(500ms);  // one token back, but request 2 is first in line
  EXPECT_TRUE(pacer.Offer("a", [&ran] { ran.push_back(3); }));
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));
  EXPECT_EQ(pacer.Release(), 1u);
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2}));
  pacer.Flush();
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3}));
}

TEST(RequestPacerTest, ZeroRateNeverHolds) {
  ManualClock clock;
  RequestPacer pacer(&clock, 0);
  int ran = 0;
  for (int i = 0; i < 10000; ++i) EXPECT_TRUE(pacer.Offer("a", [&ran] { ++ran; }));
  EXPECT_EQ(ran, 10000);
  EXPECT_EQ(pacer.held(), 0u);
}

// A key holds at most max_held back, all keys at most max_held_total: past them Offer refuses,
// and neither runs nor keeps the work.
TEST(RequestPacerTest, HeldRequestsAreBounded) {
  ManualClock clock;
  RequestPacer pacer(&clock, 2, /*max_held=*/3, /*max_held_total=*/5);
  int ran = 0;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(pacer.Offer("a", [&ran] { ++ran; }));  // 2 run, 3 held
  EXPECT_FALSE(pacer.Offer("a", [&ran] { ++ran; }));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(pacer.Offer("b", [&ran] { ++ran; }));  // 2 run, 2 held
  EXPECT_FALSE(pacer.Offer("b", [&ran] { ++ran; })) << "b holds 2 of its 3, all keys 5";
  EXPECT_TRUE(pacer.Offer("c", [&ran] { ++ran; })) << "c has tokens: it runs, holding nothing";
  EXPECT_EQ(pacer.held(), 5u);
  EXPECT_EQ(ran, 5);
  clock.Advance(1s);
  EXPECT_EQ(pacer.Release(), 4u);                    // two tokens each
  EXPECT_TRUE(pacer.Offer("a", [&ran] { ++ran; }));  // behind a's last held one
  pacer.Flush();
  EXPECT_EQ(ran, 11);
  EXPECT_EQ(pacer.held(), 0u);
}

}  // namespace
}  // namespace salus::server
