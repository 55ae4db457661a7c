// FuseElementwise (exec/fusion.h): chains of elementwise float arithmetic as one node.
//
// Note [Fused elementwise chains]
// An optimizer written as framework ops (Keras' Adam: about ten Add/Sub/Mul/Div/Sqrt nodes and
// three assignments per variable) runs each node as one pass over the weights: every
// intermediate is written to the lane and read back, so a step moves several times the bytes
// its arithmetic needs, and on the CPU those passes cost as much as the model's products. The
// pass below groups, in graph order, each such node with the producers of its operands whose
// result nothing else reads, and a SalusAssign with the chain that makes the value it writes.
// The group runs where its last node ran, as one SalusFusedElementwise node that reads each
// outside operand once and keeps every intermediate in a block of registers (the CPU kernel in
// cpu_kernels.cc), so only the chain's inputs and its result cross memory.
//
// Moving a member's reads to the group's place is safe unless something in between writes what
// it reads: nodes without outputs (SalusAssign and its kind) write in place, so a group is not
// extended across one that takes any of the group's outside operands. Every element goes
// through the same float operations, in the same order and with the same rounding, as through
// the separate nodes (oneDNN's binary and square-root primitives round exactly too), so fused
// and unfused results are identical bit for bit.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "exec/fusion.h"
#include "exec/shape_inference.h"

