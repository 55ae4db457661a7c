// The plugin's kernels on SALUS: the captured step (SalusIteration), one eager op at a time,
// and the variable ops that keep the host mirror of a variable coherent with the daemon's copy.
#include "tensorflow/c/kernels.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "common/endpoints.h"
#include "plugin.h"
#include "tensorflow/c/ops.h"
#include "tensorflow/c/tf_status.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace salus::tf {

using tensorflow::DataType;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;

const std::vector<std::string>& CapturableOps() {
  static const std::vector<std::string> ops = {
#define SALUS_TF_OP(name) #name,
#include "exec/tf_ops.inc"
#undef SALUS_TF_OP
  };
  return ops;
}

bool IsCapturable(const std::string& op) {
  static const std::set<std::string> set(CapturableOps().begin(), CapturableOps().end());
  return set.count(op) > 0;
}

namespace {

// The daemon: Note [Default endpoint] in src/common/endpoints.h (compiled into the plugin).
std::string DefaultEndpoint() { return salus::ClientEndpoint(); }

// Note [Two protobufs]
// TensorFlow's libraries export their own protobuf runtime, and Python loads them with
// RTLD_GLOBAL, so a library linked against Debian's protobuf would have its protobuf calls
// bound to TensorFlow's copy, of another version (it crashes on the first message). The client
// therefore lives in libsalus_tf_wire.so, opened with RTLD_DEEPBIND: its own dependencies are
// searched before the global scope. The plugin talks to it through wire.h only.
std::string WireLibraryPath() {
  if (const char* p = std::getenv("SALUS_TF_WIRE_LIBRARY"); p != nullptr && *p != '\0') return p;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&DefaultEndpoint), &info) == 0 || info.dli_fname == nullptr) {
    return "libsalus_tf_wire.so";
  }
  // <site-packages>/tensorflow-plugins/libsalus_tensorflow.so
  // <site-packages>/salus_tensorflow/lib/libsalus_tf_wire.so
  std::filesystem::path self(info.dli_fname);
  return (self.parent_path().parent_path() / "salus_tensorflow" / "lib" / "libsalus_tf_wire.so")
      .string();
}

std::mutex daemon_mu;
WireClient* daemon_client = nullptr;

}  // namespace

WireClient* Daemon(WireError* error) {
  std::lock_guard<std::mutex> l(daemon_mu);
  if (daemon_client != nullptr) return daemon_client;
  const std::string path = WireLibraryPath();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (lib == nullptr) {
    error->code = TF_FAILED_PRECONDITION;
    error->message = "SALUS: cannot load " + path + ": " + dlerror();
    return nullptr;
  }
  auto connect = reinterpret_cast<SalusTfWireConnectFn>(dlsym(lib, "SalusTfWireConnect"));
  if (connect == nullptr) {
    error->code = TF_FAILED_PRECONDITION;
    error->message = "SALUS: " + path + " lacks SalusTfWireConnect";
    return nullptr;
  }
  const std::string endpoint = DefaultEndpoint();
  WireClient* c = connect(endpoint.c_str(), "tensorflow", error);
  if (c == nullptr) {
    error->message = "SALUS: cannot reach salus-server at " + endpoint + ": " + error->message;
    return nullptr;
  }
  daemon_client = c;
  return c;
}

namespace {

constexpr int64_t kMaxEmbeddedElements = 64;

bool Embeddable(const Tensor& t) {
  return (t.dtype() == tensorflow::DT_INT32 || t.dtype() == tensorflow::DT_INT64) &&
         t.NumElements() <= kMaxEmbeddedElements;
}

std::vector<int64_t> IntegerValues(const Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.NumElements(); ++i) {
    v.push_back(t.dtype() == tensorflow::DT_INT32 ? t.flat<int32_t>()(i) : t.flat<int64_t>()(i));
  }
  return v;
}

absl::Status ToStatus(const WireError& e) {
  return absl::Status(static_cast<absl::StatusCode>(e.code == 0 ? TF_UNKNOWN : e.code), e.message);
}

// The wire type a TensorFlow dtype travels as: int32 travels widened to int64 (the engine
// computes indices, shapes and counters in int64).
absl::StatusOr<WireType> WireTypeOf(DataType t) {
  switch (t) {
    case tensorflow::DT_FLOAT:
      return WireType::kFloat32;
    case tensorflow::DT_INT64:
    case tensorflow::DT_INT32:
    case tensorflow::DT_UINT64:  // a random op's key and counter: the bits, as int64
      return WireType::kInt64;
    case tensorflow::DT_BOOL:
      return WireType::kBool;
    default:
      return absl::UnimplementedError("SALUS: element type " + tensorflow::DataTypeString(t) +
                                      " is not supported (float32, int32, int64 and bool are)");
  }
}

std::vector<int64_t> Dims(const TensorShape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.dims(); ++i) d.push_back(s.dim_size(i));
  return d;
}

// A tensor as a wire feed; int32 is widened into *widened, which must outlive the feed.
absl::StatusOr<WireFeed> ToFeed(const std::string& name, const Tensor& t,
                                std::vector<int64_t>* widened) {
  WireFeed f;
  f.name = name;
  auto type = WireTypeOf(t.dtype());
  if (!type.ok()) return type.status();
  f.type = *type;
  f.shape = Dims(t.shape());
  if (t.dtype() == tensorflow::DT_INT32) {
    const int32_t* p = t.flat<int32_t>().data();
    widened->assign(p, p + t.NumElements());
    f.data = widened->data();
    f.bytes = widened->size() * sizeof(int64_t);
  } else {
    f.data = t.tensor_data().data();
    f.bytes = t.tensor_data().size();
  }
  return f;
}

