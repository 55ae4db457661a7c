#include "exec/dnnl_kernel.h"

#include <cstring>
#include <exception>

namespace salus::exec {

dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& CpuStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

Shape DenseStrides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * std::max<int64_t>(shape[i + 1], 1);
  }
  return strides;
}

dnnl::memory::desc StridedDesc(const Shape& dims, const Shape& strides) {
  return dnnl::memory::desc(dnnl::memory::dims(dims.begin(), dims.end()),
                            dnnl::memory::data_type::f32,
                            dnnl::memory::dims(strides.begin(), strides.end()));
}

dnnl::memory::desc PlainDesc(const Shape& shape, DataType type) {
  Shape dims = shape.empty() ? Shape{1} : shape;
  auto dt = type == DataType::kInt64 ? dnnl::memory::data_type::s32 : dnnl::memory::data_type::f32;
  Shape strides = DenseStrides(dims);
  return dnnl::memory::desc(dnnl::memory::dims(dims.begin(), dims.end()), dt,
                            dnnl::memory::dims(strides.begin(), strides.end()));
}

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

size_t DnnlKernel::AddTemp(size_t bytes) {
  size_t offset = temp_bytes_;
  temp_bytes_ += AlignUp(bytes);
  return offset;
}

void DnnlKernel::AddPrimitive(dnnl::primitive primitive, std::vector<Binding> bindings,
                              size_t scratchpad_bytes) {
  AppendStep(std::move(primitive), std::move(bindings), scratchpad_bytes);
  auto pending = std::move(pending_outputs_);
  pending_outputs_.clear();
  for (auto& [user, want, slot, temp] : pending) {
    dnnl::reorder::primitive_desc rpd(CpuEngine(), want, CpuEngine(), user, UserScratchpad());
    AppendStep(dnnl::reorder(rpd),
               {{DNNL_ARG_FROM, want, Slot::Temp(temp)}, {DNNL_ARG_TO, user, slot}},
               rpd.scratchpad_desc().get_size());
  }
}

DnnlKernel::Binding DnnlKernel::Input(int arg, const dnnl::memory::desc& user,
                                      const dnnl::memory::desc& want, Slot slot) {
  if (user == want) return {arg, user, slot};
  const size_t temp = AddTemp(want.get_size());
  dnnl::reorder::primitive_desc rpd(CpuEngine(), user, CpuEngine(), want, UserScratchpad());
  AppendStep(dnnl::reorder(rpd),
             {{DNNL_ARG_FROM, user, slot}, {DNNL_ARG_TO, want, Slot::Temp(temp)}},
             rpd.scratchpad_desc().get_size());
  return {arg, want, Slot::Temp(temp)};
}

DnnlKernel::Binding DnnlKernel::Output(int arg, const dnnl::memory::desc& user,
                                       const dnnl::memory::desc& want, Slot slot) {
  if (user == want) return {arg, user, slot};
  const size_t temp = AddTemp(want.get_size());
  pending_outputs_.emplace_back(user, want, slot, temp);
  return {arg, want, Slot::Temp(temp)};
}

DnnlKernel::Binding DnnlKernel::Seed(int arg, const dnnl::memory::desc& user,
                                     const dnnl::memory::desc& want, Slot init, Slot slot) {
  if (user == want) {
    const size_t bytes = user.get_size();
    AddLoop([init, slot, bytes](const KernelArgs& args, std::byte*) {
      const void* from = args.inputs[init.index];
      void* to = args.outputs[slot.index];
      if (from != to) std::memcpy(to, from, bytes);
    });
    return {arg, user, slot};
  }
  const Binding b = Output(arg, user, want, slot);
  dnnl::reorder::primitive_desc rpd(CpuEngine(), user, CpuEngine(), want, UserScratchpad());
  AppendStep(dnnl::reorder(rpd), {{DNNL_ARG_FROM, user, init}, {DNNL_ARG_TO, want, b.slot}},
             rpd.scratchpad_desc().get_size());
  return b;
}

void DnnlKernel::AppendStep(dnnl::primitive primitive, std::vector<Binding> bindings,
                            size_t scratchpad_bytes) {
  Step step;
  step.primitive = std::move(primitive);
  for (Binding& b : bindings) {
    step.memories.emplace(b.arg, dnnl::memory(b.desc, CpuEngine(), DNNL_MEMORY_NONE));
    step.slots.emplace_back(b.arg, b.slot);
  }
  if (scratchpad_bytes > 0) {
    dnnl::memory::desc pad({static_cast<int64_t>(scratchpad_bytes)}, dnnl::memory::data_type::u8,
                           dnnl::memory::format_tag::a);
    step.memories.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(pad, CpuEngine(), DNNL_MEMORY_NONE));
    step.slots.emplace_back(DNNL_ARG_SCRATCHPAD, Slot::Pad());
    scratchpad_bytes_ = std::max(scratchpad_bytes_, AlignUp(scratchpad_bytes));
  }
  steps_.push_back(std::move(step));
}

void DnnlKernel::AddLoop(Loop loop) {
  Step step;
  step.loop = std::move(loop);
  steps_.push_back(std::move(step));
}

Status DnnlKernel::Run(const KernelArgs& args) {
  auto* scratch = static_cast<std::byte*>(args.scratch);
  try {
    for (Step& step : steps_) {
      if (step.loop) {
        step.loop(args, scratch);
        continue;
      }
      for (auto& [arg, slot] : step.slots) {
        void* p = nullptr;
        switch (slot.kind) {
          case Slot::Kind::kInput:
            p = args.inputs[slot.index];
            break;
          case Slot::Kind::kOutput:
            p = args.outputs[slot.index];
            break;
          case Slot::Kind::kTemp:
            p = scratch + slot.index;
            break;
          case Slot::Kind::kScratchpad:
            p = scratch + temp_bytes_;
            break;
        }
        step.memories.at(arg).set_data_handle(p);
      }
      step.primitive.execute(CpuStream(), step.memories);
    }
    CpuStream().wait();
  } catch (const std::exception& e) {
    return InternalError(std::string("oneDNN: ") + e.what());
  }
  return OkStatus();
}

Shape BroadcastStrides(const Shape& in, const Shape& out) {
  Shape dense = DenseStrides(in);
  Shape strides(out.size(), 0);
  const size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) {
    strides[off + i] = in[i] == 1 ? 0 : dense[i];
  }
  return strides;
}

int64_t CpuChannelBlock() {
  static const int64_t block = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core ? 16 : 8;
  return block;
}

dnnl::memory::desc BlockedDesc(const dnnl::memory::dims& dims, int64_t block) {
  return dnnl::memory::desc(
      dims, dnnl::memory::data_type::f32,
      block == 16 ? dnnl::memory::format_tag::nChw16c : dnnl::memory::format_tag::nChw8c);
}

}  // namespace salus::exec
