#include "exec/executable.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "common/logging.h"
#include "common/thread_annotations.h"
#include "exec/alignment.h"
#include "exec/aten_importer.h"
#include "exec/cpu_threads.h"
#include "exec/dnnl_kernel.h"
#include "exec/fusion.h"
#include "exec/kernel_registry.h"
#include "exec/memory_planner.h"
#include "exec/onnx_importer.h"
#include "exec/tf_importer.h"
#include "exec/training_ops.h"

namespace salus::exec {
namespace {

// The host<->device bandwidth the swap planner assumes when CompileOptions::swap_bandwidth is
// 0: one core's memcpy between two host buffers on the CPU device (7.5-9.4 GB/s measured on
// the 2-core development machine); PCIe 3.0 x16 from pinned memory on a GPU.
constexpr double kCpuSwapBytesPerSecond = 8e9;
constexpr double kCudaSwapBytesPerSecond = 12e9;

}  // namespace

// Note [Swapping in the executable]: the lane's buffers (DescribeLane) go to the swap planner
// with each step's phase (forward, or after the forward pass) and time (EstimateStepTimes);
// it returns points, each a lane plan with some buffers split in two regions. Selecting a
// point (ApplySwapPoint) places every buffer at the point's offset, binds the steps that read
// a swapped buffer after its copy back to its second region, and turns the swaps into copies
// at step boundaries (ScheduleSwaps, Note [Swap schedule]). On the CPU a copy thread performs
// the copies in issue order beside the steps, or (SwapCopies) the iteration's own thread
// performs each at its boundary; on a GPU they go on the iteration's stream in the same order
// (so they do not overlap compute there yet), through the context's pinned staging. The
// planner is told which (SwapProblem::overlap). A step waits only for the copies the schedule
// names; Run returns after every copy is over, error or not, so the lane may move
// (docs/architecture.md, rule 3). The same kernels read the same bytes as without swapping, so
// results are bit-identical.
namespace {

// Note [Shared copy path]
// The copy path between a device's memory and host memory is one resource (one PCIe link, one
// memory bus): two copies at once only split it. So every executable of a device that copies
// beside its steps hands its copies to the device's one CopyPath, a thread shared by all the
// sessions' executables. It runs one copy at a time and serves the executables round-robin,
// one copy each in turn: concurrent sessions' swap traffic never contends for the path, and a
// session with a long burst of copies out delays another's copy back (which a step of that
// session waits for) by at most one copy per session. This is the cross-job scheduling of
// swap traffic; an executable's own copies keep their issue order.
class CopyPath {
 public:
  // The path of `runtime`'s device, made at its first user and gone with its last.
  static std::shared_ptr<CopyPath> For(DeviceRuntime* runtime) {
    static Mutex registry_mu;
    static std::map<DeviceRuntime*, std::weak_ptr<CopyPath>>* registry =
        new std::map<DeviceRuntime*, std::weak_ptr<CopyPath>>();
    MutexLock lock(&registry_mu);
    std::weak_ptr<CopyPath>& slot = (*registry)[runtime];
    std::shared_ptr<CopyPath> path = slot.lock();
    if (!path) {
      path = std::make_shared<CopyPath>(runtime);
      slot = path;
    }
    return path;
  }

  explicit CopyPath(DeviceRuntime* runtime) : runtime_(runtime), thread_([this] { Loop(); }) {}
  ~CopyPath() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    thread_.join();
  }
  CopyPath(const CopyPath&) = delete;
  CopyPath& operator=(const CopyPath&) = delete;

  // One executable's queue and counters on the path.
  struct Channel {
    struct Copy {
      bool to_host;
      void* dst;
      const void* src;
      size_t bytes;
    };
    std::deque<Copy> queue;
    uint64_t pushed = 0, done = 0;
    Status error;
  };

  void Attach(Channel* c) {
    MutexLock lock(&mu_);
    channels_.push_back(c);
  }
  void Detach(Channel* c) {
    MutexLock lock(&mu_);
    while (c->done != c->pushed) cv_.Wait(&mu_);
    channels_.erase(std::find(channels_.begin(), channels_.end(), c));
  }
  void Push(Channel* c, bool to_host, void* dst, const void* src, size_t bytes) {
    {
      MutexLock lock(&mu_);
      c->queue.push_back({to_host, dst, src, bytes});
      ++c->pushed;
    }
    cv_.NotifyAll();
  }
  // Waits until the channel's first `count` copies of the iteration are over; its first error.
  Status WaitFor(Channel* c, uint64_t count) {
    MutexLock lock(&mu_);
    while (c->done < count && c->error.ok()) cv_.Wait(&mu_);
    return c->error;
  }
  // Waits for every copy the channel queued, and starts its next iteration's count from zero.
  Status Finish(Channel* c) {
    MutexLock lock(&mu_);
    while (c->done != c->pushed) cv_.Wait(&mu_);
    Status st = c->error;
    c->done = c->pushed = 0;
    c->error = OkStatus();
    return st;
  }

 private:
  // The next channel with a queued copy after the one served last (round-robin).
  Channel* NextLocked() REQUIRES(mu_) {
    for (size_t i = 0; i < channels_.size(); ++i) {
      next_ = (next_ + 1) % channels_.size();
      if (!channels_[next_]->queue.empty()) return channels_[next_];
    }
    return nullptr;
  }

