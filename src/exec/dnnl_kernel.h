// Building blocks of the CPU kernels: a kernel made of oneDNN primitives and a kernel made of
// a plain loop.
//
// Note [Blocked layouts]: convolutions (forward and both backward) are created with
// format_tag::any, so oneDNN picks its fastest (blocked) layouts; the kernel reorders from and
// to the graph's row-major tensors around them, in planned temp buffers. In inference on the
// CPU, a value produced by a Conv and read only by Convs (as X, or as the other operand of a
// fused sum) stays in the channel-blocked layout (nChw16c with AVX-512, nChw8c otherwise)
// between them: the producer writes it and the consumers read it without a reorder
// (KeepBlockedLayouts in fusion.h; the Convs' `dst_block`/`src_block` attributes). Only values
// whose channels are a whole number of blocks are kept so, so they take the bytes of their
// row-major form. Every other op works on row-major tensors.
//
// Note [oneDNN memory]: every primitive is created at compile time with plain (row-major)
// memory descriptors, `scratchpad_mode::user` and memory objects that own no buffer. At run
// time the kernel points those memory objects at the addresses the executable resolved for
// this iteration (inputs, outputs, and its planned scratch, which holds the primitives'
// scratchpads and any temporary buffers between primitives), so oneDNN allocates nothing.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "common/check.h"
#include "exec/alignment.h"
#include "exec/kernel.h"
#include "exec/tensor.h"

namespace salus::exec {

// The CPU engine and the calling thread's stream.
dnnl::engine& CpuEngine();
dnnl::stream& CpuStream();

// Row-major float32 (or `type`) descriptor; a scalar is described as [1].
dnnl::memory::desc PlainDesc(const Shape& shape, DataType type = DataType::kFloat32);
dnnl::memory::desc StridedDesc(const Shape& dims, const Shape& strides);
// Dense row-major strides of a shape.
Shape DenseStrides(const Shape& shape);
// An attribute with user-managed scratchpad.
dnnl::primitive_attr UserScratchpad();

// Where a primitive argument points at run time.
struct Slot {
  enum class Kind { kInput, kOutput, kTemp, kScratchpad };
  Kind kind;
  size_t index = 0;  // input/output index, or byte offset of a temp buffer in scratch
  static Slot In(size_t i) { return {Kind::kInput, i}; }
  static Slot Out(size_t i) { return {Kind::kOutput, i}; }
  static Slot Temp(size_t offset) { return {Kind::kTemp, offset}; }
  static Slot Pad() { return {Kind::kScratchpad, 0}; }
};

class DnnlKernel : public Kernel {
 public:
  struct Binding {
    int arg;
    dnnl::memory::desc desc;
    Slot slot;
  };
  using Loop = std::function<void(const KernelArgs& args, std::byte* scratch)>;

  // A temporary buffer in this kernel's scratch; returns its byte offset.
  size_t AddTemp(size_t bytes);
  // Appends a primitive; its scratchpad (queried from `scratchpad_bytes`) is bound to
  // DNNL_ARG_SCRATCHPAD automatically.
  void AddPrimitive(dnnl::primitive primitive, std::vector<Binding> bindings,
                    size_t scratchpad_bytes);
  // Appends a plain loop step (runs in order with the primitives).
  void AddLoop(Loop loop);

  // Layout adaptation for primitives created with format_tag::any (Note [Blocked layouts]).
  // The binding for argument `arg` of the next primitive, whose data the caller has in layout
  // `user` at `slot` while the primitive wants `want`: when they differ, an input is first
  // reordered into a temp buffer (a reorder step is appended now), and an output is written to
  // a temp buffer and reordered to `slot` right after the next AddPrimitive.
  Binding Input(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& want, Slot slot);
  Binding Output(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& want,
                 Slot slot);
  // Output() for a destination the next primitive accumulates into (a sum post-op): it first
  // holds a copy of input `init` (layout `user`), reordered into the temp buffer or copied to
  // `slot` (Note [Fused residual sum] in fusion.cc).
  Binding Seed(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& want, Slot init,
               Slot slot);

