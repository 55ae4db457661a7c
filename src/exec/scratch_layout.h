// Float buffers carved out of a kernel's scratch, for kernels of either device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exec/alignment.h"

namespace salus::exec {

// Offsets of float buffers in a kernel's scratch, each aligned to kAlignment, from `start`
// bytes in (a CUDA kernel calling cuBLAS keeps the workspace first).
class ScratchLayout {
 public:
  explicit ScratchLayout(size_t start = 0) : bytes_(start) {}
  // The offset of a new buffer of `floats` floats.
  size_t Add(int64_t floats) {
    const size_t offset = bytes_;
    bytes_ += AlignUp(static_cast<uint64_t>(floats) * sizeof(float));
    return offset;
  }
  size_t bytes() const { return bytes_; }
  static float* At(void* scratch, size_t offset) {
    return reinterpret_cast<float*>(static_cast<std::byte*>(scratch) + offset);
  }

 private:
  size_t bytes_;
};

}  // namespace salus::exec
