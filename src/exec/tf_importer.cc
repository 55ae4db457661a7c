#include "exec/tf_importer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "exec/fusion.h"
#include "exec/graph_builder.h"
#include "exec/shape_inference.h"
#include "exec/tf_graph.pb.h"

namespace salus::exec {
namespace {

namespace tf = ::salus::tfgraph;

// Note [TensorFlow names]
// TensorFlow names output k of node n "n:k", and "n" is "n:0". The importer names the engine
// value it makes for output 0 "n" and aliases "n:0" to it (Graph::AddAlias), and names output
// k > 0 "n:k". Where an op passes a tensor through (Identity, StopGradient, IdentityN, a read of
// a variable the graph never assigns), its names are aliases of the value it passes: fetching
// them fetches that value. Placeholders and VarHandleOps are values named by their nodes, so
// CompileOptions::input_shapes, inputs() and Read/WritePersistent use the node names.
//
// Note [TensorFlow variables]
// A VarHandleOp is a persistent kState value (zero until a client writes it). TensorFlow's
// ReadVariableOp returns a snapshot: a read placed before an assignment in the order sees the
// old value even where its consumers run after the assignment. So when the graph assigns a
// variable anywhere, each read of it is an Identity copy into the lane at the read's place in
// the order; a variable the graph never assigns is read in place, without a copy. The
// assignments are SalusAssign nodes (inputs: the variable, the value; no outputs; attribute
// `mode` "set", "add" or "sub") that write the persistent value in place at their place in the
// order, as the optimizer updates of autodiff do; LiveNodes keeps every node without outputs.

constexpr int64_t kMaxOutputIndex = 1 << 20;
// TensorFlow's sign-bit mask of a float bitcast to int32 (0x80000000 as int32).
constexpr int64_t kInt32SignMask = std::numeric_limits<int32_t>::min();

// A TensorFlow tensor as the importer sees it: an engine value, a resource handle of a
// variable, or the int32 bits of a float (Bitcast), which only BitwiseAnd with the sign mask
// may read.
struct TfTensor {
  ValueId value = kNoValue;
  ValueId variable = kNoValue;
  ValueId bits_of = kNoValue;
};

// A parsed input string: a producer node, an output index, and whether it is a control input.
struct InputRef {
  std::string node;
  int64_t index = 0;
  bool control = false;
};

bool ParseInput(const std::string& s, InputRef* ref) {
  if (s.empty()) return false;
  std::string body = s;
  if (body[0] == '^') {
    ref->control = true;
    body = body.substr(1);
  }
  const size_t colon = body.rfind(':');
  ref->index = 0;
  if (colon != std::string::npos) {
    const std::string digits = body.substr(colon + 1);
    if (digits.empty() || digits.size() > 7 || ref->control) return false;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
    }
    ref->index = std::stoll(digits);
    if (ref->index > kMaxOutputIndex) return false;
    body = body.substr(0, colon);
  }
  if (body.empty()) return false;
  ref->node = body;
  return true;
}

std::string TfTypeName(int dt) {
  if (tf::DataType_IsValid(dt)) return tf::DataType_Name(static_cast<tf::DataType>(dt));
  return "type " + std::to_string(dt);
}

// The engine type of a TensorFlow DataType (int32 is carried as int64).
StatusOr<DataType> EngineType(int dt, const std::string& node) {
  switch (dt) {
    case tf::DT_FLOAT:
      return DataType::kFloat32;
    case tf::DT_INT32:
    case tf::DT_INT64:
      return DataType::kInt64;
    case tf::DT_BOOL:
      return DataType::kBool;
    default:
      return UnimplementedError("node '" + node + "': element type " + TfTypeName(dt) +
                                " is not supported");
  }
}

int64_t OnnxTypeCode(DataType t) {
  return t == DataType::kFloat32 ? 1 : t == DataType::kInt64 ? 7 : 9;
}

// A constant's contents: tensor_content, or the typed *_val list, whose last element repeats to
// fill the shape (TensorFlow's rule; an empty list is zeros).
StatusOr<HostTensor> TensorFromTf(const tf::TensorProto& p, const std::string& node,
                                  GraphBuilder& builder) {
  const int64_t max_elements = builder.limits().max_tensor_elements;
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError("node '" + node + "': constant " + what);
  };
  SALUS_ASSIGN_OR_RETURN(DataType type, EngineType(p.dtype(), node));
  if (p.tensor_shape().unknown_rank()) return bad("of unknown rank");
  Shape shape;
  int64_t n = 1;
  for (const auto& d : p.tensor_shape().dim()) {
    if (d.size() < 0 || (d.size() > 0 && n > max_elements / d.size())) return bad("has bad dims");
    n *= d.size();
    shape.push_back(d.size());
  }
  if (n > max_elements) return bad("is too large");
  // Reserved before it is filled: one value may describe a large tensor (Note [Compile budgets]).
  SALUS_ASSIGN_OR_RETURN(HostTensor t,
                         builder.NewConstant(type, shape, "node '" + node + "': constant"));
  const size_t count = static_cast<size_t>(n);
  if (!p.tensor_content().empty()) {
    const std::string& raw = p.tensor_content();
    const size_t src_bytes = p.dtype() == tf::DT_INT32 ? 4 : ElementSize(type);
    if (raw.size() != count * src_bytes) {
      return bad("has " + std::to_string(raw.size()) + " content bytes, expected " +
                 std::to_string(count * src_bytes));
    }
    if (p.dtype() == tf::DT_INT32) {
      for (size_t i = 0; i < count; ++i) {
        int32_t v;
        std::memcpy(&v, raw.data() + 4 * i, 4);
        t.int64s()[i] = v;
      }
    } else if (!t.bytes.empty()) {
      std::memcpy(t.bytes.data(), raw.data(), t.bytes.size());
      if (type == DataType::kBool) {
        for (std::byte& b : t.bytes) b = std::byte(b != std::byte{0});
      }
    }
    return t;
  }
  // The typed list, repeated to fill.
  auto fill = [&](int size, auto get, auto set) -> Status {
    if (static_cast<size_t>(size) > count) {
      return bad("has " + std::to_string(size) + " values for " + std::to_string(count) +
                 " elements");
    }
    for (size_t i = 0; i < count && size > 0; ++i) {
      set(i, get(std::min<size_t>(i, static_cast<size_t>(size) - 1)));
    }
    return OkStatus();
  };
  switch (p.dtype()) {
    case tf::DT_FLOAT:
      SALUS_RETURN_IF_ERROR(fill(
          p.float_val_size(), [&](size_t i) { return p.float_val(static_cast<int>(i)); },
          [&](size_t i, float v) { t.floats()[i] = v; }));
      break;
    case tf::DT_INT32:
      SALUS_RETURN_IF_ERROR(fill(
          p.int_val_size(), [&](size_t i) { return p.int_val(static_cast<int>(i)); },
          [&](size_t i, int32_t v) { t.int64s()[i] = v; }));
      break;
    case tf::DT_INT64:
      SALUS_RETURN_IF_ERROR(fill(
          p.int64_val_size(), [&](size_t i) { return p.int64_val(static_cast<int>(i)); },
          [&](size_t i, int64_t v) { t.int64s()[i] = v; }));
      break;
    default:  // DT_BOOL
      SALUS_RETURN_IF_ERROR(fill(
          p.bool_val_size(), [&](size_t i) { return p.bool_val(static_cast<int>(i)); },
          [&](size_t i, bool v) { t.bytes[i] = std::byte(v ? 1 : 0); }));
      break;
  }
  return t;
}

// A reduction of an int64 constant over sorted axes (TensorFlow's shape arithmetic: Prod of a
// shape, Sum of sizes), computed at import since the engine reduces floats only.
HostTensor ReduceInt64(const HostTensor& x, const std::vector<int64_t>& axes, bool keep,
                       const std::string& op) {
  Shape out_keep = x.shape;
  for (int64_t a : axes) out_keep[a] = 1;
  Shape out;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    if (!reduced || keep) out.push_back(out_keep[d]);
  }
  const int64_t count = NumElements(out_keep);
  std::vector<int64_t> acc(count, op == "Prod"  ? 1
                                  : op == "Max" ? std::numeric_limits<int64_t>::min()
                                  : op == "Min" ? std::numeric_limits<int64_t>::max()
                                                : 0);
  std::vector<int64_t> seen(count, 0);
  const int64_t total = x.num_elements();
  const size_t rank = x.shape.size();
  for (int64_t e = 0; e < total; ++e) {
    int64_t rem = e, o = 0, stride = 1;
    for (size_t d = rank; d-- > 0;) {
      const int64_t i = rem % x.shape[d];
      rem /= x.shape[d];
      o += (out_keep[d] == 1 ? 0 : i) * stride;
      stride *= out_keep[d];
    }
    const uint64_t v = static_cast<uint64_t>(x.int64s()[e]);
    uint64_t a = static_cast<uint64_t>(acc[o]);
    if (op == "Prod") {
      a *= v;
    } else if (op == "Max") {
      a = static_cast<uint64_t>(std::max(acc[o], x.int64s()[e]));
    } else if (op == "Min") {
      a = static_cast<uint64_t>(std::min(acc[o], x.int64s()[e]));
    } else {
      a += v;
    }
    acc[o] = static_cast<int64_t>(a);
    ++seen[o];
  }
  if (op == "Mean") {
    for (int64_t o = 0; o < count; ++o) acc[o] = seen[o] > 0 ? acc[o] / seen[o] : 0;
  }
  return HostTensor::FromInt64s(out, acc);
}

// A StridedSlice's spec made dense (Importer::SliceSpec).
struct DenseSlice {
  std::vector<int64_t> starts, ends, steps;
  Shape sliced, out;
  bool whole = true;  // the Slice takes everything
};

class Importer;
using Lowering = Status (Importer::*)();

class Importer {
 public:
  Importer(const tf::GraphDef& gd, const TfImportOptions& options)
      : gd_(gd), options_(options), builder_(&graph_, options.limits) {}

  StatusOr<Graph> Run();
  static const std::map<std::string, Lowering>& Table();

 private:
  // Passes.
  Status Index();
  Status Order(std::vector<int>* order);
  void FindAssignedVariables();
  Status LowerNode(int index);

  // The node being lowered.
  const std::string& name() const { return def_->name(); }
  const std::string& op() const { return def_->op(); }
  Status Bad(const std::string& what) const {
    return InvalidArgumentError("node '" + name() + "': op " + op() + ": " + what);
  }
  Status Refuse(const std::string& what) const {
    return UnimplementedError("node '" + name() + "': op " + op() + ": " + what);
  }
  Status Arity(size_t min, size_t max) const;
  StatusOr<ValueId> In(size_t i) const;
  StatusOr<ValueId> Var(size_t i) const;
  const Value& V(ValueId id) const { return graph_.value(id); }
  const HostTensor* ConstOf(ValueId id) const {
    return V(id).kind == ValueKind::kConstant ? &V(id).data : nullptr;
  }
  StatusOr<const HostTensor*> ConstIn(size_t i, const std::string& what) const;
  StatusOr<std::vector<int64_t>> ConstInts(size_t i, const std::string& what) const;

  // Attributes.
  const tf::AttrValue* Attr(const std::string& key) const;
  StatusOr<DataType> TfType(const std::string& key) const;
  int64_t TfInt(const std::string& key, int64_t fallback) const;
  bool TfBool(const std::string& key, bool fallback) const;
  std::string TfString(const std::string& key, const std::string& fallback) const;
  StatusOr<std::vector<int64_t>> TfInts(const std::string& key) const;

  // Engine nodes and values.
  StatusOr<std::vector<ValueId>> EmitN(const std::string& op, std::vector<ValueId> inputs,
                                       std::map<std::string, Attribute> attrs, size_t outputs);
  StatusOr<ValueId> Emit(const std::string& op, std::vector<ValueId> inputs,
                         std::map<std::string, Attribute> attrs = {});
  // An engine ("Salus*") op whose single output's type and shape are given.
  StatusOr<ValueId> EmitShaped(const std::string& op, std::vector<ValueId> inputs,
                               std::map<std::string, Attribute> attrs, DataType type,
                               const Shape& shape);
  ValueId Constant(HostTensor t);
  ValueId ScalarLike(ValueId like, double v);
  ValueId Int64s(const std::vector<int64_t>& v) {
    return Constant(HostTensor::FromInt64s({static_cast<int64_t>(v.size())}, v));
  }
  StatusOr<ValueId> Reshape(ValueId x, const Shape& to);
  StatusOr<ValueId> Transpose(ValueId x, const std::vector<int64_t>& perm);
  StatusOr<ValueId> CastTo(ValueId x, DataType to);
  void Bind(size_t k, ValueId v) { Bind(k, TfTensor{v, kNoValue, kNoValue}); }
  void Bind(size_t k, TfTensor t);

  // Lowerings, grouped as in Table().
  Status Placeholder();
  Status VarHandleOp();
  Status Const();
  Status PassThrough();
  Status IdentityN();
  Status NoOp();
  Status ReadVariable();
  Status AssignVariable();
  Status ResourceGather();
  Status Binary();
  Status DivNoNan();
  Status FloorDivMod();
  Status Compare();
  Status Logical();
  Status Unary();
  Status UnaryGrad();
  Status ReluGrad();
  Status BiasAdd();
  Status BiasAddGrad();
  Status MatMul();
  Status BatchMatMul();
  Status Einsum();
  Status UnsortedSegmentSum();
  Status Softmax();
  Status SparseSoftmaxCrossEntropy();
  Status SoftmaxCrossEntropy();
  Status Reduce();
  Status ArgMax();
  Status Cast();
  Status Bitcast();
  Status BitwiseAnd();
  Status Select();
  Status LikeOp();
  Status Fill();
  Status BroadcastTo();
  Status Tile();
  Status ExpandDims();
  Status Squeeze();
  Status ReshapeOp();
  Status TransposeOp();
  Status Concat();
  Status Pack();
  Status StridedSlice();
  Status SliceOp();
  Status SplitOp();
  Status ConcatOffset();
  Status Pad();
  Status MirrorPad();
  Status MirrorPadGrad();
  // MirrorPad's and MirrorPadGrad's operands: the tensor, one (before, after) per dim, the mode.
  struct MirrorArgs {
    ValueId value;
    std::vector<int64_t> paddings;
    bool reflect;
  };
  StatusOr<MirrorArgs> MirrorOperands();
  Status DynamicStitch();
  Status FusedBatchNorm();
  Status FusedBatchNormGrad();
  struct BatchNormAxes;
  StatusOr<BatchNormAxes> BatchNormLayout(ValueId x);
  Status Relu6();
  Status Relu6Grad();
  Status StridedSliceGrad();
  StatusOr<DenseSlice> SliceSpec(const Shape& xs, size_t first_input);
  Status ShapeOp();
  Status BroadcastGradientArgs();
  Status Range();
  Status Gather();
  Status AddN();
  Status ClipByValue();
  Status Conv2D();
  Status Conv2DBackpropInput();
  Status Conv2DBackpropFilter();
  Status Pool();
  Status MaxPoolGrad();
  Status AvgPoolGrad();
  Status LeakyRelu();
  Status RandomKeyCounter();
  Status RandomDraw();
  // SalusPhiloxKeyCounter of the seed input `i` (Note [TensorFlow random numbers]).
  StatusOr<std::vector<ValueId>> KeyCounterOf(size_t i);

  // Conv2D/MaxPool attribute helpers.
 public:
  struct Window2D {
    bool nchw = false;
    std::vector<int64_t> strides, dilations, kernel, pads;  // engine order (H, W; pads t l b r)
  };

 private:
  StatusOr<Window2D> WindowFor(const Shape& x_nhwc_or_nchw, const std::vector<int64_t>& kernel_hw,
                               bool pooling);
  std::map<std::string, Attribute> ConvAttrs(const Window2D& w) const;
  bool Depthwise() const;
  Shape OihwShape(const Shape& fs) const;
  StatusOr<ValueId> OihwFilter(ValueId f);
  StatusOr<int64_t> Groups(int64_t in_c, const Shape& fs) const;
  StatusOr<Window2D> PoolWindow(const Shape& x);
  std::map<std::string, Attribute> PoolAttrs(const Window2D& w) const;
  Status PoolGradOf(ValueId xc, ValueId dy, const Window2D& w, const std::string& forward);
  StatusOr<ValueId> ToNchw(ValueId x, bool nchw) {
    return nchw ? StatusOr<ValueId>(x) : Transpose(x, {0, 3, 1, 2});
  }
  StatusOr<ValueId> FromNchw(ValueId x, bool nchw) {
    return nchw ? StatusOr<ValueId>(x) : Transpose(x, {0, 2, 3, 1});
  }

  const tf::GraphDef& gd_;
  const TfImportOptions& options_;
  Graph graph_;
  GraphBuilder builder_;
  std::unordered_map<std::string, int> index_;         // node name -> GraphDef index
  std::vector<std::vector<InputRef>> inputs_;          // parsed, per node
  std::unordered_map<std::string, TfTensor> tensors_;  // "n:k" -> tensor
  std::unordered_set<std::string> assigned_;           // VarHandleOp names
  std::vector<bool> named_;                            // per value: has a TF name