// Copies a wire result into a tensor of TensorFlow type `type` and matching shape, narrowing
// int64 to int32 where TensorFlow wants int32.
absl::Status FromResult(const WireResult& r, DataType type, Tensor* t) {
  const int64_t n = t->NumElements();
  if (type == tensorflow::DT_INT32) {
    if (r.data.size() != static_cast<size_t>(n) * sizeof(int64_t)) {
      return absl::InternalError("SALUS: '" + r.name + "' came back with the wrong size");
    }
    const auto* src = reinterpret_cast<const int64_t*>(r.data.data());
    int32_t* dst = t->flat<int32_t>().data();
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<int32_t>(src[i]);
    return absl::OkStatus();
  }
  auto dst = t->tensor_data();
  if (r.data.size() != dst.size()) {
    return absl::InternalError("SALUS: '" + r.name + "' came back with " +
                               std::to_string(r.data.size()) + " bytes, not " +
                               std::to_string(dst.size()));
  }
  if (!r.data.empty()) std::memcpy(const_cast<char*>(dst.data()), r.data.data(), r.data.size());
  return absl::OkStatus();
}

}  // namespace

// Note [Variable residence]
// A variable's newest value is in one of several places: the host mirror (the Var's tensor,
// which TensorFlow's own kernels read and write) or the persistent memory of a daemon session
// that ran a captured step writing it. Each variable has a version; every copy records the
// version it holds. A step whose session lacks the newest version gets it as a state write in
// the same RunIteration (pulled to the host first if the host is stale too); a step that writes
// the variable makes its session the only holder of the new version. Anything that touches the
// host tensor (reading weights, saving, an eager assignment, another session) first pulls it
// back with a state-only iteration. In a training loop the variables therefore stay in the
// daemon, and nothing but feeds and fetches crosses the socket per step.
struct GraphRunner::Compiled {
  std::vector<std::vector<int64_t>> signature;
  std::vector<bool> embedded;        // per feed: a constant of the graph, not fed
  std::vector<std::string> fetches;  // the graph's fetches, then init_fetches
  // Variables not yet initialised when the session was made (Note [First assignment]): the
  // value the graph assigns to each is fetched instead, and becomes the host value.
  std::vector<std::pair<int, std::string>> init_fetches;  // (variable index, fetch)
  std::vector<size_t> init_index;                         // each one's place in `fetches`
  std::unique_ptr<WireSession> session;
  GraphRunner* owner = nullptr;
  std::string dump_stem;  // SALUS_TF_DUMP_DIR: where its first iteration's values go
};

namespace {

struct Residence {
  uint64_t version = 1;
  uint64_t host_version = 1;
  std::map<const GraphRunner::Compiled*, uint64_t> held;  // daemon copies and their versions
  const GraphRunner::Compiled* newest = nullptr;          // holds `version` when the host does not
  std::string newest_name;                                // the variable's name in that session
  Var* ref = nullptr;  // the table's reference: an entry's Var is never freed and reused
};

std::mutex residence_mu;
std::map<Var*, Residence>& Table() {
  static auto* table = new std::map<Var*, Residence>();
  return *table;
}

// Drops the entries of variables TensorFlow has dropped (only the table's reference is left).
// Needs residence_mu.
void Sweep() {
  auto& table = Table();
  for (auto it = table.begin(); it != table.end();) {
    if (it->second.ref->RefCountIsOne()) {
      it->second.ref->Unref();
      it = table.erase(it);
    } else {
      ++it;
    }
  }
}

// The entry of `var`, made on first use. The table holds a reference to each variable it
// tracks, so no other variable can take a tracked one's address. Needs residence_mu.
Residence& Entry(Var* var) {
  auto [it, fresh] = Table().try_emplace(var);
  if (fresh) {
    var->Ref();
    it->second.ref = var;
  }
  return it->second;
}

// Brings the newest values of `vars` (each with its entry) into their host tensors: one
// state-only iteration per session holding some of them, not one per variable (a model's
// hundreds of weights and optimizer slots, moved when a job switches between its sessions).
// Needs residence_mu.
absl::Status PullManyLocked(const std::vector<std::pair<Var*, Residence*>>& vars) {
  std::map<const GraphRunner::Compiled*, std::vector<std::pair<Var*, Residence*>>> by_session;
  for (const auto& [var, r] : vars) {
    if (r->host_version == r->version || r->newest == nullptr) continue;
    auto& group = by_session[r->newest];
    bool listed = false;  // a variable a step reads twice is pulled once
    for (const auto& [v, entry] : group) listed = listed || v == var;
    if (!listed) group.emplace_back(var, r);
  }
  for (const auto& [session, group] : by_session) {
    std::vector<std::string> names;
    for (const auto& [var, r] : group) names.push_back(r->newest_name);
    std::vector<WireResult> results;
    WireError err;
    if (!session->session->Run({}, names, /*state_only=*/true, &results, &err)) {
      return ToStatus(err);
    }
    if (results.size() != group.size()) {
      return absl::InternalError("SALUS: a state read returned " + std::to_string(results.size()) +
                                 " values for " + std::to_string(group.size()) + " variables");
    }
    for (size_t k = 0; k < group.size(); ++k) {
      auto [var, r] = group[k];
      tensorflow::mutex_lock vl(*var->mu());
      Tensor* t = var->tensor();
      if (!t->RefCountIsOne()) {
        // Someone still holds the old value (a read's snapshot): write into a fresh buffer.
        Tensor fresh(t->dtype(), t->shape());
        *t = fresh;
      }
      absl::Status s = FromResult(results[k], t->dtype(), t);
      if (!s.ok()) return s;
      r->host_version = r->version;
    }
  }
  return absl::OkStatus();
}

// Brings the newest value of `var` into its host tensor. Needs residence_mu.
absl::Status PullLocked(Var* var, Residence& r) { return PullManyLocked({{var, &r}}); }

}  // namespace