  size_t scratch_bytes() const override { return temp_bytes_ + scratchpad_bytes_; }
  Status Run(const KernelArgs& args) override;

 private:
  struct Step {
    dnnl::primitive primitive;
    std::unordered_map<int, dnnl::memory> memories;
    std::vector<std::pair<int, Slot>> slots;
    Loop loop;
  };
  void AppendStep(dnnl::primitive primitive, std::vector<Binding> bindings,
                  size_t scratchpad_bytes);

  std::vector<Step> steps_;
  std::vector<std::tuple<dnnl::memory::desc, dnnl::memory::desc, Slot, size_t>> pending_outputs_;
  size_t temp_bytes_ = 0;
  size_t scratchpad_bytes_ = 0;
};

// A kernel that is a plain loop.
class LoopKernel : public Kernel {
 public:
  using Fn = std::function<void(const KernelArgs& args)>;
  explicit LoopKernel(Fn fn, size_t scratch = 0) : fn_(std::move(fn)), scratch_(scratch) {}
  size_t scratch_bytes() const override { return scratch_; }
  Status Run(const KernelArgs& args) override {
    fn_(args);
    return OkStatus();
  }

 private:
  Fn fn_;
  size_t scratch_;
};

// The channel block of oneDNN's fastest activation layout on this CPU: 16 with AVX-512, else 8.
int64_t CpuChannelBlock();
// A 4-D NCHW tensor of `dims` in the layout of `block` channels (nChw16c or nChw8c).
dnnl::memory::desc BlockedDesc(const dnnl::memory::dims& dims, int64_t block);

// A loop that may find its data bad (an index out of range) and says so.
class CheckedLoopKernel : public Kernel {
 public:
  using Fn = std::function<Status(const KernelArgs& args)>;
  explicit CheckedLoopKernel(Fn fn) : fn_(std::move(fn)) {}
  Status Run(const KernelArgs& args) override { return fn_(args); }

 private:
  Fn fn_;
};

// Strides of `in` (right-aligned) over `out`'s index space: 0 on broadcast dims.
Shape BroadcastStrides(const Shape& in, const Shape& out);

// Calls fn(out_index, in_offsets...) for every element of `out`, with each input's offset
// computed from its broadcast strides. Works for any rank; used where oneDNN has no
// primitive for a broadcasting pattern.
template <typename Fn>
void ForEachBroadcast(const Shape& out, const std::vector<Shape>& in_strides, Fn&& fn) {
  // Row by row: the innermost dim is a plain loop, the odometer steps once per row, and `fn`
  // inlines (a per-element odometer step and indirect call cost ten times the work).
  constexpr size_t kMaxOperands = 4;
  const int64_t total = NumElements(out);
  const size_t rank = out.size();
  const size_t k = in_strides.size();
  SALUS_DCHECK(k <= kMaxOperands, "ForEachBroadcast takes at most 4 operands");
  std::array<int64_t, kMaxOperands> offs{};
  if (total <= 0) return;
  if (rank == 0) {
    fn(int64_t{0}, offs.data());
    return;
  }
  const int64_t inner = out[rank - 1];
  std::array<int64_t, kMaxOperands> step{};
  for (size_t j = 0; j < k; ++j) step[j] = in_strides[j][rank - 1];
  std::vector<int64_t> idx(rank, 0);
  for (int64_t e = 0; e < total; e += inner) {
    std::array<int64_t, kMaxOperands> o = offs;
    for (int64_t i = 0; i < inner; ++i) {
      fn(e + i, static_cast<const int64_t*>(o.data()));
      for (size_t j = 0; j < k; ++j) o[j] += step[j];
    }
    for (int d = static_cast<int>(rank) - 2; d >= 0; --d) {
      if (++idx[d] < out[d]) {
        for (size_t j = 0; j < k; ++j) offs[j] += in_strides[j][d];
        break;
      }
      for (size_t j = 0; j < k; ++j) offs[j] -= in_strides[j][d] * (out[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace salus::exec
