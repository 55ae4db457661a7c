#include "exec/executable.h"

#include <chrono>
#include <cstring>

#include "exec/kernel_registry.h"
#include "exec/memory_planner.h"
#include "exec/onnx_importer.h"

namespace salus::exec {
namespace {

// Inference only: a Relu that is the single consumer of a Conv's or Gemm's output becomes
// that op's post-op (one pass over the data instead of two, and for a Conv no reorder of its
// output before the Relu). Training keeps them apart: the Relu's gradient needs its input.
void FuseRelu(Graph* graph, const std::vector<ValueId>& keep) {
  Graph& g = *graph;
  std::vector<int> consumers(g.values().size(), 0);
  for (const Node& n : g.nodes()) {
    for (ValueId in : n.inputs) {
      if (in != kNoValue) ++consumers[in];
    }
  }
  for (ValueId id : keep) consumers[id] += 2;
  for (ValueId id : g.outputs()) consumers[id] += 2;
  std::vector<bool> dead(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    Node& relu = g.nodes()[i];
    if (relu.op != "Relu" || relu.outputs.size() != 1) continue;
    const ValueId v = relu.inputs[0];
    const int p = g.value(v).producer;
    if (p < 0 || consumers[v] != 1) continue;
    if (g.nodes()[p].op != "Conv" && g.nodes()[p].op != "Gemm") continue;
    Node& conv = g.nodes()[p];
    if (conv.Has("fused_activation")) continue;
    Attribute a;
    a.kind = Attribute::Kind::kString;
    a.s = "Relu";
    conv.attrs["fused_activation"] = a;
    conv.outputs[0] = relu.outputs[0];
    g.value(v).producer = -1;
    dead[i] = true;
  }
  std::vector<Node> live;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!dead[i]) live.push_back(std::move(g.nodes()[i]));
  }
  g.nodes() = std::move(live);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (ValueId o : g.nodes()[i].outputs) {
      if (o != kNoValue) g.value(o).producer = static_cast<int>(i);
    }
  }
}

}  // namespace

Executable::~Executable() = default;

StatusOr<std::unique_ptr<Executable>> Executable::Compile(std::string_view model,
                                                          const CompileOptions& options) {
  ImportOptions import;
  import.input_shapes = options.input_shapes;
  import.constant_inputs = options.constant_inputs;
  import.trainable_initializers = options.mode == Mode::kTraining;
  import.max_tensor_elements = options.max_tensor_elements;
  import.max_folded_bytes = options.max_folded_bytes;
  SALUS_ASSIGN_OR_RETURN(Graph graph, OnnxImporter::Import(model.data(), model.size(), import));
  std::unique_ptr<Executable> exe(new Executable());
  exe->graph_ = std::move(graph);
  SALUS_RETURN_IF_ERROR(exe->Build(options));
  return exe;
}

