// salus-swap-bench: what swapping activations to host memory buys and costs, per reference
// model: E at each point the swap planner offers, the peak memory saved, and the iteration
// time against the unswapped plan, measured side by side in one run.
//
//   salus-swap-bench [--models mlp,lenet5,...] [--warmup 5] [--iters 20] [--bandwidth B/s]
//                    [--estimated] [--copies auto|thread|inline] [--device cpu|cuda:N]
//
// Each model is compiled for training (SGD, momentum 0.9) on --device and run `warmup`
// iterations; without --estimated these are profiled and the points are then planned again
// from the measured step times. The timed iterations go round-robin over the points on one
// executable (SelectSwapPoint before each), so every point sees the same machine load; each point's
// median is compared with the unswapped point's. Prints one JSON line per model and a
// Markdown table. Inputs are seeded: floats in [-1, 1), int64 inputs in [0, 10).
#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "bench_io.h"
#include "exec/executable.h"

namespace po = boost::program_options;
using namespace salus::exec;  // NOLINT(google-build-using-namespace)

namespace {

struct ModelSpec {
  std::string name;
  std::map<std::string, Shape> shapes;
};

// The five models of exec_models_test at its batches, and the exported ones at compare.py's.
const std::vector<ModelSpec>& Models() {
  static const std::vector<ModelSpec> models = {
      {"mlp", {{"x", {32, 784}}, {"labels", {32}}}},
      {"lenet5", {{"x", {32, 1, 28, 28}}, {"labels", {32}}}},
      {"resnet", {{"x", {32, 3, 32, 32}}, {"labels", {32}}}},
      {"espcn", {{"x", {8, 1, 16, 16}}, {"target", {8, 1, 48, 48}}}},
      {"vae", {{"x", {32, 784}}, {"eps", {32, 20}}}},
      {"resnet18", {{"x", {32, 3, 32, 32}}, {"labels", {32}}}},
      {"mobilenetv2", {{"x", {32, 3, 32, 32}}, {"labels", {32}}}},
      {"transformer", {{"tokens", {32, 32}}, {"labels", {32}}}},
      {"gpt", {{"tokens", {16, 32}}, {"labels", {16, 32}}}},
      {"lstm", {{"tokens", {32, 32}}, {"labels", {32}}}},
  };
  return models;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One core's memcpy between two 64 MiB host buffers, in bytes/s (what a CPU swap costs).
double MemcpyBandwidth() {
  constexpr size_t kBytes = size_t{64} << 20;
  std::vector<char> a(kBytes, 1), b(kBytes, 2);
  std::vector<double> secs;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), kBytes);
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return static_cast<double>(kBytes) / Median(secs);
}

struct PointResult {
  uint64_t ephemeral_bytes = 0, host_bytes = 0;
  size_t swaps = 0;
  double expected_ms = 0;
  std::vector<double> times_ms;
};

