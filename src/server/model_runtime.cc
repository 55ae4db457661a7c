#include "server/model_runtime.h"

#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <utility>

#include "common/clock.h"
#include "common/logging.h"
#include "common/units.h"

namespace salus::server {
namespace {

// Largest batch-included input dimension a client may ask for.
constexpr int64_t kMaxInputDim = int64_t{1} << 24;

v1::DataType ToWire(exec::DataType t) {
  switch (t) {
    case exec::DataType::kFloat32:
      return v1::FLOAT32;
    case exec::DataType::kInt64:
      return v1::INT64;
    case exec::DataType::kBool:
      return v1::BOOL;
    default:
      return v1::DATA_TYPE_UNSPECIFIED;
  }
}

exec::DataType FromWire(v1::DataType t) {
  switch (t) {
    case v1::FLOAT32:
      return exec::DataType::kFloat32;
    case v1::INT64:
      return exec::DataType::kInt64;
    case v1::BOOL:
      return exec::DataType::kBool;
    default:
      return exec::DataType::kUndefined;
  }
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ",") + std::to_string(d);
  return "[" + s + "]";
}

v1::TensorSpec Spec(const exec::TensorInfo& info) {
  v1::TensorSpec s;
  s.set_name(info.name);
  s.set_dtype(ToWire(info.type));
  for (int64_t d : info.shape) s.add_shape(d);
  return s;
}

StatusOr<exec::OptimizerOptions> Optimizer(const v1::Optimizer& o) {
  exec::OptimizerOptions out;
  if (o.type().empty() || o.type() == "sgd") {
    out.kind = exec::OptimizerOptions::Kind::kSgd;
  } else if (o.type() == "adam") {
    out.kind = exec::OptimizerOptions::Kind::kAdam;
  } else if (o.type() == "adamw") {
    out.kind = exec::OptimizerOptions::Kind::kAdamW;
  } else {
    return InvalidArgumentError(fmt::format(
        "optimizer type '{}' is not supported (expected sgd, adam or adamw)", o.type()));
  }
  auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!finite_nonneg(o.lr()) || !finite_nonneg(o.momentum()) || !finite_nonneg(o.weight_decay()) ||
      !finite_nonneg(o.beta1()) || !finite_nonneg(o.beta2()) || !finite_nonneg(o.epsilon())) {
    return InvalidArgumentError("optimizer values must be finite and non-negative");
  }
  if (o.lr() > 0) out.learning_rate = static_cast<float>(o.lr());
  out.momentum = static_cast<float>(o.momentum());
  out.nesterov = o.nesterov();
  out.weight_decay = static_cast<float>(o.weight_decay());
  if (o.beta1() > 0) out.beta1 = static_cast<float>(o.beta1());
  if (o.beta2() > 0) out.beta2 = static_cast<float>(o.beta2());
  if (o.epsilon() > 0) out.epsilon = static_cast<float>(o.epsilon());
  return out;
}

// The tensors a TensorFlow graph session may fetch: each named, none twice. None at all is a
// step run for its variable updates alone (a tf.function that returns nothing).
Status CheckTfOutputs(const v1::ModelSpec& spec) {
  std::set<std::string> seen;
  for (const std::string& name : spec.outputs()) {
    if (name.empty()) return InvalidArgumentError("ModelSpec.outputs has an empty name");
    if (!seen.insert(name).second) {
      return InvalidArgumentError(fmt::format("output '{}' is listed twice", name));
    }
  }
  return OkStatus();
}

std::vector<v1::TensorSpec> StateSpecs(const exec::Executable& exe) {
  // Every parameter and state value has a place in the persistent block (constants may be
  // folded away, and ONNX inference compiles its weights as constants).
  std::vector<v1::TensorSpec> out;
  for (const exec::Value& v : exe.graph().values()) {
    if (v.kind != exec::ValueKind::kParameter && v.kind != exec::ValueKind::kState) continue;
    if (ToWire(v.type) == v1::DATA_TYPE_UNSPECIFIED) continue;
    v1::TensorSpec s;
    s.set_name(v.name);
    s.set_dtype(ToWire(v.type));
    for (int64_t d : v.shape) s.add_shape(d);
    out.push_back(std::move(s));
  }
  return out;
}

bool SameSpecs(const std::vector<v1::TensorSpec>& a, const std::vector<v1::TensorSpec>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const v1::TensorSpec& x, const v1::TensorSpec& y) {
                      return x.SerializeAsString() == y.SerializeAsString();
                    });
}

}  // namespace

