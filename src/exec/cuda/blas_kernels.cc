// The CUDA device's Gemm and MatMul (cuBLAS) and reductions (CUB), with the CPU's semantics.
//
//   Gemm     beta * C broadcast into Y by a small kernel, then one sgemm adding alpha * op(A)
//            op(B) to it (beta 1); without C, sgemm with beta 0. A fused Relu (inference) is an
//            in-place kernel after the sgemm.
//   MatMul   one sgemm, or strided-batched sgemms over the batch dims; a batch dim on which one
//            operand is present and the other broadcast (say [2, 1] x [1, 3]) makes the host loop
//            over the outer batches (MatMulLayout in reduce_math.h).
//   Reduce*  an optional permutation moving the reduced dims innermost, then CUB's segmented
//            reduction, in several passes for long runs, then a division (Mean) or square root
//            (L2) (Note [Reduction layout] in reduce_math.h).
//
// Row-major data meets column-major cuBLAS through the transposition trick of RowMajorGemm in
// reduce_math.h. Every size, stride and plan is fixed when the kernel is built; Run only queues
// work on the context's stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "exec/alignment.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cuda_util.h"
#include "exec/cuda/reduce_launch.h"
#include "exec/cuda/reduce_math.h"
#include "exec/fusion.h"
#include "exec/shape_inference.h"