Status Executable::Build(const CompileOptions& options) {
  Graph& g = graph_;
  if (options.mode == Mode::kTraining) {
    ValueId loss = g.Find(options.loss);
    if (options.loss.empty() || loss == kNoValue) {
      return InvalidArgumentError("training needs a loss output; '" + options.loss +
                                  "' is not a value of the model");
    }
    const Value& lv = g.value(loss);
    if (lv.type != DataType::kFloat32 || NumElements(lv.shape) != 1) {
      return InvalidArgumentError("loss '" + options.loss + "' must be a float scalar, not " +
                                  DataTypeName(lv.type) + ShapeString(lv.shape));
    }
    SALUS_RETURN_IF_ERROR(Autodiff::Apply(&g, loss, options.optimizer));
  }
  if (options.fetches.empty()) {
    if (options.mode == Mode::kTraining) {
      fetch_ids_.push_back(g.Find(options.loss));
    } else {
      fetch_ids_ = g.outputs();
    }
  } else {
    for (const std::string& name : options.fetches) {
      ValueId id = g.Find(name);
      if (id == kNoValue) return InvalidArgumentError("fetch '" + name + "' is not a value");
      fetch_ids_.push_back(id);
    }
  }
  input_ids_ = g.inputs();
  profile_ = options.profile;
  if (options.mode == Mode::kInference) FuseRelu(&g, fetch_ids_);

  // Keep the nodes that feed a fetch or update persistent state.
  const int num_nodes = static_cast<int>(g.nodes().size());
  std::vector<bool> needed(g.values().size(), false), live(num_nodes, false);
  for (ValueId id : fetch_ids_) needed[id] = true;
  for (int i = num_nodes - 1; i >= 0; --i) {
    const Node& n = g.nodes()[i];
    bool keep = n.outputs.empty();
    for (ValueId o : n.outputs) keep = keep || (o != kNoValue && needed[o]);
    if (!keep) continue;
    live[i] = true;
    for (ValueId in : n.inputs) {
      if (in != kNoValue) needed[in] = true;
    }
  }

  // Kernels, in order.
  std::vector<int> step_node;
  for (int i = 0; i < num_nodes; ++i) {
    if (!live[i]) continue;
    Step step;
    SALUS_ASSIGN_OR_RETURN(step.kernel,
                           KernelRegistry::Global().Create(g.nodes()[i], g, options.device));
    step.op = g.nodes()[i].op;
    steps_.push_back(std::move(step));
    step_node.push_back(i);
  }
  const int num_steps = static_cast<int>(steps_.size());

  // Persistent layout.
  locations_.assign(g.values().size(), Location{});
  std::vector<ValueId> persistent;
  std::vector<uint64_t> sizes, offsets;
  for (ValueId id = 0; id < static_cast<ValueId>(g.values().size()); ++id) {
    if (g.value(id).persistent() && (needed[id] || g.value(id).kind != ValueKind::kConstant)) {
      persistent.push_back(id);
      sizes.push_back(g.value(id).bytes());
    }
  }
  persistent_bytes_ = MemoryPlanner::Sequential(sizes, &offsets);
  for (size_t i = 0; i < persistent.size(); ++i) {
    locations_[persistent[i]] = {Location::Base::kPersistent, offsets[i]};
  }

  // Lane buffers and their lifetimes.
  std::vector<PlannedBuffer> buffers;
  std::vector<ValueId> buffer_value;  // kNoValue for scratch
  std::vector<int> buffer_step;
  std::vector<int> first(g.values().size(), -2), last(g.values().size(), -2);
  for (ValueId id : input_ids_) first[id] = last[id] = -1;
  for (int s = 0; s < num_steps; ++s) {
    const Node& n = g.nodes()[step_node[s]];
    for (ValueId in : n.inputs) {
      if (in != kNoValue && !g.value(in).persistent()) last[in] = s;
    }
    for (ValueId o : n.outputs) {
      if (o != kNoValue) first[o] = last[o] = s;
    }
  }
  for (ValueId id : fetch_ids_) {
    if (!g.value(id).persistent()) last[id] = num_steps;
  }
  for (ValueId id = 0; id < static_cast<ValueId>(g.values().size()); ++id) {
    if (first[id] == -2 || g.value(id).persistent()) continue;
    buffers.push_back({g.value(id).bytes(), first[id], last[id]});
    buffer_value.push_back(id);
    buffer_step.push_back(-1);
  }
  for (int s = 0; s < num_steps; ++s) {
    const size_t scratch = steps_[s].kernel->scratch_bytes();
    if (scratch == 0) continue;
    buffers.push_back({scratch, s, s});
    buffer_value.push_back(kNoValue);
    buffer_step.push_back(s);
  }
  MemoryPlan plan = MemoryPlanner::Plan(buffers);
  ephemeral_bytes_ = plan.peak;
  for (size_t b = 0; b < buffers.size(); ++b) {
    Location l{Location::Base::kLane, plan.offsets[b]};
    if (buffer_value[b] != kNoValue) {
      locations_[buffer_value[b]] = l;
    } else {
      steps_[buffer_step[b]].scratch = l;
    }
  }
  for (int s = 0; s < num_steps; ++s) {
    const Node& n = g.nodes()[step_node[s]];
    Step& step = steps_[s];
    for (ValueId in : n.inputs) step.inputs.push_back(in == kNoValue ? Location{} : locations_[in]);
    for (ValueId o : n.outputs) step.outputs.push_back(o == kNoValue ? Location{} : locations_[o]);
    step.args.inputs.resize(step.inputs.size());
    step.args.outputs.resize(step.outputs.size());
  }
  auto info = [&](ValueId id) {
    const Value& v = g.value(id);
    return TensorInfo{v.name, v.type, v.shape, v.bytes()};
  };
  for (ValueId id : input_ids_) input_info_.push_back(info(id));
  for (ValueId id : fetch_ids_) fetch_info_.push_back(info(id));
  return OkStatus();
}

