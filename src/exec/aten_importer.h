// ATen import: a serialized salus.v1.AtenGraph (a PyTorch step as the PyTorch adaptor traces
// it: forward, backward and optimizer update in one functional graph) -> checked,
// shape-inferred, constant-folded Graph.
//
// 1. Parse the bytes (InvalidArgument when they are not an AtenGraph). Every value index must be
//    in range and every value made before it is used (InvalidArgument naming the node).
// 2. Inputs become kInput values and state values kState values (zero-initialised: a client
//    writes them with Executable::WritePersistent before the first step), both under their
//    names; constants become kConstant values.
// 3. Every node is lowered to engine ops (the table in aten_importer.cc, docs/pytorch.md)
//    through GraphBuilder, so shapes are inferred and constants fold as for ONNX. Each result's
//    shape and element type must be the one the graph declares; a mismatch is Internal naming
//    the node (the lowering would compute something else than PyTorch). An operator the table
//    lacks, or a form of one it does not lower (a transposed convolution's gradient, say), is
//    Unimplemented naming the operator, before anything runs.
// 4. "aten.copy_.default" into a state value becomes SalusAssign: the write happens where the
//    node stands, after the reads of the old value that precede it (the tracer puts the writes
//    last). A copy_ into anything else is refused.
// 5. The graph's outputs are named "output0", "output1", ... in order.
//
// Element types: float32, int64 and bool. float64 and int32 values are Unimplemented.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/compile_limits.h"
#include "exec/graph.h"
#include "salus/status.h"

namespace salus::exec {

struct AtenImportOptions {
  // What the import may cost (Note [Compile budgets] in compile_limits.h).
  CompileLimits limits;
};

class AtenImporter {
 public:
  static StatusOr<Graph> Import(const void* data, size_t size, const AtenImportOptions& options);
  // The ATen operators ("aten.convolution.default") the importer lowers, sorted.
  static std::vector<std::string> SupportedOps();
  // Output k of an imported graph is named OutputName(k).
  static std::string OutputName(size_t k) { return "output" + std::to_string(k); }
};

}  // namespace salus::exec
