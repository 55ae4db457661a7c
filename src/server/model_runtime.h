// ModelRuntime: a session that runs a compiled model (exec::Executable): an ONNX model, or a
// TensorFlow GraphDef captured by the TensorFlow adaptor.
//
// The model is compiled once at CreateSession, for the daemon's device, with its input shapes
// fixed, so P and E are exact from the memory plan. Every ONNX graph output (and the loss) can be
// fetched; a TensorFlow graph's fetchable tensors are the ones the client named. The first
// iteration writes the initial parameters into the session's persistent block; training
// iterations update them in place there, so a session's state never leaves the device between
// iterations.
//
// State I/O: the executable's parameters and state values (exec::ValueKind kParameter and kState:
// weights, optimizer state, running statistics, TensorFlow variables) are the session's
// state_specs(). A feed naming one is written into the persistent block before the step, a fetch
// naming one read after it; a state-only iteration does just that, with no step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "exec/executable.h"
#include "server/session_runtime.h"

namespace salus::server {

class ModelRuntime final : public SessionRuntime {
 public:
  // `max_folded_bytes` bounds the constants compilation may make by folding (see
  // exec::CompileOptions): past it, CreateSession is ResourceExhausted.
  static StatusOr<std::unique_ptr<ModelRuntime>> Create(
      const v1::ModelSpec& spec, const exec::Device& device,
      uint64_t max_folded_bytes = exec::CompileOptions{}.max_folded_bytes);

  std::string_view kind() const override { return "model"; }
  // P, and E without swapping; the executable's swap points are the smaller lanes it can run
  // in (admission grants one when E does not fit, and Run follows the lane it is given).
  mem::Requirement requirement() const override;
  std::vector<v1::TensorSpec> input_specs() const override { return inputs_; }
  std::vector<v1::TensorSpec> output_specs() const override { return outputs_; }
  std::vector<v1::TensorSpec> state_specs() const override { return state_; }
  Status Validate(const std::vector<HostTensor>& feeds, const std::vector<std::string>& fetches,
                  bool state_only) const override;
  Status Run(const sched::Dispatch& dispatch, const std::vector<HostTensor>& feeds,
             const std::vector<std::string>& fetches, bool state_only,
             IterationOutputs* out) override;

 private:
  explicit ModelRuntime(std::unique_ptr<exec::Executable> exe);
  // Selects the fastest swap point whose E fits a lane of `lane_bytes`.
  Status FitLane(uint64_t lane_bytes);

  // The spec of `name` in `specs`, or null.
  static const v1::TensorSpec* Find(const std::vector<v1::TensorSpec>& specs,
                                    const std::string& name);

  std::unique_ptr<exec::Executable> exe_;
  std::vector<v1::TensorSpec> inputs_, outputs_, state_;
  bool initialized_ = false;  // touched only by the session's lane worker
};

}  // namespace salus::server
