// What the executable benchmarks feed an executable and fetch from it: seeded random inputs
// (class indices for int64 inputs, uniform [-1, 1) floats otherwise) and output buffers.
#pragma once

#include <random>
#include <vector>

#include "exec/executable.h"

namespace salus::exec::bench {

struct Io {
  std::vector<HostTensor> feeds, outs;
  std::vector<const void*> feed_ptrs;
  std::vector<void*> out_ptrs;
};

inline Io MakeIo(const Executable& x, unsigned seed = 1) {
  Io io;
  std::mt19937 rng(seed);
  for (const TensorInfo& info : x.inputs()) {
    HostTensor t(info.type, info.shape);
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      if (info.type == DataType::kInt64) {
        t.int64s()[i] = static_cast<int64_t>(rng() % 10);
      } else {
        t.floats()[i] = std::uniform_real_distribution<float>(-1.f, 1.f)(rng);
      }
    }
    io.feeds.push_back(std::move(t));
  }
  for (const HostTensor& t : io.feeds) io.feed_ptrs.push_back(t.bytes.data());
  for (const TensorInfo& info : x.fetches()) io.outs.emplace_back(info.type, info.shape);
  for (HostTensor& t : io.outs) io.out_ptrs.push_back(t.bytes.data());
  return io;
}

}  // namespace salus::exec::bench
