// What CUDA devices this process can use. Built in every configuration: without CUDA it
// reports that the build has none; with CUDA but no GPU or driver it reports "no GPU" and
// why, instead of failing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace salus::device {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

struct CudaAvailability {
  bool compiled = false;    // the build has the CUDA device
  int runtime_version = 0;  // cudaRuntimeGetVersion, 0 when not compiled
  std::vector<CudaDeviceInfo> devices;
  std::string reason;  // why there are no devices, empty when there are some
};

CudaAvailability QueryCuda();

}  // namespace salus::device
