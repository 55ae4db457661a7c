// Index math of the CUDA device's cuBLAS and CUB kernels (blas_kernels.cc, reduce.cu): how a
// reduction is laid out as contiguous segments, how Gemm's C broadcasts over Y, and how a
// row-major Gemm or batched MatMul maps onto column-major cuBLAS calls. Host tests run exactly
// this code over the CPU executable's results (tests/unit/exec/reduce_math_test.cc), so the
// layout is verified on machines without a GPU.
//
// Reductions (Note [Reduction layout]): size-1 dims are dropped and adjacent dims that are both
// reduced or both kept are merged. If the reduced dims are then the innermost, the input already
// is `segments` contiguous runs of `segment_len` elements, one per output element, in output
// order. Otherwise the input is first permuted (kept dims first, reduced dims last, each in their
// own order) into scratch. Each run is reduced by CUB's segmented reduction. A run that is long
// while the runs are few would leave most of the GPU idle (CUB reduces a segment with one thread
// block), so such runs are cut into chunks of kReduceChunk elements, reduced in several passes:
// the first pass reduces chunks into partial results, the next pass reduces each run's partials,
// and so on. The plan depends only on the shapes, so the order of every floating-point operation
// is fixed: results are deterministic.
//
// C++17 with no project header beyond hd.h: nvcc compiles reduce.cu, which includes this.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/hd.h"

