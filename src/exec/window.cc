#include "exec/window.h"

#include <string>

namespace salus::exec {
namespace {

// Attribute values beyond this are refused, so window arithmetic never overflows.
constexpr int64_t kMaxWindowValue = int64_t{1} << 30;

Status CheckRange(const Node& node, const std::vector<int64_t>& values) {
  for (int64_t v : values) {
    if (v < -kMaxWindowValue || v > kMaxWindowValue) {
      return InvalidArgumentError(node.Describe() + ": window attribute out of range");
    }
  }
  return OkStatus();
}

// The part of a window both builders share: input and kernel shapes (of equal rank),
// strides and dilations, all range-checked.
Status FillCommon(const Node& node, const std::vector<int64_t>& in,
                  const std::vector<int64_t>& kernel, Window* w) {
  const size_t rank = in.size();
  w->in = in;
  w->kernel = kernel;
  if (kernel.size() != rank) {
    return InvalidArgumentError(node.Describe() + ": kernel rank does not match the input");
  }
  for (const char* a : {"strides", "dilations", "pads", "output_padding", "output_shape"}) {
    SALUS_RETURN_IF_ERROR(CheckRange(node, node.GetInts(a)));
  }
  SALUS_RETURN_IF_ERROR(CheckRange(node, w->kernel));
  SALUS_RETURN_IF_ERROR(CheckRange(node, w->in));
  w->strides = node.GetInts("strides");
  if (w->strides.empty()) w->strides.assign(rank, 1);
  w->dilations = node.GetInts("dilations");
  if (w->dilations.empty()) w->dilations.assign(rank, 1);
  if (w->strides.size() != rank || w->dilations.size() != rank) {
    return InvalidArgumentError(node.Describe() + ": strides/dilations rank mismatch");
  }
  for (size_t i = 0; i < rank; ++i) {
    if (w->strides[i] <= 0 || w->dilations[i] <= 0 || w->kernel[i] <= 0) {
      return InvalidArgumentError(node.Describe() + ": non-positive kernel, stride or dilation");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<Window> ComputeWindow(const Node& node, const std::vector<int64_t>& in,
                               const std::vector<int64_t>& kernel, bool ceil_mode) {
  Window w;
  const size_t rank = in.size();
  SALUS_RETURN_IF_ERROR(FillCommon(node, in, kernel, &w));
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  w.pad_begin.assign(rank, 0);
  w.pad_end.assign(rank, 0);
  w.out.assign(rank, 0);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t span = (kernel[i] - 1) * w.dilations[i] + 1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      w.out[i] = (in[i] + w.strides[i] - 1) / w.strides[i];
      int64_t total = std::max<int64_t>(0, (w.out[i] - 1) * w.strides[i] + span - in[i]);
      int64_t small = total / 2;
      w.pad_begin[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      w.pad_end[i] = total - w.pad_begin[i];
      continue;
    }
    if (auto_pad == "VALID") {
      // pads stay zero
    } else if (auto_pad == "NOTSET" || auto_pad.empty()) {
      std::vector<int64_t> pads = node.GetInts("pads");
      if (!pads.empty()) {
        if (pads.size() != 2 * rank) {
          return InvalidArgumentError(node.Describe() + ": pads must have 2*rank entries");
        }
        w.pad_begin[i] = pads[i];
        w.pad_end[i] = pads[i + rank];
        if (pads[i] < 0 || pads[i + rank] < 0) {
          return UnimplementedError(node.Describe() + ": negative pads");
        }
      }
    } else {
      return InvalidArgumentError(node.Describe() + ": unknown auto_pad '" + auto_pad + "'");
    }
    const int64_t room = in[i] + w.pad_begin[i] + w.pad_end[i] - span;
    if (room < 0) return InvalidArgumentError(node.Describe() + ": window larger than input");
    w.out[i] = (ceil_mode ? (room + w.strides[i] - 1) / w.strides[i] : room / w.strides[i]) + 1;
    if (ceil_mode) {
      // The last window must start inside the input or its begin padding.
      if ((w.out[i] - 1) * w.strides[i] >= in[i] + w.pad_begin[i]) --w.out[i];
      // Pad the end so that the ceil-mode windows fit; the extra padding is never counted.
      const int64_t need = (w.out[i] - 1) * w.strides[i] + span - in[i] - w.pad_begin[i];
      if (need > w.pad_end[i]) w.pad_end[i] = need;
    }
  }
  return w;
}

StatusOr<Window> ComputeTransposedWindow(const Node& node, const std::vector<int64_t>& in,
                                         const std::vector<int64_t>& kernel) {
  Window w;
  const size_t rank = in.size();
  SALUS_RETURN_IF_ERROR(FillCommon(node, in, kernel, &w));
  w.output_padding = node.GetInts("output_padding");
  if (w.output_padding.empty()) w.output_padding.assign(rank, 0);
  if (w.output_padding.size() != rank) {
    return InvalidArgumentError(node.Describe() + ": output_padding rank mismatch");
  }
  std::vector<int64_t> output_shape = node.GetInts("output_shape");
  if (output_shape.size() > rank) {
    output_shape.erase(output_shape.begin(), output_shape.end() - rank);
  }
  if (!output_shape.empty() && output_shape.size() != rank) {
    return InvalidArgumentError(node.Describe() + ": output_shape rank mismatch");
  }
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  std::vector<int64_t> pads = node.GetInts("pads");
  w.pad_begin.assign(rank, 0);
  w.pad_end.assign(rank, 0);
  w.out.assign(rank, 0);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t span = (kernel[i] - 1) * w.dilations[i] + 1;
    const int64_t full = w.strides[i] * (in[i] - 1) + w.output_padding[i] + span;
    if (!output_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t target = !output_shape.empty() ? output_shape[i] : in[i] * w.strides[i];
      const int64_t total = full - target;
      if (total < 0) return UnimplementedError(node.Describe() + ": negative total padding");
      if (auto_pad == "SAME_UPPER") {
        w.pad_begin[i] = total / 2;
        w.pad_end[i] = total - total / 2;
      } else {
        w.pad_begin[i] = total - total / 2;
        w.pad_end[i] = total / 2;
      }
      w.out[i] = target;
      continue;
    }
    if (!pads.empty()) {
      if (pads.size() != 2 * rank) {
        return InvalidArgumentError(node.Describe() + ": pads must have 2*rank entries");
      }
      w.pad_begin[i] = pads[i];
      w.pad_end[i] = pads[i + rank];
    }
    w.out[i] = full - w.pad_begin[i] - w.pad_end[i];
    if (w.out[i] <= 0) return InvalidArgumentError(node.Describe() + ": empty output");
  }
  return w;
}

}  // namespace salus::exec
