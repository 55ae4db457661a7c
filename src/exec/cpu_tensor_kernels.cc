// Forward CPU kernels of the tensor ops that exported models use around their layers: int64
// shape arithmetic, comparisons and logic, Cast, Where, Expand, Gather, Slice, Split, Range,
// ConstantOfShape, Trilu, Clip, Min, Max, Mod, Shape, Erf, Sin, Cos and SalusSort; and the int64
// and bool forms of Add..Div, Neg, Abs and Concat, whose float forms are cpu_kernels.cc's oneDNN
// primitives (cpu_tensor_kernels.h). (Gelu and Reciprocal are cpu_kernels.cc's eltwise
// primitives.)
//
// They are loops over element_math.h's per-element math and index maps, which the CUDA device can
// share. Ops that only move data (Expand, Gather, Slice, Split, Concat, Where's selection, Trilu)
// copy elements by their size, so one loop serves float, int64 and bool. Bool is one byte, read as
// zero or not.
//
// A kernel that can meet bad data when it runs (an int64 zero divisor, a Gather index out of
// range) returns InvalidArgument naming the node instead of computing garbage; when the node
// folds at import (Note [What folds] in onnx_importer.cc), that status is the compile error.
#include "exec/cpu_tensor_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "exec/cpu_kernel_helpers.h"
#include "exec/dnnl_kernel.h"
#include "exec/element_math.h"
#include "exec/kernel_registry.h"
#include "exec/shape_inference.h"

namespace salus::exec {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

KernelOr Loop(LoopKernel::Fn fn) { return std::unique_ptr<Kernel>(new LoopKernel(std::move(fn))); }
KernelOr Checked(CheckedLoopKernel::Fn fn) {
  return std::unique_ptr<Kernel>(new CheckedLoopKernel(std::move(fn)));
}

const Value& In(const Node& n, const Graph& g, size_t i) { return g.value(n.inputs[i]); }
const Value& Out(const Node& n, const Graph& g, size_t i) { return g.value(n.outputs[i]); }

template <typename T>
const T* Input(const KernelArgs& a, size_t i) {
  return static_cast<const T*>(a.inputs[i]);
}
template <typename T>
T* Output(const KernelArgs& a, size_t i) {
  return static_cast<T*>(a.outputs[i]);
}

Status Unsupported(const Node& n, DataType t) {
  return UnimplementedError("node '" + n.name + "': op " + n.op + " on " + DataTypeName(t) +
                            " tensors");
}

// Calls fn with a value of the C++ type that holds `t`'s elements (uint8_t for bool).
template <typename Fn>
auto WithType(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kInt64:
      return fn(int64_t{});
    case DataType::kBool:
      return fn(uint8_t{});
    default:
      return fn(float{});
  }
}

// Calls fn with an unsigned integer type as wide as one element of `t`, for ops that only move
// elements.
template <typename Fn>
auto WithElementSize(DataType t, Fn&& fn) {
  switch (ElementSize(t)) {
    case 8:
      return fn(uint64_t{});
    case 1:
      return fn(uint8_t{});
    default:
      return fn(uint32_t{});
  }
}

// Broadcasting of one or two operands over an output: element_math.h's IndexMap where it holds
// (the CUDA device's map), ForEachBroadcast beyond it.
class BroadcastMap {
 public:
  BroadcastMap(const Shape& out, std::vector<Shape> operands) : out_(out) {
    for (const Shape& s : operands) strides_.push_back(BroadcastStrides(s, out));
    while (strides_.size() < static_cast<size_t>(kMaxIndexOperands)) {
      strides_.push_back(Shape(out.size(), 0));
    }
    indexed_ = MakeIndexMap(out, strides_, &map_);
  }
  // fn(output element, offset in operand 0, offset in operand 1).
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    if (indexed_) {
      const int64_t count = IndexMapCount(map_);
      for (int64_t e = 0; e < count; ++e) {
        int64_t off[kMaxIndexOperands];
        MapIndex(map_, e, off);
        fn(e, off[0], off[1]);
      }
      return;
    }
    ForEachBroadcast(out_, strides_, [&](int64_t e, const int64_t* off) { fn(e, off[0], off[1]); });
  }

 private:
  Shape out_;
  std::vector<Shape> strides_;
  IndexMap map_;
  bool indexed_ = false;
};

// InvalidArgument naming the node (`node`, its Describe()) when any of the `count` divisors is
// zero.
Status CheckDivisors(const std::string& node, const int64_t* d, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (d[i] == 0) return InvalidArgumentError(node + ": integer division by zero");
  }
  return OkStatus();
}