  // The node being lowered.
  const tf::NodeDef* def_ = nullptr;
  std::vector<TfTensor> in_;
  ValueId first_new_ = 0;
};

const std::map<std::string, Lowering>& Importer::Table() {
  // clang-format off
  static const std::map<std::string, Lowering> table = {
      {"Placeholder", &Importer::Placeholder}, {"VarHandleOp", &Importer::VarHandleOp},
      {"Const", &Importer::Const},
      {"Identity", &Importer::PassThrough}, {"Snapshot", &Importer::PassThrough},
      {"StopGradient", &Importer::PassThrough}, {"PreventGradient", &Importer::PassThrough},
      {"CheckNumerics", &Importer::PassThrough}, {"EnsureShape", &Importer::PassThrough},
      {"IdentityN", &Importer::IdentityN}, {"NoOp", &Importer::NoOp},
      {"ReadVariableOp", &Importer::ReadVariable},
      {"AssignVariableOp", &Importer::AssignVariable},
      {"AssignAddVariableOp", &Importer::AssignVariable},
      {"AssignSubVariableOp", &Importer::AssignVariable},
      {"ResourceGather", &Importer::ResourceGather},
      {"Add", &Importer::Binary}, {"AddV2", &Importer::Binary}, {"Sub", &Importer::Binary},
      {"Mul", &Importer::Binary}, {"RealDiv", &Importer::Binary}, {"Div", &Importer::Binary},
      {"Maximum", &Importer::Binary}, {"Minimum", &Importer::Binary}, {"Pow", &Importer::Binary},
      {"SquaredDifference", &Importer::Binary},
      {"DivNoNan", &Importer::DivNoNan},
      {"FloorMod", &Importer::FloorDivMod}, {"FloorDiv", &Importer::FloorDivMod},
      {"Equal", &Importer::Compare}, {"NotEqual", &Importer::Compare},
      {"Less", &Importer::Compare}, {"LessEqual", &Importer::Compare},
      {"Greater", &Importer::Compare}, {"GreaterEqual", &Importer::Compare},
      {"LogicalAnd", &Importer::Logical}, {"LogicalOr", &Importer::Logical},
      {"LogicalNot", &Importer::Logical},
      {"Neg", &Importer::Unary}, {"Relu", &Importer::Unary}, {"Sigmoid", &Importer::Unary},
      {"Tanh", &Importer::Unary}, {"Exp", &Importer::Unary}, {"Log", &Importer::Unary},
      {"Sqrt", &Importer::Unary}, {"Rsqrt", &Importer::Unary}, {"Abs", &Importer::Unary},
      {"Erf", &Importer::Unary}, {"Erfc", &Importer::Unary}, {"Softplus", &Importer::Unary},
      {"Floor", &Importer::Unary},
      {"Reciprocal", &Importer::Unary}, {"Inv", &Importer::Unary}, {"Square", &Importer::Unary},
      {"Sign", &Importer::Unary}, {"Softsign", &Importer::Unary}, {"Elu", &Importer::Unary},
      {"LeakyRelu", &Importer::LeakyRelu},
      {"SigmoidGrad", &Importer::UnaryGrad}, {"TanhGrad", &Importer::UnaryGrad},
      {"SqrtGrad", &Importer::UnaryGrad}, {"RsqrtGrad", &Importer::UnaryGrad},
      {"ReciprocalGrad", &Importer::UnaryGrad}, {"InvGrad", &Importer::UnaryGrad},
      {"ReluGrad", &Importer::ReluGrad},
      {"BiasAdd", &Importer::BiasAdd}, {"BiasAddGrad", &Importer::BiasAddGrad},
      {"MatMul", &Importer::MatMul},
      {"BatchMatMul", &Importer::BatchMatMul}, {"BatchMatMulV2", &Importer::BatchMatMul},
      {"BatchMatMulV3", &Importer::BatchMatMul},
      {"Softmax", &Importer::Softmax}, {"LogSoftmax", &Importer::Softmax},
      {"SparseSoftmaxCrossEntropyWithLogits", &Importer::SparseSoftmaxCrossEntropy},
      {"SoftmaxCrossEntropyWithLogits", &Importer::SoftmaxCrossEntropy},
      {"Sum", &Importer::Reduce}, {"Mean", &Importer::Reduce}, {"Max", &Importer::Reduce},
      {"Min", &Importer::Reduce}, {"Prod", &Importer::Reduce},
      {"ArgMax", &Importer::ArgMax},
      {"Cast", &Importer::Cast}, {"Bitcast", &Importer::Bitcast},
      {"BitwiseAnd", &Importer::BitwiseAnd},
      {"Select", &Importer::Select}, {"SelectV2", &Importer::Select},
      {"ZerosLike", &Importer::LikeOp}, {"OnesLike", &Importer::LikeOp},
      {"Fill", &Importer::Fill}, {"BroadcastTo", &Importer::BroadcastTo},
      {"Tile", &Importer::Tile}, {"ExpandDims", &Importer::ExpandDims},
      {"Squeeze", &Importer::Squeeze}, {"Reshape", &Importer::ReshapeOp},
      {"Transpose", &Importer::TransposeOp},
      {"ConcatV2", &Importer::Concat}, {"Concat", &Importer::Concat},
      {"Pack", &Importer::Pack}, {"StridedSlice", &Importer::StridedSlice},
      {"Shape", &Importer::ShapeOp}, {"ShapeN", &Importer::ShapeOp},
      {"Size", &Importer::ShapeOp}, {"Rank", &Importer::ShapeOp},
      {"BroadcastGradientArgs", &Importer::BroadcastGradientArgs},
      {"Range", &Importer::Range},
      {"GatherV2", &Importer::Gather}, {"Gather", &Importer::Gather},
      {"AddN", &Importer::AddN}, {"ClipByValue", &Importer::ClipByValue},
      {"Conv2D", &Importer::Conv2D},
      {"Conv2DBackpropInput", &Importer::Conv2DBackpropInput},
      {"Conv2DBackpropFilter", &Importer::Conv2DBackpropFilter},
      {"DepthwiseConv2dNative", &Importer::Conv2D},
      {"DepthwiseConv2dNativeBackpropInput", &Importer::Conv2DBackpropInput},
      {"DepthwiseConv2dNativeBackpropFilter", &Importer::Conv2DBackpropFilter},
      {"MaxPool", &Importer::Pool}, {"MaxPoolGrad", &Importer::MaxPoolGrad},
      {"AvgPool", &Importer::Pool}, {"AvgPoolGrad", &Importer::AvgPoolGrad},
      {"Pad", &Importer::Pad}, {"PadV2", &Importer::Pad},
      {"MirrorPad", &Importer::MirrorPad}, {"MirrorPadGrad", &Importer::MirrorPadGrad},
      {"DynamicStitch", &Importer::DynamicStitch},
      {"FusedBatchNorm", &Importer::FusedBatchNorm},
      {"FusedBatchNormV2", &Importer::FusedBatchNorm},
      {"FusedBatchNormV3", &Importer::FusedBatchNorm},
      {"FusedBatchNormGrad", &Importer::FusedBatchNormGrad},
      {"FusedBatchNormGradV2", &Importer::FusedBatchNormGrad},
      {"FusedBatchNormGradV3", &Importer::FusedBatchNormGrad},
      {"ParallelDynamicStitch", &Importer::DynamicStitch},
      {"Slice", &Importer::SliceOp}, {"StridedSliceGrad", &Importer::StridedSliceGrad},
      {"Split", &Importer::SplitOp}, {"SplitV", &Importer::SplitOp},
      {"Unpack", &Importer::SplitOp}, {"ConcatOffset", &Importer::ConcatOffset},
      {"Relu6", &Importer::Relu6}, {"Relu6Grad", &Importer::Relu6Grad},
      {"Einsum", &Importer::Einsum},
      {"UnsortedSegmentSum", &Importer::UnsortedSegmentSum},
      {"StatelessRandomGetKeyCounter", &Importer::RandomKeyCounter},
      {"StatelessRandomGetKeyCounterAlg", &Importer::RandomKeyCounter},
      {"StatelessRandomUniform", &Importer::RandomDraw},
      {"StatelessRandomUniformV2", &Importer::RandomDraw},
      {"StatelessRandomNormal", &Importer::RandomDraw},
      {"StatelessRandomNormalV2", &Importer::RandomDraw},
      {"StatelessTruncatedNormal", &Importer::RandomDraw},
      {"StatelessTruncatedNormalV2", &Importer::RandomDraw},
  };
  // clang-format on
  return table;
}

// ---------------------------------------------------------------------------------------------
// Passes.

Status Importer::Index() {
  inputs_.resize(gd_.node_size());
  for (int i = 0; i < gd_.node_size(); ++i) {
    const tf::NodeDef& nd = gd_.node(i);
    const std::string& n = nd.name();
    if (n.empty() || n.find(':') != std::string::npos || n[0] == '^') {
      return InvalidArgumentError("node " + std::to_string(i) + ": bad name '" + n + "'");
    }
    if (!index_.emplace(n, i).second) {
      return InvalidArgumentError("node '" + n + "' is defined twice");
    }
  }
  for (int i = 0; i < gd_.node_size(); ++i) {
    const tf::NodeDef& nd = gd_.node(i);
    for (const std::string& s : nd.input()) {
      InputRef ref;
      if (!ParseInput(s, &ref)) {
        return InvalidArgumentError("node '" + nd.name() + "': bad input '" + s + "'");
      }
      if (index_.count(ref.node) == 0) {
        return InvalidArgumentError("node '" + nd.name() + "': input '" + s + "' is undefined");
      }
      inputs_[i].push_back(std::move(ref));
    }
  }
  return OkStatus();
}

// Kahn's algorithm over data and control edges, the smallest GraphDef index first (writes of
// variables after everything else that is ready).
Status Importer::Order(std::vector<int>* order) {
  const int count = gd_.node_size();
  std::vector<int> pending(count, 0);
  std::vector<std::vector<int>> consumers(count);
  for (int i = 0; i < count; ++i) {
    for (const InputRef& ref : inputs_[i]) {
      consumers[index_.at(ref.node)].push_back(i);
      ++pending[i];
    }
  }
  // Variable writes go last among the ready nodes, so the reads before them can share the
  // variable's memory instead of copying it (ElideSnapshots).
  auto key = [&](int i) {
    const std::string& op = gd_.node(i).op();
    const bool write =
        op == "AssignVariableOp" || op == "AssignAddVariableOp" || op == "AssignSubVariableOp";
    return std::pair<int, int>(write ? 1 : 0, i);
  };
  std::priority_queue<std::pair<int, int>, std::vector<std::pair<int, int>>,
                      std::greater<std::pair<int, int>>>
      ready;
  for (int i = 0; i < count; ++i) {
    if (pending[i] == 0) ready.push(key(i));
  }
  while (!ready.empty()) {
    const int i = ready.top().second;
    ready.pop();
    order->push_back(i);
    for (int c : consumers[i]) {
      if (--pending[c] == 0) ready.push(key(c));
    }
  }
  if (static_cast<int>(order->size()) != count) {
    for (int i = 0; i < count; ++i) {
      if (pending[i] > 0) {
        return InvalidArgumentError("node '" + gd_.node(i).name() + "' is on a cycle");
      }
    }
  }
  return OkStatus();
}

// The VarHandleOps that some Assign*VariableOp writes (through Identity nodes of the handle).
void Importer::FindAssignedVariables() {
  for (int i = 0; i < gd_.node_size(); ++i) {
    const std::string& op = gd_.node(i).op();
    if (op != "AssignVariableOp" && op != "AssignAddVariableOp" && op != "AssignSubVariableOp") {
      continue;
    }
    if (inputs_[i].empty() || inputs_[i][0].control) continue;
    int at = index_.at(inputs_[i][0].node);
    int64_t output = inputs_[i][0].index;
    for (int hops = 0; hops < gd_.node_size(); ++hops) {
      const tf::NodeDef& nd = gd_.node(at);
      if (nd.op() == "VarHandleOp") {
        assigned_.insert(nd.name());
        break;
      }
      // Handles pass through Identity (input 0) and IdentityN (input k for output k).
      const bool identity_n = nd.op() == "IdentityN";
      if (nd.op() != "Identity" && !identity_n) break;
      const size_t k = identity_n ? static_cast<size_t>(output) : 0;
      if (k >= inputs_[at].size() || inputs_[at][k].control) break;
      output = inputs_[at][k].index;
      at = index_.at(inputs_[at][k].node);
    }
  }
}

Status Importer::LowerNode(int index) {
  def_ = &gd_.node(index);
  const auto& table = Table();
  auto it = table.find(op());
  if (it == table.end()) {
    return UnimplementedError("node '" + name() + "': op " + op() + " is not supported");
  }
  in_.clear();
  for (const InputRef& ref : inputs_[index]) {
    if (ref.control) continue;
    auto t = tensors_.find(ref.node + ":" + std::to_string(ref.index));
    if (t == tensors_.end()) {
      return InvalidArgumentError("node '" + name() + "': input '" + ref.node + ":" +
                                  std::to_string(ref.index) + "' is not an output of '" + ref.node +
                                  "'");
    }
    in_.push_back(t->second);
  }
  first_new_ = static_cast<ValueId>(graph_.values().size());
  return (this->*(it->second))();
}

StatusOr<Graph> Importer::Run() {
  SALUS_RETURN_IF_ERROR(Index());
  // Every op is checked before any is lowered: an unsupported op anywhere is the error.
  for (const tf::NodeDef& nd : gd_.node()) {
    if (Table().count(nd.op()) == 0) {
      return UnimplementedError("node '" + nd.name() + "': op " + nd.op() + " is not supported");
    }
  }
  std::vector<int> order;
  SALUS_RETURN_IF_ERROR(Order(&order));
  FindAssignedVariables();
  for (int i : order) SALUS_RETURN_IF_ERROR(LowerNode(i));
  return std::move(graph_);
}

// ---------------------------------------------------------------------------------------------
// Helpers.

Status Importer::Arity(size_t min, size_t max) const {
  if (in_.size() < min || in_.size() > max) {
    return Bad(
        "takes " +
        (min == max ? std::to_string(min) : std::to_string(min) + " to " + std::to_string(max)) +
        " inputs, not " + std::to_string(in_.size()));
  }
  return OkStatus();
}

StatusOr<ValueId> Importer::In(size_t i) const {
  if (i >= in_.size()) return Bad("missing input " + std::to_string(i));
  const TfTensor& t = in_[i];
  if (t.bits_of != kNoValue) {
    return Refuse("reads a Bitcast of a float to int32; only BitwiseAnd with the sign mask may");
  }
  if (t.value == kNoValue) return Bad("input " + std::to_string(i) + " is a resource handle");
  return t.value;
}

StatusOr<ValueId> Importer::Var(size_t i) const {
  if (i >= in_.size()) return Bad("missing input " + std::to_string(i));
  if (in_[i].variable == kNoValue) {
    return Bad("input " + std::to_string(i) + " is not a variable (VarHandleOp)");
  }
  return in_[i].variable;
}

StatusOr<const HostTensor*> Importer::ConstIn(size_t i, const std::string& what) const {
  SALUS_ASSIGN_OR_RETURN(ValueId id, In(i));
  const HostTensor* t = ConstOf(id);
  if (t == nullptr) return Bad(what + " must be a compile-time constant");
  return t;
}

StatusOr<std::vector<int64_t>> Importer::ConstInts(size_t i, const std::string& what) const {
  SALUS_ASSIGN_OR_RETURN(const HostTensor* t, ConstIn(i, what));
  if (t->type != DataType::kInt64) return Bad(what + " must be integers");
  return t->ToInt64s();
}

const tf::AttrValue* Importer::Attr(const std::string& key) const {
  auto it = def_->attr().find(key);
  return it == def_->attr().end() ? nullptr : &it->second;
}

StatusOr<DataType> Importer::TfType(const std::string& key) const {
  const tf::AttrValue* a = Attr(key);
  if (a == nullptr || a->value_case() != tf::AttrValue::kType) {
    return Bad("missing type attribute '" + key + "'");
  }
  return EngineType(a->type(), name());
}

int64_t Importer::TfInt(const std::string& key, int64_t fallback) const {
  const tf::AttrValue* a = Attr(key);
  return a != nullptr && a->value_case() == tf::AttrValue::kI ? a->i() : fallback;
}

bool Importer::TfBool(const std::string& key, bool fallback) const {
  const tf::AttrValue* a = Attr(key);
  return a != nullptr && a->value_case() == tf::AttrValue::kB ? a->b() : fallback;
}

std::string Importer::TfString(const std::string& key, const std::string& fallback) const {
  const tf::AttrValue* a = Attr(key);
  return a != nullptr && a->value_case() == tf::AttrValue::kS ? a->s() : fallback;
}

StatusOr<std::vector<int64_t>> Importer::TfInts(const std::string& key) const {
  const tf::AttrValue* a = Attr(key);
  if (a == nullptr) return std::vector<int64_t>{};
  if (a->value_case() != tf::AttrValue::kList) return Bad("attribute '" + key + "' is not a list");
  return std::vector<int64_t>(a->list().i().begin(), a->list().i().end());
}

