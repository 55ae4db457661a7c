// An executable: a compiled model, ready to run iterations against relocatable memory.
//
// Compile() imports an ONNX model with its input shapes fixed, derives the backward graph and
// optimizer updates for training, creates every kernel for the device, and plans memory:
//   - persistent memory (P bytes): parameters, constants, optimizer state, at fixed offsets
//     from a persistent base;
//   - ephemeral memory (E bytes): inputs, intermediates and kernel scratch, at planned offsets
//     from a lane base.
// Run() resolves those offsets against the bases it is handed (docs/architecture.md, rule 4); it
// allocates nothing else, so the memory manager may move either region between iterations.
//
// An executable is compiled for one device (CompileOptions::device: "cpu" or one GPU). Its
// bases are that device's memory; every copy into or out of them (feeds, fetches, the initial
// persistent state, reads and writes of persistent values) goes through the device's runtime
// (exec/device.h), and its kernels run with the calling thread's device context. One
// executable runs one iteration at a time: a second concurrent Run is refused.
//
// A training executable may also run with a smaller lane: the swap planner (swap_planner.h)
// offers points that trade E for time by copying activations out to host memory across the
// gap between their forward and backward uses; SwapPoints() lists them, and
// CompileOptions::max_ephemeral_bytes or SelectSwapPoint picks one. Results do not depend on
// the point: the same kernels read the same bytes (Note [Swapping in the executable]).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "exec/autodiff.h"
#include "exec/compile_limits.h"
#include "exec/device.h"
#include "exec/graph.h"
#include "exec/kernel.h"
#include "exec/swap_planner.h"
#include "salus/status.h"

namespace salus::exec {

enum class Mode { kInference, kTraining };

// Who performs a CPU executable's swap copies (Note [Swapping in the executable]): a copy
// thread beside the steps, or the iteration's own thread at the step boundary that issues
// them. kAuto: the copy thread when the steps leave a core free (OpenMP's thread count below
// the machine's cores), where it can overlap them; inline otherwise, where it could only take
// a core from them.
enum class SwapCopies { kAuto, kThread, kInline };

// CompileOptions::device_graphs' default: on, unless the environment sets SALUS_DEVICE_GRAPHS=0
// (for tools that cannot follow graph launches: compute-sanitizer crashes inside the launch of a
// captured training iteration). Read once per process.
bool DeviceGraphsByDefault();

// What one node of a compiled graph holds in host memory, about: six sessions of 100,000-node
// Relu chains held 1.9 GiB (3.3 KiB a node, compilation's peak included); rounded up for nodes
// with more attributes and values.
inline constexpr uint64_t kHostBytesPerNode = 4096;

struct CompileOptions {
  Device device;  // the CPU unless set
  // Shapes of graph inputs, batch included (required where the model's dims are symbolic).
  std::map<std::string, Shape> input_shapes;
  // Graph inputs bound to fixed values at compile time (folded as constants).
  std::map<std::string, HostTensor> constant_inputs;
  Mode mode = Mode::kInference;
  std::string loss;  // training: the name of a scalar float output
  OptimizerOptions optimizer;
  // Training: the seed of Dropout's masks (Note [Dropout mask]); 0 means a fixed default.
  // Two executables of one model with the same seed drop the same elements.
  uint64_t seed = 0;
  // What compilation may cost: tensor sizes, constants' bytes, nodes, and a deadline (Note
  // [Compile budgets] in compile_limits.h), so a small model cannot make compilation take
  // unbounded memory or time.
  CompileLimits limits;
  // Accumulate per-step wall time (see Executable::Profile).
  bool profile = false;
  // Values returned by Run; by default the graph outputs (inference) or the loss (training).
  std::vector<std::string> fetches;
  // Apply the graph rewrites of exec/fusion.h (off: every node runs as imported): inference
  // compiles all of them, training compiles FuseGelu (before autodiff) and FoldTransposes
  // (after it).
  bool fuse = true;
  // The largest lane an iteration may need. 0: no limit, and no swapping. Otherwise the
  // fastest point of SwapPoints() whose E fits is selected; ResourceExhausted when none does.
  uint64_t max_ephemeral_bytes = 0;
  // Bytes/s of the host<->device copy path the swap planner assumes; 0: the device's default.
  double swap_bandwidth = 0;
  SwapCopies swap_copies = SwapCopies::kAuto;  // the CPU device; a GPU uses its stream
  // On a CUDA device, let convolutions take cuDNN's FFT and non-fused Winograd algorithms:
  // deterministic, but rounding more than a direct convolution and often needing far larger
  // workspaces (so a larger E). Faster training for a job that has the GPU to itself (Note
  // [Convolution algorithms] in cuda/cudnn_kernels.cc). No effect on the CPU.
  bool convolution_transforms = false;
  // On a device that has them (CUDA), replay the iteration's kernels as one captured graph
  // (Note [Device graphs] in device.h). Not while swapping or profiling.
  bool device_graphs = DeviceGraphsByDefault();
};

// What the device graph of an executable has done (Note [Device graphs]).
struct GraphStats {
  uint64_t captures = 0;  // instantiated from a capture
  uint64_t updates = 0;   // captured again and updated in place (a base moved)
  uint64_t replays = 0;   // iterations launched as the graph
  bool off = false;       // a capture failed: kernel by kernel from then on
};

struct TensorInfo {
  std::string name;
  DataType type = DataType::kFloat32;
  Shape shape;
  size_t bytes = 0;
};

class Executable {
 public:
  static StatusOr<std::unique_ptr<Executable>> Compile(std::string_view model,
                                                       const CompileOptions& options);
  // A serialized TensorFlow GraphDef (tf_importer.h): a captured step that carries its own
  // gradients and variable updates, so options.mode must be kInference (InvalidArgument
  // otherwise). input_shapes gives every Placeholder's shape; fetches name tensors "node:k" or
  // "node" (= "node:0"); variables are persistent values named by their VarHandleOp nodes.
  static StatusOr<std::unique_ptr<Executable>> CompileTf(std::string_view graph_def,
                                                         const CompileOptions& options);
  // A serialized salus.v1.AtenGraph (aten_importer.h), which carries its own gradients and
  // updates: options.mode must be kInference; input shapes come from the graph.
  static StatusOr<std::unique_ptr<Executable>> CompileAten(std::string_view graph,
                                                           const CompileOptions& options);
  ~Executable();