  void Loop() {
    StatusOr<DeviceContext*> ctx = runtime_->ThreadContext();
    mu_.Lock();
    while (true) {
      Channel* c = nullptr;
      while (!stop_ && (c = NextLocked()) == nullptr) cv_.Wait(&mu_);
      if (c == nullptr) break;
      const Channel::Copy copy = c->queue.front();
      c->queue.pop_front();
      mu_.Unlock();
      Status st = !ctx.ok()      ? ctx.status()
                  : copy.to_host ? runtime_->CopyToHost(*ctx, copy.dst, copy.src, copy.bytes)
                                 : runtime_->CopyToDevice(*ctx, copy.dst, copy.src, copy.bytes);
      mu_.Lock();
      if (c->error.ok() && !st.ok()) c->error = st;
      ++c->done;
      cv_.NotifyAll();
    }
    mu_.Unlock();
  }

  DeviceRuntime* const runtime_;
  Mutex mu_;
  CondVar cv_;
  std::vector<Channel*> channels_ GUARDED_BY(mu_);
  size_t next_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

// An executable's place on its device's copy path (Note [Shared copy path]).
class Executable::CopyThread {
 public:
  explicit CopyThread(DeviceRuntime* runtime) : path_(CopyPath::For(runtime)) {
    path_->Attach(&channel_);
  }
  ~CopyThread() { path_->Detach(&channel_); }
  CopyThread(const CopyThread&) = delete;
  CopyThread& operator=(const CopyThread&) = delete;

  void Push(bool to_host, void* dst, const void* src, size_t bytes) {
    path_->Push(&channel_, to_host, dst, src, bytes);
  }
  Status WaitFor(uint64_t count) { return path_->WaitFor(&channel_, count); }
  Status Finish() { return path_->Finish(&channel_); }

