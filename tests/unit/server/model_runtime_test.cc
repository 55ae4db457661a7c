// ModelRuntime in a daemon of several devices (Note [Sessions follow their device]): a session
// runs wherever its dispatch says, compiling its model again only for a device with other
// kernels, and carries its state across a move. The GPU case is labelled gpu and skips itself
// without one.
#include "server/model_runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "exec/device.h"
#include "exec/executable.h"

namespace salus::server {
namespace {

using exec::Device;
using exec::DeviceType;

constexpr int64_t kBatch = 8;

std::string ReadModel(const std::string& file) {
  const char* env = std::getenv("SALUS_MODELS_DIR");  // a copy run elsewhere (the GPU check)
  std::ifstream in(
      std::string(env != nullptr && *env != '\0' ? env : SALUS_MODELS_DIR) + "/" + file,
      std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

v1::ModelSpec MlpTraining() {
  v1::ModelSpec spec;
  spec.set_onnx(ReadModel("mlp.onnx"));
  spec.set_mode(v1::TRAIN);
  spec.set_loss("loss");
  spec.mutable_optimizer()->set_type("sgd");
  spec.mutable_optimizer()->set_lr(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  v1::InputShape* x = spec.add_inputs();
  x->set_name("x");
  x->add_dims(kBatch);
  x->add_dims(784);
  v1::InputShape* labels = spec.add_inputs();
  labels->set_name("labels");
  labels->add_dims(kBatch);
  return spec;
}

// One fixed batch, so that the loss falls step by step.
struct Batch {
  std::vector<float> x;
  std::vector<int64_t> labels;
  Batch() : x(kBatch * 784), labels(kBatch) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0, 1);
    for (float& v : x) v = normal(rng);
    for (int64_t& v : labels) v = static_cast<int64_t>(rng() % 10);
  }
  std::vector<HostTensor> Feeds() const {
    HostTensor tx, tl;
    tx.spec.set_name("x");
    tx.spec.set_dtype(v1::FLOAT32);
    tx.spec.add_shape(kBatch);
    tx.spec.add_shape(784);
    tx.data = reinterpret_cast<const std::byte*>(x.data());
    tx.bytes = x.size() * sizeof(float);
    tl.spec.set_name("labels");
    tl.spec.set_dtype(v1::INT64);
    tl.spec.add_shape(kBatch);
    tl.data = reinterpret_cast<const std::byte*>(labels.data());
    tl.bytes = labels.size() * sizeof(int64_t);
    return {tx, tl};
  }
};

// Memory of one device for one session: its persistent block and a lane.
struct SessionMemory {
  exec::DeviceBuffer persistent, lane;
  static SessionMemory On(const Device& device, const mem::Requirement& req) {
    auto rt = exec::DeviceRuntime::For(device);
    EXPECT_TRUE(rt.ok()) << rt.status();
    auto p = exec::DeviceBuffer::Allocate(*rt, req.persistent_bytes);
    auto l = exec::DeviceBuffer::Allocate(*rt, req.ephemeral_bytes);
    EXPECT_TRUE(p.ok() && l.ok());
    return {std::move(*p), std::move(*l)};
  }
  sched::Dispatch At(size_t device) const {
    sched::Dispatch d;
    d.session = 1;
    d.device = device;
    d.persistent = {0, persistent.size(), persistent.get()};
    d.lane_memory.size = lane.size();
    d.lane_memory.address = lane.get();
    return d;
  }
};

// One training step of `rt` on `device`; its loss.
float Step(ModelRuntime& rt, const SessionMemory& m, size_t device, const Batch& batch) {
  IterationOutputs out;
  const Status st = rt.Run(m.At(device), batch.Feeds(), {"loss"}, false, &out);
  EXPECT_TRUE(st.ok()) << st;
  if (!st.ok() || out.data.size() != 1 || out.data[0].size() != sizeof(float)) return -1;
  float loss = 0;
  std::memcpy(&loss, out.data[0].data(), sizeof(float));
  return loss;
}

TEST(ModelRuntimeTest, CpuDevicesRunOneExecutableWherever) {
  // cpu:0 and cpu:1 both run the CPU's kernels: a move is a copy of the block, nothing more.
  const Device cpu;
  auto moving = ModelRuntime::Create(MlpTraining(), {cpu, cpu}, 1);
  auto staying = ModelRuntime::Create(MlpTraining(), {cpu}, 0);
  ASSERT_TRUE(moving.ok()) << moving.status();
  ASSERT_TRUE(staying.ok()) << staying.status();
  const mem::Requirement req = (*moving)->requirement();
  EXPECT_EQ(req.persistent_bytes, (*staying)->requirement().persistent_bytes);
  const Batch batch;
  SessionMemory here = SessionMemory::On(cpu, req), there = SessionMemory::On(cpu, req);
  SessionMemory alone = SessionMemory::On(cpu, req);
  for (int step = 0; step < 6; ++step) {
    // Moves between the two devices after every step (the engine copies the block).
    const size_t device = step % 2;
    const SessionMemory& m = device == 0 ? here : there;
    const float loss = Step(**moving, m, device, batch);
    std::memcpy(device == 0 ? there.persistent.get() : here.persistent.get(), m.persistent.get(),
                req.persistent_bytes);
    EXPECT_EQ(loss, Step(**staying, alone, 0, batch)) << "step " << step;
    EXPECT_EQ((*moving)->compiled_for(), cpu);
  }
}

TEST(ModelRuntimeTest, ADispatchOnAnUnknownDeviceIsRefused) {
  auto rt = ModelRuntime::Create(MlpTraining(), {Device{}, Device{}}, 0);
  ASSERT_TRUE(rt.ok()) << rt.status();
  const SessionMemory m = SessionMemory::On(Device{}, (*rt)->requirement());
  IterationOutputs out;
  const Status st = (*rt)->Run(m.At(2), Batch().Feeds(), {"loss"}, false, &out);
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find("device 2"), std::string::npos) << st;
}

TEST(ModelRuntimeTest, ALaneSmallerThanTheModelNeedsIsRefusedBeforeItRuns) {
  // A caller's own lane (no planner) still bounds the step: never written past its end.
  auto rt = ModelRuntime::Create(MlpTraining(), {Device{}}, 0);
  ASSERT_TRUE(rt.ok()) << rt.status();
  mem::Requirement req = (*rt)->requirement();
  const uint64_t least =
      req.smaller_ephemeral.empty() ? req.ephemeral_bytes : req.smaller_ephemeral.back();
  req.ephemeral_bytes = least - 256;
  const SessionMemory m = SessionMemory::On(Device{}, req);
  IterationOutputs out;
  const Status st = (*rt)->Run(m.At(0), Batch().Feeds(), {"loss"}, false, &out);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("smaller than the least"), std::string::npos) << st;
}

TEST(ModelRuntimeTest, ACompileForADeviceOutsideTheListIsRefused) {
  auto rt = ModelRuntime::Create(MlpTraining(), {Device{}}, 1);
  EXPECT_EQ(rt.status().code(), StatusCode::kInvalidArgument) << rt.status();
}

// gpu: a session compiled for the CPU that lands on cuda:0 after one step compiles again for
// it, keeps its state, and then computes what an executable compiled for cuda:0 computes from
// that state, bit for bit.
TEST(ModelRuntimeGpuTest, CompilesAgainForTheGpuItLandsOn) {
  const Device gpu{DeviceType::kCuda, 0};
  if (auto rt = exec::DeviceRuntime::For(gpu); !rt.ok() || !(*rt)->ThreadContext().ok()) {
    GTEST_SKIP() << "needs a GPU: "
                 << (rt.ok() ? (*rt)->ThreadContext().status() : rt.status()).ToString();
  }
  const Device cpu;
  auto moving = ModelRuntime::Create(MlpTraining(), {cpu, gpu}, 0);
  ASSERT_TRUE(moving.ok()) << moving.status();
  auto reference = ModelRuntime::Create(MlpTraining(), {gpu}, 0);
  ASSERT_TRUE(reference.ok()) << reference.status();
  mem::Requirement req = (*moving)->requirement();
  ASSERT_EQ(req.persistent_bytes, (*reference)->requirement().persistent_bytes);
  // The lanes fit either compile: the GPU's may need more ephemeral memory than the CPU's.
  req.ephemeral_bytes = std::max(req.ephemeral_bytes, (*reference)->requirement().ephemeral_bytes);
  const Batch batch;

  // Step 0 on the CPU; then the block goes to the GPU, for both runtimes.
  const SessionMemory host = SessionMemory::On(cpu, req);
  Step(**moving, host, 0, batch);
  EXPECT_EQ((*moving)->compiled_for(), cpu);
  const SessionMemory m = SessionMemory::On(gpu, req);
  const SessionMemory r = SessionMemory::On(gpu, req);
  auto rt = exec::DeviceRuntime::For(gpu);
  ASSERT_TRUE(rt.ok());
  auto ctx = (*rt)->ThreadContext();
  ASSERT_TRUE(ctx.ok());
  for (const SessionMemory* to : {&m, &r}) {
    ASSERT_TRUE(
        (*rt)
            ->CopyToDevice(*ctx, to->persistent.get(), host.persistent.get(), req.persistent_bytes)
            .ok());
  }
  ASSERT_TRUE((*rt)->Synchronize(*ctx).ok());
  // The reference starts from that state too: its first iteration (state-only, so it runs no
  // step) initialises its block, which is then overwritten with the moved state.
  IterationOutputs ignored;
  ASSERT_TRUE((*reference)->Run(r.At(0), {}, {}, true, &ignored).ok());
  ASSERT_TRUE(
      (*rt)
          ->CopyToDevice(*ctx, r.persistent.get(), host.persistent.get(), req.persistent_bytes)
          .ok());
  ASSERT_TRUE((*rt)->Synchronize(*ctx).ok());
  for (int step = 1; step < 4; ++step) {
    const float a = Step(**moving, m, 1, batch);
    const float b = Step(**reference, r, 0, batch);
    EXPECT_EQ(a, b) << "step " << step;
    EXPECT_EQ((*moving)->compiled_for(), gpu);
  }
}

}  // namespace
}  // namespace salus::server