  uint64_t persistent_bytes() const { return persistent_bytes_; }  // P
  // Host bytes of the constants the executable keeps (the initial state it writes into the
  // persistent block, and the constants its kernels read): Note [Compile budgets].
  uint64_t constant_bytes() const;
  // Host memory the executable holds, estimated: its constants, and kHostBytesPerNode for each
  // node of its graph (the node, its values, its step and kernel).
  uint64_t host_bytes() const;
  uint64_t ephemeral_bytes() const { return ephemeral_bytes_; }  // E of the selected point
  const std::vector<TensorInfo>& inputs() const { return input_info_; }
  const std::vector<TensorInfo>& fetches() const { return fetch_info_; }
  size_t num_steps() const { return steps_.size(); }
  const Graph& graph() const { return graph_; }
  const Device& device() const { return device_; }
  DeviceRuntime* runtime() const { return runtime_; }

  // Writes the initial persistent state (parameters, constants; zero optimizer state) at
  // `persistent`, device memory holding persistent_bytes(); returns when it is written.
  Status InitializePersistent(std::byte* persistent) const;
  Status InitializePersistent(DeviceContext* ctx, std::byte* persistent) const;

  // One iteration. `feeds[i]` holds inputs()[i].bytes bytes of host memory; `fetches[i]`
  // receives fetches()[i].bytes bytes in host memory. `persistent` and `lane` are device
  // memory; `lane` holds ephemeral_bytes() bytes, aligned to kAlignment. Feeds are read once,
  // on the calling thread, before any kernel runs: a caller may guard those reads (the server
  // does, for feeds in a client's shared memory). Returns when the iteration is over on the
  // device: the lane may then move. A failing kernel's status names its node.
  // FailedPrecondition when another Run of this executable is in progress.
  //
  // `fetched`, when given, is called once on the calling thread as soon as every fetch is in
  // its buffer (Note [Fetches before the end]): on a device the host addresses directly, right
  // after the step that makes the last fetched value, while the steps that need none of them
  // (the backward pass and the updates after a loss) have still to run; elsewhere just before
  // Run returns. It is not called when the iteration fails before then; an iteration that fails
  // after it still returns its error.
  Status Run(DeviceContext* ctx, std::byte* persistent, std::byte* lane,
             std::span<const void* const> feeds, std::span<void* const> fetches,
             const std::function<void()>& fetched = {}) const;
  // How many steps run before every fetch is final: num_steps() where a fetch is a persistent
  // value (a step may still update it) or none can be copied early (Note [Fetches before the
  // end]).
  size_t fetch_ready_steps() const { return fetch_ready_steps_; }
  // The same with the calling thread's context of the executable's device.
  Status Run(std::byte* persistent, std::byte* lane, std::span<const void* const> feeds,
             std::span<void* const> fetches, const std::function<void()>& fetched = {}) const;