void* Executable::Resolve(const Location& l, std::byte* persistent, std::byte* lane) const {
  switch (l.base) {
    case Location::Base::kPersistent:
      return persistent + l.offset;
    case Location::Base::kLane:
      return lane + l.offset;
    case Location::Base::kNone:
      break;
  }
  return nullptr;
}

void Executable::InitializePersistent(std::byte* persistent) const {
  for (ValueId id = 0; id < static_cast<ValueId>(graph_.values().size()); ++id) {
    const Location& l = locations_[id];
    if (l.base != Location::Base::kPersistent) continue;
    const Value& v = graph_.value(id);
    if (v.data.bytes.size() == v.bytes()) {
      if (!v.data.bytes.empty()) std::memcpy(persistent + l.offset, v.data.bytes.data(), v.bytes());
    } else {
      std::memset(persistent + l.offset, 0, v.bytes());
    }
  }
}

Status Executable::Run(std::byte* persistent, std::byte* lane, std::span<const void* const> feeds,
                       std::span<void* const> fetches) {
  if (feeds.size() != input_ids_.size() || fetches.size() != fetch_ids_.size()) {
    return InvalidArgumentError("Run expects " + std::to_string(input_ids_.size()) + " feeds and " +
                                std::to_string(fetch_ids_.size()) + " fetches");
  }
  for (size_t i = 0; i < feeds.size(); ++i) {
    void* dst = Resolve(locations_[input_ids_[i]], persistent, lane);
    if (dst && input_info_[i].bytes) std::memcpy(dst, feeds[i], input_info_[i].bytes);
  }
  for (size_t s = 0; s < steps_.size(); ++s) {
    Step& step = steps_[s];
    for (size_t i = 0; i < step.inputs.size(); ++i) {
      step.args.inputs[i] = Resolve(step.inputs[i], persistent, lane);
    }
    for (size_t i = 0; i < step.outputs.size(); ++i) {
      step.args.outputs[i] = Resolve(step.outputs[i], persistent, lane);
    }
    step.args.scratch = Resolve(step.scratch, persistent, lane);
    const auto start =
        profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    Status st = step.kernel->Run(step.args);
    if (profile_) {
      step.seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (!st.ok()) return st.WithContext("step " + std::to_string(s));
  }
  for (size_t i = 0; i < fetches.size(); ++i) {
    const void* src = Resolve(locations_[fetch_ids_[i]], persistent, lane);
    if (src && fetch_info_[i].bytes) std::memcpy(fetches[i], src, fetch_info_[i].bytes);
  }
  return OkStatus();
}

StatusOr<HostTensor> Executable::ReadPersistent(const std::byte* persistent,
                                                const std::string& name) const {
  ValueId id = graph_.Find(name);
  if (id == kNoValue || locations_[id].base != Location::Base::kPersistent) {
    return NotFoundError("'" + name + "' is not a persistent value");
  }
  const Value& v = graph_.value(id);
  HostTensor t(v.type, v.shape);
  if (!t.bytes.empty())
    std::memcpy(t.bytes.data(), persistent + locations_[id].offset, t.bytes.size());
  return t;
}

}  // namespace salus::exec

namespace salus::exec {

Status Executable::WritePersistent(std::byte* persistent, const std::string& name,
                                   const HostTensor& value) const {
  ValueId id = graph_.Find(name);
  if (id == kNoValue || locations_[id].base != Location::Base::kPersistent) {
    return NotFoundError("'" + name + "' is not a persistent value");
  }
  const Value& v = graph_.value(id);
  if (value.type != v.type || value.shape != v.shape) {
    return InvalidArgumentError("'" + name + "' is " + DataTypeName(v.type) + ShapeString(v.shape) +
                                ", not " + DataTypeName(value.type) + ShapeString(value.shape));
  }
  if (!value.bytes.empty()) {
    std::memcpy(persistent + locations_[id].offset, value.bytes.data(), value.bytes.size());
  }
  return OkStatus();
}

}  // namespace salus::exec

namespace salus::exec {

std::map<std::string, double> Executable::Profile() const {
  std::map<std::string, double> out;
  for (const Step& s : steps_) out[s.op] += s.seconds;
  return out;
}

}  // namespace salus::exec
