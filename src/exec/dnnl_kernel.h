// Building blocks of the CPU kernels: a kernel made of oneDNN primitives and a kernel made of
// a plain loop.
//
// Note [Blocked layouts]: convolutions (forward and backward) are created with
// format_tag::any, so oneDNN picks its fastest (blocked) layouts; the kernel reorders from and
// to the graph's row-major tensors around them, in planned temp buffers. Every other op works
// on row-major tensors directly.
//
// Note [oneDNN memory]: every primitive is created at compile time with plain (row-major)
// memory descriptors, `scratchpad_mode::user` and memory objects that own no buffer. At run
// time the kernel points those memory objects at the addresses the executable resolved for
// this iteration (inputs, outputs, and its planned scratch, which holds the primitives'
// scratchpads and any temporary buffers between primitives), so oneDNN allocates nothing.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

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

// Strides of `in` (right-aligned) over `out`'s index space: 0 on broadcast dims.
Shape BroadcastStrides(const Shape& in, const Shape& out);

// Calls fn(out_index, in_offsets...) for every element of `out`, with each input's offset
// computed from its broadcast strides. Works for any rank; used where oneDNN has no
// primitive for a broadcasting pattern.
void ForEachBroadcast(const Shape& out, const std::vector<Shape>& in_strides,
                      const std::function<void(int64_t, const int64_t*)>& fn);

}  // namespace salus::exec