namespace salus::exec::cuda {

// The most dims a permuted reduction input may have once size-1 dims are dropped and like dims
// merged (kept and reduced dims alternate, so this allows 4 of each).
inline constexpr int kMaxReduceDims = 8;
// Elements one CUB segment (one thread block) reduces when a run is cut into chunks: 16 KiB of
// floats, a few tiles of CUB's reduction blocks.
inline constexpr int64_t kReduceChunk = 4096;
// Runs are cut into chunks only when there are fewer than this many of them: from about eight
// blocks per SM of the largest GPUs on, one block per run fills the GPU.
inline constexpr int64_t kFewSegments = 1024;

// The combining operation, what the first pass applies to each input element, and what is done
// to each result at the end.
enum class ReduceOp : int32_t { kSum, kMax, kMin, kProd };
enum class ReduceInput : int32_t { kPlain, kAbs, kSquare };
enum class ReduceFinish : int32_t { kNone, kDivide, kSqrt };

struct ReduceKind {
  ReduceOp op = ReduceOp::kSum;
  ReduceInput input = ReduceInput::kPlain;
  ReduceFinish finish = ReduceFinish::kNone;  // kDivide: by the number of reduced elements
};

// The kind of an ONNX reduction op; false for any other op.
inline bool ReduceKindFor(const std::string& op, ReduceKind* kind) {
  *kind = ReduceKind{};
  if (op == "ReduceSum") return true;
  if (op == "ReduceMean") {
    kind->finish = ReduceFinish::kDivide;
    return true;
  }
  if (op == "ReduceMax" || op == "ReduceMin" || op == "ReduceProd") {
    kind->op = op == "ReduceMax"   ? ReduceOp::kMax
               : op == "ReduceMin" ? ReduceOp::kMin
                                   : ReduceOp::kProd;
    return true;
  }
  if (op == "ReduceL1") {
    kind->input = ReduceInput::kAbs;
    return true;
  }
  if (op == "ReduceL2" || op == "ReduceSumSquare") {
    kind->input = ReduceInput::kSquare;
    if (op == "ReduceL2") kind->finish = ReduceFinish::kSqrt;
    return true;
  }
  return false;
}

// What a reduction over nothing (every reduced dim of size 1, or no reduced dim) computes for
// each element, as the CPU does: the value itself, or its absolute value (L1, and L2's
// sqrt(x * x)), or its square.
inline ReduceInput NoReductionMap(const ReduceKind& kind) {
  if (kind.finish == ReduceFinish::kSqrt) return ReduceInput::kAbs;
  return kind.input;
}

// Whether reducing `axes` (sorted, in range) of x changes nothing: the CPU's test, the reduced
// shape with keepdims equal to x's.
inline bool ReducesNothing(const std::vector<int64_t>& x, const std::vector<int64_t>& axes) {
  for (int64_t a : axes) {
    if (x[a] != 1) return false;
  }
  return true;
}

// y[o] = x[PermuteSource(p, o)] for every element o of y: y's dims are `out`, and output dim d
// advances x by in_stride[d] elements.
struct PermuteGeometry {
  int32_t rank = 0;
  int64_t out[kMaxReduceDims] = {};
  int64_t in_stride[kMaxReduceDims] = {};
};

SALUS_HD int64_t PermuteSource(const PermuteGeometry& p, int64_t o) {
  int64_t src = 0;
  for (int d = p.rank - 1; d >= 0; --d) {
    src += (o % p.out[d]) * p.in_stride[d];
    o /= p.out[d];
  }
  return src;
}

inline int64_t PermuteCount(const PermuteGeometry& p) {
  int64_t n = 1;
  for (int d = 0; d < p.rank; ++d) n *= p.out[d];
  return n;
}

// Note [Reduction layout] in the file comment.
struct ReduceLayout {
  bool permute = false;  // whether the input must first be permuted by `perm`
  PermuteGeometry perm;
  int64_t segments = 1;     // runs, = output elements
  int64_t segment_len = 1;  // elements of each run, = the number of reduced elements
};

// The layout reducing `axes` (sorted, distinct, in range) of a tensor of dims x. False when the
// permutation would need more than kMaxReduceDims dims.
inline bool MakeReduceLayout(const std::vector<int64_t>& x, const std::vector<int64_t>& axes,
                             ReduceLayout* layout) {
  *layout = ReduceLayout{};
  std::vector<bool> reduced(x.size(), false);
  for (int64_t a : axes) reduced[a] = true;
  bool empty = false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (reduced[i]) {
      layout->segment_len *= x[i];
    } else {
      layout->segments *= x[i];
    }
    empty = empty || x[i] == 0;
  }
  // Nothing to move in an empty tensor: its runs (if any) are empty.
  if (empty) return true;
  struct Group {
    int64_t size;
    bool reduced;
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == 1) continue;
    if (!groups.empty() && groups.back().reduced == reduced[i]) {
      groups.back().size *= x[i];
    } else {
      groups.push_back({x[i], reduced[i]});
    }
  }
  // Already kept-then-reduced: at most one kept group followed by at most one reduced group.
  const bool in_place = groups.size() <= 1 || (groups.size() == 2 && !groups[0].reduced);
  if (in_place) return true;
  if (groups.size() > static_cast<size_t>(kMaxReduceDims)) return false;
  std::vector<int64_t> stride(groups.size(), 1);
  for (int i = static_cast<int>(groups.size()) - 2; i >= 0; --i) {
    stride[i] = stride[i + 1] * groups[i + 1].size;
  }
  layout->permute = true;
  PermuteGeometry& p = layout->perm;
  for (bool want_reduced : {false, true}) {
    for (size_t i = 0; i < groups.size(); ++i) {
      if (groups[i].reduced != want_reduced) continue;
      p.out[p.rank] = groups[i].size;
      p.in_stride[p.rank] = stride[i];
      ++p.rank;
    }
  }
  return true;
}

// One pass of a reduction: its input is `segments` contiguous runs of `len` elements, each cut
// into chunks of `chunk` elements (the last one possibly shorter); its output holds one value
// per chunk, run by run: Chunks(p) values per run. An empty run counts as one empty chunk, which
// CUB reduces to the operation's identity.
struct ReducePass {
  int64_t segments = 0;
  int64_t len = 0;
  int64_t chunk = 1;
};

SALUS_HD int64_t ChunksPerSegment(const ReducePass& p) {
  const int64_t c = (p.len + p.chunk - 1) / p.chunk;
  return c > 0 ? c : 1;
}
SALUS_HD int64_t PassOutputs(const ReducePass& p) { return p.segments * ChunksPerSegment(p); }
// The input elements [ChunkBegin, ChunkEnd) that output value i of the pass reduces.
SALUS_HD int64_t ChunkBegin(const ReducePass& p, int64_t i) {
  const int64_t per = ChunksPerSegment(p);
  return (i / per) * p.len + (i % per) * p.chunk;
}
SALUS_HD int64_t ChunkEnd(const ReducePass& p, int64_t i) {
  const int64_t per = ChunksPerSegment(p);
  const int64_t end = ChunkBegin(p, i) + p.chunk;
  const int64_t segment_end = (i / per + 1) * p.len;
  return end < segment_end ? end : segment_end;
}