// What a model compiles from, kept while the session may land on a device with other kernels.
struct ModelRuntime::Source {
  enum class Format { kOnnx, kTf, kAten };
  Format format = Format::kOnnx;
  std::string bytes;
  exec::CompileOptions options;

  StatusOr<std::unique_ptr<exec::Executable>> Compile(const exec::Device& device) const {
    exec::CompileOptions o = options;
    o.device = device;
    switch (format) {
      case Format::kAten:
        return exec::Executable::CompileAten(bytes, o);
      case Format::kTf:
        return exec::Executable::CompileTf(bytes, o);
      case Format::kOnnx:
        break;
    }
    return exec::Executable::Compile(bytes, o);
  }
};

ModelRuntime::ModelRuntime(std::unique_ptr<exec::Executable> exe, std::vector<exec::Device> devices,
                           std::unique_ptr<Source> source)
    : exe_(std::move(exe)), devices_(std::move(devices)), source_(std::move(source)) {
  for (const auto& i : exe_->inputs()) inputs_.push_back(Spec(i));
  for (const auto& f : exe_->fetches()) outputs_.push_back(Spec(f));
  state_ = StateSpecs(*exe_);
  const std::vector<exec::SwapPoint>& points = exe_->SwapPoints();
  requirement_ = {exe_->persistent_bytes(),
                  points.empty() ? exe_->ephemeral_bytes() : points.front().ephemeral_bytes};
  for (size_t i = 1; i < points.size(); ++i)
    requirement_.smaller_ephemeral.push_back(points[i].ephemeral_bytes);
}

ModelRuntime::~ModelRuntime() = default;

const v1::TensorSpec* ModelRuntime::Find(const std::vector<v1::TensorSpec>& specs,
                                         const std::string& name) {
  for (const v1::TensorSpec& s : specs) {
    if (s.name() == name) return &s;
  }
  return nullptr;
}

StatusOr<std::unique_ptr<ModelRuntime>> ModelRuntime::Create(const v1::ModelSpec& spec,
                                                             std::vector<exec::Device> devices,
                                                             size_t compile_for,
                                                             const exec::CompileLimits& limits) {
  if (compile_for >= devices.size()) {
    return InvalidArgumentError(
        fmt::format("model runtime: device {} of {}", compile_for, devices.size()));
  }
  const bool tf = !spec.tf_graph().empty();
  const bool aten = !spec.aten_graph().empty();
  if (static_cast<int>(tf) + static_cast<int>(aten) + static_cast<int>(!spec.onnx().empty()) > 1) {
    return InvalidArgumentError(
        "a model is one of ONNX, a TensorFlow graph and an ATen graph: set one of onnx, tf_graph "
        "and aten_graph");
  }
  if (!tf && !aten && spec.onnx().empty()) {
    return InvalidArgumentError("the model has no onnx, tf_graph or aten_graph bytes");
  }
  auto source = std::make_unique<Source>();
  exec::CompileOptions& o = source->options;
  o.limits = limits;
  o.convolution_transforms = spec.convolution_transforms();
  for (const v1::InputShape& in : spec.inputs()) {
    if (in.name().empty()) return InvalidArgumentError("an input shape has no name");
    for (int64_t d : in.dims()) {
      if (d <= 0 || d > kMaxInputDim) {
        return InvalidArgumentError(fmt::format("input '{}': dimension {} is out of range [1, {}]",
                                                in.name(), d, kMaxInputDim));
      }
    }
    o.input_shapes[in.name()] = exec::Shape(in.dims().begin(), in.dims().end());
  }

  if (aten) {
    // An ATen graph (a traced PyTorch step) carries its gradients and updates, its input
    // shapes and its outputs: it compiles as written, on any device.
    if (spec.mode() != v1::MODE_UNSPECIFIED && spec.mode() != v1::TRAIN &&
        spec.mode() != v1::INFER) {
      return InvalidArgumentError("the model's mode must be TRAIN or INFER");
    }
    if (!spec.inputs().empty() || !spec.outputs().empty()) {
      return InvalidArgumentError(
          "an ATen graph names its own inputs' shapes and outputs: ModelSpec.inputs and "
          "ModelSpec.outputs must be empty");
    }
    o.mode = exec::Mode::kInference;
    o.input_shapes.clear();
    source->format = Source::Format::kAten;
    source->bytes = spec.aten_graph();
    return Build(std::move(source), std::move(devices), compile_for);
  }
  if (tf) {
    // A TensorFlow graph carries its own gradients and variable updates: it always compiles
    // as written (inference mode: no autodiff, no optimizer), whatever its mode says, and on
    // any device.
    if (spec.mode() != v1::MODE_UNSPECIFIED && spec.mode() != v1::TRAIN &&
        spec.mode() != v1::INFER) {
      return InvalidArgumentError("the model's mode must be TRAIN or INFER");
    }
    SALUS_RETURN_IF_ERROR(CheckTfOutputs(spec));
    o.mode = exec::Mode::kInference;
    o.fetches.assign(spec.outputs().begin(), spec.outputs().end());
    source->format = Source::Format::kTf;
    source->bytes = spec.tf_graph();
    return Build(std::move(source), std::move(devices), compile_for);
  }

  if (!spec.outputs().empty()) {
    return InvalidArgumentError(
        "ModelSpec.outputs is for TensorFlow graphs; an ONNX model's graph outputs (and loss) are "
        "what it can fetch");
  }
  switch (spec.mode()) {
    case v1::TRAIN: {
      if (spec.loss().empty()) return InvalidArgumentError("a training session must name its loss");
      o.mode = exec::Mode::kTraining;
      o.loss = spec.loss();
      SALUS_ASSIGN_OR_RETURN(o.optimizer, Optimizer(spec.optimizer()));
      o.seed = spec.seed();
      break;
    }
    case v1::INFER:
      o.mode = exec::Mode::kInference;
      break;
    default:
      return InvalidArgumentError("the model's mode must be TRAIN or INFER");
  }
  // Every graph output can be fetched (and the loss, first, when training).
  onnx::ModelProto proto;
  if (!proto.ParseFromString(spec.onnx())) {
    return InvalidArgumentError(
        fmt::format("the model ({} bytes) is not an ONNX ModelProto", spec.onnx().size()));
  }
  if (o.mode == exec::Mode::kTraining) o.fetches.push_back(o.loss);
  for (const auto& out : proto.graph().output()) {
    if (std::find(o.fetches.begin(), o.fetches.end(), out.name()) == o.fetches.end()) {
      o.fetches.push_back(out.name());
    }
  }
  source->format = Source::Format::kOnnx;
  source->bytes = spec.onnx();
  return Build(std::move(source), std::move(devices), compile_for);
}

