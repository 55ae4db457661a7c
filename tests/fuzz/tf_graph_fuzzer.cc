// libFuzzer target over TensorFlow GraphDefs (src/exec/tf_graph.proto), mutated through their
// structure by ProtoMutator, compiled by Executable::CompileTf with small limits and run once
// when small. The harness gives each Placeholder the shape its "shape" attribute declares
// (unknown dims 2, no attribute {2}) and fetches the graph's sinks (nodes no other node reads,
// but variable writes and NoOps), as a captured step's client would. Any input must end in a
// Status.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "exec/tf_graph.pb.h"
#include "fuzz_exec.h"
#include "proto_mutator.h"

namespace {

namespace tf = salus::tfgraph;

// The dim a Placeholder's unknown (-1) dims get, and the most fetches named.
constexpr int64_t kUnknownDim = 2;
constexpr size_t kMaxFetches = 4;

salus::fuzz::ProtoMutator Mutator(unsigned seed) {
  salus::fuzz::ProtoMutator m(seed);
  // clang-format off
  m.set_dictionary({"Placeholder", "Const", "VarHandleOp", "ReadVariableOp", "AssignVariableOp",
                    "AssignAddVariableOp", "AssignSubVariableOp", "MatMul", "BiasAdd", "Relu",
                    "ReluGrad", "Add", "AddV2", "Mul", "Sub", "Mean", "Sum", "Reshape", "Shape",
                    "StridedSlice", "Pack", "Conv2D", "MaxPool", "Identity", "Transpose",
                    "SparseSoftmaxCrossEntropyWithLogits", "BroadcastGradientArgs", "Tile",
                    "ConcatV2", "Cast", "NoOp", "dtype", "shape", "value", "T", "transpose_a",
                    "transpose_b", "strides", "padding", "ksize", "data_format", "keep_dims",
                    "begin_mask", "end_mask", "shrink_axis_mask", "N", "axis", "SAME", "VALID",
                    "NHWC", ":0", ":1", "^"});
  // clang-format on
  return m;
}

salus::exec::Shape PlaceholderShape(const tf::NodeDef& node) {
  auto it = node.attr().find("shape");
  if (it == node.attr().end() || !it->second.has_shape() || it->second.shape().unknown_rank()) {
    return {kUnknownDim};
  }
  salus::exec::Shape shape;
  for (const auto& dim : it->second.shape().dim()) {
    shape.push_back(dim.size() == -1 ? kUnknownDim : dim.size());
  }
  return shape;
}

bool WritesOnly(const std::string& op) { return op.rfind("Assign", 0) == 0 || op == "NoOp"; }

}  // namespace

SALUS_FUZZ_PROTO_HOOKS(tf::GraphDef, Mutator)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  salus::exec::CompileOptions options = salus::fuzz::SmallCompileOptions();
  // The harness's own reading of the graph; the importer parses the bytes again itself.
  tf::GraphDef graph;
  if (graph.ParseFromArray(data, static_cast<int>(size))) {
    std::set<std::string> read;
    for (const tf::NodeDef& node : graph.node()) {
      if (node.op() == "Placeholder") options.input_shapes[node.name()] = PlaceholderShape(node);
      for (const std::string& in : node.input()) {
        // "^n" (a control input), "n:k" and "n" all read node n.
        std::string_view name(in);
        if (!name.empty() && name.front() == '^') name.remove_prefix(1);
        read.emplace(name.substr(0, name.find(':')));
      }
    }
    for (const tf::NodeDef& node : graph.node()) {
      if (options.fetches.size() < kMaxFetches && !read.count(node.name()) &&
          !WritesOnly(node.op()) && node.op() != "VarHandleOp") {
        options.fetches.push_back(node.name());
      }
    }
  }
  auto exe = salus::exec::Executable::CompileTf(bytes, options);
  if (!exe.ok()) {
    salus::fuzz::Explain("compile", exe.status());
    return 0;
  }
  salus::fuzz::RunOnce(**exe);
  return 0;
}
