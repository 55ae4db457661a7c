// The memory manager on the host provider with real threads: each worker runs iterations in
// its own lane and writes its persistent block and its lane's allocations, while another
// thread admits and releases sessions (moving lanes about) and reads statistics and the
// memory map. Any overlap shows up as a corrupted pattern; any race under TSan.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "common/units.h"
#include "device/host_memory_provider.h"
#include "mem/lane_allocator.h"
#include "mem/memory_manager.h"
#include "sched/admission_rules.h"

namespace salus::mem {
namespace {

constexpr int kWorkers = 4;
constexpr int kIterationsPerWorker = 150;
// Four workers (P + E = 3MiB each) and a low lane of 1MiB leave 4MiB: enough for the churn
// thread's small sessions to open lanes, and too little for its larger ones, which grow the low
// lane or a worker's lane (Algorithm 1 step 3) and so move the workers' lanes about.
constexpr uint64_t kCapacity = 18 * kMiB;
constexpr uint64_t kP = kMiB;
constexpr uint64_t kE = 2 * kMiB;
constexpr uint64_t kPlan = 512 * kKiB;

bool AllBytesAre(const std::byte* p, uint64_t n, std::byte v) {
  const std::vector<std::byte> want(n, v);
  return std::memcmp(p, want.data(), n) == 0;
}

TEST(HostConcurrencyTest, WorkersWriteTheirLanesAndBlocksAtOnce) {
  device::HostMemoryProvider host;
  MemoryManager::Options o;
  o.rule = sched::PackRule();
  o.provider = &host;
  o.capacity = kCapacity;
  auto created = MemoryManager::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  MemoryManager& m = **created;

  // A lane below the workers' (session 50), then worker w as session w + 1 in its own lane.
  {
    auto low = m.Admit(50, {kMiB, kMiB});
    ASSERT_TRUE(low.ok() && low->has_value());
  }
  std::vector<LaneId> lanes;
  for (int w = 0; w < kWorkers; ++w) {
    auto g = m.Admit(w + 1, {kP, kE});
    ASSERT_TRUE(g.ok() && g->has_value());
    lanes.push_back((*g)->lane);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::atomic<int> moves{0};
  std::atomic<int> retries{0};

  auto worker = [&](int w) {
    const auto mark = static_cast<std::byte>(0x10 + w);
    const SessionId session = w + 1;
    uint64_t last_base = UINT64_MAX;
    for (int i = 0; i < kIterationsPerWorker; ++i) {
      StatusOr<LaneIteration> it = m.BeginIteration(lanes[w], session);
      while (!it.ok() && it.status().code() == StatusCode::kUnavailable) {
        ++retries;
        std::this_thread::yield();
        it = m.BeginIteration(lanes[w], session);
      }
      if (!it.ok()) {
        ++failures;
        return;
      }
      if (last_base != UINT64_MAX && it->base != last_base) ++moves;
      last_base = it->base;
      auto block = m.Persistent(session);
      if (!block.ok()) {
        ++failures;
        return;
      }
      // The block keeps what the last iteration wrote; the lane is scratch.
      if (i > 0 && !AllBytesAre(block->address, block->size, mark)) ++failures;
      std::memset(block->address, static_cast<int>(mark), block->size);
      LaneAllocator* a = it->allocator;
      if (!a->ReservePlan(kPlan).ok()) ++failures;
      auto planned = a->AllocatePlanned(0, kPlan);
      auto dyn1 = a->Allocate(kPlan);
      auto dyn2 = a->Allocate(kPlan / 2);
      if (!planned.ok() || !dyn1.ok() || !dyn2.ok()) {
        ++failures;
      } else {
        std::memset(*planned, static_cast<int>(mark), kPlan);
        std::memset(dyn1->address, static_cast<int>(mark) + 1, dyn1->size);
        std::memset(dyn2->address, static_cast<int>(mark) + 2, dyn2->size);
        std::this_thread::yield();
        if (!AllBytesAre(*planned, kPlan, mark) ||
            !AllBytesAre(dyn1->address, dyn1->size, static_cast<std::byte>(0x11 + w)) ||
            !AllBytesAre(dyn2->address, dyn2->size, static_cast<std::byte>(0x12 + w))) {
          ++failures;
        }
        if (!a->Free(*dyn1).ok()) ++failures;
      }
      if (!m.EndIteration(lanes[w]).ok()) ++failures;
    }
  };

  // Admits and releases sessions that open lanes below and above the workers', so that the
  // workers' lanes move between iterations; reads the views meanwhile.
  auto churn = [&] {
    SessionId next = 100;
    while (!stop.load()) {
      const SessionId s = next++;
      auto g = m.Admit(s, {kMiB, (1 + s % 5) * kMiB});
      std::this_thread::yield();
      if (!g.ok()) ++failures;
      const nlohmann::json stats = m.Stats();
      const nlohmann::json map = m.MemoryMap();
      if (stats["capacity"] != kCapacity || map["lanes"].empty()) ++failures;
      if (!m.CheckInvariants().ok()) ++failures;
      if (g.ok() && g->has_value() && !m.Release(s).ok()) ++failures;
      if (g.ok() && !g->has_value()) m.CancelWaiting(s);
      std::this_thread::yield();
    }
  };

  std::thread churner(churn);
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) workers.emplace_back(worker, w);
  for (auto& t : workers) t.join();
  stop = true;
  churner.join();

  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(m.CheckInvariants().ok());
  const MemoryStatsSnapshot s = m.StatsSnapshot();
  EXPECT_EQ(s.ephemeral.current_bytes, 0u);
  EXPECT_EQ(s.ephemeral.allocation_count,
            static_cast<uint64_t>(kWorkers) * kIterationsPerWorker * 3);
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(m.Release(w + 1).ok());
  ASSERT_TRUE(m.Release(50).ok());
  std::printf("lane moves seen by workers: %d, UNAVAILABLE retries: %d\n", moves.load(),
              retries.load());
  EXPECT_EQ(m.CommittedBytes(), 0u);
}

}  // namespace
}  // namespace salus::mem
