// TensorFlow import: a serialized GraphDef (a captured training or inference step) -> checked,
// shape-inferred, constant-folded Graph.
//
// 1. Parse the bytes as tf_graph.proto's wire-compatible GraphDef (InvalidArgument when they are
//    not one). Nodes may come in any order; they are ordered topologically over their data
//    inputs ("n", "n:k") and control inputs ("^n"), ties broken by GraphDef order (a cycle, an
//    undefined input or a duplicate name is InvalidArgument naming the node). `device` fields
//    are ignored.
// 2. Every op is lowered to engine ops of ONNX semantics (the op table in tf_importer.cc and
//    docs/execution.md) through GraphBuilder, so each output's shape is inferred and each node
//    whose inputs are all constants is folded, as the ONNX importer does: TensorFlow's
//    dynamic-shape arithmetic (Shape, ShapeN, Size, Rank, BroadcastGradientArgs, and Pack,
//    StridedSlice, Prod... over shapes) becomes constants once the Placeholders' shapes are
//    fixed. An op the importer lacks anywhere in the graph is Unimplemented naming the node and
//    the op; bad input (wrong arity, a missing attribute, a non-constant shape argument) is
//    InvalidArgument naming the node.
// 3. Element types: DT_FLOAT is float32, DT_INT64 and DT_INT32 are int64 (TensorFlow's shapes,
//    indices and counters are int32; a client converts int32 feeds and fetches at the
//    boundary), DT_BOOL is bool; any other is Unimplemented naming the node.
// 4. Names (Note [TensorFlow names]): output k of node n is the engine value "n:k", and "n"
//    finds output 0 too.
//
// Variables (Note [TensorFlow variables]): a VarHandleOp is a persistent value of kind kState
// named by the node, zero-initialised (a client writes it with Executable::WritePersistent).
// ReadVariableOp reads it (a copy at the read's place in the order when the graph assigns the
// variable anywhere, TensorFlow's snapshot semantics; the value itself otherwise), and
// Assign/AssignAdd/AssignSubVariableOp become SalusAssign nodes that write it in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "exec/compile_limits.h"
#include "exec/graph.h"
#include "salus/status.h"

namespace salus::exec {

struct TfImportOptions {
  // The shape of every Placeholder, by node name (required: TensorFlow's are often partial).
  std::map<std::string, Shape> input_shapes;
  // What the import may cost (Note [Compile budgets] in compile_limits.h).
  CompileLimits limits;
};

class TfImporter {
 public:
  static StatusOr<Graph> Import(const void* data, size_t size, const TfImportOptions& options);
  // The TensorFlow ops the importer maps, sorted.
  static std::vector<std::string> SupportedOps();
  // Drops the copies of variable reads whose readers all run before the variable's next write
  // and that no fetch names (Note [Snapshots]).
  static void ElideSnapshots(Graph* g, const std::vector<std::string>& fetches);
};

}  // namespace salus::exec