StatusOr<std::vector<ValueId>> Importer::EmitN(const std::string& engine_op,
                                               std::vector<ValueId> inputs,
                                               std::map<std::string, Attribute> attrs,
                                               size_t outputs) {
  Node n;
  n.op = engine_op;
  n.name = name();
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  for (size_t k = 0; k < outputs; ++k) {
    Value v;
    v.name = graph_.UniqueName(name());
    v.type = DataType::kUndefined;
    n.outputs.push_back(graph_.AddValue(std::move(v)));
  }
  std::vector<ValueId> out = n.outputs;
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  return out;
}

StatusOr<ValueId> Importer::Emit(const std::string& engine_op, std::vector<ValueId> inputs,
                                 std::map<std::string, Attribute> attrs) {
  SALUS_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                         EmitN(engine_op, std::move(inputs), std::move(attrs), 1));
  return out[0];
}

StatusOr<ValueId> Importer::EmitShaped(const std::string& engine_op, std::vector<ValueId> inputs,
                                       std::map<std::string, Attribute> attrs, DataType type,
                                       const Shape& shape) {
  Node n;
  n.op = engine_op;
  n.name = name();
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  Value v;
  v.name = graph_.UniqueName(name());
  v.type = type;
  v.shape = shape;
  const ValueId out = graph_.AddValue(std::move(v));
  n.outputs = {out};
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  return out;
}

ValueId Importer::Constant(HostTensor t) {
  Value v;
  v.name = graph_.UniqueName(name() + "/const");
  v.type = t.type;
  v.shape = t.shape;
  v.kind = ValueKind::kConstant;
  v.data = std::move(t);
  return graph_.AddValue(std::move(v));
}

// A scalar of `like`'s element type.
ValueId Importer::ScalarLike(ValueId like, double v) {
  const DataType t = V(like).type;
  if (t == DataType::kInt64) return Constant(HostTensor::FromInt64s({}, {static_cast<int64_t>(v)}));
  if (t == DataType::kBool) {
    HostTensor b(DataType::kBool, {});
    b.bytes[0] = std::byte(v != 0 ? 1 : 0);
    return Constant(std::move(b));
  }
  return Constant(HostTensor::FromFloats({}, {static_cast<float>(v)}));
}

StatusOr<ValueId> Importer::Reshape(ValueId x, const Shape& to) {
  if (V(x).shape == to) return x;
  return Emit("Reshape", {x, Int64s(to)}, {{"allowzero", IntAttr(1)}});
}

StatusOr<ValueId> Importer::Transpose(ValueId x, const std::vector<int64_t>& perm) {
  bool identity = perm.size() == V(x).shape.size();
  for (size_t i = 0; identity && i < perm.size(); ++i)
    identity = perm[i] == static_cast<int64_t>(i);
  if (identity) return x;
  return Emit("Transpose", {x}, {{"perm", IntsAttr(perm)}});
}

StatusOr<ValueId> Importer::CastTo(ValueId x, DataType to) {
  if (V(x).type == to) return x;
  return Emit("Cast", {x}, {{"to", IntAttr(OnnxTypeCode(to))}});
}

void Importer::Bind(size_t k, TfTensor t) {
  const std::string tf_name = name() + ":" + std::to_string(k);
  if (t.value != kNoValue) {
    const ValueId id = t.value;
    named_.resize(graph_.values().size(), false);
    if (id >= first_new_ && !named_[id]) {
      graph_.Rename(id, k == 0 ? name() : tf_name);
      named_[id] = true;
    } else if (k == 0) {
      graph_.AddAlias(name(), id);
    }
    graph_.AddAlias(tf_name, id);
  }
  tensors_[tf_name] = t;
}

// ---------------------------------------------------------------------------------------------
// Graph inputs, variables and constants.

Status Importer::Placeholder() {
  SALUS_RETURN_IF_ERROR(Arity(0, 0));
  const tf::AttrValue* dtype = Attr("dtype");
  if (dtype != nullptr && dtype->type() == tf::DT_RESOURCE) {
    return Refuse("a resource Placeholder; capture variables as VarHandleOp nodes");
  }
  Value v;
  v.name = name();
  if (dtype != nullptr && dtype->type() == tf::DT_UINT64) {
    // An eager random op's key and counter (Philox state): their bits travel as int64. int64
    // arithmetic would differ from uint64's, so nothing else may read them.
    for (const tf::NodeDef& n : gd_.node()) {
      for (const std::string& in : n.input()) {
        if (in != name() && in.rfind(name() + ":", 0) != 0) continue;
        if (n.op().rfind("StatelessRandom", 0) != 0 &&
            n.op().rfind("StatelessTruncatedNormal", 0) != 0) {
          return Refuse("a uint64 input read by " + n.op() + " '" + n.name() +
                        "' (only the random ops' key and counter may be uint64)");
        }
      }
    }
    v.type = DataType::kInt64;
  } else {
    SALUS_ASSIGN_OR_RETURN(v.type, TfType("dtype"));
  }
  auto it = options_.input_shapes.find(name());
  if (it == options_.input_shapes.end()) {
    return InvalidArgumentError("Placeholder '" + name() +
                                "' has no shape; give it when compiling");
  }
  v.shape = it->second;
  for (int64_t d : v.shape) {
    if (d < 0) return Bad("negative dim in the given shape " + ShapeString(v.shape));
  }
  if (TooManyElements(v.shape, options_.limits.max_tensor_elements))
    return Bad("input is too large");
  if (const tf::AttrValue* s = Attr("shape");
      s != nullptr && s->has_shape() && !s->shape().unknown_rank()) {
    const auto& dims = s->shape().dim();
    bool ok = dims.size() == static_cast<int>(v.shape.size());
    for (int i = 0; ok && i < dims.size(); ++i)
      ok = dims[i].size() < 0 || dims[i].size() == v.shape[i];
    if (!ok) return Bad("the given shape " + ShapeString(v.shape) + " does not fit the node's");
  }
  v.kind = ValueKind::kInput;
  const ValueId id = graph_.AddValue(std::move(v));
  graph_.inputs().push_back(id);
  named_.resize(graph_.values().size(), false);
  named_[id] = true;
  Bind(0, id);
  return OkStatus();
}

Status Importer::VarHandleOp() {
  SALUS_RETURN_IF_ERROR(Arity(0, 0));
  Value v;
  v.name = name();
  SALUS_ASSIGN_OR_RETURN(v.type, TfType("dtype"));
  const tf::AttrValue* s = Attr("shape");
  if (s == nullptr || !s->has_shape() || s->shape().unknown_rank()) {
    return Bad("a variable needs a fully defined shape");
  }
  int64_t n = 1;
  for (const auto& d : s->shape().dim()) {
    if (d.size() < 0) return Bad("a variable needs a fully defined shape");
    if (d.size() > 0 && n > options_.limits.max_tensor_elements / d.size()) {
      return Bad("variable is too large");
    }
    n *= d.size();
    v.shape.push_back(d.size());
  }
  v.kind = ValueKind::kState;  // zero until written (InitializePersistent zero-fills it)
  const ValueId id = graph_.AddValue(std::move(v));
  named_.resize(graph_.values().size(), false);
  named_[id] = true;
  graph_.AddAlias(name() + ":0", id);
  tensors_[name() + ":0"] = TfTensor{kNoValue, id, kNoValue};
  return OkStatus();
}

Status Importer::Const() {
  SALUS_RETURN_IF_ERROR(Arity(0, 0));
  const tf::AttrValue* value = Attr("value");
  if (value == nullptr || !value->has_tensor()) return Bad("missing tensor attribute 'value'");
  SALUS_ASSIGN_OR_RETURN(HostTensor t, TensorFromTf(value->tensor(), name(), builder_));
  Bind(0, Constant(std::move(t)));
  return OkStatus();
}

Status Importer::PassThrough() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  if (op() == "EnsureShape") {
    SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
    const tf::AttrValue* s = Attr("shape");
    if (s != nullptr && s->has_shape() && !s->shape().unknown_rank()) {
      const auto& dims = s->shape().dim();
      const Shape xs = V(x).shape;
      bool ok = dims.size() == static_cast<int>(xs.size());
      for (int i = 0; ok && i < dims.size(); ++i)
        ok = dims[i].size() < 0 || dims[i].size() == xs[i];
      if (!ok) return Bad("shape " + ShapeString(xs) + " does not fit the expected shape");
    }
  }
  Bind(0, in_[0]);
  return OkStatus();
}

Status Importer::IdentityN() {
  for (size_t k = 0; k < in_.size(); ++k) Bind(k, in_[k]);
  return OkStatus();
}

Status Importer::NoOp() { return OkStatus(); }

Status Importer::ReadVariable() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId var, Var(0));
  SALUS_ASSIGN_OR_RETURN(DataType type, TfType("dtype"));
  if (type != V(var).type) return Bad("reads a variable of another type");
  if (assigned_.count(V(var).name) == 0) {
    Bind(0, var);  // never assigned: read in place (Note [TensorFlow variables])
    return OkStatus();
  }
  SALUS_ASSIGN_OR_RETURN(ValueId copy, Emit("Identity", {var}));
  Bind(0, copy);
  return OkStatus();
}

Status Importer::AssignVariable() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId var, Var(0));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(1));
  if (V(x).type != V(var).type || V(x).shape != V(var).shape) {
    return Bad("assigns " + DataTypeName(V(x).type) + ShapeString(V(x).shape) + " to variable " +
               DataTypeName(V(var).type) + ShapeString(V(var).shape));
  }
  const std::string mode = op() == "AssignAddVariableOp"   ? "add"
                           : op() == "AssignSubVariableOp" ? "sub"
                                                           : "set";
  if (mode != "set" && V(var).type == DataType::kBool) return Refuse("arithmetic on a bool");
  if (assigned_.count(V(var).name) == 0) {
    // Reads of it were bound in place (Note [TensorFlow variables]): refuse rather than break
    // their snapshot semantics.
    return Refuse("assigns a variable through a handle the importer cannot trace to it");
  }
  Node n;
  n.op = "SalusAssign";
  n.name = name();
  n.inputs = {var, x};
  n.attrs["mode"] = StringAttr(mode);
  return builder_.Add(std::move(n));
}

Status Importer::ResourceGather() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId var, Var(0));
  SALUS_ASSIGN_OR_RETURN(ValueId indices, In(1));
  if (TfInt("batch_dims", 0) != 0) return Refuse("batch_dims other than 0");
  ValueId table = var;
  if (assigned_.count(V(var).name) > 0) {
    SALUS_ASSIGN_OR_RETURN(table, Emit("Identity", {var}));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gather", {table, indices}, {{"axis", IntAttr(0)}}));
  Bind(0, y);
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Elementwise math.

Status Importer::Binary() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId a, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId b, In(1));
  static const std::map<std::string, std::string> engine = {
      {"Add", "Add"},     {"AddV2", "Add"},
      {"Sub", "Sub"},     {"Mul", "Mul"},
      {"RealDiv", "Div"}, {"Div", "Div"},
      {"Maximum", "Max"}, {"Minimum", "Min"},
      {"Pow", "Pow"},     {"SquaredDifference", "Sub"}};
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(engine.at(op()), {a, b}));
  if (op() == "SquaredDifference") {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Mul", {y, y}));
  }
  Bind(0, y);
  return OkStatus();
}

// x / y, and 0 where y is 0.
Status Importer::DivNoNan() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId y, In(1));
  SALUS_ASSIGN_OR_RETURN(ValueId zero_divisor, Emit("Equal", {y, ScalarLike(y, 0)}));
  // The quotient is computed where y is 0 too; Where then drops it.
  SALUS_ASSIGN_OR_RETURN(ValueId q, Emit("Div", {x, y}));
  SALUS_ASSIGN_OR_RETURN(ValueId out, Emit("Where", {zero_divisor, ScalarLike(q, 0), q}));
  Bind(0, out);
  return OkStatus();
}

// Integers only: FloorMod is ONNX's Mod (the divisor's sign), FloorDiv (x - FloorMod) / y,
// exact. Float forms need a Floor the engine lacks.
// FloorDiv and FloorMod round toward negative infinity. On integers: the engine's Mod (fmod 0
// is Python's, the sign of the divisor) and (x - mod) / y. On floats, as TensorFlow's kernels:
// floor(x / y), and fmod(x, y) plus y where it is non-zero and its sign differs from y's.
Status Importer::FloorDivMod() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId y, In(1));
  if (V(x).type == DataType::kFloat32) {
    if (op() == "FloorDiv") {
      SALUS_ASSIGN_OR_RETURN(ValueId q, Emit("Div", {x, y}));
      SALUS_ASSIGN_OR_RETURN(ValueId f, Emit("Floor", {q}));
      Bind(0, f);
      return OkStatus();
    }
    SALUS_ASSIGN_OR_RETURN(ValueId m, Emit("Mod", {x, y}, {{"fmod", IntAttr(1)}}));
    SALUS_ASSIGN_OR_RETURN(ValueId zero, Emit("Equal", {m, ScalarLike(m, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId nonzero, Emit("Not", {zero}));
    SALUS_ASSIGN_OR_RETURN(ValueId m_neg, Emit("Less", {m, ScalarLike(m, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId y_neg, Emit("Less", {y, ScalarLike(y, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId same, Emit("Equal", {m_neg, y_neg}));
    SALUS_ASSIGN_OR_RETURN(ValueId differ, Emit("Not", {same}));
    SALUS_ASSIGN_OR_RETURN(ValueId fix, Emit("And", {nonzero, differ}));
    SALUS_ASSIGN_OR_RETURN(ValueId shifted, Emit("Add", {m, y}));
    SALUS_ASSIGN_OR_RETURN(ValueId r, Emit("Where", {fix, shifted, m}));
    Bind(0, r);
    return OkStatus();
  }
  if (V(x).type != DataType::kInt64) return Refuse("only on integers and float32");
  SALUS_ASSIGN_OR_RETURN(ValueId mod, Emit("Mod", {x, y}, {{"fmod", IntAttr(0)}}));
  if (op() == "FloorMod") {
    Bind(0, mod);
    return OkStatus();
  }
  SALUS_ASSIGN_OR_RETURN(ValueId diff, Emit("Sub", {x, mod}));
  SALUS_ASSIGN_OR_RETURN(ValueId q, Emit("Div", {diff, y}));
  Bind(0, q);
  return OkStatus();
}

Status Importer::Compare() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId a, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId b, In(1));
  static const std::map<std::string, std::string> engine = {
      {"Equal", "Equal"},           {"NotEqual", "Equal"},  {"Less", "Less"},
      {"LessEqual", "LessOrEqual"}, {"Greater", "Greater"}, {"GreaterEqual", "GreaterOrEqual"}};
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(engine.at(op()), {a, b}));
  if (op() == "NotEqual") {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Not", {y}));
  }
  Bind(0, y);
  return OkStatus();
}

Status Importer::Logical() {
  const bool unary = op() == "LogicalNot";
  SALUS_RETURN_IF_ERROR(Arity(unary ? 1 : 2, unary ? 1 : 2));
  std::vector<ValueId> xs;
  for (size_t i = 0; i < in_.size(); ++i) {
    SALUS_ASSIGN_OR_RETURN(ValueId x, In(i));
    xs.push_back(x);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(unary ? "Not" : op() == "LogicalAnd" ? "And" : "Or", xs));
  Bind(0, y);
  return OkStatus();
}

Status Importer::Unary() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  ValueId y = kNoValue;
  const std::string& o = op();
  if (o == "Rsqrt") {
    SALUS_ASSIGN_OR_RETURN(ValueId s, Emit("Sqrt", {x}));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Reciprocal", {s}));
  } else if (o == "Square") {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Mul", {x, x}));
  } else if (o == "Sign") {
    // (x > 0) - (x < 0), in x's type.
    SALUS_ASSIGN_OR_RETURN(ValueId pos, Emit("Greater", {x, ScalarLike(x, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId neg, Emit("Less", {x, ScalarLike(x, 0)}));
    SALUS_ASSIGN_OR_RETURN(pos, CastTo(pos, V(x).type));
    SALUS_ASSIGN_OR_RETURN(neg, CastTo(neg, V(x).type));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Sub", {pos, neg}));
  } else if (o == "Softsign") {
    SALUS_ASSIGN_OR_RETURN(ValueId a, Emit("Abs", {x}));
    SALUS_ASSIGN_OR_RETURN(ValueId d, Emit("Add", {a, ScalarLike(x, 1)}));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Div", {x, d}));
  } else if (o == "Erfc") {
    // Its own kernel: 1 - erf(x) loses every digit where erfc(x) is small.
    if (V(x).type != DataType::kFloat32) return Refuse("only on float32");
    SALUS_ASSIGN_OR_RETURN(y, EmitShaped("SalusErfc", {x}, {}, DataType::kFloat32, V(x).shape));
  } else {
    const std::string engine = o == "Inv" ? "Reciprocal" : o;
    SALUS_ASSIGN_OR_RETURN(y, Emit(engine, {x}));
  }
  Bind(0, y);
  return OkStatus();
}

Status Importer::LeakyRelu() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  const tf::AttrValue* a = Attr("alpha");
  const float alpha = a != nullptr && a->value_case() == tf::AttrValue::kF ? a->f() : 0.2f;
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("LeakyRelu", {x}, {{"alpha", FloatAttr(alpha)}}));
  Bind(0, y);
  return OkStatus();
}

// TensorFlow's gradients of y = f(x) written in terms of y: inputs (y, dy).
Status Importer::UnaryGrad() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId y, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(1));
  const std::string& o = op();
  ValueId dx = kNoValue;
  if (o == "SigmoidGrad") {  // dy * y * (1 - y)
    SALUS_ASSIGN_OR_RETURN(ValueId one_minus, Emit("Sub", {ScalarLike(y, 1), y}));
    SALUS_ASSIGN_OR_RETURN(ValueId d, Emit("Mul", {y, one_minus}));
    SALUS_ASSIGN_OR_RETURN(dx, Emit("Mul", {dy, d}));
  } else if (o == "TanhGrad") {  // dy * (1 - y^2)
    SALUS_ASSIGN_OR_RETURN(ValueId sq, Emit("Mul", {y, y}));
    SALUS_ASSIGN_OR_RETURN(ValueId d, Emit("Sub", {ScalarLike(y, 1), sq}));
    SALUS_ASSIGN_OR_RETURN(dx, Emit("Mul", {dy, d}));
  } else if (o == "SqrtGrad") {  // dy * 0.5 / y
    SALUS_ASSIGN_OR_RETURN(ValueId half, Emit("Mul", {dy, ScalarLike(dy, 0.5)}));
    SALUS_ASSIGN_OR_RETURN(dx, Emit("Div", {half, y}));
  } else if (o == "RsqrtGrad") {  // dy * -0.5 * y^3
    SALUS_ASSIGN_OR_RETURN(ValueId sq, Emit("Mul", {y, y}));
    SALUS_ASSIGN_OR_RETURN(ValueId cube, Emit("Mul", {sq, y}));
    SALUS_ASSIGN_OR_RETURN(ValueId scaled, Emit("Mul", {dy, ScalarLike(dy, -0.5)}));
    SALUS_ASSIGN_OR_RETURN(dx, Emit("Mul", {scaled, cube}));
  } else {  // ReciprocalGrad, InvGrad: -dy * y^2
    SALUS_ASSIGN_OR_RETURN(ValueId sq, Emit("Mul", {y, y}));
    SALUS_ASSIGN_OR_RETURN(ValueId d, Emit("Mul", {dy, sq}));
    SALUS_ASSIGN_OR_RETURN(dx, Emit("Neg", {d}));
  }
  Bind(0, dx);
  return OkStatus();
}

// Inputs (dy, features): dy where features > 0, else 0.
Status Importer::ReluGrad() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId f, In(1));
  if (V(f).shape != V(dy).shape || V(f).type != DataType::kFloat32) {
    return Bad("needs float features of the gradient's shape");
  }
  // The engine's Relu backward (dy where the features are positive, else 0): features may be
  // the Relu's input or its output, whose signs agree.
  SALUS_ASSIGN_OR_RETURN(ValueId dx, EmitShaped("SalusEltwiseGrad", {f, dy},
                                                {{"forward_op", StringAttr("Relu")},
                                                 {"opset", IntAttr(graph_.opset())}},
                                                DataType::kFloat32, V(dy).shape));
  Bind(0, dx);
  return OkStatus();
}

Status Importer::BiasAdd() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId b, In(1));
  const Shape xs = V(x).shape;
  if (xs.size() < 2 || V(b).shape.size() != 1) return Bad("needs x of rank >= 2 and a 1-D bias");
  const bool nchw = TfString("data_format", "NHWC") == "NCHW";
  const int64_t c = nchw ? xs[1] : xs.back();
  if (V(b).shape[0] != c) return Bad("bias size differs from the channels");
  if (nchw) {
    Shape bs(xs.size() - 1, 1);
    bs[0] = c;
    SALUS_ASSIGN_OR_RETURN(b, Reshape(b, bs));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Add", {x, b}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::BiasAddGrad() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(0));
  const Shape s = V(dy).shape;
  if (s.size() < 2) return Bad("needs a gradient of rank >= 2");
  const int64_t keep = TfString("data_format", "NHWC") == "NCHW" ? 1 : s.size() - 1;
  std::vector<int64_t> axes;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d != keep) axes.push_back(d);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId db,
                         Emit("ReduceSum", {dy, Int64s(axes)}, {{"keepdims", IntAttr(0)}}));
  Bind(0, db);
  return OkStatus();
}