 private:
  std::shared_ptr<CopyPath> path_;
  CopyPath::Channel channel_;
};

Executable::~Executable() = default;

uint64_t Executable::host_bytes() const {
  return constant_bytes() + kHostBytesPerNode * graph_.nodes().size();
}

uint64_t Executable::constant_bytes() const {
  uint64_t bytes = 0;
  for (const Value& v : graph_.values()) bytes += v.data.bytes.size();
  return bytes;
}

StatusOr<std::unique_ptr<Executable>> Executable::Compile(std::string_view model,
                                                          const CompileOptions& options) {
  ImportOptions import;
  import.input_shapes = options.input_shapes;
  import.constant_inputs = options.constant_inputs;
  import.trainable_initializers = options.mode == Mode::kTraining;
  import.limits = options.limits;
  SALUS_ASSIGN_OR_RETURN(Graph graph, OnnxImporter::Import(model.data(), model.size(), import));
  std::unique_ptr<Executable> exe(new Executable());
  exe->graph_ = std::move(graph);
  SALUS_RETURN_IF_ERROR(exe->Build(options));
  return exe;
}

StatusOr<std::unique_ptr<Executable>> Executable::CompileTf(std::string_view graph_def,
                                                            const CompileOptions& options) {
  if (options.mode != Mode::kInference) {
    return InvalidArgumentError(
        "a TensorFlow graph carries its own gradients and variable updates: compile it with "
        "Mode::kInference");
  }
  if (!options.constant_inputs.empty()) {
    return InvalidArgumentError("constant_inputs are not supported for TensorFlow graphs");
  }
  TfImportOptions import;
  import.input_shapes = options.input_shapes;
  import.limits = options.limits;
  SALUS_ASSIGN_OR_RETURN(Graph graph,
                         TfImporter::Import(graph_def.data(), graph_def.size(), import));
  if (options.fuse) TfImporter::ElideSnapshots(&graph, options.fetches);
  std::unique_ptr<Executable> exe(new Executable());
  exe->graph_ = std::move(graph);
  SALUS_RETURN_IF_ERROR(exe->Build(options));
  return exe;
}

StatusOr<std::unique_ptr<Executable>> Executable::CompileAten(std::string_view graph,
                                                              const CompileOptions& options) {
  if (options.mode != Mode::kInference) {
    return InvalidArgumentError(
        "an ATen graph carries its own gradients and updates: compile it with Mode::kInference");
  }
  if (!options.constant_inputs.empty() || !options.input_shapes.empty()) {
    return InvalidArgumentError(
        "an ATen graph fixes its own input shapes; input_shapes and constant_inputs must be empty");
  }
  AtenImportOptions import;
  import.limits = options.limits;
  SALUS_ASSIGN_OR_RETURN(Graph g, AtenImporter::Import(graph.data(), graph.size(), import));
  CompileOptions o = options;
  if (o.fetches.empty()) {  // every output of the step can be fetched
    for (ValueId id : g.outputs()) o.fetches.push_back(g.value(id).name);
  }
  std::unique_ptr<Executable> exe(new Executable());
  exe->graph_ = std::move(g);
  SALUS_RETURN_IF_ERROR(exe->Build(o));
  return exe;
}

Status Executable::Build(const CompileOptions& options) {
  device_ = options.device;
  SALUS_ASSIGN_OR_RETURN(runtime_, DeviceRuntime::For(device_));
  profile_ = options.profile;
  device_graphs_ = options.device_graphs && runtime_->supports_graphs();
  max_ephemeral_bytes_ = options.max_ephemeral_bytes;
  lane_.bandwidth = options.swap_bandwidth > 0         ? options.swap_bandwidth
                    : device_.type == DeviceType::kCpu ? kCpuSwapBytesPerSecond
                                                       : kCudaSwapBytesPerSecond;
  copy_thread_ = device_.type == DeviceType::kCpu &&
                 (options.swap_copies == SwapCopies::kThread ||
                  (options.swap_copies == SwapCopies::kAuto &&
                   MaxThreads() < static_cast<int>(std::thread::hardware_concurrency())));
  lane_.overlap = copy_thread_;
  // Note [Compile budgets]: the deadline is read between the passes.
  const CompileLimits& limits = options.limits;
  SALUS_RETURN_IF_ERROR(limits.CheckDeadline("importing the model"));
  SALUS_RETURN_IF_ERROR(ApplyTraining(options));
  SALUS_RETURN_IF_ERROR(limits.CheckDeadline("deriving the backward graph"));
  SALUS_RETURN_IF_ERROR(ResolveFetches(options));
  input_ids_ = graph_.inputs();
  if (options.fuse) {
    // Before the Transposes fold: a pool or convolution feeding another reaches it through a
    // Transpose back to NHWC and one to NCHW, which AdoptChannelsLast drops for both; folded
    // first, the pair would vanish and leave the two nodes on NCHW between Transposes at the
    // ends of the chain (Note [Channels-last convolutions]).
    AdoptChannelsLast(&graph_, FusionOptions{device_.type, fetch_ids_});
    FoldTransposes(&graph_, FusionOptions{device_.type, fetch_ids_},
                   num_forward_nodes_ == SIZE_MAX ? nullptr : &num_forward_nodes_);
  }
  if (options.mode == Mode::kInference && options.fuse) {
    FuseGelu(&graph_, FusionOptions{device_.type, fetch_ids_});
    ApplyInferenceFusions(&graph_, FusionOptions{device_.type, fetch_ids_});
    FuseElementwise(&graph_, FusionOptions{device_.type, fetch_ids_});
    if (device_.type == DeviceType::kCpu) {
      KeepBlockedLayouts(&graph_, FusionOptions{device_.type, fetch_ids_}, CpuChannelBlock());
    }
  }
  if (options.fuse) AdoptChannelsLast(&graph_, FusionOptions{device_.type, fetch_ids_});
  if (options.convolution_transforms) {
    for (Node& n : graph_.nodes()) {
      if (n.op.find("Conv") != std::string::npos) n.attrs[kConvolutionTransformsAttr] = IntAttr(1);
    }
  }
  SALUS_RETURN_IF_ERROR(limits.CheckDeadline("fusing operators"));
  std::vector<bool> needed;
  const std::vector<bool> live = LiveNodes(&needed);
  SALUS_RETURN_IF_ERROR(CreateKernels(live, &step_node_));
  SALUS_RETURN_IF_ERROR(limits.CheckDeadline("creating kernels"));
  LayOutPersistent(needed);
  DescribeLane();
  EstimateStepTimes();
  DescribeTensors();
  FindFetchReadySteps();
  SALUS_RETURN_IF_ERROR(limits.CheckDeadline("planning memory"));
  swap_points_ = SwapPlanner::Plan(lane_);
  SALUS_ASSIGN_OR_RETURN(size_t point, FastestFitting(swap_points_));
  ApplySwapPoint(point);
  // A compilation that ends after its deadline is refused too: the limit bounds the time any
  // compilation holds a compile thread, whichever pass took it.
  return limits.CheckDeadline("planning swaps");
}

// Training: checks the loss, rewrites BatchNormalization and Dropout into their training forms
// (training_ops.h), then derives the backward graph and the optimizer's updates.
Status Executable::ApplyTraining(const CompileOptions& options) {
  if (options.mode != Mode::kTraining) return OkStatus();
  Graph& g = graph_;
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
  if (options.fuse) {
    FusionOptions fusion{options.device.type, {loss}};
    for (const std::string& name : options.fetches) {
      if (g.Find(name) != kNoValue) fusion.keep.push_back(g.Find(name));
    }
    FuseGelu(&g, fusion);
  }
  SALUS_RETURN_IF_ERROR(LowerTrainingOps(&g, options.seed));
  num_forward_nodes_ = g.nodes().size();
  return Autodiff::Apply(&g, loss, options.optimizer);
}

// What Run returns: the named values, or by default the graph outputs (inference) or the loss.
Status Executable::ResolveFetches(const CompileOptions& options) {
  const Graph& g = graph_;
  if (options.fetches.empty()) {
    if (options.mode == Mode::kTraining) {
      fetch_ids_.push_back(g.Find(options.loss));
    } else {
      fetch_ids_ = g.outputs();
    }
    return OkStatus();
  }
  for (const std::string& name : options.fetches) {
    ValueId id = g.Find(name);
    if (id == kNoValue) return InvalidArgumentError("fetch '" + name + "' is not a value");
    fetch_ids_.push_back(id);
    fetch_names_.push_back(name);  // an alias keeps the name it was asked by
  }
  return OkStatus();
}

// The nodes that feed a fetch or update persistent state; `needed` marks the values they read.
std::vector<bool> Executable::LiveNodes(std::vector<bool>* needed) const {
  const Graph& g = graph_;
  const int num_nodes = static_cast<int>(g.nodes().size());
  needed->assign(g.values().size(), false);
  std::vector<bool> live(num_nodes, false);
  for (ValueId id : fetch_ids_) (*needed)[id] = true;
  for (int i = num_nodes - 1; i >= 0; --i) {
    const Node& n = g.nodes()[i];
    bool keep = n.outputs.empty();
    for (ValueId o : n.outputs) keep = keep || (o != kNoValue && (*needed)[o]);
    if (!keep) continue;
    live[i] = true;
    for (ValueId in : n.inputs) {
      if (in != kNoValue) (*needed)[in] = true;
    }
  }
  return live;
}

// One kernel per live node, in order, created for the device with the compiling thread's
// context (CUDA kernels choose algorithms and size workspaces through it).
Status Executable::CreateKernels(const std::vector<bool>& live, std::vector<int>* step_node) {
  const Graph& g = graph_;
  SALUS_ASSIGN_OR_RETURN(DeviceContext * ctx, runtime_->ThreadContext());
  for (int i = 0; i < static_cast<int>(g.nodes().size()); ++i) {
    if (!live[i]) continue;
    const Node& node = g.nodes()[i];
    auto step = std::make_unique<Step>();
    if (device_.type == DeviceType::kCpu) step->threads = StepThreads(g, node, MaxThreads());
    // oneDNN partitions a primitive's work for the threads it is created with.
    std::optional<ScopedThreads> threads;
    if (step->threads > 0) threads.emplace(step->threads);
    SALUS_ASSIGN_OR_RETURN(step->kernel,
                           KernelRegistry::Global().Create(node, g, device_.type, ctx));
    step->op = node.op;
    step->node = node.Describe();
    max_arity_ = std::max({max_arity_, node.inputs.size(), node.outputs.size()});
    steps_.push_back(std::move(step));
    step_node->push_back(i);
  }
  return OkStatus();
}

// Persistent values (parameters, optimizer state, and the constants some step reads) at
// sequential aligned offsets: P.
void Executable::LayOutPersistent(const std::vector<bool>& needed) {
  const Graph& g = graph_;
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
}

// Note [Views share their buffer]
// A reshape (Reshape, Flatten, Squeeze, Unsqueeze, Identity) of a lane value gives the same
// bytes in the same order, and a lane value is written once, by the step that defines it: so
// the reshape's output shares its input's buffer, and the reshape's kernel, seeing one
// address on both sides, copies nothing. The shared buffer lives until the last read of
// either, its readers are both's (what a swap of it must bring back in time), and it is fetched
// if either is. A reshape of a persistent value (a parameter) still copies: the optimizer's
// update writes that value in place, after which a view would read the new value.
void Executable::FindViews() {
  const Graph& g = graph_;
  view_of_.assign(g.values().size(), kNoValue);
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Node& n = g.nodes()[step_node_[s]];
    if (n.op != "Reshape" && n.op != "Flatten" && n.op != "Squeeze" && n.op != "Unsqueeze" &&
        n.op != "Identity" && n.op != "SalusReshape") {
      continue;
    }
    const ValueId in = n.input(0), out = n.output(0);
    if (in == kNoValue || out == kNoValue || g.value(in).persistent() ||
        g.value(out).persistent() || g.value(in).bytes() != g.value(out).bytes()) {
      continue;
    }
    view_of_[out] = BufferOf(in);
  }
}

// Lane buffers (inputs, intermediates, each step's scratch) with their lifetimes and readers,
// and each step's phase: what the memory planner and the swap planner plan. A view is its
// buffer's (Note [Views share their buffer]).
void Executable::DescribeLane() {
  const Graph& g = graph_;
  const int num_steps = static_cast<int>(steps_.size());
  FindViews();
  std::vector<int> first(g.values().size(), -2), last(g.values().size(), -2);
  std::vector<std::vector<int>> uses(g.values().size());
  for (ValueId id : input_ids_) first[id] = last[id] = -1;
  for (int s = 0; s < num_steps; ++s) {
    const Node& n = g.nodes()[step_node_[s]];
    for (ValueId read : n.inputs) {
      if (read == kNoValue || g.value(read).persistent()) continue;
      const ValueId in = BufferOf(read);
      last[in] = s;
      if (uses[in].empty() || uses[in].back() != s) uses[in].push_back(s);
    }
    for (ValueId o : n.outputs) {
      if (o != kNoValue && view_of_[o] == kNoValue) first[o] = last[o] = s;
    }
  }
  // Training swaps (Note [Swapping in the executable]); fetched values are read after the steps.
  std::vector<bool> swappable(g.values().size(), num_forward_nodes_ != SIZE_MAX);
  for (ValueId fetched : fetch_ids_) {
    const ValueId id = BufferOf(fetched);
    if (!g.value(id).persistent()) last[id] = num_steps;
    swappable[id] = false;
  }
  for (ValueId id = 0; id < static_cast<ValueId>(g.values().size()); ++id) {
    if (first[id] == -2 || g.value(id).persistent()) continue;
    lane_.buffers.push_back(
        {{g.value(id).bytes(), first[id], last[id]}, std::move(uses[id]), swappable[id]});
    buffer_value_.push_back(id);
    buffer_step_.push_back(-1);
  }
  for (int s = 0; s < num_steps; ++s) {
    const size_t scratch = steps_[s]->kernel->scratch_bytes();
    if (scratch == 0) continue;
    lane_.buffers.push_back({{scratch, s, s}, {}, false});
    buffer_value_.push_back(kNoValue);
    buffer_step_.push_back(s);
  }
  for (int s = 0; s < num_steps; ++s) {
    lane_.backward.push_back(static_cast<size_t>(step_node_[s]) >= num_forward_nodes_);
  }
}

// Each step's time for the swap planner: its mean measured time where the executable has
// been profiled, a size-based estimate (the bytes it reads, writes and scratches) otherwise.
void Executable::EstimateStepTimes() {
  const Graph& g = graph_;
  const int64_t runs = profiled_runs_.load();
  lane_.step_seconds.assign(steps_.size(), 0.0);
  for (size_t s = 0; s < steps_.size(); ++s) {
    if (profile_ && runs > 0) {
      lane_.step_seconds[s] =
          static_cast<double>(steps_[s]->nanos.load()) * 1e-9 / static_cast<double>(runs);
      continue;
    }
    const Node& n = g.nodes()[step_node_[s]];
    uint64_t bytes = steps_[s]->kernel->scratch_bytes();
    for (ValueId in : n.inputs) bytes += in == kNoValue ? 0 : g.value(in).bytes();
    for (ValueId o : n.outputs) bytes += o == kNoValue ? 0 : g.value(o).bytes();
    lane_.step_seconds[s] = EstimateStepSeconds(bytes);
  }
}

// The tensor descriptions of inputs and fetches, and the staging a GPU run needs for them.
void Executable::DescribeTensors() {
  const Graph& g = graph_;
  auto info = [&](ValueId id) {
    const Value& v = g.value(id);
    return TensorInfo{v.name, v.type, v.shape, v.bytes()};
  };
  for (ValueId id : input_ids_) input_info_.push_back(info(id));
  for (size_t i = 0; i < fetch_ids_.size(); ++i) {
    fetch_info_.push_back(info(fetch_ids_[i]));
    if (i < fetch_names_.size()) fetch_info_.back().name = fetch_names_[i];
  }
  for (const TensorInfo& t : input_info_) feed_staging_bytes_ += AlignUp(t.bytes);
  for (const TensorInfo& t : fetch_info_) fetch_staging_bytes_ += AlignUp(t.bytes);
}

// Note [Fetches before the end]
// A training step's loss is final long before the step ends: the backward pass and the
// optimizer's updates after it read it or not, but never write it. A lane value is written
// once, by the step that defines it (Note [Views share their buffer]), and a fetched one lives
// to the end of the iteration (DescribeLane), so once the last step that makes a fetched value
// (or the buffer a fetched view shares) has run, the fetches can be copied out and the caller
// told (Run's `fetched`): the daemon then replies to the iteration, and its client goes on with
// its next step while this one's remaining steps run (RunIteration.reply_when_fetched). A
// persistent value fetched may still be updated by a later step, so it is ready only at the
// end. The copies are made early only where the host addresses the device's memory and the
// steps run in order on the calling thread (the CPU), and not while the iteration swaps (its
// copies run beside the steps); on a GPU the fetches come back with the
// iteration's last synchronisation, as before.
void Executable::FindFetchReadySteps() {
  const Graph& g = graph_;
  std::vector<size_t> made(g.values().size(), 0);  // the steps up to the one defining it
  for (size_t s = 0; s < steps_.size(); ++s) {
    for (ValueId o : g.nodes()[step_node_[s]].outputs) {
      if (o != kNoValue) made[o] = s + 1;
    }
  }
  fetch_ready_steps_ = 0;
  for (ValueId id : fetch_ids_) {
    if (g.value(id).persistent()) {
      fetch_ready_steps_ = steps_.size();
      return;
    }
    fetch_ready_steps_ = std::max({fetch_ready_steps_, made[id], made[BufferOf(id)]});
  }
}

// The fastest point whose lane fits CompileOptions::max_ephemeral_bytes (points are sorted by
// E, highest and fastest first).
StatusOr<size_t> Executable::FastestFitting(const std::vector<SwapPoint>& points) const {
  if (max_ephemeral_bytes_ == 0) return size_t{0};
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].ephemeral_bytes <= max_ephemeral_bytes_) return i;
  }
  const SwapPoint& lowest = points.back();
  const std::string how = lowest.swaps.empty() ? "nothing to swap"
                                               : "swapping " + std::to_string(lowest.swaps.size()) +
                                                     " buffers to host memory";
  return ResourceExhaustedError("an iteration needs a lane of at least " +
                                std::to_string(lowest.ephemeral_bytes) + " bytes (" + how +
                                "), more than max_ephemeral_bytes " +
                                std::to_string(max_ephemeral_bytes_));
}

