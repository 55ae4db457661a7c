// salus-conformance: runs ONNX backend node tests on the engine and writes a JSON report.
//
//   salus-conformance --data DIR [--filter REGEX] [--device cpu|cuda:N] --report FILE.json
//
// Every folder under DIR that holds model.onnx and test_data_set_*/{input,output}_*.pb is
// compiled for its inputs' shapes (graph inputs that are not float32, such as shapes, axes and
// labels, are bound as compile-time constants), run on the device (the CPU by default) and
// compared output by
// output: floats within rtol 1e-3 and atol 1e-5, integers and booleans exactly. A test is
// "unsupported" when compilation is refused with UNIMPLEMENTED, "failed" when any other error
// occurs or a result differs, and "passed" otherwise. The exit code is 1 if any test failed.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "exec/executable.h"
#include "exec/onnx_importer.h"

namespace fs = std::filesystem;
namespace po = boost::program_options;
using namespace salus;        // NOLINT(google-build-using-namespace)
using namespace salus::exec;  // NOLINT(google-build-using-namespace)

namespace {

constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-5;

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

StatusOr<HostTensor> ReadTensor(const fs::path& p) {
  onnx::TensorProto proto;
  std::string bytes = ReadFile(p);
  if (!proto.ParseFromString(bytes)) return InvalidArgumentError("cannot parse " + p.string());
  return OnnxImporter::TensorFromProto(proto);
}

std::vector<fs::path> Numbered(const fs::path& dir, const std::string& stem) {
  std::vector<fs::path> out;
  for (int i = 0;; ++i) {
    fs::path p = dir / (stem + "_" + std::to_string(i) + ".pb");
    if (!fs::exists(p)) break;
    out.push_back(p);
  }
  return out;
}

std::string Compare(const HostTensor& got, const HostTensor& want, const std::string& name) {
  if (got.type != want.type) {
    return name + ": type " + DataTypeName(got.type) + ", expected " + DataTypeName(want.type);
  }
  if (got.shape != want.shape && NumElements(got.shape) != NumElements(want.shape)) {
    return name + ": shape " + ShapeString(got.shape) + ", expected " + ShapeString(want.shape);
  }
  if (got.shape != want.shape) {
    return name + ": shape " + ShapeString(got.shape) + ", expected " + ShapeString(want.shape);
  }
  const int64_t n = want.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    if (want.type == DataType::kFloat32) {
      const double a = got.floats()[i], b = want.floats()[i];
      if (std::isnan(a) && std::isnan(b)) continue;
      if (std::isinf(a) && a == b) continue;
      if (!(std::abs(a - b) <= kAtol + kRtol * std::abs(b))) {
        return name + "[" + std::to_string(i) + "] = " + std::to_string(a) + ", expected " +
               std::to_string(b);
      }
    } else if (want.type == DataType::kInt64) {
      if (got.int64s()[i] != want.int64s()[i]) {
        return name + "[" + std::to_string(i) + "] differs";
      }
    } else if ((got.bytes[i] != std::byte{0}) != (want.bytes[i] != std::byte{0})) {
      return name + "[" + std::to_string(i) + "] differs";
    }
  }
  return "";
}