absl::Status PullToHost(Var* var) {
  std::lock_guard<std::mutex> l(residence_mu);
  auto it = Table().find(var);
  if (it == Table().end()) return absl::OkStatus();
  return PullLocked(var, it->second);
}

void MarkHostWritten(Var* var) {
  std::lock_guard<std::mutex> l(residence_mu);
  auto it = Table().find(var);
  if (it == Table().end()) return;
  Residence& r = it->second;
  r.version++;
  r.host_version = r.version;
  r.newest = nullptr;
}

namespace {

// Every live runner, for eviction.
std::mutex runners_mu;
std::set<GraphRunner*>& Runners() {
  static auto* runners = new std::set<GraphRunner*>();
  return *runners;
}

}  // namespace

GraphRunner::GraphRunner(GraphSpec spec) : spec_(std::move(spec)) {
  std::lock_guard<std::mutex> l(runners_mu);
  Runners().insert(this);
}

GraphRunner::~GraphRunner() {
  {
    std::lock_guard<std::mutex> l(runners_mu);
    Runners().erase(this);
  }
  std::lock_guard<std::mutex> l(mu_);
  EvictLocked();
}

void GraphRunner::EvictLocked() {
  // Variables whose newest value only these sessions hold come home first.
  {
    std::lock_guard<std::mutex> l(residence_mu);
    for (auto& [var, r] : Table()) {
      for (const auto& c : compiled_) {
        if (r.newest == c.get()) {
          absl::Status s = PullLocked(var, r);
          if (!s.ok()) LOG(ERROR) << "SALUS: a variable's newest value is lost: " << s;
          r.newest = nullptr;
        }
        r.held.erase(c.get());
      }
    }
  }
  compiled_.clear();  // closes the daemon sessions
}

// SALUS_TF_DUMP_DIR=DIR writes each session's graph as DIR/<n>.pb with the salus-exec-bench
// arguments that time it in DIR/<n>.args, to profile a captured step outside the daemon; the
// stem DIR/<n>, or "" when not dumping.
std::string DumpForBench(const WireSessionSpec& spec) {
  const char* dir = std::getenv("SALUS_TF_DUMP_DIR");
  if (dir == nullptr || *dir == '\0') return "";
  static std::atomic<int> serial{0};
  const std::string stem = std::string(dir) + "/" + std::to_string(serial++);
  std::ofstream(stem + ".pb", std::ios::binary) << spec.graph_def;
  std::ofstream args(stem + ".args");
  args << "# " << spec.name << "\n--tf-graph --model " << stem << ".pb";
  for (const auto& [name, dims] : spec.inputs) {
    args << " --input " << name << "=";
    for (size_t i = 0; i < dims.size(); ++i) args << (i ? "," : "") << dims[i];
  }
  if (!spec.outputs.empty()) args << " --fetch " << spec.outputs[0];
  args << "\n";
  // The session's spec, for a client that replays it (benchmarks/tensorflow/gpu_steps.py).
  std::ofstream json(stem + ".spec.json");
  json << "{\"name\": \"" << spec.name << "\", \"inputs\": {";
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    json << (k ? ", " : "") << "\"" << spec.inputs[k].first << "\": [";
    const std::vector<int64_t>& dims = spec.inputs[k].second;
    for (size_t i = 0; i < dims.size(); ++i) json << (i ? ", " : "") << dims[i];
    json << "]";
  }
  json << "}, \"outputs\": [";
  for (size_t k = 0; k < spec.outputs.size(); ++k) {
    json << (k ? ", " : "") << "\"" << spec.outputs[k] << "\"";
  }
  json << "]}\n";
  return stem;
}

// With SALUS_TF_DUMP_VALUES=1 besides, a session's first iteration is written too, to replay
// the step elsewhere (benchmarks/tensorflow/gpu_steps.py): DIR/<n>.bin holds the bytes of its
// feeds, state writes (every variable the step reads: a session's first iteration sends them
// all) and fetched results, and DIR/<n>.json says which is which.
void DumpValues(const std::string& stem, const std::vector<std::string>& fetch_names,
                const std::set<std::string>& var_names, const std::vector<WireFeed>& sent,
                const std::vector<WireResult>& results) {
  const char* values = std::getenv("SALUS_TF_DUMP_VALUES");
  if (stem.empty() || values == nullptr || std::string(values) != "1") return;
  std::ofstream bin(stem + ".bin", std::ios::binary);
  std::ofstream index(stem + ".json");
  size_t offset = 0;
  bool first = true;
  auto entry = [&](const char* role, const std::string& name, WireType type,
                   const std::vector<int64_t>& shape, const void* data, size_t bytes) {
    bin.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    index << (first ? "" : ",\n") << "{\"role\": \"" << role << "\", \"name\": \"" << name
          << "\", \"type\": " << static_cast<int>(type) << ", \"shape\": [";
    for (size_t i = 0; i < shape.size(); ++i) index << (i ? ", " : "") << shape[i];
    index << "], \"offset\": " << offset << ", \"bytes\": " << bytes << "}";
    offset += bytes;
    first = false;
  };
  index << "[\n";
  for (const WireFeed& f : sent) {
    entry(var_names.count(f.name) > 0 ? "state" : "feed", f.name, f.type, f.shape, f.data, f.bytes);
  }
  for (size_t k = 0; k < results.size() && k < fetch_names.size(); ++k) {
    entry("fetch", fetch_names[k], results[k].type, results[k].shape, results[k].data.data(),
          results[k].data.size());
  }
  index << "\n]\n";
}

