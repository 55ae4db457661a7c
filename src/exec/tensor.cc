#include "exec/tensor.h"

#include <cstring>

namespace salus::exec {

size_t ElementSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kBool:
      return 1;
    case DataType::kUndefined:
      break;
  }
  return 0;
}

std::string DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kInt64:
      return "int64";
    case DataType::kBool:
      return "bool";
    case DataType::kUndefined:
      break;
  }
  return "undefined";
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

std::string ShapeString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

HostTensor::HostTensor(DataType t, Shape s)
    : type(t), shape(std::move(s)), bytes(NumElements(shape) * ElementSize(t)) {}

HostTensor HostTensor::FromFloats(Shape s, const std::vector<float>& values) {
  HostTensor t(DataType::kFloat32, std::move(s));
  const size_t n = std::min(t.bytes.size(), values.size() * 4);
  if (n > 0) std::memcpy(t.bytes.data(), values.data(), n);
  return t;
}

HostTensor HostTensor::FromInt64s(Shape s, const std::vector<int64_t>& values) {
  HostTensor t(DataType::kInt64, std::move(s));
  const size_t n = std::min(t.bytes.size(), values.size() * 8);
  if (n > 0) std::memcpy(t.bytes.data(), values.data(), n);
  return t;
}

std::vector<int64_t> HostTensor::ToInt64s() const {
  std::vector<int64_t> out(num_elements());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = type == DataType::kInt64 ? int64s()[i] : static_cast<int64_t>(floats()[i]);
  }
  return out;
}

}  // namespace salus::exec
