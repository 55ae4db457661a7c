#include "exec/onnx_importer.h"

#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <set>

#include "exec/graph_builder.h"
#include "exec/shape_inference.h"

namespace salus::exec {
namespace {

// Upper bound on the elements of one tensor read from a model (4 GiB of floats).
constexpr int64_t kMaxElements = int64_t{1} << 30;

StatusOr<Shape> ShapeFromProto(const onnx::TensorProto& p) {
  Shape s;
  int64_t n = 1;
  for (int64_t d : p.dims()) {
    if (d < 0 || (d > 0 && n > kMaxElements / d)) {
      return InvalidArgumentError("tensor '" + p.name() + "' has bad dims");
    }
    n *= d;
    s.push_back(d);
  }
  return s;
}

StatusOr<Attribute> AttributeFromProto(const onnx::AttributeProto& a) {
  Attribute out;
  switch (a.type()) {
    case onnx::AttributeProto::INT:
      out.kind = Attribute::Kind::kInt;
      out.i = a.i();
      break;
    case onnx::AttributeProto::FLOAT:
      out.kind = Attribute::Kind::kFloat;
      out.f = a.f();
      break;
    case onnx::AttributeProto::STRING:
      out.kind = Attribute::Kind::kString;
      out.s = a.s();
      break;
    case onnx::AttributeProto::INTS:
      out.kind = Attribute::Kind::kInts;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case onnx::AttributeProto::FLOATS:
      out.kind = Attribute::Kind::kFloats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case onnx::AttributeProto::STRINGS:
      out.kind = Attribute::Kind::kStrings;
      out.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case onnx::AttributeProto::TENSOR: {
      out.kind = Attribute::Kind::kTensor;
      SALUS_ASSIGN_OR_RETURN(out.t, OnnxImporter::TensorFromProto(a.t()));
      break;
    }
    default:
      return UnimplementedError("attribute '" + a.name() + "' of an unsupported kind");
  }
  return out;
}

// The value of a Constant node. Each value attribute must be of its own kind: a "value" that
// is a string holds no tensor, and an empty tensor of rank 0 would be read as one element.
StatusOr<HostTensor> ConstantValue(const Node& n) {
  static const std::pair<const char*, Attribute::Kind> kKinds[] = {
      {"value", Attribute::Kind::kTensor},
      {"value_float", Attribute::Kind::kFloat},
      {"value_floats", Attribute::Kind::kFloats},
      {"value_int", Attribute::Kind::kInt},
      {"value_ints", Attribute::Kind::kInts}};
  for (const auto& [name, kind] : kKinds) {
    if (n.Has(name) && n.attrs.at(name).kind != kind) {
      return InvalidArgumentError("node '" + n.name + "': op Constant's attribute '" + name +
                                  "' is of the wrong kind");
    }
  }
  if (n.Has("value")) return n.attrs.at("value").t;
  if (n.Has("value_float")) return HostTensor::FromFloats({}, {n.GetFloat("value_float", 0)});
  if (n.Has("value_floats")) {
    const auto& f = n.attrs.at("value_floats").floats;
    return HostTensor::FromFloats({static_cast<int64_t>(f.size())}, f);
  }
  if (n.Has("value_int")) return HostTensor::FromInt64s({}, {n.GetInt("value_int", 0)});
  if (n.Has("value_ints")) {
    const auto& v = n.attrs.at("value_ints").ints;
    return HostTensor::FromInt64s({static_cast<int64_t>(v.size())}, v);
  }
  return UnimplementedError("node '" + n.name + "': op Constant with an unsupported value kind");
}

// Note [Composed ops]
// A few ONNX ops are exactly a short chain of ops the engine has, and are imported as that
// chain, which gives them shape inference, kernels on every device, fusion and gradients at
// once: HardSigmoid(x; alpha, beta) = Clip(alpha x + beta, 0, 1) and HardSwish(x) =
// x HardSigmoid(x; 1/6, 1/2) (torchvision's MobileNetV3 exports both). Clip's gradient passes
// where the bound was not taken, as PyTorch's hardsigmoid_backward does inside (-3, 3).
bool IsComposedOp(const std::string& op) { return op == "HardSigmoid" || op == "HardSwish"; }

// A fresh value of `g` named after `stem`, unused by the model.
ValueId NewValue(Graph& g, const std::string& stem, Value v) {
  std::string name = stem;
  for (int k = 1; g.Find(name) != kNoValue; ++k) name = stem + "#" + std::to_string(k);
  v.name = std::move(name);
  return g.AddValue(std::move(v));
}

Status AddComposed(GraphBuilder& builder, Node n) {
  Graph& g = builder.graph();
  if (n.inputs.size() != 1 || n.inputs[0] == kNoValue || n.outputs.size() != 1) {
    return InvalidArgumentError(n.Describe() + ": needs one input and one output");
  }
  const bool swish = n.op == "HardSwish";
  const float alpha = swish ? 1.f / 6 : n.GetFloat("alpha", 0.2f);
  const float beta = swish ? 0.5f : n.GetFloat("beta", 0.5f);
  auto scalar = [&](const char* what, float f) {
    Value v;
    v.kind = ValueKind::kConstant;
    v.data = HostTensor::FromFloats({}, {f});
    return NewValue(g, n.name + "/" + what, std::move(v));
  };
  auto intermediate = [&](const char* what) {
    Value v;
    v.type = DataType::kUndefined;
    return NewValue(g, n.name + "/" + what, std::move(v));
  };
  auto add = [&](const char* op, const char* what, std::vector<ValueId> inputs, ValueId out,
                 std::map<std::string, Attribute> attrs = {}) {
    Node m;
    m.op = op;
    m.name = n.name + "/" + what;
    m.inputs = std::move(inputs);
    m.outputs = {out};
    m.attrs = std::move(attrs);
    return builder.Add(std::move(m));
  };
  const ValueId x = n.inputs[0];
  const ValueId scaled = intermediate("scaled"), shifted = intermediate("shifted");
  const ValueId gate = swish ? intermediate("gate") : n.outputs[0];
  SALUS_RETURN_IF_ERROR(add("Mul", "scale", {x, scalar("alpha", alpha)}, scaled));
  SALUS_RETURN_IF_ERROR(add("Add", "shift", {scaled, scalar("beta", beta)}, shifted));
  if (g.opset() >= 11) {
    SALUS_RETURN_IF_ERROR(
        add("Clip", "clip", {shifted, scalar("zero", 0.f), scalar("one", 1.f)}, gate));
  } else {  // Clip-6: the bounds are attributes
    SALUS_RETURN_IF_ERROR(
        add("Clip", "clip", {shifted}, gate, {{"min", FloatAttr(0.f)}, {"max", FloatAttr(1.f)}}));
  }
  if (swish) SALUS_RETURN_IF_ERROR(add("Mul", "gated", {x, gate}, n.outputs[0]));
  return OkStatus();
}

// Note [No external data]
// A tensor may keep its data in a file beside the model (data_location EXTERNAL, with a path in
// external_data). The daemon never reads such files: a model is data a client sends, and a path
// names the daemon's file system, not the client's. Such a model is refused before any check
// touches the file system (the ONNX checker stats external paths), with one answer whatever the
// path and whether it exists, so the refusal reveals nothing about the daemon's files.
bool UsesExternalData(const onnx::TensorProto& t) {
  return t.data_location() == onnx::TensorProto::EXTERNAL || t.external_data_size() > 0;
}

Status RefuseExternalData(const onnx::GraphProto& g);

Status RefuseExternalData(const onnx::AttributeProto& a) {
  auto refuse = [&] {
    return InvalidArgumentError("attribute '" + a.name() +
                                "' holds a tensor with external data, which the engine does not "
                                "read: embed the data in the model");
  };
  if (a.has_t() && UsesExternalData(a.t())) return refuse();
  for (const auto& t : a.tensors()) {
    if (UsesExternalData(t)) return refuse();
  }
  if (a.has_sparse_tensor() && (UsesExternalData(a.sparse_tensor().values()) ||
                                UsesExternalData(a.sparse_tensor().indices()))) {
    return refuse();
  }
  for (const auto& st : a.sparse_tensors()) {
    if (UsesExternalData(st.values()) || UsesExternalData(st.indices())) return refuse();
  }
  if (a.has_g()) SALUS_RETURN_IF_ERROR(RefuseExternalData(a.g()));
  for (const auto& sub : a.graphs()) SALUS_RETURN_IF_ERROR(RefuseExternalData(sub));
  return OkStatus();
}

Status RefuseExternalData(const onnx::GraphProto& g) {
  auto refuse = [](const std::string& name) {
    return InvalidArgumentError("tensor '" + name +
                                "' uses external data, which the engine does not read: embed the "
                                "data in the model");
  };
  for (const auto& t : g.initializer()) {
    if (UsesExternalData(t)) return refuse(t.name());
  }
  for (const auto& st : g.sparse_initializer()) {
    if (UsesExternalData(st.values()) || UsesExternalData(st.indices())) {
      return refuse(st.values().name());
    }
  }
  for (const auto& n : g.node()) {
    for (const auto& a : n.attribute()) SALUS_RETURN_IF_ERROR(RefuseExternalData(a));
  }
  return OkStatus();
}

// Nodes of `g` and of every subgraph its nodes hold (If, Loop, Scan bodies).
int64_t CountNodes(const onnx::GraphProto& g) {
  int64_t n = g.node_size();
  for (const auto& node : g.node()) {
    for (const auto& a : node.attribute()) {
      if (a.has_g()) n += CountNodes(a.g());
      for (const auto& sub : a.graphs()) n += CountNodes(sub);
    }
  }
  return n;
}

// The bytes a tensor's data will take once read (elements times element size); InvalidArgument
// for a bad type or shape.
StatusOr<uint64_t> DeclaredBytes(const onnx::TensorProto& p) {
  SALUS_ASSIGN_OR_RETURN(DataType type, OnnxImporter::TypeFromOnnx(p.data_type()));
  SALUS_ASSIGN_OR_RETURN(Shape shape, ShapeFromProto(p));
  return static_cast<uint64_t>(NumElements(shape)) * ElementSize(type);
}

bool SameShape(const onnx::TypeProto& t, const Shape& s) {
  if (!t.has_tensor_type() || !t.tensor_type().has_shape()) return true;
  const auto& dims = t.tensor_type().shape().dim();
  if (dims.size() != static_cast<int>(s.size())) return false;
  for (int i = 0; i < dims.size(); ++i) {
    if (dims[i].has_dim_value() && dims[i].dim_value() != s[i]) return false;
  }
  return true;
}

// Note [Model versions]
// The engine reads models of IR versions kMinIrVersion..kMaxIrVersion importing default-domain
// opsets kMinOpset..kMaxOpset; each op's semantics at each of those versions are the engine's
// own (shape_inference.cc and the kernels), so the installed ONNX library's age does not limit
// what it accepts. That library checks a model and infers its shapes as a second opinion only
// when it knows the model's IR version and opset; otherwise the engine's own validation (every
// input defined before use, every value defined once, every op, attribute, type and shape
// checked by shape inference) is the whole gate.
constexpr int64_t kMinIrVersion = 3;
constexpr int64_t kMaxIrVersion = 10;
constexpr int kMinOpset = 1;
constexpr int kMaxOpset = 21;

Status CheckVersions(int64_t ir_version, int opset) {
  if (ir_version < kMinIrVersion || ir_version > kMaxIrVersion) {
    return UnimplementedError("model IR version " + std::to_string(ir_version) +
                              " is outside the supported range " + std::to_string(kMinIrVersion) +
                              ".." + std::to_string(kMaxIrVersion));
  }
  if (opset < kMinOpset || opset > kMaxOpset) {
    return UnimplementedError("model imports default-domain opset " + std::to_string(opset) +
                              ", outside the supported range " + std::to_string(kMinOpset) + ".." +
                              std::to_string(kMaxOpset));
  }
  return OkStatus();
}

bool LibOnnxKnows(int64_t ir_version, int opset) {
  const auto& ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = ranges.find(onnx::ONNX_DOMAIN);
  return ir_version <= onnx::Version::IR_VERSION && it != ranges.end() &&
         opset <= it->second.second;
}

}  // namespace

StatusOr<DataType> OnnxImporter::TypeFromOnnx(int elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::FLOAT:
      return DataType::kFloat32;
    case onnx::TensorProto::INT64:
      return DataType::kInt64;
    case onnx::TensorProto::BOOL:
      return DataType::kBool;
    default:
      return UnimplementedError(
          "element type " +
          onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(elem_type)));
  }
}