// Note [First assignment]
// A variable is created on the host with its dtype only; its shape comes with its first value.
// A graph that assigns a variable not yet initialised (TensorFlow's initialize_variables
// functions, a lazily built optimizer) cannot declare it to the daemon, so for that session the
// AssignVariableOp is cut out and the assigned value fetched instead; the kernel makes it the
// variable's host value. Any other use of the variable in such a graph is refused.
absl::Status GraphRunner::FetchFirstAssignment(tensorflow::GraphDef* g, int j,
                                               std::vector<std::pair<int, std::string>>* fetches) {
  const std::string& var = spec_.var_names[j];
  std::set<std::string> removed = {var};
  tensorflow::GraphDef kept;
  for (const tensorflow::NodeDef& n : g->node()) {
    if (n.name() == var) continue;
    const bool uses = std::any_of(n.input().begin(), n.input().end(),
                                  [&](const std::string& in) { return in == var; });
    if (!uses) {
      *kept.add_node() = n;
      continue;
    }
    if (n.op() != "AssignVariableOp" || n.input_size() < 2 || n.input(0) != var) {
      return absl::FailedPreconditionError("SALUS: node '" + n.name() + "' (" + n.op() +
                                           ") uses a variable before it is initialised");
    }
    std::string value = n.input(1);
    if (value.find(':') == std::string::npos) value += ":0";
    fetches->emplace_back(j, value);
    removed.insert(n.name());
  }
  for (tensorflow::NodeDef& n : *kept.mutable_node()) {
    auto* inputs = n.mutable_input();
    inputs->erase(std::remove_if(inputs->begin(), inputs->end(),
                                 [&](const std::string& in) {
                                   return !in.empty() && in[0] == '^' &&
                                          removed.count(in.substr(1)) > 0;
                                 }),
                  inputs->end());
  }
  *g->mutable_node() = kept.node();
  return absl::OkStatus();
}

GraphRunner::Compiled* GraphRunner::SessionFor(OpKernelContext* ctx,
                                               const std::vector<const Tensor*>& feeds,
                                               const std::vector<Var*>& vars) {
  std::vector<std::vector<int64_t>> sig;
  std::vector<bool> embedded(feeds.size(), false);
  for (size_t i = 0; i < feeds.size(); ++i) {
    sig.push_back(Dims(feeds[i]->shape()));
    sig.back().push_back(feeds[i]->dtype());
    if (spec_.embed_small_integers && Embeddable(*feeds[i])) {
      embedded[i] = true;
      sig.push_back(IntegerValues(*feeds[i]));
    }
  }
  for (Var* v : vars) {
    sig.push_back(Dims(v->tensor()->shape()));
    sig.back().push_back(v->is_initialized ? 1 : 0);
  }
  for (const auto& c : compiled_) {
    if (c->signature == sig) return c.get();
  }
  // A new shape signature: a session of its own, with the template's shapes filled in.
  WireSessionSpec spec;
  spec.name = spec_.name;
  tensorflow::GraphDef g = spec_.graph;
  std::map<std::string, tensorflow::NodeDef*> by_name;
  for (tensorflow::NodeDef& n : *g.mutable_node()) by_name[n.name()] = &n;
  for (size_t i = 0; i < feeds.size(); ++i) {
    tensorflow::NodeDef* n = by_name[spec_.feed_names[i]];
    if (n == nullptr) {
      ctx->SetStatus(absl::InternalError("SALUS: feed " + spec_.feed_names[i] + " is missing"));
      return nullptr;
    }
    if (embedded[i]) {
      n->set_op("Const");
      n->clear_attr();
      (*n->mutable_attr())["dtype"].set_type(feeds[i]->dtype());
      feeds[i]->AsProtoTensorContent((*n->mutable_attr())["value"].mutable_tensor());
      continue;
    }
    (*n->mutable_attr())["dtype"].set_type(feeds[i]->dtype());
    feeds[i]->shape().AsProto((*n->mutable_attr())["shape"].mutable_shape());
    spec.inputs.emplace_back(spec_.feed_names[i], Dims(feeds[i]->shape()));
  }
  std::vector<std::pair<int, std::string>> init_fetches;
  for (size_t j = 0; j < vars.size(); ++j) {
    tensorflow::NodeDef* n = by_name[spec_.var_names[j]];
    if (n == nullptr) {
      ctx->SetStatus(absl::InternalError("SALUS: variable " + spec_.var_names[j] + " is missing"));
      return nullptr;
    }
    if (!vars[j]->is_initialized) {
      absl::Status s = FetchFirstAssignment(&g, static_cast<int>(j), &init_fetches);
      if (!s.ok()) {
        ctx->SetStatus(s);
        return nullptr;
      }
      continue;
    }
    const Tensor& t = *vars[j]->tensor();
    (*n->mutable_attr())["dtype"].set_type(t.dtype());
    t.shape().AsProto((*n->mutable_attr())["shape"].mutable_shape());
  }
  g.SerializeToString(&spec.graph_def);
  spec.outputs = spec_.fetch_names;
  std::vector<size_t> init_index;  // per init fetch: its place in spec.outputs
  for (const auto& [j, name] : init_fetches) {
    auto it = std::find(spec.outputs.begin(), spec.outputs.end(), name);
    init_index.push_back(it - spec.outputs.begin());
    if (it == spec.outputs.end()) spec.outputs.push_back(name);
  }
  const std::string dump_stem = DumpForBench(spec);
  WireError err;
  WireClient* daemon = Daemon(&err);
  if (daemon == nullptr) {
    ctx->SetStatus(ToStatus(err));
    return nullptr;
  }
  std::unique_ptr<WireSession> session = daemon->CreateSession(spec, &err);
  if (session == nullptr) {
    ctx->SetStatus(ToStatus(err));
    return nullptr;
  }
  // Note [A job never waits on itself]
  // A job has several sessions (a step per shape signature, evaluate, predict, eager ops), one
  // job to the daemon (wire.cc), which admits them as one: under FIFO a new one never waits
  // behind the job's own. It may still wait for memory the job's own idle sessions hold (each
  // holds its variables and a lane), and those never close by themselves: so when the daemon
  // queues a new session, the job closes its other sessions, their variables pulled home
  // first; they are made again when next needed. Whatever else the session waits for is
  // another job, as the policy intends.
  if (!session->admitted()) {
    std::lock_guard<std::mutex> l(runners_mu);
    for (GraphRunner* other : Runners()) {
      if (other == this || !other->mu_.try_lock()) continue;
      other->EvictLocked();
      other->mu_.unlock();
    }
    EvictLocked();
  }
  auto c = std::make_unique<Compiled>();
  c->signature = std::move(sig);
  c->embedded = std::move(embedded);
  c->fetches = spec.outputs;
  c->init_fetches = std::move(init_fetches);
  c->init_index = std::move(init_index);
  c->session = std::move(session);
  c->owner = this;
  c->dump_stem = dump_stem;
  compiled_.push_back(std::move(c));
  return compiled_.back().get();
}