namespace salus::exec {
namespace {

struct Group {
  std::vector<int> members;  // node positions, ascending; the last is the root
  int sink = -1;             // a SalusAssign that writes the root's result, or -1
  bool merged = false;       // absorbed into a later group
};

bool Opcode(const std::string& op, ElementwiseOpcode* code, int* arity) {
  static const std::map<std::string, std::pair<ElementwiseOpcode, int>> kOps = {
      {"Add", {ElementwiseOpcode::kAdd, 2}},   {"Sub", {ElementwiseOpcode::kSub, 2}},
      {"Mul", {ElementwiseOpcode::kMul, 2}},   {"Div", {ElementwiseOpcode::kDiv, 2}},
      {"Sqrt", {ElementwiseOpcode::kSqrt, 1}}, {"Neg", {ElementwiseOpcode::kNeg, 1}}};
  auto it = kOps.find(op);
  if (it == kOps.end()) return false;
  *code = it->second.first;
  *arity = it->second.second;
  return true;
}

// Whether node `n` can be a member: one of the ops, float32 throughout, every operand with the
// output's element count or one element.
bool Fusable(const Graph& g, const Node& n) {
  ElementwiseOpcode code;
  int arity = 0;
  if (!Opcode(n.op, &code, &arity)) return false;
  if (n.outputs.size() != 1 || n.outputs[0] == kNoValue) return false;
  if (static_cast<int>(n.inputs.size()) != arity) return false;
  const Value& out = g.value(n.outputs[0]);
  const int64_t count = NumElements(out.shape);
  if (out.type != DataType::kFloat32 || count < 1) return false;
  for (ValueId in : n.inputs) {
    if (in == kNoValue) return false;
    const Value& v = g.value(in);
    const int64_t c = NumElements(v.shape);
    if (v.type != DataType::kFloat32 || (c != count && c != 1)) return false;
  }
  return true;
}

// Whether the group's reads may move to position `to`: no node with effects between a member
// and `to` takes one of the values that member reads from outside the group.
bool CanMoveTo(const Graph& g, const Group& group, int to, const std::vector<int>& effects) {
  std::set<ValueId> produced;
  for (int m : group.members) produced.insert(g.nodes()[m].outputs[0]);
  for (int m : group.members) {
    for (int k : effects) {
      if (k <= m || k >= to) continue;
      for (ValueId in : g.nodes()[k].inputs) {
        const std::vector<ValueId>& reads = g.nodes()[m].inputs;
        if (produced.count(in) == 0 && std::find(reads.begin(), reads.end(), in) != reads.end()) {
          return false;
        }
      }
    }
  }
  return true;
}

// Writes the group as one node at `at` (its root, or its sink), whose other members die.
void Emit(Graph* graph, const Group& group, std::vector<bool>* dead) {
  Graph& g = *graph;
  std::vector<ValueId> inputs;
  std::map<ValueId, int64_t> operand;  // a value -> its operand number
  if (group.sink >= 0) {
    inputs.push_back(g.nodes()[group.sink].inputs[0]);  // the variable, written in place
  }
  auto outside = [&](ValueId v) -> int64_t {
    auto it = operand.find(v);
    if (it != operand.end()) return it->second;
    // A variable the chain also reads is input 0 already.
    if (group.sink >= 0 && v == inputs[0]) return 0;
    inputs.push_back(v);
    return operand[v] = static_cast<int64_t>(inputs.size()) - 1;
  };
  std::vector<int64_t> program;
  for (size_t k = 0; k < group.members.size(); ++k) {
    const Node& m = g.nodes()[group.members[k]];
    ElementwiseOpcode code;
    int arity = 0;
    Opcode(m.op, &code, &arity);
    int64_t ab[2] = {0, 0};
    for (int j = 0; j < arity; ++j) ab[j] = outside(m.inputs[j]);
    if (arity == 1) ab[1] = ab[0];
    program.push_back(static_cast<int64_t>(code));
    program.push_back(ab[0]);
    program.push_back(ab[1]);
    operand[m.outputs[0]] = -1 - static_cast<int64_t>(k);
  }
  const int at = group.sink >= 0 ? group.sink : group.members.back();
  Node& n = g.nodes()[at];
  std::string mode;
  if (group.sink >= 0) {
    auto m = AssignModeFor(g, n);
    mode = m.ok() ? *m : "set";
  }
  for (int m : group.members) {
    if (m == at) continue;
    (*dead)[m] = true;
    g.value(g.nodes()[m].outputs[0]).producer = -1;
  }
  n.op = kFusedElementwiseOp;
  n.inputs = std::move(inputs);
  n.attrs.clear();
  n.attrs[kFusedProgramAttr] = IntsAttr(std::move(program));
  if (!mode.empty()) n.attrs[kFusedAssignAttr] = StringAttr(mode);
}

}  // namespace

int FuseElementwise(Graph* graph, const FusionOptions& options) {
  if (options.device != DeviceType::kCpu) return 0;
  Graph& g = *graph;
  const std::vector<int> reads = ReadCounts(g, options.keep);
  const int num_nodes = static_cast<int>(g.nodes().size());
  std::vector<int> effects;
  for (int i = 0; i < num_nodes; ++i) {
    if (WritesInPlace(g.nodes()[i])) effects.push_back(i);
  }
  std::vector<Group> groups;
  std::vector<int> root_of(num_nodes, -1);  // the group whose root a node is
  // The group rooted at the producer of `v` that can run at `to` as part of a chain of
  // `count` elements, or -1.
  auto absorbable = [&](ValueId v, int64_t count, int to) -> int {
    if (v == kNoValue || reads[v] != 1) return -1;
    const int p = g.value(v).producer;
    if (p < 0 || root_of[p] < 0) return -1;
    if (NumElements(g.value(v).shape) != count) return -1;
    const Group& gp = groups[root_of[p]];
    if (gp.merged || gp.sink >= 0 || !CanMoveTo(g, gp, to, effects)) return -1;
    return root_of[p];
  };
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == "SalusAssign" && n.inputs.size() == 2 && n.outputs.empty()) {
      const Value& var = g.value(n.inputs[0]);
      if (var.type != DataType::kFloat32 || !AssignModeFor(g, n).ok()) continue;
      const int k = absorbable(n.inputs[1], NumElements(var.shape), i);
      if (k < 0) continue;
      groups[k].sink = i;
      continue;
    }
    if (!Fusable(g, n)) continue;
    Group group;
    const int64_t count = NumElements(g.value(n.outputs[0]).shape);
    std::set<ValueId> seen;
    for (ValueId in : n.inputs) {
      if (!seen.insert(in).second) continue;
      const int k = absorbable(in, count, i);
      if (k < 0) continue;
      if (group.members.size() + groups[k].members.size() + 1 >
          static_cast<size_t>(kMaxFusedOperations)) {
        continue;
      }
      group.members.insert(group.members.end(), groups[k].members.begin(), groups[k].members.end());
      groups[k].merged = true;
    }
    group.members.push_back(i);
    std::sort(group.members.begin(), group.members.end());
    root_of[i] = static_cast<int>(groups.size());
    groups.push_back(std::move(group));
  }
  std::vector<bool> dead(num_nodes, false);
  int removed = 0;
  for (const Group& group : groups) {
    if (group.merged) continue;
    if (group.sink < 0 && group.members.size() < 2) continue;
    Emit(&g, group, &dead);
    removed += static_cast<int>(group.members.size()) - (group.sink >= 0 ? 0 : 1);
  }
  if (removed == 0) return 0;
  RemoveNodes(&g, dead);
  return removed;
}

}  // namespace salus::exec
