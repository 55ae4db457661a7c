// What the copy benchmarks (paging_bench, migration_bench) share: medians, timing, and their
// command line (--device, --sizes-mib, --reps).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace salus::bench {

using Clock = std::chrono::steady_clock;

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct CopyBenchArgs {
  std::string device = "cpu";
  std::vector<uint64_t> sizes_mib = {16, 64, 256, 1024};
  int reps = 7;
};

// Parses --device, --sizes-mib a,b,c and --reps; false (after saying why) on anything else.
inline bool ParseCopyBenchArgs(int argc, char** argv, CopyBenchArgs* args) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::cerr << flag << " needs a value\n";
      return false;
    }
    const std::string value = argv[i + 1];
    if (flag == "--device") {
      args->device = value;
    } else if (flag == "--reps") {
      args->reps = std::max(1, std::stoi(value));
    } else if (flag == "--sizes-mib") {
      args->sizes_mib.clear();
      std::stringstream ss(value);
      for (std::string part; std::getline(ss, part, ',');) {
        args->sizes_mib.push_back(std::stoull(part));
      }
    } else {
      std::cerr << "unknown flag " << flag << "\n";
      return false;
    }
  }
  return true;
}

}  // namespace salus::bench
