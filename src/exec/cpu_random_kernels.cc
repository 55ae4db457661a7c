// CPU kernels of the stateless random ops that TensorFlow graphs draw with (Note [Stateless random
// numbers] in philox_math.h):
//   - SalusPhiloxKeyCounter: seed (int64 [2]) -> key (int64 [1]), counter (int64 [2]), TensorFlow's
//     StatelessRandomGetKeyCounter with the Philox algorithm; attribute seed_bits 32 for an int32
//     seed (the low 32 bits of each word, sign-extended, as TensorFlow reads an int32), else 64;
//   - SalusRandomUniform: key, counter -> float32 of the output's shape, uniform in [0, 1),
//     TensorFlow's StatelessRandomUniformV2; SalusRandomNormal and SalusRandomTruncatedNormal
//     likewise, standard normal and normal truncated to 2 standard deviations
//     (StatelessRandomNormalV2, StatelessTruncatedNormalV2).
// The uint64 words of TensorFlow's key and counter are int64 of the same bits. Both are loops over
// philox_math.h's functions, which the CUDA kernels share; the results are bit for bit those of
// TensorFlow's CPU kernels.
#include <cstdint>
#include <memory>

#include "exec/dnnl_kernel.h"
#include "exec/graph.h"
#include "exec/kernel_registry.h"
#include "exec/philox_math.h"
#include "exec/shape_inference.h"
#include "exec/tensor.h"

namespace salus::exec {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

KernelOr KeyCounter(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const bool int32_seed, PhiloxKeyCounterFor(g, n));
  return std::unique_ptr<Kernel>(new LoopKernel([int32_seed](const KernelArgs& a) {
    const auto* seed = static_cast<const int64_t*>(a.inputs[0]);
    uint64_t key = 0;
    uint64_t counter[2] = {0, 0};
    PhiloxKeyCounterOfSeed(PhiloxSeedWord(seed[0], int32_seed), PhiloxSeedWord(seed[1], int32_seed),
                           &key, counter);
    static_cast<int64_t*>(a.outputs[0])[0] = static_cast<int64_t>(key);
    auto* c = static_cast<int64_t*>(a.outputs[1]);
    c[0] = static_cast<int64_t>(counter[0]);
    c[1] = static_cast<int64_t>(counter[1]);
  }));
}

KernelOr Draw(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(const PhiloxDraw draw, PhiloxDrawFor(g, n));
  return std::unique_ptr<Kernel>(new LoopKernel([draw](const KernelArgs& a) {
    const auto key = static_cast<uint64_t>(static_cast<const int64_t*>(a.inputs[0])[0]);
    const auto* c = static_cast<const int64_t*>(a.inputs[1]);
    const auto lo = static_cast<uint64_t>(c[0]);
    const auto hi = static_cast<uint64_t>(c[1]);
    auto* out = static_cast<float*>(a.outputs[0]);
    const int64_t groups = (draw.count + 3) / 4;
    for (int64_t gi = 0; gi < groups; ++gi) {
      PhiloxGroup(draw.distribution, key, lo, hi, gi, draw.count, out);
    }
  }));
}

}  // namespace

void RegisterCpuRandomKernels(KernelRegistry* r) {
  r->Register("SalusPhiloxKeyCounter", DeviceType::kCpu, KeyCounter);
  for (const char* op : {"SalusRandomUniform", "SalusRandomNormal", "SalusRandomTruncatedNormal"}) {
    r->Register(op, DeviceType::kCpu, Draw);
  }
}

}  // namespace salus::exec
