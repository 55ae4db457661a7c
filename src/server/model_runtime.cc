#include "server/model_runtime.h"

#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <set>

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

}  // namespace

ModelRuntime::ModelRuntime(std::unique_ptr<exec::Executable> exe) : exe_(std::move(exe)) {
  for (const auto& i : exe_->inputs()) inputs_.push_back(Spec(i));
  for (const auto& f : exe_->fetches()) outputs_.push_back(Spec(f));
}

StatusOr<std::unique_ptr<ModelRuntime>> ModelRuntime::Create(const v1::ModelSpec& spec,
                                                             const exec::Device& device,
                                                             uint64_t max_folded_bytes) {
  exec::CompileOptions o;
  o.device = device;
  o.max_folded_bytes = max_folded_bytes;
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
  switch (spec.mode()) {
    case v1::TRAIN: {
      if (device.type != exec::DeviceType::kCpu) {
        return UnimplementedError(fmt::format(
            "training sessions on {} are not implemented yet (inference is); train on a daemon "
            "with --device cpu",
            device.name()));
      }
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
  if (spec.onnx().empty() || !proto.ParseFromString(spec.onnx())) {
    return InvalidArgumentError(
        fmt::format("the model ({} bytes) is not an ONNX ModelProto", spec.onnx().size()));
  }
  if (o.mode == exec::Mode::kTraining) o.fetches.push_back(o.loss);
  for (const auto& out : proto.graph().output()) {
    if (std::find(o.fetches.begin(), o.fetches.end(), out.name()) == o.fetches.end()) {
      o.fetches.push_back(out.name());
    }
  }
  SALUS_ASSIGN_OR_RETURN(auto exe, exec::Executable::Compile(spec.onnx(), o));
  return std::unique_ptr<ModelRuntime>(new ModelRuntime(std::move(exe)));
}

Status ModelRuntime::Validate(const std::vector<HostTensor>& feeds,
                              const std::vector<std::string>& fetches) const {
  std::set<std::string> seen;
  for (const HostTensor& f : feeds) {
    const auto it = std::find_if(inputs_.begin(), inputs_.end(), [&](const v1::TensorSpec& s) {
      return s.name() == f.spec.name();
    });
    if (it == inputs_.end()) {
      return InvalidArgumentError(
          fmt::format("feed '{}' is not an input of the model", f.spec.name()));
    }
    if (!seen.insert(f.spec.name()).second) {
      return InvalidArgumentError(fmt::format("feed '{}' is given twice", f.spec.name()));
    }
    if (f.spec.dtype() != it->dtype()) {
      return InvalidArgumentError(fmt::format("feed '{}': dtype {} where the model takes {}",
                                              f.spec.name(), v1::DataType_Name(f.spec.dtype()),
                                              v1::DataType_Name(it->dtype())));
    }
    if (!std::equal(f.spec.shape().begin(), f.spec.shape().end(), it->shape().begin(),
                    it->shape().end())) {
      std::string want, got;
      for (int64_t d : it->shape()) want += (want.empty() ? "" : ",") + std::to_string(d);
      for (int64_t d : f.spec.shape()) got += (got.empty() ? "" : ",") + std::to_string(d);
      return InvalidArgumentError(
          fmt::format("feed '{}': shape [{}] where the session was compiled for [{}]",
                      f.spec.name(), got, want));
    }
  }
  for (const v1::TensorSpec& s : inputs_) {
    if (seen.count(s.name()) == 0) {
      return InvalidArgumentError(fmt::format("input '{}' is not fed", s.name()));
    }
  }
  for (const std::string& name : fetches) {
    if (std::none_of(outputs_.begin(), outputs_.end(),
                     [&](const v1::TensorSpec& s) { return s.name() == name; })) {
      return InvalidArgumentError(fmt::format("'{}' cannot be fetched (not an output)", name));
    }
  }
  return OkStatus();
}

Status ModelRuntime::Run(const sched::Dispatch& d, const std::vector<HostTensor>& feeds,
                         const std::vector<std::string>& fetches, IterationOutputs* out) {
  if (d.persistent.address == nullptr || d.lane_memory.address == nullptr) {
    return FailedPreconditionError("model sessions need host-accessible memory on this device");
  }
  // Interactive lanes run on high-priority streams (Note [Device contexts] in exec/device.h).
  SALUS_ASSIGN_OR_RETURN(
      exec::DeviceContext * ctx,
      exe_->runtime()->ThreadContext(d.lane_class == mem::LaneClass::kInteractive));
  if (!initialized_) {
    SALUS_RETURN_IF_ERROR(exe_->InitializePersistent(ctx, d.persistent.address));
    initialized_ = true;
  }
  std::vector<const void*> feed_ptrs(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i) {
    for (const HostTensor& f : feeds) {
      if (f.spec.name() == inputs_[i].name()) feed_ptrs[i] = f.data;
    }
  }
  const auto& infos = exe_->fetches();
  std::vector<std::string> buffers(infos.size());
  std::vector<void*> fetch_ptrs(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    buffers[i].resize(infos[i].bytes);
    fetch_ptrs[i] = buffers[i].data();
  }
  SALUS_RETURN_IF_ERROR(
      exe_->Run(ctx, d.persistent.address, d.lane_memory.address, feed_ptrs, fetch_ptrs));
  for (const std::string& name : fetches) {
    for (size_t i = 0; i < infos.size(); ++i) {
      if (infos[i].name != name) continue;
      out->specs.push_back(outputs_[i]);
      out->data.push_back(std::move(buffers[i]));
      break;
    }
  }
  return OkStatus();
}

}  // namespace salus::server
