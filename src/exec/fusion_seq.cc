// Graph rewrites for the exported sequence models (exec/fusion.h): FuseGelu.
//
// FuseGelu finds the exporter's exact GELU, y = (x * (erf(x / sqrt 2) + 1)) * 0.5 or
// (x * 0.5) * (erf(x / sqrt 2) + 1), each Add and Mul in either operand order and the division
// possibly a multiplication by 1 / sqrt 2, whose intermediates no other node reads and that are
// neither fetched nor graph outputs, and replaces it with one Gelu node (approximate "none")
// writing y. Gelu has a gradient, so the rewrite also serves training compiles, before autodiff.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "exec/fusion.h"

namespace salus::exec {
namespace {

// Whether `id` is a compile-time float constant with one element equal to `want` (to 1e-6).
bool IsScalar(const Graph& g, ValueId id, double want) {
  if (id == kNoValue) return false;
  const Value& v = g.value(id);
  if (v.kind != ValueKind::kConstant || v.type != DataType::kFloat32) return false;
  if (NumElements(v.shape) != 1 || v.data.bytes.size() != sizeof(float)) return false;
  float f;
  std::memcpy(&f, v.data.bytes.data(), sizeof(f));
  return std::abs(f - want) <= 1e-6 * std::abs(want);
}

// The node producing `id` if it is op `op` with two inputs, else nullptr.
const Node* Producer(const Graph& g, ValueId id, const char* op) {
  if (id == kNoValue || g.value(id).producer < 0) return nullptr;
  const Node& n = g.nodes()[g.value(id).producer];
  return n.op == op && n.inputs.size() == 2 && n.outputs.size() == 1 ? &n : nullptr;
}

// For binary node `n` with one operand the scalar `want`, the other operand; else kNoValue.
ValueId OtherThanScalar(const Graph& g, const Node& n, double want) {
  if (IsScalar(g, n.inputs[1], want)) return n.inputs[0];
  if (IsScalar(g, n.inputs[0], want) && n.op != "Div") return n.inputs[1];
  return kNoValue;
}

// The x of erf(x / sqrt 2) + 1 produced as `a`, or kNoValue. Appends the pattern's nodes.
ValueId ErfPlusOneInput(const Graph& g, ValueId a, const std::vector<int>& reads,
                        std::vector<int>* nodes) {
  const Node* add = Producer(g, a, "Add");
  if (add == nullptr || reads[a] != 1) return kNoValue;
  const ValueId e = OtherThanScalar(g, *add, 1.0);
  if (e == kNoValue || reads[e] != 1 || g.value(e).producer < 0) return kNoValue;
  const Node& erf = g.nodes()[g.value(e).producer];
  if (erf.op != "Erf" || erf.inputs.size() != 1) return kNoValue;
  const ValueId s = erf.inputs[0];
  if (reads[s] != 1) return kNoValue;
  ValueId x = kNoValue;
  const Node* scale = Producer(g, s, "Div");
  if (scale != nullptr) {
    x = OtherThanScalar(g, *scale, std::sqrt(2.0));
  } else if ((scale = Producer(g, s, "Mul")) != nullptr) {
    x = OtherThanScalar(g, *scale, std::sqrt(0.5));
  }
  if (x == kNoValue) return kNoValue;
  nodes->push_back(g.value(a).producer);
  nodes->push_back(g.value(e).producer);
  nodes->push_back(g.value(s).producer);
  return x;
}

// Whether node `m` (a Mul) multiplies `x` by erf(x / sqrt 2) + 1; appends the pattern's nodes.
bool IsXTimesErfPlusOne(const Graph& g, const Node& m, ValueId x, const std::vector<int>& reads,
                        std::vector<int>* nodes) {
  for (int k = 0; k < 2; ++k) {
    if (m.inputs[k] != x) continue;
    std::vector<int> found;
    if (ErfPlusOneInput(g, m.inputs[1 - k], reads, &found) == x) {
      nodes->insert(nodes->end(), found.begin(), found.end());
      return true;
    }
  }
  return false;
}

}  // namespace

int FuseGelu(Graph* graph, const FusionOptions& options) {
  Graph& g = *graph;
  const std::vector<int> reads = ReadCounts(g, options.keep);
  std::vector<bool> dead(g.nodes().size(), false);
  int removed = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& top = g.nodes()[i];
    if (top.op != "Mul" || top.inputs.size() != 2 || top.outputs.size() != 1) continue;
    if (g.value(top.outputs[0]).type != DataType::kFloat32) continue;
    std::vector<int> nodes;
    ValueId x = kNoValue;
    // (x * (erf(x / sqrt 2) + 1)) * 0.5
    const ValueId inner = OtherThanScalar(g, top, 0.5);
    const Node* m = Producer(g, inner, "Mul");
    if (m != nullptr && reads[inner] == 1) {
      for (int k = 0; k < 2 && x == kNoValue; ++k) {
        nodes.clear();
        if (IsXTimesErfPlusOne(g, *m, m->inputs[k], reads, &nodes)) x = m->inputs[k];
      }
      if (x != kNoValue) nodes.push_back(g.value(inner).producer);
    }
    // (x * 0.5) * (erf(x / sqrt 2) + 1)
    for (int k = 0; k < 2 && x == kNoValue; ++k) {
      const Node* half = Producer(g, top.inputs[k], "Mul");
      if (half == nullptr || reads[top.inputs[k]] != 1) continue;
      const ValueId hx = OtherThanScalar(g, *half, 0.5);
      if (hx == kNoValue) continue;
      nodes.clear();
      if (ErfPlusOneInput(g, top.inputs[1 - k], reads, &nodes) == hx) {
        x = hx;
        nodes.push_back(g.value(top.inputs[k]).producer);
      }
    }
    if (x == kNoValue || g.value(x).shape != g.value(top.outputs[0]).shape) continue;
    bool taken = false;
    for (int n : nodes) taken = taken || dead[n];
    if (taken) continue;
    for (int n : nodes) {
      dead[n] = true;
      for (ValueId o : g.nodes()[n].outputs) g.value(o).producer = -1;
    }
    Node& gelu = g.nodes()[i];
    gelu.op = "Gelu";
    gelu.inputs = {x};
    gelu.attrs.clear();
    gelu.attrs["approximate"] = StringAttr("none");
    removed += static_cast<int>(nodes.size());
  }
  if (removed == 0) return 0;
  RemoveNodes(&g, dead);
  return removed;
}

}  // namespace salus::exec
