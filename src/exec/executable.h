// An executable: a compiled model, ready to run iterations against relocatable memory.
//
// Compile() imports an ONNX model with its input shapes fixed, derives the backward graph and
// optimizer updates for training, creates every kernel for the device, and plans memory:
//   - persistent memory (P bytes): parameters, constants, optimizer state, at fixed offsets
//     from a persistent base;
//   - ephemeral memory (E bytes): inputs, intermediates and kernel scratch, at planned offsets
//     from a lane base.
// Run() resolves those offsets against the bases it is handed (DESIGN.md, invariant 4); it
// allocates nothing else, so the memory manager may move either region between iterations.
// One executable runs one iteration at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "exec/autodiff.h"
#include "exec/graph.h"
#include "exec/kernel.h"
#include "salus/status.h"

namespace salus::exec {

enum class Mode { kInference, kTraining };

struct CompileOptions {
  DeviceType device = DeviceType::kCpu;
  // Shapes of graph inputs, batch included (required where the model's dims are symbolic).
  std::map<std::string, Shape> input_shapes;
  // Graph inputs bound to fixed values at compile time (folded as constants).
  std::map<std::string, HostTensor> constant_inputs;
  Mode mode = Mode::kInference;
  std::string loss;  // training: the name of a scalar float output
  OptimizerOptions optimizer;
  // Any tensor with more elements is refused (InvalidArgument).
  int64_t max_tensor_elements = int64_t{1} << 30;
  // Constants made at compile time by folding may hold at most this many bytes in all
  // (ResourceExhausted): a small model cannot make compilation take unbounded memory.
  uint64_t max_folded_bytes = uint64_t{1} << 30;
  // Accumulate per-step wall time (see Executable::Profile).
  bool profile = false;
  // Values returned by Run; by default the graph outputs (inference) or the loss (training).
  std::vector<std::string> fetches;
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
  ~Executable();

  uint64_t persistent_bytes() const { return persistent_bytes_; }  // P
  uint64_t ephemeral_bytes() const { return ephemeral_bytes_; }    // E
  const std::vector<TensorInfo>& inputs() const { return input_info_; }
  const std::vector<TensorInfo>& fetches() const { return fetch_info_; }
  size_t num_steps() const { return steps_.size(); }
  const Graph& graph() const { return graph_; }

  // Writes the initial persistent state (parameters, constants; zero optimizer state) at
  // `persistent`, which must hold persistent_bytes().
  void InitializePersistent(std::byte* persistent) const;

  // One iteration. `feeds[i]` holds inputs()[i].bytes bytes; `fetches[i]` receives
  // fetches()[i].bytes bytes. `lane` must hold ephemeral_bytes() bytes, aligned to 64.
  // Feeds are read once, on the calling thread, before any kernel runs: a caller may guard
  // those reads (the server does, for feeds in a client's shared memory).
  Status Run(std::byte* persistent, std::byte* lane, std::span<const void* const> feeds,
             std::span<void* const> fetches);

  // With CompileOptions::profile: seconds spent per op type over all Runs so far.
  std::map<std::string, double> Profile() const;

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
    KernelArgs args;
    std::string op;
    double seconds = 0;
  };

  Executable() = default;
  Status Build(const CompileOptions& options);
  void* Resolve(const Location& l, std::byte* persistent, std::byte* lane) const;

  Graph graph_;
  std::vector<Step> steps_;
  std::vector<Location> locations_;  // per value
  std::vector<ValueId> input_ids_, fetch_ids_;
  std::vector<TensorInfo> input_info_, fetch_info_;
  uint64_t persistent_bytes_ = 0, ephemeral_bytes_ = 0;
  bool profile_ = false;
};

}  // namespace salus::exec