// The bound of an omitted Clip min or max: none at all (infinity for float).
template <typename T>
T Unbounded(bool upper) {
  if constexpr (std::numeric_limits<T>::has_infinity) {
    return upper ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity();
  } else {
    return upper ? std::numeric_limits<T>::max() : std::numeric_limits<T>::lowest();
  }
}

// ---------------------------------------------------------------------------------------------
// Arithmetic, comparison and logic.

// Mod (float with fmod = 1, int64 either way).
KernelOr Mod(const Node& n, const Graph& g) {
  const DataType t = Out(n, g, 0).type;
  BroadcastMap map(Out(n, g, 0).shape, {In(n, g, 0).shape, In(n, g, 1).shape});
  if (t == DataType::kFloat32) {
    return Loop([map](const KernelArgs& a) {
      const float* x = Input<float>(a, 0);
      const float* y = Input<float>(a, 1);
      float* z = Output<float>(a, 0);
      map.ForEach([&](int64_t e, int64_t i, int64_t j) { z[e] = ModFloat(x[i], y[j]); });
    });
  }
  if (t != DataType::kInt64) return Unsupported(n, t);
  const bool fmod = n.GetInt("fmod", 0) != 0;
  const int64_t divisors = NumElements(In(n, g, 1).shape);
  return Checked([node = n.Describe(), map, fmod, divisors](const KernelArgs& a) {
    const int64_t* x = Input<int64_t>(a, 0);
    const int64_t* y = Input<int64_t>(a, 1);
    SALUS_RETURN_IF_ERROR(CheckDivisors(node, y, divisors));
    int64_t* z = Output<int64_t>(a, 0);
    map.ForEach([&](int64_t e, int64_t i, int64_t j) { z[e] = ModInt64(x[i], y[j], fmod); });
    return OkStatus();
  });
}

KernelOr Compare(const Node& n, const Graph& g) {
  CompareOp op = CompareOp::kEqual;
  CompareOpFor(n.op, &op);
  const DataType t = In(n, g, 0).type;
  BroadcastMap map(Out(n, g, 0).shape, {In(n, g, 0).shape, In(n, g, 1).shape});
  if (t == DataType::kBool) {
    // Equal only (shape inference); any nonzero byte is true.
    return Loop([map](const KernelArgs& a) {
      const uint8_t* x = Input<uint8_t>(a, 0);
      const uint8_t* y = Input<uint8_t>(a, 1);
      uint8_t* z = Output<uint8_t>(a, 0);
      map.ForEach([&](int64_t e, int64_t i, int64_t j) { z[e] = (x[i] != 0) == (y[j] != 0); });
    });
  }
  return WithType(t, [&](auto tag) {
    using T = decltype(tag);
    return Loop([map, op](const KernelArgs& a) {
      const T* x = Input<T>(a, 0);
      const T* y = Input<T>(a, 1);
      uint8_t* z = Output<uint8_t>(a, 0);
      map.ForEach([&](int64_t e, int64_t i, int64_t j) { z[e] = ApplyCompare(op, x[i], y[j]); });
    });
  });
}

KernelOr Logic(const Node& n, const Graph& g) {
  if (n.op == "Not") {
    const int64_t count = NumElements(In(n, g, 0).shape);
    return Loop([count](const KernelArgs& a) {
      const uint8_t* x = Input<uint8_t>(a, 0);
      uint8_t* z = Output<uint8_t>(a, 0);
      for (int64_t e = 0; e < count; ++e) z[e] = x[e] == 0;
    });
  }
  const bool is_and = n.op == "And";
  BroadcastMap map(Out(n, g, 0).shape, {In(n, g, 0).shape, In(n, g, 1).shape});
  return Loop([map, is_and](const KernelArgs& a) {
    const uint8_t* x = Input<uint8_t>(a, 0);
    const uint8_t* y = Input<uint8_t>(a, 1);
    uint8_t* z = Output<uint8_t>(a, 0);
    map.ForEach([&](int64_t e, int64_t i, int64_t j) {
      z[e] = is_and ? (x[i] != 0 && y[j] != 0) : (x[i] != 0 || y[j] != 0);
    });
  });
}

