// Micro-benchmarks of the common library's hot helpers.
#include <benchmark/benchmark.h>

#include "common/clock.h"
#include "common/units.h"

namespace {

void BM_ParseBytes(benchmark::State& state) {
  for (auto _ : state) {
    auto v = salus::ParseBytes("16GiB");
    benchmark::DoNotOptimize(v);
  }
}
BENCHMARK(BM_ParseBytes);

void BM_SteadyClockNow(benchmark::State& state) {
  salus::Clock* clock = salus::SteadyClock::Get();
  for (auto _ : state) benchmark::DoNotOptimize(clock->Now());
}
BENCHMARK(BM_SteadyClockNow);

}  // namespace

BENCHMARK_MAIN();
