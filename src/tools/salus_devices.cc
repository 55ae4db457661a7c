// salus-devices: lists the devices this build of Salus can serve from (the CPU device, and
// each CUDA GPU), as a table or as JSON.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/units.h"
#include "common/version.h"
#include "device/cuda_query.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  po::options_description opts("salus-devices: the devices Salus can use");
  opts.add_options()("help,h", "show this help")("version", "print the version and exit")(
      "json", "print JSON instead of a table");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
  } catch (const po::error& e) {
    std::cerr << "salus-devices: " << e.what() << "\n" << opts;
    return 2;
  }
  if (vm.count("version")) {
    std::cout << salus::VersionText("salus-devices");
    return 0;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }

  const salus::device::CudaAvailability cuda = salus::device::QueryCuda();
  const unsigned threads = std::thread::hardware_concurrency();
  if (vm.count("json")) {
    nlohmann::json j;
    j["cpu"] = {{"available", true}, {"threads", threads}};
    nlohmann::json gpus = nlohmann::json::array();
    for (const auto& d : cuda.devices) {
      gpus.push_back({{"ordinal", d.ordinal},
                      {"name", d.name},
                      {"total_bytes", d.total_bytes},
                      {"free_bytes", d.free_bytes},
                      {"compute_capability",
                       std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor)}});
    }
    j["cuda"] = {{"compiled", cuda.compiled},
                 {"runtime_version", cuda.runtime_version},
                 {"devices", gpus},
                 {"reason", cuda.reason}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%-8s %-40s %s\n", "DEVICE", "NAME", "MEMORY");
  std::printf("%-8s %-40s %s\n", "cpu", ("host, " + std::to_string(threads) + " threads").c_str(),
              "configured arena");
  for (const auto& d : cuda.devices) {
    std::printf("%-8s %-40s %s total, %s free\n", ("cuda:" + std::to_string(d.ordinal)).c_str(),
                d.name.c_str(), salus::FormatBytes(d.total_bytes).c_str(),
                salus::FormatBytes(d.free_bytes).c_str());
  }
  if (cuda.devices.empty()) std::printf("cuda     %s\n", cuda.reason.c_str());
  return 0;
}
