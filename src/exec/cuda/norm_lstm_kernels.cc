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
//   SalusLstmGrad       the CPU's loop kernel on cuBLAS and norm_lstm.cu's kernels (Note [LSTM
//                       backward on cuda]).
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
#include "exec/scratch_layout.h"
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
    return CudaStatus(LaunchLayerNorm(geo, static_cast<const float*>(a.inputs[0]),
                                      static_cast<const float*>(a.inputs[1]),
                                      bias ? static_cast<const float*>(a.inputs[2]) : nullptr,
                                      FloatOut(a, 0), FloatOut(a, 1), FloatOut(a, 2), StreamOf(a)),
                      what);
  }));
}

// ---------------------------------------------------------------------------------------------
// LSTM.

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

// Row-major C[m, n] = op(A)·op(B) + beta·C, as cpu_lstm_kernels.cc's Sgemm: A is [m, k] ([k, m]
// when trans_a) with rows lda floats apart, B [k, n] ([n, k] when trans_b) with ldb, C with ldc
// (packed, n, where k is 0). Sizes were checked against cuBLAS's int when the kernel was built.
Status Sgemm(cublasHandle_t h, cudaStream_t stream, const std::string& what, bool trans_a,
             bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
             const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return OkStatus();
  if (k == 0) {  // an empty sum: C = beta·C
    if (beta != 0.f) return OkStatus();
    SALUS_CUDA_RETURN(cudaMemsetAsync(c, 0, m * n * sizeof(float), stream), what + ": zeroing");
    return OkStatus();
  }
  const float one = 1.f;
  return CublasStatus(
      cublasSgemm(h, Op(trans_b), Op(trans_a), static_cast<int>(n), static_cast<int>(m),
                  static_cast<int>(k), &one, b, static_cast<int>(ldb), a, static_cast<int>(lda),
                  &beta, c, static_cast<int>(ldc)),
      what + ": cublasSgemm");
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

// The geometry of direction d of `s`. LstmSpec's offsets are linear in their indices: bases and
// strides are differences.
LstmGeometry GeometryOf(const LstmSpec& s, int64_t d) {
  LstmGeometry geo;
  geo.batch = s.batch;
  geo.hidden = s.hidden;
  geo.row_t = s.Row(1, 0) - s.Row(0, 0);
  geo.row_b = s.Row(0, 1) - s.Row(0, 0);
  geo.y_base = s.YOffset(0, d, 0);
  geo.y_t = s.YOffset(1, d, 0) - geo.y_base;
  geo.y_b = s.YOffset(0, d, 1) - geo.y_base;
  geo.state_base = s.StateOffset(d, 0);
  geo.state_b = s.StateOffset(d, 1) - geo.state_base;
  return geo;
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
  ScratchLayout plan(kCublasWorkspaceBytes);
  k->gx_ = plan.Add(rows * g4);
  k->gh_ = plan.Add(s.batch * g4);
  k->h_ = plan.Add(s.batch * s.hidden);
  k->c_ = plan.Add(s.batch * s.hidden);
  k->bytes_ = plan.bytes();
  return std::unique_ptr<Kernel>(std::move(k));
}

Status LstmKernel::RunDirection(const KernelArgs& a, cublasHandle_t handle, int64_t d) const {
  cudaStream_t stream = StreamOf(a);
  const int64_t hs = s_.hidden, g4 = 4 * hs, rows = s_.seq * s_.batch;
  const float* bias = s_.has_b ? FloatIn(a, 3) : nullptr;
  const float* wb = bias != nullptr ? bias + d * 2 * g4 : nullptr;
  const float* rb = wb != nullptr ? wb + g4 : nullptr;
  float* gx = ScratchLayout::At(a.scratch, gx_);
  float* gh = ScratchLayout::At(a.scratch, gh_);
  float* h = ScratchLayout::At(a.scratch, h_);
  float* c = ScratchLayout::At(a.scratch, c_);
  const LstmGeometry geo = GeometryOf(s_, d);

  if (rows > 0 && s_.input > 0) {
    SALUS_RETURN_IF_ERROR(SgemmTransB(handle, input_gemm_, FloatIn(a, 0),
                                      FloatIn(a, 1) + d * g4 * s_.input, gx, what_ + ": X·W^T"));
  } else if (rows > 0) {
    SALUS_CUDA_RETURN(cudaMemsetAsync(gx, 0, rows * g4 * sizeof(float), stream),
                      what_ + ": zeroing X·W^T");
  }
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, s_.has_h0 ? FloatIn(a, 5) : nullptr, h, stream),
                    what_ + ": initial h");
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, s_.has_c0 ? FloatIn(a, 6) : nullptr, c, stream),
                    what_ + ": initial c");
  const float* r = FloatIn(a, 2) + d * g4 * hs;
  for (int64_t step = 0; step < s_.seq && s_.batch > 0; ++step) {
    const int64_t t = s_.Backwards(d) ? s_.seq - 1 - step : step;
    SALUS_RETURN_IF_ERROR(SgemmTransB(handle, recurrent_gemm_, h, r, gh, what_ + ": h·R^T"));
    SALUS_CUDA_RETURN(LaunchLstmCell(geo, t, gx, gh, wb, rb, h, c, FloatOut(a, 0), stream),
                      what_ + ": cell");
  }
  if (FloatOut(a, 1) != nullptr) {
    SALUS_CUDA_RETURN(LaunchLstmStoreState(geo, h, FloatOut(a, 1), stream), what_ + ": Y_h");
  }
  if (FloatOut(a, 2) != nullptr) {
    SALUS_CUDA_RETURN(LaunchLstmStoreState(geo, c, FloatOut(a, 2), stream), what_ + ": Y_c");
  }
  return OkStatus();
}