void GraphRunner::Compute(OpKernelContext* ctx) {
  if (!spec_.error.empty()) {
    ctx->SetStatus(absl::UnimplementedError(spec_.error));
    return;
  }
  const int num_feeds = static_cast<int>(spec_.feed_names.size());
  const int num_vars = static_cast<int>(spec_.var_names.size());
  if (ctx->num_inputs() != num_feeds + num_vars) {
    ctx->SetStatus(absl::InternalError("SALUS: input count does not match the captured graph"));
    return;
  }
  std::vector<const Tensor*> feeds;
  for (int i = 0; i < num_feeds; ++i) feeds.push_back(&ctx->input(i));
  std::vector<tensorflow::core::RefCountPtr<Var>> var_refs(num_vars);
  std::vector<Var*> vars;
  for (int j = 0; j < num_vars; ++j) {
    absl::Status s = tensorflow::LookupResource(
        ctx, tensorflow::HandleFromInput(ctx, num_feeds + j), &var_refs[j]);
    if (!s.ok()) {
      ctx->SetStatus(s);
      return;
    }
    vars.push_back(var_refs[j].get());
  }

  std::lock_guard<std::mutex> runner_lock(mu_);
  Compiled* c = SessionFor(ctx, feeds, vars);
  if (c == nullptr) return;

  std::vector<WireFeed> wire;
  std::vector<std::vector<int64_t>> widened(num_feeds + num_vars);
  for (int i = 0; i < num_feeds; ++i) {
    if (c->embedded[i]) continue;
    auto f = ToFeed(spec_.feed_names[i], *feeds[i], &widened[i]);
    if (!f.ok()) {
      ctx->SetStatus(f.status());
      return;
    }
    wire.push_back(*std::move(f));
  }
  std::lock_guard<std::mutex> residence_lock(residence_mu);
  Sweep();
  std::vector<Tensor> snapshots(num_vars);  // host values sent as state writes
  std::vector<uint64_t> sent(num_vars, 0);
  std::vector<bool> first(num_vars, false);
  for (const auto& [j, name] : c->init_fetches) first[j] = true;
  // The variables this session lacks the newest value of come to the host first, together.
  std::vector<std::pair<Var*, Residence*>> stale;
  for (int j = 0; j < num_vars; ++j) {
    if (first[j]) continue;
    Residence& r = Entry(vars[j]);
    auto held = r.held.find(c);
    if (held == r.held.end() || held->second != r.version) stale.emplace_back(vars[j], &r);
  }
  if (absl::Status s = PullManyLocked(stale); !s.ok()) {
    ctx->SetStatus(s);
    return;
  }
  for (int j = 0; j < num_vars; ++j) {
    if (first[j]) continue;
    Residence& r = Entry(vars[j]);
    auto held = r.held.find(c);
    if (held != r.held.end() && held->second == r.version) continue;
    {
      tensorflow::tf_shared_lock vl(*vars[j]->mu());
      snapshots[j] = *vars[j]->tensor();
    }
    auto f = ToFeed(spec_.var_names[j], snapshots[j], &widened[num_feeds + j]);
    if (!f.ok()) {
      ctx->SetStatus(f.status());
      return;
    }
    wire.push_back(*std::move(f));
    sent[j] = r.version;
  }
  std::vector<WireResult> results;
  WireError err;
  if (!c->session->Run(wire, c->fetches, /*state_only=*/false, &results, &err)) {
    ctx->SetStatus(ToStatus(err));
    return;
  }
  if (!c->dump_stem.empty()) {
    DumpValues(c->dump_stem, c->fetches,
               std::set<std::string>(spec_.var_names.begin(), spec_.var_names.end()), wire,
               results);
    c->dump_stem.clear();  // the first iteration only
  }
  for (size_t k = 0; k < c->init_fetches.size(); ++k) {
    const int j = c->init_fetches[k].first;
    const WireResult& r = results[c->init_index[k]];
    TensorShape shape;
    absl::Status s = TensorShape::BuildTensorShape(r.shape, &shape);
    if (!s.ok()) {
      ctx->SetStatus(s);
      return;
    }
    tensorflow::mutex_lock vl(*vars[j]->mu());
    Tensor value(vars[j]->tensor()->dtype(), shape);
    s = FromResult(r, value.dtype(), &value);
    if (!s.ok()) {
      ctx->SetStatus(s);
      return;
    }
    *vars[j]->tensor() = value;
    vars[j]->is_initialized = true;
  }
  for (int j = 0; j < num_vars; ++j) {
    Residence& r = Entry(vars[j]);
    if (first[j]) {
      r.version++;
      r.host_version = r.version;
      continue;
    }
    if (sent[j] != 0) r.held[c] = sent[j];
    if (!spec_.assigned[j]) continue;
    r.version++;
    r.held[c] = r.version;
    r.newest = c;
    r.newest_name = spec_.var_names[j];
  }
  for (size_t k = 0; k < spec_.fetch_names.size(); ++k) {
    TensorShape shape;
    absl::Status s = TensorShape::BuildTensorShape(results[k].shape, &shape);
    Tensor* out = nullptr;
    if (s.ok()) s = ctx->allocate_output(static_cast<int>(k), shape, &out);
    if (s.ok()) s = FromResult(results[k], spec_.fetch_types[k], out);
    if (!s.ok()) {
      ctx->SetStatus(s);
      return;
    }
  }
}

