// Paging a session's persistent block out to host memory and back in (Note [Paging] in
// src/mem/arena_memory_manager.cc), against its size, on a real provider: the host arena on
// the CPU device (`--device cuda:0` on a GPU: pinned host memory, the provider's copy
// stream). Each repetition is what the daemon does to make room: PageIn of a second session,
// which pages the first out (its block copied to host memory), then PageIn of the first
// (copied back); the copies run through MemoryProvider::CopyToHost/CopyToDevice as the
// executor's copy thread runs them. Beside it, a bare memcpy of the same bytes between two
// host buffers, measured in the same run: the ratio is what paging costs over the copy
// itself. Prints one JSON line per size with medians and MiB/s.
//
//   paging_bench [--device cpu|cuda:N] [--sizes-mib 16,64,256,1024] [--reps 7]
#include <fmt/format.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/units.h"
#include "copy_bench_util.h"
#include "device/memory_provider.h"
#include "mem/memory_manager.h"
#include "sched/admission_rules.h"

namespace {

using salus::kMiB;
using salus::bench::Clock;
using salus::bench::Median;
using salus::bench::Seconds;

// Runs every copy the manager has ready; adds the seconds each took to `out` or `in`.
void RunCopies(salus::mem::MemoryManager& m, salus::device::MemoryProvider& p, double* out,
               double* in) {
  for (auto ts = m.TakeTransfers(); !ts.empty(); ts = m.TakeTransfers()) {
    for (const salus::mem::Transfer& t : ts) {
      const auto start = Clock::now();
      const salus::Status s = t.to_host ? p.CopyToHost(t.host, t.device, t.bytes)
                                        : p.CopyToDevice(t.device, t.host, t.bytes);
      *(t.to_host ? out : in) += Seconds(start, Clock::now());
      if (!s.ok() || !m.FinishTransfer(t.id, s).ok()) {
        std::cerr << "copy failed: " << s << "\n";
        std::exit(1);
      }
    }
  }
}

int Run(const std::string& device, const std::vector<uint64_t>& sizes_mib, int reps) {
  auto provider = salus::device::CreateMemoryProvider(device);
  if (!provider.ok()) {
    std::cerr << provider.status() << "\n";
    return 1;
  }
  for (const uint64_t mib : sizes_mib) {
    const uint64_t bytes = mib * kMiB;
    salus::mem::MemoryManager::Options o;
    o.provider = provider->get();
    o.capacity = bytes + bytes / 2;  // one block and its lane fit, two do not
    o.rule = salus::sched::PackRule();
    o.overcommit = 3.0;
    o.host_pool_bytes = 2 * bytes;  // as the engine keeps it: (overcommit - 1) × C
    auto m = salus::mem::MemoryManager::Create(o);
    if (!m.ok()) {
      std::cerr << m.status() << "\n";
      return 1;
    }
    salus::mem::MemoryManager& mm = **m;
    if (!mm.Admit(1, {bytes, kMiB}).ok() || !mm.Admit(2, {bytes, kMiB}).ok()) return 1;
    // Session 1 resident, 2 admitted paged out. Touch 1's block so its pages are real.
    auto block = mm.Persistent(1);
    if (block.ok() && (*provider)->host_accessible()) std::memset(block->address, 1, bytes);
    std::vector<double> out_s, in_s, pagein_call_s, memcpy_s;
    std::vector<std::byte> a(bytes, std::byte{1}), b(bytes);
    for (int r = 0; r < reps + 1; ++r) {
      // 2 in (fresh the first time), 1 out; then 1 back in, 2 out. Each page-out's copy
      // and each page-in's copy is timed on its own.
      double out = 0, in = 0;
      auto t0 = Clock::now();
      auto r1 = mm.PageIn(2, std::vector<salus::mem::SessionId>{1});
      auto t1 = Clock::now();
      RunCopies(mm, **provider, &out, &in);
      auto t2 = Clock::now();
      auto r2 = mm.PageIn(1, std::vector<salus::mem::SessionId>{2});
      auto t3 = Clock::now();
      RunCopies(mm, **provider, &out, &in);
      if (!r1.ok() || !r2.ok() || !r1->resident || !r2->resident) {
        std::cerr << "page-in refused\n";
        return 1;
      }
      const auto m0 = Clock::now();
      std::memcpy(b.data(), a.data(), bytes);
      const auto m1 = Clock::now();
      if (r == 0) continue;      // warm-up: first touches of host memory
      out_s.push_back(out / 2);  // two page-outs per repetition
      in_s.push_back(in / 2);    // and two page-ins (session 2 is fresh only in the warm-up)
      pagein_call_s.push_back((Seconds(t0, t1) + Seconds(t2, t3)) / 2);
      memcpy_s.push_back(Seconds(m0, m1));
    }
    const double mb = static_cast<double>(bytes) / static_cast<double>(kMiB);
    const double out = Median(out_s), in = Median(in_s), mc = Median(memcpy_s);
    std::cout
        << fmt::format(
               "{{\"device\": \"{}\", \"mib\": {}, \"page_out_ms\": {:.3f}, "
               "\"page_in_ms\": {:.3f}, \"page_out_mib_s\": {:.0f}, \"page_in_mib_s\": {:.0f}, "
               "\"decision_us\": {:.1f}, \"memcpy_ms\": {:.3f}, \"memcpy_mib_s\": {:.0f}, "
               "\"out_vs_memcpy\": {:.2f}}}",
               device, mib, out * 1e3, in * 1e3, mb / out, mb / in, Median(pagein_call_s) * 1e6,
               mc * 1e3, mb / mc, out / mc)
        << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  salus::bench::CopyBenchArgs args;
  if (!salus::bench::ParseCopyBenchArgs(argc, argv, &args)) return 2;
  return Run(args.device, args.sizes_mib, args.reps);
}
