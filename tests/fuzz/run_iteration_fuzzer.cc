// libFuzzer target over RunIteration requests of a model session: the feeds' specs and frames,
// the fetches and the flags a client sends. One tiny ONNX MLP training session (built here with
// the onnx protobuf API: Gemm, Relu, Gemm, SoftmaxCrossEntropyLoss; SGD with momentum, so the
// session has state values) is created once as a server::ModelRuntime. Each input is decoded
// as SessionManager::Run decodes a request (CheckFrame per framed feed, then
// SessionRuntime::Validate) and, when Validate accepts, runs as an iteration on host memory.
// Any input must end in a Status.
//
// Input layout: a 2-byte little-endian length n, n bytes of a serialized salus.v1.RunIteration,
// then the frame bytes. Each feed without a buffer slice takes one control byte c from the
// frame bytes: c < 0xE0 makes a frame of the size its spec says (TensorBytes, while that is at
// most kMaxFrameBytes), anything else a frame of c & 0x1f bytes; the frame's bytes follow,
// zero-padded where the input ends. The custom mutator mutates the RunIteration through its
// structure (ProtoMutator, with the session's tensor names as its dictionary) or, one time in
// four, the frame bytes with libFuzzer's byte mutations.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exec/device.h"
#include "fuzz_exec.h"
#include "proto_mutator.h"
#include "salus/v1/salus.pb.h"
#include "server/model_runtime.h"
#include "server/session_runtime.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

namespace v1 = salus::v1;
using salus::server::HostTensor;
using salus::server::ModelRuntime;

constexpr int64_t kBatch = 2, kIn = 4, kHidden = 8, kClasses = 3;
constexpr size_t kLengthBytes = 2;
constexpr uint8_t kSpecSizedBelow = 0xE0;
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 20;

void AddInitializer(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims) {
  onnx::TensorProto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  int64_t n = 1;
  for (int64_t d : dims) {
    t->add_dims(d);
    n *= d;
  }
  for (int64_t i = 0; i < n; ++i) t->add_float_data(0.01f * static_cast<float>((i * 7) % 13 - 6));
}

void AddValue(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
              const std::string& name, int type, std::vector<int64_t> dims) {
  onnx::ValueInfoProto* v = list->Add();
  v->set_name(name);
  auto* tensor = v->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(type);
  tensor->mutable_shape();  // a scalar's shape has no dims, but is there
  for (int64_t d : dims) tensor->mutable_shape()->add_dim()->set_dim_value(d);
}

onnx::NodeProto* AddNode(onnx::GraphProto* g, const std::string& op,
                         std::vector<std::string> inputs, std::string output) {
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(op);
  for (auto& in : inputs) n->add_input(in);
  n->add_output(output);
  return n;
}

// x[2,4] -> Gemm(w1, b1) -> Relu -> Gemm(w2, b2) -> logits[2,3]; loss = mean cross-entropy
// against labels[2].
std::string TinyMlp() {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name("tiny_mlp");
  AddValue(g->mutable_input(), "x", onnx::TensorProto::FLOAT, {kBatch, kIn});
  AddValue(g->mutable_input(), "labels", onnx::TensorProto::INT64, {kBatch});
  AddInitializer(g, "w1", {kIn, kHidden});
  AddInitializer(g, "b1", {kHidden});
  AddInitializer(g, "w2", {kHidden, kClasses});
  AddInitializer(g, "b2", {kClasses});
  AddNode(g, "Gemm", {"x", "w1", "b1"}, "h");
  AddNode(g, "Relu", {"h"}, "r");
  AddNode(g, "Gemm", {"r", "w2", "b2"}, "logits");
  onnx::NodeProto* sce = AddNode(g, "SoftmaxCrossEntropyLoss", {"logits", "labels"}, "loss");
  onnx::AttributeProto* reduction = sce->add_attribute();
  reduction->set_name("reduction");
  reduction->set_type(onnx::AttributeProto::STRING);
  reduction->set_s("mean");
  AddValue(g->mutable_output(), "logits", onnx::TensorProto::FLOAT, {kBatch, kClasses});
  AddValue(g->mutable_output(), "loss", onnx::TensorProto::FLOAT, {});
  return model.SerializeAsString();
}

// The session every input runs in, with its memory.
struct Session {
  std::unique_ptr<ModelRuntime> runtime;
  salus::exec::DeviceBuffer persistent, lane;
  std::vector<std::string> names;  // every tensor it knows, for the mutator's dictionary

  static Session& Get() {
    static Session* session = Create();
    return *session;
  }

 private:
  static Session* Create() {
    v1::ModelSpec spec;
    spec.set_onnx(TinyMlp());
    spec.set_mode(v1::TRAIN);
    spec.set_loss("loss");
    spec.mutable_optimizer()->set_type("sgd");
    spec.mutable_optimizer()->set_lr(0.05);
    spec.mutable_optimizer()->set_momentum(0.9);
    v1::InputShape* x = spec.add_inputs();
    x->set_name("x");
    x->add_dims(kBatch);
    x->add_dims(kIn);
    v1::InputShape* labels = spec.add_inputs();
    labels->set_name("labels");
    labels->add_dims(kBatch);
    const salus::exec::Device cpu;
    auto runtime = ModelRuntime::Create(spec, {cpu}, 0);
    if (!runtime.ok()) {
      std::fprintf(stderr, "run_iteration_fuzzer: the session failed: %s\n",
                   runtime.status().ToString().c_str());
      std::abort();  // the harness is broken, not the input
    }
    auto* s = new Session;
    s->runtime = std::move(*runtime);
    auto rt = salus::exec::DeviceRuntime::For(cpu);
    auto p = salus::exec::DeviceBuffer::Allocate(*rt, s->runtime->requirement().persistent_bytes);
    auto l = salus::exec::DeviceBuffer::Allocate(*rt, s->runtime->requirement().ephemeral_bytes);
    if (!p.ok() || !l.ok()) std::abort();
    s->persistent = std::move(*p);
    s->lane = std::move(*l);
    for (const auto& specs :
         {s->runtime->input_specs(), s->runtime->output_specs(), s->runtime->state_specs()}) {
      for (const v1::TensorSpec& t : specs) s->names.push_back(t.name());
    }
    return s;
  }
};