  // With CompileOptions::profile: seconds spent per op type over all Runs so far.
  std::map<std::string, double> Profile() const;

  // The points this executable can run at, sorted by E, highest first: the first swaps
  // nothing; each next one needs a strictly smaller lane and is expected to take longer. An
  // inference executable (or a model with nothing to swap) has only the first. Valid until
  // ReplanSwaps.
  GraphStats graph_stats() const;
  const std::vector<SwapPoint>& SwapPoints() const { return swap_points_; }
  size_t selected_swap_point() const { return swap_point_; }
  // Runs later iterations at SwapPoints()[i]; ephemeral_bytes() becomes its E, so the lane
  // handed to Run may shrink. InvalidArgument when there is no such point; FailedPrecondition
  // while an iteration runs.
  Status SelectSwapPoint(size_t i);
  // Plans the points again with the step times measured so far (CompileOptions::profile and
  // at least one Run; the size-based estimate otherwise) and selects as the compile did: the
  // fastest point within CompileOptions::max_ephemeral_bytes. ephemeral_bytes() may change.
  // ResourceExhausted, keeping the current points, when none fits any more.
  Status ReplanSwaps();

  // A persistent value (a parameter after training, say) copied out.
  StatusOr<HostTensor> ReadPersistent(const std::byte* persistent, const std::string& name) const;
  // Overwrites a persistent value (loading weights from a checkpoint, say).
  Status WritePersistent(std::byte* persistent, const std::string& name,
                         const HostTensor& value) const;

 private:
  struct Location {
    enum class Base { kNone, kPersistent, kLane };
    Base base = Base::kNone;
    uint64_t offset = 0;
  };
  struct Step {
    std::unique_ptr<Kernel> kernel;
    std::vector<Location> inputs, outputs;
    Location scratch;
    std::string op;
    std::string node;  // Node::Describe(), for errors
    int threads = 0;   // CPU: OpenMP threads (Note [Threads per step]); 0 elsewhere
    mutable std::atomic<int64_t> nanos{0};  // with profile_
  };
  // One copy of a swap (Note [Swap schedule] in swap_planner.h), as offsets from the lane
  // and from the host swap area.
  struct SwapCopy {
    bool to_host = false;
    uint64_t lane_offset = 0, host_offset = 0, bytes = 0;
  };
  // What happens before a step starts: copies issued, then a wait until the first
  // `wait_for` copies of the iteration are over (0: none).
  struct SwapBoundary {
    std::vector<SwapCopy> issue;
    uint64_t wait_for = 0;
  };
  class CopyThread;

  Executable() = default;
  // Build's passes, in order.
  Status Build(const CompileOptions& options);
  Status ApplyTraining(const CompileOptions& options);
  Status ResolveFetches(const CompileOptions& options);
  std::vector<bool> LiveNodes(std::vector<bool>* needed) const;
  Status CreateKernels(const std::vector<bool>& live, std::vector<int>* step_node);
  void LayOutPersistent(const std::vector<bool>& needed);
  void FindViews();
  void DescribeLane();
  void EstimateStepTimes();
  void DescribeTensors();
  StatusOr<size_t> FastestFitting(const std::vector<SwapPoint>& points) const;
  void ApplySwapPoint(size_t i);
  void BindSteps(const SwapPoint& point);
  void ScheduleSwaps(const SwapPoint& point);
  Status SwapAtBoundary(DeviceContext* ctx, const SwapBoundary& boundary, std::byte* lane,
                        std::byte* host) const;

