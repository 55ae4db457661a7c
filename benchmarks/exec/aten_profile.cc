// salus-aten-profile: where an ATen graph's step spends its time in the engine.
//
//   build/bin/salus-aten-profile --graph step.aten [--iters 20] [--warmup 3] [--no-fuse]
//
// Compiles a serialized salus.v1.AtenGraph (as salus_torch traces it; write one with
// `traced.graph.SerializeToString()`) on the CPU with profiling on, runs it with seeded random
// inputs and zero state, and prints the median step time, when its fetches (the loss) were
// ready within it (Note [Fetches before the end] in exec/executable.cc), and the seconds per
// iteration spent in each engine op type, largest first. `--no-fuse` compiles every node as
// imported (the graph rewrites of exec/fusion.h off), for a before and after of those rewrites in
// one run.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "bench_io.h"
#include "exec/device.h"
#include "exec/executable.h"

namespace po = boost::program_options;
using salus::exec::CompileOptions;
using salus::exec::DeviceBuffer;
using salus::exec::Executable;

int main(int argc, char** argv) {
  std::string path;
  int iters = 20, warmup = 3;
  po::options_description desc("salus-aten-profile");
  desc.add_options()("help", "this message")("graph", po::value(&path)->required(),
                                             "a serialized salus.v1.AtenGraph")(
      "iters", po::value(&iters)->default_value(20), "timed iterations")(
      "warmup", po::value(&warmup)->default_value(3), "untimed iterations first")(
      "no-fuse", "compile every node as imported (no graph rewrites)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n" << desc << "\n";
    return 2;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot read " << path << "\n";
    return 2;
  }
  std::stringstream bytes;
  bytes << in.rdbuf();
  CompileOptions o;
  o.profile = true;
  o.fuse = vm.count("no-fuse") == 0;
  auto exe = Executable::CompileAten(bytes.str(), o);
  if (!exe.ok()) {
    std::cerr << exe.status() << "\n";
    return 1;
  }
  Executable& x = **exe;
  auto persistent = DeviceBuffer::Allocate(x.runtime(), x.persistent_bytes());
  auto lane = DeviceBuffer::Allocate(x.runtime(), x.ephemeral_bytes());
  if (!persistent.ok() || !lane.ok() || !x.InitializePersistent(persistent->get()).ok()) {
    std::cerr << "cannot allocate or initialise the step's memory\n";
    return 1;
  }
  salus::exec::bench::Io io = salus::exec::bench::MakeIo(x);
  std::vector<double> ms, fetched_ms;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto since = [&start] {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
          .count();
    };
    double fetched = 0;
    if (auto st = x.Run(persistent->get(), lane->get(), io.feed_ptrs, io.out_ptrs,
                        [&] { fetched = since(); });
        !st.ok()) {
      std::cerr << st << "\n";
      return 1;
    }
    if (i >= warmup) {
      ms.push_back(since());
      fetched_ms.push_back(fetched);
    }
  }
  std::sort(ms.begin(), ms.end());
  std::sort(fetched_ms.begin(), fetched_ms.end());
  std::cout << "nodes " << x.graph().nodes().size() << ", P " << x.persistent_bytes() << " B, E "
            << x.ephemeral_bytes() << " B, median step " << ms[ms.size() / 2] << " ms\n"
            << "fetches ready after " << x.fetch_ready_steps() << " of " << x.num_steps()
            << " steps, median " << fetched_ms[fetched_ms.size() / 2] << " ms\n";
  std::vector<std::pair<double, std::string>> per_op;
  for (const auto& [op, seconds] : x.Profile()) per_op.emplace_back(seconds, op);
  std::sort(per_op.rbegin(), per_op.rend());
  const double runs = warmup + iters;
  for (const auto& [seconds, op] : per_op) {
    std::cout << "  " << op << " " << seconds / runs * 1e3 << " ms/iter\n";
  }
  return 0;
}