// Min and Max: the first two inputs broadcast into the output, then each further input is
// combined into it in place.
// A single input is combined with itself.
KernelOr MinMax(const Node& n, const Graph& g) {
  const Shape out = Out(n, g, 0).shape;
  const bool is_max = n.op == "Max";
  const size_t inputs = n.inputs.size();
  std::vector<BroadcastMap> maps;  // step k combines (input 0 or the output) with input k + 1
  for (size_t k = 0; k + 1 < std::max<size_t>(inputs, 2); ++k) {
    const Shape& y = In(n, g, inputs == 1 ? 0 : k + 1).shape;
    maps.emplace_back(out, std::vector<Shape>{k == 0 ? In(n, g, 0).shape : out, y});
  }
  return WithType(Out(n, g, 0).type, [&](auto tag) {
    using T = decltype(tag);
    return Loop([maps, is_max, inputs](const KernelArgs& a) {
      T* z = Output<T>(a, 0);
      for (size_t k = 0; k < maps.size(); ++k) {
        const T* x = k == 0 ? Input<T>(a, 0) : z;
        const T* y = Input<T>(a, inputs == 1 ? 0 : k + 1);
        maps[k].ForEach([&](int64_t e, int64_t i, int64_t j) {
          z[e] = is_max ? ApplyMax(x[i], y[j]) : ApplyMin(x[i], y[j]);
        });
      }
    });
  });
}

KernelOr Where(const Node& n, const Graph& g) {
  const Shape out = Out(n, g, 0).shape;
  std::vector<Shape> strides;
  for (size_t i = 0; i < 3; ++i) strides.push_back(BroadcastStrides(In(n, g, i).shape, out));
  return WithElementSize(Out(n, g, 0).type, [&](auto tag) {
    using T = decltype(tag);
    return Loop([out, strides](const KernelArgs& a) {
      const uint8_t* c = Input<uint8_t>(a, 0);
      const T* x = Input<T>(a, 1);
      const T* y = Input<T>(a, 2);
      T* z = Output<T>(a, 0);
      ForEachBroadcast(out, strides, [&](int64_t e, const int64_t* off) {
        z[e] = c[off[0]] != 0 ? x[off[1]] : y[off[2]];
      });
    });
  });
}

KernelOr Clip(const Node& n, const Graph& g) {
  const DataType t = Out(n, g, 0).type;
  const int64_t count = NumElements(In(n, g, 0).shape);
  if (g.opset() < 11) {
    // Clip-6's defaults are float's finite limits.
    const float lo = n.GetFloat("min", std::numeric_limits<float>::lowest());
    const float hi = n.GetFloat("max", std::numeric_limits<float>::max());
    return Loop([count, lo, hi](const KernelArgs& a) {
      const float* x = Input<float>(a, 0);
      float* z = Output<float>(a, 0);
      for (int64_t e = 0; e < count; ++e) z[e] = ApplyClip(x[e], lo, hi);
    });
  }
  // From opset 11 the bounds are optional scalar inputs, read when the kernel runs.
  return WithType(t, [&](auto tag) {
    using T = decltype(tag);
    return Loop([count](const KernelArgs& a) {
      const T lo = a.inputs.size() > 1 && a.inputs[1] ? Input<T>(a, 1)[0] : Unbounded<T>(false);
      const T hi = a.inputs.size() > 2 && a.inputs[2] ? Input<T>(a, 2)[0] : Unbounded<T>(true);
      const T* x = Input<T>(a, 0);
      T* z = Output<T>(a, 0);
      for (int64_t e = 0; e < count; ++e) z[e] = ApplyClip(x[e], lo, hi);
    });
  });
}