std::string ReadModel(const ModelSpec& spec) {
  std::ifstream f(std::string(SALUS_MODELS_DIR) + "/" + spec.name + ".onnx", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Training with SGD and momentum at the spec's shapes on `device`, copies as asked.
CompileOptions TrainingOptions(const ModelSpec& spec, const Device& device, SwapCopies copies) {
  CompileOptions o;
  o.device = device;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer.learning_rate = 0.01f;
  o.optimizer.momentum = 0.9f;
  o.input_shapes = spec.shapes;
  o.swap_copies = copies;
  return o;
}

// Benchmarks one model; false (with a message) when it cannot run.
// Profiles the warm-up only for re-planning from measured step times: on a GPU, profiling
// synchronises after every step.
bool Bench(const ModelSpec& spec, const Device& device, int warmup, int iters, double bandwidth,
           bool estimated, SwapCopies copies, nlohmann::json* out) {
  const std::string model = ReadModel(spec);
  CompileOptions o = TrainingOptions(spec, device, copies);
  o.profile = !estimated;
  o.swap_bandwidth = bandwidth;
  const auto compile_start = std::chrono::steady_clock::now();
  auto exe = Executable::Compile(model, o);
  const double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - compile_start)
          .count();
  if (!exe.ok()) {
    std::cerr << spec.name << ": " << exe.status() << "\n";
    return false;
  }
  Executable& x = **exe;
  // Point 0 needs the largest lane; every point fits in it.
  const uint64_t lane_bytes = x.SwapPoints().front().ephemeral_bytes;
  auto persistent = DeviceBuffer::Allocate(x.runtime(), x.persistent_bytes());
  auto lane = DeviceBuffer::Allocate(x.runtime(), lane_bytes);
  if (!persistent.ok() || !lane.ok()) {
    std::cerr << (persistent.ok() ? lane.status() : persistent.status()) << "\n";
    return false;
  }
  if (salus::Status st = x.InitializePersistent(persistent->get()); !st.ok()) {
    std::cerr << st << "\n";
    return false;
  }
  bench::Io io = bench::MakeIo(x);
  std::vector<const void*>& feed_ptrs = io.feed_ptrs;
  std::vector<void*>& out_ptrs = io.out_ptrs;
  auto run = [&]() -> salus::StatusOr<double> {
    const auto start = std::chrono::steady_clock::now();
    SALUS_RETURN_IF_ERROR(x.Run(persistent->get(), lane->get(), feed_ptrs, out_ptrs));
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };

  for (int i = 0; i < warmup; ++i) {
    if (auto t = run(); !t.ok()) {
      std::cerr << spec.name << ": " << t.status() << "\n";
      return false;
    }
  }
  double plan_ms = 0;
  if (!estimated) {
    const auto plan_start = std::chrono::steady_clock::now();
    if (salus::Status st = x.ReplanSwaps(); !st.ok()) {
      std::cerr << spec.name << ": " << st << "\n";
      return false;
    }
    plan_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - plan_start)
            .count();
  }
  const std::vector<SwapPoint> points = x.SwapPoints();
  std::vector<PointResult> results(points.size());
  for (size_t p = 0; p < points.size(); ++p) {
    results[p].ephemeral_bytes = points[p].ephemeral_bytes;
    results[p].host_bytes = points[p].host_bytes;
    results[p].swaps = points[p].swaps.size();
    results[p].expected_ms = points[p].expected_seconds * 1e3;
  }
  // Round-robin over the points: each iteration of the loop runs every point once.
  for (int i = 0; i < iters + 2; ++i) {
    for (size_t p = 0; p < points.size(); ++p) {
      if (salus::Status st = x.SelectSwapPoint(p); !st.ok()) {
        std::cerr << spec.name << ": " << st << "\n";
        return false;
      }
      auto t = run();
      if (!t.ok()) {
        std::cerr << spec.name << " at point " << p << ": " << t.status() << "\n";
        return false;
      }
      if (i >= 2) results[p].times_ms.push_back(*t);  // two untimed rounds per point
    }
  }
  const double base_ms = Median(results[0].times_ms);
  nlohmann::json j = {{"model", spec.name},
                      {"compile_ms", compile_ms},
                      {"plan_ms", plan_ms},
                      {"points", nlohmann::json::array()}};
  for (const PointResult& r : results) {
    const double median = Median(r.times_ms);
    j["points"].push_back(
        {{"ephemeral_bytes", r.ephemeral_bytes},
         {"saved_pct", 100.0 * (1.0 - static_cast<double>(r.ephemeral_bytes) /
                                          static_cast<double>(results[0].ephemeral_bytes))},
         {"swaps", r.swaps},
         {"host_bytes", r.host_bytes},
         {"expected_ms", r.expected_ms},
         {"median_ms", median},
         {"time_ratio", median / base_ms}});
  }
  *out = j;
  return true;
}

