// Builds small ONNX models in tests (ir_version 8, opset 17).
#pragma once

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "exec/alignment.h"
#include "exec/executable.h"

namespace salus::exec::testing {

class ModelBuilder {
 public:
  ModelBuilder() {
    model_.set_ir_version(8);
    auto* op = model_.add_opset_import();
    op->set_domain("");
    op->set_version(17);
    model_.mutable_graph()->set_name("test");
  }

  ModelBuilder& Input(const std::string& name, const Shape& shape,
                      int type = onnx::TensorProto::FLOAT) {
    auto* in = model_.mutable_graph()->add_input();
    in->set_name(name);
    auto* t = in->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    t->mutable_shape();
    for (int64_t d : shape) t->mutable_shape()->add_dim()->set_dim_value(d);
    return *this;
  }
  // libonnx's checker wants a shape on every graph output; its dims may stay unknown.
  ModelBuilder& Output(const std::string& name, const Shape& shape) {
    auto* out = model_.mutable_graph()->add_output();
    out->set_name(name);
    auto* t = out->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    t->mutable_shape();
    for (int64_t d : shape) t->mutable_shape()->add_dim()->set_dim_value(d);
    return *this;
  }
  ModelBuilder& Initializer(const std::string& name, const Shape& shape,
                            const std::vector<float>& values) {
    auto* t = model_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : shape) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
    return *this;
  }
  ModelBuilder& Int64Initializer(const std::string& name, const Shape& shape,
                                 const std::vector<int64_t>& values) {
    auto* t = model_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    for (int64_t d : shape) t->add_dims(d);
    for (int64_t v : values) t->add_int64_data(v);
    return *this;
  }
  onnx::NodeProto& Node(const std::string& op, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs) {
    auto* n = model_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(model_.graph().node_size()));
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return *n;
  }
  static void Attr(onnx::NodeProto& n, const std::string& name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void Attr(onnx::NodeProto& n, const std::string& name, float v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void Attr(onnx::NodeProto& n, const std::string& name, const std::string& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  static void Attr(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  std::string Bytes() const { return model_.SerializeAsString(); }
  onnx::ModelProto& proto() { return model_; }

 private:
  onnx::ModelProto model_;
};

// Inputs a and b (shapes as stored) and y = MatMul(a or a^T, b or b^T), each operand read
// transposed (its last two dims swapped by a Transpose) when `ta` / `tb` says so.
inline void MatMulOfStored(ModelBuilder& mb, const Shape& a, const Shape& b, bool ta, bool tb) {
  mb.Input("a", a).Input("b", b);
  std::string names[2] = {"a", "b"};
  const Shape* shapes[2] = {&a, &b};
  const bool transposed[2] = {ta, tb};
  for (int k = 0; k < 2; ++k) {
    if (!transposed[k]) continue;
    std::vector<int64_t> perm(shapes[k]->size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
    std::swap(perm[perm.size() - 2], perm.back());
    auto& t = mb.Node("Transpose", {names[k]}, {names[k] + "t"});
    ModelBuilder::Attr(t, "perm", perm);
    names[k] += "t";
  }
  mb.Node("MatMul", {names[0], names[1]}, {"y"});
}

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Host memory for one CPU executable: a persistent block and a lane, aligned to kAlignment.
struct Memory {
  explicit Memory(const Executable& exe)
      : persistent(exe.persistent_bytes() + kAlignment),
        // Poisoned (each float reads about 1.5e16), as a reused lane holds an earlier
        // iteration's values: an output a kernel leaves unwritten shows.
        lane(exe.ephemeral_bytes() + kAlignment, std::byte{0x5a}) {
    Status st = exe.InitializePersistent(p());
    if (!st.ok()) ADD_FAILURE() << st.ToString();
  }
  std::byte* p() { return Align(persistent); }
  std::byte* l() { return Align(lane); }
  static std::byte* Align(std::vector<std::byte>& v) {
    auto addr = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (kAlignment - addr % kAlignment) % kAlignment;
  }
  std::vector<std::byte> persistent, lane;
};

// Runs one iteration with host tensors; returns the fetches.
inline StatusOr<std::vector<HostTensor>> RunHost(Executable& exe, Memory& mem,
                                                 const std::vector<HostTensor>& feeds) {
  std::vector<const void*> in;
  for (const HostTensor& f : feeds) in.push_back(f.bytes.data());
  std::vector<HostTensor> out;
  for (const TensorInfo& info : exe.fetches()) out.emplace_back(info.type, info.shape);
  std::vector<void*> out_ptrs;
  for (HostTensor& t : out) out_ptrs.push_back(t.bytes.data());
  Status st = exe.Run(mem.p(), mem.l(), in, out_ptrs);
  if (!st.ok()) return st;
  return out;
}

}  // namespace salus::exec::testing