Status LstmKernel::Run(const KernelArgs& a) {
  if (s_.hidden == 0 || s_.batch == 0) return OkStatus();  // every output is empty
  return WithCublasWorkspace(a, what_, [&](cublasHandle_t handle) {
    for (int64_t d = 0; d < s_.dirs; ++d) SALUS_RETURN_IF_ERROR(RunDirection(a, handle, d));
    return OkStatus();
  });
}

// Note [LSTM backward on cuda]
// The CPU's loop kernel (Note [LSTM backward]) step for step, per direction: the forward is
// recomputed into the scratch (X·W^T for every step at once, then per step h·R^T and
// LaunchLstmCellTrain, whose cell math is the forward kernel's, keeping every step's activated
// gates in `act`, cell state in `cs` and previous hidden state in `hp`); the steps are then
// walked backwards (LaunchLstmCellBackward, then dh = dG_t·R over the rows of time t, `ldz`
// floats apart); dX (accumulated over directions), dW and dR are one cublasSgemm each over
// every step's dG, and dB a column sum in double. Scratch: the cuBLAS workspace, act
// [rows, 4H], cs and hp [rows, H], gh [batch, 4H], and h, c, dh, dc [batch, H]; reused by each
// direction.
//
// Inputs (X, W, R, B, initial_h, initial_c, dY, dY_h, dY_c); outputs (dX, dW, dR, dB,
// d_initial_h, d_initial_c), each absent where not needed.
class LstmGradKernel final : public Kernel {
 public:
  static KernelOr Create(const Node& n, const Graph& g, DeviceContext*);
  size_t scratch_bytes() const override { return bytes_; }
  Status Run(const KernelArgs& a) override;

 private:
  LstmGradKernel(std::string what, const LstmSpec& s) : what_(std::move(what)), s_(s) {}
  Status RunDirection(const KernelArgs& a, cublasHandle_t handle, int64_t d) const;

  std::string what_;
  LstmSpec s_;
  CublasGemmShape input_gemm_, recurrent_gemm_;
  size_t act_ = 0, cs_ = 0, hp_ = 0, gh_ = 0, h_ = 0, c_ = 0, dh_ = 0, dc_ = 0, bytes_ = 0;
};

KernelOr LstmGradKernel::Create(const Node& n, const Graph& g, DeviceContext*) {
  SALUS_ASSIGN_OR_RETURN(LstmSpec s, LstmGradSpec(n, g));
  std::unique_ptr<LstmGradKernel> k(new LstmGradKernel(n.Describe(), s));
  const int64_t rows = s.seq * s.batch, g4 = 4 * s.hidden;
  k->input_gemm_ = RowMajorGemm(rows, g4, s.input, false, true);
  k->recurrent_gemm_ = RowMajorGemm(s.batch, g4, s.hidden, false, true);
  const int64_t ldz = GeometryOf(s, 0).row_b * g4;  // the BPTT product's row stride
  SALUS_RETURN_IF_ERROR(RequireInt(n, {rows, g4, s.input, s.hidden, s.batch, ldz}));
  ScratchLayout plan(kCublasWorkspaceBytes);
  k->act_ = plan.Add(rows * g4);
  k->cs_ = plan.Add(rows * s.hidden);
  k->hp_ = plan.Add(rows * s.hidden);
  k->gh_ = plan.Add(s.batch * g4);
  for (size_t* buffer : {&k->h_, &k->c_, &k->dh_, &k->dc_}) *buffer = plan.Add(s.batch * s.hidden);
  k->bytes_ = plan.bytes();
  return std::unique_ptr<Kernel>(std::move(k));
}

