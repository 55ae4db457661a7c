// The one alignment of the execution engine.
//
// Every buffer the engine plans (a persistent value, a lane tensor, a kernel's scratch and the
// temporaries inside it) starts at a multiple of kAlignment from its base, and every base
// (persistent block, lane) is itself aligned at least that much by the memory manager. 256
// bytes is the strictest of what the kernels want: cudaMalloc's own alignment, which cuBLAS's
// and cuDNN's fastest (vectorised, tensor-core) paths assume of their operands, and a multiple
// of the 64-byte cache line oneDNN's AVX-512 kernels want on the CPU. Planning with one value on
// every device keeps P and E the same for a model wherever it runs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace salus::exec {

inline constexpr uint64_t kAlignment = 256;

constexpr uint64_t AlignUp(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace salus::exec