Status Importer::MatMul() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId a, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId b, In(1));
  if (V(a).shape.size() != 2 || V(b).shape.size() != 2) return Bad("operands must be 2-D");
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gemm", {a, b},
                                         {{"transA", IntAttr(TfBool("transpose_a", false))},
                                          {"transB", IntAttr(TfBool("transpose_b", false))}}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::BatchMatMul() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId a, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId b, In(1));
  auto adjoint = [&](ValueId v) -> StatusOr<ValueId> {
    const size_t rank = V(v).shape.size();
    if (rank < 2) return Bad("operands must be at least 2-D");
    std::vector<int64_t> perm(rank);
    for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(i);
    std::swap(perm[rank - 2], perm[rank - 1]);
    return Transpose(v, perm);
  };
  if (V(a).shape.size() < 2 || V(b).shape.size() < 2) return Bad("operands must be at least 2-D");
  if (TfBool("adj_x", false)) {
    SALUS_ASSIGN_OR_RETURN(a, adjoint(a));
  }
  if (TfBool("adj_y", false)) {
    SALUS_ASSIGN_OR_RETURN(b, adjoint(b));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("MatMul", {a, b}));
  Bind(0, y);
  return OkStatus();
}

// Note [Einsum]
// Einsum of one or two operands (Keras' EinsumDense and MultiHeadAttention, and their
// gradients), without ellipses or a label repeated within an operand. One operand: a sum over
// the labels the output drops, then a transpose. Two: labels only one operand has and the
// output drops are summed out first; the rest are batch (both operands and the output),
// contracted (both operands, not the output) or free (one operand and the output). Each operand
// is transposed to [batch, free, contracted] (the second to [batch, contracted, free]) and
// flattened to 3-D, one batched MatMul multiplies them, and the product is unflattened and
// transposed to the output's order.
Status Importer::Einsum() {
  const std::string eq = TfString("equation", "");
  const size_t arrow = eq.find("->");
  if (arrow == std::string::npos) return Refuse("an equation without '->'");
  if (eq.find('.') != std::string::npos) return Refuse("an equation with an ellipsis");
  std::vector<std::string> terms;
  std::string lhs = eq.substr(0, arrow);
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(
        lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const std::string out = eq.substr(arrow + 2);
  if (terms.size() != in_.size() || terms.size() > 2) {
    return Refuse("'" + eq + "' with " + std::to_string(in_.size()) + " operands");
  }
  std::vector<ValueId> x(terms.size());
  std::map<char, int64_t> size;
  auto unique_letters = [](const std::string& t) {
    std::set<char> seen;
    for (char c : t) {
      if (!std::isalpha(static_cast<unsigned char>(c)) || !seen.insert(c).second) return false;
    }
    return true;
  };
  for (size_t i = 0; i < terms.size(); ++i) {
    SALUS_ASSIGN_OR_RETURN(x[i], In(i));
    const Shape& s = V(x[i]).shape;
    if (!unique_letters(terms[i]) || terms[i].size() != s.size()) {
      return Refuse("operand " + std::to_string(i) + " of '" + eq + "' (shape " + ShapeString(s) +
                    ")");
    }
    for (size_t d = 0; d < s.size(); ++d) {
      auto [it, fresh] = size.emplace(terms[i][d], s[d]);
      if (!fresh && it->second != s[d]) return Bad("'" + eq + "': sizes of a label differ");
    }
  }
  if (!unique_letters(out)) return Refuse("output '" + out + "' of '" + eq + "'");
  for (char c : out) {
    if (size.count(c) == 0) return Bad("'" + eq + "': output label without an operand");
  }
  auto has = [](const std::string& t, char c) { return t.find(c) != std::string::npos; };
  // Sums out the labels of term `i` that no other term (the output included) has.
  auto sum_private = [&](size_t i) -> Status {
    std::vector<int64_t> axes;
    std::string kept;
    for (size_t d = 0; d < terms[i].size(); ++d) {
      const char c = terms[i][d];
      const bool other = terms.size() == 2 && has(terms[1 - i], c);
      if (!other && !has(out, c)) {
        axes.push_back(static_cast<int64_t>(d));
      } else {
        kept += c;
      }
    }
    if (axes.empty()) return OkStatus();
    SALUS_ASSIGN_OR_RETURN(x[i],
                           Emit("ReduceSum", {x[i], Int64s(axes)}, {{"keepdims", IntAttr(0)}}));
    terms[i] = kept;
    return OkStatus();
  };
  for (size_t i = 0; i < terms.size(); ++i) SALUS_RETURN_IF_ERROR(sum_private(i));
  auto perm_to = [](const std::string& from, const std::string& to) {
    std::vector<int64_t> perm;
    for (char c : to) perm.push_back(static_cast<int64_t>(from.find(c)));
    return perm;
  };
  auto product = [&](const std::string& labels) {
    int64_t n = 1;
    for (char c : labels) n *= size[c];
    return n;
  };
  std::string result;
  ValueId y = kNoValue;
  if (terms.size() == 1) {
    y = x[0];
    result = terms[0];
  } else {
    std::string batch, contract, free_a, free_b;
    for (char c : out) {
      if (has(terms[0], c) && has(terms[1], c)) batch += c;
    }
    for (char c : terms[0]) {
      if (has(terms[1], c) && !has(out, c)) contract += c;
      if (!has(terms[1], c)) free_a += c;
    }
    for (char c : terms[1]) {
      if (!has(terms[0], c)) free_b += c;
    }
    SALUS_ASSIGN_OR_RETURN(ValueId a,
                           Transpose(x[0], perm_to(terms[0], batch + free_a + contract)));
    SALUS_ASSIGN_OR_RETURN(ValueId b,
                           Transpose(x[1], perm_to(terms[1], batch + contract + free_b)));
    SALUS_ASSIGN_OR_RETURN(a, Reshape(a, {product(batch), product(free_a), product(contract)}));
    SALUS_ASSIGN_OR_RETURN(b, Reshape(b, {product(batch), product(contract), product(free_b)}));
    SALUS_ASSIGN_OR_RETURN(y, Emit("MatMul", {a, b}));
    result = batch + free_a + free_b;
    Shape dims;
    for (char c : result) dims.push_back(size[c]);
    SALUS_ASSIGN_OR_RETURN(y, Reshape(y, dims));
  }
  if (result != out) {
    SALUS_ASSIGN_OR_RETURN(y, Transpose(y, perm_to(result, out)));
  }
  Bind(0, y);
  return OkStatus();
}

// UnsortedSegmentSum(data, segment_ids, num_segments): the rows of data added into
// [num_segments, ...] at their ids — the scatter-add of a Gather's gradient (an embedding's
// sparse gradient, which Keras' optimizers sum this way).
Status Importer::UnsortedSegmentSum() {
  SALUS_RETURN_IF_ERROR(Arity(3, 3));
  SALUS_ASSIGN_OR_RETURN(ValueId data, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId ids, In(1));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> n, ConstInts(2, "num_segments"));
  const Shape& ds = V(data).shape;
  const Shape& is = V(ids).shape;
  if (n.size() != 1 || n[0] < 0) return Bad("num_segments must be one non-negative number");
  if (V(data).type != DataType::kFloat32) return Refuse("only on float data");
  if (is.size() > ds.size() || !std::equal(is.begin(), is.end(), ds.begin())) {
    return Bad("segment ids of shape " + ShapeString(is) + " do not prefix data " +
               ShapeString(ds));
  }
  Shape out = {n[0]};
  out.insert(out.end(), ds.begin() + static_cast<std::ptrdiff_t>(is.size()), ds.end());
  SALUS_ASSIGN_OR_RETURN(ValueId y, EmitShaped("SalusGatherGrad", {ids, data},
                                               {{"axis", IntAttr(0)}}, DataType::kFloat32, out));
  Bind(0, y);
  return OkStatus();
}

Status Importer::Softmax() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  if (V(x).shape.empty()) return Bad("needs logits of rank >= 1");
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(op(), {x}, {{"axis", IntAttr(-1)}}));
  Bind(0, y);
  return OkStatus();
}

// Inputs (logits [B, C], labels [B]); outputs the per-row loss [B] and the gradient with
// respect to the logits, softmax - onehot(labels). Labels outside [0, C) give a loss of 0 (the
// engine's loss ignores them; TensorFlow's CPU kernel fails).
Status Importer::SparseSoftmaxCrossEntropy() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId logits, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId labels, In(1));
  const Shape ls = V(logits).shape;
  if (ls.size() != 2 || V(labels).shape != Shape{ls[0]}) {
    return Bad("needs logits [batch, classes] and labels [batch]");
  }
  SALUS_ASSIGN_OR_RETURN(
      std::vector<ValueId> sce,
      EmitN("SoftmaxCrossEntropyLoss", {logits, labels}, {{"reduction", StringAttr("none")}}, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId probs, Emit("Exp", {sce[1]}));
  std::vector<int64_t> classes(ls[1]);
  for (int64_t c = 0; c < ls[1]; ++c) classes[c] = c;
  SALUS_ASSIGN_OR_RETURN(ValueId column, Reshape(labels, {ls[0], 1}));
  SALUS_ASSIGN_OR_RETURN(ValueId hot, Emit("Equal", {column, Int64s(classes)}));
  SALUS_ASSIGN_OR_RETURN(ValueId onehot, CastTo(hot, DataType::kFloat32));
  SALUS_ASSIGN_OR_RETURN(ValueId backprop, Emit("Sub", {probs, onehot}));
  Bind(0, sce[0]);
  Bind(1, backprop);
  return OkStatus();
}

// Inputs (logits [B, C], labels [B, C] probabilities); outputs the loss [B] and
// softmax - labels.
Status Importer::SoftmaxCrossEntropy() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId logits, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId labels, In(1));
  const Shape ls = V(logits).shape;
  if (ls.size() != 2 || V(labels).shape != ls) {
    return Bad("needs logits and labels of one shape [batch, classes]");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId logp, Emit("LogSoftmax", {logits}, {{"axis", IntAttr(-1)}}));
  SALUS_ASSIGN_OR_RETURN(ValueId prod, Emit("Mul", {labels, logp}));
  SALUS_ASSIGN_OR_RETURN(ValueId sum,
                         Emit("ReduceSum", {prod, Int64s({1})}, {{"keepdims", IntAttr(0)}}));
  SALUS_ASSIGN_OR_RETURN(ValueId loss, Emit("Neg", {sum}));
  SALUS_ASSIGN_OR_RETURN(ValueId probs, Emit("Exp", {logp}));
  SALUS_ASSIGN_OR_RETURN(ValueId backprop, Emit("Sub", {probs, labels}));
  Bind(0, loss);
  Bind(1, backprop);
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Reductions and indices.

Status Importer::Reduce() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ConstInts(1, "reduction_indices"));
  const int64_t rank = V(x).shape.size();
  Node probe;
  probe.op = op();
  probe.name = name();
  for (int64_t& a : axes) {
    SALUS_ASSIGN_OR_RETURN(a, NormalizeAxis(probe, a, rank));
  }
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  const bool keep = TfBool("keep_dims", false);
  if (axes.empty() || rank == 0) {
    Bind(0, x);  // TensorFlow reduces nothing over no axes
    return OkStatus();
  }
  if (V(x).type == DataType::kInt64) {
    const HostTensor* c = ConstOf(x);
    if (c == nullptr) return Refuse("integer reductions only of compile-time constants");
    Bind(0, Constant(ReduceInt64(*c, axes, keep, op())));
    return OkStatus();
  }
  static const std::map<std::string, std::string> engine = {{"Sum", "ReduceSum"},
                                                            {"Mean", "ReduceMean"},
                                                            {"Max", "ReduceMax"},
                                                            {"Min", "ReduceMin"},
                                                            {"Prod", "ReduceProd"}};
  ValueId y = kNoValue;
  if (op() == "Sum") {
    SALUS_ASSIGN_OR_RETURN(y, Emit("ReduceSum", {x, Int64s(axes)}, {{"keepdims", IntAttr(keep)}}));
  } else {
    SALUS_ASSIGN_OR_RETURN(
        y, Emit(engine.at(op()), {x}, {{"axes", IntsAttr(axes)}, {"keepdims", IntAttr(keep)}}));
  }
  Bind(0, y);
  return OkStatus();
}