KernelOr Cast(const Node& n, const Graph& g) {
  const DataType from = In(n, g, 0).type, to = Out(n, g, 0).type;
  const int64_t count = NumElements(In(n, g, 0).shape);
  if (from == to) {
    const size_t bytes = In(n, g, 0).bytes();
    return Loop([bytes](const KernelArgs& a) {
      if (a.outputs[0] != a.inputs[0]) std::memcpy(a.outputs[0], a.inputs[0], bytes);
    });
  }
  return WithType(from, [&](auto from_tag) {
    using F = decltype(from_tag);
    return WithType(to, [&](auto to_tag) {
      using T = decltype(to_tag);
      return Loop([count](const KernelArgs& a) {
        const F* x = Input<F>(a, 0);
        T* z = Output<T>(a, 0);
        for (int64_t e = 0; e < count; ++e) {
          if constexpr (std::is_same_v<T, uint8_t>) {
            z[e] = x[e] != 0;  // NaN is true, as numpy's astype(bool)
          } else if constexpr (std::is_same_v<F, float> && std::is_same_v<T, int64_t>) {
            z[e] = FloatToInt64(x[e]);
          } else {
            z[e] = static_cast<T>(x[e]);
          }
        }
      });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Unary float math.

// Erf, SalusErfc (1 - erf, exact where it is small), Sin, Cos, Atan, Floor, Ceil, Round (half to
// even), and SalusLog1p and SalusExpm1 (PyTorch's log1p and expm1: exact for small x, where log(1 +
// x) and exp(x) - 1 lose every digit), by the C library; SalusLgamma, SalusDigamma, SalusErfinv and
// SalusPolygamma (attribute n) by element_math.h.
KernelOr FloatMath(const Node& n, const Graph& g) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const int64_t count = NumElements(In(n, g, 0).shape);
  using Fn = float (*)(float);
  Fn fn = static_cast<Fn>(std::erf);
  if (n.op == "SalusLog1p") fn = static_cast<Fn>(std::log1p);
  if (n.op == "SalusExpm1") fn = static_cast<Fn>(std::expm1);
  if (n.op == "SalusErfc") fn = static_cast<Fn>(std::erfc);
  if (n.op == "Sin") fn = static_cast<Fn>(std::sin);
  if (n.op == "Cos") fn = static_cast<Fn>(std::cos);
  if (n.op == "Atan") fn = static_cast<Fn>(std::atan);
  if (n.op == "Floor") fn = static_cast<Fn>(std::floor);
  if (n.op == "Ceil") fn = static_cast<Fn>(std::ceil);
  if (n.op == "Round") fn = static_cast<Fn>(std::nearbyint);  // the default mode: to even
  if (n.op == "SalusLgamma") fn = Lgamma;                     // element_math.h's formulas
  if (n.op == "SalusDigamma") fn = Digamma;
  if (n.op == "SalusErfinv") fn = Erfinv;
  if (n.op == "SalusPolygamma") {
    const int order = static_cast<int>(n.GetInt("n", 0));
    return Loop([count, order](const KernelArgs& a) {
      const float* x = Input<float>(a, 0);
      float* z = Output<float>(a, 0);
      for (int64_t e = 0; e < count; ++e) z[e] = Polygamma(order, x[e]);
    });
  }
  return Loop([count, fn](const KernelArgs& a) {
    const float* x = Input<float>(a, 0);
    float* z = Output<float>(a, 0);
    for (int64_t e = 0; e < count; ++e) z[e] = fn(x[e]);
  });
}

// ---------------------------------------------------------------------------------------------
// Data movement and generators.

// Row by row (the output's last dim): each row is a row of X, or one element of X repeated.
KernelOr Expand(const Node& n, const Graph& g) {
  const Shape out = Out(n, g, 0).shape;
  const Shape strides = BroadcastStrides(In(n, g, 0).shape, out);
  const Shape rows = out.empty() ? Shape{} : Shape(out.begin(), out.end() - 1);
  const Shape row_strides = out.empty() ? Shape{} : Shape(strides.begin(), strides.end() - 1);
  const int64_t inner = out.empty() ? 1 : out.back();
  const bool repeat = !out.empty() && strides.back() == 0;
  return WithElementSize(Out(n, g, 0).type, [&](auto tag) {
    using T = decltype(tag);
    return Loop([=](const KernelArgs& a) {
      const T* x = Input<T>(a, 0);
      T* z = Output<T>(a, 0);
      ForEachBroadcast(rows, {row_strides}, [&](int64_t r, const int64_t* off) {
        T* to = z + r * inner;
        if (repeat) {
          std::fill(to, to + inner, x[off[0]]);
        } else {
          std::copy(x + off[0], x + off[0] + inner, to);
        }
      });
    });
  });
}

KernelOr Gather(const Node& n, const Graph& g) {
  const Shape& x = In(n, g, 0).shape;
  SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), x.size()));
  GatherGeometry geo;
  for (int64_t i = 0; i < axis; ++i) geo.outer *= x[i];
  geo.axis_dim = x[axis];
  for (size_t i = axis + 1; i < x.size(); ++i) geo.inner *= x[i];
  geo.count = NumElements(In(n, g, 1).shape);
  const size_t row_bytes = static_cast<size_t>(geo.inner) * ElementSize(Out(n, g, 0).type);
  return Checked([node = n.Describe(), geo, row_bytes](const KernelArgs& a) {
    const int64_t* indices = Input<int64_t>(a, 1);
    for (int64_t j = 0; j < geo.count; ++j) {
      if (indices[j] < -geo.axis_dim || indices[j] >= geo.axis_dim) {
        return InvalidArgumentError(node + ": index " + std::to_string(indices[j]) +
                                    " out of range for dim " + std::to_string(geo.axis_dim));
      }
    }
    const std::byte* src = Input<std::byte>(a, 0);
    std::byte* dst = Output<std::byte>(a, 0);
    // A row of `inner` elements at a time; GatherSourceIndex of its first element.
    for (int64_t r = 0; r < geo.outer * geo.count; ++r) {
      const int64_t from = GatherSourceIndex(geo, indices, r * geo.inner) / geo.inner;
      std::memcpy(dst + r * row_bytes, src + from * row_bytes, row_bytes);
    }
    return OkStatus();
  });
}

// Element by element, as the CUDA device maps them (the exporters' uses are small: BERT's
// token-type buffer, which folds).
KernelOr GatherElements(const Node& n, const Graph& g) {
  const Shape& x = In(n, g, 0).shape;
  SALUS_ASSIGN_OR_RETURN(const int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), x.size()));
  GatherElementsGeometry geo;
  if (!MakeGatherElementsGeometry(x, In(n, g, 1).shape, axis, &geo)) {
    return UnimplementedError(n.Describe() + ": more than " + std::to_string(kMaxIndexDims) +
                              " dims");
  }
  const int64_t count = NumElements(In(n, g, 1).shape);
  const size_t bytes = ElementSize(Out(n, g, 0).type);
  return Checked([node = n.Describe(), geo, count, bytes](const KernelArgs& a) {
    const int64_t* indices = Input<int64_t>(a, 1);
    const std::byte* src = Input<std::byte>(a, 0);
    std::byte* dst = Output<std::byte>(a, 0);
    for (int64_t o = 0; o < count; ++o) {
      const int64_t k = indices[o];
      if (k < -geo.axis_dim || k >= geo.axis_dim) {
        return InvalidArgumentError(node + ": index " + std::to_string(k) +
                                    " out of range for dim " + std::to_string(geo.axis_dim));
      }
      std::memcpy(dst + o * bytes, src + GatherElementsSourceIndex(geo, o, k) * bytes, bytes);
    }
    return OkStatus();
  });
}

