// The graph optimizer: captures each traced function's SALUS subgraph as one SalusIteration
// node (Note [Capture]).
#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "plugin.h"
#include "tensorflow/c/experimental/grappler/grappler.h"
#include "tensorflow/c/tf_buffer.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def.pb.h"

namespace salus::tf {
namespace {

using tensorflow::DataType;
using tensorflow::GraphDef;
using tensorflow::NodeDef;

// Note [Capture]
// TensorFlow hands the optimizer each traced function as one placed GraphDef: forward,
// gradients and optimizer updates, with the variables as resource arguments. The nodes placed on
// SALUS whose ops the daemon can run form the step. They are cut out into a template GraphDef
// in which every tensor entering from outside becomes a Placeholder (a Const stays a Const, so
// shapes still fold in the daemon) and every variable a VarHandleOp, and replaced by one
// SalusIteration node whose inputs are those tensors and the variables' handles, and whose
// outputs are the step's tensors used outside. Control edges into and out of the step attach to
// the new node. The step must be convex: a node outside it (an op SALUS cannot run, placed on
// the CPU) on a path between two of its nodes would have to run in the middle of the
// iteration, so it is refused, naming that node and its op. The refusal is a SalusIteration
// that fails when it runs, since a graph optimizer's own errors are only logged.
//
// Note [Stand-ins]
// A node of the step that TensorFlow will look up by name afterwards keeps a node of that name
// outside it. Only the item's fetches need its value: for those the stand-in is an Identity of
// the step's output. The rest are kept for their effects (a tf.function's control outputs: every
// stateful op of its body, each variable read included), and a NoOp after the step is all they
// need. An Identity there would make every step fetch every variable it reads out of the daemon
// (a Keras custom loop's step: the weights and both Adam slots, about 16 MB for a 1.3M-parameter
// MLP) and, since the Identity runs on SALUS too, send them back in as a second captured step.

struct Edge {
  std::string node;
  int index = 0;  // -1: a control edge
};

Edge ParseInput(const std::string& in) {
  Edge e;
  if (!in.empty() && in[0] == '^') {
    e.node = in.substr(1);
    e.index = -1;
    return e;
  }
  const size_t colon = in.rfind(':');
  if (colon == std::string::npos) {
    e.node = in;
    return e;
  }
  e.node = in.substr(0, colon);
  e.index = std::stoi(in.substr(colon + 1));
  return e;
}

std::string TensorName(const Edge& e) { return e.node + ":" + std::to_string(e.index); }

bool OnSalus(const NodeDef& n) {
  return n.device().find(std::string("/device:") + kDeviceType + ":") != std::string::npos;
}

absl::StatusOr<std::vector<DataType>> OutputTypes(const NodeDef& n) {
  const tensorflow::OpDef* op_def = nullptr;
  absl::Status s = tensorflow::OpRegistry::Global()->LookUpOpDef(n.op(), &op_def);
  if (!s.ok()) return s;
  tensorflow::DataTypeVector out;
  s = tensorflow::OutputTypesForNode(n, *op_def, &out);
  if (!s.ok()) return s;
  return std::vector<DataType>(out.begin(), out.end());
}

// Nodes that belong to the step: on SALUS, an op the daemon runs, and not a resource Identity
// (the handle of a variable stays outside; its value enters through the variable's input).
bool Capturable(const NodeDef& n) {
  if (!OnSalus(n) || !IsCapturable(n.op())) return false;
  if (n.op() == "Identity" || n.op() == "IdentityN") {
    auto types = OutputTypes(n);
    if (!types.ok()) return false;
    for (DataType t : *types) {
      if (t == tensorflow::DT_RESOURCE) return false;
    }
  }
  return true;
}

class Rewriter {
 public:
  Rewriter(GraphDef* g, std::set<std::string> preserve, std::set<std::string> fetched)
      : g_(g), preserve_(std::move(preserve)), fetched_(std::move(fetched)) {
    for (int i = 0; i < g_->node_size(); ++i) index_[g_->node(i).name()] = i;
  }

  absl::Status Run(int serial) {
    std::vector<bool> in(g_->node_size(), false);
    bool any = false;
    for (int i = 0; i < g_->node_size(); ++i) {
      in[i] = Capturable(g_->node(i));
      if (in[i] && g_->node(i).op() != "NoOp" && g_->node(i).op() != "Const") any = true;
    }
    if (!any) return absl::OkStatus();
    std::string error = Convexity(in);
    if (!error.empty()) return Refuse(in, error, serial);
    return Replace(in, "", serial);
  }