namespace salus::exec::cuda {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// Note [cuBLAS workspace]: cuBLAS allocates nothing while a kernel runs only if it is handed its
// workspace. A handle's default workspace (taken when the handle is created, counted in the
// runtime's reserved bytes) is shared by every kernel on the context, so instead each Gemm and
// MatMul declares kCublasWorkspaceBytes of scratch, planned in the lane like any other buffer
// and so counted in E, and points the handle at it (cublasSetWorkspace) for the duration of its
// own calls only: the handle's workspace is the kernel's scratch only during the call. Right
// after, the handle is given an empty workspace, so that a later cuBLAS call that forgets to set
// its own cannot write into a lane buffer that has been reused (with none, cuBLAS picks an
// algorithm that needs no workspace or fails with CUBLAS_STATUS_ALLOC_FAILED: loud, not corrupt).
// Work already queued keeps the pointer it was given, and stream order keeps the scratch valid
// until it has run.
//
// Size: the cuBLAS documentation (cublasSetWorkspace) recommends 32 MiB on Hopper and 4 MiB on
// other GPUs; with a smaller workspace cuBLAS still works (16 KiB are enough never to fail with
// CUBLAS_STATUS_ALLOC_FAILED) but may choose a slower algorithm for some shapes (split-K kernels
// keep their partial sums there). 4 MiB is the figure for Ampere and a compromise on Hopper:
// these are FP32 GEMMs without tensor cores (CUBLAS_PEDANTIC_MATH), which gain least from a large
// workspace, while every lane of every session running a model with a matmul pays the workspace
// in its E. (kCublasWorkspaceBytes and WithCublasWorkspace: cuda_util.h.)

// Unimplemented unless the listed inputs (every present one when empty) and the outputs are
// float32, with the CPU's message.
Status RequireFloat(const Node& n, const Graph& g, std::initializer_list<size_t> inputs = {}) {
  auto check = [&](ValueId id) -> Status {
    if (id == kNoValue) return OkStatus();
    const Value& v = g.value(id);
    if (v.type != DataType::kFloat32) {
      return UnimplementedError("node '" + n.name + "': op " + n.op + " on " +
                                DataTypeName(v.type) + " tensor '" + v.name + "'");
    }
    return OkStatus();
  };
  if (inputs.size() == 0) {
    for (ValueId id : n.inputs) SALUS_RETURN_IF_ERROR(check(id));
  } else {
    for (size_t i : inputs) SALUS_RETURN_IF_ERROR(check(n.input(i)));
  }
  for (ValueId id : n.outputs) SALUS_RETURN_IF_ERROR(check(id));
  return OkStatus();
}

// cuBLAS's 32-bit API takes sizes, leading dims and batch counts as int.
Status RequireInt(const Node& n, std::initializer_list<int64_t> values) {
  for (int64_t v : values) {
    if (v > INT_MAX) {
      return UnimplementedError(n.Describe() + ": a matrix dimension of " + std::to_string(v) +
                                " is more than cuBLAS's int");
    }
  }
  return OkStatus();
}

cublasOperation_t Op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

const float* In(const KernelArgs& a, size_t i) { return static_cast<const float*>(a.inputs[i]); }
float* Out(const KernelArgs& a, size_t i) { return static_cast<float*>(a.outputs[i]); }

// Y[M, N] = alpha * op(A) op(B) + beta * C, C broadcast.
KernelOr Gemm(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  const Shape& a = g.value(n.inputs[0]).shape;
  const Shape& out = g.value(n.outputs[0]).shape;
  const bool ta = n.GetInt("transA", 0) != 0, tb = n.GetInt("transB", 0) != 0;
  const float alpha = n.GetFloat("alpha", 1.f), beta = n.GetFloat("beta", 1.f);
  const int64_t m = out[0], nn = out[1], k = ta ? a[0] : a[1];
  const std::string activation = n.GetString("fused_activation", "");
  if (!activation.empty() && activation != "Relu") {
    return UnimplementedError(n.Describe() + ": fused activation " + activation);
  }
  const bool relu = activation == "Relu";
  // As on the CPU, C is not read at all when beta is 0.
  const bool has_c = n.input(2) != kNoValue && beta != 0.f;
  const CublasGemmShape s = RowMajorGemm(m, nn, k, ta, tb);
  SALUS_RETURN_IF_ERROR(RequireInt(n, {s.m, s.n, s.k, s.ld_first, s.ld_second, s.ld_out}));
  const GemmBias bias = has_c ? MakeGemmBias(g.value(n.inputs[2]).shape, m, nn) : GemmBias{};
  const int64_t count = m * nn;
  const bool multiply = count > 0 && k > 0;
  const std::string what = n.Describe();
  return std::unique_ptr<Kernel>(new CudaFnKernel(
      [=](const KernelArgs& args) -> Status {
        if (count == 0) return OkStatus();
        cudaStream_t stream = StreamOf(args);
        float* y = Out(args, 0);
        if (has_c) {
          SALUS_CUDA_RETURN(LaunchGemmBias(bias, beta, In(args, 2), y, stream),
                            what + ": broadcasting C into Y");
        } else if (!multiply) {
          // K = 0: the product is empty, Y is 0.
          SALUS_CUDA_RETURN(cudaMemsetAsync(y, 0, count * sizeof(float), stream),
                            what + ": zeroing Y");
        }
        if (multiply) {
          const float gemm_beta = has_c ? 1.f : 0.f;
          SALUS_RETURN_IF_ERROR(WithCublasWorkspace(args, what, [&](cublasHandle_t h) {
            return CublasStatus(
                cublasSgemm(h, Op(s.trans_first), Op(s.trans_second), static_cast<int>(s.m),
                            static_cast<int>(s.n), static_cast<int>(s.k), &alpha, In(args, 1),
                            static_cast<int>(s.ld_first), In(args, 0),
                            static_cast<int>(s.ld_second), &gemm_beta, y,
                            static_cast<int>(s.ld_out)),
                what + ": cublasSgemm");
          }));
        }
        if (relu) SALUS_CUDA_RETURN(LaunchRelu(y, count, stream), what + ": fused Relu");
        return OkStatus();
      },
      multiply ? kCublasWorkspaceBytes : 0));
}

// numpy's matmul: 1-D operands, broadcast batch dims.
KernelOr MatMul(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  // Operands stored transposed: Note [Transposed operands] in exec/fusion.h.
  std::vector<int64_t> as = g.value(n.inputs[0]).shape, bs = g.value(n.inputs[1]).shape;
  SALUS_RETURN_IF_ERROR(ApplyMatMulTransposes(n, &as, &bs));
  const bool ta = n.GetInt(kMatMulTransA, 0) != 0, tb = n.GetInt(kMatMulTransB, 0) != 0;
  const MatMulPlan plan = MakeMatMulPlan(as, bs, ta, tb);
  const MatMulLayout& l = plan.layout;
  const CublasGemmShape& s = plan.gemm;
  const int64_t batch = plan.batch;
  const int64_t count = NumElements(g.value(n.outputs[0]).shape);
  const bool multiply = count > 0 && l.k > 0;
  SALUS_RETURN_IF_ERROR(RequireInt(n, {s.m, s.n, s.k, s.ld_first, s.ld_second, s.ld_out, batch}));
  const cublasOperation_t op_b = s.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = s.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t out_step = l.inner * l.m * l.n;  // elements of Y per outer batch
  const std::string what = n.Describe();
  return std::unique_ptr<Kernel>(new CudaFnKernel(
      [=](const KernelArgs& args) -> Status {
        if (count == 0) return OkStatus();
        float* y = Out(args, 0);
        if (!multiply) {
          // K = 0: every product is empty, Y is 0.
          return CudaStatus(cudaMemsetAsync(y, 0, count * sizeof(float), StreamOf(args)),
                            what + ": zeroing Y");
        }
        const float* a = In(args, 0);
        const float* b = In(args, 1);
        const float one = 1.f, zero = 0.f;
        return WithCublasWorkspace(args, what, [&](cublasHandle_t h) -> Status {
          for (int64_t o = 0; o < l.outer; ++o) {
            int64_t a_at = 0, b_at = 0;
            l.OuterOffsets(o, &a_at, &b_at);
            float* y_at = y + o * out_step;
            if (batch == 1) {
              SALUS_CUBLAS_RETURN(
                  cublasSgemm(h, op_b, op_a, static_cast<int>(s.m), static_cast<int>(s.n),
                              static_cast<int>(s.k), &one, b + b_at, static_cast<int>(s.ld_first),
                              a + a_at, static_cast<int>(s.ld_second), &zero, y_at,
                              static_cast<int>(s.ld_out)),
                  what + ": cublasSgemm");
            } else {
              SALUS_CUBLAS_RETURN(
                  cublasSgemmStridedBatched(
                      h, op_b, op_a, static_cast<int>(s.m), static_cast<int>(s.n),
                      static_cast<int>(s.k), &one, b + b_at, static_cast<int>(s.ld_first),
                      l.b_stride, a + a_at, static_cast<int>(s.ld_second), l.a_stride, &zero, y_at,
                      static_cast<int>(s.ld_out), l.m * l.n, static_cast<int>(batch)),
                  what + ": cublasSgemmStridedBatched");
            }
          }
          return OkStatus();
        });
      },
      multiply ? kCublasWorkspaceBytes : 0));
}

// A reduction whose reduced dims all have size 1 (or that reduces no dim): the CPU's copy,
// absolute value or square.
KernelOr NoReduction(const Node& n, const Graph& g, const ReduceKind& kind) {
  const int64_t count = NumElements(g.value(n.inputs[0]).shape);
  const ReduceInput map = NoReductionMap(kind);
  const std::string what = n.Describe();
  return std::unique_ptr<Kernel>(new CudaFnKernel([=](const KernelArgs& args) -> Status {
    if (count == 0) return OkStatus();
    if (map != ReduceInput::kPlain) {
      return CudaStatus(LaunchReduceMap(map, In(args, 0), Out(args, 0), count, StreamOf(args)),
                        what);
    }
    if (args.outputs[0] == args.inputs[0]) return OkStatus();
    return CudaStatus(cudaMemcpyAsync(args.outputs[0], args.inputs[0], count * sizeof(float),
                                      cudaMemcpyDeviceToDevice, StreamOf(args)),
                      what + ": copy");
  }));
}

// Where a reduction's temporaries lie in its scratch, and what it runs.
struct ReducePlan {
  ReduceKind kind;
  ReduceLayout layout;
  std::vector<ReducePass> passes;
  std::vector<size_t> temp_bytes;  // CUB's temporary storage of each pass
  size_t permuted_at = 0;          // the permuted input, when layout.permute
  size_t partials_at[2] = {0, 0};  // partial results of passes but the last, alternately
  size_t temp_at = 0;              // CUB's temporary storage, shared by the passes
  size_t scratch_bytes = 0;
  int64_t out_count = 0;
};

// Places `bytes` at the next aligned offset of a scratch now `*end` bytes long.
size_t Carve(size_t* end, size_t bytes) {
  const size_t at = AlignUp(*end);
  *end = at + bytes;
  return at;
}

KernelOr Reduce(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g, {0}));
  ReducePlan plan;
  if (!ReduceKindFor(n.op, &plan.kind)) {
    return UnimplementedError(n.Describe() + ": not a reduction");
  }
  const Shape& x = g.value(n.inputs[0]).shape;
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReductionAxes(g, n));
  if (x.empty() || ReducesNothing(x, axes)) return NoReduction(n, g, plan.kind);
  if (!MakeReduceLayout(x, axes, &plan.layout)) {
    return UnimplementedError(n.Describe() + ": the reduced and kept dims of " + ShapeString(x) +
                              " alternate in more than " + std::to_string(kMaxReduceDims) +
                              " groups");
  }
  const std::string what = n.Describe();
  plan.out_count = plan.layout.segments;
  plan.passes = PlanReducePasses(plan.layout.segments, plan.layout.segment_len);
  size_t end = 0;
  if (plan.layout.permute) {
    plan.permuted_at = Carve(&end, NumElements(x) * sizeof(float));
  }
  size_t partials[2] = {0, 0};
  size_t temp = 1;  // never 0 bytes: CUB takes a null temporary storage for a size query
  for (size_t i = 0; i < plan.passes.size(); ++i) {
    if (i + 1 < plan.passes.size()) {
      partials[i % 2] =
          std::max<size_t>(partials[i % 2], PassOutputs(plan.passes[i]) * sizeof(float));
    }
    size_t bytes = 0;
    SALUS_CUDA_RETURN(LaunchSegmentedReduce(plan.passes[i], plan.kind.op,
                                            i == 0 ? plan.kind.input : ReduceInput::kPlain, nullptr,
                                            nullptr, nullptr, &bytes, nullptr),
                      what + ": sizing CUB's temporary storage");
    plan.temp_bytes.push_back(bytes);
    temp = std::max(temp, bytes);
  }
  for (int i = 0; i < 2; ++i) {
    if (partials[i] > 0) plan.partials_at[i] = Carve(&end, partials[i]);
  }
  plan.temp_at = Carve(&end, temp);
  plan.scratch_bytes = end;
  const size_t scratch = plan.scratch_bytes;
  return std::unique_ptr<Kernel>(new CudaFnKernel(
      [plan = std::move(plan), what](const KernelArgs& args) -> Status {
        if (plan.out_count == 0) return OkStatus();
        cudaStream_t stream = StreamOf(args);
        std::byte* temps = static_cast<std::byte*>(args.scratch);
        const float* src = In(args, 0);
        float* y = Out(args, 0);
        if (plan.layout.permute) {
          float* permuted = reinterpret_cast<float*>(temps + plan.permuted_at);
          SALUS_CUDA_RETURN(LaunchPermute(plan.layout.perm, src, permuted, stream),
                            what + ": permuting the reduced dims innermost");
          src = permuted;
        }
        for (size_t i = 0; i < plan.passes.size(); ++i) {
          float* dst = i + 1 == plan.passes.size()
                           ? y
                           : reinterpret_cast<float*>(temps + plan.partials_at[i % 2]);
          size_t bytes = plan.temp_bytes[i];
          SALUS_CUDA_RETURN(LaunchSegmentedReduce(plan.passes[i], plan.kind.op,
                                                  i == 0 ? plan.kind.input : ReduceInput::kPlain,
                                                  src, dst, temps + plan.temp_at, &bytes, stream),
                            what + ": CUB segmented reduction");
          src = dst;
        }
        SALUS_CUDA_RETURN(
            LaunchReduceFinish(plan.kind.finish, static_cast<float>(plan.layout.segment_len), y,
                               plan.out_count, stream),
            what + ": finishing the reduction");
        return OkStatus();
      },
      scratch));
}

}  // namespace

void RegisterBlasKernels(KernelRegistry* r) {
  const DeviceType cuda = DeviceType::kCuda;
  r->Register("Gemm", cuda, KernelFactory(Gemm));
  r->Register("MatMul", cuda, KernelFactory(MatMul));
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL1", "ReduceL2", "ReduceSumSquare"}) {
    r->Register(op, cuda, KernelFactory(Reduce));
  }
}

}  // namespace salus::exec::cuda