Status Importer::ArgMax() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dim, ConstInts(1, "dimension"));
  if (dim.size() != 1) return Bad("dimension must be a scalar");
  const Shape xs = V(x).shape;
  Node probe;
  probe.op = op();
  probe.name = name();
  SALUS_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(probe, dim[0], xs.size()));
  if (xs.empty() || xs[axis] == 0) return Bad("ArgMax over an empty dimension");
  Shape out = xs;
  out.erase(out.begin() + axis);
  SALUS_ASSIGN_OR_RETURN(
      ValueId y, EmitShaped("SalusArgMax", {x}, {{"axis", IntAttr(axis)}}, DataType::kInt64, out));
  Bind(0, y);
  return OkStatus();
}

Status Importer::Cast() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(DataType to, TfType("DstT"));
  SALUS_ASSIGN_OR_RETURN(ValueId y, CastTo(x, to));
  Bind(0, y);
  return OkStatus();
}

// Only a float's bits as int32, for BitwiseAnd with the sign mask (Keras's argmax treats -0.0
// as below +0.0 that way).
Status Importer::Bitcast() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  const tf::AttrValue* type = Attr("type");
  if (V(x).type != DataType::kFloat32 || type == nullptr || type->type() != tf::DT_INT32) {
    return Refuse("only a float32 to int32 Bitcast (read by BitwiseAnd with the sign mask)");
  }
  Bind(0, TfTensor{kNoValue, kNoValue, x});
  return OkStatus();
}

Status Importer::BitwiseAnd() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  // Bitcast(x) & 0x80000000: the sign bit, kept in place (INT32_MIN where set, else 0).
  for (size_t i = 0; i < 2; ++i) {
    if (in_[i].bits_of == kNoValue) continue;
    SALUS_ASSIGN_OR_RETURN(const HostTensor* mask, ConstIn(1 - i, "the mask"));
    bool sign_mask = mask->type == DataType::kInt64 &&
                     (mask->num_elements() == 1 || mask->shape == V(in_[i].bits_of).shape);
    for (int64_t e = 0; sign_mask && e < mask->num_elements(); ++e) {
      sign_mask = mask->int64s()[e] == kInt32SignMask;
    }
    if (!sign_mask) return Refuse("of a Bitcast float only with the sign mask 0x80000000");
    const ValueId x = in_[i].bits_of;
    // signbit(x): x < 0, or 1/x < 0 (which tells -0.0 from +0.0).
    SALUS_ASSIGN_OR_RETURN(ValueId neg, Emit("Less", {x, ScalarLike(x, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId inv, Emit("Reciprocal", {x}));
    SALUS_ASSIGN_OR_RETURN(ValueId inv_neg, Emit("Less", {inv, ScalarLike(x, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId sign, Emit("Or", {neg, inv_neg}));
    const ValueId set = Constant(HostTensor::FromInt64s({}, {kInt32SignMask}));
    const ValueId clear = Constant(HostTensor::FromInt64s({}, {0}));
    SALUS_ASSIGN_OR_RETURN(ValueId bits, Emit("Where", {sign, set, clear}));
    Bind(0, bits);
    return OkStatus();
  }
  // Two integer constants.
  SALUS_ASSIGN_OR_RETURN(const HostTensor* a, ConstIn(0, "x (on integers)"));
  SALUS_ASSIGN_OR_RETURN(const HostTensor* b, ConstIn(1, "y (on integers)"));
  if (a->type != DataType::kInt64 || b->type != DataType::kInt64 || a->shape != b->shape) {
    return Refuse("only on integer constants of one shape");
  }
  HostTensor out = *a;
  for (int64_t e = 0; e < out.num_elements(); ++e) out.int64s()[e] &= b->int64s()[e];
  Bind(0, Constant(std::move(out)));
  return OkStatus();
}

// SelectV2 broadcasts; Select's condition may also be a vector over the first dim.
Status Importer::Select() {
  SALUS_RETURN_IF_ERROR(Arity(3, 3));
  SALUS_ASSIGN_OR_RETURN(ValueId c, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId t, In(1));
  SALUS_ASSIGN_OR_RETURN(ValueId e, In(2));
  const Shape ts = V(t).shape;
  if (op() == "Select" && V(c).shape.size() == 1 && ts.size() > 1) {
    Shape cs(ts.size(), 1);
    cs[0] = V(c).shape[0];
    SALUS_ASSIGN_OR_RETURN(c, Reshape(c, cs));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Where", {c, t, e}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::LikeOp() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(
      ValueId y, Emit("Expand", {ScalarLike(x, op() == "OnesLike" ? 1 : 0), Int64s(V(x).shape)}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::Fill() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ConstInts(0, "dims"));
  SALUS_ASSIGN_OR_RETURN(ValueId value, In(1));
  if (!V(value).shape.empty()) return Bad("value must be a scalar");
  for (int64_t d : dims) {
    if (d < 0) return Bad("negative dim");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Expand", {value, Int64s(dims)}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::BroadcastTo() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ConstInts(1, "shape"));
  for (int64_t d : dims) {
    if (d < 0) return Bad("negative dim");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Expand", {x, Int64s(dims)}));
  if (V(y).shape != Shape(dims)) {
    return Bad(ShapeString(V(x).shape) + " does not broadcast to " + ShapeString(dims));
  }
  Bind(0, y);
  return OkStatus();
}

// x [d0, d1, ...] tiled by m: x as [1, d0, 1, d1, ...] expanded to [m0, d0, m1, d1, ...] and
// reshaped to [m0 d0, m1 d1, ...].
Status Importer::Tile() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> m, ConstInts(1, "multiples"));
  const Shape xs = V(x).shape;
  if (m.size() != xs.size()) return Bad("multiples must have one entry per dim");
  Shape spread, expanded, out;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (m[d] < 0) return Bad("negative multiple");
    int64_t dim = 0;
    if (__builtin_mul_overflow(xs[d], m[d], &dim)) return Bad("tiled shape overflows");
    spread.insert(spread.end(), {1, xs[d]});
    expanded.insert(expanded.end(), {m[d], xs[d]});
    out.push_back(dim);
  }
  if (TooManyElements(out, options_.limits.max_tensor_elements)) return Bad("output is too large");
  SALUS_ASSIGN_OR_RETURN(ValueId s, Reshape(x, spread));
  SALUS_ASSIGN_OR_RETURN(ValueId e, Emit("Expand", {s, Int64s(expanded)}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Reshape(e, out));
  Bind(0, y);
  return OkStatus();
}

Status Importer::ExpandDims() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ConstInts(1, "axis"));
  if (axis.size() != 1) return Bad("axis must be a scalar");
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Unsqueeze", {x, Int64s(axis)}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::Squeeze() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axes, TfInts("squeeze_dims"));
  std::vector<ValueId> inputs = {x};
  if (!axes.empty()) inputs.push_back(Int64s(axes));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Squeeze", inputs));
  Bind(0, y);
  return OkStatus();
}

Status Importer::ReshapeOp() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ConstInts(1, "shape"));
  SALUS_ASSIGN_OR_RETURN(ValueId y,
                         Emit("Reshape", {x, Int64s(dims)}, {{"allowzero", IntAttr(1)}}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::TransposeOp() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> perm, ConstInts(1, "perm"));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Transpose(x, perm));
  Bind(0, y);
  return OkStatus();
}

// ConcatV2(values..., axis) and Concat(axis, values...).
Status Importer::Concat() {
  if (in_.size() < 2) return Bad("needs values and an axis");
  const bool v2 = op() == "ConcatV2";
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ConstInts(v2 ? in_.size() - 1 : 0, "axis"));
  if (axis.size() != 1) return Bad("axis must be a scalar");
  std::vector<ValueId> values;
  for (size_t i = v2 ? 0 : 1; i < (v2 ? in_.size() - 1 : in_.size()); ++i) {
    SALUS_ASSIGN_OR_RETURN(ValueId v, In(i));
    values.push_back(v);
  }
  if (values.size() == 1) {
    Bind(0, values[0]);
    return OkStatus();
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Concat", values, {{"axis", IntAttr(axis[0])}}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::Pack() {
  if (in_.empty()) return Bad("needs values");
  const int64_t axis = TfInt("axis", 0);
  std::vector<ValueId> parts;
  for (size_t i = 0; i < in_.size(); ++i) {
    SALUS_ASSIGN_OR_RETURN(ValueId v, In(i));
    SALUS_ASSIGN_OR_RETURN(ValueId u, Emit("Unsqueeze", {v, Int64s({axis})}));
    parts.push_back(u);
  }
  ValueId y = parts[0];
  if (parts.size() > 1) {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Concat", parts, {{"axis", IntAttr(axis)}}));
  }
  Bind(0, y);
  return OkStatus();
}

// TensorFlow's sparse slice spec (begin, end, strides and five masks) made dense over the
// input's dims (as TensorFlow's ValidateStridedSliceOp): one Slice (starts, ends, steps over
// every dim) whose result, of shape `sliced`, is reshaped to `out` for the new and shrunk axes.
// StridedSlice and its gradient StridedSliceGrad share it.

StatusOr<DenseSlice> Importer::SliceSpec(const Shape& xs, size_t first_input) {
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> begin, ConstInts(first_input, "begin"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> end, ConstInts(first_input + 1, "end"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> strides, ConstInts(first_input + 2, "strides"));
  if (begin.size() != end.size() || begin.size() != strides.size() || begin.size() > 32) {
    return Bad("begin, end and strides differ in length (or exceed 32)");
  }
  const int64_t rank = xs.size();
  int64_t ellipsis = TfInt("ellipsis_mask", 0), new_axis = TfInt("new_axis_mask", 0);
  const int64_t shrink = TfInt("shrink_axis_mask", 0), begin_mask = TfInt("begin_mask", 0);
  const int64_t end_mask = TfInt("end_mask", 0);
  int64_t sparse = begin.size();
  for (int64_t mask : {ellipsis, new_axis, shrink, begin_mask, end_mask}) {
    if (mask < 0 || mask >= (int64_t{1} << 32)) return Bad("a mask out of range");
  }
  if ((ellipsis & (ellipsis - 1)) != 0) return Bad("more than one ellipsis");
  if (ellipsis == 0) {
    ellipsis = int64_t{1} << sparse;  // an implicit ellipsis at the end
    ++sparse;
  }
  int64_t new_after_ellipsis = 0;
  bool after = false;
  for (int64_t i = 0; i < sparse; ++i) {
    if (after && ((new_axis >> i) & 1)) ++new_after_ellipsis;
    if ((ellipsis >> i) & 1) after = true;
  }
  constexpr int64_t kNewAxis = -1, kShrunk = -2;
  struct Dim {
    int64_t begin = 0, end = 0, stride = 1;
    bool begin_masked = true, end_masked = true, shrink = false;
  };
  std::vector<Dim> dense(rank);
  std::vector<int64_t> gather;  // per final dim: a dense dim, kNewAxis or kShrunk
  int64_t full = 0;
  for (int64_t i = 0; i < sparse; ++i) {
    if ((ellipsis >> i) & 1) {
      const int64_t next = std::min(rank - (sparse - i) + 1 + new_after_ellipsis, rank);
      for (; full < next; ++full) gather.push_back(full);
      continue;
    }
    if ((new_axis >> i) & 1) {
      gather.push_back(kNewAxis);
      continue;
    }
    if (full >= rank) return Bad("the slice has more dims than the input's " + ShapeString(xs));
    Dim& d = dense[full];
    d.begin = begin[i];
    d.end = end[i];
    d.stride = strides[i];
    d.begin_masked = (begin_mask >> i) & 1;
    d.end_masked = (end_mask >> i) & 1;
    d.shrink = (shrink >> i) & 1;
    gather.push_back(d.shrink ? kShrunk : full);
    ++full;
  }
  DenseSlice s;
  s.starts.resize(rank), s.ends.resize(rank), s.steps.resize(rank), s.sliced.resize(rank);
  for (int64_t k = 0; k < rank; ++k) {
    const Dim& d = dense[k];
    const int64_t dim = xs[k];
    if (d.stride == 0) return Bad("a stride is 0");
    if (d.stride == std::numeric_limits<int64_t>::min()) return Bad("stride out of range");
    if (d.shrink) {
      const int64_t b = d.begin < 0 ? d.begin + dim : d.begin;
      if (b < 0 || b >= dim) return Bad("index " + std::to_string(d.begin) + " out of range");
      s.starts[k] = b;
      s.ends[k] = b + 1;
      s.steps[k] = 1;
      s.sliced[k] = 1;
    } else {
      auto canonical = [&](int64_t v, bool masked, bool is_begin) {
        if (masked) {
          return d.stride > 0 ? (is_begin ? 0 : dim) : (is_begin ? dim - 1 : -1);
        }
        const int64_t fwd = v < 0 ? v + dim : v;
        return d.stride > 0 ? std::clamp<int64_t>(fwd, 0, dim)
                            : std::clamp<int64_t>(fwd, -1, dim - 1);
      };
      const int64_t b = canonical(d.begin, d.begin_masked, true);
      const int64_t e = canonical(d.end, d.end_masked, false);
      int64_t size = 0;
      if (d.stride > 0 && e > b) size = (e - b - 1) / d.stride + 1;
      if (d.stride < 0 && b > e) size = (b - e - 1) / -d.stride + 1;
      s.starts[k] = b;
      // ONNX reads a negative end from the back: "before index 0" is -dim - 1.
      s.ends[k] = e < 0 ? -dim - 1 : e;
      s.steps[k] = d.stride;
      s.sliced[k] = size;
    }
    s.whole = s.whole && s.sliced[k] == dim && s.steps[k] == 1;
  }
  for (int64_t g : gather) {
    if (g == kNewAxis) {
      s.out.push_back(1);
    } else if (g != kShrunk) {
      s.out.push_back(s.sliced[g]);
    }
  }
  return s;
}

Status Importer::StridedSlice() {
  SALUS_RETURN_IF_ERROR(Arity(4, 4));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  const Shape xs = V(x).shape;
  SALUS_ASSIGN_OR_RETURN(DenseSlice s, SliceSpec(xs, 1));
  ValueId y = x;
  if (!s.whole) {
    std::vector<int64_t> axes(xs.size());
    for (size_t k = 0; k < xs.size(); ++k) axes[k] = static_cast<int64_t>(k);
    SALUS_ASSIGN_OR_RETURN(
        y, Emit("Slice", {x, Int64s(s.starts), Int64s(s.ends), Int64s(axes), Int64s(s.steps)}));
  }
  SALUS_ASSIGN_OR_RETURN(y, Reshape(y, s.out));
  Bind(0, y);
  return OkStatus();
}

// Inputs (shape, begin, end, strides, dy): dy scattered into zeros of `shape` where the
// StridedSlice of the same spec read.
Status Importer::StridedSliceGrad() {
  SALUS_RETURN_IF_ERROR(Arity(5, 5));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> xs, ConstInts(0, "shape"));
  for (int64_t d : xs) {
    if (d < 0) return Bad("negative dimension in shape");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(4));
  SALUS_ASSIGN_OR_RETURN(DenseSlice s, SliceSpec(xs, 1));
  if (NumElements(V(dy).shape) != NumElements(s.out)) {
    return Bad("dy " + ShapeString(V(dy).shape) + " is not the slice's shape " +
               ShapeString(s.out));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId d, Reshape(dy, s.sliced));
  ValueId dx = d;
  if (!s.whole) {
    SALUS_ASSIGN_OR_RETURN(
        dx, EmitShaped("SalusSliceGrad", {d},
                       {{"starts", IntsAttr(s.starts)}, {"steps", IntsAttr(s.steps)}}, V(dy).type,
                       Shape(xs)));
  }
  Bind(0, dx);
  return OkStatus();
}

// Slice(x, begin, size): size -1 takes the rest of the dim.
Status Importer::SliceOp() {
  SALUS_RETURN_IF_ERROR(Arity(3, 3));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> begin, ConstInts(1, "begin"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> size, ConstInts(2, "size"));
  const Shape xs = V(x).shape;
  if (begin.size() != xs.size() || size.size() != xs.size()) {
    return Bad("begin and size must have one entry per dim of " + ShapeString(xs));
  }
  std::vector<int64_t> ends(xs.size()), axes(xs.size());
  bool whole = true;
  for (size_t d = 0; d < xs.size(); ++d) {
    const int64_t n = size[d] == -1 ? xs[d] - begin[d] : size[d];
    if (begin[d] < 0 || n < 0 || begin[d] > xs[d] || n > xs[d] - begin[d]) {
      return Bad("begin " + ShapeString(begin) + " and size " + ShapeString(size) +
                 " fall outside " + ShapeString(xs));
    }
    ends[d] = begin[d] + n;
    axes[d] = static_cast<int64_t>(d);
    whole = whole && begin[d] == 0 && n == xs[d];
  }
  if (whole) {
    Bind(0, x);
    return OkStatus();
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Slice", {x, Int64s(begin), Int64s(ends), Int64s(axes)}));
  Bind(0, y);
  return OkStatus();
}

// Split(axis, value) into num_split equal parts, SplitV(value, size_splits, axis) (one size
// may be -1: the rest) and Unpack(value) along attribute `axis`, its parts losing that dim.
Status Importer::SplitOp() {
  const std::string& o = op();
  SALUS_RETURN_IF_ERROR(o == "Split" ? Arity(2, 2) : o == "SplitV" ? Arity(3, 3) : Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(o == "Split" ? 1 : 0));
  const Shape xs = V(x).shape;
  int64_t axis = TfInt("axis", 0);
  if (o != "Unpack") {
    SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> a, ConstInts(o == "Split" ? 0 : 2, "axis"));
    if (a.size() != 1) return Bad("axis must be a scalar");
    axis = a[0];
  }
  const int64_t rank = xs.size();
  if (axis < -rank || axis >= rank) return Bad("axis out of range for " + ShapeString(xs));
  if (axis < 0) axis += rank;
  const int64_t dim = xs[axis];
  std::vector<int64_t> sizes;
  if (o == "SplitV") {
    SALUS_ASSIGN_OR_RETURN(sizes, ConstInts(1, "size_splits"));
    int64_t known = 0, rest = -1;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == -1 && rest < 0) {
        rest = static_cast<int64_t>(i);
      } else if (sizes[i] < 0) {
        return Bad("size_splits has a negative size");
      } else {
        known += sizes[i];
      }
    }
    if (rest >= 0) sizes[rest] = dim - known;
    if (known > dim || (rest < 0 && known != dim)) {
      return Bad("size_splits " + ShapeString(sizes) + " do not sum to " + std::to_string(dim));
    }
  } else {
    const int64_t parts = o == "Split" ? TfInt("num_split", 0) : TfInt("num", 0);
    if (parts < 1 || dim % parts != 0 || (o == "Unpack" && parts != dim)) {
      return Bad("cannot split a dim of " + std::to_string(dim) + " into " + std::to_string(parts) +
                 " parts");
    }
    sizes.assign(parts, dim / parts);
  }
  std::vector<ValueId> outs;
  if (sizes.size() == 1) {
    outs = {x};
  } else {
    SALUS_ASSIGN_OR_RETURN(
        outs, EmitN("Split", {x, Int64s(sizes)}, {{"axis", IntAttr(axis)}}, sizes.size()));
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    ValueId part = outs[k];
    if (o == "Unpack") {
      Shape s = xs;
      s.erase(s.begin() + axis);
      SALUS_ASSIGN_OR_RETURN(part, Reshape(part, s));
    }
    Bind(k, part);
  }
  return OkStatus();
}

