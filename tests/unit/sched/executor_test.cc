// The threaded executor with real threads and the steady clock (also run under TSan).
#include "sched/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "common/units.h"
#include "device/memory_provider.h"

namespace salus::sched {
namespace {

using std::chrono::milliseconds;

class ExecutorTest : public ::testing::Test {
 protected:
  void Make(std::string_view policy, nlohmann::json options = {}, uint64_t cap = 16 * kGiB) {
    provider_ = std::move(*device::CreateMemoryProvider("fake"));
    Engine::Options o;
    o.clock = SteadyClock::Get();
    o.policy = std::move(*CreatePolicy(policy, options));
    o.devices = std::move(*MakeDevices(*o.policy, o.clock, {{"fake:0", provider_.get(), cap}}));
    auto ex = Executor::Create(std::move(o));
    ASSERT_TRUE(ex.ok()) << ex.status();
    ex_ = std::move(*ex);
  }
  void TearDown() override {
    if (ex_) ex_->Shutdown();
  }

  // Runs `iterations` iterations of sessions 1..sessions, one client thread each, every one
  // writing a pattern into its persistent block and checking (every `stride`-th word) the one
  // its previous iteration wrote; counts the iterations that ended OK and the checks that
  // failed.
  void TrainCheckingState(int sessions, int iterations, size_t stride, std::atomic<int>* ok,
                          std::atomic<int>* wrong) {
    std::vector<std::thread> clients;
    for (SessionId id = 1; id <= static_cast<SessionId>(sessions); ++id) {
      clients.emplace_back([&, id] {
        for (int i = 0; i < iterations; ++i) {
          std::promise<void> finished;
          auto work = [&, id, i](const Dispatch& d) {
            auto* words = reinterpret_cast<uint64_t*>(d.persistent.address);
            const size_t n = d.persistent.size / sizeof(uint64_t);
            if (i > 0) {
              for (size_t k = 0; k < n; k += stride) {
                if (words[k] != id * 1000 + static_cast<uint64_t>(i - 1) + k) {
                  (*wrong)++;
                  break;
                }
              }
            }
            for (size_t k = 0; k < n; ++k) words[k] = id * 1000 + static_cast<uint64_t>(i) + k;
            return OkStatus();
          };
          auto done = [&](const Status& s, const IterationRecord&) {
            if (s.ok()) (*ok)++;
            finished.set_value();
          };
          ASSERT_TRUE(ex_->Submit(id, work, done).ok());
          finished.get_future().wait();
        }
      });
    }
    for (auto& t : clients) t.join();
  }

  static SessionSpec Spec(uint64_t p, uint64_t e) {
    SessionSpec s;
    s.requirement = {p, e};
    return s;
  }