StatusOr<std::unique_ptr<ModelRuntime>> ModelRuntime::Build(std::unique_ptr<Source> source,
                                                            std::vector<exec::Device> devices,
                                                            size_t compile_for) {
  SALUS_ASSIGN_OR_RETURN(auto exe, source->Compile(devices[compile_for]));
  // A later compile (after a move) runs on a lane worker, for a session already admitted.
  source->options.limits.deadline = exec::CompileLimits::TimePoint::max();
  // The source is kept only where a move could need another compile.
  const bool one_kernel_device = std::all_of(
      devices.begin(), devices.end(), [&](const exec::Device& d) { return d == devices.front(); });
  if (one_kernel_device) source.reset();
  const uint64_t source_bytes = source ? source->bytes.size() : 0;
  auto rt = std::unique_ptr<ModelRuntime>(
      new ModelRuntime(std::move(exe), std::move(devices), std::move(source)));
  rt->host_bytes_ = rt->exe_->host_bytes() + source_bytes;
  return rt;
}

Status ModelRuntime::FollowDevice(const sched::Dispatch& d) {
  if (d.device >= devices_.size()) {
    return InternalError(fmt::format("session {} was dispatched on device {}, of {}", d.session,
                                     d.device, devices_.size()));
  }
  const exec::Device& want = devices_[d.device];
  if (exe_->device() == want) return OkStatus();
  if (source_ == nullptr) {
    return InternalError(
        fmt::format("session {} cannot be compiled again for {}", d.session, want.name()));
  }
  const Nanos start = SteadyClock::Get()->Now();
  auto exe = source_->Compile(want);
  if (!exe.ok()) return exe.status().WithContext(fmt::format("compiling for {}", want.name()));
  // Its persistent block moved here byte for byte: the layouts must be one.
  std::vector<v1::TensorSpec> inputs, outputs;
  for (const auto& i : (*exe)->inputs()) inputs.push_back(Spec(i));
  for (const auto& f : (*exe)->fetches()) outputs.push_back(Spec(f));
  if ((*exe)->persistent_bytes() != exe_->persistent_bytes() || !SameSpecs(inputs, inputs_) ||
      !SameSpecs(outputs, outputs_) || !SameSpecs(StateSpecs(**exe), state_)) {
    return FailedPreconditionError(fmt::format(
        "session {}: the model compiled for {} does not lay out its state as on {} ({} and {} of "
        "persistent memory)",
        d.session, want.name(), exe_->device().name(), FormatBytes((*exe)->persistent_bytes()),
        FormatBytes(exe_->persistent_bytes())));
  }
  logging::Event("server", "session_recompiled",
                 {{"session", d.session},
                  {"from", exe_->device().name()},
                  {"to", want.name()},
                  {"seconds", ToSeconds(SteadyClock::Get()->Now() - start)}});
  exe_ = std::move(*exe);
  return OkStatus();
}

