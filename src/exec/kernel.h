// A kernel: one node's computation on one device, built once when an executable is compiled
// (shapes fixed, primitives, descriptors and algorithms chosen) and run every iteration on
// addresses resolved from the persistent and lane bases. A kernel allocates nothing when it
// runs; the temporary memory it needs (oneDNN scratchpads, cuDNN and cuBLAS workspaces, CUB
// temporary storage, intermediate buffers) is declared as scratch_bytes() and planned in the
// lane like any other buffer.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "exec/device.h"
#include "salus/status.h"

namespace salus::exec {

struct KernelArgs {
  std::vector<void*> inputs;   // nullptr for an omitted optional input
  std::vector<void*> outputs;  // nullptr for an omitted optional output
  void* scratch = nullptr;     // scratch_bytes() bytes, aligned to kAlignment
  // The device context of this run (Note [Device contexts] in device.h): the stream and
  // library handles on CUDA. CPU kernels never read it.
  DeviceContext* ctx = nullptr;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual size_t scratch_bytes() const { return 0; }
  // Runs on the calling thread; an iteration's kernels run one after another (on CUDA: are
  // queued one after another on ctx's stream, and may still be running when Run returns).
  virtual Status Run(const KernelArgs& args) = 0;
};

}  // namespace salus::exec