StatusOr<HostTensor> OnnxImporter::TensorFromProto(const onnx::TensorProto& p) {
  if (UsesExternalData(p)) {
    return InvalidArgumentError("tensor '" + p.name() +
                                "' uses external data, which the engine does not read: embed the "
                                "data in the model");
  }
  SALUS_ASSIGN_OR_RETURN(DataType type, TypeFromOnnx(p.data_type()));
  SALUS_ASSIGN_OR_RETURN(Shape shape, ShapeFromProto(p));
  const size_t n = static_cast<size_t>(NumElements(shape));
  // Check the data's size before allocating, so a header cannot ask for gigabytes.
  auto mismatch = [&](size_t got) {
    return InvalidArgumentError("tensor '" + p.name() + "' has " + std::to_string(got) +
                                " values, expected " + std::to_string(n));
  };
  if (p.has_raw_data()) {
    if (p.raw_data().size() != n * ElementSize(type)) {
      return InvalidArgumentError("tensor '" + p.name() + "': raw_data has " +
                                  std::to_string(p.raw_data().size()) + " bytes, expected " +
                                  std::to_string(n * ElementSize(type)));
    }
  } else if (type == DataType::kFloat32) {
    if (static_cast<size_t>(p.float_data_size()) != n) return mismatch(p.float_data_size());
  } else if (type == DataType::kInt64) {
    if (static_cast<size_t>(p.int64_data_size()) != n) return mismatch(p.int64_data_size());
  } else if (static_cast<size_t>(p.int32_data_size()) != n) {
    return mismatch(p.int32_data_size());
  }
  HostTensor t(type, shape);
  if (p.has_raw_data()) {
    if (!t.bytes.empty()) std::memcpy(t.bytes.data(), p.raw_data().data(), t.bytes.size());
  } else if (type == DataType::kFloat32) {
    for (size_t i = 0; i < n; ++i) t.floats()[i] = p.float_data(i);
  } else if (type == DataType::kInt64) {
    for (size_t i = 0; i < n; ++i) t.int64s()[i] = p.int64_data(i);
  } else {
    for (size_t i = 0; i < n; ++i) t.bytes[i] = std::byte(p.int32_data(i) != 0);
  }
  return t;
}