// Places every lane buffer at SwapPoints()[i]'s offsets and binds the steps to them: E.
void Executable::ApplySwapPoint(size_t i) {
  const SwapPoint& point = swap_points_[i];
  swap_point_ = i;
  ephemeral_bytes_ = point.ephemeral_bytes;
  for (size_t b = 0; b < lane_.buffers.size(); ++b) {
    Location l{Location::Base::kLane, point.plan.offsets[b]};
    if (buffer_value_[b] != kNoValue) {
      locations_[buffer_value_[b]] = l;
    } else {
      steps_[buffer_step_[b]]->scratch = l;
    }
  }
  for (ValueId id = 0; id < static_cast<ValueId>(view_of_.size()); ++id) {
    if (view_of_[id] != kNoValue) locations_[id] = locations_[view_of_[id]];
  }
  BindSteps(point);
  ScheduleSwaps(point);
}

// Each step's argument locations: a swapped buffer's second region from its first backward
// use on, its first region (locations_) before.
void Executable::BindSteps(const SwapPoint& point) {
  const Graph& g = graph_;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Node& n = g.nodes()[step_node_[s]];
    Step& step = *steps_[s];
    step.inputs.clear();
    step.outputs.clear();
    for (ValueId in : n.inputs) step.inputs.push_back(in == kNoValue ? Location{} : locations_[in]);
    for (ValueId o : n.outputs) step.outputs.push_back(o == kNoValue ? Location{} : locations_[o]);
  }
  for (size_t k = 0; k < point.swaps.size(); ++k) {
    const Swap& swap = point.swaps[k];
    const ValueId value = buffer_value_[swap.buffer];
    const Location late{Location::Base::kLane, point.plan.offsets[lane_.buffers.size() + k]};
    for (size_t s = swap.in; s < steps_.size(); ++s) {
      const Node& n = g.nodes()[step_node_[s]];
      for (size_t j = 0; j < n.inputs.size(); ++j) {
        if (BufferOf(n.inputs[j]) == value) steps_[s]->inputs[j] = late;
      }
      for (size_t j = 0; j < n.outputs.size(); ++j) {  // a view made after the swap back in
        if (n.outputs[j] != kNoValue && view_of_[n.outputs[j]] == value) {
          steps_[s]->outputs[j] = late;
        }
      }
    }
  }
}