// The passes reducing `segments` runs of `len` elements to one value each (the file comment).
inline std::vector<ReducePass> PlanReducePasses(int64_t segments, int64_t len) {
  std::vector<ReducePass> passes;
  while (true) {
    ReducePass p{segments, len, std::max<int64_t>(len, 1)};
    if (segments < kFewSegments && len > kReduceChunk) p.chunk = kReduceChunk;
    passes.push_back(p);
    if (ChunksPerSegment(p) == 1) return passes;
    len = ChunksPerSegment(p);
  }
}

// Gemm's C broadcast to Y [m, n] (unidirectional, as ONNX defines it): C may be a scalar, [n],
// [1, n], [m, 1], [m, n], [1] or [1, 1]; Y's element e reads C's element GemmBiasSource(b, e).
struct GemmBias {
  int64_t m = 0, n = 0;
  int64_t row_stride = 0, col_stride = 0;  // elements of C per row and column of Y
};

SALUS_HD int64_t GemmBiasSource(const GemmBias& b, int64_t e) {
  return (e / b.n) * b.row_stride + (e % b.n) * b.col_stride;
}

// C's dims (rank 0 to 2, already checked to broadcast to [m, n]).
inline GemmBias MakeGemmBias(const std::vector<int64_t>& c, int64_t m, int64_t n) {
  GemmBias b;
  b.m = m;
  b.n = n;
  const int64_t rows = c.size() == 2 ? c[0] : 1;
  const int64_t cols = c.empty() ? 1 : c.back();
  b.row_stride = rows == 1 ? 0 : cols;
  b.col_stride = cols == 1 ? 0 : 1;
  return b;
}

// cuBLAS is column-major: a row-major [r, c] matrix is, to it, the column-major [c, r] matrix of
// the same bytes, its transpose. So row-major Y[M, N] = op(A) op(B) is computed as the
// column-major Y^T = op(B)^T op(A)^T: cuBLAS's first operand is B and its second A, with
// cuBLAS's m = N, n = M, and each operand transposed (to cuBLAS) exactly when it is in the
// ONNX op. The leading dims are the row lengths of the row-major matrices as stored.
struct CublasGemmShape {
  bool trans_first = false, trans_second = false;   // cuBLAS's transa (on B), transb (on A)
  int64_t m = 0, n = 0, k = 0;                      // N, M, K
  int64_t ld_first = 1, ld_second = 1, ld_out = 1;  // of B, A and Y
};

// Y[M, N] = op(A) op(B) with A [M, K] ([K, M] when trans_a) and B [K, N] ([N, K] when trans_b),
// all row-major. Leading dims are at least 1, as cuBLAS requires even of empty matrices.
inline CublasGemmShape RowMajorGemm(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  CublasGemmShape s;
  s.trans_first = trans_b;
  s.trans_second = trans_a;
  s.m = n;
  s.n = m;
  s.k = k;
  s.ld_first = std::max<int64_t>(trans_b ? k : n, 1);
  s.ld_second = std::max<int64_t>(trans_a ? m : k, 1);
  s.ld_out = std::max<int64_t>(n, 1);
  return s;
}

// A MatMul (numpy semantics) as cuBLAS calls: `outer` strided-batched calls of `inner` products
// [m, k] x [k, n] each. Batch dims of size 1 in the output are dropped; the innermost batch dims
// over which each operand is either wholly present or wholly broadcast form the inner batch, so
// consecutive inner batches are a_stride and b_stride elements apart (0 when broadcast); the
// remaining outer batches are looped over on the host, each operand's start found from its
// strides over the outer dims (0 on a broadcast dim). Output batches are contiguous: outer batch
// o starts at element o * inner * m * n of Y.
struct MatMulLayout {
  int64_t m = 0, n = 0, k = 0;
  int64_t outer = 1, inner = 1;
  int64_t a_stride = 0, b_stride = 0;
  std::vector<int64_t> outer_dims, a_outer_strides, b_outer_strides;