  void* Resolve(const Location& l, std::byte* persistent, std::byte* lane) const;
  Status RunSteps(DeviceContext* ctx, std::byte* persistent, std::byte* lane,
                  std::span<const void* const> feeds, std::span<void* const> fetches,
                  const std::function<void()>& fetched) const;
  void FindFetchReadySteps();

  Graph graph_;
  Device device_;
  DeviceRuntime* runtime_ = nullptr;
  std::vector<std::unique_ptr<Step>> steps_;
  std::vector<int> step_node_;  // per step: its node in graph_
  // Training: nodes before this index are the forward pass (autodiff appends the rest).
  size_t num_forward_nodes_ = SIZE_MAX;
  std::vector<Location> locations_;  // per value
  std::vector<ValueId> input_ids_, fetch_ids_;
  std::vector<std::string> fetch_names_;  // as CompileOptions::fetches named them
  std::vector<TensorInfo> input_info_, fetch_info_;
  uint64_t persistent_bytes_ = 0, ephemeral_bytes_ = 0;
  size_t max_arity_ = 0;          // most inputs or outputs of one step
  size_t fetch_ready_steps_ = 0;  // Note [Fetches before the end]
  // Pinned staging a GPU run needs for its feeds and for its fetches (Note [Staging]).
  size_t feed_staging_bytes_ = 0, fetch_staging_bytes_ = 0;
  bool profile_ = false;
  mutable std::atomic<int64_t> profiled_runs_{0};  // Runs that added to Step::nanos
  mutable std::atomic<bool> running_{false};

  // Note [Device graphs]: the captured iteration, the bases it was captured at, and what it
  // did. Touched only by the one Run in progress (running_); the counters are read by others.
  bool device_graphs_ = false;
  mutable std::unique_ptr<DeviceGraph> device_graph_;
  mutable std::byte* graph_persistent_ = nullptr;
  mutable std::byte* graph_lane_ = nullptr;
  mutable std::atomic<bool> graphs_off_{false};
  mutable std::atomic<uint64_t> graph_captures_{0}, graph_updates_{0}, graph_replays_{0};
  Status LaunchGraph(DeviceContext* ctx, std::byte* persistent, std::byte* lane,
                     const std::function<Status()>& enqueue) const;

  // Swapping (Note [Swapping in the executable]). The lane's buffers as the swap planner sees
  // them (values, then kernels' scratch), with each buffer's value or scratch step.
  SwapProblem lane_;
  std::vector<ValueId> buffer_value_;  // kNoValue for scratch
  // Note [Views share their buffer]: per value, the lane value whose buffer it shares (the
  // input of the reshapes that made it); kNoValue for a value with a buffer of its own.
  std::vector<ValueId> view_of_;
  ValueId BufferOf(ValueId id) const {
    return id != kNoValue && view_of_[id] != kNoValue ? view_of_[id] : id;
  }
  std::vector<int> buffer_step_;  // the step whose scratch it is; -1 for values
  std::vector<SwapPoint> swap_points_;
  size_t swap_point_ = 0;
  uint64_t max_ephemeral_bytes_ = 0;
  std::vector<SwapBoundary> swap_schedule_;  // per step of the selected point; empty: no swaps
  // Host memory the copies out land in (devices whose memory the host reaches; a GPU run
  // uses its context's pinned staging instead), allocated once at its largest selected size.
  std::unique_ptr<std::byte[]> swap_host_;
  uint64_t swap_host_capacity_ = 0, swap_host_bytes_ = 0;
  bool copy_thread_ = false;            // copies beside the steps (SwapCopies)
  std::unique_ptr<CopyThread> copier_;  // with copy_thread_, once a point swaps
};

}  // namespace salus::exec
