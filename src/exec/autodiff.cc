#include "exec/autodiff.h"

namespace salus::exec {

Status Autodiff::Apply(Graph* graph, ValueId loss, const OptimizerOptions& optimizer) {
  return UnimplementedError("training");
}

}  // namespace salus::exec