// Updates applied in order (a repeated index: the last wins), as the CUDA device applies them.
KernelOr ScatterND(const Node& n, const Graph& g) {
  ScatterNDGeometry geo;
  if (!MakeScatterNDGeometry(In(n, g, 0).shape, In(n, g, 1).shape, &geo)) {
    return UnimplementedError(n.Describe() + ": index tuples of more than " +
                              std::to_string(kMaxIndexDims) + " entries");
  }
  const size_t bytes = static_cast<size_t>(geo.slice) * ElementSize(Out(n, g, 0).type);
  const size_t total =
      static_cast<size_t>(NumElements(In(n, g, 0).shape)) * ElementSize(Out(n, g, 0).type);
  return Checked([node = n.Describe(), geo, bytes, total](const KernelArgs& a) {
    const int64_t* indices = Input<int64_t>(a, 1);
    const std::byte* updates = Input<std::byte>(a, 2);
    std::byte* out = Output<std::byte>(a, 0);
    for (int64_t m = 0; m < geo.count; ++m) {
      if (ScatterNDTarget(geo, indices + m * geo.k) < 0) {
        return InvalidArgumentError(node + ": index tuple " + std::to_string(m) +
                                    " is out of range");
      }
    }
    if (out != Input<std::byte>(a, 0)) std::memcpy(out, Input<std::byte>(a, 0), total);
    for (int64_t m = 0; m < geo.count; ++m) {
      const int64_t at = ScatterNDTarget(geo, indices + m * geo.k);
      std::memcpy(out + at * bytes, updates + m * bytes, bytes);
    }
    return OkStatus();
  });
}

// Rows shorter than this are copied element by element (a memcpy call costs more).
constexpr int64_t kSliceRowMin = 8;

KernelOr Slice(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(SliceSpec spec, SliceFor(g, n));
  SliceMap map;
  if (!MakeSliceMap(In(n, g, 0).shape, spec.starts, spec.steps, spec.out, &map)) {
    return UnimplementedError(n.Describe() + ": more than " + std::to_string(kMaxIndexDims) +
                              " sliced dims");
  }
  // Note [Slices by rows]: where the innermost merged dim is read with step 1, the output is
  // rows of consecutive input elements: each row's source is found once and copied whole (an
  // attention's q, k and v split from one projection: 1 ms per step element by element).
  const int64_t row = map.rank > 0 && map.step[map.rank - 1] == 1 ? map.out[map.rank - 1] : 1;
  return WithElementSize(Out(n, g, 0).type, [&](auto tag) {
    using T = decltype(tag);
    return Loop([map, row](const KernelArgs& a) {
      const T* x = Input<T>(a, 0);
      T* z = Output<T>(a, 0);
      const int64_t count = SliceOutputCount(map);
      if (row >= kSliceRowMin) {
        for (int64_t o = 0; o < count; o += row) {
          std::memcpy(z + o, x + SliceSourceIndex(map, o), row * sizeof(T));
        }
        return;
      }
      for (int64_t o = 0; o < count; ++o) z[o] = x[SliceSourceIndex(map, o)];
    });
  });
}

