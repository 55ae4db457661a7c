// The CPU kernel of SalusFusedElementwise (Note [Fused elementwise chains] in
// fusion_eltwise.cc). Its own file: it is compiled without errno for the square root and without
// contracting products and sums, so its loops vectorise and round as the separate nodes did.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "exec/dnnl_kernel.h"
#include "exec/fusion.h"
#include "exec/kernel_registry.h"

namespace salus::exec {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// Note [Fused elementwise chains] (fusion_eltwise.cc): a SalusFusedElementwise node's program
// runs over blocks of kFusedBlock elements, each operation's result kept in a block on the
// stack; the blocks are split across the step's threads as the optimizer's assignments are.
constexpr int64_t kFusedBlock = 256;

KernelOr FusedElementwise(const Node& n, const Graph& g) {
  const std::vector<int64_t> program = n.GetInts(kFusedProgramAttr);
  const std::string assign = n.GetString(kFusedAssignAttr, "");
  const int64_t num_inputs = static_cast<int64_t>(n.inputs.size());
  const int64_t ops = static_cast<int64_t>(program.size()) / 3;
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(n.Describe() + ": " + why);
  };
  if (ops < 1 || ops > kMaxFusedOperations || program.size() % 3 != 0) {
    return bad("a program of " + std::to_string(program.size()) + " ints");
  }
  if (!assign.empty() && assign != "set" && assign != "add" && assign != "sub") {
    return bad("assignment mode '" + assign + "'");
  }
  if (num_inputs < 1 || (assign.empty() && (n.outputs.size() != 1 || n.outputs[0] == kNoValue))) {
    return bad("no inputs or no output");
  }
  const int64_t count =
      NumElements(assign.empty() ? g.value(n.outputs[0]).shape : g.value(n.inputs[0]).shape);
  std::vector<bool> broadcast(num_inputs);
  for (int64_t i = 0; i < num_inputs; ++i) {
    const Value& v = g.value(n.inputs[i]);
    const int64_t c = NumElements(v.shape);
    if (v.type != DataType::kFloat32 || (c != count && c != 1)) {
      return bad("input " + std::to_string(i) + " is " + DataTypeName(v.type) +
                 ShapeString(v.shape) + " for " + std::to_string(count) + " elements");
    }
    broadcast[i] = c != count;
  }
  for (int64_t k = 0; k < ops; ++k) {
    const int64_t code = program[3 * k];
    if (code < 0 || code > static_cast<int64_t>(ElementwiseOpcode::kNeg)) {
      return bad("opcode " + std::to_string(code));
    }
    for (int j = 1; j <= 2; ++j) {
      const int64_t o = program[3 * k + j];
      if (o >= num_inputs || o < -k)
        return bad("operation " + std::to_string(k) + " reads operand " + std::to_string(o));
    }
  }
  const int mode = assign.empty() ? 0 : assign == "set" ? 1 : assign == "add" ? 2 : 3;
  return std::unique_ptr<Kernel>(
      new LoopKernel([program, broadcast, count, ops, mode](const KernelArgs& a) {
        const int64_t blocks = (count + kFusedBlock - 1) / kFusedBlock;
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 15))
        for (int64_t blk = 0; blk < blocks; ++blk) {
          float regs[kMaxFusedOperations][kFusedBlock];
          float splat[2][kFusedBlock];
          const int64_t base = blk * kFusedBlock;
          const int64_t len = std::min(kFusedBlock, count - base);
          auto operand = [&](int64_t o, int j) -> const float* {
            if (o < 0) return regs[-1 - o];
            const float* p = static_cast<const float*>(a.inputs[o]);
            if (!broadcast[o]) return p + base;
            std::fill(splat[j], splat[j] + len, p[0]);
            return splat[j];
          };
          for (int64_t k = 0; k < ops; ++k) {
            const float* x = operand(program[3 * k + 1], 0);
            const float* y = operand(program[3 * k + 2], 1);
            float* z = regs[k];
            switch (static_cast<ElementwiseOpcode>(program[3 * k])) {
              case ElementwiseOpcode::kAdd:
                for (int64_t i = 0; i < len; ++i) z[i] = x[i] + y[i];
                break;
              case ElementwiseOpcode::kSub:
                for (int64_t i = 0; i < len; ++i) z[i] = x[i] - y[i];
                break;
              case ElementwiseOpcode::kMul:
                for (int64_t i = 0; i < len; ++i) z[i] = x[i] * y[i];
                break;
              case ElementwiseOpcode::kDiv:
                for (int64_t i = 0; i < len; ++i) z[i] = x[i] / y[i];
                break;
              case ElementwiseOpcode::kSqrt:
                for (int64_t i = 0; i < len; ++i) z[i] = std::sqrt(x[i]);
                break;
              case ElementwiseOpcode::kNeg:
                // As the Neg node's oneDNN linear eltwise computes it: +0 for 0, a NaN's sign kept.
                for (int64_t i = 0; i < len; ++i) z[i] = x[i] * -1.0f + 0.0f;
                break;
            }
          }
          const float* r = regs[ops - 1];
          if (mode == 0) {
            std::copy(r, r + len, static_cast<float*>(a.outputs[0]) + base);
            continue;
          }
          float* v = static_cast<float*>(a.inputs[0]) + base;
          if (mode == 1) {
            std::copy(r, r + len, v);
          } else if (mode == 2) {
            for (int64_t i = 0; i < len; ++i) v[i] = v[i] + r[i];
          } else {
            for (int64_t i = 0; i < len; ++i) v[i] = v[i] - r[i];
          }
        }
      }));
}

}  // namespace

void RegisterCpuFusedKernels(KernelRegistry* r) {
  r->Register(kFusedElementwiseOp, DeviceType::kCpu, FusedElementwise);
}

}  // namespace salus::exec