// Returns {status, detail}.
std::pair<std::string, std::string> RunTest(const fs::path& dir, const Device& device) {
  const std::string model_bytes = ReadFile(dir / "model.onnx");
  onnx::ModelProto model;
  if (!model.ParseFromString(model_bytes)) return {"failed", "cannot parse model.onnx"};
  std::vector<std::string> input_names;
  std::set<std::string> inits;
  for (const auto& i : model.graph().initializer()) inits.insert(i.name());
  for (const auto& i : model.graph().input()) {
    if (!i.type().has_tensor_type())
      return {"unsupported", "input '" + i.name() + "' is not a tensor"};
    if (!inits.count(i.name())) input_names.push_back(i.name());
  }
  for (const auto& o : model.graph().output()) {
    if (!o.type().has_tensor_type())
      return {"unsupported", "output '" + o.name() + "' is not a tensor"};
  }
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) {
      sets.push_back(e.path());
    }
  }
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {"failed", "no test data sets"};
  for (const fs::path& set : sets) {
    std::vector<fs::path> in_files = Numbered(set, "input");
    std::vector<fs::path> out_files = Numbered(set, "output");
    if (in_files.size() > input_names.size()) return {"failed", "more inputs than the model has"};
    CompileOptions options;
    options.device = device;
    std::vector<HostTensor> feeds;
    for (size_t i = 0; i < in_files.size(); ++i) {
      auto t = ReadTensor(in_files[i]);
      if (!t.ok()) {
        if (t.status().code() == StatusCode::kUnimplemented) {
          return {"unsupported", t.status().ToString()};
        }
        return {"failed", t.status().ToString()};
      }
      if (t->type != DataType::kFloat32) {
        options.constant_inputs[input_names[i]] = *t;
      } else {
        options.input_shapes[input_names[i]] = t->shape;
        feeds.push_back(std::move(t).value());
      }
    }
    auto exe = Executable::Compile(model_bytes, options);
    if (!exe.ok()) {
      if (exe.status().code() == StatusCode::kUnimplemented) {
        return {"unsupported", exe.status().ToString()};
      }
      return {"failed", exe.status().ToString()};
    }
    Executable& x = **exe;
    if (x.inputs().size() != feeds.size()) return {"failed", "input count mismatch"};
    if (x.fetches().size() != out_files.size()) return {"failed", "output count mismatch"};
    auto persistent = DeviceBuffer::Allocate(x.runtime(), x.persistent_bytes());
    if (!persistent.ok()) return {"failed", persistent.status().ToString()};
    auto lane = DeviceBuffer::Allocate(x.runtime(), x.ephemeral_bytes());
    if (!lane.ok()) return {"failed", lane.status().ToString()};
    if (Status st = x.InitializePersistent(persistent->get()); !st.ok()) {
      return {"failed", st.ToString()};
    }
    std::vector<const void*> feed_ptrs;
    for (const HostTensor& f : feeds) feed_ptrs.push_back(f.bytes.data());
    std::vector<HostTensor> results;
    std::vector<void*> fetch_ptrs;
    for (const TensorInfo& info : x.fetches()) results.emplace_back(info.type, info.shape);
    for (HostTensor& r : results) fetch_ptrs.push_back(r.bytes.data());
    Status st = x.Run(persistent->get(), lane->get(), feed_ptrs, fetch_ptrs);
    if (!st.ok()) return {"failed", st.ToString()};
    for (size_t i = 0; i < out_files.size(); ++i) {
      auto want = ReadTensor(out_files[i]);
      if (!want.ok()) return {"unsupported", "expected output: " + want.status().ToString()};
      std::string diff = Compare(results[i], *want, x.fetches()[i].name);
      if (!diff.empty()) return {"failed", set.filename().string() + ": " + diff};
    }
  }
  return {"passed", ""};
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("salus-conformance");
  std::string data, filter, report, device_name = "cpu";
  desc.add_options()("help", "this message")("data", po::value(&data)->required(),
                                             "folder of ONNX backend test folders")(
      "filter", po::value(&filter), "only tests whose name matches this regex")(
      "device", po::value(&device_name), "cpu (default), cuda or cuda:N")(
      "report", po::value(&report)->required(), "JSON report to write");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "salus-conformance: " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  auto device = ParseDevice(device_name);
  if (!device.ok()) {
    std::cerr << "salus-conformance: " << device.status().ToString() << "\n";
    return 2;
  }
  if (auto rt = DeviceRuntime::For(*device); !rt.ok()) {
    std::cerr << "salus-conformance: " << rt.status().ToString() << "\n";
    return 2;
  }
  std::optional<std::regex> re;
  try {
    if (!filter.empty()) re.emplace(filter);
  } catch (const std::regex_error& e) {
    std::cerr << "salus-conformance: bad --filter: " << e.what() << "\n";
    return 2;
  }
  std::vector<fs::path> tests;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(data, ec)) {
    if (!e.is_directory() || !fs::exists(e.path() / "model.onnx")) continue;
    if (re && !std::regex_search(e.path().filename().string(), *re)) continue;
    tests.push_back(e.path());
  }
  if (ec) {
    std::cerr << "salus-conformance: cannot read " << data << ": " << ec.message() << "\n";
    return 2;
  }
  std::sort(tests.begin(), tests.end());
  nlohmann::json out = {{"passed", 0}, {"failed", 0}, {"unsupported", 0}};
  out["tests"] = nlohmann::json::array();
  for (const fs::path& t : tests) {
    std::pair<std::string, std::string> r;
    try {
      r = RunTest(t, *device);
    } catch (const std::exception& e) {
      r = {"failed", std::string("exception: ") + e.what()};
    }
    out[r.first] = out[r.first].get<int>() + 1;
    out["tests"].push_back(
        {{"name", t.filename().string()}, {"status", r.first}, {"detail", r.second}});
    if (r.first == "failed") std::cerr << t.filename().string() << ": " << r.second << "\n";
  }
  std::ofstream f(report);
  f << out.dump(2) << "\n";
  if (!f) {
    std::cerr << "salus-conformance: cannot write " << report << "\n";
    return 2;
  }
  std::cout << "passed " << out["passed"] << ", failed " << out["failed"] << ", unsupported "
            << out["unsupported"] << " of " << tests.size() << "\n";
  return out["failed"].get<int>() > 0 ? 1 : 0;
}