  std::unique_ptr<device::MemoryProvider> provider_;
  std::unique_ptr<Executor> ex_;
};

TEST_F(ExecutorTest, EverySubmitIsAnsweredOnceAndLanesNeverOverlap) {
  Make("pack");
  constexpr int kSessions = 6, kIterations = 50;
  for (SessionId id = 1; id <= kSessions; ++id) {
    ASSERT_TRUE(*ex_->AddSession(id, Spec(kGiB / 4, kGiB)));
  }
  std::mutex mu;
  std::map<LaneId, int> in_lane;
  std::atomic<int> overlaps{0}, answered{0}, ok{0};
  std::vector<std::thread> clients;
  for (SessionId id = 1; id <= kSessions; ++id) {
    clients.emplace_back([&, id] {
      for (int i = 0; i < kIterations; ++i) {
        std::promise<void> finished;
        auto work = [&](const Dispatch& d) {
          {
            std::lock_guard<std::mutex> l(mu);
            if (++in_lane[d.lane] > 1) overlaps++;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          std::lock_guard<std::mutex> l(mu);
          in_lane[d.lane]--;
          return OkStatus();
        };
        auto done = [&](const Status& s, const IterationRecord&) {
          answered++;
          if (s.ok()) ok++;
          finished.set_value();
        };
        ASSERT_TRUE(ex_->Submit(id, work, done).ok());
        finished.get_future().wait();
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(answered.load(), kSessions * kIterations);
  EXPECT_EQ(ok.load(), kSessions * kIterations);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST_F(ExecutorTest, PackRunsLanesInParallel) {
  Make("pack");
  ASSERT_TRUE(*ex_->AddSession(1, Spec(kGiB, 4 * kGiB)));
  ASSERT_TRUE(*ex_->AddSession(2, Spec(kGiB, 4 * kGiB)));
  // Each iteration waits until both are inside their iteration: only parallel lanes finish.
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;
  std::atomic<int> met{0};
  std::promise<void> p1, p2;
  auto work = [&](const Dispatch&) {
    std::unique_lock<std::mutex> l(mu);
    ++inside;
    cv.notify_all();
    if (cv.wait_for(l, std::chrono::seconds(10), [&] { return inside >= 2; })) met++;
    return OkStatus();
  };
  ASSERT_TRUE(
      ex_->Submit(1, work, [&](const Status&, const IterationRecord&) { p1.set_value(); }).ok());
  ASSERT_TRUE(
      ex_->Submit(2, work, [&](const Status&, const IterationRecord&) { p2.set_value(); }).ok());
  p1.get_future().wait();
  p2.get_future().wait();
  EXPECT_EQ(met.load(), 2);
  EXPECT_EQ(ex_->WorkerCount(), 2u);
}

TEST_F(ExecutorTest, RemoveCancelsQueuedIterations) {
  Make("fair", {{"single_lane", true}});
  ASSERT_TRUE(*ex_->AddSession(1, Spec(kGiB, kGiB)));
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::vector<std::promise<Status>> results(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(ex_->Submit(
                       1,
                       [gate](const Dispatch&) {
                         gate.wait();
                         return OkStatus();
                       },
                       [&, i](const Status& s, const IterationRecord&) { results[i].set_value(s); })
                    .ok());
  }
  // The first is running (blocked on the gate); the other two are queued.
  while (ex_->engine().RunningIterations() == 0) std::this_thread::yield();
  ASSERT_TRUE(ex_->RemoveSession(1).ok());
  EXPECT_EQ(results[1].get_future().get().code(), StatusCode::kCancelled);
  EXPECT_EQ(results[2].get_future().get().code(), StatusCode::kCancelled);
  release.set_value();
  EXPECT_TRUE(results[0].get_future().get().ok());
  EXPECT_EQ(ex_->Submit(
                   1, [](const Dispatch&) { return OkStatus(); },
                   [](const Status&, const IterationRecord&) {})
                .code(),
            StatusCode::kNotFound);
}

TEST_F(ExecutorTest, ShutdownAnswersWaitersAndFinishesInFlight) {
  Make("fair", {{"single_lane", true}});
  ASSERT_TRUE(*ex_->AddSession(1, Spec(kGiB, kGiB)));
  std::atomic<bool> ran_to_end{false};
  std::promise<Status> first, second;
  ASSERT_TRUE(ex_->Submit(
                     1,
                     [&](const Dispatch&) {
                       std::this_thread::sleep_for(milliseconds(50));
                       ran_to_end = true;
                       return OkStatus();
                     },
                     [&](const Status& s, const IterationRecord&) { first.set_value(s); })
                  .ok());
  ASSERT_TRUE(ex_->Submit(
                     1, [](const Dispatch&) { return OkStatus(); },
                     [&](const Status& s, const IterationRecord&) { second.set_value(s); })
                  .ok());
  while (ex_->engine().RunningIterations() == 0) std::this_thread::yield();
  ex_->Shutdown();
  EXPECT_TRUE(ran_to_end.load());
  EXPECT_TRUE(first.get_future().get().ok());
  EXPECT_EQ(second.get_future().get().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ex_->AddSession(2, Spec(kGiB, kGiB)).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ex_->engine().memory().CommittedBytes(), 0u);
}

TEST_F(ExecutorTest, SessionsOfOneLaneAlternateOnOneWorker) {
  Make("fair", {{"single_lane", true}});
  ASSERT_TRUE(*ex_->AddSession(1, Spec(kGiB, kGiB)));
  ASSERT_TRUE(*ex_->AddSession(2, Spec(kGiB, kGiB)));
  std::mutex mu;
  std::vector<std::pair<SessionId, std::thread::id>> ran;
  std::vector<IterationRecord> recs;
  std::atomic<int> left{40};
  std::promise<void> all;
  for (int i = 0; i < 20; ++i) {
    for (SessionId id : {1, 2}) {
      ASSERT_TRUE(ex_->Submit(
                         id,
                         [&](const Dispatch& d) {
                           std::this_thread::sleep_for(std::chrono::microseconds(200));
                           std::lock_guard<std::mutex> l(mu);
                           ran.emplace_back(d.session, std::this_thread::get_id());
                           return OkStatus();
                         },
                         [&](const Status&, const IterationRecord& r) {
                           {
                             std::lock_guard<std::mutex> l(mu);
                             recs.push_back(r);
                           }
                           if (--left == 0) all.set_value();
                         })
                      .ok());
    }
  }
  all.get_future().wait();
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(ran.size(), 40u);
  for (const auto& r : ran) EXPECT_EQ(r.second, ran.front().second);  // one worker thread
  // Both sessions progress before either finishes (FAIR's exact order is tested on the
  // manual clock in engine_test; here real sleeps vary with the machine's load).
  std::string order;
  for (const auto& r : ran) order += std::to_string(r.first);
  const std::string first_half = order.substr(0, 20);
  EXPECT_NE(first_half.find('1'), std::string::npos) << order;
  EXPECT_NE(first_half.find('2'), std::string::npos) << order;
  for (const auto& r : recs) EXPECT_GE(r.switch_gap, Nanos(0));
}

// Note [Anticipation] with real threads: a window far longer than any delay the test can
// produce, so the outcome does not depend on timing. The short session (shorter declared
// length) finishes an iteration and its client waits 50 ms before the next; the long
// session's iteration, queued all along, must not take the lane in that gap.
TEST_F(ExecutorTest, HeldLaneWaitsForTheSessionExpectedBack) {
  Make("srtf", {{"max_hold_ms", 60000}, {"min_hold_ms", 60000}});
  SessionSpec long_spec = Spec(kGiB, kGiB), short_spec = Spec(kGiB, kGiB);
  long_spec.declared_iterations = 1000;
  long_spec.iteration_time_hint = milliseconds(10);
  short_spec.declared_iterations = 2;
  short_spec.iteration_time_hint = milliseconds(10);
  ASSERT_TRUE(*ex_->AddSession(1, long_spec));
  ASSERT_TRUE(*ex_->AddSession(2, short_spec));
  std::mutex mu;
  std::vector<SessionId> order;
  auto work = [&](const Dispatch& d) {
    std::lock_guard<std::mutex> l(mu);
    order.push_back(d.session);
    return OkStatus();
  };
  std::promise<void> short_first, short_second, long_done;
  ASSERT_TRUE(
      ex_->Submit(2, work, [&](const Status&, const IterationRecord&) { short_first.set_value(); })
          .ok());
  short_first.get_future().wait();
  // The lane is idle, held for session 2; session 1 asks now and must wait.
  ASSERT_TRUE(
      ex_->Submit(1, work, [&](const Status&, const IterationRecord&) { long_done.set_value(); })
          .ok());
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_TRUE(
      ex_->Submit(2, work, [&](const Status&, const IterationRecord&) { short_second.set_value(); })
          .ok());
  short_second.get_future().wait();
  long_done.get_future().wait();
  EXPECT_EQ(order, (std::vector<SessionId>{2, 2, 1}));
  const HoldStats holds = ex_->engine().Holds();
  EXPECT_EQ(holds.started, 1u);
  EXPECT_EQ(holds.returned, 1u);
}

// A hold that nothing ends early ends at its deadline: the timer pumps the engine.
TEST_F(ExecutorTest, HoldEndsAtItsDeadlineWithoutAnotherEvent) {
  Make("srtf", {{"max_hold_ms", 20}});
  SessionSpec long_spec = Spec(kGiB, kGiB), short_spec = Spec(kGiB, kGiB);
  long_spec.declared_iterations = 1000;
  long_spec.iteration_time_hint = milliseconds(10);
  short_spec.declared_iterations = 5;
  short_spec.iteration_time_hint = milliseconds(10);
  ASSERT_TRUE(*ex_->AddSession(1, long_spec));
  ASSERT_TRUE(*ex_->AddSession(2, short_spec));
  auto work = [](const Dispatch&) { return OkStatus(); };
  std::promise<void> short_done, long_done;
  ASSERT_TRUE(
      ex_->Submit(2, work, [&](const Status&, const IterationRecord&) { short_done.set_value(); })
          .ok());
  short_done.get_future().wait();
  ASSERT_TRUE(
      ex_->Submit(1, work, [&](const Status&, const IterationRecord&) { long_done.set_value(); })
          .ok());
  // Session 2 never comes back: the long session runs once the 20 ms window has passed.
  ASSERT_EQ(long_done.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(ex_->engine().Holds().expired, 1u);
}

TEST_F(ExecutorTest, InteractiveLanesGetTheirOwnWorker) {
  Make("priority");
  SessionSpec interactive = Spec(kGiB, kGiB);
  interactive.requirement.lane_class = mem::LaneClass::kInteractive;
  ASSERT_TRUE(*ex_->AddSession(1, Spec(kGiB, kGiB)));
  ASSERT_TRUE(*ex_->AddSession(2, interactive));
  std::promise<mem::LaneClass> c1, c2;
  ASSERT_TRUE(ex_->Submit(
                     1,
                     [&](const Dispatch& d) {
                       c1.set_value(d.lane_class);
                       return OkStatus();
                     },
                     [](const Status&, const IterationRecord&) {})
                  .ok());
  ASSERT_TRUE(ex_->Submit(
                     2,
                     [&](const Dispatch& d) {
                       c2.set_value(d.lane_class);
                       return OkStatus();
                     },
                     [](const Status&, const IterationRecord&) {})
                  .ok());
  EXPECT_EQ(c1.get_future().get(), mem::LaneClass::kBatch);
  EXPECT_EQ(c2.get_future().get(), mem::LaneClass::kInteractive);
  EXPECT_EQ(ex_->WorkerCount(), 2u);
}

// Overcommit on the host device: sessions whose blocks add up to twice the arena take turns,
// paged out and in by the copy thread between their iterations. Each iteration checks that
// its block holds what its previous iteration wrote, wherever the block is now, then writes
// the next value: paging moves the bytes, not just the accounting.
TEST_F(ExecutorTest, PagedStateComesBackByteForByte) {
  provider_ = std::move(*device::CreateMemoryProvider("host"));
  Engine::Options o;
  o.clock = SteadyClock::Get();
  o.policy = std::move(*CreatePolicy("fair"));
  o.devices =
      std::move(*MakeDevices(*o.policy, o.clock, {{"cpu:0", provider_.get(), 8 * kMiB, 2.5}}));
  o.paging_quantum = Nanos(0);
  auto ex = Executor::Create(std::move(o));
  ASSERT_TRUE(ex.ok()) << ex.status();
  ex_ = std::move(*ex);
  constexpr int kSessions = 4, kIterations = 12;
  constexpr uint64_t kP = 4 * kMiB, kE = 64 * kKiB;
  for (SessionId id = 1; id <= kSessions; ++id) ASSERT_TRUE(*ex_->AddSession(id, Spec(kP, kE)));
  std::atomic<int> wrong{0}, ok{0};
  TrainCheckingState(kSessions, kIterations, 97, &ok, &wrong);
  EXPECT_EQ(ok.load(), kSessions * kIterations);
  EXPECT_EQ(wrong.load(), 0);
  const PagingStats p = ex_->engine().Paging();
  EXPECT_GT(p.page_ins, 0u);
  EXPECT_GT(p.copies, 0u);
  EXPECT_TRUE(ex_->engine().memory().CheckInvariants().ok());
}

// Two devices under real threads: sessions train while another thread keeps moving them
// between the devices (Note [Migration]); every iteration sees the state its previous one
// left, wherever it ran.
TEST_F(ExecutorTest, MovesBetweenDevicesKeepStateUnderLoad) {
  provider_ = std::move(*device::CreateMemoryProvider("host"));
  auto second = std::move(*device::CreateMemoryProvider("host"));
  Engine::Options o;
  o.clock = SteadyClock::Get();
  o.policy = std::move(*CreatePolicy("fair"));
  o.devices = std::move(
      *MakeDevices(*o.policy, o.clock,
                   {{"cpu:0", provider_.get(), 8 * kMiB}, {"cpu:1", second.get(), 8 * kMiB}}));
  o.paging_quantum = Nanos(0);
  auto ex = Executor::Create(std::move(o));
  ASSERT_TRUE(ex.ok()) << ex.status();
  ex_ = std::move(*ex);
  constexpr int kSessions = 3, kIterations = 30;
  constexpr uint64_t kP = 1 * kMiB, kE = 64 * kKiB;
  for (SessionId id = 1; id <= kSessions; ++id) ASSERT_TRUE(*ex_->AddSession(id, Spec(kP, kE)));
  std::atomic<int> wrong{0}, ok{0};
  std::atomic<bool> stop{false};
  std::thread mover([&] {
    for (uint64_t k = 0; !stop.load(); ++k) {
      const SessionId id = 1 + k % kSessions;
      auto info = ex_->engine().Session(id);
      if (!info.ok() || !info->device) continue;
      // Refused while it runs or copies: only between iterations does it move.
      ex_->Migrate(id, 1 - *info->device).IgnoreError();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  TrainCheckingState(kSessions, kIterations, 61, &ok, &wrong);
  stop = true;
  mover.join();
  EXPECT_EQ(ok.load(), kSessions * kIterations);
  EXPECT_EQ(wrong.load(), 0);
  const MigrationStats m = ex_->engine().Migrations();
  EXPECT_GT(m.finished, 0u);
  ex_->Shutdown();
  EXPECT_TRUE(ex_->engine().memory(0).CheckInvariants().ok());
  EXPECT_TRUE(ex_->engine().memory(1).CheckInvariants().ok());
  ex_.reset();  // before `second`, whose memory its arena holds
}

}  // namespace
}  // namespace salus::sched
