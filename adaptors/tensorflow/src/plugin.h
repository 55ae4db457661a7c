// Shared parts of the SALUS TensorFlow plugin: the daemon connection, the captured-graph
// runner and the variable residence table (kernels.cc), used by the graph rewrite
// (rewrite.cc) and the kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "wire.h"

namespace salus::tf {

inline constexpr char kDeviceType[] = "SALUS";
inline constexpr char kIterationOp[] = "SalusIteration";

// The ops a captured step may contain: the daemon's TensorFlow importer maps each of them onto
// the engine's kernels (src/exec/tf_ops.inc, shared with it).
const std::vector<std::string>& CapturableOps();
bool IsCapturable(const std::string& op);

// The daemon connection of this process, made on first use, to the daemon every client finds
// (Note [Default endpoint] in src/common/endpoints.h). Null with *error set when the wire
// library cannot be loaded or the daemon cannot be reached.
WireClient* Daemon(WireError* error);

// A graph that runs in the daemon as one iteration per call: a captured step, or one eager op.
// `graph` is a template: Placeholder nodes named feed_names (one per feed) and VarHandleOp nodes
// named var_names (one per resource input), whose shapes are filled in from the tensors of the
// first call (and of any call with new shapes: one daemon session per shape signature).
struct GraphSpec {
  std::string name;  // for the sessions' names in salusctl
  tensorflow::GraphDef graph;
  std::vector<std::string> feed_names, var_names, fetch_names;
  std::vector<tensorflow::DataType> fetch_types;
  std::vector<bool> assigned;  // per variable: whether the graph writes it
  std::string error;           // non-empty: refused at capture; every call fails with it
  // Eager ops: small integer feeds (shapes, axes, multiples) become constants of the graph,
  // and their values part of the session's signature, so the daemon can fold what they decide.
  bool embed_small_integers = false;
};

class GraphRunner {
 public:
  explicit GraphRunner(GraphSpec spec);
  ~GraphRunner();
  // Runs the graph: inputs 0..feeds-1 are the feeds, the rest resource handles of variables.
  void Compute(tensorflow::OpKernelContext* ctx);

  struct Compiled;  // one daemon session (kernels.cc)

 private:
  absl::Status FetchFirstAssignment(tensorflow::GraphDef* g, int j,
                                    std::vector<std::pair<int, std::string>>* fetches);
  // Closes this runner's sessions, their variables pulled home first (Note [A job never waits on
  // itself]). Needs mu_.
  void EvictLocked();
  Compiled* SessionFor(tensorflow::OpKernelContext* ctx,
                       const std::vector<const tensorflow::Tensor*>& feeds,
                       const std::vector<tensorflow::Var*>& vars);
  GraphSpec spec_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Compiled>> compiled_;
};

// Note [Variable residence] in kernels.cc: before TensorFlow reads or writes a variable's
// tensor on the host, its newest value must be there.
absl::Status PullToHost(tensorflow::Var* var);
// The host copy was just written (an eager assignment): every daemon copy is stale.
void MarkHostWritten(tensorflow::Var* var);

// Registers the plugin's ops and kernels (kernels.cc), and the graph optimizer (rewrite.cc).
void RegisterKernels();

}  // namespace salus::tf