namespace {

// ---- SalusIteration: a captured step ----

void* CreateIteration(TF_OpKernelConstruction* c) {
  auto* ctx = reinterpret_cast<tensorflow::OpKernelConstruction*>(c);
  GraphSpec spec;
  std::string graph;
  std::vector<int64_t> assigned;
  tensorflow::DataTypeVector tout;
  absl::Status s = ctx->GetAttr("graph", &graph);
  if (s.ok()) s = ctx->GetAttr("feed_names", &spec.feed_names);
  if (s.ok()) s = ctx->GetAttr("var_names", &spec.var_names);
  if (s.ok()) s = ctx->GetAttr("fetch_names", &spec.fetch_names);
  if (s.ok()) s = ctx->GetAttr("assigned", &assigned);
  if (s.ok()) s = ctx->GetAttr("error", &spec.error);
  if (s.ok()) s = ctx->GetAttr("Tout", &tout);
  if (s.ok() && !spec.graph.ParseFromString(graph)) {
    s = absl::InvalidArgumentError("SALUS: the captured graph does not parse");
  }
  if (!s.ok()) {
    ctx->CtxFailure(s);
    return nullptr;
  }
  spec.fetch_types.assign(tout.begin(), tout.end());
  spec.assigned.assign(spec.var_names.size(), false);
  for (int64_t j : assigned) {
    if (j >= 0 && j < static_cast<int64_t>(spec.assigned.size())) spec.assigned[j] = true;
  }
  spec.name = "tf:" + ctx->def().name();
  return new GraphRunner(std::move(spec));
}

void ComputeRunner(void* kernel, TF_OpKernelContext* ctx) {
  static_cast<GraphRunner*>(kernel)->Compute(reinterpret_cast<OpKernelContext*>(ctx));
}

void DeleteRunner(void* kernel) { delete static_cast<GraphRunner*>(kernel); }

void UnknownShapes(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  // Outputs' shapes are what the captured nodes had; the rewrite runs after shape inference.
  (void)ctx;
  TF_SetStatus(status, TF_OK, "");
}

// ---- One eager op through the daemon ----

// The op alone in a graph: Placeholders (or VarHandleOps for resources) feed it, and every
// output is fetched. Inputs must be all feeds first, then resources, as GraphRunner reads them;
// ops whose resource input comes first (ResourceGather) have their own variable kernels.
void* CreateEager(TF_OpKernelConstruction* c) {
  auto* ctx = reinterpret_cast<tensorflow::OpKernelConstruction*>(c);
  GraphSpec spec;
  spec.name = "tf-eager:" + ctx->def().op();
  tensorflow::NodeDef node = ctx->def();
  node.set_name("op");
  node.clear_device();
  node.clear_input();
  for (int i = 0; i < ctx->num_inputs(); ++i) {
    const bool resource = ctx->input_type(i) == tensorflow::DT_RESOURCE;
    if (resource && i < ctx->num_inputs() - 1 &&
        ctx->input_type(ctx->num_inputs() - 1) != tensorflow::DT_RESOURCE) {
      ctx->CtxFailure(absl::UnimplementedError("SALUS: eager " + node.op() +
                                               " with a variable first is not supported"));
      return nullptr;
    }
    tensorflow::NodeDef* in = spec.graph.add_node();
    const std::string name = (resource ? "var_" : "feed_") + std::to_string(i);
    in->set_name(name);
    in->set_op(resource ? "VarHandleOp" : "Placeholder");
    if (!resource) (*in->mutable_attr())["dtype"].set_type(ctx->input_type(i));
    (resource ? spec.var_names : spec.feed_names).push_back(name);
    node.add_input(name);
  }
  for (int k = 0; k < ctx->num_outputs(); ++k) {
    spec.fetch_names.push_back("op:" + std::to_string(k));
    spec.fetch_types.push_back(ctx->output_type(k));
  }
  spec.assigned.assign(spec.var_names.size(), false);
  spec.embed_small_integers = true;
  *spec.graph.add_node() = node;
  return new GraphRunner(std::move(spec));
}

// ---- Variables on SALUS ----

absl::Status LookupVar(OpKernelContext* ctx, tensorflow::core::RefCountPtr<Var>* var) {
  return tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), var);
}

