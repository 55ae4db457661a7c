// The int64 and bool forms of ops whose float kernels are oneDNN primitives in cpu_kernels.cc:
// those factories hand any other element type to these loops (cpu_tensor_kernels.cc), which
// exporters' shape arithmetic needs (Shape -> Gather -> Mul -> Concat -> Reshape).
#pragma once

#include <memory>

#include "exec/graph.h"
#include "exec/kernel.h"
#include "salus/status.h"

namespace salus::exec {

// int64 Add, Sub, Mul and Div with numpy broadcasting (element_math.h's ApplyBinaryInt64); a
// zero divisor is InvalidArgument when the kernel runs. Other types and Pow are Unimplemented.
StatusOr<std::unique_ptr<Kernel>> CpuIntegerBinary(const Node& n, const Graph& g);

// int64 Neg and Abs (wrapping at INT64_MIN, as numpy); other ops and types are Unimplemented.
StatusOr<std::unique_ptr<Kernel>> CpuIntegerUnary(const Node& n, const Graph& g);

// Concat of int64 or bool tensors: a copy of each input's rows into place.
StatusOr<std::unique_ptr<Kernel>> CpuConcatCopy(const Node& n, const Graph& g);

}  // namespace salus::exec