// Copies of [outer, part_i * inner] blocks between one tensor and its parts along an axis:
// Split scatters the input into its outputs, Concat gathers its inputs into the output.
struct AxisParts {
  int64_t outer = 1;
  std::vector<size_t> part_bytes;  // per part: its extent along the axis times inner, in bytes
  size_t whole_bytes = 0;          // the same for the whole tensor
};

AxisParts PartsAlong(const Shape& whole, int64_t axis, const std::vector<int64_t>& sizes,
                     DataType t) {
  AxisParts p;
  int64_t inner = 1;
  for (int64_t i = 0; i < axis; ++i) p.outer *= whole[i];
  for (size_t i = axis + 1; i < whole.size(); ++i) inner *= whole[i];
  for (int64_t s : sizes) p.part_bytes.push_back(static_cast<size_t>(s * inner) * ElementSize(t));
  p.whole_bytes = static_cast<size_t>(whole[axis] * inner) * ElementSize(t);
  return p;
}

KernelOr Split(const Node& n, const Graph& g) {
  int64_t axis = 0;
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, SplitSizes(g, n, &axis));
  const AxisParts p = PartsAlong(In(n, g, 0).shape, axis, sizes, In(n, g, 0).type);
  return Loop([p](const KernelArgs& a) {
    const std::byte* x = Input<std::byte>(a, 0);
    size_t offset = 0;
    for (size_t i = 0; i < p.part_bytes.size(); ++i) {
      std::byte* z = i < a.outputs.size() ? Output<std::byte>(a, i) : nullptr;
      if (z != nullptr && p.part_bytes[i] > 0) {
        for (int64_t o = 0; o < p.outer; ++o) {
          std::memcpy(z + o * p.part_bytes[i], x + o * p.whole_bytes + offset, p.part_bytes[i]);
        }
      }
      offset += p.part_bytes[i];
    }
  });
}

KernelOr Trilu(const Node& n, const Graph& g) {
  const Shape& x = In(n, g, 0).shape;
  const int64_t rows = x[x.size() - 2], cols = x[x.size() - 1];
  const int64_t matrices = NumElements(x) / std::max<int64_t>(rows * cols, 1);
  const bool upper = n.GetInt("upper", 1) != 0;
  return WithElementSize(Out(n, g, 0).type, [&](auto tag) {
    using T = decltype(tag);
    return Loop([rows, cols, matrices, upper](const KernelArgs& a) {
      const int64_t k = a.inputs.size() > 1 && a.inputs[1] ? Input<int64_t>(a, 1)[0] : 0;
      const T* in = Input<T>(a, 0);
      T* z = Output<T>(a, 0);
      for (int64_t m = 0; m < matrices; ++m) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t e = (m * rows + r) * cols + c;
            z[e] = TriluKeeps(r, c, k, upper) ? in[e] : T{0};
          }
        }
      }
    });
  });
}

// Element i is start + i * delta (the ONNX definition; no accumulated rounding).
KernelOr Range(const Node& n, const Graph& g) {
  const int64_t count = NumElements(Out(n, g, 0).shape);
  return WithType(Out(n, g, 0).type, [&](auto tag) {
    using T = decltype(tag);
    return Loop([count](const KernelArgs& a) {
      const T start = Input<T>(a, 0)[0], delta = Input<T>(a, 2)[0];
      T* z = Output<T>(a, 0);
      for (int64_t i = 0; i < count; ++i) {
        if constexpr (std::is_same_v<T, int64_t>) {
          // Wraps like numpy rather than overflow, though shape inference bounds the count.
          z[i] = static_cast<int64_t>(static_cast<uint64_t>(start) +
                                      static_cast<uint64_t>(i) * static_cast<uint64_t>(delta));
        } else {
          z[i] = start + static_cast<T>(i) * delta;
        }
      }
    });
  });
}

KernelOr ConstantOfShape(const Node& n, const Graph& g) {
  const Value& out = Out(n, g, 0);
  std::vector<std::byte> value(ElementSize(out.type), std::byte{0});
  if (n.Has("value")) {
    const HostTensor& v = n.attrs.at("value").t;
    if (v.type != out.type || v.bytes.size() != value.size()) {
      return InvalidArgumentError(n.Describe() + ": bad value");
    }
    value = v.bytes;
  }
  const int64_t count = NumElements(out.shape);
  return Loop([value, count](const KernelArgs& a) {
    std::byte* z = Output<std::byte>(a, 0);
    for (int64_t e = 0; e < count; ++e) {
      std::memcpy(z + e * value.size(), value.data(), value.size());
    }
  });
}

