// The floor of a device recorded below Python (bare.py --cpp): plain PrivateUse1 tensors with
// no data, whose every ATen op that reaches the backend goes to one boxed C++ fallback that
// only makes its outputs.
//
// An op's output geometry comes from running it once on meta tensors per op and argument
// geometry (floating-point scalars left out of the key: learning rates and bias corrections
// change every step, the shapes they give do not), then from that memo. Ops that write their
// arguments (in place, out=) return them; views return tensors over their argument's storage;
// other outputs get a storage of their size with no bytes behind it. A host read
// (`_local_scalar_dense`) gives 0. Nothing is recorded, sent or computed, so a step on these
// tensors costs what the user's Python, PyTorch's dispatcher, autograd and a memo lookup per
// op cost: what any device that records in C++ would pay at least.
//
// The device guard and hooks are the lazy device's own (salus_torch/csrc/device.cc, loaded
// beside this file in a process that never imports salus_torch).

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

struct Geometry {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
  int64_t nbytes;
};

// One output of an op, from its memo entry.
struct Output {
  enum Kind { kFresh, kArgument, kView, kValue } kind = kFresh;
  int arg = -1;  // the argument written (kArgument) or viewed (kView)
  bool list = false;
  std::vector<Geometry> geometry;
  c10::IValue value;  // kValue: a non-tensor return
};

std::unordered_map<std::string, std::vector<Output>> memo;
int64_t calls = 0;

void Put(std::string& key, int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); }

// What an op's output geometry depends on in one argument.
void KeyOf(std::string& key, const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return Put(key, -1);
    Put(key, -2);
    Put(key, static_cast<int64_t>(t.scalar_type()));
    Put(key, static_cast<int64_t>(t.device().type()));
    Put(key, t.dim());
    for (int64_t s : t.sizes()) Put(key, s);
    for (int64_t s : t.strides()) Put(key, s);
    Put(key, t.storage_offset());
  } else if (v.isInt()) {
    Put(key, -3);
    Put(key, v.toInt());
  } else if (v.isBool()) {
    Put(key, -4);
    Put(key, v.toBool());
  } else if (v.isNone()) {
    Put(key, -5);
  } else if (v.isList()) {
    const auto& items = v.toListRef();
    Put(key, -6);
    Put(key, static_cast<int64_t>(items.size()));
    for (const c10::IValue& item : items) KeyOf(key, item);
  } else if (v.isString()) {
    Put(key, -7);
    key += v.toStringRef();
    key += '\0';
  } else if (v.isScalar()) {  // a double or a Scalar: its kind, an integer's value
    const c10::Scalar s = v.toScalar();
    Put(key, s.isIntegral(false) ? -8 : -9);
    if (s.isIntegral(false)) Put(key, s.toLong());
  } else if (v.isDevice()) {
    Put(key, -10);
    Put(key, static_cast<int64_t>(v.toDevice().type()));
  } else {
    Put(key, -11);
    key += v.tagKind();
  }
}

at::Tensor MetaOf(const at::Tensor& t) {
  if (!t.defined()) return t;
  const int64_t elements = static_cast<int64_t>(t.storage().nbytes()) / t.element_size();
  return at::empty({elements}, t.options().device(c10::kMeta))
      .as_strided(t.sizes(), t.strides(), t.storage_offset());
}

c10::IValue MetaOf(const c10::IValue& v) {
  if (v.isTensor()) return MetaOf(v.toTensor());
  if (v.isDevice()) return c10::Device(c10::kMeta);
  if (v.isTensorList()) {
    std::vector<at::Tensor> metas;
    for (const at::Tensor& t : v.toTensorVector()) metas.push_back(MetaOf(t));
    return metas;
  }
  if (v.isList()) {
    c10::impl::GenericList metas(v.toList().elementType());
    for (const c10::IValue& item : v.toListRef()) metas.push_back(MetaOf(item));
    return metas;
  }
  return v;
}

// The op's results on meta tensors. PrivateUse1's convolutions are the "overrideable" ops,
// which have no meta kernel: their geometry is that of the ordinary ones.
torch::jit::Stack OnMeta(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  torch::jit::Stack m;
  for (const c10::IValue& a : args) m.push_back(MetaOf(a));
  const std::string& name = op.operator_name().name;
  if (name == "aten::convolution_overrideable") {
    at::Tensor out = at::convolution(
        m[0].toTensor(), m[1].toTensor(), m[2].toOptional<at::Tensor>(), m[3].toIntVector(),
        m[4].toIntVector(), m[5].toIntVector(), m[6].toBool(), m[7].toIntVector(), m[8].toInt());
    return {out};
  }
  if (name == "aten::convolution_backward_overrideable") {
    const at::Tensor& weight = m[2].toTensor();
    auto [gi, gw, gb] = at::convolution_backward(
        m[0].toTensor(), m[1].toTensor(), weight,
        std::vector<int64_t>{weight.size(m[6].toBool() ? 1 : 0)}, m[3].toIntVector(),
        m[4].toIntVector(), m[5].toIntVector(), m[6].toBool(), m[7].toIntVector(), m[8].toInt(),
        {true, true, true});
    auto mask = m[9].to<std::array<bool, 3>>();
    return {mask[0] ? gi : at::Tensor(), mask[1] ? gw : at::Tensor(), mask[2] ? gb : at::Tensor()};
  }
  op.callBoxed(&m);
  return m;
}