// The input split into its RunIteration bytes and its frame bytes.
struct Parts {
  std::string_view request, frames;
  explicit Parts(const uint8_t* data, size_t size) {
    const std::string_view all(reinterpret_cast<const char*>(data), size);
    if (size < kLengthBytes) {
      frames = all;
      return;
    }
    const size_t n = std::min<size_t>(data[0] | (size_t{data[1]} << 8), size - kLengthBytes);
    request = all.substr(kLengthBytes, n);
    frames = all.substr(kLengthBytes + n);
  }
};

// Frames cut from the frame bytes as the layout above says; a frame's storage is its string.
std::vector<std::string> CutFrames(const v1::RunIteration& body, std::string_view bytes) {
  std::vector<std::string> frames;
  size_t at = 0;
  auto next = [&]() -> uint8_t {
    return at < bytes.size() ? static_cast<uint8_t>(bytes[at++]) : 0;
  };
  for (const v1::TensorSpec& spec : body.feeds()) {
    if (spec.has_buffer()) continue;
    const uint8_t c = next();
    size_t n = c & 0x1f;
    if (c < kSpecSizedBelow) {
      auto want = salus::server::TensorBytes(spec);
      if (want.ok() && *want <= kMaxFrameBytes) n = *want;
    }
    std::string frame(n, '\0');
    const size_t have = std::min(n, bytes.size() - std::min(at, bytes.size()));
    if (have > 0) std::memcpy(frame.data(), bytes.data() + at, have);
    at += have;
    frames.push_back(std::move(frame));
  }
  return frames;
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned seed) {
  if (max_size <= kLengthBytes) return size;
  const Parts parts(data, size);
  std::string request(parts.request), frames(parts.frames);
  salus::fuzz::ProtoMutator mutator(seed);
  if (seed % 4 == 0) {
    const size_t room = max_size - kLengthBytes - request.size();
    frames.resize(std::max(room, frames.size()));
    if (frames.empty()) return size;  // no room for a frame byte
    frames.resize(LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(frames.data()), parts.frames.size(),
                                   frames.size()));
  } else {
    mutator.set_dictionary(Session::Get().names);
    // Room for the request: what the frames leave, and at most what the length can say.
    const size_t free = max_size - kLengthBytes;
    const size_t room = std::min<size_t>(free > frames.size() ? free - frames.size() : 0, 0xffff);
    std::string buf(std::max(room, request.size()), '\0');
    std::memcpy(buf.data(), request.data(), request.size());
    buf.resize(mutator.MutateSerialized(v1::RunIteration(), reinterpret_cast<uint8_t*>(buf.data()),
                                        request.size(), std::max(room, request.size())));
    if (buf.size() > room) return size;
    request = std::move(buf);
  }
  if (kLengthBytes + request.size() + frames.size() > max_size || request.size() > 0xffff) {
    return size;
  }
  data[0] = static_cast<uint8_t>(request.size() & 0xff);
  data[1] = static_cast<uint8_t>(request.size() >> 8);
  std::memcpy(data + kLengthBytes, request.data(), request.size());
  std::memcpy(data + kLengthBytes + request.size(), frames.data(), frames.size());
  return kLengthBytes + request.size() + frames.size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Session& session = Session::Get();
  const Parts parts(data, size);
  v1::RunIteration body;
  if (!body.ParseFromArray(parts.request.data(), static_cast<int>(parts.request.size()))) return 0;
  // Feeds in shared buffers would need a client's registered buffer: this session has none,
  // and SessionManager refuses a slice of an unknown buffer before Validate.
  for (const v1::TensorSpec& spec : body.feeds()) {
    if (spec.has_buffer()) return 0;
  }
  // As SessionManager::Run: every frame checked against its spec, then the whole request.
  const std::vector<std::string> frames = CutFrames(body, parts.frames);
  std::vector<HostTensor> feeds;
  for (int i = 0; i < body.feeds_size(); ++i) {
    const v1::TensorSpec& spec = body.feeds(i);
    const std::string& frame = frames[static_cast<size_t>(i)];
    if (salus::Status s = salus::server::CheckFrame(spec, frame.size()); !s.ok()) {
      salus::fuzz::Explain("frame", s);
      return 0;
    }
    feeds.push_back(
        HostTensor{spec, reinterpret_cast<const std::byte*>(frame.data()), frame.size()});
  }
  const std::vector<std::string> fetches(body.fetches().begin(), body.fetches().end());
  const bool state_only = body.state_only();
  if (salus::Status s = session.runtime->Validate(feeds, fetches, state_only); !s.ok()) {
    salus::fuzz::Explain("validate", s);
    return 0;
  }
  salus::sched::Dispatch d;
  d.session = 1;
  d.persistent = {0, session.persistent.size(), session.persistent.get()};
  d.lane_memory.size = session.lane.size();
  d.lane_memory.address = session.lane.get();
  salus::server::IterationOutputs out;
  if (body.reply_when_fetched() && !state_only) out.ready = [] {};
  salus::fuzz::Explain("run", session.runtime->Run(d, feeds, fetches, state_only, &out));
  return 0;
}