// N sessions of one model training at once, as the daemon's lanes would run them: all at
// point 0, then all at their lowest point (their copies sharing the device's copy path, Note
// [Shared copy path]), alternating for `rounds`; the median wall time of `iters` iterations
// each, side by side.
bool BenchJobs(const ModelSpec& spec, const Device& device, int jobs, int iters, int rounds,
               SwapCopies copies, nlohmann::json* out) {
  const std::string model = ReadModel(spec);
  const CompileOptions o = TrainingOptions(spec, device, copies);
  struct Job {
    std::unique_ptr<Executable> x;
    std::optional<DeviceBuffer> persistent, lane;
    bench::Io io;
  };
  std::vector<Job> js(jobs);
  for (Job& j : js) {
    auto x = Executable::Compile(model, o);
    if (!x.ok()) {
      std::cerr << spec.name << ": " << x.status() << "\n";
      return false;
    }
    j.x = std::move(*x);
    auto p = DeviceBuffer::Allocate(j.x->runtime(), j.x->persistent_bytes());
    auto l = DeviceBuffer::Allocate(j.x->runtime(), j.x->SwapPoints().front().ephemeral_bytes);
    if (!p.ok() || !l.ok() || !j.x->InitializePersistent(p->get()).ok()) return false;
    j.persistent.emplace(std::move(*p));
    j.lane.emplace(std::move(*l));
    j.io = bench::MakeIo(*j.x);
  }
  const size_t lowest = js[0].x->SwapPoints().size() - 1;
  auto run_all = [&](size_t point) -> double {
    for (Job& j : js) {
      if (!j.x->SelectSwapPoint(point).ok()) return -1;
    }
    std::atomic<bool> failed{false};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (Job& j : js) {
      threads.emplace_back([&] {
        for (int i = 0; i < iters; ++i) {
          if (!j.x->Run(j.persistent->get(), j.lane->get(), j.io.feed_ptrs, j.io.out_ptrs).ok()) {
            failed = true;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    if (failed) return -1;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  run_all(0);  // warm-up
  run_all(lowest);
  std::vector<double> plain, swapped;
  for (int r = 0; r < rounds; ++r) {
    plain.push_back(run_all(0));
    swapped.push_back(run_all(lowest));
    if (plain.back() < 0 || swapped.back() < 0) return false;
  }
  const uint64_t e0 = js[0].x->SwapPoints().front().ephemeral_bytes;
  const uint64_t elow = js[0].x->SwapPoints()[lowest].ephemeral_bytes;
  *out = {{"model", spec.name},
          {"jobs", jobs},
          {"ephemeral_bytes", e0},
          {"lowest_ephemeral_bytes", elow},
          {"saved_bytes", static_cast<uint64_t>(jobs) * (e0 - elow)},
          {"saved_pct", 100.0 * (1.0 - static_cast<double>(elow) / static_cast<double>(e0))},
          {"unswapped_ms", Median(plain)},
          {"swapped_ms", Median(swapped)},
          {"time_ratio", Median(swapped) / Median(plain)}};
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models, copies = "auto", device_name = "cpu";
  int warmup = 5, iters = 20, jobs = 0, rounds = 5;
  double bandwidth = 0;
  po::options_description desc("salus-swap-bench");
  desc.add_options()("models", po::value(&models), "comma-separated; default: all")(
      "warmup", po::value(&warmup), "profiled iterations before planning")(
      "iters", po::value(&iters), "timed iterations per point")(
      "bandwidth", po::value(&bandwidth), "copy bytes/s the planner assumes (0: the default)")(
      "estimated", "keep the size-based plan (no re-planning from measured times)")(
      "copies", po::value(&copies), "auto, thread or inline (CompileOptions::swap_copies)")(
      "jobs", po::value(&jobs),
      "N > 0: N sessions of each model train at once, all unswapped vs all at the lowest point")(
      "rounds", po::value(&rounds), "with --jobs: alternating rounds of each (median)")(
      "device", po::value(&device_name), "cpu (default) or cuda:N");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n" << desc << "\n";
    return 2;
  }
  const std::map<std::string, SwapCopies> modes = {{"auto", SwapCopies::kAuto},
                                                   {"thread", SwapCopies::kThread},
                                                   {"inline", SwapCopies::kInline}};
  if (!modes.contains(copies)) {
    std::cerr << "--copies: auto, thread or inline\n";
    return 2;
  }
  auto device = ParseDevice(device_name);
  if (!device.ok()) {
    std::cerr << "--device: " << device.status() << "\n";
    return 2;
  }
  std::vector<std::string> names;
  std::stringstream list(models);
  for (std::string n; std::getline(list, n, ',');) names.push_back(n);
  std::cerr << "memcpy bandwidth: " << MemcpyBandwidth() / 1e9 << " GB/s\n";
  std::vector<nlohmann::json> rows;
  for (const ModelSpec& spec : Models()) {
    if (!names.empty() && std::find(names.begin(), names.end(), spec.name) == names.end()) {
      continue;
    }
    nlohmann::json j;
    if (jobs > 0) {
      if (!BenchJobs(spec, *device, jobs, std::max(iters, 1), std::max(rounds, 1), modes.at(copies),
                     &j)) {
        return 1;
      }
      std::cout << j.dump() << "\n" << std::flush;
      continue;
    }
    if (!Bench(spec, *device, warmup, std::max(iters, 1), bandwidth, vm.count("estimated") > 0,
               modes.at(copies), &j)) {
      return 1;
    }
    std::cout << j.dump() << "\n" << std::flush;
    rows.push_back(j);
  }
  if (rows.empty()) return 0;
  std::cout << "\n| model | point | swaps | E (MiB) | saved | host (MiB) | expected ms | median ms "
               "| time ratio |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  std::cout << std::fixed;
  for (const nlohmann::json& j : rows) {
    for (size_t p = 0; p < j["points"].size(); ++p) {
      const nlohmann::json& q = j["points"][p];
      std::cout << "| " << j["model"].get<std::string>() << " | " << p << " | "
                << q["swaps"].get<size_t>() << " | " << std::setprecision(2)
                << q["ephemeral_bytes"].get<double>() / (1 << 20) << " | " << std::setprecision(1)
                << q["saved_pct"].get<double>() << "% | " << std::setprecision(2)
                << q["host_bytes"].get<double>() / (1 << 20) << " | "
                << q["expected_ms"].get<double>() << " | " << q["median_ms"].get<double>() << " | "
                << q["time_ratio"].get<double>() << "x |\n";
    }
  }
  return 0;
}