Status LstmGradKernel::RunDirection(const KernelArgs& a, cublasHandle_t handle, int64_t d) const {
  cudaStream_t stream = StreamOf(a);
  const int64_t hs = s_.hidden, g4 = 4 * hs, rows = s_.seq * s_.batch, input = s_.input;
  const float* x = FloatIn(a, 0);
  const float* w = FloatIn(a, 1) + d * g4 * input;
  const float* r = FloatIn(a, 2) + d * g4 * hs;
  const float* wb = s_.has_b ? FloatIn(a, 3) + d * 2 * g4 : nullptr;
  const float* rb = wb != nullptr ? wb + g4 : nullptr;
  const float* h0 = s_.has_h0 ? FloatIn(a, 4) : nullptr;
  const float* c0 = s_.has_c0 ? FloatIn(a, 5) : nullptr;
  float* act = ScratchLayout::At(a.scratch, act_);
  float* cs = ScratchLayout::At(a.scratch, cs_);
  float* hp = ScratchLayout::At(a.scratch, hp_);
  float* gh = ScratchLayout::At(a.scratch, gh_);
  float* h = ScratchLayout::At(a.scratch, h_);
  float* c = ScratchLayout::At(a.scratch, c_);
  float* dh = ScratchLayout::At(a.scratch, dh_);
  float* dc = ScratchLayout::At(a.scratch, dc_);
  const LstmGeometry geo = GeometryOf(s_, d);
  const int64_t ldz = geo.row_b * g4;
  auto time_of = [&](int64_t step) { return s_.Backwards(d) ? s_.seq - 1 - step : step; };

  // The forward, again.
  if (rows > 0 && input > 0) {
    SALUS_RETURN_IF_ERROR(SgemmTransB(handle, input_gemm_, x, w, act, what_ + ": X·W^T"));
  } else if (rows > 0) {
    SALUS_CUDA_RETURN(cudaMemsetAsync(act, 0, rows * g4 * sizeof(float), stream),
                      what_ + ": zeroing X·W^T");
  }
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, h0, h, stream), what_ + ": initial h");
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, c0, c, stream), what_ + ": initial c");
  for (int64_t step = 0; step < s_.seq && s_.batch > 0; ++step) {
    SALUS_RETURN_IF_ERROR(SgemmTransB(handle, recurrent_gemm_, h, r, gh, what_ + ": h·R^T"));
    SALUS_CUDA_RETURN(
        LaunchLstmCellTrain(geo, time_of(step), act, gh, wb, rb, h, c, hp, cs, stream),
        what_ + ": cell");
  }

  // Backpropagation through time.
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, FloatIn(a, 7), dh, stream), what_ + ": dY_h");
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, FloatIn(a, 8), dc, stream), what_ + ": dY_c");
  SALUS_CUDA_RETURN(LaunchLstmLoadState(geo, c0, c, stream), what_ + ": initial c");
  for (int64_t step = s_.seq - 1; step >= 0 && s_.batch > 0; --step) {
    const int64_t t = time_of(step);
    SALUS_CUDA_RETURN(LaunchLstmCellBackward(geo, t, step > 0 ? time_of(step - 1) : -1, act, cs, c,
                                             FloatIn(a, 6), dh, dc, stream),
                      what_ + ": cell gradient");
    SALUS_RETURN_IF_ERROR(Sgemm(handle, stream, what_ + ": dG·R", false, false, s_.batch, hs, g4,
                                act + t * geo.row_t * g4, ldz, r, hs, 0.f, dh, hs));
  }
  if (FloatOut(a, 4) != nullptr) {
    SALUS_CUDA_RETURN(LaunchLstmStoreState(geo, dh, FloatOut(a, 4), stream),
                      what_ + ": d_initial_h");
  }
  if (FloatOut(a, 5) != nullptr) {
    SALUS_CUDA_RETURN(LaunchLstmStoreState(geo, dc, FloatOut(a, 5), stream),
                      what_ + ": d_initial_c");
  }

  // The gradients of X, W, R and B over every step at once.
  if (FloatOut(a, 0) != nullptr) {
    SALUS_RETURN_IF_ERROR(Sgemm(handle, stream, what_ + ": dX", false, false, rows, input, g4, act,
                                g4, w, input, d == 0 ? 0.f : 1.f, FloatOut(a, 0), input));
  }
  if (FloatOut(a, 1) != nullptr) {
    SALUS_RETURN_IF_ERROR(Sgemm(handle, stream, what_ + ": dW", true, false, g4, input, rows, act,
                                g4, x, input, 0.f, FloatOut(a, 1) + d * g4 * input, input));
  }
  if (FloatOut(a, 2) != nullptr) {
    SALUS_RETURN_IF_ERROR(Sgemm(handle, stream, what_ + ": dR", true, false, g4, hs, rows, act, g4,
                                hp, hs, 0.f, FloatOut(a, 2) + d * g4 * hs, hs));
  }
  if (FloatOut(a, 3) != nullptr) {
    SALUS_CUDA_RETURN(LaunchLstmBiasGrad(rows, g4, act, FloatOut(a, 3) + d * 2 * g4, stream),
                      what_ + ": dB");
  }
  return OkStatus();
}

Status LstmGradKernel::Run(const KernelArgs& a) {
  if (s_.hidden == 0) return OkStatus();  // every output is empty
  return WithCublasWorkspace(a, what_, [&](cublasHandle_t handle) {
    for (int64_t d = 0; d < s_.dirs; ++d) SALUS_RETURN_IF_ERROR(RunDirection(a, handle, d));
    return OkStatus();
  });
}

}  // namespace

void RegisterNormLstmKernels(KernelRegistry* registry) {
  const DeviceType cuda = DeviceType::kCuda;
  registry->Register("LayerNormalization", cuda, KernelFactory(&LayerNorm));
  registry->Register("LSTM", cuda, KernelFactory(&LstmKernel::Create));
  registry->Register("SalusLstmGrad", cuda, KernelFactory(&LstmGradKernel::Create));
}

}  // namespace salus::exec::cuda