void ComputeRead(void*, TF_OpKernelContext* c) {
  auto* ctx = reinterpret_cast<OpKernelContext*>(c);
  tensorflow::core::RefCountPtr<Var> var;
  absl::Status s = LookupVar(ctx, &var);
  if (s.ok() && !var->is_initialized) {
    s = absl::FailedPreconditionError("SALUS: variable read before it is initialised");
  }
  if (s.ok()) s = PullToHost(var.get());
  if (!s.ok()) {
    ctx->SetStatus(s);
    return;
  }
  tensorflow::tf_shared_lock l(*var->mu());
  ctx->set_output(0, *var->tensor());
}

template <typename T>
void Accumulate(Tensor* dst, const Tensor& src, bool subtract) {
  T* d = dst->flat<T>().data();
  const T* s = src.flat<T>().data();
  const int64_t n = dst->NumElements();
  for (int64_t i = 0; i < n; ++i) d[i] = subtract ? d[i] - s[i] : d[i] + s[i];
}

// mode 0: assign, 1: add, 2: subtract — on the host mirror, which then holds the newest value.
template <int kMode>
void ComputeAssign(void*, TF_OpKernelContext* c) {
  auto* ctx = reinterpret_cast<OpKernelContext*>(c);
  tensorflow::core::RefCountPtr<Var> var;
  absl::Status s = LookupVar(ctx, &var);
  if (!s.ok()) {
    ctx->SetStatus(s);
    return;
  }
  const Tensor& value = ctx->input(1);
  if (kMode != 0) {
    s = PullToHost(var.get());
    if (!s.ok()) {
      ctx->SetStatus(s);
      return;
    }
  }
  {
    tensorflow::mutex_lock l(*var->mu());
    Tensor* t = var->tensor();
    if (kMode == 0) {
      if (var->is_initialized && t->dtype() != value.dtype()) {
        ctx->SetStatus(absl::InvalidArgumentError(
            "SALUS: assigning " + tensorflow::DataTypeString(value.dtype()) + " to a variable of " +
            tensorflow::DataTypeString(t->dtype())));
        return;
      }
      Tensor copy(value.dtype(), value.shape());
      if (value.TotalBytes() > 0) {
        std::memcpy(const_cast<char*>(copy.tensor_data().data()), value.tensor_data().data(),
                    value.TotalBytes());
      }
      *t = copy;
      var->is_initialized = true;
    } else {
      if (!var->is_initialized || t->shape() != value.shape() || t->dtype() != value.dtype()) {
        ctx->SetStatus(absl::InvalidArgumentError("SALUS: updating a variable of " +
                                                  t->shape().DebugString() + " with " +
                                                  value.shape().DebugString()));
        return;
      }
      if (!t->RefCountIsOne()) {
        Tensor copy(t->dtype(), t->shape());
        std::memcpy(const_cast<char*>(copy.tensor_data().data()), t->tensor_data().data(),
                    t->TotalBytes());
        *t = copy;
      }
      switch (t->dtype()) {
        case tensorflow::DT_FLOAT:
          Accumulate<float>(t, value, kMode == 2);
          break;
        case tensorflow::DT_DOUBLE:
          Accumulate<double>(t, value, kMode == 2);
          break;
        case tensorflow::DT_INT32:
          Accumulate<int32_t>(t, value, kMode == 2);
          break;
        case tensorflow::DT_INT64:
          Accumulate<int64_t>(t, value, kMode == 2);
          break;
        default:
          ctx->SetStatus(absl::UnimplementedError("SALUS: updating a variable of " +
                                                  tensorflow::DataTypeString(t->dtype())));
          return;
      }
    }
  }
  MarkHostWritten(var.get());
}

// ResourceGather(resource, indices) on the host mirror.
void ComputeGather(void*, TF_OpKernelContext* c) {
  auto* ctx = reinterpret_cast<OpKernelContext*>(c);
  tensorflow::core::RefCountPtr<Var> var;
  absl::Status s = LookupVar(ctx, &var);
  if (s.ok()) s = PullToHost(var.get());
  if (!s.ok()) {
    ctx->SetStatus(s);
    return;
  }
  int32_t batch_dims = 0;
  if (!GetNodeAttr(ctx->op_kernel().def(), "batch_dims", &batch_dims).ok()) batch_dims = 0;
  tensorflow::tf_shared_lock l(*var->mu());
  const Tensor& params = *var->tensor();
  const Tensor& indices = ctx->input(1);
  if (batch_dims != 0 || params.dims() < 1) {
    ctx->SetStatus(absl::UnimplementedError("SALUS: eager ResourceGather with batch_dims"));
    return;
  }
  TensorShape shape = indices.shape();
  for (int d = 1; d < params.dims(); ++d) shape.AddDim(params.dim_size(d));
  Tensor* out = nullptr;
  s = ctx->allocate_output(0, shape, &out);
  if (!s.ok()) {
    ctx->SetStatus(s);
    return;
  }
  const int64_t rows = params.dim_size(0);
  const size_t row_bytes = params.TotalBytes() / std::max<int64_t>(rows, 1);
  const char* src = params.tensor_data().data();
  char* dst = const_cast<char*>(out->tensor_data().data());
  for (int64_t i = 0; i < indices.NumElements(); ++i) {
    const int64_t k = indices.dtype() == tensorflow::DT_INT32 ? indices.flat<int32_t>()(i)
                                                              : indices.flat<int64_t>()(i);
    if (k < 0 || k >= rows) {
      ctx->SetStatus(absl::InvalidArgumentError("SALUS: ResourceGather index " + std::to_string(k) +
                                                " is out of range"));
      return;
    }
    std::memcpy(dst + i * row_bytes, src + k * row_bytes, row_bytes);
  }
}

