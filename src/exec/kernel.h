// A kernel: one node's computation on one device, built once when an executable is compiled
// (shapes fixed, primitives created) and run every iteration on addresses resolved from the
// persistent and lane bases. A kernel allocates nothing when it runs; the temporary memory it
// needs (oneDNN scratchpads, intermediate buffers) is declared as scratch_bytes() and planned
// in the lane like any other buffer.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "salus/status.h"

namespace salus::exec {

enum class DeviceType { kCpu, kCuda };

std::string DeviceTypeName(DeviceType d);

struct KernelArgs {
  std::vector<void*> inputs;   // nullptr for an omitted optional input
  std::vector<void*> outputs;  // nullptr for an omitted optional output
  void* scratch = nullptr;     // scratch_bytes() bytes, 64-byte aligned
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual size_t scratch_bytes() const { return 0; }
  // Runs on the calling thread; an iteration's kernels run one after another.
  virtual Status Run(const KernelArgs& args) = 0;
};

}  // namespace salus::exec
