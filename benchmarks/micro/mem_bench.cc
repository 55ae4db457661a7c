// Micro-benchmarks of the memory manager's hot paths, on the fake provider:
//   - an admission decision with 1, 100 and 1,000 sessions admitted (each in its own lane),
//     measured as Admit + Release of one more session (target: < 5 us median at 1,000), for
//     three outcomes of Algorithm 1: a new lane (step 1), joining the best match (step 2),
//     and waiting (step 4, then CancelWaiting);
//   - a planned allocation in a lane (target: < 50 ns);
//   - a dynamic allocate/free pair in a fragmented lane (target: < 200 ns).
#include <benchmark/benchmark.h>

#include <memory>

#include "common/units.h"
#include "device/fake_memory_provider.h"
#include "mem/lane_allocator.h"
#include "mem/memory_manager.h"
#include "sched/admission_rules.h"

namespace salus::mem {
namespace {

constexpr uint64_t kP = kMiB;
// The E of the i-th resident session: 64 down to 1 MiB, so lane sizes vary and even one
// resident has a lane a session of 32MiB can join.
uint64_t ResidentE(int64_t i) { return (64 - i % 64) * kMiB; }

enum class Outcome { kNewLane, kJoin, kWait };

// A manager with `n` sessions admitted, each alone in its lane, and a capacity that leaves
// exactly the room the outcome needs for a session of (kP, 32MiB).
struct Setup {
  Setup(int64_t n, Outcome outcome) {
    uint64_t committed = 0;
    for (int64_t i = 0; i < n; ++i) committed += kP + ResidentE(i);
    uint64_t capacity = committed;
    switch (outcome) {
      case Outcome::kNewLane:
        capacity += kP + 32 * kMiB;  // step 1 fits exactly
        break;
      case Outcome::kJoin:
        capacity += kP;  // no new lane, but P fits: step 2 joins a lane of >= 32MiB
        break;
      case Outcome::kWait:
        break;  // full: P does not fit at all
    }
    MemoryManager::Options o;
    o.provider = &provider;
    o.capacity = capacity;
    o.rule = sched::PackRule();
    manager = std::move(MemoryManager::Create(o)).value();
    for (int64_t i = 0; i < n; ++i) {
      auto g = manager->Admit(i + 1, {kP, ResidentE(i)});
      if (!g.ok() || !g->has_value()) std::abort();
    }
  }
  device::FakeMemoryProvider provider;
  std::unique_ptr<MemoryManager> manager;
};

void BM_Admission(benchmark::State& state, Outcome outcome) {
  const int64_t n = state.range(0);
  Setup setup(n, outcome);
  MemoryManager& m = *setup.manager;
  const SessionId s = 1'000'000;
  for (auto _ : state) {
    auto g = m.Admit(s, {kP, 32 * kMiB});
    benchmark::DoNotOptimize(g);
    if (outcome == Outcome::kWait) {
      m.CancelWaiting(s);
    } else if (!m.Release(s).ok()) {
      state.SkipWithError("release failed");
      break;
    }
  }
  state.counters["admitted"] = static_cast<double>(m.Lanes().size());
}
BENCHMARK_CAPTURE(BM_Admission, new_lane, Outcome::kNewLane)->Arg(1)->Arg(100)->Arg(1000);
BENCHMARK_CAPTURE(BM_Admission, join_best_match, Outcome::kJoin)->Arg(1)->Arg(100)->Arg(1000);
BENCHMARK_CAPTURE(BM_Admission, wait, Outcome::kWait)->Arg(1)->Arg(100)->Arg(1000);

// One lane of 1GiB mid-iteration.
struct LaneSetup {
  LaneSetup() {
    MemoryManager::Options o;
    o.provider = &provider;
    o.capacity = 2 * kGiB;
    o.rule = sched::PackRule();
    manager = std::move(MemoryManager::Create(o)).value();
    auto g = manager->Admit(1, {kMiB, kGiB});
    if (!g.ok() || !g->has_value()) std::abort();
    lane = (*g)->lane;
    auto it = manager->BeginIteration(lane);
    if (!it.ok()) std::abort();
    iteration = *it;
  }
  device::FakeMemoryProvider provider;
  std::unique_ptr<MemoryManager> manager;
  LaneId lane = 0;
  LaneIteration iteration;
};

// Planned allocations as an executable makes them: a plan of 4,096 tensors, then the
// iteration ends (the end-of-iteration release is timed too, amortised over the plan).
void BM_PlannedAllocation(benchmark::State& state) {
  LaneSetup setup;
  constexpr uint64_t kTensors = 4096;
  constexpr uint64_t kTensorBytes = 64 * kKiB;
  LaneAllocator* a = setup.iteration.allocator;
  if (!a->ReservePlan(kTensors * kTensorBytes).ok()) std::abort();
  uint64_t i = 0;
  for (auto _ : state) {
    auto p = a->AllocatePlanned(i * kTensorBytes, kTensorBytes);
    benchmark::DoNotOptimize(p);
    if (++i == kTensors) {
      a->ReleaseAll();
      a->Reset(setup.iteration.address, setup.iteration.size);
      if (!a->ReservePlan(kTensors * kTensorBytes).ok()) std::abort();
      i = 0;
    }
  }
}
BENCHMARK(BM_PlannedAllocation);

// A dynamic allocate/free pair in a lane already holding 256 allocations with holes between
// them, sizes rotating over 1KiB..1MiB.
void BM_DynamicAllocateFree(benchmark::State& state) {
  LaneSetup setup;
  LaneAllocator* a = setup.iteration.allocator;
  std::vector<LaneAllocator::Allocation> resident;
  for (int i = 0; i < 512; ++i) {
    auto x = a->Allocate((1 + i % 17) * 4 * kKiB);
    if (!x.ok()) std::abort();
    resident.push_back(*x);
  }
  for (size_t i = 0; i < resident.size(); i += 2) {
    if (!a->Free(resident[i]).ok()) std::abort();
  }
  constexpr uint64_t kSizes[] = {kKiB, 12 * kKiB, 100 * kKiB, kMiB, 3 * kKiB, 40 * kKiB};
  size_t k = 0;
  for (auto _ : state) {
    auto x = a->Allocate(kSizes[k]);
    if (!x.ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
    benchmark::DoNotOptimize(x->address);
    if (!a->Free(*x).ok()) std::abort();
    k = k + 1 == std::size(kSizes) ? 0 : k + 1;
  }
}
BENCHMARK(BM_DynamicAllocateFree);

}  // namespace
}  // namespace salus::mem

BENCHMARK_MAIN();
