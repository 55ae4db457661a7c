// salus-run: compiles an ONNX model with the execution engine and times its iterations
// in-process, with no daemon in between. The benchmark driver's `overhead` experiment divides
// the daemon's per-iteration time by this one.
//
//   salus-run --model FILE --input x=64,784 --input labels=64 [--mode train|infer]
//             [--loss loss] [--lr 0.05] [--iterations 50] [--warmup 5] [--seed 1]
//             [--device cpu|cuda:N]
//
// Feeds are seeded synthetic data: float32 inputs standard normal, int64 inputs uniform in
// [0, kLabelClasses). The executable is compiled exactly as the daemon compiles a session
// (fetches: the loss when training, then every graph output). Prints one JSON object:
// {"model", "mode", "device", "persistent_bytes", "ephemeral_bytes", "iterations", "median_ms",
//  "mean_ms", "min_ms", "max_ms"}.
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/openmp_env.h"
#include "common/version.h"
#include "exec/alignment.h"
#include "exec/executable.h"

namespace po = boost::program_options;
using namespace salus;        // NOLINT(google-build-using-namespace)
using namespace salus::exec;  // NOLINT(google-build-using-namespace)

namespace {

constexpr int64_t kLabelClasses = 10;  // every reference model classifies into 10 classes

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, AlignedFree>;

// Host memory for feeds and fetches.
Buffer Allocate(size_t bytes) {
  return Buffer(static_cast<std::byte*>(std::aligned_alloc(kAlignment, AlignUp(bytes + 1))));
}

// "x=64,784" -> ("x", {64, 784}).
StatusOr<std::pair<std::string, Shape>> ParseInput(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError("--input '" + text + "': expected NAME=D0,D1,...");
  }
  Shape shape;
  std::stringstream dims(text.substr(eq + 1));
  std::string d;
  while (std::getline(dims, d, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(d.c_str(), &end, 10);
    if (d.empty() || *end != '\0' || v <= 0) {
      return InvalidArgumentError("--input '" + text + "': bad dimension '" + d + "'");
    }
    shape.push_back(v);
  }
  return std::pair{text.substr(0, eq), shape};
}

int Fail(const Status& s) {
  std::cerr << "salus-run: " << s.ToString() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Note [OpenMP wait policy]: the daemon runs its kernels this way, so the in-process
  // baseline must too, or the comparison measures the wait policy instead of the daemon.
  EnsurePassiveOpenMpWait(argv);
  std::string model_path, mode = "train", loss = "loss", device_name = "cpu";
  std::vector<std::string> input_texts;
  double lr = 0.05;
  int iterations = 50, warmup = 5;
  unsigned seed = 1;
  po::options_description desc("salus-run: time a model's iterations in-process");
  desc.add_options()("help,h", "show this help")("version", "print the version and exit")(
      "model", po::value(&model_path)->required(), "ONNX model file")(
      "input", po::value(&input_texts)->composing(), "input shape NAME=D0,D1,... (repeatable)")(
      "mode", po::value(&mode)->default_value("train"), "train or infer")(
      "loss", po::value(&loss)->default_value("loss"), "the loss output (train)")(
      "lr", po::value(&lr)->default_value(0.05), "SGD learning rate (train)")(
      "iterations", po::value(&iterations)->default_value(50), "timed iterations")(
      "warmup", po::value(&warmup)->default_value(5), "untimed iterations first")(
      "seed", po::value(&seed)->default_value(1), "seed of the synthetic feeds")(
      "device", po::value(&device_name)->default_value("cpu"), "cpu, cuda or cuda:N");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("version")) {
      std::cout << salus::VersionText("salus-run");
      return 0;
    }
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "salus-run: " << e.what() << "\n\n" << desc;
    return 2;
  }
  if (iterations < 1 || warmup < 0) {
    return Fail(InvalidArgumentError("--iterations must be >= 1 and --warmup >= 0"));
  }
  if (mode != "train" && mode != "infer") {
    return Fail(InvalidArgumentError("--mode must be train or infer, got '" + mode + "'"));
  }

  auto device = ParseDevice(device_name);
  if (!device.ok()) return Fail(device.status());

  std::ifstream f(model_path, std::ios::binary);
  if (!f) return Fail(NotFoundError("cannot read " + model_path));
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string model = ss.str();
  onnx::ModelProto proto;
  if (!proto.ParseFromString(model)) {
    return Fail(InvalidArgumentError(model_path + " is not an ONNX model"));
  }

  CompileOptions o;
  o.device = *device;
  for (const std::string& t : input_texts) {
    auto in = ParseInput(t);
    if (!in.ok()) return Fail(in.status());
    o.input_shapes[in->first] = in->second;
  }
  if (mode == "train") {
    o.mode = Mode::kTraining;
    o.loss = loss;
    o.optimizer.learning_rate = static_cast<float>(lr);
    o.fetches.push_back(loss);
  }
  for (const auto& out : proto.graph().output()) {
    if (std::find(o.fetches.begin(), o.fetches.end(), out.name()) == o.fetches.end()) {
      o.fetches.push_back(out.name());
    }
  }
  auto exe = Executable::Compile(model, o);
  if (!exe.ok()) return Fail(exe.status());
  Executable& e = **exe;

  auto persistent = DeviceBuffer::Allocate(e.runtime(), e.persistent_bytes());
  if (!persistent.ok()) return Fail(persistent.status());
  auto lane = DeviceBuffer::Allocate(e.runtime(), e.ephemeral_bytes());
  if (!lane.ok()) return Fail(lane.status());
  if (Status s = e.InitializePersistent(persistent->get()); !s.ok()) return Fail(s);

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int64_t> label(0, kLabelClasses - 1);
  std::vector<Buffer> feeds;
  std::vector<const void*> feed_ptrs;
  for (const TensorInfo& in : e.inputs()) {
    Buffer b = Allocate(in.bytes);
    const int64_t n = NumElements(in.shape);
    if (in.type == DataType::kInt64) {
      auto* p = reinterpret_cast<int64_t*>(b.get());
      for (int64_t i = 0; i < n; ++i) p[i] = label(rng);
    } else if (in.type == DataType::kFloat32) {
      auto* p = reinterpret_cast<float*>(b.get());
      for (int64_t i = 0; i < n; ++i) p[i] = normal(rng);
    } else {
      return Fail(InvalidArgumentError("input '" + in.name + "' has type " + DataTypeName(in.type) +
                                       ", which salus-run cannot fill"));
    }
    feed_ptrs.push_back(b.get());
    feeds.push_back(std::move(b));
  }
  std::vector<Buffer> fetches;
  std::vector<void*> fetch_ptrs;
  for (const TensorInfo& out : e.fetches()) {
    fetches.push_back(Allocate(out.bytes));
    fetch_ptrs.push_back(fetches.back().get());
  }

  std::vector<double> ms;
  for (int i = 0; i < warmup + iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = e.Run(persistent->get(), lane->get(), feed_ptrs, fetch_ptrs); !s.ok())
      return Fail(s);
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  double sum = 0;
  for (double v : ms) sum += v;
  nlohmann::json out = {{"model", model_path},
                        {"mode", mode},
                        {"device", e.device().name()},
                        {"persistent_bytes", e.persistent_bytes()},
                        {"ephemeral_bytes", e.ephemeral_bytes()},
                        {"iterations", iterations},
                        {"median_ms", median},
                        {"mean_ms", sum / static_cast<double>(n)},
                        {"min_ms", sorted.front()},
                        {"max_ms", sorted.back()}};
  std::cout << out.dump() << "\n";
  return 0;
}
