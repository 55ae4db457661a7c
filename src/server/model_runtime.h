// ModelRuntime: a session that runs a compiled model (exec::Executable): an ONNX model, or a
// TensorFlow GraphDef captured by the TensorFlow adaptor.
//
// The model is compiled at CreateSession, for the daemon's device (its pinned device, or the
// first, where the daemon has several), with its input shapes fixed, so P and E are exact from
// the memory plan. Every ONNX graph output (and the loss) can be
// fetched; a TensorFlow graph's fetchable tensors are the ones the client named. The first
// iteration writes the initial parameters into the session's persistent block; training
// iterations update them in place there, so a session's state never leaves the device between
// iterations.
//
// State I/O: the executable's parameters and state values (exec::ValueKind kParameter and kState:
// weights, optimizer state, running statistics, TensorFlow variables) are the session's
// state_specs(). A feed naming one is written into the persistent block before the step, a fetch
// naming one read after it; a state-only iteration does just that, with no step.
//
// Note [Sessions follow their device]: in a daemon of several GPUs, the engine places a session
// on any of them and may move it between iterations (Note [Migration] in sched/engine.cc), but
// an executable's kernels, library handles and captured graph belong to the GPU it was compiled
// for. So the session keeps its model's source, and before an iteration on another GPU it
// compiles the model again for that GPU, on the lane worker, and runs there from then on: the
// first iteration after a move pays one compile. The persistent layout does not depend on the
// GPU (the same graph, planned the same way), and the new executable is checked to have the
// same P and the same inputs, outputs and state values, so the block the move copied is its
// state as it was. P and E stay what admission was asked for; a lane the new executable does
// not fit is refused with RESOURCE_EXHAUSTED, as any lane is. Where every device runs the same
// kernels (CPU devices, one GPU), nothing is kept and nothing is compiled again.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "exec/executable.h"
#include "server/session_runtime.h"

namespace salus::server {

class ModelRuntime final : public SessionRuntime {
 public:
  // `devices` are the kernel devices of the engine's devices, by index (the CPU for each CPU
  // device, each GPU itself); it compiles for devices[compile_for] (Note [Sessions follow their
  // device]). `limits` bound what the compilation may cost (Note [Compile budgets] in
  // exec/compile_limits.h): past them CreateSession fails with their status. Their deadline
  // applies to this first compilation only.
  static StatusOr<std::unique_ptr<ModelRuntime>> Create(const v1::ModelSpec& spec,
                                                        std::vector<exec::Device> devices,
                                                        size_t compile_for,
                                                        const exec::CompileLimits& limits = {});
  ~ModelRuntime() override;

  std::string_view kind() const override { return "model"; }
  // P, and E without swapping; the executable's swap points are the smaller lanes it can run
  // in (admission grants one when E does not fit, and Run follows the lane it is given). Fixed
  // at creation: what admission was asked for.
  mem::Requirement requirement() const override { return requirement_; }
  std::vector<v1::TensorSpec> input_specs() const override { return inputs_; }
  std::vector<v1::TensorSpec> output_specs() const override { return outputs_; }
  std::vector<v1::TensorSpec> state_specs() const override { return state_; }
  uint64_t host_bytes() const override { return host_bytes_; }
  Status Validate(const std::vector<HostTensor>& feeds, const std::vector<std::string>& fetches,
                  bool state_only) const override;
  Status Run(const sched::Dispatch& dispatch, const std::vector<HostTensor>& feeds,
             const std::vector<std::string>& fetches, bool state_only,
             IterationOutputs* out) override;

  // The device its executable is compiled for now; touched only by the session's lane worker.
  const exec::Device& compiled_for() const { return exe_->device(); }

 private:
  struct Source;
  ModelRuntime(std::unique_ptr<exec::Executable> exe, std::vector<exec::Device> devices,
               std::unique_ptr<Source> source);
  static StatusOr<std::unique_ptr<ModelRuntime>> Build(std::unique_ptr<Source> source,
                                                       std::vector<exec::Device> devices,
                                                       size_t compile_for);
  // Moves the step's outputs (`step_outputs`, one per executable fetch) and the state values
  // read now into `out`, in the order `fetches` asks.
  Status CollectFetches(const sched::Dispatch& d, const std::vector<std::string>& fetches,
                        std::vector<std::string>* step_outputs, IterationOutputs* out) const;
  // Compiles the model again when the dispatch's device runs other kernels than the
  // executable's (Note [Sessions follow their device]).
  Status FollowDevice(const sched::Dispatch& dispatch);
  // Selects the fastest swap point whose E fits a lane of `lane_bytes`.
  Status FitLane(uint64_t lane_bytes);

  // The spec of `name` in `specs`, or null.
  static const v1::TensorSpec* Find(const std::vector<v1::TensorSpec>& specs,
                                    const std::string& name);

  std::unique_ptr<exec::Executable> exe_;
  const std::vector<exec::Device> devices_;
  // What it compiles from; null where every device runs the same kernels.
  const std::unique_ptr<Source> source_;
  mem::Requirement requirement_;
  uint64_t host_bytes_ = 0;  // the executable's (Executable::host_bytes) and the source kept
  std::vector<v1::TensorSpec> inputs_, outputs_, state_;
  bool initialized_ = false;  // touched only by the session's lane worker
};

}  // namespace salus::server
