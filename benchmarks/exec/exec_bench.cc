// salus-exec-bench: times iterations of one ONNX model on the engine and prints one JSON line.
//
//   salus-exec-bench --model FILE --input NAME=d0,d1,... [--input ...] [--train LOSS]
//                    [--fetch NAME] [--warmup 5] [--iters 20] [--profile] [--device cuda:0]
//                    [--tf-graph]
// --tf-graph: FILE is a TensorFlow GraphDef (a step the TensorFlow adaptor captured, written
// with SALUS_TF_DUMP_DIR), compiled with Executable::CompileTf; --fetch is then required and
// its variables start at zero.
//
// Inputs are filled with seeded values (int64 inputs with small class indices). Training uses
// SGD with momentum 0.9. The thread count is OpenMP's (OMP_NUM_THREADS).
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench_io.h"
#include "exec/executable.h"

namespace po = boost::program_options;
using namespace salus::exec;  // NOLINT(google-build-using-namespace)

int main(int argc, char** argv) {
  std::string model_path, train_loss, fetch, device_name = "cpu";
  std::vector<std::string> inputs;
  int warmup = 5, iters = 20;
  po::options_description desc("salus-exec-bench");
  desc.add_options()("model", po::value(&model_path)->required(), "ONNX file")(
      "input", po::value(&inputs)->composing(), "NAME=d0,d1,...")("train", po::value(&train_loss),
                                                                  "train with this loss output")(
      "fetch", po::value(&fetch), "output to fetch in inference")(
      "profile", "print seconds per op type to stderr")(
      "no-fuse", "inference: skip the graph rewrites of exec/fusion.h")(
      "no-graphs", "launch kernel by kernel (no device graph replay on CUDA)")(
      "convolution-transforms", "CUDA: admit cuDNN's FFT and Winograd convolution algorithms")(
      "tf-graph", "the model is a TensorFlow GraphDef")("device", po::value(&device_name),
                                                        "cpu (default), cuda or cuda:N")(
      "warmup", po::value(&warmup), "untimed iterations")("iters", po::value(&iters),
                                                          "timed iterations");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n" << desc << "\n";
    return 2;
  }
  std::ifstream f(model_path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  CompileOptions o;
  auto device = ParseDevice(device_name);
  if (!device.ok()) {
    std::cerr << device.status() << "\n";
    return 2;
  }
  o.device = *device;
  o.fuse = vm.count("no-fuse") == 0;
  o.device_graphs = vm.count("no-graphs") == 0;
  o.convolution_transforms = vm.count("convolution-transforms") > 0;
  for (const std::string& spec : inputs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      std::cerr << "bad --input " << spec << "\n";
      return 2;
    }
    Shape s;
    std::stringstream dims(spec.substr(eq + 1));
    for (std::string d; std::getline(dims, d, ',');) s.push_back(std::stoll(d));
    o.input_shapes[spec.substr(0, eq)] = s;
  }
  if (!train_loss.empty()) {
    o.mode = Mode::kTraining;
    o.loss = train_loss;
    o.optimizer.learning_rate = 0.01f;
    o.optimizer.momentum = 0.9f;
  } else if (!fetch.empty()) {
    o.fetches = {fetch};
  }
  o.profile = vm.count("profile") > 0;
  auto exe = vm.count("tf-graph") > 0 ? Executable::CompileTf(ss.str(), o)
                                      : Executable::Compile(ss.str(), o);
  if (!exe.ok()) {
    std::cerr << exe.status() << "\n";
    return 1;
  }
  Executable& x = **exe;
  auto persistent = DeviceBuffer::Allocate(x.runtime(), x.persistent_bytes());
  auto lane = DeviceBuffer::Allocate(x.runtime(), x.ephemeral_bytes());
  if (!persistent.ok() || !lane.ok()) {
    std::cerr << (persistent.ok() ? lane.status() : persistent.status()) << "\n";
    return 1;
  }
  if (salus::Status st = x.InitializePersistent(persistent->get()); !st.ok()) {
    std::cerr << st << "\n";
    return 1;
  }
  bench::Io io = bench::MakeIo(x);
  std::vector<const void*>& feed_ptrs = io.feed_ptrs;
  std::vector<void*>& out_ptrs = io.out_ptrs;
  std::vector<double> times;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    salus::Status st = x.Run(persistent->get(), lane->get(), feed_ptrs, out_ptrs);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!st.ok()) {
      std::cerr << st << "\n";
      return 1;
    }
    if (i >= warmup) times.push_back(ms);
  }
  for (const auto& [op, sec] : x.Profile()) {
    if (o.profile) std::cerr << op << " " << sec * 1e3 / (warmup + iters) << " ms/iter\n";
  }
  std::sort(times.begin(), times.end());
  nlohmann::json out = {{"model", model_path},
                        {"mode", train_loss.empty() ? "inference" : "training"},
                        {"device", x.device().name()},
                        {"median_ms", times[times.size() / 2]},
                        {"min_ms", times.front()},
                        {"persistent_bytes", x.persistent_bytes()},
                        {"ephemeral_bytes", x.ephemeral_bytes()},
                        {"graph_replays", x.graph_stats().replays},
                        {"graph_captures", x.graph_stats().captures},
                        {"graphs_off", x.graph_stats().off}};
  std::cout << out.dump() << "\n";
  return 0;
}
