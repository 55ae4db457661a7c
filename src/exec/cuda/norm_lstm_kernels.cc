// The CUDA device's LayerNormalization and LSTM, with the CPU's semantics (cpu_norm_kernels.cc,
// cpu_lstm_kernels.cc):
//   LayerNormalization  norm_lstm.cu's kernel, one block per row of X seen as [outer, inner]:
//                       mean and variance summed in double by a fixed tree (deterministic), the
//                       optional Mean and InvStdDev outputs written alongside.
//   LSTM                per direction, one cublasSgemm for the input projections of every step
//                       (X·W^T), then per step one cublasSgemm for the recurrent projection
//                       (h·R^T) and norm_lstm.cu's cell kernel (element_math.h's
//                       LstmCellForward, the biases added as the CPU adds them), which also
//                       writes Y; initial and final states by small copy kernels.
// Row-major data meets column-major cuBLAS through reduce_math.h's RowMajorGemm. Every size and
// offset is fixed when the kernel is built; Run only queues work on the context's stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "exec/alignment.h"
#include "exec/cpu_kernel_helpers.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cuda_util.h"
#include "exec/cuda/norm_lstm_launch.h"
#include "exec/cuda/reduce_math.h"
#include "exec/lstm.h"
#include "exec/shape_inference.h"

namespace salus::exec::cuda {
namespace {

using KernelOr = StatusOr<std::unique_ptr<Kernel>>;

// ---------------------------------------------------------------------------------------------
// LayerNormalization.

// X seen as [rows, inner] with the CPU's checks (LayerNormFor in shape_inference.h).
StatusOr<LayerNormGeometry> LayerNormGeometryFor(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(LayerNormSpec s, LayerNormFor(g, n));
  LayerNormGeometry geo;
  geo.rows = s.outer;
  geo.inner = s.inner;
  geo.epsilon = s.epsilon;
  return geo;
}

// Inputs (X, Scale, B?); outputs (Y, Mean?, InvStdDev?).
KernelOr LayerNorm(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_RETURN_IF_ERROR(RequireFloat(n, g));
  SALUS_ASSIGN_OR_RETURN(LayerNormGeometry geo, LayerNormGeometryFor(n, g));
  const bool bias = n.input(2) != kNoValue;
  const std::string what = n.Describe();
  return std::unique_ptr<Kernel>(new CudaFnKernel([geo, bias, what](const KernelArgs& a) {
    auto out = [&](size_t i) {
      return i < a.outputs.size() ? static_cast<float*>(a.outputs[i]) : nullptr;
    };
    return CudaStatus(LaunchLayerNorm(geo, static_cast<const float*>(a.inputs[0]),
                                      static_cast<const float*>(a.inputs[1]),
                                      bias ? static_cast<const float*>(a.inputs[2]) : nullptr,
                                      out(0), out(1), out(2), StreamOf(a)),
                      what);
  }));
}

// ---------------------------------------------------------------------------------------------
// LSTM.

// As blas_kernels.cc's Note [cuBLAS workspace]: the kernel's scratch starts with this much
// workspace, handed to the handle for the kernel's own cuBLAS calls only.
constexpr size_t kCublasWorkspaceBytes = size_t{4} << 20;

cublasOperation_t Op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

// cuBLAS's 32-bit API takes sizes and leading dims as int.
Status RequireInt(const Node& n, std::initializer_list<int64_t> values) {
  for (int64_t v : values) {
    if (v > INT_MAX) {
      return UnimplementedError(n.Describe() + ": a matrix dimension of " + std::to_string(v) +
                                " is more than cuBLAS's int");
    }
  }
  return OkStatus();
}

// Row-major C[m, n] = A[m, k] · B[n, k]^T (beta 0) with the leading dims of packed matrices.
Status SgemmTransB(cublasHandle_t h, const CublasGemmShape& s, const float* a, const float* b,
                   float* c, const std::string& what) {
  const float one = 1.f, zero = 0.f;
  return CublasStatus(cublasSgemm(h, Op(s.trans_first), Op(s.trans_second), static_cast<int>(s.m),
                                  static_cast<int>(s.n), static_cast<int>(s.k), &one, b,
                                  static_cast<int>(s.ld_first), a, static_cast<int>(s.ld_second),
                                  &zero, c, static_cast<int>(s.ld_out)),
                      what + ": cublasSgemm");
}

// Inputs (X, W, R, B, sequence_lens, initial_h, initial_c, P); outputs (Y, Y_h, Y_c).
// Scratch: the cuBLAS workspace, the input projections gx [seq * batch, 4H], the recurrent
// projection gh [batch, 4H], and the running states h and c [batch, H]; reused by each direction.
class LstmKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext*);
  size_t scratch_bytes() const override { return bytes_; }
  Status Run(const KernelArgs& a) override;

