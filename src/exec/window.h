// Sliding-window geometry of Conv, ConvTranspose, MaxPool and AveragePool: kernel, strides,
// dilations and the begin/end padding resolved from ONNX's `pads` and `auto_pad`, and the
// output spatial size. Shape inference and the kernels (forward and backward) share it, so
// they always agree.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/graph.h"
#include "salus/status.h"

namespace salus::exec {

struct Window {
  std::vector<int64_t> in, out, kernel, strides, dilations, pad_begin, pad_end;
  std::vector<int64_t> output_padding;  // ConvTranspose only
  size_t rank() const { return in.size(); }
};

// Forward windows (Conv, pooling). `in` is the spatial input size, `kernel` the window.
StatusOr<Window> ComputeWindow(const Node& node, const std::vector<int64_t>& in,
                               const std::vector<int64_t>& kernel, bool ceil_mode);
// ConvTranspose: output_padding, output_shape and auto_pad per the ONNX spec.
StatusOr<Window> ComputeTransposedWindow(const Node& node, const std::vector<int64_t>& in,
                                         const std::vector<int64_t>& kernel);

}  // namespace salus::exec