StatusOr<Graph> OnnxImporter::Import(const void* data, size_t size, const ImportOptions& options) {
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return InvalidArgumentError("model larger than 2 GiB");
  }
  onnx::ModelProto model;
  if (!model.ParseFromArray(data, static_cast<int>(size))) {
    return InvalidArgumentError("model bytes are not a valid ONNX ModelProto");
  }
  if (!model.has_graph()) return InvalidArgumentError("model has no graph");
  // Before anything reads the model further (the ONNX checker would look for the files):
  // whether a path exists must not show in the answer (Note [No external data]).
  SALUS_RETURN_IF_ERROR(RefuseExternalData(model.graph()));
  SALUS_RETURN_IF_ERROR(options.limits.CheckNodes(CountNodes(model.graph()), "the model"));
  for (const auto& np : model.graph().node()) {
    if (!np.domain().empty() && np.domain() != "ai.onnx") {
      return UnimplementedError("node '" + np.name() + "': op " + np.domain() + "." + np.op_type() +
                                " is not supported");
    }
  }
  int opset = -1;
  for (const auto& imp : model.opset_import()) {
    if (imp.domain().empty() || imp.domain() == "ai.onnx") opset = static_cast<int>(imp.version());
  }
  if (opset < 0) return InvalidArgumentError("model imports no default-domain opset");
  SALUS_RETURN_IF_ERROR(CheckVersions(model.ir_version(), opset));
  const bool libonnx_knows = LibOnnxKnows(model.ir_version(), opset);
  onnx::GraphProto* gp = model.mutable_graph();
  if (gp->node_size() == 0) return InvalidArgumentError("model graph has no nodes");

  std::set<std::string> initializer_names;
  for (const auto& init : gp->initializer()) initializer_names.insert(init.name());
  // Fix input shapes; drop stale intermediate and output shapes so that inference recomputes
  // them for these inputs.
  for (auto& in : *gp->mutable_input()) {
    if (initializer_names.count(in.name())) continue;
    if (!in.type().has_tensor_type()) {
      return UnimplementedError("input '" + in.name() + "' is not a tensor");
    }
    const bool had_shape = in.type().tensor_type().has_shape();
    auto* shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
    auto it = options.input_shapes.find(in.name());
    auto ct = options.constant_inputs.find(in.name());
    if (it != options.input_shapes.end() || ct != options.constant_inputs.end()) {
      const Shape& s = it != options.input_shapes.end() ? it->second : ct->second.shape;
      shape->clear_dim();
      for (int64_t d : s) shape->add_dim()->set_dim_value(d);
    } else {
      if (!had_shape) {
        return InvalidArgumentError("input '" + in.name() +
                                    "' has no shape; give it when compiling");
      }
      for (const auto& d : shape->dim()) {
        if (!d.has_dim_value() || d.dim_value() < 0) {
          return InvalidArgumentError("input '" + in.name() +
                                      "' has a symbolic dim; give its shape when compiling");
        }
      }
    }
  }
  gp->clear_value_info();
  for (auto& out : *gp->mutable_output()) {
    if (!out.type().has_tensor_type() || !out.type().tensor_type().has_shape()) continue;
    for (auto& d : *out.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
      d.clear_dim_value();
    }
  }
  if (libonnx_knows) {
    try {
      onnx::checker::check_model(model);
    } catch (const std::exception& e) {
      return InvalidArgumentError(std::string("ONNX check failed: ") + e.what());
    }
    SALUS_RETURN_IF_ERROR(options.limits.CheckDeadline("checking the model"));
  }

  Graph g;
  GraphBuilder builder(&g, options.limits);
  g.set_opset(opset);
  for (const auto& init : gp->initializer()) {
    if (g.Find(init.name()) != kNoValue) {
      return InvalidArgumentError("initializer '" + init.name() + "' defined twice");
    }
    Value v;
    v.name = init.name();
    SALUS_ASSIGN_OR_RETURN(const uint64_t bytes, DeclaredBytes(init));
    SALUS_RETURN_IF_ERROR(builder.Reserve(bytes, "initializer '" + init.name() + "'"));
    SALUS_ASSIGN_OR_RETURN(v.data, TensorFromProto(init));
    v.type = v.data.type;
    v.shape = v.data.shape;
    v.kind = options.trainable_initializers && v.type == DataType::kFloat32 ? ValueKind::kParameter
                                                                            : ValueKind::kConstant;
    g.AddValue(std::move(v));
  }
  for (const auto& in : gp->input()) {
    if (initializer_names.count(in.name())) continue;
    Value v;
    v.name = in.name();
    SALUS_ASSIGN_OR_RETURN(v.type, TypeFromOnnx(in.type().tensor_type().elem_type()));
    for (const auto& d : in.type().tensor_type().shape().dim()) v.shape.push_back(d.dim_value());
    if (TooManyElements(v.shape, options.limits.max_tensor_elements)) {
      return InvalidArgumentError("input '" + in.name() + "' is too large");
    }
    auto ct = options.constant_inputs.find(in.name());
    if (ct != options.constant_inputs.end()) {
      if (ct->second.type != v.type) {
        return InvalidArgumentError("constant input '" + in.name() + "' has the wrong type");
      }
      v.kind = ValueKind::kConstant;
      v.data = ct->second;
      g.AddValue(std::move(v));
    } else {
      v.kind = ValueKind::kInput;
      g.inputs().push_back(g.AddValue(std::move(v)));
    }
  }
  for (int ni = 0; ni < gp->node_size(); ++ni) {
    const onnx::NodeProto& np = gp->node(ni);
    Node n;
    n.op = np.op_type();
    n.name = np.name().empty() ? np.op_type() + "_" + std::to_string(ni) : np.name();
    if (!np.domain().empty() && np.domain() != "ai.onnx") {
      return UnimplementedError("node '" + n.name + "': op " + np.domain() + "." + n.op +
                                " is not supported");
    }
    if (!IsSupportedOp(n.op) && !IsComposedOp(n.op)) {
      return UnimplementedError("node '" + n.name + "': op " + n.op + " is not supported");
    }
    for (const auto& a : np.attribute()) {
      // (A tensor that cannot be read is refused by AttributeFromProto, with its context.)
      if (auto bytes = DeclaredBytes(a.t());
          a.type() == onnx::AttributeProto::TENSOR && bytes.ok()) {
        SALUS_RETURN_IF_ERROR(
            builder.Reserve(*bytes, n.Describe() + ": attribute '" + a.name() + "'"));
      }
      auto attr = AttributeFromProto(a);
      if (!attr.ok()) return attr.status().WithContext("node '" + n.name + "': op " + n.op);
      n.attrs[a.name()] = std::move(attr).value();
    }
    for (const std::string& name : np.input()) {
      if (name.empty()) {
        n.inputs.push_back(kNoValue);
        continue;
      }
      ValueId id = g.Find(name);
      if (id == kNoValue) {
        return InvalidArgumentError(n.Describe() + ": input '" + name + "' is undefined");
      }
      n.inputs.push_back(id);
    }
    while (!n.inputs.empty() && n.inputs.back() == kNoValue) n.inputs.pop_back();
    for (const std::string& name : np.output()) {
      if (name.empty()) {
        n.outputs.push_back(kNoValue);
        continue;
      }
      if (g.Find(name) != kNoValue) {
        return InvalidArgumentError(n.Describe() + ": output '" + name + "' defined twice");
      }
      Value v;
      v.name = name;
      v.type = DataType::kUndefined;
      n.outputs.push_back(g.AddValue(std::move(v)));
    }
    while (!n.outputs.empty() && n.outputs.back() == kNoValue) n.outputs.pop_back();
    if (n.op == "Constant") {
      SALUS_ASSIGN_OR_RETURN(HostTensor t, ConstantValue(n));
      if (n.outputs.size() != 1) return InvalidArgumentError(n.Describe() + ": needs one output");
      Value& v = g.value(n.outputs[0]);
      v.kind = ValueKind::kConstant;
      v.type = t.type;
      v.shape = t.shape;
      v.data = std::move(t);
      continue;
    }
    if (IsComposedOp(n.op)) {
      SALUS_RETURN_IF_ERROR(AddComposed(builder, std::move(n)));
      continue;
    }
    SALUS_RETURN_IF_ERROR(builder.Add(std::move(n)));
  }
  // libonnx's shape inference runs only now, on a graph the engine's own rules have
  // validated: some of its inference functions assume well-formed inputs (ConvTranspose's
  // dereferences a missing weight shape). It is a second opinion (Note [Model versions]):
  // where it infers a shape, that shape must agree with the engine's; where it cannot (an
  // exporter's int64 Constant under an opset whose schema allows only floats), the engine's
  // own inference, which has already succeeded, stands.
  if (libonnx_knows) {
    try {
      onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                         onnx::ShapeInferenceOptions(false, 0, false));
    } catch (const std::exception&) {
      gp->clear_value_info();
    }
    SALUS_RETURN_IF_ERROR(options.limits.CheckDeadline("inferring shapes"));
  }
  for (const auto& vi : gp->value_info()) {
    ValueId id = g.Find(vi.name());
    if (id != kNoValue && !SameShape(vi.type(), g.value(id).shape)) {
      return InvalidArgumentError("value '" + vi.name() + "' has shape " +
                                  ShapeString(g.value(id).shape) + " but ONNX infers another");
    }
  }
  for (const auto& out : gp->output()) {
    ValueId id = g.Find(out.name());
    if (id == kNoValue) {
      return InvalidArgumentError("graph output '" + out.name() + "' is never produced");
    }
    g.outputs().push_back(id);
  }
  return g;
}

}  // namespace salus::exec
