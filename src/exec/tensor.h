// Element types, shapes and host-side tensors of the execution engine.
//
// The engine computes in float32; int64 carries labels, shapes and indices. A HostTensor
// owns bytes in host memory: compile-time constants (initializers, folded subgraphs) and the
// tensors tools and tests feed and fetch. Device tensors never use it: they live at planned
// offsets from a persistent or lane base (docs/architecture.md, rule 4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "salus/status.h"

namespace salus::exec {

enum class DataType : int { kUndefined = 0, kFloat32 = 1, kInt64 = 7, kBool = 9 };

using Shape = std::vector<int64_t>;

size_t ElementSize(DataType type);
std::string DataTypeName(DataType type);
// Product of the dims; 1 for a scalar; -1 when a dim is negative or the product overflows.
int64_t NumElements(const Shape& shape);
// "[2,3,4]".
std::string ShapeString(const Shape& shape);

struct HostTensor {
  DataType type = DataType::kFloat32;
  Shape shape;
  std::vector<std::byte> bytes;

  HostTensor() = default;
  HostTensor(DataType t, Shape s);
  static HostTensor FromFloats(Shape s, const std::vector<float>& values);
  static HostTensor FromInt64s(Shape s, const std::vector<int64_t>& values);

  int64_t num_elements() const { return NumElements(shape); }
  float* floats() { return reinterpret_cast<float*>(bytes.data()); }
  const float* floats() const { return reinterpret_cast<const float*>(bytes.data()); }
  int64_t* int64s() { return reinterpret_cast<int64_t*>(bytes.data()); }
  const int64_t* int64s() const { return reinterpret_cast<const int64_t*>(bytes.data()); }
  // The values as int64 (from int64 or float data); for shape-like constants.
  std::vector<int64_t> ToInt64s() const;
};

}  // namespace salus::exec