  // The step cannot be one iteration: the graph is left as it is, except that every node of
  // the would-be step waits for a SalusIteration that fails with the reason when it runs.
  absl::Status Refuse(const std::vector<bool>& in, const std::string& error, int serial) {
    std::string device;
    const std::string name = "salus_refused_" + std::to_string(serial);
    for (int i = 0; i < g_->node_size(); ++i) {
      if (!in[i]) continue;
      if (device.empty()) device = g_->node(i).device();
      g_->mutable_node(i)->add_input("^" + name);
    }
    NodeDef* refused = g_->add_node();
    refused->set_name(name);
    refused->set_op(kIterationOp);
    refused->set_device(device);
    auto& attr = *refused->mutable_attr();
    attr["Tin"].mutable_list();
    attr["Tout"].mutable_list();
    attr["nvars"].set_i(0);
    attr["graph"].set_s("");
    for (const char* key : {"feed_names", "var_names", "fetch_names"}) attr[key].mutable_list();
    attr["assigned"].mutable_list();
    attr["error"].set_s(error);
    return absl::OkStatus();
  }

 private:
  // Empty, or why the step cannot be one iteration.
  std::string Convexity(const std::vector<bool>& in) {
    const int n = g_->node_size();
    std::vector<std::vector<int>> succ(n), pred(n);
    for (int i = 0; i < n; ++i) {
      for (const std::string& s : g_->node(i).input()) {
        auto it = index_.find(ParseInput(s).node);
        if (it == index_.end()) continue;
        succ[it->second].push_back(i);
        pred[i].push_back(it->second);
      }
    }
    auto reach = [&](const std::vector<std::vector<int>>& adj) {
      std::vector<bool> seen(n, false);
      std::deque<int> q;
      for (int i = 0; i < n; ++i) {
        if (in[i]) q.push_back(i);
      }
      while (!q.empty()) {
        int u = q.front();
        q.pop_front();
        for (int v : adj[u]) {
          if (!seen[v] && !in[v]) {
            seen[v] = true;
            q.push_back(v);
          }
        }
      }
      return seen;
    };
    const std::vector<bool> after = reach(succ), before = reach(pred);
    for (int i = 0; i < n; ++i) {
      if (in[i] || !after[i] || !before[i]) continue;
      const NodeDef& node = g_->node(i);
      // Only a node that itself feeds back into the step is to blame (not one downstream of
      // the culprit).
      bool feeds_step = false;
      for (int v : succ[i]) feeds_step = feeds_step || in[v];
      if (!feeds_step) continue;
      return "node '" + node.name() + "': op " + node.op() +
             (OnSalus(node) ? " is not supported on SALUS"
                            : " cannot run on SALUS (placed on " + node.device() + ")") +
             ", and the step's SALUS ops need its result mid-iteration; supported ops are "
             "listed in adaptors/tensorflow/README.md";
    }
    return "";
  }

