#include "exec/cpu_threads.h"

#include <omp.h>

#include <algorithm>

#include "exec/fusion.h"

namespace salus::exec {
namespace {

int64_t Elements(const Graph& g, ValueId id) {
  return id == kNoValue ? 0 : std::max<int64_t>(NumElements(g.value(id).shape), 0);
}

// Multiply-adds of the compute-bound ops; -1 for memory-bound ones.
int64_t MultiplyAdds(const Graph& g, const Node& n) {
  const std::string& op = n.op;
  auto shape = [&](size_t i) -> const Shape& { return g.value(n.inputs[i]).shape; };
  if (op == "Conv" || op == "SalusConvGradData" || op == "SalusConvGradWeights" ||
      op == "ConvTranspose") {
    // Every output or input element of the larger activation meets a whole filter.
    const Shape& w = op == "SalusConvGradWeights" ? g.value(n.outputs[0]).shape : shape(1);
    // Per output channel: OIHW's dims after the first, an HWIO filter's before the last.
    const bool hwio = n.GetInt(kFilterHwioAttr, 0) != 0;
    int64_t filter = 1;
    for (size_t d = hwio ? 0 : 1; d + (hwio ? 1 : 0) < w.size(); ++d) filter *= w[d];
    int64_t activation = 0;
    for (ValueId v : n.inputs) activation = std::max(activation, Elements(g, v));
    for (ValueId v : n.outputs) activation = std::max(activation, Elements(g, v));
    return activation * filter;
  }
  if (op == "MatMul" || op == "Gemm") {
    const Shape& a = shape(0);
    const bool ta = n.GetInt(op == "Gemm" ? "transA" : kMatMulTransA, 0) != 0;
    const int64_t k = a.empty() ? 1 : (ta && a.size() >= 2 ? a[a.size() - 2] : a.back());
    return Elements(g, n.outputs[0]) * k;
  }
  if (op == "LSTM" || op == "SalusLstmGrad") {
    // One time step's input and recurrent products: its rows times (input + hidden) per gate.
    const Shape& x = shape(0);
    const Shape& w = shape(1);
    const Shape& r = shape(2);
    if (x.size() != 3 || w.size() != 3 || r.size() != 3) return 0;
    const int64_t batch = n.GetInt("layout", 0) == 0 ? x[1] : x[0];
    return batch * w[0] * w[1] * (w[2] + r[2]);
  }
  return -1;
}

}  // namespace

int StepThreads(const Graph& g, const Node& n, int max_threads) {
  const int64_t factor = max_threads <= 2 ? kTwoThreadFactor : 1;
  const int64_t macs = MultiplyAdds(g, n);
  if (macs >= 0) return macs < kSerialMultiplyAdds * factor ? 1 : max_threads;
  int64_t elements = 0;
  for (ValueId v : n.inputs) elements += Elements(g, v);
  for (ValueId v : n.outputs) elements += Elements(g, v);
  return elements < kSerialElements * factor ? 1 : max_threads;
}

ScopedThreads::ScopedThreads(int threads) : saved_(omp_get_max_threads()) {
  if (threads != saved_) omp_set_num_threads(threads);
}

ScopedThreads::~ScopedThreads() {
  if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
}

int MaxThreads() { return omp_get_max_threads(); }

}  // namespace salus::exec