Geometry GeometryOf(const at::Tensor& t) {
  const int64_t nbytes = static_cast<int64_t>(at::detail::computeStorageNbytes(
      t.sizes(), t.strides(), t.element_size(), t.storage_offset()));
  return {t.scalar_type(), t.sizes().vec(), t.strides().vec(), t.storage_offset(), nbytes};
}

std::vector<Output> Entry(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const c10::FunctionSchema& schema = op.schema();
  torch::jit::Stack results = OnMeta(op, args);
  std::vector<Output> outputs;
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    Output o;
    if (const c10::AliasInfo* alias = schema.returns()[i].alias_info()) {
      for (size_t j = 0; j < args.size(); ++j) {
        const c10::AliasInfo* a = schema.arguments()[j].alias_info();
        if (a != nullptr && a->beforeSets() == alias->beforeSets()) {
          o.arg = static_cast<int>(j);
          o.kind = alias->isWrite() ? Output::kArgument : Output::kView;
          break;
        }
      }
    }
    const c10::IValue& r = results[i];
    if (r.isTensor()) {
      if (r.toTensor().defined()) {
        o.geometry.push_back(GeometryOf(r.toTensor()));
      } else {
        o.kind = Output::kValue;
        o.value = r;
      }
    } else if (r.isTensorList()) {
      o.list = true;
      for (const at::Tensor& t : r.toTensorVector()) o.geometry.push_back(GeometryOf(t));
    } else {
      o.kind = Output::kValue;
      o.value = r;
    }
    outputs.push_back(std::move(o));
  }
  return outputs;
}

at::Tensor Make(const Geometry& g, const c10::Storage* viewed) {
  c10::Storage storage =
      viewed != nullptr
          ? *viewed
          : c10::Storage(c10::Storage::use_byte_size_t(), g.nbytes,
                         c10::DataPtr(nullptr, c10::Device(kType, 0)), nullptr, false);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(g.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  return t;
}

void Fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ++calls;
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  const std::string& name = op.operator_name().name;
  if (name == "aten::_local_scalar_dense") {  // a host read: there is no value to give
    const bool integral = !c10::isFloatingType(args[0].toTensor().scalar_type());
    torch::jit::drop(*stack, n);
    stack->emplace_back(integral ? c10::Scalar(int64_t{0}) : c10::Scalar(0.0));
    return;
  }
  if (name == "aten::_copy_from" || name == "aten::_copy_from_and_resize") {  // writes dst
    c10::IValue dst = args[1];
    torch::jit::drop(*stack, n);
    stack->push_back(std::move(dst));
    return;
  }
  std::string key;
  Put(key, reinterpret_cast<int64_t>(&op.schema()));
  for (const c10::IValue& a : args) KeyOf(key, a);
  auto it = memo.find(key);
  if (it == memo.end()) {
    it = memo.emplace(std::move(key), Entry(op, args)).first;
  }
  torch::jit::Stack outs;
  for (const Output& o : it->second) {
    if (o.kind == Output::kValue) {
      outs.push_back(o.value);
    } else if (o.kind == Output::kArgument) {  // written, and resized if an out= argument
      const at::Tensor& t = args[o.arg].toTensor();
      const Geometry& g = o.geometry[0];
      if (!o.list && t.sizes() != c10::IntArrayRef(g.sizes)) {
        t.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
        t.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl()->set_nbytes(g.nbytes);
      }
      outs.push_back(args[o.arg]);
    } else {
      c10::Storage viewed;
      if (o.kind == Output::kView) viewed = args[o.arg].toTensor().storage();
      const c10::Storage* shared = o.kind == Output::kView ? &viewed : nullptr;
      if (o.list) {
        std::vector<at::Tensor> list;
        for (const Geometry& g : o.geometry) list.push_back(Make(g, shared));
        outs.push_back(std::move(list));
      } else {
        outs.push_back(Make(o.geometry[0], shared));
      }
    }
  }
  torch::jit::drop(*stack, n);
  for (c10::IValue& v : outs) stack->push_back(std::move(v));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&Fallback>());
}

// The convolutions have a default kernel for every backend, which refuses: the fallback is
// theirs by name.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&Fallback>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&Fallback>());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Dataless PrivateUse1 tensors whose ops only make their outputs, in C++";
  m.def("calls", [] { return calls; });
}