  absl::Status Replace(const std::vector<bool>& in, const std::string& error, int serial) {
    const int n = g_->node_size();
    GraphSpec spec;
    std::string device;
    std::map<std::string, std::string> feed_of;  // external tensor -> Placeholder name
    std::map<std::string, int> var_of;           // external resource tensor -> var index
    std::vector<std::string> feed_tensors, var_tensors;
    std::vector<DataType> tin;
    std::set<std::string> control_in;
    std::set<std::string> assigned_vars;
    for (int i = 0; i < n; ++i) {
      if (!in[i]) continue;
      const NodeDef& node = g_->node(i);
      if (device.empty()) device = node.device();
      NodeDef* copy = spec.graph.add_node();
      *copy = node;
      copy->clear_device();
      copy->clear_input();
      for (int k = 0; k < node.input_size(); ++k) {
        Edge e = ParseInput(node.input(k));
        auto src = index_.find(e.node);
        if (src == index_.end()) {
          return absl::InvalidArgumentError("input " + node.input(k) + " of " + node.name() +
                                            " is not in the graph");
        }
        if (in[src->second]) {
          copy->add_input(node.input(k));
          continue;
        }
        if (e.index < 0) {
          control_in.insert(e.node);
          continue;
        }
        const NodeDef& s = g_->node(src->second);
        if (s.op() == "Const") {
          // Constants travel with the graph, so what depends on them folds in the daemon.
          if (feed_of.count(s.name()) == 0) {
            NodeDef* c = spec.graph.add_node();
            *c = s;
            c->clear_device();
            c->clear_input();
            feed_of[s.name()] = s.name();
          }
          copy->add_input(node.input(k));
          continue;
        }
        auto types = OutputTypes(s);
        if (!types.ok()) return types.status();
        if (e.index >= static_cast<int>(types->size())) {
          return absl::InvalidArgumentError("input " + node.input(k) + " out of range");
        }
        const DataType t = (*types)[e.index];
        const std::string tensor = TensorName(e);
        if (t == tensorflow::DT_RESOURCE) {
          auto [it, fresh] = var_of.emplace(tensor, static_cast<int>(var_tensors.size()));
          if (fresh) {
            var_tensors.push_back(tensor);
            NodeDef* v = spec.graph.add_node();
            v->set_name("salus_var_" + std::to_string(it->second));
            v->set_op("VarHandleOp");
            spec.var_names.push_back(v->name());
          }
          copy->add_input(spec.var_names[it->second]);
          if (node.op().rfind("Assign", 0) == 0) assigned_vars.insert(spec.var_names[it->second]);
          continue;
        }
        auto [it, fresh] = feed_of.emplace(tensor, "salus_feed_" + std::to_string(tin.size()));
        if (fresh) {
          NodeDef* p = spec.graph.add_node();
          p->set_name(it->second);
          p->set_op("Placeholder");
          (*p->mutable_attr())["dtype"].set_type(t);
          feed_tensors.push_back(tensor);
          spec.feed_names.push_back(it->second);
          tin.push_back(t);
        }
        copy->add_input(it->second);
      }
    }
    // The step's tensors used outside, and its control successors.
    std::map<std::string, int> fetch_of;
    std::vector<DataType> tout;
    const std::string step = "salus_step_" + std::to_string(serial);
    for (int i = 0; i < n; ++i) {
      if (in[i]) continue;
      NodeDef* node = g_->mutable_node(i);
      for (int k = 0; k < node->input_size(); ++k) {
        Edge e = ParseInput(node->input(k));
        auto src = index_.find(e.node);
        if (src == index_.end() || !in[src->second]) continue;
        if (e.index < 0) {
          node->set_input(k, "^" + step);
          continue;
        }
        const std::string tensor = TensorName(e);
        auto [it, fresh] = fetch_of.emplace(tensor, static_cast<int>(tout.size()));
        if (fresh) {
          auto types = OutputTypes(g_->node(src->second));
          if (!types.ok()) return types.status();
          tout.push_back((*types)[e.index]);
          spec.fetch_names.push_back(tensor);
        }
        node->set_input(k, step + ":" + std::to_string(it->second));
      }
    }
    // Fetch names are the original "node:k"; a fetched Const is in the template too.
    NodeDef iteration;
    iteration.set_name(step);
    iteration.set_op(kIterationOp);
    iteration.set_device(device);
    for (const std::string& t : feed_tensors) iteration.add_input(t);
    for (const std::string& t : var_tensors) iteration.add_input(t);
    for (const std::string& c : control_in) iteration.add_input("^" + c);
    auto& attr = *iteration.mutable_attr();
    for (DataType t : tin) attr["Tin"].mutable_list()->add_type(t);
    if (tin.empty()) attr["Tin"].mutable_list();
    for (DataType t : tout) attr["Tout"].mutable_list()->add_type(t);
    if (tout.empty()) attr["Tout"].mutable_list();
    attr["nvars"].set_i(static_cast<int64_t>(var_tensors.size()));
    std::string graph;
    spec.graph.SerializeToString(&graph);
    attr["graph"].set_s(graph);
    auto strings = [&](const char* key, const std::vector<std::string>& v) {
      auto* list = attr[key].mutable_list();
      for (const std::string& s : v) list->add_s(s);
    };
    strings("feed_names", spec.feed_names);
    strings("var_names", spec.var_names);
    strings("fetch_names", spec.fetch_names);
    auto* assigned = attr["assigned"].mutable_list();
    for (size_t j = 0; j < spec.var_names.size(); ++j) {
      if (assigned_vars.count(spec.var_names[j]) > 0) assigned->add_i(static_cast<int64_t>(j));
    }
    attr["error"].set_s(error);
    // Keep what the step does not contain, then the step, then a stand-in for each node of
    // the step TensorFlow will ask for by name (Note [Stand-ins]): an Identity of its first
    // output for a fetch, else a NoOp after the step.
    GraphDef out;
    *out.mutable_versions() = g_->versions();
    *out.mutable_library() = g_->library();
    for (int i = 0; i < n; ++i) {
      if (!in[i]) *out.add_node() = g_->node(i);
    }
    for (int i = 0; i < n; ++i) {
      if (!in[i] || preserve_.count(g_->node(i).name()) == 0) continue;
      NodeDef* stand_in = out.add_node();
      stand_in->set_name(g_->node(i).name());
      stand_in->set_device(device);
      auto types = OutputTypes(g_->node(i));
      if (fetched_.count(g_->node(i).name()) > 0 && types.ok() && !types->empty() &&
          (*types)[0] != tensorflow::DT_RESOURCE) {
        const std::string tensor = g_->node(i).name() + ":0";
        auto [it, fresh] = fetch_of.emplace(tensor, static_cast<int>(tout.size()));
        if (fresh) {
          tout.push_back((*types)[0]);
          spec.fetch_names.push_back(tensor);
          attr["Tout"].mutable_list()->add_type((*types)[0]);
          attr["fetch_names"].mutable_list()->add_s(tensor);
        }
        stand_in->set_op("Identity");
        (*stand_in->mutable_attr())["T"].set_type((*types)[0]);
        stand_in->add_input(step + ":" + std::to_string(it->second));
      } else {
        stand_in->set_op("NoOp");
        stand_in->add_input("^" + step);
      }
    }
    *out.add_node() = iteration;
    *g_ = std::move(out);
    return absl::OkStatus();
  }