// Shapes are fixed at compile time, so a Shape node writes a constant (the importer folds it).
KernelOr ShapeOf(const Node& n, const Graph& g) {
  const Shape& x = In(n, g, 0).shape;
  const int64_t rank = x.size();
  int64_t start = n.GetInt("start", 0);
  if (start < 0) start += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  const int64_t count = NumElements(Out(n, g, 0).shape);
  std::vector<int64_t> dims(x.begin() + start, x.begin() + start + count);
  return Loop(
      [dims](const KernelArgs& a) { std::copy(dims.begin(), dims.end(), Output<int64_t>(a, 0)); });
}

// In place: inputs (variable, x), no outputs. The variable (persistent memory) becomes x, or
// itself plus or minus x (attribute `mode`: "set", "add", "sub"); TensorFlow's
// Assign/AssignAdd/AssignSubVariableOp.
KernelOr Assign(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const std::string mode, AssignModeFor(g, n));
  const Value& var = In(n, g, 0);
  const int64_t count = NumElements(var.shape);
  if (mode == "set") {
    const size_t bytes = var.bytes();
    return Loop([bytes](const KernelArgs& a) {
      if (bytes > 0 && a.inputs[0] != a.inputs[1]) std::memcpy(a.inputs[0], a.inputs[1], bytes);
    });
  }
  // Branch-free loops, split across the step's threads (Note [Threads per step]): a model's
  // optimizer updates every weight with one of these each iteration.
  const bool add = mode == "add";
  if (var.type == DataType::kFloat32) {
    return Loop([count, add](const KernelArgs& a) {
      float* v = static_cast<float*>(a.inputs[0]);
      const float* x = Input<float>(a, 1);
      const float sign = add ? 1.0f : -1.0f;
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 15))
      for (int64_t e = 0; e < count; ++e) v[e] += sign * x[e];
    });
  }
  if (var.type == DataType::kInt64) {
    return Loop([count, add](const KernelArgs& a) {
      // Wrapping, as TensorFlow's integer arithmetic.
      uint64_t* v = static_cast<uint64_t*>(a.inputs[0]);
      const uint64_t* x = Input<uint64_t>(a, 1);
      if (add) {
        for (int64_t e = 0; e < count; ++e) v[e] += x[e];
      } else {
        for (int64_t e = 0; e < count; ++e) v[e] -= x[e];
      }
    });
  }
  return Unsupported(n, var.type);
}

// Input x (float32 or int64), attribute `axis` (non-negative); output int64 with that axis
// removed: the first index of the largest element along it (TensorFlow's ArgMax).
KernelOr ArgMax(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const ArgMaxGeometry geo, ArgMaxFor(g, n));
  const Value& x = In(n, g, 0);
  return WithType(x.type, [&](auto tag) -> KernelOr {
    using T = decltype(tag);
    return Loop([geo](const KernelArgs& a) {
      const T* x = Input<T>(a, 0);
      int64_t* y = Output<int64_t>(a, 0);
      for (int64_t o = 0; o < geo.outer * geo.inner; ++o) y[o] = ArgMaxAt(geo, x, o);
    });
  });
}