// ConcatOffset(concat_dim, shape...): where each input of a Concat starts, folded here since
// the shapes are constants.
Status Importer::ConcatOffset() {
  if (in_.size() < 2) return Bad("needs concat_dim and shapes");
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ConstInts(0, "concat_dim"));
  if (axis.size() != 1) return Bad("concat_dim must be a scalar");
  int64_t offset = 0;
  size_t rank = 0;
  for (size_t i = 1; i < in_.size(); ++i) {
    SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ConstInts(i, "shape"));
    if (i == 1) rank = shape.size();
    int64_t a = axis[0] < 0 ? axis[0] + static_cast<int64_t>(rank) : axis[0];
    if (shape.size() != rank || a < 0 || a >= static_cast<int64_t>(rank)) {
      return Bad("shapes differ in rank or concat_dim is out of range");
    }
    std::vector<int64_t> at(rank, 0);
    at[a] = offset;
    offset += shape[a];
    Bind(i - 1, Int64s(at));
  }
  return OkStatus();
}

// Note [Fused batch normalisation]
// FusedBatchNorm/V2/V3(x, scale, offset, mean, variance), TensorFlow's own batch normalisation
// kernels (tf.keras 2's BatchNormalization, tf.nn.fused_batch_norm), written as the engine's
// reductions and elementwise ops over the channel dim (last in NHWC, second in NCHW). Training
// normalises by the batch's mean and biased variance; outputs 1 and 2 are the running mean and
// the Bessel-corrected variance averaged with the inputs by exponential_avg_factor (1: the
// batch's own); reserve spaces 1 and 2 carry the batch mean and biased variance to the gradient,
// as TensorFlow's CPU kernel does. Inference normalises by the given mean and variance.
struct Importer::BatchNormAxes {
  std::vector<int64_t> reduce;  // every dim but the channels'
  Shape channel;                // [C] broadcast against x: [C] for NHWC, [C, 1, 1] for NCHW
  int64_t count = 1;            // elements per channel
};

StatusOr<Importer::BatchNormAxes> Importer::BatchNormLayout(ValueId x) {
  const Shape& xs = V(x).shape;
  const std::string format = TfString("data_format", "NHWC");
  if (xs.size() != 4 || (format != "NHWC" && format != "NCHW")) {
    return Refuse("batch normalisation of a 4-D NHWC or NCHW input only");
  }
  const int64_t c = format == "NHWC" ? 3 : 1;
  BatchNormAxes a;
  for (int64_t d = 0; d < 4; ++d) {
    if (d != c) {
      a.reduce.push_back(d);
      a.count *= xs[d];
    }
  }
  a.channel = c == 3 ? Shape{xs[3]} : Shape{xs[1], 1, 1};
  return a;
}

Status Importer::FusedBatchNorm() {
  SALUS_RETURN_IF_ERROR(Arity(5, 5));
  std::vector<ValueId> in(5);
  for (size_t i = 0; i < 5; ++i) {
    SALUS_ASSIGN_OR_RETURN(in[i], In(i));
  }
  const ValueId x = in[0];
  SALUS_ASSIGN_OR_RETURN(BatchNormAxes a, BatchNormLayout(x));
  std::vector<ValueId> per_channel(4);
  for (size_t i = 1; i < 5; ++i) {
    if (V(in[i]).type != DataType::kFloat32) return Refuse("a float32 scale, offset and moments");
    SALUS_ASSIGN_OR_RETURN(per_channel[i - 1], Reshape(in[i], a.channel));
  }
  const ValueId scale = per_channel[0], offset = per_channel[1];
  const float eps = Attr("epsilon") != nullptr ? Attr("epsilon")->f() : 1e-4f;
  const float factor =
      Attr("exponential_avg_factor") != nullptr ? Attr("exponential_avg_factor")->f() : 1.f;
  const bool training = TfBool("is_training", true);
  ValueId mean = per_channel[2], var = per_channel[3];
  if (training) {
    if (a.count < 2) return Bad("training over a single element per channel");
    SALUS_ASSIGN_OR_RETURN(
        mean, Emit("ReduceMean", {x}, {{"axes", IntsAttr(a.reduce)}, {"keepdims", IntAttr(0)}}));
    SALUS_ASSIGN_OR_RETURN(mean, Reshape(mean, a.channel));
    SALUS_ASSIGN_OR_RETURN(ValueId centred, Emit("Sub", {x, mean}));
    SALUS_ASSIGN_OR_RETURN(ValueId squares, Emit("Mul", {centred, centred}));
    SALUS_ASSIGN_OR_RETURN(var, Emit("ReduceMean", {squares},
                                     {{"axes", IntsAttr(a.reduce)}, {"keepdims", IntAttr(0)}}));
    SALUS_ASSIGN_OR_RETURN(var, Reshape(var, a.channel));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId shifted, Emit("Add", {var, ScalarLike(var, eps)}));
  SALUS_ASSIGN_OR_RETURN(ValueId root, Emit("Sqrt", {shifted}));
  SALUS_ASSIGN_OR_RETURN(ValueId inv, Emit("Reciprocal", {root}));
  SALUS_ASSIGN_OR_RETURN(ValueId gain, Emit("Mul", {inv, scale}));
  SALUS_ASSIGN_OR_RETURN(ValueId centred, Emit("Sub", {x, mean}));
  SALUS_ASSIGN_OR_RETURN(ValueId scaled, Emit("Mul", {centred, gain}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Add", {scaled, offset}));
  Bind(0, y);
  const Shape flat = {a.channel[0]};
  ValueId running_mean = mean, running_var = var;
  if (training) {
    const float bessel = static_cast<float>(a.count) / static_cast<float>(a.count - 1);
    SALUS_ASSIGN_OR_RETURN(running_var, Emit("Mul", {var, ScalarLike(var, bessel)}));
    if (factor != 1.f) {
      auto average = [&](ValueId old, ValueId batch) -> StatusOr<ValueId> {
        SALUS_ASSIGN_OR_RETURN(ValueId kept, Emit("Mul", {old, ScalarLike(old, 1.f - factor)}));
        SALUS_ASSIGN_OR_RETURN(ValueId added, Emit("Mul", {batch, ScalarLike(batch, factor)}));
        return Emit("Add", {kept, added});
      };
      SALUS_ASSIGN_OR_RETURN(running_mean, average(per_channel[2], mean));
      SALUS_ASSIGN_OR_RETURN(running_var, average(per_channel[3], running_var));
    }
  }
  SALUS_ASSIGN_OR_RETURN(ValueId out_mean, Reshape(running_mean, flat));
  SALUS_ASSIGN_OR_RETURN(ValueId out_var, Reshape(running_var, flat));
  SALUS_ASSIGN_OR_RETURN(ValueId saved_mean, Reshape(mean, flat));
  SALUS_ASSIGN_OR_RETURN(ValueId saved_var, Reshape(var, flat));
  Bind(1, out_mean);
  Bind(2, out_var);
  Bind(3, saved_mean);
  Bind(4, saved_var);
  if (op() == "FusedBatchNormV3") Bind(5, Constant(HostTensor(DataType::kFloat32, {0})));
  return OkStatus();
}

// FusedBatchNormGrad/V2/V3(dy, x, scale, reserve_space_1, reserve_space_2[, reserve_space_3]):
// the batch mean and biased variance from the forward (Note [Fused batch normalisation]).
Status Importer::FusedBatchNormGrad() {
  SALUS_RETURN_IF_ERROR(op() == "FusedBatchNormGradV3" ? Arity(6, 6) : Arity(5, 5));
  std::vector<ValueId> in(5);
  for (size_t i = 0; i < 5; ++i) {
    SALUS_ASSIGN_OR_RETURN(in[i], In(i));
  }
  const ValueId dy = in[0], x = in[1];
  if (V(dy).shape != V(x).shape) return Bad("y_backprop and x differ in shape");
  SALUS_ASSIGN_OR_RETURN(BatchNormAxes a, BatchNormLayout(x));
  std::vector<ValueId> per_channel(3);
  for (size_t i = 2; i < 5; ++i) {
    SALUS_ASSIGN_OR_RETURN(per_channel[i - 2], Reshape(in[i], a.channel));
  }
  const ValueId scale = per_channel[0], mean = per_channel[1], var = per_channel[2];
  const float eps = Attr("epsilon") != nullptr ? Attr("epsilon")->f() : 1e-4f;
  const bool training = TfBool("is_training", true);
  auto sum = [&](ValueId v) -> StatusOr<ValueId> {
    SALUS_ASSIGN_OR_RETURN(ValueId s,
                           Emit("ReduceSum", {v, Int64s(a.reduce)}, {{"keepdims", IntAttr(0)}}));
    return Reshape(s, a.channel);
  };
  SALUS_ASSIGN_OR_RETURN(ValueId shifted, Emit("Add", {var, ScalarLike(var, eps)}));
  SALUS_ASSIGN_OR_RETURN(ValueId root, Emit("Sqrt", {shifted}));
  SALUS_ASSIGN_OR_RETURN(ValueId inv, Emit("Reciprocal", {root}));
  SALUS_ASSIGN_OR_RETURN(ValueId centred, Emit("Sub", {x, mean}));
  SALUS_ASSIGN_OR_RETURN(ValueId xhat, Emit("Mul", {centred, inv}));
  SALUS_ASSIGN_OR_RETURN(ValueId dy_xhat, Emit("Mul", {dy, xhat}));
  SALUS_ASSIGN_OR_RETURN(ValueId dscale, sum(dy_xhat));
  SALUS_ASSIGN_OR_RETURN(ValueId doffset, sum(dy));
  SALUS_ASSIGN_OR_RETURN(ValueId gain, Emit("Mul", {scale, inv}));
  ValueId dx = kNoValue;
  if (training) {
    // dx = scale * inv / n * (n * dy - sum(dy) - xhat * sum(dy * xhat))
    const float n = static_cast<float>(a.count);
    SALUS_ASSIGN_OR_RETURN(ValueId mean_dy, Emit("Mul", {doffset, ScalarLike(doffset, 1.f / n)}));
    SALUS_ASSIGN_OR_RETURN(ValueId mean_dyx, Emit("Mul", {dscale, ScalarLike(dscale, 1.f / n)}));
    SALUS_ASSIGN_OR_RETURN(ValueId along, Emit("Mul", {xhat, mean_dyx}));
    SALUS_ASSIGN_OR_RETURN(ValueId d1, Emit("Sub", {dy, mean_dy}));
    SALUS_ASSIGN_OR_RETURN(ValueId d2, Emit("Sub", {d1, along}));
    SALUS_ASSIGN_OR_RETURN(dx, Emit("Mul", {d2, gain}));
  } else {
    SALUS_ASSIGN_OR_RETURN(dx, Emit("Mul", {dy, gain}));
  }
  Bind(0, dx);
  const Shape flat = {a.channel[0]};
  SALUS_ASSIGN_OR_RETURN(ValueId dscale_flat, Reshape(dscale, flat));
  SALUS_ASSIGN_OR_RETURN(ValueId doffset_flat, Reshape(doffset, flat));
  Bind(1, dscale_flat);
  Bind(2, doffset_flat);
  Bind(3, Constant(HostTensor(DataType::kFloat32, {0})));
  Bind(4, Constant(HostTensor(DataType::kFloat32, {0})));
  return OkStatus();
}

// DynamicStitch(indices..., data...) and ParallelDynamicStitch: merged[indices[i][j]] =
// data[i][j]. TensorFlow's gradient of a reduction over a shape unknown when traced builds the
// reduced shape with it; shapes are constants here, so it folds at import, and only constant
// inputs are taken.
Status Importer::DynamicStitch() {
  if (in_.empty() || in_.size() % 2 != 0) return Bad("needs as many data inputs as indices");
  const size_t n = in_.size() / 2;
  std::vector<const HostTensor*> idx(n), data(n);
  int64_t rows = 0;
  for (size_t i = 0; i < n; ++i) {
    SALUS_ASSIGN_OR_RETURN(idx[i], ConstIn(i, "indices"));
    SALUS_ASSIGN_OR_RETURN(data[i], ConstIn(n + i, "data"));
    if (idx[i]->type != DataType::kInt64) return Bad("indices must be integers");
    if (data[i]->type != data[0]->type) return Bad("data differ in type");
    const Shape& is = idx[i]->shape;
    const Shape& ds = data[i]->shape;
    if (ds.size() < is.size() || !std::equal(is.begin(), is.end(), ds.begin())) {
      return Bad("data " + ShapeString(ds) + " does not start with its indices' shape " +
                 ShapeString(is));
    }
    for (int64_t k = 0; k < idx[i]->num_elements(); ++k) {
      const int64_t at = idx[i]->int64s()[k];
      if (at < 0 || at >= (int64_t{1} << 24)) return Bad("index " + std::to_string(at));
      rows = std::max(rows, at + 1);
    }
  }
  const Shape suffix(data[0]->shape.begin() + idx[0]->shape.size(), data[0]->shape.end());
  Shape out = suffix;
  out.insert(out.begin(), rows);
  HostTensor merged(data[0]->type, out);
  const size_t row_bytes = static_cast<size_t>(NumElements(suffix)) * ElementSize(merged.type);
  for (size_t i = 0; i < n; ++i) {
    const Shape ds_suffix(data[i]->shape.begin() + idx[i]->shape.size(), data[i]->shape.end());
    if (ds_suffix != suffix) return Bad("data differ in their trailing dims");
    for (int64_t k = 0; k < idx[i]->num_elements(); ++k) {
      std::memcpy(merged.bytes.data() + idx[i]->int64s()[k] * row_bytes,
                  data[i]->bytes.data() + k * row_bytes, row_bytes);
    }
  }
  Bind(0, Constant(std::move(merged)));
  return OkStatus();
}

// Pad(x, paddings) with zeros and PadV2(x, paddings, constant_values); paddings [rank, 2].
Status Importer::Pad() {
  const bool v2 = op() == "PadV2";
  SALUS_RETURN_IF_ERROR(v2 ? Arity(3, 3) : Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> p, ConstInts(1, "paddings"));
  const size_t rank = V(x).shape.size();
  if (p.size() != 2 * rank)
    return Bad("paddings must have shape [" + std::to_string(rank) + ", 2]");
  std::vector<int64_t> pads(2 * rank);
  bool none = true;
  for (size_t d = 0; d < rank; ++d) {
    if (p[2 * d] < 0 || p[2 * d + 1] < 0) return Bad("negative paddings");
    pads[d] = p[2 * d];
    pads[rank + d] = p[2 * d + 1];
    none = none && p[2 * d] == 0 && p[2 * d + 1] == 0;
  }
  if (none) {
    Bind(0, x);
    return OkStatus();
  }
  ValueId value = ScalarLike(x, 0);
  if (v2) {
    SALUS_ASSIGN_OR_RETURN(value, In(2));
    if (ConstOf(value) == nullptr) return Refuse("constant_values that is not a constant");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y,
                         Emit("Pad", {x, Int64s(pads), value}, {{"mode", StringAttr("constant")}}));
  Bind(0, y);
  return OkStatus();
}

// Note [Mirror padding]
// MirrorPad(x, paddings, mode) pads each dim with x's own values mirrored at its edges: REFLECT
// leaves the edge out ([a b c] padded by 2 each side: c b | a b c | b a), SYMMETRIC repeats it
// (b a | a b c | c b). Each padded dim is a Gather of x along it, by the source index of every
// output position. The gradient, MirrorPadGrad(dy, paddings, mode), sums each position's
// gradient into its source: along each dim a product with the 0/1 matrix of that map (output
// positions by input positions), the dim moved last for the MatMul and back. The dims are
// separable, so their order does not matter.

// The source index of each of the n + before + after output positions along one dim, or an
// error when the padding is wider than the mode allows.
StatusOr<std::vector<int64_t>> MirrorSources(int64_t n, int64_t before, int64_t after,
                                             bool reflect) {
  const int64_t widest = reflect ? n - 1 : n;
  if (before < 0 || after < 0 || before > widest || after > widest) {
    return InvalidArgumentError("paddings must be in [0, " + std::to_string(widest) +
                                "] for a dim of " + std::to_string(n) + " in " +
                                (reflect ? "REFLECT" : "SYMMETRIC") + " mode");
  }
  std::vector<int64_t> src;
  for (int64_t o = 0; o < n + before + after; ++o) {
    int64_t i = o - before;
    if (i < 0) i = reflect ? -i : -i - 1;
    if (i >= n) i = reflect ? 2 * (n - 1) - i : 2 * n - 1 - i;
    src.push_back(i);
  }
  return src;
}

// MirrorPad(x, paddings, mode): Note [Mirror padding].
StatusOr<Importer::MirrorArgs> Importer::MirrorOperands() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  MirrorArgs a;
  SALUS_ASSIGN_OR_RETURN(a.value, In(0));
  SALUS_ASSIGN_OR_RETURN(a.paddings, ConstInts(1, "paddings"));
  const std::string mode = TfString("mode", "");
  if (mode != "REFLECT" && mode != "SYMMETRIC") return Bad("mode must be REFLECT or SYMMETRIC");
  a.reflect = mode == "REFLECT";
  const size_t rank = V(a.value).shape.size();
  if (a.paddings.size() != 2 * rank) {
    return Bad("paddings must have shape [" + std::to_string(rank) + ", 2]");
  }
  return a;
}

Status Importer::MirrorPad() {
  SALUS_ASSIGN_OR_RETURN(MirrorArgs a, MirrorOperands());
  const Shape shape = V(a.value).shape;
  const std::vector<int64_t>& p = a.paddings;
  ValueId y = a.value;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (p[2 * d] == 0 && p[2 * d + 1] == 0) continue;
    auto src = MirrorSources(shape[d], p[2 * d], p[2 * d + 1], a.reflect);
    if (!src.ok()) return Bad(std::string(src.status().message()));
    SALUS_ASSIGN_OR_RETURN(
        y, Emit("Gather", {y, Int64s(*src)}, {{"axis", IntAttr(static_cast<int64_t>(d))}}));
  }
  Bind(0, y);
  return OkStatus();
}