Status ModelRuntime::Validate(const std::vector<HostTensor>& feeds,
                              const std::vector<std::string>& fetches, bool state_only) const {
  std::set<std::string> seen;
  for (const HostTensor& f : feeds) {
    const std::string& name = f.spec.name();
    const v1::TensorSpec* want = Find(inputs_, name);
    const bool input = want != nullptr;
    if (input && state_only) {
      return InvalidArgumentError(fmt::format(
          "feed '{}' is an input of the model; a state-only iteration takes state writes only",
          name));
    }
    if (!input) want = Find(state_, name);
    if (want == nullptr) {
      return InvalidArgumentError(
          state_.empty()
              ? fmt::format("feed '{}' is not an input of the model", name)
              : fmt::format("feed '{}' is neither an input of the model nor one of its state "
                            "values",
                            name));
    }
    if (!seen.insert(name).second) {
      return InvalidArgumentError(fmt::format("feed '{}' is given twice", name));
    }
    const char* what = input ? "the model takes" : "the state value is";
    if (f.spec.dtype() != want->dtype()) {
      return InvalidArgumentError(fmt::format("feed '{}': dtype {} where {} {}", name,
                                              v1::DataType_Name(f.spec.dtype()), what,
                                              v1::DataType_Name(want->dtype())));
    }
    if (!std::equal(f.spec.shape().begin(), f.spec.shape().end(), want->shape().begin(),
                    want->shape().end())) {
      return InvalidArgumentError(
          input ? fmt::format("feed '{}': shape {} where the session was compiled for {}", name,
                              ShapeText(f.spec.shape()), ShapeText(want->shape()))
                : fmt::format("feed '{}': shape {} where the state value is {}", name,
                              ShapeText(f.spec.shape()), ShapeText(want->shape())));
    }
  }
  if (!state_only) {
    for (const v1::TensorSpec& s : inputs_) {
      if (seen.count(s.name()) == 0) {
        return InvalidArgumentError(fmt::format("input '{}' is not fed", s.name()));
      }
    }
  }
  for (const std::string& name : fetches) {
    if (Find(state_, name) != nullptr) continue;
    if (Find(outputs_, name) != nullptr) {
      if (!state_only) continue;
      return InvalidArgumentError(
          fmt::format("'{}' is an output; a state-only iteration reads state values only", name));
    }
    return InvalidArgumentError(fmt::format("'{}' cannot be fetched (not an output{})", name,
                                            state_.empty() ? "" : " nor a state value"));
  }
  return OkStatus();
}

Status ModelRuntime::FitLane(uint64_t lane_bytes) {
  // The fastest point whose E fits the lane: points run from the largest E, fastest, down.
  const std::vector<exec::SwapPoint>& points = exe_->SwapPoints();
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].ephemeral_bytes > lane_bytes) continue;
    if (i == exe_->selected_swap_point()) return OkStatus();
    return exe_->SelectSwapPoint(i);
  }
  return ResourceExhaustedError(fmt::format(
      "the lane of {} is smaller than the least this model needs ({})", FormatBytes(lane_bytes),
      FormatBytes(points.empty() ? exe_->ephemeral_bytes() : points.back().ephemeral_bytes)));
}