// SalusSort: each slice along the axis ordered by SortsBefore (element_math.h).
KernelOr Sort(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const ArgMaxGeometry geo, SortFor(g, n));
  const bool descending = n.GetInt("descending", 0) != 0;
  const Value& x = In(n, g, 0);
  return WithType(x.type, [&](auto tag) -> KernelOr {
    using T = decltype(tag);
    return Loop([geo, descending](const KernelArgs& a) {
      const T* x = Input<T>(a, 0);
      T* values = Output<T>(a, 0);
      int64_t* indices = Output<int64_t>(a, 1);
      std::vector<int64_t> order(geo.axis_dim);
      for (int64_t o = 0; o < geo.outer * geo.inner; ++o) {
        const int64_t base = (o / geo.inner) * geo.axis_dim * geo.inner + o % geo.inner;
        const T* slice = x + base;
        for (int64_t i = 0; i < geo.axis_dim; ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
          return SortsBefore(slice[i * geo.inner], i, slice[j * geo.inner], j, descending);
        });
        for (int64_t r = 0; r < geo.axis_dim; ++r) {
          values[base + r * geo.inner] = slice[order[r] * geo.inner];
          indices[base + r * geo.inner] = order[r];
        }
      }
    });
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Non-float forms of cpu_kernels.cc's ops.

KernelOr CpuIntegerBinary(const Node& n, const Graph& g) {
  const DataType t = Out(n, g, 0).type;
  BinaryOp op = BinaryOp::kAdd;
  if (t != DataType::kInt64) return Unsupported(n, t);
  if (!BinaryOpFor(n.op, &op) || op == BinaryOp::kPow) return Unsupported(n, t);
  BroadcastMap map(Out(n, g, 0).shape, {In(n, g, 0).shape, In(n, g, 1).shape});
  const int64_t divisors = op == BinaryOp::kDiv ? NumElements(In(n, g, 1).shape) : 0;
  return Checked([node = n.Describe(), map, op, divisors](const KernelArgs& a) {
    const int64_t* x = Input<int64_t>(a, 0);
    const int64_t* y = Input<int64_t>(a, 1);
    SALUS_RETURN_IF_ERROR(CheckDivisors(node, y, divisors));
    int64_t* z = Output<int64_t>(a, 0);
    map.ForEach([&](int64_t e, int64_t i, int64_t j) { z[e] = ApplyBinaryInt64(op, x[i], y[j]); });
    return OkStatus();
  });
}

KernelOr CpuIntegerUnary(const Node& n, const Graph& g) {
  const DataType t = Out(n, g, 0).type;
  if (t != DataType::kInt64 || (n.op != "Neg" && n.op != "Abs")) return Unsupported(n, t);
  const bool neg = n.op == "Neg";
  const int64_t count = NumElements(In(n, g, 0).shape);
  return Loop([count, neg](const KernelArgs& a) {
    const int64_t* x = Input<int64_t>(a, 0);
    int64_t* z = Output<int64_t>(a, 0);
    for (int64_t e = 0; e < count; ++e) {
      const bool flip = neg || x[e] < 0;
      z[e] = flip ? static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(x[e])) : x[e];
    }
  });
}

KernelOr CpuConcatCopy(const Node& n, const Graph& g) {
  const Shape& y = Out(n, g, 0).shape;
  SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n, n.GetInt("axis", 0), y.size()));
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < n.inputs.size(); ++i) sizes.push_back(In(n, g, i).shape[axis]);
  const AxisParts p = PartsAlong(y, axis, sizes, Out(n, g, 0).type);
  return Loop([p](const KernelArgs& a) {
    std::byte* z = Output<std::byte>(a, 0);
    size_t offset = 0;
    for (size_t i = 0; i < p.part_bytes.size(); ++i) {
      if (p.part_bytes[i] > 0) {
        const std::byte* x = Input<std::byte>(a, i);
        for (int64_t o = 0; o < p.outer; ++o) {
          std::memcpy(z + o * p.whole_bytes + offset, x + o * p.part_bytes[i], p.part_bytes[i]);
        }
      }
      offset += p.part_bytes[i];
    }
  });
}

void RegisterCpuTensorKernels(KernelRegistry* r) {
  const DeviceType cpu = DeviceType::kCpu;
  r->Register("Mod", cpu, Mod);
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    r->Register(op, cpu, Compare);
  }
  for (const char* op : {"Not", "And", "Or"}) r->Register(op, cpu, Logic);
  r->Register("Min", cpu, MinMax);
  r->Register("Max", cpu, MinMax);
  r->Register("Where", cpu, Where);
  r->Register("Clip", cpu, Clip);
  r->Register("Cast", cpu, Cast);
  for (const char* op :
       {"Erf", "SalusErfc", "SalusLog1p", "SalusExpm1", "Sin", "Cos", "Atan", "Floor", "Ceil",
        "Round", "SalusLgamma", "SalusDigamma", "SalusErfinv", "SalusPolygamma"}) {
    r->Register(op, cpu, FloatMath);
  }
  r->Register("Expand", cpu, Expand);
  r->Register("Gather", cpu, Gather);
  r->Register("GatherElements", cpu, GatherElements);
  r->Register("ScatterND", cpu, ScatterND);
  r->Register("Slice", cpu, Slice);
  r->Register("Split", cpu, Split);
  r->Register("Trilu", cpu, Trilu);
  r->Register("Range", cpu, Range);
  r->Register("ConstantOfShape", cpu, ConstantOfShape);
  r->Register("Shape", cpu, ShapeOf);
  r->Register("SalusAssign", cpu, Assign);
  r->Register("SalusArgMax", cpu, ArgMax);
  r->Register("SalusSort", cpu, Sort);
}

}  // namespace salus::exec
