// Reverse-mode automatic differentiation over the IR, and the optimizer's updates.
//
// Given a scalar loss, Autodiff walks the forward nodes in reverse topological order. Each
// node that lies on a path from a parameter to the loss contributes the gradients of its
// inputs from the gradients of its outputs, as new nodes: backward ops with oneDNN kernels
// where oneDNN has them ("SalusConvGradData", "SalusEltwiseGrad", ...), forward ops where the
// gradient is itself a forward computation (Gemm's gradients are Gemms), loops otherwise.
// Gradients that reach one value along several paths are summed with Add. Finally one update
// node per parameter ("SalusSgdUpdate" or "SalusAdamUpdate") changes the parameter and its
// optimizer state in place, in persistent memory.
#pragma once

#include "exec/graph.h"
#include "salus/status.h"

namespace salus::exec {

struct OptimizerOptions {
  // As torch.optim's SGD and Adam (weight decay as L2 added to the gradient) and AdamW
  // (decoupled: p -= lr * weight_decay * p before the Adam step).
  enum class Kind { kSgd, kAdam, kAdamW };
  Kind kind = Kind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.f;   // SGD
  bool nesterov = false;  // SGD
  float weight_decay = 0.f;
  float beta1 = 0.9f;  // Adam, AdamW
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

class Autodiff {
 public:
  // Appends the backward graph of `loss` and the optimizer updates. Unimplemented names the
  // node and op whose gradient the engine lacks.
  static Status Apply(Graph* graph, ValueId loss, const OptimizerOptions& optimizer);
};

}  // namespace salus::exec