// The copies of the point's swaps at step boundaries, in the planner's order (Note [Swap
// schedule]); the host swap area they need, allocated when it must grow; the CPU's copy thread.
void Executable::ScheduleSwaps(const SwapPoint& point) {
  swap_schedule_.clear();
  swap_host_bytes_ = point.host_bytes;
  if (point.swaps.empty()) return;
  const size_t num_steps = steps_.size();
  swap_schedule_.resize(num_steps);
  std::vector<uint64_t> out_count(point.swaps.size()), in_count(point.swaps.size());
  uint64_t issued = 0;
  for (size_t s = 0; s < num_steps; ++s) {
    SwapBoundary& boundary = swap_schedule_[s];
    for (size_t k = 0; k < point.swaps.size(); ++k) {
      const Swap& swap = point.swaps[k];
      if (static_cast<size_t>(swap.out + 1) != s) continue;
      boundary.issue.push_back({true, point.plan.offsets[swap.buffer], swap.host_offset,
                                lane_.buffers[swap.buffer].lifetime.size});
      out_count[k] = ++issued;
    }
    for (size_t k = 0; k < point.swaps.size(); ++k) {
      const Swap& swap = point.swaps[k];
      if (static_cast<size_t>(swap.in_issue) != s) continue;
      boundary.issue.push_back({false, point.plan.offsets[lane_.buffers.size() + k],
                                swap.host_offset, lane_.buffers[swap.buffer].lifetime.size});
      in_count[k] = ++issued;
    }
    for (size_t k = 0; k < point.swaps.size(); ++k) {
      const Swap& swap = point.swaps[k];
      if (static_cast<size_t>(swap.out_done) == s) {
        boundary.wait_for = std::max(boundary.wait_for, out_count[k]);
      }
      if (static_cast<size_t>(swap.in) == s) {
        boundary.wait_for = std::max(boundary.wait_for, in_count[k]);
      }
    }
  }
  if (!runtime_->host_accessible()) return;  // a GPU run swaps through its pinned staging
  if (swap_host_capacity_ < swap_host_bytes_) {
    swap_host_.reset(new std::byte[swap_host_bytes_]);
    swap_host_capacity_ = swap_host_bytes_;
  }
  if (copy_thread_ && !copier_) copier_ = std::make_unique<CopyThread>(runtime_);
}