Status ModelRuntime::Run(const sched::Dispatch& d, const std::vector<HostTensor>& feeds,
                         const std::vector<std::string>& fetches, bool state_only,
                         IterationOutputs* out) {
  // A region of no bytes (a graph without state, or whose every value folds) may have no base.
  if ((d.persistent.address == nullptr && exe_->persistent_bytes() > 0) ||
      (d.lane_memory.address == nullptr && exe_->ephemeral_bytes() > 0)) {
    return FailedPreconditionError("model sessions need host-accessible memory on this device");
  }
  SALUS_RETURN_IF_ERROR(FollowDevice(d));
  // Interactive lanes run on high-priority streams (Note [Device contexts] in exec/device.h).
  SALUS_ASSIGN_OR_RETURN(
      exec::DeviceContext * ctx,
      exe_->runtime()->ThreadContext(d.lane_class == mem::LaneClass::kInteractive));
  if (!initialized_) {
    SALUS_RETURN_IF_ERROR(exe_->InitializePersistent(ctx, d.persistent.address));
    initialized_ = true;
  }
  // State writes, before the step. (Read/WritePersistent copy on the thread's own context of
  // the device and synchronise it, so they are ordered with the step on either side.)
  for (const HostTensor& f : feeds) {
    if (Find(inputs_, f.spec.name()) != nullptr) continue;
    exec::HostTensor t(FromWire(f.spec.dtype()),
                       exec::Shape(f.spec.shape().begin(), f.spec.shape().end()));
    if (t.bytes.size() != f.bytes) {
      return InternalError(fmt::format("state feed '{}': {} bytes where {} were expected",
                                       f.spec.name(), f.bytes, t.bytes.size()));
    }
    if (f.bytes > 0) std::memcpy(t.bytes.data(), f.data, f.bytes);
    SALUS_RETURN_IF_ERROR(exe_->WritePersistent(d.persistent.address, f.spec.name(), t));
  }
  const auto& infos = exe_->fetches();
  std::vector<std::string> buffers;
  if (!state_only) {
    std::vector<const void*> feed_ptrs(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      for (const HostTensor& f : feeds) {
        if (f.spec.name() == inputs_[i].name()) feed_ptrs[i] = f.data;
      }
    }
    buffers.resize(infos.size());
    std::vector<void*> fetch_ptrs(infos.size());
    for (size_t i = 0; i < infos.size(); ++i) {
      buffers[i].resize(infos[i].bytes);
      fetch_ptrs[i] = buffers[i].data();
    }
    // A lane without a planner (a caller's own buffer) still bounds what the step may use.
    if (d.lane_memory.allocator != nullptr || d.lane_memory.size > 0) {
      SALUS_RETURN_IF_ERROR(FitLane(d.lane_memory.size));
    }
    SALUS_ASSIGN_OR_RETURN(std::byte * lane,
                           TakePlannedLane(d.lane_memory, exe_->ephemeral_bytes()));
    // Note [Fetches before the end] in exec/executable.cc: when only outputs are fetched, the
    // caller may have them before the remaining steps run.
    std::function<void()> fetched;
    if (out->ready && std::none_of(fetches.begin(), fetches.end(), [&](const std::string& name) {
          return Find(state_, name) != nullptr;
        })) {
      fetched = [&] {
        CollectFetches(d, fetches, &buffers, out).IgnoreError();  // (outputs only: no error)
        std::exchange(out->ready, nullptr)();
      };
    }
    SALUS_RETURN_IF_ERROR(
        exe_->Run(ctx, d.persistent.address, lane, feed_ptrs, fetch_ptrs, fetched));
    if (fetched && !out->ready) return OkStatus();  // collected and handed over already
  }
  return CollectFetches(d, fetches, &buffers, out);
}

Status ModelRuntime::CollectFetches(const sched::Dispatch& d,
                                    const std::vector<std::string>& fetches,
                                    std::vector<std::string>* step_outputs,
                                    IterationOutputs* out) const {
  // Fetches in the order asked: outputs of the step, state values read after it.
  const auto& infos = exe_->fetches();
  std::vector<std::string>& buffers = *step_outputs;
  std::vector<size_t> taken(buffers.size(), SIZE_MAX);  // where an output went in `out`
  for (const std::string& name : fetches) {
    bool done = false;
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (infos[i].name != name) continue;
      out->specs.push_back(outputs_[i]);
      if (taken[i] == SIZE_MAX) {
        taken[i] = out->data.size();
        out->data.push_back(std::move(buffers[i]));
      } else {
        out->data.push_back(out->data[taken[i]]);  // fetched twice
      }
      done = true;
      break;
    }
    if (done) continue;
    const v1::TensorSpec* spec = Find(state_, name);
    if (spec == nullptr) return InternalError(fmt::format("'{}' cannot be fetched", name));
    SALUS_ASSIGN_OR_RETURN(exec::HostTensor t, exe_->ReadPersistent(d.persistent.address, name));
    out->specs.push_back(*spec);
    out->data.emplace_back(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  return OkStatus();
}

}  // namespace salus::server
