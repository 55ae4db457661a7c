// Scheduler micro-benchmarks: a policy's decision over N runnable sessions, and one full
// engine boundary (complete an iteration, re-request it, dispatch the next) with N sessions
// sharing one lane.
#include <benchmark/benchmark.h>

#include <random>

#include "common/units.h"
#include "device/memory_provider.h"
#include "sched/engine.h"

namespace {

using salus::sched::LaneSnapshot;
using salus::sched::SessionView;

void BM_PolicyPick(benchmark::State& state, const char* policy_name) {
  const int n = static_cast<int>(state.range(0));
  auto policy = std::move(*salus::sched::CreatePolicy(policy_name));
  std::mt19937 rng(1);
  std::uniform_int_distribution<int64_t> t(0, 1'000'000'000);
  std::vector<SessionView> views(n);
  for (int i = 0; i < n; ++i) {
    views[i].id = i + 1;
    views[i].admit_seq = i;
    views[i].priority = static_cast<int>(rng() % 3);
    views[i].requested_at = salus::Nanos(t(rng));
    views[i].service = salus::Nanos(t(rng));
    views[i].remaining_seconds = static_cast<double>(t(rng)) / 1e6;
  }
  LaneSnapshot snap{salus::Nanos(0), 1, views};
  for (auto _ : state) benchmark::DoNotOptimize(policy->Pick(snap));
}
BENCHMARK_CAPTURE(BM_PolicyPick, fifo, "fifo")->Arg(10)->Arg(100)->Arg(1000);
BENCHMARK_CAPTURE(BM_PolicyPick, srtf, "srtf")->Arg(10)->Arg(100)->Arg(1000);
BENCHMARK_CAPTURE(BM_PolicyPick, pack, "pack")->Arg(10)->Arg(100)->Arg(1000);
BENCHMARK_CAPTURE(BM_PolicyPick, fair, "fair")->Arg(10)->Arg(100)->Arg(1000);

void BM_EngineBoundary(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  salus::ManualClock clock;
  auto provider = std::move(*salus::device::CreateMemoryProvider("fake"));
  salus::sched::Engine::Options o;
  o.clock = &clock;
  o.policy = std::move(*salus::sched::CreatePolicy("fair", {{"single_lane", true}}));
  o.devices = std::move(*salus::sched::MakeDevices(
      *o.policy, &clock, {{"fake:0", provider.get(), 1024 * salus::kGiB}}));
  auto engine = std::move(*salus::sched::Engine::Create(std::move(o)));
  for (int i = 1; i <= n; ++i) {
    salus::sched::SessionSpec spec;
    spec.requirement = {salus::kMiB, salus::kMiB};
    (void)engine->AddSession(i, spec);
    (void)engine->RequestIteration(i);
  }
  auto d = engine->DispatchReady().front();
  for (auto _ : state) {
    clock.Advance(salus::Nanos(1000));
    (void)engine->Complete(d);
    (void)engine->RequestIteration(d.session);
    d = engine->DispatchReady().front();
  }
}
BENCHMARK(BM_EngineBoundary)->Arg(10)->Arg(100)->Arg(1000);

}  // namespace

BENCHMARK_MAIN();