  // The first elements of A and B of outer batch `o`.
  void OuterOffsets(int64_t o, int64_t* a, int64_t* b) const {
    *a = 0;
    *b = 0;
    for (int d = static_cast<int>(outer_dims.size()) - 1; d >= 0; --d) {
      const int64_t i = o % outer_dims[d];
      o /= outer_dims[d];
      *a += i * a_outer_strides[d];
      *b += i * b_outer_strides[d];
    }
  }
};

// a and b as the op gets them (rank >= 1 each; their batch dims broadcast, their inner dims
// agree: shape inference has checked).
inline MatMulLayout MakeMatMulLayout(std::vector<int64_t> a, std::vector<int64_t> b) {
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const size_t rank = std::max(a.size(), b.size());
  while (a.size() < rank) a.insert(a.begin(), 1);
  while (b.size() < rank) b.insert(b.begin(), 1);
  MatMulLayout l;
  l.m = a[rank - 2];
  l.k = a[rank - 1];
  l.n = b[rank - 1];
  // Each operand's batch dims and element strides, size-1 output dims dropped.
  struct Dim {
    int64_t size;
    bool a_full, b_full;
    int64_t a_stride, b_stride;
  };
  std::vector<Dim> dims;
  int64_t a_step = l.m * l.k, b_step = l.k * l.n;
  for (int i = static_cast<int>(rank) - 3; i >= 0; --i) {
    const int64_t size = std::max(a[i], b[i]);
    if (size != 1) {
      dims.insert(dims.begin(),
                  {size, a[i] != 1, b[i] != 1, a[i] != 1 ? a_step : 0, b[i] != 1 ? b_step : 0});
    }
    a_step *= a[i];
    b_step *= b[i];
  }
  // The inner batch: the longest run of innermost dims over which each operand is either
  // present on every dim or broadcast on every dim.
  size_t first_inner = dims.size();
  while (first_inner > 0) {
    const Dim& d = dims[first_inner - 1];
    const Dim* last = first_inner < dims.size() ? &dims.back() : nullptr;
    if (last != nullptr && (d.a_full != last->a_full || d.b_full != last->b_full)) break;
    --first_inner;
  }
  for (size_t i = first_inner; i < dims.size(); ++i) l.inner *= dims[i].size;
  if (first_inner < dims.size()) {
    l.a_stride = dims.back().a_full ? l.m * l.k : 0;
    l.b_stride = dims.back().b_full ? l.k * l.n : 0;
  }
  for (size_t i = 0; i < first_inner; ++i) {
    l.outer *= dims[i].size;
    l.outer_dims.push_back(dims[i].size);
    l.a_outer_strides.push_back(dims[i].a_stride);
    l.b_outer_strides.push_back(dims[i].b_stride);
  }
  return l;
}

// Whether each outer batch is better run as one product of inner * m rows: B is broadcast over
// the inner batches and A present on them, so A's inner batches are consecutive rows of one
// [inner * m, k] matrix, and Y's of one [inner * m, n] matrix.
inline bool FoldsInnerBatch(const MatMulLayout& l) {
  return l.inner > 1 && l.b_stride == 0 && l.a_stride != 0;
}

// The cuBLAS calls of a MatMul: per outer batch, `batch` strided products of `gemm`'s shape.
// `a` and `b` are the shapes the product reads; `ta` / `tb` say that an operand is stored with
// its last two dims swapped (Note [Transposed operands] in exec/fusion.h). Its batches are as
// far apart either way; a transposed A's inner batches are no longer rows of one matrix, so
// they are not folded.
struct MatMulPlan {
  MatMulLayout layout;
  bool fold = false;
  CublasGemmShape gemm;
  int64_t batch = 1;
};

inline MatMulPlan MakeMatMulPlan(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                 bool ta, bool tb) {
  MatMulPlan p;
  p.layout = MakeMatMulLayout(a, b);
  const MatMulLayout& l = p.layout;
  p.fold = FoldsInnerBatch(l) && !ta;
  p.gemm = RowMajorGemm(p.fold ? l.inner * l.m : l.m, l.n, l.k, ta, tb);
  p.batch = p.fold ? 1 : l.inner;
  return p;
}

}  // namespace salus::exec::cuda