void Check(TF_Status* status, const std::string& what) {
  if (TF_GetCode(status) != TF_OK) {
    LOG(ERROR) << "SALUS: registering " << what << ": " << TF_Message(status);
  }
}

void RegisterIterationOp() {
  TF_Status* status = TF_NewStatus();
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder(kIterationOp);
  TF_OpDefinitionBuilderAddInput(b, "feeds: Tin");
  TF_OpDefinitionBuilderAddInput(b, "vars: nvars * resource");
  TF_OpDefinitionBuilderAddOutput(b, "fetches: Tout");
  TF_OpDefinitionBuilderAddAttr(b, "Tin: list(type) >= 0");
  TF_OpDefinitionBuilderAddAttr(b, "Tout: list(type) >= 0");
  TF_OpDefinitionBuilderAddAttr(b, "nvars: int >= 0");
  TF_OpDefinitionBuilderAddAttr(b, "graph: string");
  TF_OpDefinitionBuilderAddAttr(b, "feed_names: list(string) >= 0");
  TF_OpDefinitionBuilderAddAttr(b, "var_names: list(string) >= 0");
  TF_OpDefinitionBuilderAddAttr(b, "fetch_names: list(string) >= 0");
  TF_OpDefinitionBuilderAddAttr(b, "assigned: list(int) >= 0");
  TF_OpDefinitionBuilderAddAttr(b, "error: string = ''");
  TF_OpDefinitionBuilderSetIsStateful(b, true);
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, UnknownShapes);
  TF_RegisterOpDefinition(b, status);
  Check(status, kIterationOp);
  TF_KernelBuilder* k =
      TF_NewKernelBuilder(kIterationOp, kDeviceType, CreateIteration, ComputeRunner, DeleteRunner);
  TF_KernelBuilder_HostMemory(k, "vars");
  TF_RegisterKernelBuilder("SalusIterationKernel", k, status);
  Check(status, "the SalusIteration kernel");
  TF_DeleteStatus(status);
}

void RegisterVariableKernel(const char* op, void (*compute)(void*, TF_OpKernelContext*)) {
  TF_Status* status = TF_NewStatus();
  TF_KernelBuilder* k = TF_NewKernelBuilder(op, kDeviceType, nullptr, compute, nullptr);
  TF_KernelBuilder_HostMemory(k, "resource");
  TF_RegisterKernelBuilder((std::string("Salus") + op).c_str(), k, status);
  Check(status, op);
  TF_DeleteStatus(status);
}

// Resource ops have the variable kernels above; VarHandleOp, Identity, NoOp and the like keep
// TensorFlow's generic ones (they never read a tensor's bytes on SALUS).
const std::set<std::string>& VariableOps() {
  static const std::set<std::string> ops = {"ReadVariableOp", "AssignVariableOp",
                                            "AssignAddVariableOp", "AssignSubVariableOp",
                                            "ResourceGather"};
  return ops;
}
const std::set<std::string>& GenericOps() {
  static const std::set<std::string> ops = {"Identity",    "NoOp",         "IdentityN", "Const",
                                            "VarHandleOp", "StopGradient", "Snapshot"};
  return ops;
}

// Ops whose output TensorFlow types as a shape tensor.
const std::set<std::string>& ShapeOps() {
  static const std::set<std::string> ops = {"Shape", "ShapeN", "Size", "Rank"};
  return ops;
}

}  // namespace

void RegisterKernels() {
  RegisterIterationOp();
  RegisterVariableKernel("ReadVariableOp", ComputeRead);
  RegisterVariableKernel("AssignVariableOp", ComputeAssign<0>);
  RegisterVariableKernel("AssignAddVariableOp", ComputeAssign<1>);
  RegisterVariableKernel("AssignSubVariableOp", ComputeAssign<2>);
  RegisterVariableKernel("ResourceGather", ComputeGather);
  TF_Status* status = TF_NewStatus();
  for (const std::string& op : CapturableOps()) {
    if (VariableOps().count(op) > 0 || GenericOps().count(op) > 0) continue;
    if (tensorflow::OpRegistry::Global()->LookUp(op) == nullptr) continue;
    TF_KernelBuilder* k =
        TF_NewKernelBuilder(op.c_str(), kDeviceType, CreateEager, ComputeRunner, DeleteRunner);
    // TensorFlow types a shape op's int32 output as a shape tensor, which must live in host
    // memory on any device but the CPU (an eager tf.shape on SALUS fails otherwise). Ours is
    // host memory anyway (Note [Device memory] in device.cc).
    if (ShapeOps().count(op) > 0) TF_KernelBuilder_HostMemory(k, "output");
    TF_RegisterKernelBuilder(("SalusEager" + op).c_str(), k, status);
    Check(status, op);
  }
  TF_DeleteStatus(status);
}

}  // namespace salus::tf

extern "C" __attribute__((visibility("default"))) void TF_InitKernel() {
  salus::tf::RegisterKernels();
}
