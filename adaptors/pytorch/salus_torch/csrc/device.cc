// The `salus` device's C++ half (Note [The lazy device] in device.py).
//
// PyTorch's autograd engine and device guards ask every device type for a DeviceGuardImpl and,
// for PrivateUse1, for hooks; without them a tensor on the device cannot take part in
// backward(). The device is lazy: nothing runs on it in this process, so the guard has one
// device with one stream that is always idle, and the hooks hand out the CPU generator (the
// daemon draws the device's random numbers itself, with explicit seeds), as does a generator
// made for the device (`torch.Generator(device="salus")`). Everything else, the
// tensors, the recording and the flushes, is Python, but for setting a tensor's geometry when
// an in-place op changed it, for the choice of attention and linear kernels (Note [Fused
// attention], Note [Fused linear]) and for a detach made in one call (Note [One detach, one
// dispatch]).

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/alias.h>
#include <ATen/ops/linear_native.h>
#include <ATen/ops/mkldnn_linear.h>
#include <ATen/ops/mkldnn_linear_backward.h>
#include <ATen/ops/scaled_dot_product_attention_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <type_traits>

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(kType, 0); }
  c10::Device getDevice() const override { return c10::Device(kType, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  // The stream never has work in flight in this process: events are complete at once.
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// torch 2.4 declares getDefaultGenerator non-const, later versions const: each overrides
// the one its version declares (neither is marked override, as one of them overrides nothing).
struct Hooks final : at::PrivateUse1HooksInterface {
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) {
    return at::detail::getDefaultCPUGenerator();
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const {
    return at::detail::getDefaultCPUGenerator();
  }
  // From torch 2.15 on, the device's generators (DeviceGenerator below); a plain method before.
  at::Generator getNewGenerator(c10::DeviceIndex index = -1) const;
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
};

const bool kHooksRegistered = [] {
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

// A generator of the device. Random numbers a script draws with it are drawn on the host
// (Note [Draws on the host] in device.py), so it is a CPU generator under the device's name:
// the same seed gives the numbers eager PyTorch on the CPU would draw with a CPU generator.
struct DeviceGenerator final : c10::GeneratorImpl {
  DeviceGenerator(c10::DeviceIndex index, at::Generator host_generator)
      : c10::GeneratorImpl(c10::Device(kType, index < 0 ? 0 : index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host(std::move(host_generator)) {}
  void set_current_seed(uint64_t seed) override { host.set_current_seed(seed); }
  void set_offset(uint64_t offset) override { host.set_offset(offset); }
  uint64_t get_offset() const override { return host.get_offset(); }
  uint64_t current_seed() const override { return host.current_seed(); }
  uint64_t seed() override { return host.seed(); }
  void set_state(const c10::TensorImpl& state) override {
    host.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return host.unsafeGetGeneratorImpl()->get_state();
  }
  static c10::DeviceType device_type() { return kType; }

  at::Generator host;

 private:
  DeviceGenerator* clone_impl() const override {
    return new DeviceGenerator(device().index(), host.clone());
  }
};

at::Generator MakeGenerator(c10::DeviceIndex index) {
  return at::make_generator<DeviceGenerator>(index, at::detail::createCPUGenerator());
}

// Up to torch 2.14 a device's generators come from a registered factory; 2.15 deprecates it
// for the hooks' getNewGenerator (Hooks above).
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 15
REGISTER_GENERATOR_PRIVATEUSE1(MakeGenerator)
#endif

at::Generator Hooks::getNewGenerator(c10::DeviceIndex index) const { return MakeGenerator(index); }

// The host generator behind a device generator, for the host's kernels to draw with.
at::Generator HostGenerator(const at::Generator& generator) {
  TORCH_CHECK(generator.device().type() == kType, "host_generator: not a salus generator");
  return generator.get<DeviceGenerator>()->host;
}

// A device tensor's new geometry after an in-place op that changed it (Note [Reshaped in
// place] in device.py): the wrapper holds no data, so only its sizes and strides change.
void SetGeometry(const at::Tensor& t, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                 int64_t offset) {
  TORCH_CHECK(t.device().type() == kType, "set_geometry: not a salus device tensor");
  TORCH_CHECK(sizes.size() == strides.size(), "set_geometry: sizes and strides differ in rank");
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
}

// Note [Fused attention]
// torch 2.4 asks for a fused scaled_dot_product_attention kernel only on CPU and CUDA tensors;
// on any other device it runs the math composite above autograd: scaling, two batched matmuls
// with their views and expansions, a softmax, and their gradients: about 28 more recorded ops
// per attention layer than one fused op each way, each recorded by the device from Python. Where
// the CPU's fused kernel would take the device's tensors (4-D float32 query, key and value of one
// batch, heads and head size; no dropout; no mask, or a float mask that needs no gradient), this
// kernel at the device's autograd key calls that fused op: autograd records one node, and the
// recording one op forward and one backward, which the trace decomposes into the math the engine
// runs (Note [Fused attention] in trace.py). Other calls take the composite, as before.
bool Fusable(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const c10::optional<at::Tensor>& mask, double dropout_p, bool is_causal) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->dim() != 4 || t->scalar_type() != at::kFloat || t->is_nested()) return false;
  }
  if (dropout_p != 0.0 || q.size(0) != k.size(0) || q.size(0) != v.size(0) ||
      q.size(1) != k.size(1) || q.size(1) != v.size(1) || k.size(2) != v.size(2) ||
      q.size(3) != k.size(3) || q.size(3) != v.size(3)) {
    return false;
  }
  if (mask.has_value() && mask->defined()) {
    if (is_causal || mask->scalar_type() != at::kFloat || mask->requires_grad() ||
        mask->dim() > 4) {
      return false;
    }
  }
  return true;
}

// torch 2.5 added `enable_gqa` (grouped-query attention: fewer key and value heads than query
// heads) to the op's schema; the kernel's signature must be the installed schema's. Grouped
// calls take the composite.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const c10::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                     c10::optional<double> scale, bool enable_gqa) {
  if (enable_gqa || !Fusable(q, k, v, mask, dropout_p, is_causal)) {
    return at::native::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale,
                                                    enable_gqa);
  }
#else
at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const c10::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                     c10::optional<double> scale) {
  if (!Fusable(q, k, v, mask, dropout_p, is_causal)) {
    return at::native::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale);
  }
