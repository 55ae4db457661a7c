// SessionRuntime: what a session runs in each iteration. Two kinds exist: a compiled model
// (exec) and a synthetic load generator. The session manager owns one per session; the lane
// worker calls Run with the iteration's resolved memory (invariant 4: addresses are valid for
// this iteration only, and may differ in the next).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "mem/memory_manager.h"
#include "salus/status.h"
#include "salus/v1/salus.pb.h"
#include "sched/engine.h"

namespace salus::server {

// A tensor received or to be sent as a raw frame.
struct HostTensor {
  v1::TensorSpec spec;
  const std::byte* data = nullptr;  // feeds: the frame's bytes (valid during Run)
  size_t bytes = 0;
};

struct IterationOutputs {
  std::vector<v1::TensorSpec> specs;
  std::vector<std::string> data;  // one buffer per spec
  // When set, a runtime that can may call it once from Run, on the lane worker, as soon as
  // `specs` and `data` are complete and before the iteration's remaining work (Note [Fetches
  // before the end] in exec/executable.cc); it clears it when it does. Run's status still
  // says how the whole iteration went.
  std::function<void()> ready;
};

class SessionRuntime {
 public:
  virtual ~SessionRuntime() = default;
  virtual std::string_view kind() const = 0;
  virtual mem::Requirement requirement() const = 0;
  virtual std::optional<Nanos> iteration_time_hint() const { return std::nullopt; }
  virtual std::vector<v1::TensorSpec> input_specs() const { return {}; }
  virtual std::vector<v1::TensorSpec> output_specs() const { return {}; }
  // Persistent values an iteration may write (a feed naming one) and read (a fetch naming
  // one); see salus.v1.RunIteration.
  virtual std::vector<v1::TensorSpec> state_specs() const { return {}; }
  // Host memory the session holds outside the arena for as long as it lives (a compiled
  // model's constants, graph and kernels, and source): counted against the host_bytes limits
  // (docs/operations.md).
  virtual uint64_t host_bytes() const { return 0; }
  // Checks feeds and fetches before the iteration is queued, so bad input is refused at once
  // (INVALID_ARGUMENT naming the tensor) and never reaches a lane. `state_only`: the
  // iteration only writes and reads state (RunIteration.state_only).
  virtual Status Validate(const std::vector<HostTensor>& feeds,
                          const std::vector<std::string>& fetches, bool state_only) const = 0;
  // One iteration (or, with `state_only`, only its state writes and reads), on the lane
  // worker.
  virtual Status Run(const sched::Dispatch& dispatch, const std::vector<HostTensor>& feeds,
                     const std::vector<std::string>& fetches, bool state_only,
                     IterationOutputs* out) = 0;
};

// The bytes dtype × shape need; INVALID_ARGUMENT naming the tensor for an unknown dtype, a
// negative dimension or an overflowing shape.
StatusOr<uint64_t> TensorBytes(const v1::TensorSpec& spec);
// INVALID_ARGUMENT naming the tensor when the frame's size is not what dtype × shape says.
Status CheckFrame(const v1::TensorSpec& spec, size_t frame_bytes);
// Takes the iteration's lane for a static plan of `bytes` (the executable's E): reserves the
// plan in the lane's allocator and allocates it, so the lane's and the session's ephemeral
// statistics count what the iteration uses. Returns the plan's base; RESOURCE_EXHAUSTED when
// the lane is smaller than the plan.
StatusOr<std::byte*> TakePlannedLane(const mem::LaneIteration& lane, uint64_t bytes);

}  // namespace salus::server
