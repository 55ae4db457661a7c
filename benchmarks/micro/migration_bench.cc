// Moving a session between two devices (Note [Migration] in src/sched/engine.cc), against its
// persistent size, through the engine on real providers: two CPU devices (host arenas), as
// `salus-server --device cpu:2` runs them, or two GPUs (`--device cuda`: cuda:0 and cuda:1).
// Each repetition is one Engine::Migrate of an idle session to the other device, until it can
// run there, with the copies run as the executor's copy thread runs them: by default one peer
// copy into the target's block (MemoryProvider::CopyToPeer; between GPUs, direct where they
// have peer access), and, beside it in the same run, through host memory (CopyToHost, then
// CopyToDevice: Engine::Options::peer_moves off). Beside both, a bare memcpy of the same bytes
// (on the host). Prints one JSON line per size with medians and MiB/s.
//
//   migration_bench [--device cpu|cuda] [--sizes-mib 16,64,256,1024] [--reps 7]
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

// Runs every copy the engine has ready until none is left, as the executor's copy thread does.
salus::Status RunCopies(salus::sched::Engine& e) {
  for (auto ts = e.TakeTransfers(); !ts.empty(); ts = e.TakeTransfers()) {
    for (const salus::mem::Transfer& t : ts) {
      const auto c0 = Clock::now();
      const salus::Status copy = salus::sched::RunCopy(e, t);
      SALUS_RETURN_IF_ERROR(e.FinishTransfer(t, copy, Clock::now() - c0));
    }
  }
  return salus::OkStatus();
}

// The median seconds of `reps` moves of a session of `bytes` between two devices named by
// `provider_names`, by peer copy or through host memory.
salus::StatusOr<double> TimeMoves(const std::vector<std::string>& provider_names, uint64_t bytes,
                                  int reps, bool peer) {
  std::vector<std::unique_ptr<salus::device::MemoryProvider>> providers;
  for (const std::string& name : provider_names) {
    SALUS_ASSIGN_OR_RETURN(auto p, salus::device::CreateMemoryProvider(name));
    providers.push_back(std::move(p));
  }
  salus::sched::Engine::Options o;
  o.clock = salus::SteadyClock::Get();
  o.peer_moves = peer;
  SALUS_ASSIGN_OR_RETURN(o.policy, salus::sched::CreatePolicy("fair"));
  const uint64_t capacity = bytes + bytes / 2;  // the session fits either device
  SALUS_ASSIGN_OR_RETURN(
      o.devices, salus::sched::MakeDevices(
                     *o.policy, o.clock,
                     {{"a", providers[0].get(), capacity}, {"b", providers[1].get(), capacity}}));
  SALUS_ASSIGN_OR_RETURN(auto engine, salus::sched::Engine::Create(std::move(o)));
  salus::sched::Engine& e = *engine;
  salus::sched::SessionSpec spec;
  spec.requirement = {bytes, kMiB};
  SALUS_ASSIGN_OR_RETURN(const bool admitted, e.AddSession(1, spec));
  if (!admitted) return salus::InternalError("the session was not admitted");
  // One iteration, to touch the block's pages as a job's first iteration does (on the CPU).
  SALUS_RETURN_IF_ERROR(e.RequestIteration(1));
  const auto ds = e.DispatchReady();
  if (ds.size() != 1) return salus::InternalError("no dispatch");
  if (e.provider(0).host_accessible()) std::memset(ds[0].persistent.address, 1, bytes);
  SALUS_RETURN_IF_ERROR(e.Complete(ds[0]).status());
  std::vector<double> move_s;
  for (int r = 0; r < reps + 1; ++r) {  // the first: the arenas' and host memory's first touches
    const size_t to = 1 - *e.Session(1)->device;
    const auto t0 = Clock::now();
    SALUS_RETURN_IF_ERROR(e.Migrate(1, to));
    SALUS_RETURN_IF_ERROR(RunCopies(e));
    const auto t1 = Clock::now();
    const auto info = e.Session(1);
    if (!info.ok() || info->device != to || info->copying) {
      return salus::InternalError("the session did not arrive");
    }
    if (r > 0) move_s.push_back(Seconds(t0, t1));
  }
  return Median(move_s);
}

int Run(const salus::bench::CopyBenchArgs& args) {
  std::vector<std::string> names;
  if (args.device == "cpu") {
    names = {"cpu", "cpu"};
  } else if (args.device == "cuda") {
    names = {"cuda:0", "cuda:1"};
  } else {
    return Fail(salus::InvalidArgumentError(fmt::format(
        "--device {}: expected cpu (two CPU devices) or cuda (cuda:0 and cuda:1)", args.device)));
  }
  for (const uint64_t mib : args.sizes_mib) {
    const uint64_t bytes = mib * kMiB;
    auto peer = TimeMoves(names, bytes, args.reps, true);
    if (!peer.ok()) return Fail(peer.status());
    auto host = TimeMoves(names, bytes, args.reps, false);
    if (!host.ok()) return Fail(host.status());
    std::vector<double> memcpy_s;
    std::vector<std::byte> a(bytes, std::byte{1}), b(bytes);
    for (int r = 0; r < args.reps + 1; ++r) {
      const auto m0 = Clock::now();
      std::memcpy(b.data(), a.data(), bytes);
      const auto m1 = Clock::now();
      if (r > 0) memcpy_s.push_back(Seconds(m0, m1));
    }
    const double mb = static_cast<double>(bytes) / static_cast<double>(kMiB);
    const double mc = Median(memcpy_s);
    std::cout << fmt::format(
                     "{{\"device\": \"{}\", \"mib\": {}, \"peer_ms\": {:.3f}, "
                     "\"peer_mib_s\": {:.0f}, \"host_ms\": {:.3f}, \"host_mib_s\": {:.0f}, "
                     "\"memcpy_ms\": {:.3f}, \"memcpy_mib_s\": {:.0f}, "
                     "\"peer_vs_host\": {:.2f}, \"peer_vs_memcpy\": {:.2f}}}",
                     names[0] == "cpu" ? "cpu:2" : "cuda:0,cuda:1", mib, *peer * 1e3, mb / *peer,
                     *host * 1e3, mb / *host, mc * 1e3, mb / mc, *peer / *host, *peer / mc)
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