#endif
  return std::get<0>(
      at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, mask, scale));
}

// Note [Fused linear]
// A linear layer reaches a device below autograd as the composite's parts: `t` of the weight and
// `addmm` (a batch of rows), with `view`s around them for more leading dims or a `matmul`'s
// folding for a strided input; backward, about six more (the two products with their
// transposes, the bias's sum, the views' inverses) and a clone, where autograd makes the
// weight's transposed gradient contiguous. Each one recorded costs the device a call into
// Python: the encoder's nine linear layers were about a third of its recorded ops. So this
// kernel at the device's autograd key records one op each way: `mkldnn_linear` forward (the
// ATen op of the same semantics, which has no kernel for the device's tensors in PyTorch
// itself; its shapes come from the meta kernels below) and `mkldnn_linear_backward` when
// autograd runs the node's backward, which the trace decomposes into the products the engine
// runs (Note [Fused linear] in trace.py). The node is made as PyTorch's generated autograd
// kernels make theirs: a torch::autograd::Function cost the recording about 13 us more per
// layer, as much again as the recorded op. Its backward run with the graph recorded
// (`create_graph=True`, a gradient penalty) takes differentiable ops instead, so gradients of
// gradients still flow. Inputs of one dim, other dtypes, forward-mode gradients and mismatched
// shapes take the composite, as before (its errors name the shapes).
bool LinearFusable(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  if (x.dim() < 2 || w.dim() != 2 || x.scalar_type() != at::kFloat ||
      w.scalar_type() != at::kFloat || x.is_nested() || x.size(-1) != w.size(1) ||
      x._fw_grad(0).defined() || w._fw_grad(0).defined()) {
    return false;
  }
  if (b.has_value() && b->defined()) {
    return b->dim() == 1 && b->size(0) == w.size(0) && b->scalar_type() == at::kFloat &&
           !b->_fw_grad(0).defined();
  }
  return true;
}