 private:
  LstmKernel(std::string what, const LstmSpec& s) : what_(std::move(what)), s_(s) {}
  float* At(const KernelArgs& a, size_t offset) const {
    return reinterpret_cast<float*>(static_cast<std::byte*>(a.scratch) + offset);
  }
  // The geometry of direction d.
  LstmGeometry GeometryOf(int64_t d) const;
  Status RunDirection(const KernelArgs& a, cublasHandle_t handle, int64_t d) const;

  std::string what_;
  LstmSpec s_;
  CublasGemmShape input_gemm_, recurrent_gemm_;
  size_t gx_ = 0, gh_ = 0, h_ = 0, c_ = 0, bytes_ = 0;
};

KernelOr LstmKernel::Create(const Node& n, const Graph& g, DeviceContext*) {
  // LstmForwardSpec checks the types (float) and refuses what the engine does not support.
  SALUS_ASSIGN_OR_RETURN(LstmSpec s, LstmForwardSpec(n, g));
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] == kNoValue) continue;
    const Shape want = i == 0 ? s.YShape() : s.StateShape();
    if (g.value(n.outputs[i]).shape != want) {
      return InvalidArgumentError(n.Describe() + ": output " + std::to_string(i) + " is " +
                                  ShapeString(g.value(n.outputs[i]).shape) + ", expected " +
                                  ShapeString(want));
    }
  }
  std::unique_ptr<LstmKernel> k(new LstmKernel(n.Describe(), s));
  const int64_t rows = s.seq * s.batch, g4 = 4 * s.hidden;
  k->input_gemm_ = RowMajorGemm(rows, g4, s.input, false, true);
  k->recurrent_gemm_ = RowMajorGemm(s.batch, g4, s.hidden, false, true);
  for (const CublasGemmShape& m : {k->input_gemm_, k->recurrent_gemm_}) {
    SALUS_RETURN_IF_ERROR(RequireInt(n, {m.m, m.n, m.k, m.ld_first, m.ld_second, m.ld_out}));
  }
  size_t at = kCublasWorkspaceBytes;
  auto add = [&at](int64_t floats) {
    const size_t offset = at;
    at += AlignUp(static_cast<uint64_t>(floats) * sizeof(float));
    return offset;
  };
  k->gx_ = add(rows * g4);
  k->gh_ = add(s.batch * g4);
  k->h_ = add(s.batch * s.hidden);
  k->c_ = add(s.batch * s.hidden);
  k->bytes_ = at;
  return std::unique_ptr<Kernel>(std::move(k));
}

LstmGeometry LstmKernel::GeometryOf(int64_t d) const {
  // LstmSpec's offsets are linear in their indices: bases and strides are differences.
  LstmGeometry geo;
  geo.batch = s_.batch;
  geo.hidden = s_.hidden;
  geo.row_t = s_.Row(1, 0) - s_.Row(0, 0);
  geo.row_b = s_.Row(0, 1) - s_.Row(0, 0);
  geo.y_base = s_.YOffset(0, d, 0);
  geo.y_t = s_.YOffset(1, d, 0) - geo.y_base;
  geo.y_b = s_.YOffset(0, d, 1) - geo.y_base;
  geo.state_base = s_.StateOffset(d, 0);
  geo.state_b = s_.StateOffset(d, 1) - geo.state_base;
  return geo;
}

