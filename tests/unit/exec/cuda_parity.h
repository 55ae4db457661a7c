// Parity of the CUDA device with the CPU: a model compiled for both, fed the same seeded random
// inputs, must give the same outputs within a relative tolerance; and two GPU runs in lanes at
// different addresses must give bit-identical outputs (the kernels are deterministic and
// relocatable). Tests using it are labelled `gpu` and skip, saying why, without a usable GPU.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "exec/alignment.h"
#include "exec/device.h"
#include "exec/executable.h"

namespace salus::exec::testing {

// The reason cuda:0 cannot be used, or "" when it can.
inline std::string NoGpuReason() {
  auto rt = DeviceRuntime::For(Device{DeviceType::kCuda, 0});
  if (!rt.ok()) return rt.status().ToString();
  auto ctx = (*rt)->ThreadContext();
  if (!ctx.ok()) return ctx.status().ToString();
  return "";
}

#define SALUS_REQUIRE_GPU()                                                     \
  do {                                                                          \
    const std::string salus_no_gpu = ::salus::exec::testing::NoGpuReason();     \
    if (!salus_no_gpu.empty()) GTEST_SKIP() << "needs a GPU: " << salus_no_gpu; \
  } while (0)

struct ParityOptions {
  double rtol = 1e-4;  // |gpu - cpu| <= atol + rtol * |cpu|
  double atol = 1e-5;
  uint64_t seed = 1;
  float lo = -1.f, hi = 1.f;                // float feeds are uniform in [lo, hi)
  int64_t int_hi = 2;                       // int64 feeds are uniform in [0, int_hi)
  std::map<std::string, HostTensor> feeds;  // fixed feeds, by input name
  // Training: when > 0, optimizer state (velocities, moments) is compared by the norm of its
  // difference relative to the CPU's norm, within this; else element by element, as the
  // parameters always are. Over many steps a velocity, a running sum of gradients, follows
  // the small differences of summation order through every ReLU kink it crosses.
  double state_norm_rtol = 0;
};

// The outputs of one run of `exe` on its device, with the given persistent and lane memory.
inline std::vector<HostTensor> RunOnce(Executable& exe, std::byte* persistent, std::byte* lane,
                                       const std::vector<HostTensor>& feeds) {
  std::vector<const void*> in;
  for (const HostTensor& f : feeds) in.push_back(f.bytes.data());
  std::vector<HostTensor> out;
  std::vector<void*> ptrs;
  for (const TensorInfo& f : exe.fetches()) out.emplace_back(f.type, f.shape);
  for (HostTensor& t : out) ptrs.push_back(t.bytes.data());
  Status st = exe.Run(persistent, lane, in, ptrs);
  EXPECT_TRUE(st.ok()) << exe.device().name() << ": " << st.ToString();
  return out;
}

inline std::vector<HostTensor> RandomFeeds(const Executable& exe, const ParityOptions& p) {
  std::mt19937_64 rng(p.seed);
  std::vector<HostTensor> feeds;
  for (const TensorInfo& in : exe.inputs()) {
    auto fixed = p.feeds.find(in.name);
    if (fixed != p.feeds.end()) {
      feeds.push_back(fixed->second);
      continue;
    }
    HostTensor t(in.type, in.shape);
    const int64_t n = t.num_elements();
    if (in.type == DataType::kFloat32) {
      std::uniform_real_distribution<float> d(p.lo, p.hi);
      for (int64_t i = 0; i < n; ++i) t.floats()[i] = d(rng);
    } else if (in.type == DataType::kInt64) {
      std::uniform_int_distribution<int64_t> d(0, p.int_hi - 1);
      for (int64_t i = 0; i < n; ++i) t.int64s()[i] = d(rng);
    } else {
      for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = std::byte(rng() & 1);
    }
    feeds.push_back(std::move(t));
  }
  return feeds;
}

inline void ExpectClose(const HostTensor& cpu, const HostTensor& gpu, const std::string& what,
                        const ParityOptions& p) {
  ASSERT_EQ(cpu.shape, gpu.shape) << what;
  ASSERT_EQ(cpu.bytes.size(), gpu.bytes.size()) << what;
  if (cpu.type != DataType::kFloat32) {
    EXPECT_EQ(cpu.bytes, gpu.bytes) << what;
    return;
  }
  int bad = 0;
  for (int64_t i = 0; i < cpu.num_elements(); ++i) {
    const double a = cpu.floats()[i], b = gpu.floats()[i];
    const bool same_nan = std::isnan(a) && std::isnan(b);
    const bool same_inf = std::isinf(a) && a == b;
    if (same_nan || same_inf || std::abs(a - b) <= p.atol + p.rtol * std::abs(a)) continue;
    if (++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: cpu " << a << " gpu " << b;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << cpu.num_elements() << " elements differ";
}

// `model` compiled with `o` for the CPU and for cuda:0; a null one (with a test failure) where
// compiling failed.
inline std::pair<std::unique_ptr<Executable>, std::unique_ptr<Executable>> CompileOnBoth(
    const std::string& model, CompileOptions o) {
  std::pair<std::unique_ptr<Executable>, std::unique_ptr<Executable>> both;
  o.device = Device{};
  auto cpu = Executable::Compile(model, o);
  EXPECT_TRUE(cpu.ok()) << "cpu: " << cpu.status().ToString();
  if (cpu.ok()) both.first = std::move(*cpu);
  o.device = Device{DeviceType::kCuda, 0};
  auto gpu = Executable::Compile(model, o);
  EXPECT_TRUE(gpu.ok()) << "cuda:0: " << gpu.status().ToString();
  if (gpu.ok()) both.second = std::move(*gpu);
  return both;
}

// See the file comment. Returns the CPU outputs (for further checks).
inline std::vector<HostTensor> ExpectCudaParity(const std::string& model, CompileOptions o = {},
                                                const ParityOptions& p = {}) {
  auto [cpu, gpu] = CompileOnBoth(model, o);
  if (cpu == nullptr || gpu == nullptr) return {};
  Executable& c = *cpu;
  Executable& g = *gpu;
  EXPECT_EQ(c.persistent_bytes(), g.persistent_bytes());
  const std::vector<HostTensor> feeds = RandomFeeds(c, p);

  DeviceRuntime* host = c.runtime();
  auto hp = DeviceBuffer::Allocate(host, c.persistent_bytes());
  auto hl = DeviceBuffer::Allocate(host, c.ephemeral_bytes());
  EXPECT_TRUE(c.InitializePersistent(hp->get()).ok());
  const std::vector<HostTensor> want = RunOnce(c, hp->get(), hl->get(), feeds);

  DeviceRuntime* dev = g.runtime();
  auto gp = DeviceBuffer::Allocate(dev, g.persistent_bytes());
  auto lane_a = DeviceBuffer::Allocate(dev, g.ephemeral_bytes());
  // A second lane at another address, offset by one alignment unit so no planned offset
  // coincides with the first lane's.
  auto lane_b = DeviceBuffer::Allocate(dev, g.ephemeral_bytes() + kAlignment);
  EXPECT_TRUE(gp.ok() && lane_a.ok() && lane_b.ok());
  if (!gp.ok() || !lane_a.ok() || !lane_b.ok()) return want;
  Status init = g.InitializePersistent(gp->get());
  EXPECT_TRUE(init.ok()) << init.ToString();
  const std::vector<HostTensor> got = RunOnce(g, gp->get(), lane_a->get(), feeds);
  const std::vector<HostTensor> again = RunOnce(g, gp->get(), lane_b->get() + kAlignment, feeds);
  EXPECT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const std::string& name = c.fetches()[i].name;
    ExpectClose(want[i], got[i], name, p);
    EXPECT_EQ(got[i].bytes, again[i].bytes) << name << ": not bit-identical in another lane";
  }
  return want;
}

// Training: the fetches of every step and the persistent values (parameters and optimizer
// state) after the last, read back to the host.
struct Trained {
  std::vector<std::vector<HostTensor>> steps;
  std::map<std::string, HostTensor> state;
  std::set<std::string> optimizer_state;  // the names in `state` that are optimizer state
};

// `steps` iterations of `exe` on its device from freshly initialized persistent memory, on the
// same feeds; with `alternate`, odd steps run in a second lane at another address (the state
// stays put, the lane moves, as between the daemon's iterations).
inline Trained TrainOn(Executable& exe, const std::vector<HostTensor>& feeds, int steps,
                       bool alternate) {
  Trained t;
  DeviceRuntime* rt = exe.runtime();
  auto p = DeviceBuffer::Allocate(rt, exe.persistent_bytes());
  auto la = DeviceBuffer::Allocate(rt, exe.ephemeral_bytes());
  auto lb = DeviceBuffer::Allocate(rt, exe.ephemeral_bytes() + kAlignment);
  EXPECT_TRUE(p.ok() && la.ok() && lb.ok());
  if (!p.ok() || !la.ok() || !lb.ok()) return t;
  Status init = exe.InitializePersistent(p->get());
  EXPECT_TRUE(init.ok()) << init.ToString();
  for (int s = 0; s < steps; ++s) {
    std::byte* lane = alternate && s % 2 == 1 ? lb->get() + kAlignment : la->get();
    t.steps.push_back(RunOnce(exe, p->get(), lane, feeds));
  }
  for (const Value& v : exe.graph().values()) {
    if (!v.persistent() || v.kind == ValueKind::kConstant) continue;
    auto value = exe.ReadPersistent(p->get(), v.name);
    if (!value.ok()) continue;
    t.state.emplace(v.name, std::move(*value));
    if (v.kind == ValueKind::kState) t.optimizer_state.insert(v.name);
  }
  return t;
}

// Two runs' losses (every step's first fetch) and final states, bit for bit.
inline void ExpectBitIdentical(const Trained& want, const Trained& got) {
  ASSERT_EQ(want.steps.size(), got.steps.size());
  for (size_t s = 0; s < want.steps.size(); ++s) {
    EXPECT_EQ(want.steps[s][0].bytes, got.steps[s][0].bytes) << "step " << s;
  }
  ASSERT_EQ(want.state.size(), got.state.size());
  for (const auto& [state, value] : want.state) {
    auto g = got.state.find(state);
    ASSERT_NE(g, got.state.end()) << state;
    EXPECT_EQ(value.bytes, g->second.bytes) << state;
  }
}

// A training compile of `model` (o.mode kTraining, its loss and optimizer set) on the CPU and on
// cuda:0, `steps` steps on the same random feeds: every step's fetches and the final state
// match the CPU's within p's tolerance; and two GPU runs, one moving between lanes, are
// bit-identical. Returns the CPU's run.
inline Trained ExpectTrainingParity(const std::string& model, CompileOptions o,
                                    const ParityOptions& p, int steps) {
  auto [cpu, gpu] = CompileOnBoth(model, o);
  if (cpu == nullptr || gpu == nullptr) return {};
  EXPECT_EQ(cpu->persistent_bytes(), gpu->persistent_bytes());
  const std::vector<HostTensor> feeds = RandomFeeds(*cpu, p);
  Trained want = TrainOn(*cpu, feeds, steps, false);
  const Trained got = TrainOn(*gpu, feeds, steps, true);
  const Trained again = TrainOn(*gpu, feeds, steps, false);
  EXPECT_EQ(want.steps.size(), got.steps.size());
  for (size_t s = 0; s < want.steps.size() && s < got.steps.size(); ++s) {
    for (size_t i = 0; i < want.steps[s].size() && i < got.steps[s].size(); ++i) {
      const std::string what = "step " + std::to_string(s) + " " + gpu->fetches()[i].name;
      ExpectClose(want.steps[s][i], got.steps[s][i], what, p);
      if (s < again.steps.size()) {
        EXPECT_EQ(got.steps[s][i].bytes, again.steps[s][i].bytes)
            << what << ": not bit-identical in a second run";
      }
    }
  }
  EXPECT_EQ(want.state.size(), got.state.size());
  for (const auto& [name, value] : want.state) {
    auto g = got.state.find(name);
    if (g == got.state.end()) {
      ADD_FAILURE() << name << ": not in the GPU's state";
      continue;
    }
    if (p.state_norm_rtol > 0 && want.optimizer_state.count(name) > 0 &&
        value.type == DataType::kFloat32 && value.shape == g->second.shape) {
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < value.num_elements(); ++i) {
        const double a = value.floats()[i], b = g->second.floats()[i];
        diff += (a - b) * (a - b);
        norm += a * a;
      }
      EXPECT_LE(std::sqrt(diff), p.state_norm_rtol * std::sqrt(norm) + p.atol)
          << "state " << name << ": the GPU's differs from the CPU's by "
          << std::sqrt(diff / std::max(norm, 1e-300)) << " of its norm";
    } else {
      ExpectClose(value, g->second, "state " + name, p);
    }
    auto a = again.state.find(name);
    if (a != again.state.end()) {
      EXPECT_EQ(g->second.bytes, a->second.bytes) << name << ": not bit-identical in a second run";
    }
  }
  return want;
}

}  // namespace salus::exec::testing
