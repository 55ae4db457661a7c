// Moving a session between two devices (Note [Migration] in src/sched/engine.cc), against its
// persistent size, through the engine on real providers: two CPU devices (host arenas), as
// `salus-server --device cpu:2` runs them. Each repetition is one Engine::Migrate of an idle
// session to the other device: its block is copied out to host memory and into the target's
// arena (MemoryProvider::CopyToHost, then CopyToDevice, as the executor's copy thread runs
// them), until it can run there. Beside it, a bare memcpy of the same bytes, measured in the
// same run: a move through host memory is two copies, so 2x memcpy is its floor. Prints one
// JSON line per size with medians and MiB/s.
//
//   migration_bench [--device cpu] [--sizes-mib 16,64,256,1024] [--reps 7]
#include <fmt/format.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "common/units.h"
#include "copy_bench_util.h"
#include "device/memory_provider.h"
#include "sched/engine.h"

namespace {

using salus::kMiB;
using salus::bench::Clock;
using salus::bench::Median;
using salus::bench::Seconds;

int Fail(const salus::Status& s) {
  std::cerr << s << "\n";
  return 1;
}

int Run(const salus::bench::CopyBenchArgs& args) {
  if (args.device != "cpu") {
    return Fail(salus::UnimplementedError(
        "moves between GPUs wait for daemons with several GPUs; --device cpu only"));
  }
  for (const uint64_t mib : args.sizes_mib) {
    const uint64_t bytes = mib * kMiB;
    std::vector<std::unique_ptr<salus::device::MemoryProvider>> providers;
    for (int d = 0; d < 2; ++d) {
      auto p = salus::device::CreateMemoryProvider("cpu");
      if (!p.ok()) return Fail(p.status());
      providers.push_back(std::move(*p));
    }
    salus::sched::Engine::Options o;
    o.clock = salus::SteadyClock::Get();
    auto policy = salus::sched::CreatePolicy("fair");
    if (!policy.ok()) return Fail(policy.status());
    o.policy = std::move(*policy);
    const uint64_t capacity = bytes + bytes / 2;  // the session fits either device
    auto devices = salus::sched::MakeDevices(
        *o.policy, o.clock,
        {{"cpu:0", providers[0].get(), capacity}, {"cpu:1", providers[1].get(), capacity}});
    if (!devices.ok()) return Fail(devices.status());
    o.devices = std::move(*devices);
    auto engine = salus::sched::Engine::Create(std::move(o));
    if (!engine.ok()) return Fail(engine.status());
    salus::sched::Engine& e = **engine;
    salus::sched::SessionSpec spec;
    spec.requirement = {bytes, kMiB};
    if (auto a = e.AddSession(1, spec); !a.ok() || !*a) return Fail(a.status());
    // One iteration, to touch the block's pages as a job's first iteration does.
    if (auto s = e.RequestIteration(1); !s.ok()) return Fail(s);
    const auto ds = e.DispatchReady();
    if (ds.size() != 1) return Fail(salus::InternalError("no dispatch"));
    std::memset(ds[0].persistent.address, 1, bytes);
    if (auto s = e.Complete(ds[0]); !s.ok()) return Fail(s.status());

    std::vector<double> move_s, memcpy_s;
    std::vector<std::byte> a(bytes, std::byte{1}), b(bytes);
    for (int r = 0; r < args.reps + 1; ++r) {
      const size_t to = 1 - *e.Session(1)->device;
      const auto t0 = Clock::now();
      if (auto s = e.Migrate(1, to); !s.ok()) return Fail(s);
      for (auto ts = e.TakeTransfers(); !ts.empty(); ts = e.TakeTransfers()) {
        for (const salus::mem::Transfer& t : ts) {
          salus::device::MemoryProvider& p = e.provider(t.device_index);
          const auto c0 = Clock::now();
          const salus::Status copy = t.to_host ? p.CopyToHost(t.host, t.device, t.bytes)
                                               : p.CopyToDevice(t.device, t.host, t.bytes);
          if (auto s = e.FinishTransfer(t, copy, Clock::now() - c0); !s.ok()) return Fail(s);
        }
      }
      const auto t1 = Clock::now();
      const auto info = e.Session(1);
      if (!info.ok() || info->device != to || info->copying) {
        return Fail(salus::InternalError("the session did not arrive"));
      }
      const auto m0 = Clock::now();
      std::memcpy(b.data(), a.data(), bytes);
      const auto m1 = Clock::now();
      if (r == 0) continue;  // warm-up: the target arena's and host memory's first touches
      move_s.push_back(Seconds(t0, t1));
      memcpy_s.push_back(Seconds(m0, m1));
    }
    const double mb = static_cast<double>(bytes) / static_cast<double>(kMiB);
    const double move = Median(move_s), mc = Median(memcpy_s);
    std::cout << fmt::format(
                     "{{\"device\": \"cpu:2\", \"mib\": {}, \"move_ms\": {:.3f}, "
                     "\"move_mib_s\": {:.0f}, \"memcpy_ms\": {:.3f}, \"memcpy_mib_s\": {:.0f}, "
                     "\"move_vs_memcpy\": {:.2f}}}",
                     mib, move * 1e3, mb / move, mc * 1e3, mb / mc, move / mc)
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  salus::bench::CopyBenchArgs args;
  if (!salus::bench::ParseCopyBenchArgs(argc, argv, &args)) return 2;
  salus::logging::SetLevel("warn").IgnoreError();  // an event per move would flood stderr
  return Run(args);
}