Status LstmKernel::RunDirection(const KernelArgs& a, cublasHandle_t handle, int64_t d) const {
  cudaStream_t stream = StreamOf(a);
  auto in = [&](size_t i) {
    return i < a.inputs.size() ? static_cast<const float*>(a.inputs[i]) : nullptr;
  };
  auto out = [&](size_t i) {
    return i < a.outputs.size() ? static_cast<float*>(a.outputs[i]) : nullptr;
  };
  const int64_t hs = s_.hidden, g4 = 4 * hs, rows = s_.seq * s_.batch;
  const float* bias = s_.has_b ? in(3) : nullptr;
  const float* wb = bias != nullptr ? bias + d * 2 * g4 : nullptr;
  const float* rb = wb != nullptr ? wb + g4 : nullptr;
  float* gx = At(a, gx_);
  float* gh = At(a, gh_);
  float* h = At(a, h_);
  float* c = At(a, c_);
  const LstmGeometry geo = GeometryOf(d);

  if (rows > 0 && s_.input > 0) {
    SALUS_RETURN_IF_ERROR(
        SgemmTransB(handle, input_gemm_, in(0), in(1) + d * g4 * s_.input, gx, what_ + ": X·W^T"));
  } else if (rows > 0) {
    SALUS_CUDA_RETURN(cudaMemsetAsync(gx, 0, rows * g4 * sizeof(float), stream),
                      what_ + ": zeroing X·W^T");
  }
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, s_.has_h0 ? in(5) : nullptr, h, stream),
                    what_ + ": initial h");
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, s_.has_c0 ? in(6) : nullptr, c, stream),
                    what_ + ": initial c");
  const float* r = in(2) + d * g4 * hs;
  for (int64_t step = 0; step < s_.seq && s_.batch > 0; ++step) {
    const int64_t t = s_.Backwards(d) ? s_.seq - 1 - step : step;
    SALUS_RETURN_IF_ERROR(SgemmTransB(handle, recurrent_gemm_, h, r, gh, what_ + ": h·R^T"));
    SALUS_CUDA_RETURN(LaunchLstmCell(geo, t, gx, gh, wb, rb, h, c, out(0), stream),
                      what_ + ": cell");
  }
  if (out(1) != nullptr) {
    SALUS_CUDA_RETURN(LaunchLstmStoreState(geo, h, out(1), stream), what_ + ": Y_h");
  }
  if (out(2) != nullptr) {
    SALUS_CUDA_RETURN(LaunchLstmStoreState(geo, c, out(2), stream), what_ + ": Y_c");
  }
  return OkStatus();
}

Status LstmKernel::Run(const KernelArgs& a) {
  if (s_.hidden == 0 || s_.batch == 0) return OkStatus();  // every output is empty
  cublasHandle_t handle = CublasOf(a);
  // As blas_kernels.cc's WithWorkspace: host scalars, and the scratch as the handle's workspace
  // for these calls only (Note [cuBLAS workspace]).
  SALUS_CUBLAS_RETURN(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST),
                      what_ + ": cuBLAS pointer mode");
  SALUS_CUBLAS_RETURN(cublasSetWorkspace(handle, a.scratch, kCublasWorkspaceBytes),
                      what_ + ": cuBLAS workspace");
  Status done = OkStatus();
  for (int64_t d = 0; d < s_.dirs && done.ok(); ++d) done = RunDirection(a, handle, d);
  const Status reset =
      CublasStatus(cublasSetWorkspace(handle, nullptr, 0), what_ + ": cuBLAS workspace reset");
  SALUS_RETURN_IF_ERROR(done);
  return reset;
}

}  // namespace

void RegisterNormLstmKernels(KernelRegistry* registry) {
  const DeviceType cuda = DeviceType::kCuda;
  registry->Register("LayerNormalization", cuda, KernelFactory(&LayerNorm));
  registry->Register("LSTM", cuda, KernelFactory(&LstmKernel::Create));
}

}  // namespace salus::exec::cuda