// MirrorPadGrad(dy, paddings, mode): Note [Mirror padding].
Status Importer::MirrorPadGrad() {
  SALUS_ASSIGN_OR_RETURN(MirrorArgs a, MirrorOperands());
  const ValueId dy = a.value;
  if (V(dy).type != DataType::kFloat32) return Refuse("a gradient that is not float32");
  const Shape shape = V(dy).shape;
  const size_t rank = shape.size();
  const std::vector<int64_t>& p = a.paddings;
  ValueId dx = dy;
  for (size_t d = 0; d < rank; ++d) {
    if (p[2 * d] == 0 && p[2 * d + 1] == 0) continue;
    const int64_t n = shape[d] - p[2 * d] - p[2 * d + 1];
    if (n <= 0) return Bad("paddings are wider than the gradient");
    auto src = MirrorSources(n, p[2 * d], p[2 * d + 1], a.reflect);
    if (!src.ok()) return Bad(std::string(src.status().message()));
    const int64_t out = shape[d];
    std::vector<float> m(out * n, 0.f);
    for (int64_t o = 0; o < out; ++o) m[o * n + (*src)[o]] += 1.f;
    std::vector<int64_t> perm, back(rank);
    for (size_t k = 0; k < rank; ++k) {
      if (k != d) perm.push_back(static_cast<int64_t>(k));
    }
    perm.push_back(static_cast<int64_t>(d));
    for (size_t k = 0; k < rank; ++k) back[perm[k]] = static_cast<int64_t>(k);
    SALUS_ASSIGN_OR_RETURN(ValueId last, Transpose(dx, perm));
    SALUS_ASSIGN_OR_RETURN(ValueId summed,
                           Emit("MatMul", {last, Constant(HostTensor::FromFloats({out, n}, m))}));
    SALUS_ASSIGN_OR_RETURN(dx, Transpose(summed, back));
  }
  Bind(0, dx);
  return OkStatus();
}

// Relu6(x) = min(max(x, 0), 6); Relu6Grad(dy, features) = dy where 0 < features < 6, else 0.
Status Importer::Relu6() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Clip", {x, ScalarLike(x, 0), ScalarLike(x, 6)}));
  Bind(0, y);
  return OkStatus();
}

// The engine's Clip gradient passes dy where lo <= f <= hi; TensorFlow's Relu6Grad, whose
// features are Relu6's output, where 0 < f < 6: the same with lo the least float above 0 and hi
// the greatest below 6.
Status Importer::Relu6Grad() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId f, In(1));
  if (V(f).shape != V(dy).shape || V(f).type != DataType::kFloat32) {
    return Bad("needs float features of the gradient's shape");
  }
  Node n;
  n.op = "SalusClipGrad";
  n.name = name();
  n.inputs = {f, kNoValue, kNoValue, dy};
  n.attrs["min"] = FloatAttr(std::numeric_limits<float>::denorm_min());
  n.attrs["max"] = FloatAttr(std::nextafter(6.f, 0.f));
  Value v;
  v.name = graph_.UniqueName(name());
  v.type = DataType::kFloat32;
  v.shape = V(dy).shape;
  const ValueId dx = graph_.AddValue(std::move(v));
  n.outputs = {dx, kNoValue, kNoValue};
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  Bind(0, dx);
  return OkStatus();
}

// Shape, ShapeN, Size and Rank: constants, as shapes are fixed at compile time.
Status Importer::ShapeOp() {
  if (op() == "ShapeN") {
    if (in_.empty()) return Bad("needs inputs");
  } else {
    SALUS_RETURN_IF_ERROR(Arity(1, 1));
  }
  for (size_t i = 0; i < in_.size(); ++i) {
    SALUS_ASSIGN_OR_RETURN(ValueId x, In(i));
    const Shape s = V(x).shape;
    if (op() == "Size") {
      Bind(0, Constant(HostTensor::FromInt64s({}, {NumElements(s)})));
    } else if (op() == "Rank") {
      Bind(0, Constant(HostTensor::FromInt64s({}, {static_cast<int64_t>(s.size())})));
    } else {
      Bind(i, Int64s(s));
    }
  }
  return OkStatus();
}

// The axes along which each of two broadcast shapes was broadcast (both, where both are 1), as
// TensorFlow's BCast computes them.
Status Importer::BroadcastGradientArgs() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> s0, ConstInts(0, "s0"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> s1, ConstInts(1, "s1"));
  const size_t rank = std::max(s0.size(), s1.size());
  std::vector<int64_t> r0, r1;
  for (size_t i = 0; i < rank; ++i) {
    const int64_t a = i < rank - s0.size() ? 1 : s0[i - (rank - s0.size())];
    const int64_t b = i < rank - s1.size() ? 1 : s1[i - (rank - s1.size())];
    if (a != b && a != 1 && b != 1) {
      return Bad("shapes " + ShapeString(s0) + " and " + ShapeString(s1) + " do not broadcast");
    }
    if (a == 1 && b == 1) {
      r0.push_back(i);
      r1.push_back(i);
    } else if (a == 1) {
      r0.push_back(i);
    } else if (b == 1) {
      r1.push_back(i);
    }
  }
  Bind(0, Int64s(r0));
  Bind(1, Int64s(r1));
  return OkStatus();
}

Status Importer::Range() {
  SALUS_RETURN_IF_ERROR(Arity(3, 3));
  std::vector<ValueId> args;
  for (size_t i = 0; i < 3; ++i) {
    SALUS_ASSIGN_OR_RETURN(ValueId v, In(i));
    args.push_back(v);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Range", args));
  Bind(0, y);
  return OkStatus();
}

// GatherV2(params, indices, axis) and Gather(params, indices).
Status Importer::Gather() {
  const bool v2 = op() == "GatherV2";
  SALUS_RETURN_IF_ERROR(Arity(v2 ? 3 : 2, v2 ? 3 : 2));
  SALUS_ASSIGN_OR_RETURN(ValueId params, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId indices, In(1));
  int64_t axis = 0;
  if (v2) {
    SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> a, ConstInts(2, "axis"));
    if (a.size() != 1) return Bad("axis must be a scalar");
    axis = a[0];
  }
  if (TfInt("batch_dims", 0) != 0) return Refuse("batch_dims other than 0");
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gather", {params, indices}, {{"axis", IntAttr(axis)}}));
  Bind(0, y);
  return OkStatus();
}

Status Importer::AddN() {
  if (in_.empty()) return Bad("needs inputs");
  SALUS_ASSIGN_OR_RETURN(ValueId sum, In(0));
  for (size_t i = 1; i < in_.size(); ++i) {
    SALUS_ASSIGN_OR_RETURN(ValueId v, In(i));
    SALUS_ASSIGN_OR_RETURN(sum, Emit("Add", {sum, v}));
  }
  Bind(0, sum);
  return OkStatus();
}

Status Importer::ClipByValue() {
  SALUS_RETURN_IF_ERROR(Arity(3, 3));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId lo, In(1));
  SALUS_ASSIGN_OR_RETURN(ValueId hi, In(2));
  SALUS_ASSIGN_OR_RETURN(ValueId a, Emit("Max", {x, lo}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Min", {a, hi}));
  if (V(y).shape != V(x).shape) return Bad("bounds broadcast beyond the input's shape");
  Bind(0, y);
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Convolution and pooling (Note [NHWC lowering]).
//
// Note [NHWC lowering]
// TensorFlow's Conv2D and MaxPool (and their gradients) default to NHWC with HWIO filters; the
// engine's Conv, MaxPool, SalusConvGradData/Weights and SalusPoolGrad are NCHW with OIHW
// weights. Each is lowered with Transposes around it (NHWC -> NCHW before, back after, HWIO ->
// OIHW for filters). On the CPU the executable then lets the convolutions read and write NHWC
// themselves and drops their activations' Transposes (Note [Channels-last convolutions] in
// fusion.h); pooling, the filters and CUDA keep them. NCHW graphs take no Transposes. Padding SAME
// is TensorFlow's (the extra pad at the end), computed here as explicit pads; EXPLICIT takes
// explicit_paddings.

StatusOr<Importer::Window2D> Importer::WindowFor(const Shape& x, const std::vector<int64_t>& kernel,
                                                 bool pooling) {
  Window2D w;
  const std::string format = TfString("data_format", "NHWC");
  if (format != "NHWC" && format != "NCHW") return Refuse("data_format " + format);
  w.nchw = format == "NCHW";
  if (x.size() != 4) return Bad("needs a 4-D input");
  const int h = w.nchw ? 2 : 1, wd = w.nchw ? 3 : 2;
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> strides, TfInts("strides"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dilations, TfInts("dilations"));
  if (strides.size() != 4) return Bad("strides must have 4 entries");
  if (dilations.empty()) dilations = {1, 1, 1, 1};
  if (dilations.size() != 4) return Bad("dilations must have 4 entries");
  const int c = w.nchw ? 1 : 3;
  if (strides[0] != 1 || strides[c] != 1 || dilations[0] != 1 || dilations[c] != 1) {
    return Refuse("strides or dilations over the batch or channels");
  }
  w.strides = {strides[h], strides[wd]};
  w.dilations = {dilations[h], dilations[wd]};
  if (pooling && (w.dilations[0] != 1 || w.dilations[1] != 1)) return Refuse("dilated pooling");
  w.kernel = kernel;
  for (int i = 0; i < 2; ++i) {
    if (w.strides[i] < 1 || w.strides[i] > (1 << 16) || w.dilations[i] < 1 ||
        w.dilations[i] > (1 << 16) || w.kernel[i] < 1 || w.kernel[i] > (1 << 16)) {
      return Bad("bad strides, dilations or window");
    }
  }
  const std::string padding = TfString("padding", "");
  w.pads.assign(4, 0);
  if (padding == "SAME") {
    for (int i = 0; i < 2; ++i) {
      const int64_t in = x[i == 0 ? h : wd];
      const int64_t out = (in + w.strides[i] - 1) / w.strides[i];
      const int64_t span = (w.kernel[i] - 1) * w.dilations[i] + 1;
      const int64_t total = std::max<int64_t>((out - 1) * w.strides[i] + span - in, 0);
      w.pads[i] = total / 2;
      w.pads[i + 2] = total - total / 2;
    }
  } else if (padding == "EXPLICIT") {
    SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> p, TfInts("explicit_paddings"));
    if (p.size() != 8) return Bad("explicit_paddings must have 8 entries");
    for (int i = 0; i < 2; ++i) {
      const int dim = i == 0 ? h : wd;
      w.pads[i] = p[2 * dim];
      w.pads[i + 2] = p[2 * dim + 1];
    }
    if (p[0] != 0 || p[1] != 0 || p[2 * c] != 0 || p[2 * c + 1] != 0) {
      return Refuse("padding over the batch or channels");
    }
  } else if (padding != "VALID") {
    return Bad("padding must be VALID, SAME or EXPLICIT");
  }
  return w;
}

// The NCHW output shape of a window over NCHW `x` with `channels` output channels.
Shape WindowOutput(const Shape& x, int64_t channels, const Importer::Window2D& w) {
  Shape out = {x[0], channels, 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t span = (w.kernel[i] - 1) * w.dilations[i] + 1;
    const int64_t padded = x[2 + i] + w.pads[i] + w.pads[i + 2];
    out[2 + i] = padded >= span ? (padded - span) / w.strides[i] + 1 : -1;
  }
  return out;
}

std::map<std::string, Attribute> Importer::ConvAttrs(const Window2D& w) const {
  return {{"kernel_shape", IntsAttr(w.kernel)},
          {"strides", IntsAttr(w.strides)},
          {"dilations", IntsAttr(w.dilations)},
          {"pads", IntsAttr(w.pads)}};
}

// TensorFlow's filters as the engine's OIHW weights. Conv2D's are HWIO [kh, kw, I / group, O];
// a depthwise convolution's are [kh, kw, C, M], output channel c * M + m reading input channel
// c only: the grouped convolution with C groups of one input channel, whose OIHW weight is the
// filter read as [kh, kw, 1, C * M].
bool Importer::Depthwise() const { return op().rfind("DepthwiseConv2dNative", 0) == 0; }

Shape Importer::OihwShape(const Shape& fs) const {
  return Depthwise() ? Shape{fs[2] * fs[3], 1, fs[0], fs[1]} : Shape{fs[3], fs[2], fs[0], fs[1]};
}

StatusOr<ValueId> Importer::OihwFilter(ValueId f) {
  const Shape fs = V(f).shape;
  if (Depthwise()) {
    SALUS_ASSIGN_OR_RETURN(f, Reshape(f, {fs[0], fs[1], 1, fs[2] * fs[3]}));
  }
  return Transpose(f, {3, 2, 0, 1});
}

// The group count of a convolution of `in_c` input channels with filter shape `fs`.
StatusOr<int64_t> Importer::Groups(int64_t in_c, const Shape& fs) const {
  if (Depthwise()) {
    if (fs[2] != in_c) return Bad("the filter's channels are not the input's");
    return in_c;
  }
  if (fs[2] <= 0 || in_c % fs[2] != 0) return Bad("filter channels do not divide the input's");
  const int64_t groups = in_c / fs[2];
  if (fs[3] % groups != 0) return Bad("groups do not divide the output channels");
  return groups;
}

// Conv2D(input, filter) and DepthwiseConv2dNative(input, filter).
Status Importer::Conv2D() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId f, In(1));
  const Shape fs = V(f).shape;
  if (fs.size() != 4) return Bad("needs a 4-D filter");
  SALUS_ASSIGN_OR_RETURN(Window2D w, WindowFor(V(x).shape, {fs[0], fs[1]}, false));
  SALUS_ASSIGN_OR_RETURN(ValueId xc, ToNchw(x, w.nchw));
  SALUS_ASSIGN_OR_RETURN(int64_t groups, Groups(V(xc).shape[1], fs));
  SALUS_ASSIGN_OR_RETURN(ValueId wc, OihwFilter(f));
  std::map<std::string, Attribute> attrs = ConvAttrs(w);
  attrs["group"] = IntAttr(groups);
  SALUS_ASSIGN_OR_RETURN(ValueId yc, Emit("Conv", {xc, wc}, attrs));
  SALUS_ASSIGN_OR_RETURN(ValueId y, FromNchw(yc, w.nchw));
  Bind(0, y);
  return OkStatus();
}