Status Executable::SelectSwapPoint(size_t i) {
  if (i >= swap_points_.size()) {
    return InvalidArgumentError("swap point " + std::to_string(i) + " of " +
                                std::to_string(swap_points_.size()));
  }
  if (running_.exchange(true)) {
    return FailedPreconditionError("cannot select a swap point while an iteration runs");
  }
  ApplySwapPoint(i);
  running_ = false;
  return OkStatus();
}

Status Executable::ReplanSwaps() {
  if (running_.exchange(true)) {
    return FailedPreconditionError("cannot plan swaps while an iteration runs");
  }
  EstimateStepTimes();
  std::vector<SwapPoint> points = SwapPlanner::Plan(lane_);
  StatusOr<size_t> point = FastestFitting(points);
  if (point.ok()) {
    swap_points_ = std::move(points);
    ApplySwapPoint(*point);
  }
  running_ = false;
  return point.status();
}

// Issues a boundary's copies and waits for those the next step needs (Note [Swap schedule]).
Status Executable::SwapAtBoundary(DeviceContext* ctx, const SwapBoundary& boundary, std::byte* lane,
                                  std::byte* host) const {
  for (const SwapCopy& c : boundary.issue) {
    std::byte* device = lane + c.lane_offset;
    std::byte* staged = host + c.host_offset;
    if (copier_) {
      if (c.to_host) {
        copier_->Push(true, staged, device, c.bytes);
      } else {
        copier_->Push(false, device, staged, c.bytes);
      }
    } else if (c.to_host) {
      SALUS_RETURN_IF_ERROR(runtime_->CopyToHost(ctx, staged, device, c.bytes));
    } else {
      SALUS_RETURN_IF_ERROR(runtime_->CopyToDevice(ctx, device, staged, c.bytes));
    }
  }
  if (copier_ && boundary.wait_for > 0) return copier_->WaitFor(boundary.wait_for);
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

Status Executable::InitializePersistent(std::byte* persistent) const {
  SALUS_ASSIGN_OR_RETURN(DeviceContext * ctx, runtime_->ThreadContext());
  return InitializePersistent(ctx, persistent);
}

Status Executable::InitializePersistent(DeviceContext* ctx, std::byte* persistent) const {
  for (ValueId id = 0; id < static_cast<ValueId>(graph_.values().size()); ++id) {
    const Location& l = locations_[id];
    if (l.base != Location::Base::kPersistent) continue;
    const Value& v = graph_.value(id);
    if (v.data.bytes.size() == v.bytes()) {
      // The source is the graph's own constant, alive as long as the executable.
      SALUS_RETURN_IF_ERROR(
          runtime_->CopyToDevice(ctx, persistent + l.offset, v.data.bytes.data(), v.bytes()));
    } else {
      SALUS_RETURN_IF_ERROR(runtime_->Zero(ctx, persistent + l.offset, v.bytes()));
    }
  }
  return runtime_->Synchronize(ctx);
}

Status Executable::Run(std::byte* persistent, std::byte* lane, std::span<const void* const> feeds,
                       std::span<void* const> fetches, const std::function<void()>& fetched) const {
  SALUS_ASSIGN_OR_RETURN(DeviceContext * ctx, runtime_->ThreadContext());
  return Run(ctx, persistent, lane, feeds, fetches, fetched);
}

Status Executable::Run(DeviceContext* ctx, std::byte* persistent, std::byte* lane,
                       std::span<const void* const> feeds, std::span<void* const> fetches,
                       const std::function<void()>& fetched) const {
  if (feeds.size() != input_ids_.size() || fetches.size() != fetch_ids_.size()) {
    return InvalidArgumentError("Run expects " + std::to_string(input_ids_.size()) + " feeds and " +
                                std::to_string(fetch_ids_.size()) + " fetches");
  }
  if (ctx == nullptr || ctx->device != device_) {
    return InvalidArgumentError("an executable compiled for " + device_.name() +
                                " was run with a context of " +
                                (ctx ? ctx->device.name() : std::string("no device")));
  }
  if (running_.exchange(true)) {
    return FailedPreconditionError(
        "the executable is already running an iteration (one at a time)");
  }
  Status st = RunSteps(ctx, persistent, lane, feeds, fetches, fetched);
  running_ = false;
  return st;
}

Status Executable::RunSteps(DeviceContext* ctx, std::byte* persistent, std::byte* lane,
                            std::span<const void* const> feeds, std::span<void* const> fetches,
                            const std::function<void()>& fetched) const {
  // Feeds: on the CPU straight into the lane; on a GPU through pinned staging (Note [Staging]).
  const bool staged = !runtime_->host_accessible();
  const size_t feed_bytes = feed_staging_bytes_, fetch_bytes = fetch_staging_bytes_;
  const bool swapping = !swap_schedule_.empty();
  std::byte* staging = nullptr;
  if (staged) {
    SALUS_ASSIGN_OR_RETURN(staging, runtime_->Staging(ctx, feed_bytes + fetch_bytes +
                                                               (swapping ? swap_host_bytes_ : 0)));
  }
  std::byte* swap_host = staged ? staging + feed_bytes + fetch_bytes : swap_host_.get();
  // Copies still queued must be over before Run returns, error or not (invariant 3).
  struct FinishCopies {
    CopyThread* copier;
    ~FinishCopies() {
      if (copier != nullptr) copier->Finish().IgnoreError();
    }
  } finish_copies{swapping ? copier_.get() : nullptr};
  size_t at = 0;
  for (size_t i = 0; i < feeds.size(); ++i) {
    void* dst = Resolve(locations_[input_ids_[i]], persistent, lane);
    const size_t bytes = input_info_[i].bytes;
    if (dst == nullptr || bytes == 0) continue;
    const void* src = feeds[i];
    if (staged) {
      std::memcpy(staging + at, feeds[i], bytes);  // the only read of the caller's memory
      src = staging + at;
      at += AlignUp(bytes);
    }
    SALUS_RETURN_IF_ERROR(runtime_->CopyToDevice(ctx, dst, src, bytes));
  }

  // Note [Fetches before the end]: copied out after the step that makes the last of them, on a
  // device whose steps run in order on this thread; at the end elsewhere.
  const bool early = fetched && !staged && !swapping && !(device_graphs_ && !graphs_off_) &&
                     fetch_ready_steps_ < steps_.size();
  // Queues the fetches' copies: into the caller's buffers, or (staged) into the pinned staging
  // after the feeds, each aligned.
  auto queue_fetch_copies = [&]() -> Status {
    std::byte* out = staged ? staging + feed_bytes : nullptr;
    for (size_t i = 0; i < fetches.size(); ++i) {
      const void* src = Resolve(locations_[fetch_ids_[i]], persistent, lane);
      const size_t bytes = fetch_info_[i].bytes;
      if (src == nullptr || bytes == 0) continue;
      SALUS_RETURN_IF_ERROR(runtime_->CopyToHost(ctx, staged ? out : fetches[i], src, bytes));
      if (staged) out += AlignUp(bytes);
    }
    return OkStatus();
  };
  bool fetches_copied = false;
  auto copy_fetches = [&]() -> Status {
    SALUS_RETURN_IF_ERROR(queue_fetch_copies());
    SALUS_RETURN_IF_ERROR(runtime_->Synchronize(ctx));
    fetches_copied = true;
    fetched();
    return OkStatus();
  };
  if (early && fetch_ready_steps_ == 0) SALUS_RETURN_IF_ERROR(copy_fetches());

  KernelArgs args;
  args.ctx = ctx;
  args.inputs.reserve(max_arity_);
  args.outputs.reserve(max_arity_);
  auto enqueue_steps = [&]() -> Status {
    for (size_t s = 0; s < steps_.size(); ++s) {
      const Step& step = *steps_[s];
      if (swapping) {
        Status st = SwapAtBoundary(ctx, swap_schedule_[s], lane, swap_host);
        if (!st.ok()) {
          runtime_->Synchronize(ctx).IgnoreError();
          return st.WithContext("swapping before " + step.node);
        }
      }
      args.inputs.clear();
      args.outputs.clear();
      for (const Location& l : step.inputs) args.inputs.push_back(Resolve(l, persistent, lane));
      for (const Location& l : step.outputs) args.outputs.push_back(Resolve(l, persistent, lane));
      args.scratch = Resolve(step.scratch, persistent, lane);
      const auto start =
          profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      std::optional<ScopedThreads> threads;
      if (step.threads > 0) threads.emplace(step.threads);
      Status st = step.kernel->Run(args);
      threads.reset();
      if (profile_) {
        if (staged && st.ok()) st = runtime_->Synchronize(ctx);  // time the work, not the launch
        step.nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      }
      if (!st.ok()) {
        // Leave nothing queued behind an error: the lane must be idle when Run returns. The
        // kernel's own error is the one to report.
        runtime_->Synchronize(ctx).IgnoreError();
        // (a kernel whose own message names its node already says where)
        return st.message().starts_with(step.node) ? st : st.WithContext(step.node);
      }
      if (early && s + 1 == fetch_ready_steps_) SALUS_RETURN_IF_ERROR(copy_fetches());
    }
    return OkStatus();
  };
  if (device_graphs_ && !graphs_off_ && !swapping && !profile_) {
    Status st = LaunchGraph(ctx, persistent, lane, enqueue_steps);
    if (!st.ok()) {
      runtime_->Synchronize(ctx).IgnoreError();
      return st;
    }
  } else {
    SALUS_RETURN_IF_ERROR(enqueue_steps());
  }

  if (swapping && copier_) {
    finish_copies.copier = nullptr;
    SALUS_RETURN_IF_ERROR(copier_->Finish());
  }
  if (profile_) ++profiled_runs_;

  if (!fetches_copied) SALUS_RETURN_IF_ERROR(queue_fetch_copies());
  // The iteration's last operation: wait for the device, so the lane may move (invariant 3).
  // An asynchronous fault surfaces here and cannot be pinned on one kernel.
  Status done = runtime_->Synchronize(ctx);
  if (!done.ok()) {
    return done.WithContext("an iteration of " + std::to_string(steps_.size()) + " steps on " +
                            device_.name());
  }
  if (staged) {
    const std::byte* out = staging + feed_bytes;
    for (size_t i = 0; i < fetches.size(); ++i) {
      const size_t bytes = fetch_info_[i].bytes;
      if (bytes == 0 || locations_[fetch_ids_[i]].base == Location::Base::kNone) continue;
      std::memcpy(fetches[i], out, bytes);
      out += AlignUp(bytes);
    }
  }
  if (fetched && !fetches_copied) fetched();
  return OkStatus();
}

// Note [Device graphs] in device.h.
Status Executable::LaunchGraph(DeviceContext* ctx, std::byte* persistent, std::byte* lane,
                               const std::function<Status()>& enqueue) const {
  if (device_graph_ == nullptr || graph_persistent_ != persistent || graph_lane_ != lane) {
    auto captured = runtime_->Capture(ctx, enqueue, std::move(device_graph_));
    device_graph_.reset();
    if (!captured.ok()) {
      graphs_off_ = true;
      logging::Get("exec")->warn("{}: device graphs off for this executable: {}", device_.name(),
                                 captured.status().ToString());
      return enqueue();
    }
    device_graph_ = std::move(*captured);
    (device_graph_->updated ? graph_updates_ : graph_captures_)++;
    device_graph_->updated = false;
    graph_persistent_ = persistent;
    graph_lane_ = lane;
  }
  graph_replays_++;
  return device_graph_->Launch(ctx);
}

GraphStats Executable::graph_stats() const {
  GraphStats s;
  s.captures = graph_captures_.load();
  s.updates = graph_updates_.load();
  s.replays = graph_replays_.load();
  s.off = graphs_off_.load();
  return s;
}

StatusOr<HostTensor> Executable::ReadPersistent(const std::byte* persistent,
                                                const std::string& name) const {
  ValueId id = graph_.Find(name);
  if (id == kNoValue || locations_[id].base != Location::Base::kPersistent) {
    return NotFoundError("'" + name + "' is not a persistent value");
  }
  const Value& v = graph_.value(id);
  HostTensor t(v.type, v.shape);
  if (t.bytes.empty()) return t;
  SALUS_ASSIGN_OR_RETURN(DeviceContext * ctx, runtime_->ThreadContext());
  SALUS_RETURN_IF_ERROR(runtime_->CopyToHost(ctx, t.bytes.data(),
                                             persistent + locations_[id].offset, t.bytes.size()));
  SALUS_RETURN_IF_ERROR(runtime_->Synchronize(ctx));
  return t;
}

bool DeviceGraphsByDefault() {
  static const bool on = [] {
    const char* env = std::getenv("SALUS_DEVICE_GRAPHS");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
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
  if (value.bytes.empty()) return OkStatus();
  SALUS_ASSIGN_OR_RETURN(DeviceContext * ctx, runtime_->ThreadContext());
  SALUS_RETURN_IF_ERROR(runtime_->CopyToDevice(ctx, persistent + locations_[id].offset,
                                               value.bytes.data(), value.bytes.size()));
  return runtime_->Synchronize(ctx);
}

}  // namespace salus::exec

namespace salus::exec {

std::map<std::string, double> Executable::Profile() const {
  std::map<std::string, double> out;
  for (const auto& s : steps_) out[s->op] += static_cast<double>(s->nanos.load()) * 1e-9;
  return out;
}

}  // namespace salus::exec