  GraphDef* g_;
  std::set<std::string> preserve_;
  std::set<std::string> fetched_;  // the nodes whose outputs the item fetches
  std::map<std::string, int> index_;
};

// A list of node names from the item (the nodes to preserve, or the fetches); a fetch may name a
// tensor ("node:1"): its node counts.
using ListSizeFn = void (*)(const TF_GrapplerItem*, int*, size_t*, TF_Status*);
using ListFn = void (*)(const TF_GrapplerItem*, char**, size_t*, int, void*, size_t, TF_Status*);
bool NodeNames(const TF_GrapplerItem* item, ListSizeFn size_of, ListFn list,
               std::set<std::string>* out, TF_Status* status) {
  int num = 0;
  size_t storage = 0;
  size_of(item, &num, &storage, status);
  if (TF_GetCode(status) != TF_OK) return false;
  std::vector<char*> values(num);
  std::vector<size_t> lengths(num);
  std::vector<char> buffer(storage);
  list(item, values.data(), lengths.data(), num, buffer.data(), storage, status);
  if (TF_GetCode(status) != TF_OK) return false;
  for (int i = 0; i < num; ++i) out->insert(ParseInput(std::string(values[i], lengths[i])).node);
  return true;
}

void* CreateOptimizer() { return nullptr; }
void DeleteOptimizer(void*) {}

void Optimize(void*, const TF_Buffer* in, const TF_GrapplerItem* item, TF_Buffer* out,
              TF_Status* status) {
  static std::atomic<int> serial{0};
  GraphDef g;
  if (!g.ParseFromArray(in->data, static_cast<int>(in->length))) {
    TF_SetStatus(status, TF_INVALID_ARGUMENT, "SALUS: the graph does not parse");
    return;
  }
  // Nodes TensorFlow must find by name afterwards cannot be cut out; of those, the fetches need
  // their values (Note [Stand-ins]).
  std::set<std::string> preserve;
  std::set<std::string> fetched;
  if (!NodeNames(item, TF_GetNodesToPreserveListSize, TF_GetNodesToPreserveList, &preserve,
                 status) ||
      !NodeNames(item, TF_GetFetchNodesListSize, TF_GetFetchNodesList, &fetched, status)) {
    return;
  }
  Rewriter r(&g, std::move(preserve), std::move(fetched));
  absl::Status s = r.Run(serial++);
  if (!s.ok()) {
    TF_SetStatus(status, static_cast<TF_Code>(s.code()), std::string(s.message()).c_str());
    return;
  }
  std::string bytes;
  g.SerializeToString(&bytes);
  void* data = std::malloc(bytes.size());
  std::memcpy(data, bytes.data(), bytes.size());
  out->data = data;
  out->length = bytes.size();
  out->data_deallocator = [](void* d, size_t) { std::free(d); };
  TF_SetStatus(status, TF_OK, "");
}

}  // namespace
}  // namespace salus::tf

extern "C" __attribute__((visibility("default"))) void TF_InitGraph(
    TP_OptimizerRegistrationParams* params, TF_Status* status) {
  params->device_type = salus::tf::kDeviceType;
  params->optimizer_configs->struct_size = TP_OPTIMIZER_CONFIGS_STRUCT_SIZE;
  // Rewrites that would turn the step's ops into fused or re-laid-out forms the daemon does
  // not know stay off while SALUS is present.
  params->optimizer_configs->remapping = TF_TriState_Off;
  params->optimizer_configs->layout_optimizer = TF_TriState_Off;
  params->optimizer_configs->auto_mixed_precision = TF_TriState_Off;
  params->optimizer->struct_size = TP_OPTIMIZER_STRUCT_SIZE;
  params->optimizer->create_func = salus::tf::CreateOptimizer;
  params->optimizer->optimize_func = salus::tf::Optimize;
  params->optimizer->destroy_func = salus::tf::DeleteOptimizer;
  TF_SetStatus(status, TF_OK, "");
}