// Conv2DBackpropInput and DepthwiseConv2dNativeBackpropInput: (input_sizes, filter,
// out_backprop).
Status Importer::Conv2DBackpropInput() {
  SALUS_RETURN_IF_ERROR(Arity(3, 3));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, ConstInts(0, "input_sizes"));
  SALUS_ASSIGN_OR_RETURN(ValueId f, In(1));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(2));
  const Shape fs = V(f).shape;
  if (fs.size() != 4 || sizes.size() != 4) return Bad("needs 4-D input_sizes and filter");
  for (int64_t d : sizes) {
    if (d < 0) return Bad("negative input size");
  }
  SALUS_ASSIGN_OR_RETURN(Window2D w, WindowFor(sizes, {fs[0], fs[1]}, false));
  const Shape xc = w.nchw ? Shape(sizes) : Shape{sizes[0], sizes[3], sizes[1], sizes[2]};
  SALUS_ASSIGN_OR_RETURN(int64_t groups, Groups(xc[1], fs));
  SALUS_ASSIGN_OR_RETURN(ValueId wc, OihwFilter(f));
  SALUS_ASSIGN_OR_RETURN(ValueId dyc, ToNchw(dy, w.nchw));
  if (V(dyc).shape != WindowOutput(xc, OihwShape(fs)[0], w)) {
    return Bad("out_backprop " + ShapeString(V(dy).shape) + " is not the convolution's output");
  }
  std::map<std::string, Attribute> attrs = ConvAttrs(w);
  attrs["x_shape"] = IntsAttr(xc);
  attrs["group"] = IntAttr(groups);
  attrs["forward_op"] = StringAttr("Conv");
  SALUS_ASSIGN_OR_RETURN(ValueId dxc,
                         EmitShaped("SalusConvGradData", {dyc, wc}, attrs, DataType::kFloat32, xc));
  SALUS_ASSIGN_OR_RETURN(ValueId dx, FromNchw(dxc, w.nchw));
  Bind(0, dx);
  return OkStatus();
}

// Conv2DBackpropFilter and DepthwiseConv2dNativeBackpropFilter: (input, filter_sizes,
// out_backprop).
Status Importer::Conv2DBackpropFilter() {
  SALUS_RETURN_IF_ERROR(Arity(3, 3));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> fs, ConstInts(1, "filter_sizes"));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(2));
  if (fs.size() != 4) return Bad("needs 4-D filter_sizes");
  for (int64_t d : fs) {
    if (d < 1) return Bad("filter sizes must be positive");
  }
  SALUS_ASSIGN_OR_RETURN(Window2D w, WindowFor(V(x).shape, {fs[0], fs[1]}, false));
  SALUS_ASSIGN_OR_RETURN(ValueId xc, ToNchw(x, w.nchw));
  SALUS_ASSIGN_OR_RETURN(int64_t groups, Groups(V(xc).shape[1], fs));
  SALUS_ASSIGN_OR_RETURN(ValueId dyc, ToNchw(dy, w.nchw));
  const Shape wc = OihwShape(fs);
  if (V(dyc).shape != WindowOutput(V(xc).shape, wc[0], w)) {
    return Bad("out_backprop " + ShapeString(V(dy).shape) + " is not the convolution's output");
  }
  std::map<std::string, Attribute> attrs = ConvAttrs(w);
  attrs["w_shape"] = IntsAttr(wc);
  attrs["group"] = IntAttr(groups);
  attrs["forward_op"] = StringAttr("Conv");
  SALUS_ASSIGN_OR_RETURN(
      ValueId dwc, EmitShaped("SalusConvGradWeights", {xc, dyc}, attrs, DataType::kFloat32, wc));
  SALUS_ASSIGN_OR_RETURN(ValueId dw, Transpose(dwc, {2, 3, 1, 0}));
  SALUS_ASSIGN_OR_RETURN(dw, Reshape(dw, Shape(fs)));
  Bind(0, dw);
  return OkStatus();
}

// The window of MaxPool, AvgPool and their gradients over `x` (NHWC or NCHW), from ksize.
StatusOr<Importer::Window2D> Importer::PoolWindow(const Shape& x) {
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> ksize, TfInts("ksize"));
  if (ksize.size() != 4) return Bad("ksize must have 4 entries");
  const bool nchw = TfString("data_format", "NHWC") == "NCHW";
  if (ksize[0] != 1 || ksize[nchw ? 1 : 3] != 1) return Refuse("pooling over batch or channels");
  return WindowFor(x, {ksize[nchw ? 2 : 1], ksize[nchw ? 3 : 2]}, true);
}

// The engine's pooling attributes. TensorFlow's average pooling divides each window by its
// part inside the input (padding not counted).
std::map<std::string, Attribute> Importer::PoolAttrs(const Window2D& w) const {
  std::map<std::string, Attribute> attrs = ConvAttrs(w);
  attrs.erase("dilations");
  if (op().rfind("AvgPool", 0) == 0) attrs["count_include_pad"] = IntAttr(0);
  return attrs;
}

// MaxPool(x) and AvgPool(x).
Status Importer::Pool() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(Window2D w, PoolWindow(V(x).shape));
  SALUS_ASSIGN_OR_RETURN(ValueId xc, ToNchw(x, w.nchw));
  const std::string engine = op() == "MaxPool" ? "MaxPool" : "AveragePool";
  SALUS_ASSIGN_OR_RETURN(ValueId yc, Emit(engine, {xc}, PoolAttrs(w)));
  SALUS_ASSIGN_OR_RETURN(ValueId y, FromNchw(yc, w.nchw));
  Bind(0, y);
  return OkStatus();
}

// The engine's pooling gradient of NCHW `xc` given `dy` (the pooling's output shape, NHWC or
// NCHW as the op's data format).
Status Importer::PoolGradOf(ValueId xc, ValueId dy, const Window2D& w, const std::string& forward) {
  SALUS_ASSIGN_OR_RETURN(ValueId dyc, ToNchw(dy, w.nchw));
  if (V(dyc).shape != WindowOutput(V(xc).shape, V(xc).shape[1], w)) {
    return Bad("grad does not have the pooling's output shape");
  }
  std::map<std::string, Attribute> attrs = PoolAttrs(w);
  attrs["forward_op"] = StringAttr(forward);
  SALUS_ASSIGN_OR_RETURN(
      ValueId dxc, EmitShaped("SalusPoolGrad", {xc, dyc}, attrs, DataType::kFloat32, V(xc).shape));
  SALUS_ASSIGN_OR_RETURN(ValueId dx, FromNchw(dxc, w.nchw));
  Bind(0, dx);
  return OkStatus();
}

// Inputs (orig_input, orig_output, grad): the gradient goes to the window's first maximum.
Status Importer::MaxPoolGrad() {
  SALUS_RETURN_IF_ERROR(Arity(3, 3));
  SALUS_ASSIGN_OR_RETURN(ValueId x, In(0));
  SALUS_ASSIGN_OR_RETURN(ValueId y, In(1));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(2));
  SALUS_ASSIGN_OR_RETURN(Window2D w, PoolWindow(V(x).shape));
  if (V(dy).shape != V(y).shape) return Bad("grad and orig_output differ in shape");
  SALUS_ASSIGN_OR_RETURN(ValueId xc, ToNchw(x, w.nchw));
  return PoolGradOf(xc, dy, w, "MaxPool");
}

// Inputs (orig_input_shape, grad). The engine's average-pooling gradient reads only the
// input's shape, but takes the input as an operand: the tensor whose Shape gave
// orig_input_shape where the graph says so (TensorFlow's gradient of AvgPool), else zeros.
Status Importer::AvgPoolGrad() {
  SALUS_RETURN_IF_ERROR(Arity(2, 2));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> xs, ConstInts(0, "orig_input_shape"));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, In(1));
  if (xs.size() != 4) return Bad("orig_input_shape must have 4 entries");
  for (int64_t d : xs) {
    if (d < 0) return Bad("negative dimension in orig_input_shape");
  }
  SALUS_ASSIGN_OR_RETURN(Window2D w, PoolWindow(xs));
  ValueId x = kNoValue;
  const InputRef& ref = inputs_[index_.at(name())][0];
  if (auto at = index_.find(ref.node); at != index_.end() && gd_.node(at->second).op() == "Shape") {
    const std::vector<InputRef>& shape_in = inputs_[at->second];
    if (!shape_in.empty() && !shape_in[0].control) {
      auto t = tensors_.find(shape_in[0].node + ":" + std::to_string(shape_in[0].index));
      if (t != tensors_.end() && t->second.value != kNoValue && V(t->second.value).shape == xs) {
        x = t->second.value;
      }
    }
  }
  if (x == kNoValue) {
    SALUS_ASSIGN_OR_RETURN(x, Emit("Expand", {ScalarLike(dy, 0), Int64s(xs)}));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId xc, ToNchw(x, w.nchw));
  return PoolGradOf(xc, dy, w, "AveragePool");
}

// ---------------------------------------------------------------------------------------------
// Stateless random numbers.
//
// Note [TensorFlow random numbers]
// Keras 3's Dropout draws its mask with StatelessRandomGetKeyCounter (seed -> Philox key and
// counter, uint64 [1] and [2]) and StatelessRandomUniformV2 (shape, key, counter, alg), the seed
// read from a SeedGenerator's variable each step. The engine's SalusPhiloxKeyCounter (attribute
// seed_bits: 32 for an int32 seed, else 64) and SalusRandomUniform compute them bit for bit as
// TensorFlow's CPU kernels do (philox_math.h), the uint64 words carried as int64 of the same
// bits. `keras.random.normal` and `truncated_normal` (a VAE's reparameterisation, GaussianNoise,
// initialisers run inside a step) draw the same way with StatelessRandomNormalV2 and
// StatelessTruncatedNormalV2: SalusRandomNormal and SalusRandomTruncatedNormal, bit for bit on
// the CPU. They run each iteration like any node, and fold where their inputs are constants.
// Only the Philox algorithm (alg 1, or 3: auto-select, which TensorFlow resolves to Philox) and
// float32 outputs are mapped; the output shape must be a compile-time constant.

StatusOr<std::vector<ValueId>> Importer::KeyCounterOf(size_t i) {
  SALUS_ASSIGN_OR_RETURN(ValueId seed, In(i));
  const tf::AttrValue* tseed = Attr("Tseed");
  const int dt = tseed != nullptr && tseed->value_case() == tf::AttrValue::kType ? tseed->type()
                                                                                 : tf::DT_INT64;
  if (dt != tf::DT_INT32 && dt != tf::DT_INT64) return Bad("seed of type " + TfTypeName(dt));
  if (V(seed).type != DataType::kInt64 || V(seed).shape != Shape{2}) {
    return Bad("the seed must be integers of shape [2], not " + ShapeString(V(seed).shape));
  }
  Node n;
  n.op = "SalusPhiloxKeyCounter";
  n.name = name();
  n.inputs = {seed};
  n.attrs["seed_bits"] = IntAttr(dt == tf::DT_INT32 ? 32 : 64);
  for (int64_t words : {1, 2}) {
    Value v;
    v.name = graph_.UniqueName(name());
    v.type = DataType::kInt64;
    v.shape = {words};
    n.outputs.push_back(graph_.AddValue(std::move(v)));
  }
  std::vector<ValueId> out = n.outputs;
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  return out;
}

// StatelessRandomGetKeyCounter(seed) -> key, counter; the ...Alg form adds alg (Philox: 1).
Status Importer::RandomKeyCounter() {
  SALUS_RETURN_IF_ERROR(Arity(1, 1));
  SALUS_ASSIGN_OR_RETURN(std::vector<ValueId> kc, KeyCounterOf(0));
  Bind(0, kc[0]);
  Bind(1, kc[1]);
  if (op() == "StatelessRandomGetKeyCounterAlg") Bind(2, Constant(HostTensor::FromInt64s({}, {1})));
  return OkStatus();
}

// StatelessRandomUniform(shape, seed) and StatelessRandomUniformV2(shape, key, counter, alg); the
// normal and truncated normal ops likewise.
Status Importer::RandomDraw() {
  const std::string& tf_op = op();
  const bool v1 = tf_op.back() != '2';
  const char* engine_op = tf_op.find("Truncated") != std::string::npos
                              ? "SalusRandomTruncatedNormal"
                          : tf_op.find("Normal") != std::string::npos ? "SalusRandomNormal"
                                                                      : "SalusRandomUniform";
  SALUS_RETURN_IF_ERROR(v1 ? Arity(2, 2) : Arity(4, 4));
  const tf::AttrValue* dtype = Attr("dtype");
  if (dtype != nullptr &&
      (dtype->value_case() != tf::AttrValue::kType || dtype->type() != tf::DT_FLOAT)) {
    return Refuse("draws float32 only");
  }
  SALUS_ASSIGN_OR_RETURN(const HostTensor* shape_t, ConstIn(0, "the shape"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ConstInts(0, "the shape"));
  if (shape_t->shape.size() > 1) return Bad("the shape must be a vector");
  for (int64_t d : dims) {
    if (d < 0) return Bad("the shape has a negative dimension");
  }
  std::vector<ValueId> kc;
  if (v1) {
    SALUS_ASSIGN_OR_RETURN(kc, KeyCounterOf(1));
  } else {
    SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> alg, ConstInts(3, "the algorithm"));
    if (alg.size() != 1 || (alg[0] != 1 && alg[0] != 3)) {
      return Refuse("only the Philox algorithm (1, or 3: auto-select)");
    }
    for (size_t i = 1; i <= 2; ++i) {
      SALUS_ASSIGN_OR_RETURN(ValueId v, In(i));
      const Shape want = {static_cast<int64_t>(i)};
      if (V(v).type != DataType::kInt64 || V(v).shape != want) {
        return Bad(std::string(i == 1 ? "the key" : "the counter") + " must have shape " +
                   ShapeString(want) + ", not " + ShapeString(V(v).shape));
      }
      kc.push_back(v);
    }
  }
  SALUS_ASSIGN_OR_RETURN(
      ValueId y, EmitShaped(engine_op, {kc[0], kc[1]}, {}, DataType::kFloat32, Shape(dims)));
  Bind(0, y);
  return OkStatus();
}

}  // namespace

StatusOr<Graph> TfImporter::Import(const void* data, size_t size, const TfImportOptions& options) {
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return InvalidArgumentError("GraphDef larger than 2 GiB");
  }
  tf::GraphDef gd;
  if (!gd.ParseFromArray(data, static_cast<int>(size))) {
    return InvalidArgumentError("bytes are not a valid TensorFlow GraphDef");
  }
  if (gd.node_size() == 0) return InvalidArgumentError("GraphDef has no nodes");
  SALUS_RETURN_IF_ERROR(options.limits.CheckNodes(gd.node_size(), "the GraphDef"));
  Importer importer(gd, options);
  return importer.Run();
}

// Note [Snapshots]
// A read of a variable the graph also writes is a copy (TensorFlow's reads are snapshots). The
// copy is needless when every reader of it runs before the variable's next write and nothing
// fetches it (fetches are read after the whole step): the readers then read the variable
// itself. Order() puts writes after everything ready, so in a training step the forward and
// backward passes' reads of a weight all come before its update.
void TfImporter::ElideSnapshots(Graph* g, const std::vector<std::string>& fetches) {
  std::vector<bool> fetched(g->values().size(), false);
  for (const std::string& f : fetches) {
    const ValueId id = g->Find(f);
    if (id != kNoValue) fetched[id] = true;
  }
  auto& nodes = g->nodes();
  const int count = static_cast<int>(nodes.size());
  std::vector<bool> dead(count, false);
  for (int i = 0; i < count; ++i) {
    Node& n = nodes[i];
    if (n.op != "Identity" || n.inputs.size() != 1 || n.outputs.size() != 1) continue;
    const ValueId var = n.inputs[0], snap = n.outputs[0];
    if (var == kNoValue || snap == kNoValue || g->value(var).kind != ValueKind::kState ||
        fetched[snap]) {
      continue;
    }
    int write = count;
    for (int j = i + 1; j < count && write == count; ++j) {
      if (nodes[j].op == "SalusAssign" && nodes[j].input(0) == var) write = j;
    }
    bool safe = true;
    for (int j = i + 1; j < count && safe; ++j) {
      for (ValueId in : nodes[j].inputs) safe = safe && !(in == snap && j >= write);
    }
    if (!safe) continue;
    for (int j = i + 1; j < count; ++j) {
      for (ValueId& in : nodes[j].inputs) {
        if (in == snap) in = var;
      }
    }
    dead[i] = true;
  }
  RemoveNodes(g, dead);
}

std::vector<std::string> TfImporter::SupportedOps() {
  std::vector<std::string> ops;
  for (const auto& [op, lowering] : Importer::Table()) ops.push_back(op);
  return ops;
}

}  // namespace salus::exec