// The layer's autograd node.
struct LinearBackward final : torch::autograd::Node {
  torch::autograd::SavedVariable x, w;
  bool bias = false;

  std::string name() const override { return "SalusLinearBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor input = x.unpack();
    const at::Tensor weight = w.unpack();
    const std::array<bool, 3> mask = {should_compute_output(0), should_compute_output(1),
                                      bias && should_compute_output(2)};
    if (at::GradMode::is_enabled()) {  // (create_graph: the gradients are differentiable)
      const at::Tensor g2 = g.reshape({-1, weight.size(0)});
      return {mask[0] ? g.matmul(weight) : at::Tensor(),
              mask[1] ? g2.t().mm(input.reshape({-1, weight.size(1)})) : at::Tensor(),
              mask[2] ? g2.sum(0) : at::Tensor()};
    }
    auto [gx, gw, gb] = at::mkldnn_linear_backward(input, g, weight, mask);
    return {gx, gw, gb};
  }

  void release_variables() override {
    x.reset_data();
    w.reset_data();
  }
};

// A new autograd node, owned as the installed PyTorch owns them: by an intrusive pointer from
// 2.15 on (Node derives from intrusive_ptr_target), by a shared_ptr with autograd's deleter
// before. (`deleteNode` is found by argument-dependent lookup, through Node's namespace, so the
// branch a version lacks is never compiled.)
template <typename N>
auto MakeNode() {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, N>) {
    return c10::make_intrusive<N>();
  } else {
    return std::shared_ptr<N>(new N(), [](N* node) { deleteNode(node); });
  }
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  if (!LinearFusable(x, w, b)) return at::native::linear(x, w, b);
  const bool has_bias = b.has_value() && b->defined();
  decltype(MakeNode<LinearBackward>()) node;
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || w.requires_grad() || (has_bias && b->requires_grad()))) {
    node = MakeNode<LinearBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
    node->x = torch::autograd::SavedVariable(x, false);
    node->w = torch::autograd::SavedVariable(w, false);
    node->bias = has_bias;
  }
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    out = at::mkldnn_linear(x, w, b);
  }
  if (node) torch::autograd::set_history(out, node);
  return out;
}

// The shapes of the fused linear ops, for the device's recording (which runs each op on meta
// tensors for its results' shapes): results are contiguous, as the trace's decompositions make
// them.
at::Tensor LinearMeta(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>&) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = w.size(0);
  return at::empty(sizes, x.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> LinearBackwardMeta(const at::Tensor& x,
                                                                  const at::Tensor& g,
                                                                  const at::Tensor& w,
                                                                  std::array<bool, 3> mask) {
  return {mask[0] ? at::empty(x.sizes(), x.options()) : at::Tensor(),
          mask[1] ? at::empty(w.sizes(), w.options()) : at::Tensor(),
          mask[2] ? at::empty({w.size(0)}, w.options()) : at::Tensor()};
}

// Note [One detach, one dispatch] (device.py): below autograd, `detach` reaches Python twice,
// once from its ADInplaceOrView kernel and again from the shallow copy that kernel makes of the
// first result. Autograd detaches every gradient it accumulates into a `.grad` (about thirty
// per encoder step), so this kernel at the device's autograd key does what those two do in one
// call: the device's `alias` of the tensor (recorded as a detach is), given the tensor's version
// counter and no metadata changes, as the shallow copy would be.
at::Tensor Detach(const at::Tensor& self) {
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    out = at::alias(self);
  }
  c10::TensorImpl* impl = out.unsafeGetTensorImpl();
  impl->set_version_counter(self.unsafeGetTensorImpl()->version_counter());
  impl->set_allow_tensor_metadata_change(false);
  return out;
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("scaled_dot_product_attention", &Attention);
  m.impl("linear", &Linear);
  m.impl("detach", &Detach);
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("mkldnn_linear", &LinearMeta);
  m.impl("mkldnn_linear_backward", &LinearBackwardMeta);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Device guard and hooks of the lazy salus device";
  m.def("hooks_registered", [] { return kHooksRegistered; });
  m.def("set_geometry", &SetGeometry);
  m.def("host_generator", &HostGenerator);
}
