#include "exec/aten_importer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "exec/graph_builder.h"
#include "exec/window.h"
#include "salus/v1/aten_graph.pb.h"

namespace salus::exec {
namespace {

namespace v1 = ::salus::v1;

// The opset the lowered nodes follow: reductions take their axes as inputs, Gelu exists.
constexpr int kAtenOpset = 21;

// A graph's number as an int64 element, saturated at the type's range and NaN as 0: a float
// that does not fit comes only from a malformed graph (PyTorch promotes such arithmetic to a
// float type), and converting it must not be undefined behaviour.
int64_t SaturatedInt64(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (v < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

class Lowerer;
using Lowering = Status (Lowerer::*)();

class Lowerer {
 public:
  Lowerer(const v1::AtenGraph& ag, const AtenImportOptions& o)
      : ag_(ag), builder_(&graph_, o.limits) {
    graph_.set_opset(kAtenOpset);
  }

  StatusOr<Graph> Run();
  static const std::map<std::string, Lowering>& Table();

 private:
  // --- arguments of the current node ---
  Status Bad(const std::string& what) const {
    return InvalidArgumentError(fmt::format("{} (node {}): {}", node_->op(), index_, what));
  }
  Status Refuse(const std::string& what) const {
    return UnimplementedError(
        fmt::format("{} (node {}): {} is not supported", node_->op(), index_, what));
  }
  StatusOr<const v1::AtenArgument*> Arg(const std::string& name) const {
    for (const v1::AtenArgument& a : node_->args()) {
      if (a.name() == name) return &a;
    }
    return Bad("argument '" + name + "' is missing");
  }
  bool IsNone(const std::string& name) const {
    for (const v1::AtenArgument& a : node_->args()) {
      if (a.name() == name) return a.kind_case() == v1::AtenArgument::kNone;
    }
    return true;
  }
  StatusOr<ValueId> ValueOf(int index) {
    if (index < 0 || index >= static_cast<int>(ids_.size())) {
      return Bad(fmt::format("value {} is out of range", index));
    }
    if (ids_[index] == kNoValue && empties_.count(index) > 0) {
      // An `empty` whose contents a node reads after all: zeros (PyTorch leaves them undefined).
      const v1::AtenValue& v = ag_.values(index);
      SALUS_ASSIGN_OR_RETURN(DataType type, EngineType(v));
      ids_[index] = Filled(type, Shape(v.shape().begin(), v.shape().end()), 0);
    }
    if (ids_[index] == kNoValue && pool_taps_.count(index) > 0) {
      // A graph that computes with max pooling's indices (max_unpool2d, which later PyTorch
      // versions decompose into index arithmetic; indices returned to the caller).
      return UnimplementedError(fmt::format(
          "{} (node {}): max pooling's indices ('{}') are not computed by the engine: only max "
          "pooling's own gradient may read them (max_unpool2d and returned indices are not "
          "supported)",
          node_->op(), index_, ag_.values(index).name()));
    }
    if (ids_[index] == kNoValue) {
      return Bad(fmt::format("value {} ('{}') is used before it is made", index,
                             ag_.values(index).name()));
    }
    return ids_[index];
  }
  // A tensor argument; kNoValue for None when `optional`.
  StatusOr<ValueId> Tensor(const std::string& name, bool optional = false) {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* a, Arg(name));
    if (a->kind_case() == v1::AtenArgument::kNone && optional) return kNoValue;
    if (a->kind_case() != v1::AtenArgument::kValue) return Bad("'" + name + "' is not a tensor");
    return ValueOf(a->value());
  }
  // A tensor argument, or a number made a scalar constant of type `type`.
  StatusOr<ValueId> TensorOrScalar(const std::string& name, DataType type) {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* a, Arg(name));
    if (a->kind_case() == v1::AtenArgument::kValue) return ValueOf(a->value());
    SALUS_ASSIGN_OR_RETURN(double v, Number(name));
    return Scalar(type, v);
  }
  // An optional argument's value, or `fallback` where it is None or absent.
  StatusOr<int64_t> IntOr(const std::string& name, int64_t fallback) const {
    if (IsNone(name)) return fallback;
    return Int(name);
  }
  StatusOr<bool> BoolOr(const std::string& name, bool fallback) const {
    if (IsNone(name)) return fallback;
    return Bool(name);
  }
  StatusOr<double> NumberOr(const std::string& name, double fallback) const {
    if (IsNone(name)) return fallback;
    return Number(name);
  }
  StatusOr<std::vector<int64_t>> IntsOr(const std::string& name,
                                        std::vector<int64_t> fallback) const {
    if (IsNone(name)) return fallback;
    return Ints(name);
  }
  StatusOr<double> Number(const std::string& name) const {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* a, Arg(name));
    switch (a->kind_case()) {
      case v1::AtenArgument::kIntValue:
        return static_cast<double>(a->int_value());
      case v1::AtenArgument::kFloatValue:
        return a->float_value();
      case v1::AtenArgument::kBoolValue:
        return a->bool_value() ? 1.0 : 0.0;
      default:
        return Bad("'" + name + "' is not a number");
    }
  }
  StatusOr<int64_t> Int(const std::string& name) const {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* a, Arg(name));
    if (a->kind_case() == v1::AtenArgument::kIntValue) return a->int_value();
    if (a->kind_case() == v1::AtenArgument::kBoolValue) return a->bool_value() ? 1 : 0;
    return Bad("'" + name + "' is not an integer");
  }
  StatusOr<bool> Bool(const std::string& name) const {
    SALUS_ASSIGN_OR_RETURN(int64_t v, Int(name));
    return v != 0;
  }
  StatusOr<std::vector<int64_t>> Ints(const std::string& name) const {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* a, Arg(name));
    if (a->kind_case() == v1::AtenArgument::kInts) {
      return std::vector<int64_t>(a->ints().v().begin(), a->ints().v().end());
    }
    if (a->kind_case() == v1::AtenArgument::kIntValue) return std::vector<int64_t>{a->int_value()};
    return Bad("'" + name + "' is not a list of integers");
  }
  StatusOr<std::string> String(const std::string& name) const {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* a, Arg(name));
    if (a->kind_case() != v1::AtenArgument::kStringValue)
      return Bad("'" + name + "' is not a string");
    return a->string_value();
  }

  // --- the current node's declared results ---
  int Outputs() const { return node_->outputs_size(); }
  StatusOr<const v1::AtenValue*> Declared(int k) const {
    if (k >= node_->outputs_size() || node_->outputs(k) < 0) return Bad("result missing");
    return &ag_.values(node_->outputs(k));
  }
  StatusOr<Shape> DeclaredShape(int k) const {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenValue* v, Declared(k));
    return Shape(v->shape().begin(), v->shape().end());
  }
  StatusOr<DataType> DeclaredType(int k) const {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenValue* v, Declared(k));
    return EngineType(*v);
  }
  StatusOr<DataType> EngineType(const v1::AtenValue& v) const {
    switch (v.dtype()) {
      case v1::ATEN_FLOAT32:
        return DataType::kFloat32;
      case v1::ATEN_INT64:
        return DataType::kInt64;
      case v1::ATEN_BOOL:
        return DataType::kBool;
      case v1::ATEN_INT32:
        return UnimplementedError("value '" + v.name() + "': int32 tensors");
      case v1::ATEN_FLOAT64:
        return UnimplementedError("value '" + v.name() + "': float64 tensors");
      default:
        return InvalidArgumentError("value '" + v.name() + "' has no dtype");
    }
  }
  // Result k of the current node is `id`: checked against what the graph declares.
  Status Bind(int k, ValueId id) {
    if (k >= node_->outputs_size()) return Bad("fewer results than the lowering makes");
    const int index = node_->outputs(k);
    if (index < 0) return OkStatus();
    const v1::AtenValue& want = ag_.values(index);
    SALUS_ASSIGN_OR_RETURN(DataType type, EngineType(want));
    const Value& got = graph_.value(id);
    const Shape shape(want.shape().begin(), want.shape().end());
    if (got.type != type || got.shape != shape) {
      return InternalError(fmt::format(
          "{} (node {}): the lowering gives {}{} where the graph declares {}{} for '{}'",
          node_->op(), index_, DataTypeName(got.type), ShapeString(got.shape), DataTypeName(type),
          ShapeString(shape), want.name()));
    }
    if (ids_[index] != kNoValue) return Bad("value '" + want.name() + "' is made twice");
    ids_[index] = id;
    return OkStatus();
  }

  // --- emitting ---
  Shape S(ValueId v) const { return graph_.value(v).shape; }
  DataType T(ValueId v) const { return graph_.value(v).type; }
  std::string NodeName() const { return fmt::format("aten{}", index_); }
  StatusOr<std::vector<ValueId>> EmitN(const std::string& op, std::vector<ValueId> inputs,
                                       std::map<std::string, Attribute> attrs, size_t outputs) {
    Node n;
    n.op = op;
    n.name = NodeName();
    n.inputs = std::move(inputs);
    n.attrs = std::move(attrs);
    for (size_t k = 0; k < outputs; ++k) {
      Value v;
      v.name = graph_.UniqueName(n.name);
      v.type = DataType::kUndefined;
      n.outputs.push_back(graph_.AddValue(std::move(v)));
    }
    std::vector<ValueId> out = n.outputs;
    SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
    return out;
  }
  StatusOr<ValueId> Emit(const std::string& op, std::vector<ValueId> inputs,
                         std::map<std::string, Attribute> attrs = {}) {
    SALUS_ASSIGN_OR_RETURN(auto out, EmitN(op, std::move(inputs), std::move(attrs), 1));
    return out[0];
  }
  // For the engine's own ops, which have no shape rules.
  StatusOr<ValueId> EmitShaped(const std::string& op, std::vector<ValueId> inputs,
                               std::map<std::string, Attribute> attrs, DataType type,
                               const Shape& shape) {
    Node n;
    n.op = op;
    n.name = NodeName();
    n.inputs = std::move(inputs);
    n.attrs = std::move(attrs);
    const ValueId out = NewValue(n.name, shape);
    graph_.value(out).type = type;
    n.outputs = {out};
    SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
    return out;
  }
  // A float32 value of `shape` for the output of an engine op without shape rules.
  ValueId NewValue(const std::string& stem, const Shape& shape) {
    Value v;
    v.name = graph_.UniqueName(stem);
    v.shape = shape;
    return graph_.AddValue(std::move(v));
  }
  ValueId Constant(HostTensor t) {
    Value v;
    v.name = graph_.UniqueName(NodeName() + ".const");
    v.type = t.type;
    v.shape = t.shape;
    v.kind = ValueKind::kConstant;
    v.data = std::move(t);
    return graph_.AddValue(std::move(v));
  }
  ValueId Filled(DataType type, const Shape& shape, double value) {
    HostTensor t(type, shape);
    const int64_t n = NumElements(shape);
    if (type == DataType::kFloat32) {
      std::fill_n(t.floats(), n, static_cast<float>(value));
    } else if (type == DataType::kInt64) {
      std::fill_n(reinterpret_cast<int64_t*>(t.bytes.data()), n, SaturatedInt64(value));
    } else {
      std::fill(t.bytes.begin(), t.bytes.end(), std::byte(value != 0 ? 1 : 0));
    }
    return Constant(std::move(t));
  }
  ValueId Scalar(DataType type, double value) { return Filled(type, {}, value); }
  ValueId Int64s(const std::vector<int64_t>& v) {
    return Constant(HostTensor::FromInt64s({static_cast<int64_t>(v.size())}, v));
  }
  StatusOr<ValueId> Cast(ValueId x, DataType to) {
    if (T(x) == to) return x;
    return Emit("Cast", {x}, {{"to", IntAttr(static_cast<int64_t>(to))}});
  }
  StatusOr<ValueId> ReshapeTo(ValueId x, const Shape& to) {
    if (S(x) == to) return x;
    return Emit("Reshape", {x, Int64s(to)}, {{"allowzero", IntAttr(1)}});
  }
  StatusOr<ValueId> ExpandTo(ValueId x, const Shape& to) {
    if (S(x) == to) return x;
    return Emit("Expand", {x, Int64s(to)});
  }
  StatusOr<int64_t> Axis(int64_t dim, size_t rank) const {
    const int64_t r = std::max<int64_t>(static_cast<int64_t>(rank), 1);
    if (dim < -r || dim >= r)
      return Bad(fmt::format("dim {} is out of range for rank {}", dim, rank));
    return dim < 0 ? dim + r : dim;
  }
  StatusOr<ValueId> Reduce(const std::string& op, ValueId x, std::vector<int64_t> axes, bool keep) {
    for (int64_t& a : axes) {
      SALUS_ASSIGN_OR_RETURN(a, Axis(a, S(x).size()));
    }
    if (axes.empty()) {
      for (size_t d = 0; d < S(x).size(); ++d) axes.push_back(static_cast<int64_t>(d));
    }
    if (S(x).empty()) return x;
    return Emit(op, {x, Int64s(axes)}, {{"keepdims", IntAttr(keep ? 1 : 0)}});
  }

  // --- lowerings (one per operator family) ---
  Status Unary();
  Status Rsqrt();
  Status Rounding();
  Status Sign();
  Status FloatSpecial();
  Status Polygamma();
  Status IsNan();
  Status LeakyRelu();
  Status LeakyReluBackward();
  Status EluOp();
  Status EluBackward();
  Status Bitwise();
  Status ClampBound();
  Status Clamp();
  Status SplitWithSizes();
  Status ConstantPad();
  Status ArgMaxMin();
  Status MaxMinDim();
  Status TopK();
  Status Cumsum();
  Status Variance();
  Status SliceScatter();
  Status AsStrided();
  Status Flip();
  Status Sort();
  Status Prod();
  Status Cumprod();
  Status Diagonal();
  Status DiagonalScatter();
  struct DiagonalPlan {
    std::vector<int64_t> perm;       // dim1 and dim2 moved last, the others in order
    Shape moved;                     // the tensor's shape so permuted
    std::vector<int64_t> positions;  // the diagonal's offsets in the last two dims flattened
  };
  StatusOr<DiagonalPlan> PlanDiagonal(const Shape& xs);
  Status IndexSelect();
  Status Unfold();
  Status UnfoldBackward();
  Status Binary();
  Status Compare();
  Status WhereOp();
  Status Identity();
  Status CastOp();
  Status CopyOp();
  Status Fill();
  Status ScalarTensor();
  Status Arange();
  Status ReshapeOp();
  Status ExpandOp();
  Status Permute();
  Status TransposeOp();
  Status SliceOp();
  Status Select();
  Status SelectBackward();
  Status Cat();
  Status ReduceOp();
  Status AnyAll();
  Status Addmm();
  Status MatMulOp();
  Status SoftmaxOp();
  Status SoftmaxBackward();
  Status ThresholdBackward();
  Status Gelu();
  Status GeluBackward();
  Status Convolution();
  Status ConvolutionBackward();
  // Note [1-D convolutions]: a height of 1 inserted at dim 2, and removed again; BindConv binds
  // a gradient of the current node, removing the height when the node is a 1-D convolution's.
  StatusOr<ValueId> AddHeight(ValueId v) {
    Shape s = S(v);
    s.insert(s.begin() + 2, 1);
    return ReshapeTo(v, s);
  }
  StatusOr<ValueId> DropHeight(ValueId v) {
    Shape s = S(v);
    s.erase(s.begin() + 2);
    return ReshapeTo(v, s);
  }
  Status BindConv(int k, ValueId v) {
    if (one_d_results_) {
      SALUS_ASSIGN_OR_RETURN(v, DropHeight(v));
    }
    return Bind(k, v);
  }
  bool one_d_results_ = false;  // the current node is a 1-D convolution's backward
  Status TransposedConvolutionBackward(ValueId dy, ValueId x, ValueId w,
                                       std::map<std::string, Attribute> attrs,
                                       const std::function<bool(int)>& wanted);
  Status MaxPool();
  StatusOr<ValueId> MaxPoolOf(ValueId x, std::map<std::string, Attribute> attrs);
  StatusOr<ValueId> PoolTaps(const std::string& forward);
  Status MaxPoolBackward();
  Status AvgPool();
  Status AvgPoolBackward();
  Status AdaptivePool();
  Status AdaptivePoolBackward();
  StatusOr<std::map<std::string, Attribute>> AvgPoolAttrs(const Shape& xs);
  Status BatchNormTrain();
  Status BatchNormEval();
  Status BatchNormNoStats();
  Status BatchNormEvalBackward(ValueId dy, ValueId x, ValueId w);
  Status Repeat();
  Status BatchNormBackward();
  Status LayerNorm();
  Status LayerNormBackward();
  Status GroupNorm();
  Status GroupNormBackward();
  Status LstmCell();
  Status LstmCellBackward();
  Status GruCell();
  Status GruCellBackward();
  // A fused RNN cell's arguments: input and hidden gates [batch, gates * hidden], the previous
  // state `state` [batch, hidden] and the optional biases, checked.
  struct CellInputs {
    ValueId gi = kNoValue, gh = kNoValue, state = kNoValue, bi = kNoValue, bh = kNoValue;
    int64_t hidden = 0;
  };
  StatusOr<CellInputs> FusedCellInputs(const std::string& state, int gates);
  // Columns [k * width, (k + 1) * width) of v along `axis`.
  StatusOr<ValueId> Part(ValueId v, int64_t k, int64_t width, int64_t axis = 1) {
    return Emit("Slice",
                {v, Int64s({k * width}), Int64s({k * width + width}), Int64s({axis}), Int64s({1})});
  }
  StatusOr<ValueId> PerChannel(ValueId v, size_t rank);
  Status Embedding();
  Status IndexPut();
  Status Index();
  Status EmbeddingBag();
  Status EmbeddingBagBackward();
  Status UpsampleNearestBackward();
  Status UpsampleBilinear();
  Status PadBackward();
  // A per-dim matrix of Note [Bilinear as matrices]: [out, in], or [in, out] if transposed,
  // for dim 2 (height) or 3 (width).
  using DimMatrix = std::function<HostTensor(int64_t in, int64_t out, bool transposed, int dim)>;
  StatusOr<ValueId> ByMatrices(ValueId x, const Shape& to, bool backward, const std::string& what,
                               const DimMatrix& matrix);
  // Advanced indexing by index tensors on consecutive dims (Note [Advanced indexing]).
  struct Indexed {
    int64_t first = 0;          // the first indexed dim
    int64_t count = 0;          // how many consecutive dims are indexed
    ValueId flat = kNoValue;    // self with those dims flattened into one
    ValueId linear = kNoValue;  // the linear index into it, the index tensors' broadcast shape
  };
  StatusOr<Indexed> IndexTensors(ValueId self, const v1::AtenArgument& list);
  // An int64 index into a dim of `size` with negative entries wrapped, as PyTorch indexes.
  StatusOr<ValueId> Wrapped(ValueId index, int64_t size) {
    const DataType i64 = DataType::kInt64;
    SALUS_ASSIGN_OR_RETURN(ValueId negative, Emit("Less", {index, Scalar(i64, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId up,
                           Emit("Add", {index, Scalar(i64, static_cast<double>(size))}));
    return Emit("Where", {negative, up, index});
  }
  // An embedding bag's rows (one per index) with padding_idx's zeroed; `kept`, when given,
  // gets 1 where a row counts and 0 where it is padding.
  StatusOr<ValueId> WithoutPadding(ValueId rows, ValueId idx, int64_t pad, ValueId* kept);
  Status GatherOp();
  Status Scatter();
  Status Dropout();
  Status Bernoulli();
  Status Empty();
  Status CopyInto();
  Status FusedUpdate();

  StatusOr<ValueId> OneHotAlong(ValueId index, int64_t dim, const Shape& like);
  bool OnePerSlice(ValueId index, int64_t dim, const Shape& like) const;
  StatusOr<ValueId> LinearIndexAlong(ValueId index, int64_t dim, const Shape& like);
  // LinearIndexAlong flattened, and float `values` of as many elements added into zeros of
  // `like`'s shape at those positions (SalusGatherGrad, in a fixed order).
  StatusOr<ValueId> FlatIndexAlong(ValueId index, int64_t dim, const Shape& like) {
    SALUS_ASSIGN_OR_RETURN(ValueId linear, LinearIndexAlong(index, dim, like));
    return ReshapeTo(linear, {NumElements(S(index))});
  }
  StatusOr<ValueId> AddedAt(ValueId flat_index, ValueId values, const Shape& like) {
    SALUS_ASSIGN_OR_RETURN(values, ReshapeTo(values, S(flat_index)));
    SALUS_ASSIGN_OR_RETURN(
        ValueId added, EmitShaped("SalusGatherGrad", {flat_index, values}, {{"axis", IntAttr(0)}},
                                  DataType::kFloat32, {NumElements(like)}));
    return ReshapeTo(added, like);
  }
  Status ScatterAdd();
  Status Fmod();
  StatusOr<ValueId> ArgMaxAlong(ValueId x, bool min, std::optional<int64_t> dim, bool keep);
  StatusOr<std::pair<ValueId, ValueId>> IntExtremeAlong(ValueId x, bool min, int64_t axis);

  const v1::AtenGraph& ag_;
  Graph graph_;
  GraphBuilder builder_;
  std::vector<ValueId> ids_;
  const v1::AtenNode* node_ = nullptr;
  int index_ = 0;
  std::string name_;  // the operator's name without "aten." and the overload
  // max_pool2d_with_indices' indices: only the matching backward may use them, and it reads
  // the engine's taps in their place (SalusMaxPool's second output, Note [Pooling taps] in
  // cpu_kernel_helpers.h). By the indices' value in the ATen graph.
  std::map<int, ValueId> pool_taps_;
  std::set<int> written_;  // state values a copy_ wrote
  // Results of `empty`: made (as zeros) only if a node reads them; bernoulli reads only the
  // shape.
  std::set<int> empties_;
  // A training batch norm's save_rstd result -> its batch statistics, for the backward.
  struct BatchStats {
    ValueId mean, var;
    float eps;
  };
  std::map<int, BatchStats> batch_stats_;
  std::map<int, float> layer_eps_;  // a layer norm's rstd result -> its epsilon
  // A training batch norm's new running statistics -> the state it updated in place with them.
  std::map<ValueId, ValueId> bn_updated_;
  // An embedding bag's offset2bag and bag_size results -> the values the lowering computed.
  std::map<int, ValueId> bag_results_;
  // A topk's indices result -> its dim: positions distinct within each slice along that dim.
  std::map<int, int64_t> distinct_indices_;
  // For each value, the last node that reads it other than as copy_'s destination.
  std::vector<int> last_read_;
};

const std::map<std::string, Lowering>& Lowerer::Table() {
  // clang-format off
  static const std::map<std::string, Lowering> table = {
      {"aten.abs.default", &Lowerer::Unary}, {"aten.neg.default", &Lowerer::Unary},
      {"aten.exp.default", &Lowerer::Unary}, {"aten.log.default", &Lowerer::Unary},
      {"aten.sqrt.default", &Lowerer::Unary}, {"aten.relu.default", &Lowerer::Unary},
      {"aten.erf.default", &Lowerer::Unary}, {"aten.tanh.default", &Lowerer::Unary},
      {"aten.sin.default", &Lowerer::Unary}, {"aten.cos.default", &Lowerer::Unary},
      {"aten.atan.default", &Lowerer::Unary}, {"aten.floor.default", &Lowerer::Rounding},
      {"aten.ceil.default", &Lowerer::Rounding}, {"aten.round.default", &Lowerer::Rounding},
      {"aten.sigmoid.default", &Lowerer::Unary}, {"aten.reciprocal.default", &Lowerer::Unary},
      {"aten.logical_not.default", &Lowerer::Unary}, {"aten.rsqrt.default", &Lowerer::Rsqrt},
      {"aten.sign.default", &Lowerer::Sign}, {"aten.log1p.default", &Lowerer::FloatSpecial},
      {"aten.expm1.default", &Lowerer::FloatSpecial},
      {"aten.lgamma.default", &Lowerer::FloatSpecial},
      {"aten.digamma.default", &Lowerer::FloatSpecial},
      {"aten.erfinv.default", &Lowerer::FloatSpecial}, {"aten.isnan.default", &Lowerer::IsNan},
      {"aten.polygamma.default", &Lowerer::Polygamma},
      {"aten.leaky_relu.default", &Lowerer::LeakyRelu},
      {"aten.leaky_relu_backward.default", &Lowerer::LeakyReluBackward},
      {"aten.bitwise_not.default", &Lowerer::Bitwise},
      {"aten.bitwise_and.Tensor", &Lowerer::Bitwise}, {"aten.bitwise_or.Tensor", &Lowerer::Bitwise},
      {"aten.bitwise_xor.Tensor", &Lowerer::Bitwise},
      {"aten.clamp_min.default", &Lowerer::ClampBound},
      {"aten.clamp.default", &Lowerer::Clamp}, {"aten.clamp.Tensor", &Lowerer::Clamp},
      {"aten.split_with_sizes_copy.default", &Lowerer::SplitWithSizes},
      {"aten.split_with_sizes.default", &Lowerer::SplitWithSizes},
      {"aten.constant_pad_nd.default", &Lowerer::ConstantPad},
      {"aten.var_mean.correction", &Lowerer::Variance},
      {"aten.clamp_max.default", &Lowerer::ClampBound},
      {"aten.clamp_min.Tensor", &Lowerer::ClampBound},
      {"aten.clamp_max.Tensor", &Lowerer::ClampBound},
      {"aten.elu.default", &Lowerer::EluOp},
      {"aten.elu_backward.default", &Lowerer::EluBackward},
      {"aten.argmax.default", &Lowerer::ArgMaxMin}, {"aten.argmin.default", &Lowerer::ArgMaxMin},
      {"aten.max.dim", &Lowerer::MaxMinDim}, {"aten.min.dim", &Lowerer::MaxMinDim},
      {"aten.topk.default", &Lowerer::TopK},
      {"aten.cumsum.default", &Lowerer::Cumsum},
      {"aten.max.default", &Lowerer::ReduceOp}, {"aten.min.default", &Lowerer::ReduceOp},
      {"aten.amin.default", &Lowerer::ReduceOp},
      {"aten.var.correction", &Lowerer::Variance}, {"aten.std.correction", &Lowerer::Variance},
      {"aten.slice_scatter.default", &Lowerer::SliceScatter},
      {"aten.select_scatter.default", &Lowerer::SliceScatter},
      {"aten.as_strided_copy.default", &Lowerer::AsStrided},
      {"aten.as_strided_scatter.default", &Lowerer::AsStrided},
      {"aten.flip.default", &Lowerer::Flip},
      {"aten.prod.default", &Lowerer::Prod}, {"aten.prod.dim_int", &Lowerer::Prod},
      {"aten.cumprod.default", &Lowerer::Cumprod},
      {"aten.sort.default", &Lowerer::Sort}, {"aten.sort.stable", &Lowerer::Sort},
      {"aten.argsort.default", &Lowerer::Sort}, {"aten.argsort.stable", &Lowerer::Sort},
      {"aten.diagonal_copy.default", &Lowerer::Diagonal},
      {"aten.diagonal_scatter.default", &Lowerer::DiagonalScatter},
      {"aten.index_select.default", &Lowerer::IndexSelect},
      {"aten.unfold_copy.default", &Lowerer::Unfold}, {"aten.unfold.default", &Lowerer::Unfold},
      {"aten.unfold_backward.default", &Lowerer::UnfoldBackward},
      {"aten.add.Tensor", &Lowerer::Binary}, {"aten.add.Scalar", &Lowerer::Binary},
      {"aten.sub.Tensor", &Lowerer::Binary}, {"aten.sub.Scalar", &Lowerer::Binary},
      {"aten.rsub.Scalar", &Lowerer::Binary}, {"aten.rsub.Tensor", &Lowerer::Binary},
      {"aten.mul.Tensor", &Lowerer::Binary}, {"aten.mul.Scalar", &Lowerer::Binary},
      {"aten.div.Tensor", &Lowerer::Binary}, {"aten.div.Scalar", &Lowerer::Binary},
      {"aten.pow.Tensor_Tensor", &Lowerer::Binary}, {"aten.pow.Tensor_Scalar", &Lowerer::Binary},
      {"aten.pow.Scalar", &Lowerer::Binary},
      {"aten.maximum.default", &Lowerer::Binary}, {"aten.minimum.default", &Lowerer::Binary},
      {"aten.eq.Scalar", &Lowerer::Compare}, {"aten.eq.Tensor", &Lowerer::Compare},
      {"aten.ne.Scalar", &Lowerer::Compare}, {"aten.ne.Tensor", &Lowerer::Compare},
      {"aten.lt.Scalar", &Lowerer::Compare}, {"aten.lt.Tensor", &Lowerer::Compare},
      {"aten.le.Scalar", &Lowerer::Compare}, {"aten.le.Tensor", &Lowerer::Compare},
      {"aten.gt.Scalar", &Lowerer::Compare}, {"aten.gt.Tensor", &Lowerer::Compare},
      {"aten.ge.Scalar", &Lowerer::Compare}, {"aten.ge.Tensor", &Lowerer::Compare},
      {"aten.logical_and.default", &Lowerer::Compare}, {"aten.logical_or.default", &Lowerer::Compare},
      {"aten.where.self", &Lowerer::WhereOp},
      {"aten.alias.default", &Lowerer::Identity}, {"aten.alias_copy.default", &Lowerer::Identity},
      {"aten.clone.default", &Lowerer::Identity}, {"aten.lift_fresh_copy.default", &Lowerer::Identity},
      {"aten.detach.default", &Lowerer::Identity}, {"aten.detach_copy.default", &Lowerer::Identity},
      {"aten._to_copy.default", &Lowerer::CastOp}, {"aten.copy.default", &Lowerer::CopyOp},
      {"aten.full.default", &Lowerer::Fill}, {"aten.full_like.default", &Lowerer::Fill},
      {"aten.zeros_like.default", &Lowerer::Fill}, {"aten.ones_like.default", &Lowerer::Fill},
      {"aten.zeros.default", &Lowerer::Fill}, {"aten.ones.default", &Lowerer::Fill},
      {"aten.scalar_tensor.default", &Lowerer::ScalarTensor},
      {"aten.arange.start_step", &Lowerer::Arange}, {"aten.arange.default", &Lowerer::Arange},
      {"aten.arange.start", &Lowerer::Arange},
      {"aten.view.default", &Lowerer::ReshapeOp}, {"aten.view_copy.default", &Lowerer::ReshapeOp},
      {"aten._unsafe_view.default", &Lowerer::ReshapeOp},
      {"aten.reshape.default", &Lowerer::ReshapeOp},
      {"aten.squeeze.dims", &Lowerer::ReshapeOp}, {"aten.squeeze_copy.dims", &Lowerer::ReshapeOp},
      {"aten.squeeze.dim", &Lowerer::ReshapeOp}, {"aten.squeeze_copy.dim", &Lowerer::ReshapeOp},
      {"aten.unsqueeze.default", &Lowerer::ReshapeOp},
      {"aten.unsqueeze_copy.default", &Lowerer::ReshapeOp},
      {"aten.expand.default", &Lowerer::ExpandOp}, {"aten.expand_copy.default", &Lowerer::ExpandOp},
      {"aten.permute.default", &Lowerer::Permute}, {"aten.permute_copy.default", &Lowerer::Permute},
      {"aten.t.default", &Lowerer::TransposeOp}, {"aten.t_copy.default", &Lowerer::TransposeOp},
      {"aten.transpose.int", &Lowerer::TransposeOp},
      {"aten.transpose_copy.int", &Lowerer::TransposeOp},
      {"aten.slice.Tensor", &Lowerer::SliceOp}, {"aten.slice_copy.Tensor", &Lowerer::SliceOp},
      {"aten.select.int", &Lowerer::Select}, {"aten.select_copy.int", &Lowerer::Select},
      {"aten.select_backward.default", &Lowerer::SelectBackward},
      {"aten.cat.default", &Lowerer::Cat},
      {"aten.sum.dim_IntList", &Lowerer::ReduceOp}, {"aten.sum.default", &Lowerer::ReduceOp},
      {"aten.mean.dim", &Lowerer::ReduceOp}, {"aten.mean.default", &Lowerer::ReduceOp},
      {"aten.amax.default", &Lowerer::ReduceOp},
      {"aten.any.dim", &Lowerer::AnyAll}, {"aten.any.dims", &Lowerer::AnyAll},
      {"aten.any.default", &Lowerer::AnyAll}, {"aten.all.dim", &Lowerer::AnyAll},
      {"aten.all.dims", &Lowerer::AnyAll}, {"aten.all.default", &Lowerer::AnyAll},
      {"aten.addmm.default", &Lowerer::Addmm},
      {"aten.mm.default", &Lowerer::MatMulOp}, {"aten.bmm.default", &Lowerer::MatMulOp},
      {"aten._softmax.default", &Lowerer::SoftmaxOp},
      {"aten._log_softmax.default", &Lowerer::SoftmaxOp},
      {"aten._softmax_backward_data.default", &Lowerer::SoftmaxBackward},
      {"aten.threshold_backward.default", &Lowerer::ThresholdBackward},
      {"aten.gelu_backward.default", &Lowerer::GeluBackward},
      {"aten._log_softmax_backward_data.default", &Lowerer::SoftmaxBackward},
      {"aten.gelu.default", &Lowerer::Gelu},
      {"aten.convolution.default", &Lowerer::Convolution},
      {"aten.convolution_backward.default", &Lowerer::ConvolutionBackward},
      {"aten.max_pool2d_with_indices.default", &Lowerer::MaxPool},
      {"aten.max_pool2d_with_indices_backward.default", &Lowerer::MaxPoolBackward},
      {"aten.avg_pool2d.default", &Lowerer::AvgPool},
      {"aten.avg_pool2d_backward.default", &Lowerer::AvgPoolBackward},
      {"aten._adaptive_avg_pool2d.default", &Lowerer::AdaptivePool},
      {"aten._adaptive_avg_pool2d_backward.default", &Lowerer::AdaptivePoolBackward},
      {"aten.adaptive_max_pool2d.default", &Lowerer::AdaptivePool},
      {"aten.adaptive_max_pool2d_backward.default", &Lowerer::AdaptivePoolBackward},
      {"aten._native_batch_norm_legit_functional.default", &Lowerer::BatchNormTrain},
      {"aten._native_batch_norm_legit_no_training.default", &Lowerer::BatchNormEval},
      {"aten._native_batch_norm_legit.no_stats", &Lowerer::BatchNormNoStats},
      {"aten.repeat.default", &Lowerer::Repeat},
      {"aten.native_layer_norm.default", &Lowerer::LayerNorm},
      {"aten.native_batch_norm_backward.default", &Lowerer::BatchNormBackward},
      {"aten.native_layer_norm_backward.default", &Lowerer::LayerNormBackward},
      {"aten.native_group_norm.default", &Lowerer::GroupNorm},
      {"aten.native_group_norm_backward.default", &Lowerer::GroupNormBackward},
      {"aten._thnn_fused_lstm_cell.default", &Lowerer::LstmCell},
      {"aten._thnn_fused_lstm_cell_backward_impl.default", &Lowerer::LstmCellBackward},
      {"aten._thnn_fused_gru_cell.default", &Lowerer::GruCell},
      {"aten._thnn_fused_gru_cell_backward.default", &Lowerer::GruCellBackward},
      {"aten.embedding.default", &Lowerer::Embedding},
      {"aten._unsafe_index_put.default", &Lowerer::IndexPut},
      {"aten.index_put.default", &Lowerer::IndexPut},
      {"aten.index.Tensor", &Lowerer::Index},
      {"aten._embedding_bag.default", &Lowerer::EmbeddingBag},
      {"aten._embedding_bag_forward_only.default", &Lowerer::EmbeddingBag},
      {"aten._embedding_bag_dense_backward.default", &Lowerer::EmbeddingBagBackward},
      {"aten._embedding_bag_backward.default", &Lowerer::EmbeddingBagBackward},
      {"aten.upsample_nearest2d_backward.default", &Lowerer::UpsampleNearestBackward},
      {"aten.upsample_bilinear2d.default", &Lowerer::UpsampleBilinear},
      {"aten.reflection_pad2d_backward.default", &Lowerer::PadBackward},
      {"aten.replication_pad2d_backward.default", &Lowerer::PadBackward},
      {"aten.upsample_bilinear2d.vec", &Lowerer::UpsampleBilinear},
      {"aten.upsample_bilinear2d_backward.default", &Lowerer::UpsampleBilinear},
      {"aten.gather.default", &Lowerer::GatherOp},
      {"aten.scatter.value", &Lowerer::Scatter}, {"aten.scatter.src", &Lowerer::Scatter},
      {"aten.scatter_add.default", &Lowerer::ScatterAdd},
      {"aten.fmod.Scalar", &Lowerer::Fmod}, {"aten.fmod.Tensor", &Lowerer::Fmod},
      {"aten.remainder.Scalar", &Lowerer::Fmod}, {"aten.remainder.Tensor", &Lowerer::Fmod},
      {"aten.remainder.Scalar_Tensor", &Lowerer::Fmod},
      {"aten.native_dropout.default", &Lowerer::Dropout},
      {"aten.bernoulli.p", &Lowerer::Bernoulli},
      {"aten.empty.memory_format", &Lowerer::Empty},
      {"aten.empty_permuted.default", &Lowerer::Empty},  // its layout: the engine's is dense
      {"aten.empty_like.default", &Lowerer::Empty},
      // (autograd makes a gradient that arrived expanded contiguous through these)
      {"aten.new_empty_strided.default", &Lowerer::Empty},
      {"aten.new_empty.default", &Lowerer::Empty},
      {"aten.empty_strided.default", &Lowerer::Empty},
      {"aten.copy_.default", &Lowerer::CopyInto},
      {"salus.sgd_update.default", &Lowerer::FusedUpdate},
      {"salus.adam_update.default", &Lowerer::FusedUpdate},
  };
  // clang-format on
  return table;
}

StatusOr<Graph> Lowerer::Run() {
  SALUS_RETURN_IF_ERROR(builder_.limits().CheckNodes(ag_.nodes_size(), "the ATen graph"));
  const int count = ag_.values_size();
  ids_.assign(count, kNoValue);
  std::set<std::string> names;
  auto declare = [&](int index, ValueKind kind, const char* what) -> Status {
    if (index < 0 || index >= count) {
      return InvalidArgumentError(fmt::format("{} {} is not a value of the graph", what, index));
    }
    const v1::AtenValue& av = ag_.values(index);
    if (ids_[index] != kNoValue) {
      return InvalidArgumentError(fmt::format("value '{}' is declared twice", av.name()));
    }
    if (av.name().empty() || !names.insert(av.name()).second) {
      return InvalidArgumentError(
          fmt::format("{} name '{}' is empty or repeated", what, av.name()));
    }
    Value v;
    v.name = av.name();
    SALUS_ASSIGN_OR_RETURN(v.type, EngineType(av));
    v.shape.assign(av.shape().begin(), av.shape().end());
    for (int64_t d : v.shape) {
      if (d < 0) return InvalidArgumentError("value '" + av.name() + "' has a negative dim");
    }
    if (TooManyElements(v.shape, builder_.limits().max_tensor_elements)) {
      return InvalidArgumentError(fmt::format("value '{}' of shape {} has more than {} elements",
                                              av.name(), ShapeString(v.shape),
                                              builder_.limits().max_tensor_elements));
    }
    v.kind = kind;
    if (kind == ValueKind::kConstant) {
      // The data's size first: a declaration alone must not allocate anything.
      const uint64_t bytes = static_cast<uint64_t>(NumElements(v.shape)) * ElementSize(v.type);
      if (av.data().size() != bytes) {
        return InvalidArgumentError(fmt::format("constant '{}' has {} bytes for {}{}", av.name(),
                                                av.data().size(), DataTypeName(v.type),
                                                ShapeString(v.shape)));
      }
      SALUS_ASSIGN_OR_RETURN(HostTensor t,
                             builder_.NewConstant(v.type, v.shape, "constant '" + av.name() + "'"));
      if (bytes > 0) std::memcpy(t.bytes.data(), av.data().data(), bytes);
      v.data = std::move(t);
    }
    ids_[index] = graph_.AddValue(std::move(v));
    if (kind == ValueKind::kInput) graph_.inputs().push_back(ids_[index]);
    return OkStatus();
  };
  for (int i : ag_.inputs()) SALUS_RETURN_IF_ERROR(declare(i, ValueKind::kInput, "input"));
  for (int i : ag_.state()) SALUS_RETURN_IF_ERROR(declare(i, ValueKind::kState, "state value"));
  for (int i = 0; i < count; ++i) {
    if (ag_.values(i).constant())
      SALUS_RETURN_IF_ERROR(declare(i, ValueKind::kConstant, "constant"));
  }
  // Every unsupported operator at once, so a user learns the whole list from one attempt.
  std::set<std::string> missing;
  for (const v1::AtenNode& n : ag_.nodes()) {
    if (Table().count(n.op()) == 0) missing.insert(n.op());
  }
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    return UnimplementedError("the graph uses ATen operators the engine does not run: " + list);
  }
  last_read_.assign(count, -1);
  for (int i = 0; i < ag_.nodes_size(); ++i) {
    const v1::AtenNode& n = ag_.nodes(i);
    for (const v1::AtenArgument& a : n.args()) {
      // copy_ writes its self; copy reads only self's shape and type.
      if ((n.op() == "aten.copy_.default" || n.op() == "aten.copy.default") && a.name() == "self") {
        continue;
      }
      if (a.kind_case() == v1::AtenArgument::kValue && a.value() >= 0 && a.value() < count) {
        last_read_[a.value()] = i;
      }
      if (a.kind_case() == v1::AtenArgument::kValues) {
        for (int v : a.values().v()) {
          if (v >= 0 && v < count) last_read_[v] = i;
        }
      }
    }
  }
  for (index_ = 0; index_ < ag_.nodes_size(); ++index_) {
    node_ = &ag_.nodes(index_);
    one_d_results_ = false;
    for (int o : node_->outputs()) {
      if (o >= count) return Bad(fmt::format("result {} is out of range", o));
    }
    SALUS_RETURN_IF_ERROR((this->*Table().at(node_->op()))());
    for (int o : node_->outputs()) {
      if (o >= 0 && ids_[o] == kNoValue && pool_taps_.count(o) == 0 && empties_.count(o) == 0) {
        return InternalError(fmt::format("{} (node {}): result '{}' was not made", node_->op(),
                                         index_, ag_.values(o).name()));
      }
    }
  }
  node_ = nullptr;
  for (int k = 0; k < ag_.outputs_size(); ++k) {
    const int o = ag_.outputs(k);
    if (o < 0 || o >= count || ids_[o] == kNoValue) {
      return InvalidArgumentError(fmt::format("output {} is not a value the graph makes", k));
    }
    ValueId id = ids_[o];
    if (graph_.value(id).kind != ValueKind::kIntermediate ||
        std::count(graph_.outputs().begin(), graph_.outputs().end(), id) > 0) {
      Node n;
      n.op = "Identity";
      n.name = "output" + std::to_string(k);
      n.inputs = {id};
      Value v;
      v.name = graph_.UniqueName("output");
      v.type = DataType::kUndefined;
      n.outputs = {graph_.AddValue(std::move(v))};
      id = n.outputs[0];
      SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
    }
    graph_.Rename(id, AtenImporter::OutputName(k));
    graph_.outputs().push_back(id);
  }
  return std::move(graph_);
}

// ---------------------------------------------------------------------------------------------
// Elementwise.

Status Lowerer::Unary() {
  static const std::map<std::string, std::string> ops = {
      {"aten.abs.default", "Abs"},         {"aten.neg.default", "Neg"},
      {"aten.exp.default", "Exp"},         {"aten.log.default", "Log"},
      {"aten.sqrt.default", "Sqrt"},       {"aten.relu.default", "Relu"},
      {"aten.erf.default", "Erf"},         {"aten.tanh.default", "Tanh"},
      {"aten.sigmoid.default", "Sigmoid"}, {"aten.reciprocal.default", "Reciprocal"},
      {"aten.sin.default", "Sin"},         {"aten.cos.default", "Cos"},
      {"aten.atan.default", "Atan"},       {"aten.logical_not.default", "Not"}};
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, type));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(ops.at(node_->op()), {x}));
  return Bind(0, y);
}

// floor, ceil and round (half to even, as ONNX's Round): the engine's Floor, Ceil and Round on
// floats; an integer tensor is its own value.
Status Lowerer::Rounding() {
  static const std::map<std::string, std::string> ops = {{"aten.floor.default", "Floor"},
                                                         {"aten.ceil.default", "Ceil"},
                                                         {"aten.round.default", "Round"}};
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  if (type == DataType::kBool) return Refuse("rounding of a bool tensor");
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, type));
  if (type != DataType::kFloat32) return Bind(0, x);
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(ops.at(node_->op()), {x}));
  return Bind(0, y);
}

Status Lowerer::Rsqrt() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kFloat32));
  SALUS_ASSIGN_OR_RETURN(ValueId s, Emit("Sqrt", {x}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Reciprocal", {s}));
  return Bind(0, y);
}

// sign: (x > 0) - (x < 0) in x's type, so NaN and zero give 0, as PyTorch's.
Status Lowerer::Sign() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  if (type == DataType::kBool) return Refuse("sign of a bool tensor");
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, type));
  SALUS_ASSIGN_OR_RETURN(ValueId pos, Emit("Greater", {x, Scalar(type, 0)}));
  SALUS_ASSIGN_OR_RETURN(ValueId neg, Emit("Less", {x, Scalar(type, 0)}));
  SALUS_ASSIGN_OR_RETURN(pos, Cast(pos, type));
  SALUS_ASSIGN_OR_RETURN(neg, Cast(neg, type));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Sub", {pos, neg}));
  return Bind(0, y);
}

// log1p and expm1: the engine's SalusLog1p and SalusExpm1 (log(1 + x) and exp(x) - 1 would
// lose every digit of a small x); lgamma, digamma and erfinv: its SalusLgamma, SalusDigamma and
// SalusErfinv. Their gradients are made of these and ordinary ops by PyTorch (digamma's, the
// trigamma, is polygamma: below).
Status Lowerer::FloatSpecial() {
  static const std::map<std::string, std::string> ops = {{"aten.log1p.default", "SalusLog1p"},
                                                         {"aten.expm1.default", "SalusExpm1"},
                                                         {"aten.lgamma.default", "SalusLgamma"},
                                                         {"aten.digamma.default", "SalusDigamma"},
                                                         {"aten.erfinv.default", "SalusErfinv"}};
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kFloat32));
  SALUS_ASSIGN_OR_RETURN(ValueId y,
                         EmitShaped(ops.at(node_->op()), {x}, {}, DataType::kFloat32, S(x)));
  return Bind(0, y);
}

// polygamma(n, x), the n-th derivative of digamma (digamma's gradient is n = 1, and each
// polygamma's the next): the engine's SalusPolygamma with n as its attribute.
Status Lowerer::Polygamma() {
  SALUS_ASSIGN_OR_RETURN(int64_t order, Int("n"));
  if (order < 0 || order > 1000) {
    return Bad(fmt::format("n = {} is outside 0..1000", order));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kFloat32));
  SALUS_ASSIGN_OR_RETURN(ValueId y, EmitShaped("SalusPolygamma", {x}, {{"n", IntAttr(order)}},
                                               DataType::kFloat32, S(x)));
  return Bind(0, y);
}

// isnan: x != x (false for every integer).
Status Lowerer::IsNan() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  if (T(x) == DataType::kBool) {
    SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kInt64));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId same, Emit("Equal", {x, x}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Not", {same}));
  return Bind(0, y);
}

Status Lowerer::LeakyRelu() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kFloat32));
  double slope = 0.01;
  SALUS_ASSIGN_OR_RETURN(slope, NumberOr("negative_slope", slope));
  SALUS_ASSIGN_OR_RETURN(ValueId y,
                         Emit("LeakyRelu", {x}, {{"alpha", FloatAttr(static_cast<float>(slope))}}));
  return Bind(0, y);
}

// leaky_relu_backward(grad_output, self, negative_slope, self_is_result): the gradient where
// self > 0, slope times it elsewhere (PyTorch's choice at 0). A result has the input's sign
// only for a positive slope.
Status Lowerer::LeakyReluBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(double slope, Number("negative_slope"));
  SALUS_ASSIGN_OR_RETURN(bool is_result, Bool("self_is_result"));
  if (is_result && slope < 0)
    return Refuse("leaky_relu_backward of a result with a negative slope");
  if (S(dy) != S(x) || T(x) != DataType::kFloat32 || T(dy) != DataType::kFloat32) {
    return Bad("grad_output and self must be float tensors of one shape");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId pos, Emit("Greater", {x, Scalar(DataType::kFloat32, 0)}));
  SALUS_ASSIGN_OR_RETURN(ValueId scaled, Emit("Mul", {dy, Scalar(DataType::kFloat32, slope)}));
  SALUS_ASSIGN_OR_RETURN(ValueId dx, Emit("Where", {pos, dy, scaled}));
  return Bind(0, dx);
}

// clamp(self, min=None, max=None) with number or tensor bounds: maximum, then minimum, as the
// device's decomposition of clamp does (trace.py).
Status Lowerer::Clamp() {
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(y, Cast(y, type));
  for (const char* bound : {"min", "max"}) {
    if (IsNone(bound)) continue;
    SALUS_ASSIGN_OR_RETURN(ValueId b, TensorOrScalar(bound, type));
    SALUS_ASSIGN_OR_RETURN(b, Cast(b, type));
    SALUS_ASSIGN_OR_RETURN(y, Emit(std::string(bound) == "min" ? "Max" : "Min", {y, b}));
  }
  return Bind(0, y);
}

// split_with_sizes(self, split_sizes, dim=0) (what chunk and split record): one Slice per part.
Status Lowerer::SplitWithSizes() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, Ints("split_sizes"));
  int64_t dim = 0;
  SALUS_ASSIGN_OR_RETURN(dim, IntOr("dim", dim));
  if (S(x).empty()) return Bad("split of a 0-d tensor");
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(x).size()));
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 0) return Bad("a negative split size");
    total += n;
  }
  if (total != S(x)[dim]) return Bad("split sizes do not add up to the dim");
  if (static_cast<int>(sizes.size()) != Outputs()) return Bad("one result per split size");
  int64_t at = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t end = at + sizes[k];
    if (node_->outputs(static_cast<int>(k)) >= 0) {
      SALUS_ASSIGN_OR_RETURN(ValueId part, Emit("Slice", {x, Int64s({at}), Int64s({end}),
                                                          Int64s({dim}), Int64s({1})}));
      SALUS_RETURN_IF_ERROR(Bind(static_cast<int>(k), part));
    }
    at = end;
  }
  return OkStatus();
}

// constant_pad_nd(self, pad, value=0) (F.pad's constant mode): pad holds (before, after) pairs
// from the last dim backwards. Negative amounts crop, by a Slice first; the rest is one Pad.
Status Lowerer::ConstantPad() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> pad, Ints("pad"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  double value = 0;
  SALUS_ASSIGN_OR_RETURN(value, NumberOr("value", value));
  const Shape xs = S(x);
  const size_t rank = xs.size();
  if (pad.size() % 2 != 0 || pad.size() / 2 > rank) return Bad("pad must hold pairs, one per dim");
  std::vector<int64_t> before(rank, 0), after(rank, 0);
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    const size_t d = rank - 1 - k;
    before[d] = pad[2 * k];
    after[d] = pad[2 * k + 1];
  }
  std::vector<int64_t> starts, ends, axes;
  for (size_t d = 0; d < rank; ++d) {
    if (before[d] >= 0 && after[d] >= 0) continue;
    const int64_t start = std::max<int64_t>(0, -before[d]);
    const int64_t end = xs[d] - std::max<int64_t>(0, -after[d]);
    if (end < start) return Bad("the padding crops more than the dim holds");
    starts.push_back(start);
    ends.push_back(end);
    axes.push_back(static_cast<int64_t>(d));
    before[d] = std::max<int64_t>(0, before[d]);
    after[d] = std::max<int64_t>(0, after[d]);
  }
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, type));
  if (!axes.empty()) {
    SALUS_ASSIGN_OR_RETURN(x, Emit("Slice", {x, Int64s(starts), Int64s(ends), Int64s(axes)}));
  }
  std::vector<int64_t> pads = before;
  pads.insert(pads.end(), after.begin(), after.end());
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) {
    SALUS_ASSIGN_OR_RETURN(
        x, Emit("Pad", {x, Int64s(pads), Scalar(type, value)}, {{"mode", StringAttr("constant")}}));
  }
  return Bind(0, x);
}

// fmod(self, other): the remainder with the dividend's sign, the engine's Mod with fmod=1.
// remainder(self, other), Python's %: the remainder with the divisor's sign. For int64 that is
// Mod with fmod=0; for floats, as PyTorch computes it, fmod's remainder plus the divisor where
// the two have opposite signs (their product below 0; a zero remainder stays).
Status Lowerer::Fmod() {
  const bool remainder = node_->op().rfind("aten.remainder.", 0) == 0;
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(ValueId a, TensorOrScalar("self", type));
  SALUS_ASSIGN_OR_RETURN(ValueId b, TensorOrScalar("other", type));
  if (type == DataType::kBool)
    return Refuse(remainder ? "remainder of bool tensors" : "fmod of bool tensors");
  SALUS_ASSIGN_OR_RETURN(a, Cast(a, type));
  SALUS_ASSIGN_OR_RETURN(b, Cast(b, type));
  const bool floored = remainder && type == DataType::kInt64;
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Mod", {a, b}, {{"fmod", IntAttr(floored ? 0 : 1)}}));
  if (remainder && !floored) {
    SALUS_ASSIGN_OR_RETURN(ValueId product, Emit("Mul", {y, b}));
    SALUS_ASSIGN_OR_RETURN(ValueId differ, Emit("Less", {product, Scalar(type, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId shifted, Emit("Add", {y, b}));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Where", {differ, shifted, y}));
  }
  return Bind(0, y);
}

// elu(self, alpha=1, scale=1, input_scale=1): scale * x where x > 0, else
// alpha * scale * expm1(input_scale * x) (NaN takes that side, as PyTorch's).
Status Lowerer::EluOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kFloat32));
  double alpha = 1, scale = 1, input_scale = 1;
  SALUS_ASSIGN_OR_RETURN(alpha, NumberOr("alpha", alpha));
  SALUS_ASSIGN_OR_RETURN(scale, NumberOr("scale", scale));
  SALUS_ASSIGN_OR_RETURN(input_scale, NumberOr("input_scale", input_scale));
  const DataType f = DataType::kFloat32;
  SALUS_ASSIGN_OR_RETURN(ValueId pos, Emit("Greater", {x, Scalar(f, 0)}));
  SALUS_ASSIGN_OR_RETURN(ValueId scaled_in, Emit("Mul", {x, Scalar(f, input_scale)}));
  SALUS_ASSIGN_OR_RETURN(ValueId em1, EmitShaped("SalusExpm1", {scaled_in}, {}, f, S(x)));
  SALUS_ASSIGN_OR_RETURN(ValueId neg, Emit("Mul", {em1, Scalar(f, alpha * scale)}));
  SALUS_ASSIGN_OR_RETURN(ValueId lin, Emit("Mul", {x, Scalar(f, scale)}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Where", {pos, lin, neg}));
  return Bind(0, y);
}

// elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result), PyTorch's
// formula: grad * scale where self_or_result > 0 (or is NaN); elsewhere
// grad * input_scale * (result + alpha * scale) from the result, or
// grad * input_scale * alpha * scale * exp(input_scale * x) from the input.
Status Lowerer::EluBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId v, Tensor("self_or_result"));
  SALUS_ASSIGN_OR_RETURN(double alpha, Number("alpha"));
  SALUS_ASSIGN_OR_RETURN(double scale, Number("scale"));
  SALUS_ASSIGN_OR_RETURN(double input_scale, Number("input_scale"));
  SALUS_ASSIGN_OR_RETURN(bool is_result, Bool("is_result"));
  if (S(dy) != S(v) || T(dy) != DataType::kFloat32 || T(v) != DataType::kFloat32) {
    return Bad("grad_output and self_or_result must be float tensors of one shape");
  }
  const DataType f = DataType::kFloat32;
  ValueId slope = kNoValue;
  if (is_result) {
    SALUS_ASSIGN_OR_RETURN(ValueId shifted, Emit("Add", {v, Scalar(f, alpha * scale)}));
    SALUS_ASSIGN_OR_RETURN(slope, Emit("Mul", {shifted, Scalar(f, input_scale)}));
  } else {
    SALUS_ASSIGN_OR_RETURN(ValueId scaled_in, Emit("Mul", {v, Scalar(f, input_scale)}));
    SALUS_ASSIGN_OR_RETURN(ValueId e, Emit("Exp", {scaled_in}));
    SALUS_ASSIGN_OR_RETURN(slope, Emit("Mul", {e, Scalar(f, input_scale * alpha * scale)}));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId neg, Emit("LessOrEqual", {v, Scalar(f, 0)}));
  SALUS_ASSIGN_OR_RETURN(ValueId factor, Emit("Where", {neg, slope, Scalar(f, scale)}));
  SALUS_ASSIGN_OR_RETURN(ValueId dx, Emit("Mul", {dy, factor}));
  return Bind(0, dx);
}

// bitwise_not, _and, _or, _xor: logic on bool tensors (masks); not also on int64, as -1 - x.
Status Lowerer::Bitwise() {
  const std::string& op = node_->op();
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(ValueId a, Tensor("self"));
  if (op == "aten.bitwise_not.default") {
    ValueId y = kNoValue;
    if (type == DataType::kBool) {
      SALUS_ASSIGN_OR_RETURN(y, Emit("Not", {a}));
    } else if (type == DataType::kInt64) {
      SALUS_ASSIGN_OR_RETURN(y, Emit("Sub", {Scalar(type, -1), a}));
    } else {
      return Refuse("bitwise_not of a float tensor");
    }
    return Bind(0, y);
  }
  if (type != DataType::kBool) return Refuse("bitwise and, or or xor of integer tensors");
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("other"));
  SALUS_ASSIGN_OR_RETURN(a, Cast(a, DataType::kBool));
  SALUS_ASSIGN_OR_RETURN(b, Cast(b, DataType::kBool));
  ValueId y = kNoValue;
  if (op == "aten.bitwise_and.Tensor") {
    SALUS_ASSIGN_OR_RETURN(y, Emit("And", {a, b}));
  } else if (op == "aten.bitwise_or.Tensor") {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Or", {a, b}));
  } else {
    SALUS_ASSIGN_OR_RETURN(ValueId either, Emit("Or", {a, b}));
    SALUS_ASSIGN_OR_RETURN(ValueId both, Emit("And", {a, b}));
    SALUS_ASSIGN_OR_RETURN(ValueId not_both, Emit("Not", {both}));
    SALUS_ASSIGN_OR_RETURN(y, Emit("And", {either, not_both}));
  }
  return Bind(0, y);
}

// clamp_min(self, min) and clamp_max(self, max) with a number bound: maximum and minimum
// against it, as clamp's decomposition (trace.py) does.
Status Lowerer::ClampBound() {
  const bool lower = node_->op().rfind("aten.clamp_min.", 0) == 0;
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(ValueId bound, TensorOrScalar(lower ? "min" : "max", type));
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, type));
  SALUS_ASSIGN_OR_RETURN(bound, Cast(bound, type));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(lower ? "Max" : "Min", {x, bound}));
  return Bind(0, y);
}

// add/sub (with alpha), rsub, mul, div, pow, maximum, minimum: both operands are cast to the
// result's type (PyTorch's type promotion already decided it).
Status Lowerer::Binary() {
  const std::string& op = node_->op();
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  const bool pow = op.rfind("aten.pow.", 0) == 0;
  const bool rsub = op.rfind("aten.rsub.", 0) == 0;
  ValueId a = kNoValue, b = kNoValue;
  if (op == "aten.pow.Scalar") {
    SALUS_ASSIGN_OR_RETURN(a, TensorOrScalar("self", type));
    SALUS_ASSIGN_OR_RETURN(b, TensorOrScalar("exponent", type));
  } else if (pow) {
    SALUS_ASSIGN_OR_RETURN(a, TensorOrScalar("self", type));
    SALUS_ASSIGN_OR_RETURN(b, TensorOrScalar("exponent", type));
  } else {
    SALUS_ASSIGN_OR_RETURN(a, TensorOrScalar("self", type));
    SALUS_ASSIGN_OR_RETURN(b, TensorOrScalar("other", type));
  }
  if (op == "aten.div.Tensor_mode" || (op.rfind("aten.div.", 0) == 0 && !IsNone("rounding_mode"))) {
    return Refuse("div with a rounding mode");
  }
  SALUS_ASSIGN_OR_RETURN(a, Cast(a, type));
  SALUS_ASSIGN_OR_RETURN(b, Cast(b, type));
  const bool with_alpha = op.rfind("aten.add.", 0) == 0 || op.rfind("aten.sub.", 0) == 0 || rsub;
  if (with_alpha) {
    SALUS_ASSIGN_OR_RETURN(double alpha, Number("alpha"));
    if (alpha != 1.0) {
      SALUS_ASSIGN_OR_RETURN(b, Emit("Mul", {b, Scalar(type, alpha)}));
    }
  }
  std::string engine;
  if (op.rfind("aten.add.", 0) == 0) {
    engine = "Add";
  } else if (op.rfind("aten.sub.", 0) == 0) {
    engine = "Sub";
  } else if (rsub) {
    engine = "Sub";
    std::swap(a, b);
  } else if (op.rfind("aten.mul.", 0) == 0) {
    engine = "Mul";
  } else if (op.rfind("aten.div.", 0) == 0) {
    if (type != DataType::kFloat32) return Refuse("integer division");
    engine = "Div";
  } else if (pow) {
    engine = "Pow";
  } else if (op == "aten.maximum.default") {
    engine = "Max";
  } else {
    engine = "Min";
  }
  if (type == DataType::kBool && (engine == "Mul" || engine == "Add")) {
    engine = engine == "Mul" ? "And" : "Or";  // PyTorch's bool product and sum
  } else if (type == DataType::kBool && engine != "Max" && engine != "Min") {
    return Refuse("arithmetic on bool tensors");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(engine, {a, b}));
  return Bind(0, y);
}

Status Lowerer::Compare() {
  const std::string& op = node_->op();
  const bool logical = op.rfind("aten.logical_", 0) == 0;
  SALUS_ASSIGN_OR_RETURN(ValueId a, Tensor("self"));
  DataType common = T(a);
  ValueId b = kNoValue;
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* other, Arg("other"));
  if (other->kind_case() == v1::AtenArgument::kValue) {
    SALUS_ASSIGN_OR_RETURN(b, ValueOf(other->value()));
    if (T(b) == DataType::kFloat32) common = DataType::kFloat32;
  } else if (other->kind_case() == v1::AtenArgument::kFloatValue) {
    common = DataType::kFloat32;
  }
  if (logical) common = DataType::kBool;
  if (b == kNoValue) {
    SALUS_ASSIGN_OR_RETURN(double v, Number("other"));
    b = Scalar(common, v);
  }
  if (common == DataType::kBool && !logical) common = DataType::kInt64;
  SALUS_ASSIGN_OR_RETURN(a, Cast(a, common));
  SALUS_ASSIGN_OR_RETURN(b, Cast(b, common));
  const std::string family = op.substr(5, op.find('.', 5) - 5);
  static const std::map<std::string, std::string> ops = {
      {"eq", "Equal"},   {"ne", "Equal"},          {"lt", "Less"},         {"le", "LessOrEqual"},
      {"gt", "Greater"}, {"ge", "GreaterOrEqual"}, {"logical_and", "And"}, {"logical_or", "Or"}};
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(ops.at(family), {a, b}));
  if (family == "ne") {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Not", {y}));
  }
  return Bind(0, y);
}

Status Lowerer::WhereOp() {
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(ValueId c, Tensor("condition"));
  SALUS_ASSIGN_OR_RETURN(ValueId a, TensorOrScalar("self", type));
  SALUS_ASSIGN_OR_RETURN(ValueId b, TensorOrScalar("other", type));
  SALUS_ASSIGN_OR_RETURN(c, Cast(c, DataType::kBool));
  SALUS_ASSIGN_OR_RETURN(a, Cast(a, type));
  SALUS_ASSIGN_OR_RETURN(b, Cast(b, type));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Where", {c, a, b}));
  return Bind(0, y);
}

// ---------------------------------------------------------------------------------------------
// Copies, constants and shapes.

// An alias (detach, clone...) of a norm's statistics stands for them as they do: activation
// checkpointing hands its recomputed forward's results to the backward through detach.
Status Lowerer::Identity() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* self, Arg("self"));
  if (Outputs() == 0) return Bad("the node declares no result");
  const int out = node_->outputs(0);
  if (self->kind_case() == v1::AtenArgument::kValue && out >= 0) {
    if (auto it = layer_eps_.find(self->value()); it != layer_eps_.end()) {
      layer_eps_[out] = it->second;
    }
    if (auto it = batch_stats_.find(self->value()); it != batch_stats_.end()) {
      batch_stats_[out] = it->second;
    }
  }
  return Bind(0, x);
}

Status Lowerer::CastOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Cast(x, type));
  return Bind(0, y);
}

// copy(self, src): src broadcast to self's shape in self's type.
Status Lowerer::CopyOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId self, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(ValueId src, Tensor("src"));
  SALUS_ASSIGN_OR_RETURN(src, Cast(src, T(self)));
  SALUS_ASSIGN_OR_RETURN(ValueId y, ExpandTo(src, S(self)));
  return Bind(0, y);
}

Status Lowerer::Fill() {
  const std::string& op = node_->op();
  double v = 0;
  if (op == "aten.ones_like.default" || op == "aten.ones.default") {
    v = 1;
  } else if (op == "aten.full.default" || op == "aten.full_like.default") {
    SALUS_ASSIGN_OR_RETURN(v, Number("fill_value"));
  }
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(Shape shape, DeclaredShape(0));
  if (TooManyElements(shape, builder_.limits().max_tensor_elements)) {
    return Bad("the filled tensor is too large");
  }
  SALUS_RETURN_IF_ERROR(builder_.Reserve(
      static_cast<uint64_t>(NumElements(shape)) * ElementSize(type),
      fmt::format("{} (node {}): the filled tensor {}", node_->op(), index_, ShapeString(shape))));
  return Bind(0, Filled(type, shape, v));
}

Status Lowerer::ScalarTensor() {
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(double v, Number("s"));
  return Bind(0, Scalar(type, v));
}

Status Lowerer::Arange() {
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(Shape shape, DeclaredShape(0));
  double start = 0, step = 1;
  if (node_->op() != "aten.arange.default") {
    SALUS_ASSIGN_OR_RETURN(start, Number("start"));
  }
  if (node_->op() == "aten.arange.start_step") {
    SALUS_ASSIGN_OR_RETURN(step, Number("step"));
  }
  if (shape.size() != 1) return Bad("arange's result is not 1-D");
  SALUS_ASSIGN_OR_RETURN(
      HostTensor t, builder_.NewConstant(
                        type, shape, fmt::format("{} (node {}): the range", node_->op(), index_)));
  for (int64_t i = 0; i < shape[0]; ++i) {
    const double v = start + step * static_cast<double>(i);
    if (type == DataType::kFloat32) {
      t.floats()[i] = static_cast<float>(v);
    } else if (type == DataType::kInt64) {
      reinterpret_cast<int64_t*>(t.bytes.data())[i] = SaturatedInt64(v);
    } else {
      return Refuse("a bool arange");
    }
  }
  return Bind(0, Constant(std::move(t)));
}

// view, reshape, squeeze, unsqueeze: the declared shape says where the elements go.
Status Lowerer::ReshapeOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(Shape to, DeclaredShape(0));
  if (NumElements(to) != NumElements(S(x))) return Bad("the new shape has another size");
  SALUS_ASSIGN_OR_RETURN(ValueId y, ReshapeTo(x, to));
  return Bind(0, y);
}

Status Lowerer::ExpandOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(Shape to, DeclaredShape(0));
  SALUS_ASSIGN_OR_RETURN(ValueId y, ExpandTo(x, to));
  return Bind(0, y);
}

Status Lowerer::Permute() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dims, Ints("dims"));
  if (dims.size() != S(x).size()) return Bad("dims do not match the rank");
  for (int64_t& d : dims) {
    SALUS_ASSIGN_OR_RETURN(d, Axis(d, S(x).size()));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Transpose", {x}, {{"perm", IntsAttr(dims)}}));
  return Bind(0, y);
}

Status Lowerer::TransposeOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  const size_t rank = S(x).size();
  if (rank < 2) return Bind(0, x);
  int64_t d0 = 0, d1 = 1;
  if (node_->op().find(".int") != std::string::npos) {
    SALUS_ASSIGN_OR_RETURN(int64_t a, Int("dim0"));
    SALUS_ASSIGN_OR_RETURN(int64_t b, Int("dim1"));
    SALUS_ASSIGN_OR_RETURN(d0, Axis(a, rank));
    SALUS_ASSIGN_OR_RETURN(d1, Axis(b, rank));
  }
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[d0], perm[d1]);
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Transpose", {x}, {{"perm", IntsAttr(perm)}}));
  return Bind(0, y);
}

Status Lowerer::SliceOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(x).size()));
  const int64_t size = S(x)[dim];
  int64_t start = 0, end = size, step = 1;
  SALUS_ASSIGN_OR_RETURN(start, IntOr("start", start));
  SALUS_ASSIGN_OR_RETURN(end, IntOr("end", end));
  SALUS_ASSIGN_OR_RETURN(step, Int("step"));
  if (step < 1) return Bad("slice step must be positive");
  start = std::clamp<int64_t>(start < 0 ? start + size : start, 0, size);
  end = std::clamp<int64_t>(end < 0 ? end + size : end, 0, size);
  SALUS_ASSIGN_OR_RETURN(
      ValueId y, Emit("Slice", {x, Int64s({start}), Int64s({end}), Int64s({dim}), Int64s({step})}));
  return Bind(0, y);
}

Status Lowerer::Select() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(x).size()));
  SALUS_ASSIGN_OR_RETURN(int64_t index, Int("index"));
  const int64_t size = S(x)[dim];
  if (index < -size || index >= size) return Bad("index is out of range");
  if (index < 0) index += size;
  SALUS_ASSIGN_OR_RETURN(
      ValueId y,
      Emit("Gather", {x, Constant(HostTensor::FromInt64s({}, {index}))}, {{"axis", IntAttr(dim)}}));
  return Bind(0, y);
}

// select_backward(grad_output, input_sizes, dim, index): the gradient placed at `index` along
// `dim` of zeros of input_sizes, as one Pad.
Status Lowerer::SelectBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, Ints("input_sizes"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, sizes.size()));
  SALUS_ASSIGN_OR_RETURN(int64_t index, Int("index"));
  const int64_t size = sizes[dim];
  if (index < -size || index >= size) return Bad("index is out of range");
  if (index < 0) index += size;
  Shape kept = sizes;
  kept[dim] = 1;
  if (NumElements(kept) != NumElements(S(dy))) return Bad("grad_output does not fit input_sizes");
  SALUS_ASSIGN_OR_RETURN(ValueId g, ReshapeTo(dy, kept));
  std::vector<int64_t> pads(2 * sizes.size(), 0);
  pads[dim] = index;
  pads[dim + sizes.size()] = size - 1 - index;
  SALUS_ASSIGN_OR_RETURN(ValueId y,
                         Emit("Pad", {g, Int64s(pads)}, {{"mode", StringAttr("constant")}}));
  return Bind(0, y);
}

Status Lowerer::Cat() {
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* list, Arg("tensors"));
  if (list->kind_case() != v1::AtenArgument::kValues) return Bad("'tensors' is not a list");
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  std::vector<ValueId> parts;
  for (int i : list->values().v()) {
    SALUS_ASSIGN_OR_RETURN(ValueId p, ValueOf(i));
    if (NumElements(S(p)) == 0 && S(p).size() == 1) continue;  // torch skips empty 1-D inputs
    SALUS_ASSIGN_OR_RETURN(p, Cast(p, type));
    parts.push_back(p);
  }
  if (parts.empty()) return Bad("nothing to concatenate");
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(parts[0]).size()));
  SALUS_ASSIGN_OR_RETURN(ValueId y, parts.size() == 1
                                        ? StatusOr<ValueId>(parts[0])
                                        : Emit("Concat", parts, {{"axis", IntAttr(dim)}}));
  return Bind(0, y);
}

Status Lowerer::ReduceOp() {
  const std::string& op = node_->op();
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  std::vector<int64_t> axes;
  bool keep = false;
  // .default: every axis, no keepdim (sum, mean, and max/min of the whole tensor).
  if (!op.ends_with(".default") || op == "aten.amax.default" || op == "aten.amin.default") {
    SALUS_ASSIGN_OR_RETURN(axes, IntsOr("dim", axes));
    SALUS_ASSIGN_OR_RETURN(keep, Bool("keepdim"));
  }
  const bool min = op == "aten.amin.default" || op == "aten.min.default";
  const std::string engine = op.rfind("aten.sum.", 0) == 0    ? "ReduceSum"
                             : op.rfind("aten.mean.", 0) == 0 ? "ReduceMean"
                             : min                            ? "ReduceMin"
                                                              : "ReduceMax";
  if (engine == "ReduceMax" || engine == "ReduceMin") {
    if (NumElements(S(x)) == 0) return Bad("max or min of an empty tensor");
    if (T(x) == DataType::kInt64 && !S(x).empty()) {  // (one axis at a time, kept as 1)
      SALUS_ASSIGN_OR_RETURN(Shape out, DeclaredShape(0));
      if (axes.empty()) {
        for (size_t d = 0; d < S(x).size(); ++d) axes.push_back(static_cast<int64_t>(d));
      }
      for (int64_t a : axes) {
        SALUS_ASSIGN_OR_RETURN(a, Axis(a, S(x).size()));
        SALUS_ASSIGN_OR_RETURN(auto extreme, IntExtremeAlong(x, min, a));
        x = extreme.first;
      }
      SALUS_ASSIGN_OR_RETURN(ValueId y, ReshapeTo(x, out));
      return Bind(0, y);
    }
    SALUS_ASSIGN_OR_RETURN(ValueId y, Reduce(engine, x, axes, keep));
    return Bind(0, y);
  }
  // Integer sums (counts of a mask, nll_loss's) in float, exact below 2^24.
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kFloat32));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Reduce(engine, x, axes, keep));
  SALUS_ASSIGN_OR_RETURN(y, Cast(y, type));
  return Bind(0, y);
}

// any and all (.dim: one axis; .dims: a list, or none for every axis; .default: every axis):
// the largest truth value as 0 or 1 in float, and all(x) as not any(not x).
Status Lowerer::AnyAll() {
  const std::string& op = node_->op();
  const bool all = op.rfind("aten.all.", 0) == 0;
  const bool every_axis = op.ends_with(".default");
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  std::vector<int64_t> axes;
  bool keep = false;
  if (!every_axis) {
    SALUS_ASSIGN_OR_RETURN(axes, IntsOr("dim", axes));
    SALUS_ASSIGN_OR_RETURN(keep, Bool("keepdim"));
  }
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kBool));
  if (all) {
    SALUS_ASSIGN_OR_RETURN(x, Emit("Not", {x}));
  }
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kFloat32));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Reduce("ReduceMax", x, axes, keep));
  SALUS_ASSIGN_OR_RETURN(y, Cast(y, DataType::kBool));
  if (all) {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Not", {y}));
  }
  return Bind(0, y);
}

// The index of the largest (smallest: `min`) element along `dim`, or of the whole tensor
// flattened when there is no dim, as int64 with the dim kept as 1 or removed: SalusArgMax,
// whose ties go to the first index and whose NaN wins, as PyTorch's. The smallest is the
// largest of -x (of 0 - x for int64).
StatusOr<ValueId> Lowerer::ArgMaxAlong(ValueId x, bool min, std::optional<int64_t> dim, bool keep) {
  const Shape xs = S(x);
  if (T(x) == DataType::kBool) {
    SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kInt64));
  }
  if (min && T(x) == DataType::kInt64) {
    SALUS_ASSIGN_OR_RETURN(x, Emit("Sub", {Scalar(DataType::kInt64, 0), x}));
  } else if (min) {
    SALUS_ASSIGN_OR_RETURN(x, Emit("Neg", {x}));
  }
  int64_t axis = 0;
  if (!dim || xs.empty()) {
    SALUS_ASSIGN_OR_RETURN(x, ReshapeTo(x, {NumElements(xs)}));
  } else {
    SALUS_ASSIGN_OR_RETURN(axis, Axis(*dim, xs.size()));
  }
  Shape out = S(x);
  if (out[axis] == 0) return Bad("the largest or smallest index along an empty dim");
  out.erase(out.begin() + axis);
  SALUS_ASSIGN_OR_RETURN(
      ValueId y, EmitShaped("SalusArgMax", {x}, {{"axis", IntAttr(axis)}}, DataType::kInt64, out));
  Shape want;
  if (!dim) {
    if (keep) want.assign(xs.size(), 1);
  } else if (!xs.empty()) {
    want = xs;
    if (keep) {
      want[axis] = 1;
    } else {
      want.erase(want.begin() + axis);
    }
  }
  return ReshapeTo(y, want);
}

// The largest (smallest: `min`) element of an int64 tensor along `axis`, kept as 1, and its
// index. The engine reduces in float, which would round values beyond 2^24 (a count, an
// index), so the value is read back at SalusArgMax's index (Note [Gathers by linear index]).
StatusOr<std::pair<ValueId, ValueId>> Lowerer::IntExtremeAlong(ValueId x, bool min, int64_t axis) {
  SALUS_ASSIGN_OR_RETURN(ValueId index, ArgMaxAlong(x, min, axis, true));
  SALUS_ASSIGN_OR_RETURN(ValueId linear, LinearIndexAlong(index, axis, S(x)));
  SALUS_ASSIGN_OR_RETURN(ValueId flat, ReshapeTo(x, {NumElements(S(x))}));
  SALUS_ASSIGN_OR_RETURN(ValueId value, Emit("Gather", {flat, linear}, {{"axis", IntAttr(0)}}));
  return std::make_pair(value, index);
}

// argmax and argmin (self, dim=None, keepdim=False).
Status Lowerer::ArgMaxMin() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  std::optional<int64_t> dim;
  if (!IsNone("dim")) {
    SALUS_ASSIGN_OR_RETURN(dim, Int("dim"));
  }
  bool keep = false;
  SALUS_ASSIGN_OR_RETURN(keep, BoolOr("keepdim", keep));
  SALUS_ASSIGN_OR_RETURN(ValueId y,
                         ArgMaxAlong(x, node_->op() == "aten.argmin.default", dim, keep));
  return Bind(0, y);
}

// max.dim and min.dim (self, dim, keepdim=False) -> (values, indices).
Status Lowerer::MaxMinDim() {
  const bool min = node_->op() == "aten.min.dim";
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  if (T(x) == DataType::kBool) return Refuse("the largest or smallest of a bool tensor");
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  bool keep = false;
  SALUS_ASSIGN_OR_RETURN(keep, BoolOr("keepdim", keep));
  if (T(x) == DataType::kInt64 && !S(x).empty()) {
    SALUS_ASSIGN_OR_RETURN(int64_t axis, Axis(dim, S(x).size()));
    SALUS_ASSIGN_OR_RETURN(auto extreme, IntExtremeAlong(x, min, axis));
    SALUS_ASSIGN_OR_RETURN(Shape out, DeclaredShape(0));
    SALUS_ASSIGN_OR_RETURN(ValueId values, ReshapeTo(extreme.first, out));
    SALUS_ASSIGN_OR_RETURN(ValueId indices, ReshapeTo(extreme.second, out));
    SALUS_RETURN_IF_ERROR(Bind(0, values));
    return Bind(1, indices);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId indices, ArgMaxAlong(x, min, dim, keep));
  SALUS_ASSIGN_OR_RETURN(ValueId values, Reduce(min ? "ReduceMin" : "ReduceMax", x, {dim}, keep));
  SALUS_RETURN_IF_ERROR(Bind(0, values));
  return Bind(1, indices);
}

// topk(self, k, dim=-1, largest=True, sorted=True) -> (values, indices) of a float tensor for
// k up to kMaxTopK: k rounds of SalusArgMax along dim, each taking the best remaining element
// (ties to the first index, NaN first, as argmax) and masking it out for the next, so the
// results come sorted. Its indices are distinct along dim, which its gradient's scatter relies
// on (Scatter).
Status Lowerer::TopK() {
  constexpr int64_t kMaxTopK = 16;
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t k, Int("k"));
  int64_t dim = -1;
  SALUS_ASSIGN_OR_RETURN(dim, IntOr("dim", dim));
  bool largest = true;
  SALUS_ASSIGN_OR_RETURN(largest, BoolOr("largest", largest));
  if (T(x) != DataType::kFloat32) return Refuse("topk of a non-float tensor");
  const Shape xs = S(x);
  if (xs.empty()) return Refuse("topk of a 0-d tensor");
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, xs.size()));
  if (k < 0 || k > xs[dim]) return Bad("k is out of range");
  if (k == 0) return Refuse("topk with k = 0");
  if (k > kMaxTopK) return Refuse("topk with k over " + std::to_string(kMaxTopK));
  const DataType f32 = DataType::kFloat32;
  // The search runs on -x for the smallest; values are read from x itself.
  ValueId rest = x;
  if (!largest) {
    SALUS_ASSIGN_OR_RETURN(rest, Emit("Neg", {x}));
  }
  Shape positions(xs.size(), 1);
  positions[dim] = xs[dim];
  std::vector<int64_t> along(xs[dim]);
  for (int64_t i = 0; i < xs[dim]; ++i) along[i] = i;
  const ValueId index_along = Constant(HostTensor::FromInt64s(positions, along));
  std::vector<ValueId> values, indices;
  for (int64_t j = 0; j < k; ++j) {
    SALUS_ASSIGN_OR_RETURN(ValueId best, ArgMaxAlong(rest, false, dim, true));
    SALUS_ASSIGN_OR_RETURN(ValueId hit, Emit("Equal", {index_along, best}));
    SALUS_ASSIGN_OR_RETURN(ValueId picked, Emit("Where", {hit, x, Scalar(f32, 0)}));
    SALUS_ASSIGN_OR_RETURN(ValueId value, Reduce("ReduceSum", picked, {dim}, true));
    values.push_back(value);
    indices.push_back(best);
    if (j + 1 < k) {
      SALUS_ASSIGN_OR_RETURN(rest, Emit("Where", {hit, Scalar(f32, -INFINITY), rest}));
    }
  }
  auto join = [&](const std::vector<ValueId>& parts) -> StatusOr<ValueId> {
    if (parts.size() == 1) return parts[0];
    return Emit("Concat", parts, {{"axis", IntAttr(dim)}});
  };
  SALUS_ASSIGN_OR_RETURN(ValueId v, join(values));
  SALUS_ASSIGN_OR_RETURN(ValueId i, join(indices));
  SALUS_RETURN_IF_ERROR(Bind(0, v));
  if (Outputs() > 1 && node_->outputs(1) >= 0) distinct_indices_[node_->outputs(1)] = dim;
  return Bind(1, i);
}

namespace {

// The [n, n] matrix of ones on and above the diagonal (above it only, `strict`): x . U is x's
// running sum along its last dim (the sum before each position).
HostTensor UpperOnes(int64_t n, bool strict) {
  std::vector<float> upper(static_cast<size_t>(n * n), 0.f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = strict ? i + 1 : i; j < n; ++j) upper[i * n + j] = 1.f;
  }
  return HostTensor::FromFloats({n, n}, upper);
}

}  // namespace

// cumsum(self, dim, dtype=None): a MatMul with the constant [n, n] upper-triangular matrix of
// ones, the dim moved last and back. Along a dim over kMaxCumsum (a long sequence's position
// ids), in blocks of kMaxCumsum instead: the dim zero-padded to whole blocks, each block's
// running sum by one such MatMul, plus the sum of the blocks before it (the blocks' totals by
// a strictly upper-triangular MatMul), up to kMaxCumsum blocks. Integer and bool inputs
// (position ids from a mask) are summed in float, exact below 2^24, and cast back.
Status Lowerer::Cumsum() {
  constexpr int64_t kMaxCumsum = 2048;
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  const Shape xs = S(x);
  if (xs.empty()) {
    SALUS_ASSIGN_OR_RETURN(ValueId y, Cast(x, type));
    return Bind(0, y);
  }
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, xs.size()));
  const int64_t n = xs[dim];
  const int64_t blocks = (n + kMaxCumsum - 1) / kMaxCumsum;
  if (blocks > kMaxCumsum) {
    return Refuse("cumsum along a dim over " + std::to_string(kMaxCumsum * kMaxCumsum));
  }
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, DataType::kFloat32));
  const int64_t last = static_cast<int64_t>(xs.size()) - 1;
  std::vector<int64_t> perm(xs.size());
  for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
  std::swap(perm[dim], perm[last]);
  if (dim != last) {
    SALUS_ASSIGN_OR_RETURN(x, Emit("Transpose", {x}, {{"perm", IntsAttr(perm)}}));
  }
  ValueId y = x;
  if (blocks == 1) {
    SALUS_ASSIGN_OR_RETURN(y, Emit("MatMul", {x, Constant(UpperOnes(n, false))}));
  } else {
    Shape moved = S(x);  // [..., n]
    Shape padded = moved;
    padded.back() = blocks * kMaxCumsum;
    if (padded.back() > n) {
      Shape zeros = moved;
      zeros.back() = padded.back() - n;
      SALUS_ASSIGN_OR_RETURN(
          x, Emit("Concat", {x, Filled(DataType::kFloat32, zeros, 0)}, {{"axis", IntAttr(last)}}));
    }
    Shape split = moved;
    split.back() = blocks;
    split.push_back(kMaxCumsum);  // [..., blocks, B]
    SALUS_ASSIGN_OR_RETURN(x, ReshapeTo(x, split));
    SALUS_ASSIGN_OR_RETURN(ValueId within,
                           Emit("MatMul", {x, Constant(UpperOnes(kMaxCumsum, false))}));
    SALUS_ASSIGN_OR_RETURN(ValueId totals, Reduce("ReduceSum", x, {last + 1}, false));
    SALUS_ASSIGN_OR_RETURN(ValueId before,
                           Emit("MatMul", {totals, Constant(UpperOnes(blocks, true))}));
    Shape column = split;
    column.back() = 1;
    SALUS_ASSIGN_OR_RETURN(before, ReshapeTo(before, column));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Add", {within, before}));
    SALUS_ASSIGN_OR_RETURN(y, ReshapeTo(y, padded));
    if (padded.back() > n) {
      SALUS_ASSIGN_OR_RETURN(
          y, Emit("Slice", {y, Int64s({0}), Int64s({n}), Int64s({last}), Int64s({1})}));
    }
  }
  if (dim != last) {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Transpose", {y}, {{"perm", IntsAttr(perm)}}));
  }
  SALUS_ASSIGN_OR_RETURN(y, Cast(y, type));
  return Bind(0, y);
}

// var.correction, std.correction and var_mean.correction (self, dim=None, *, correction=None,
// keepdim=False): the
// squared deviations from the mean, summed in two passes, over N - correction (1 by default),
// as PyTorch divides (by 0 when correction reaches N).
Status Lowerer::Variance() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  if (T(x) != DataType::kFloat32) return Refuse("the variance of a non-float tensor");
  std::vector<int64_t> axes;
  SALUS_ASSIGN_OR_RETURN(axes, IntsOr("dim", axes));
  bool keep = false;
  SALUS_ASSIGN_OR_RETURN(keep, BoolOr("keepdim", keep));
  double correction = 1;
  SALUS_ASSIGN_OR_RETURN(correction, NumberOr("correction", correction));
  const Shape xs = S(x);
  double n = 1;
  if (axes.empty()) {
    n = static_cast<double>(NumElements(xs));
  } else {
    for (int64_t a : axes) {
      SALUS_ASSIGN_OR_RETURN(int64_t axis, Axis(a, xs.size()));
      if (!xs.empty()) n *= static_cast<double>(xs[axis]);
    }
  }
  SALUS_ASSIGN_OR_RETURN(ValueId mean, Reduce("ReduceMean", x, axes, true));
  SALUS_ASSIGN_OR_RETURN(ValueId d, Emit("Sub", {x, mean}));
  SALUS_ASSIGN_OR_RETURN(ValueId sq, Emit("Mul", {d, d}));
  SALUS_ASSIGN_OR_RETURN(ValueId sum, Reduce("ReduceSum", sq, axes, keep));
  SALUS_ASSIGN_OR_RETURN(
      ValueId y, Emit("Div", {sum, Scalar(DataType::kFloat32, std::max(0.0, n - correction))}));
  if (node_->op() == "aten.std.correction") {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Sqrt", {y}));
  }
  SALUS_RETURN_IF_ERROR(Bind(0, y));
  if (node_->op() == "aten.var_mean.correction") {  // (var, mean)
    if (!keep) {
      SALUS_ASSIGN_OR_RETURN(mean, ReshapeTo(mean, S(y)));
    }
    return Bind(1, mean);
  }
  return OkStatus();
}

// slice_scatter(self, src, dim=0, start=None, end=None, step=1): self with the slice replaced
// by src, as a Concat of self's parts before and after it around src (slicing's gradient is
// zeros with the slice's gradient scattered in); with a step, src's rows are gathered into
// their places and selected there.
// select_scatter(self, src, dim, index) likewise, src taking a slice of one along dim (what an
// assignment into a selected row, `x[:, 0] = v`, becomes once functionalized).
Status Lowerer::SliceScatter() {
  const bool select = node_->op() == "aten.select_scatter.default";
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(ValueId src, Tensor("src"));
  int64_t dim = 0, step = 1;
  SALUS_ASSIGN_OR_RETURN(dim, IntOr("dim", dim));
  SALUS_ASSIGN_OR_RETURN(step, IntOr("step", step));
  const Shape xs = S(x);
  const char* what = select ? "select_scatter" : "slice_scatter";
  if (xs.empty()) return Bad(std::string(what) + " into a 0-d tensor");
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, xs.size()));
  const int64_t size = xs[dim];
  int64_t start = 0, end = size;
  if (select) {
    SALUS_ASSIGN_OR_RETURN(start, Int("index"));
    if (start < -size || start >= size) {
      return Bad("index " + std::to_string(start) + " is out of range for dim " +
                 std::to_string(dim) + " of size " + std::to_string(size));
    }
    start = start < 0 ? start + size : start;
    end = start + 1;
    Shape one = xs;
    one[dim] = 1;
    Shape selected = xs;
    selected.erase(selected.begin() + dim);
    if (S(src) != selected) {
      return Bad("src is " + ShapeString(S(src)) + " where the selection is " +
                 ShapeString(selected));
    }
    SALUS_ASSIGN_OR_RETURN(src, ReshapeTo(src, one));
  } else {
    SALUS_ASSIGN_OR_RETURN(start, IntOr("start", start));
    SALUS_ASSIGN_OR_RETURN(end, IntOr("end", end));
    start = std::clamp<int64_t>(start < 0 ? start + size : start, 0, size);
    end = std::clamp<int64_t>(end < 0 ? end + size : end, start, size);
  }
  if (step <= 0) return Bad("slice_scatter with a step of " + std::to_string(step));
  Shape want = xs;
  want[dim] = (end - start + step - 1) / step;
  if (S(src) != want) {
    return Bad("src is " + ShapeString(S(src)) + " where the slice is " + ShapeString(want));
  }
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, type));
  SALUS_ASSIGN_OR_RETURN(src, Cast(src, type));
  if (step > 1) {  // (x[:, ::2]'s gradient) src's rows gathered into place, where they go
    if (want[dim] == 0) return Bind(0, x);
    std::vector<int64_t> from(size, 0);
    Shape along(xs.size(), 1);
    along[dim] = size;
    HostTensor mask(DataType::kBool, along);
    for (int64_t i = start; i < end; i += step) {
      from[i] = (i - start) / step;
      mask.bytes[i] = std::byte(1);
    }
    SALUS_ASSIGN_OR_RETURN(ValueId placed,
                           Emit("Gather", {src, Int64s(from)}, {{"axis", IntAttr(dim)}}));
    SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Where", {Constant(std::move(mask)), placed, x}));
    return Bind(0, y);
  }
  std::vector<ValueId> parts;
  auto piece = [&](int64_t from, int64_t to) -> Status {
    if (to <= from) return OkStatus();
    SALUS_ASSIGN_OR_RETURN(
        ValueId p, Emit("Slice", {x, Int64s({from}), Int64s({to}), Int64s({dim}), Int64s({1})}));
    parts.push_back(p);
    return OkStatus();
  };
  SALUS_RETURN_IF_ERROR(piece(0, start));
  if (end > start) parts.push_back(src);
  SALUS_RETURN_IF_ERROR(piece(end, size));
  ValueId y = x;
  if (parts.size() == 1) {
    y = parts[0];
  } else if (parts.size() > 1) {
    SALUS_ASSIGN_OR_RETURN(y, Emit("Concat", parts, {{"axis", IntAttr(dim)}}));
  }
  return Bind(0, y);
}

// Note [Strided views]
// as_strided_copy(self, size, stride, storage_offset) reads self's storage by strides;
// as_strided_scatter(self, src, size, stride, storage_offset) writes src there (what autograd's
// restriding of a gradient becomes once functionalized: ConvNeXt's [N, C, 1, 1] gradient in
// channels-last strides). The trace refuses a base whose storage is not its elements in
// row-major order (Note [Strided views] in trace.py), so here the storage is self's row-major
// elements. A view that is a dense block of it (its strides, size-1 dims aside, a row-major
// layout of its sizes in some dim order, from storage_offset) is a Slice of the flattened base,
// a Reshape and a Transpose; the scatter is the same in reverse around a Concat. Other views
// (overlapping or with gaps: expand-like strides of 0, every other element) are refused naming
// their strides.
Status Lowerer::AsStrided() {
  const bool scatter = node_->op() == "aten.as_strided_scatter.default";
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(const std::vector<int64_t> size, Ints("size"));
  SALUS_ASSIGN_OR_RETURN(const std::vector<int64_t> stride, Ints("stride"));
  SALUS_ASSIGN_OR_RETURN(const int64_t offset, IntOr("storage_offset", 0));
  const Shape xs = S(x);
  const int64_t total = NumElements(xs);
  const int64_t span = NumElements(size);
  if (size.size() != stride.size()) return Bad("size and stride differ in length");
  if (span <= 0 || offset < 0 || offset + span > total) {
    return Bad("a view of " + ShapeString(size) + " from offset " + std::to_string(offset) +
               " does not fit a base of " + std::to_string(total) + " elements");
  }
  // The non-unit dims, outermost in storage first: each stride the product of the sizes after.
  std::vector<size_t> dims;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] != 1) dims.push_back(d);
  }
  std::vector<size_t> storage = dims;
  std::stable_sort(storage.begin(), storage.end(),
                   [&](size_t a, size_t b) { return stride[a] > stride[b]; });
  int64_t dense = 1;
  for (size_t k = storage.size(); k-- > 0;) {
    if (stride[storage[k]] != dense) {
      std::string s;
      for (int64_t v : stride) s += (s.empty() ? "" : ", ") + std::to_string(v);
      return Refuse("a view that is not a dense block of its base (size " + ShapeString(size) +
                    ", stride [" + s + "])");
    }
    dense *= size[storage[k]];
  }
  Shape block;                                // the view's non-unit dims in storage order
  std::vector<int64_t> to_view(dims.size());  // block dim of each non-unit dim of the view
  for (size_t k = 0; k < storage.size(); ++k) {
    block.push_back(size[storage[k]]);
    to_view[std::find(dims.begin(), dims.end(), storage[k]) - dims.begin()] =
        static_cast<int64_t>(k);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId flat, ReshapeTo(x, {total}));
  auto piece = [&](int64_t from, int64_t to) {
    return Emit("Slice", {flat, Int64s({from}), Int64s({to}), Int64s({0}), Int64s({1})});
  };
  if (!scatter) {
    ValueId v = flat;
    if (span < total) {
      SALUS_ASSIGN_OR_RETURN(v, piece(offset, offset + span));
    }
    SALUS_ASSIGN_OR_RETURN(v, ReshapeTo(v, block));
    if (block.size() > 1) {
      SALUS_ASSIGN_OR_RETURN(v, Emit("Transpose", {v}, {{"perm", IntsAttr(to_view)}}));
    }
    SALUS_ASSIGN_OR_RETURN(v, ReshapeTo(v, size));
    return Bind(0, v);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId src, Tensor("src"));
  if (S(src) != Shape(size)) {
    return Bad("src is " + ShapeString(S(src)) + " where the view is " + ShapeString(size));
  }
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(src, Cast(src, type));
  SALUS_ASSIGN_OR_RETURN(flat, Cast(flat, type));
  Shape viewed;  // the view's non-unit dims in its own order
  for (size_t d : dims) viewed.push_back(size[d]);
  SALUS_ASSIGN_OR_RETURN(ValueId v, ReshapeTo(src, viewed));
  if (viewed.size() > 1) {
    std::vector<int64_t> to_block(dims.size());  // the inverse permutation
    for (size_t i = 0; i < to_view.size(); ++i) to_block[to_view[i]] = static_cast<int64_t>(i);
    SALUS_ASSIGN_OR_RETURN(v, Emit("Transpose", {v}, {{"perm", IntsAttr(to_block)}}));
  }
  SALUS_ASSIGN_OR_RETURN(v, ReshapeTo(v, {span}));
  std::vector<ValueId> parts;
  if (offset > 0) {
    SALUS_ASSIGN_OR_RETURN(ValueId before, piece(0, offset));
    parts.push_back(before);
  }
  parts.push_back(v);
  if (offset + span < total) {
    SALUS_ASSIGN_OR_RETURN(ValueId after, piece(offset + span, total));
    parts.push_back(after);
  }
  if (parts.size() > 1) {
    SALUS_ASSIGN_OR_RETURN(v, Emit("Concat", parts, {{"axis", IntAttr(0)}}));
  }
  SALUS_ASSIGN_OR_RETURN(v, ReshapeTo(v, xs));
  return Bind(0, v);
}

// flip(self, dims): one Slice with step -1 along each dim.
Status Lowerer::Flip() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dims, Ints("dims"));
  std::set<int64_t> seen;
  std::vector<int64_t> starts, ends, axes, steps;
  for (int64_t d : dims) {
    SALUS_ASSIGN_OR_RETURN(int64_t axis, Axis(d, S(x).size()));
    if (!seen.insert(axis).second) return Bad("dim " + std::to_string(d) + " appears twice");
    if (S(x).empty()) continue;
    starts.push_back(S(x)[axis] - 1);
    ends.push_back(std::numeric_limits<int64_t>::min());
    axes.push_back(axis);
    steps.push_back(-1);
  }
  ValueId y = x;
  if (!axes.empty()) {
    SALUS_ASSIGN_OR_RETURN(
        y, Emit("Slice", {x, Int64s(starts), Int64s(ends), Int64s(axes), Int64s(steps)}));
  }
  return Bind(0, y);
}

// prod(self, dtype=None) and prod.dim_int(self, dim, keepdim=False, dtype=None) of float
// tensors: ReduceProd. Its gradient, which must survive zeros, is built from cumprods.
Status Lowerer::Prod() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  if (type != DataType::kFloat32) return Refuse("prod of a non-float tensor");
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, type));
  const Shape xs = S(x);
  if (xs.empty()) return Bind(0, x);
  std::vector<int64_t> axes;
  bool keepdim = false;
  if (node_->op() == "aten.prod.default") {
    for (size_t d = 0; d < xs.size(); ++d) axes.push_back(static_cast<int64_t>(d));
  } else {
    SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
    SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, xs.size()));
    SALUS_ASSIGN_OR_RETURN(keepdim, BoolOr("keepdim", keepdim));
    axes.push_back(dim);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Reduce("ReduceProd", x, axes, keepdim));
  return Bind(0, y);
}

// cumprod(self, dim, dtype=None) along a dim of at most kMaxCumprod: a running product, one Mul
// per position in the order PyTorch's scan multiplies, the positions joined by a Concat.
Status Lowerer::Cumprod() {
  constexpr int64_t kMaxCumprod = 64;
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  if (type == DataType::kBool) return Refuse("cumprod of bool tensors");
  SALUS_ASSIGN_OR_RETURN(x, Cast(x, type));
  const Shape xs = S(x);
  if (xs.empty()) return Bind(0, x);
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, xs.size()));
  const int64_t n = xs[dim];
  if (n > kMaxCumprod) return Refuse("cumprod along a dim over " + std::to_string(kMaxCumprod));
  if (n <= 1) return Bind(0, x);
  std::vector<ValueId> running;
  for (int64_t i = 0; i < n; ++i) {
    SALUS_ASSIGN_OR_RETURN(ValueId at,
                           Emit("Slice", {x, Int64s({i}), Int64s({i + 1}), Int64s({dim})}));
    if (!running.empty()) {
      SALUS_ASSIGN_OR_RETURN(at, Emit("Mul", {running.back(), at}));
    }
    running.push_back(at);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Concat", running, {{"axis", IntAttr(dim)}}));
  return Bind(0, y);
}

// sort(self, dim=-1, descending=False) and sort.stable(self, stable, dim, descending) ->
// (values, indices), and argsort's forms (the indices alone): the engine's SalusSort, always
// stable (PyTorch's unstable sort may order equal values either way; the stable order is one
// of those). NaN sorts as the largest value. Its indices are distinct along dim, so its
// gradient's scatter is lowered as topk's.
Status Lowerer::Sort() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  int64_t dim = -1;
  bool descending = false;
  SALUS_ASSIGN_OR_RETURN(dim, IntOr("dim", dim));
  SALUS_ASSIGN_OR_RETURN(descending, BoolOr("descending", descending));
  const Shape xs = S(x);
  if (xs.empty()) return Refuse("sort of a 0-d tensor");
  if (T(x) != DataType::kFloat32 && T(x) != DataType::kInt64) {
    return Refuse(std::string("sort of a ") + DataTypeName(T(x)) + " tensor");
  }
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, xs.size()));
  if (xs[dim] == 0) return Refuse("sort along an empty dim");
  Node n;
  n.op = "SalusSort";
  n.name = NodeName();
  n.inputs = {x};
  n.attrs = {{"axis", IntAttr(dim)}, {"descending", IntAttr(descending ? 1 : 0)}};
  n.outputs = {NewValue(n.name, xs), NewValue(n.name, xs)};
  graph_.value(n.outputs[0]).type = T(x);
  graph_.value(n.outputs[1]).type = DataType::kInt64;
  const std::vector<ValueId> outs = n.outputs;
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  if (node_->op().rfind("aten.argsort.", 0) == 0) return Bind(0, outs[1]);
  SALUS_RETURN_IF_ERROR(Bind(0, outs[0]));
  if (Outputs() > 1 && node_->outputs(1) >= 0) distinct_indices_[node_->outputs(1)] = dim;
  return Bind(1, outs[1]);
}

// Note [Diagonals]: diagonal_copy(self, offset, dim1, dim2) moves dim1 and dim2 last (the
// other dims keep their order, as PyTorch's result does), flattens those two, and Gathers the
// diagonal's positions, constants: (i + max(-offset, 0)) * cols + i + max(offset, 0).
// diagonal_scatter(self, src, offset, dim1, dim2), its gradient, Gathers each flattened
// position's element from src with a zero appended (the diagonal's own element there, the zero
// elsewhere), selects that where the diagonal lies and self elsewhere, and moves the dims back.
// Only copies and selects: exact, and no NaN from src reaches another position.
StatusOr<Lowerer::DiagonalPlan> Lowerer::PlanDiagonal(const Shape& xs) {
  int64_t offset = 0, dim1 = 0, dim2 = 1;
  SALUS_ASSIGN_OR_RETURN(offset, IntOr("offset", offset));
  SALUS_ASSIGN_OR_RETURN(dim1, IntOr("dim1", dim1));
  SALUS_ASSIGN_OR_RETURN(dim2, IntOr("dim2", dim2));
  if (xs.size() < 2) return Bad("diagonal of a tensor of rank under 2");
  SALUS_ASSIGN_OR_RETURN(dim1, Axis(dim1, xs.size()));
  SALUS_ASSIGN_OR_RETURN(dim2, Axis(dim2, xs.size()));
  if (dim1 == dim2) return Bad("dim1 and dim2 are the same dim");
  DiagonalPlan plan;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (static_cast<int64_t>(d) != dim1 && static_cast<int64_t>(d) != dim2) {
      plan.perm.push_back(static_cast<int64_t>(d));
    }
  }
  plan.perm.push_back(dim1);
  plan.perm.push_back(dim2);
  for (int64_t d : plan.perm) plan.moved.push_back(xs[d]);
  const int64_t rows = xs[dim1], cols = xs[dim2];
  const int64_t row0 = std::max<int64_t>(-offset, 0), col0 = std::max<int64_t>(offset, 0);
  const int64_t length = std::max<int64_t>(0, std::min(rows - row0, cols - col0));
  if (length == 0) return Refuse("an empty diagonal");
  for (int64_t i = 0; i < length; ++i) plan.positions.push_back((row0 + i) * cols + col0 + i);
  return plan;
}

Status Lowerer::Diagonal() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(DiagonalPlan plan, PlanDiagonal(S(x)));
  SALUS_ASSIGN_OR_RETURN(ValueId moved, Emit("Transpose", {x}, {{"perm", IntsAttr(plan.perm)}}));
  Shape flat(plan.moved.begin(), plan.moved.end() - 2);
  const int64_t last = static_cast<int64_t>(flat.size());
  flat.push_back(plan.moved[last] * plan.moved[last + 1]);
  SALUS_ASSIGN_OR_RETURN(moved, ReshapeTo(moved, flat));
  const int64_t length = static_cast<int64_t>(plan.positions.size());
  const ValueId where = Constant(HostTensor::FromInt64s({length}, plan.positions));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gather", {moved, where}, {{"axis", IntAttr(last)}}));
  return Bind(0, y);
}

Status Lowerer::DiagonalScatter() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(ValueId src, Tensor("src"));
  SALUS_ASSIGN_OR_RETURN(DiagonalPlan plan, PlanDiagonal(S(x)));
  SALUS_ASSIGN_OR_RETURN(src, Cast(src, T(x)));
  const int64_t length = static_cast<int64_t>(plan.positions.size());
  Shape lead(plan.moved.begin(), plan.moved.end() - 2);
  Shape want = lead;
  want.push_back(length);
  if (S(src) != want) {
    return Bad("src " + ShapeString(S(src)) + " is not the diagonal's shape " + ShapeString(want));
  }
  const int64_t last = static_cast<int64_t>(lead.size());
  const int64_t area = plan.moved[last] * plan.moved[last + 1];
  Shape padding = lead;
  padding.push_back(1);
  SALUS_ASSIGN_OR_RETURN(
      ValueId extended, Emit("Concat", {src, Filled(T(x), padding, 0)}, {{"axis", IntAttr(last)}}));
  std::vector<int64_t> from(area, length);  // the appended zero, but on the diagonal
  std::vector<int64_t> on(area, 0);
  for (int64_t i = 0; i < length; ++i) {
    from[plan.positions[i]] = i;
    on[plan.positions[i]] = 1;
  }
  SALUS_ASSIGN_OR_RETURN(ValueId placed,
                         Emit("Gather", {extended, Constant(HostTensor::FromInt64s({area}, from))},
                              {{"axis", IntAttr(last)}}));
  SALUS_ASSIGN_OR_RETURN(ValueId moved, Emit("Transpose", {x}, {{"perm", IntsAttr(plan.perm)}}));
  Shape flat = lead;
  flat.push_back(area);
  SALUS_ASSIGN_OR_RETURN(moved, ReshapeTo(moved, flat));
  SALUS_ASSIGN_OR_RETURN(ValueId diagonal,
                         Cast(Constant(HostTensor::FromInt64s({area}, on)), DataType::kBool));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Where", {diagonal, placed, moved}));
  SALUS_ASSIGN_OR_RETURN(y, ReshapeTo(y, plan.moved));
  std::vector<int64_t> back(plan.perm.size());
  for (size_t d = 0; d < plan.perm.size(); ++d) back[plan.perm[d]] = static_cast<int64_t>(d);
  SALUS_ASSIGN_OR_RETURN(y, Emit("Transpose", {y}, {{"perm", IntsAttr(back)}}));
  return Bind(0, y);
}

// index_select(self, dim, index): Gather along dim.
Status Lowerer::IndexSelect() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(ValueId index, Tensor("index"));
  if (S(x).empty()) return Refuse("index_select of a 0-d tensor");
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(x).size()));
  if (T(index) != DataType::kInt64 || S(index).size() > 1) {
    return Bad("index must be an int64 vector");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gather", {x, index}, {{"axis", IntAttr(dim)}}));
  if (S(index).empty()) {  // a 0-d index keeps the dim, as PyTorch's
    Shape want = S(x);
    want[dim] = 1;
    SALUS_ASSIGN_OR_RETURN(y, ReshapeTo(y, want));
  }
  return Bind(0, y);
}

namespace {

// Note [Unfolded windows]: unfold(self, dimension, size, step) (sliding windows: an audio
// signal's frames, an image's patches) is a Gather along the dim of constant positions
// [windows, size], window i's j-th element at i * step + j, whose size axis then moves last.
// Its gradient, unfold_backward, moves that axis back and scatter-adds through the same
// positions (SalusGatherGrad), so overlapping windows add, as PyTorch's.
struct Windows {
  int64_t axis = 0;
  HostTensor positions;
  std::vector<int64_t> to_last;  // the Gather's result's axes, the size axis moved last
};

StatusOr<Windows> WindowsFor(const Shape& x, int64_t axis, int64_t size, int64_t step) {
  const int64_t length = x.empty() ? 1 : x[axis];
  if (size < 0 || size > length || step <= 0) {
    return InvalidArgumentError(
        fmt::format("unfold: size {} and step {} do not fit a dim of {}", size, step, length));
  }
  Windows w;
  w.axis = axis;
  const int64_t count = (length - size) / step + 1;
  std::vector<int64_t> at(count * size);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t j = 0; j < size; ++j) at[i * size + j] = i * step + j;
  }
  w.positions = HostTensor::FromInt64s({count, size}, at);
  const int64_t rank = static_cast<int64_t>(x.size()) + 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (d != axis + 1) w.to_last.push_back(d);
  }
  w.to_last.push_back(axis + 1);
  return w;
}

}  // namespace

Status Lowerer::Unfold() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dimension"));
  SALUS_ASSIGN_OR_RETURN(int64_t size, Int("size"));
  SALUS_ASSIGN_OR_RETURN(int64_t step, Int("step"));
  if (S(x).empty()) return Refuse("unfold of a 0-d tensor");
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(x).size()));
  auto windows = WindowsFor(S(x), dim, size, step);
  if (!windows.ok()) return Bad(windows.status().message());
  SALUS_ASSIGN_OR_RETURN(
      ValueId y, Emit("Gather", {x, Constant(windows->positions)}, {{"axis", IntAttr(dim)}}));
  SALUS_ASSIGN_OR_RETURN(y, Emit("Transpose", {y}, {{"perm", IntsAttr(windows->to_last)}}));
  return Bind(0, y);
}

// unfold_backward(grad_in, input_sizes, dim, size, step): Note [Unfolded windows].
Status Lowerer::UnfoldBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_in"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, Ints("input_sizes"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(int64_t size, Int("size"));
  SALUS_ASSIGN_OR_RETURN(int64_t step, Int("step"));
  if (sizes.empty()) return Refuse("unfold of a 0-d tensor");
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, sizes.size()));
  const Shape xs(sizes.begin(), sizes.end());
  auto windows = WindowsFor(xs, dim, size, step);
  if (!windows.ok()) return Bad(windows.status().message());
  std::vector<int64_t> back(windows->to_last.size());
  for (size_t d = 0; d < back.size(); ++d) back[windows->to_last[d]] = static_cast<int64_t>(d);
  SALUS_ASSIGN_OR_RETURN(dy, Cast(dy, DataType::kFloat32));
  SALUS_ASSIGN_OR_RETURN(dy, Emit("Transpose", {dy}, {{"perm", IntsAttr(back)}}));
  SALUS_ASSIGN_OR_RETURN(ValueId dx,
                         EmitShaped("SalusGatherGrad", {Constant(windows->positions), dy},
                                    {{"axis", IntAttr(dim)}}, DataType::kFloat32, xs));
  return Bind(0, dx);
}

namespace {

// Note [Bilinear as matrices]: bilinear resizing along one dim is a linear map, each output
// row mixing two input rows. The map's [out, in] matrix holds PyTorch's weights (its
// area_pixel_compute_source_index, in float): with scale = (in - 1) / (out - 1) when aligning
// corners, else 1 / the given scale factor or in / out, output row d reads source
// s = scale * d (aligned) or max(0, scale * (d + 0.5) - 0.5), i.e. rows i0 = floor(s) and
// i0 + 1 (i0 at the last row) with weights 1 - (s - i0) and s - i0. So the resize of x is
// A_h . x . A_w^T (two MatMuls with constants) and its gradient A_h^T . dy . A_w.
HostTensor BilinearMatrix(int64_t in, int64_t out, bool align_corners, std::optional<double> scale,
                          bool transposed) {
  std::vector<float> m(static_cast<size_t>(in * out), 0.f);
  float step = 0.f;
  if (align_corners) {
    step = out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.f;
  } else {
    step = scale && *scale > 0 ? static_cast<float>(1.0 / *scale)
                               : static_cast<float>(in) / static_cast<float>(out);
  }
  for (int64_t d = 0; d < out; ++d) {
    float src = align_corners ? step * static_cast<float>(d)
                              : std::max(0.f, step * (static_cast<float>(d) + 0.5f) - 0.5f);
    const int64_t i0 = std::min<int64_t>(static_cast<int64_t>(src), in - 1);
    const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
    const float l1 = src - static_cast<float>(i0), l0 = 1.f - l1;
    auto at = [&](int64_t row, int64_t col) -> float& {
      return transposed ? m[col * out + row] : m[row * in + col];
    };
    at(d, i0) += l0;
    at(d, i1) += l1;
  }
  return HostTensor::FromFloats(transposed ? Shape{in, out} : Shape{out, in}, m);
}

// Nearest resizing along a dim as the same kind of 0/1 [out, in] matrix: output row d copies
// input row min(floor(d * s), in - 1), s = 1 / scale when the op was given one and in / out
// otherwise, computed in float as PyTorch computes it.
HostTensor NearestMatrix(int64_t in, int64_t out, std::optional<double> scale, bool transposed) {
  std::vector<float> m(static_cast<size_t>(in * out), 0.f);
  const float s = scale && *scale > 0 ? static_cast<float>(1.0 / *scale)
                                      : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    const int64_t i = std::clamp<int64_t>(SaturatedInt64(std::floor(static_cast<float>(d) * s)),
                                          int64_t{0}, in - 1);
    (transposed ? m[i * out + d] : m[d * in + i]) = 1.f;
  }
  return HostTensor::FromFloats(transposed ? Shape{in, out} : Shape{out, in}, m);
}

// Adaptive average pooling along a dim as the same kind of [out, in] matrix: output row d
// averages input rows floor(d * in / out) up to ceil((d + 1) * in / out), PyTorch's windows,
// which differ in size when out does not divide in.
HostTensor AdaptiveAverageMatrix(int64_t in, int64_t out, bool transposed, int /*dim*/) {
  std::vector<float> m(static_cast<size_t>(in * out), 0.f);
  for (int64_t d = 0; d < out; ++d) {
    const int64_t start = d * in / out, end = ((d + 1) * in + out - 1) / out;
    for (int64_t i = start; i < end; ++i) {
      (transposed ? m[i * out + d] : m[d * in + i]) = 1.f / static_cast<float>(end - start);
    }
  }
  return HostTensor::FromFloats(transposed ? Shape{in, out} : Shape{out, in}, m);
}

}  // namespace

// x [N, C, H, W] mapped to `to` by a linear map per spatial dim (Note [Bilinear as matrices]:
// bilinear resizing, adaptive average pooling with uneven windows), or, `backward`, the
// gradient dy of such a map from `to` back to x's sizes.
StatusOr<ValueId> Lowerer::ByMatrices(ValueId x, const Shape& to, bool backward,
                                      const std::string& what, const DimMatrix& matrix) {
  const Shape xs = S(x);
  if (xs.size() != 4 || to.size() != 4 || to[0] != xs[0] || to[1] != xs[1] || to[2] <= 0 ||
      to[3] <= 0 || xs[2] <= 0 || xs[3] <= 0) {
    return Bad(what + " needs 4-D tensors of the same batch and channels");
  }
  if (T(x) != DataType::kFloat32) return Refuse(what + " of a non-float tensor");
  // Forward: in = x's sizes, out = to's. Backward: the map went from to's sizes to x's.
  const int64_t hi = backward ? to[2] : xs[2], ho = backward ? xs[2] : to[2];
  const int64_t wi = backward ? to[3] : xs[3], wo = backward ? xs[3] : to[3];
  // Forward x . A_w^T and A_h . (that); backward dy . A_w and A_h^T . (that).
  const ValueId right = Constant(matrix(wi, wo, !backward, 3));
  const ValueId left = Constant(matrix(hi, ho, backward, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId t, Emit("MatMul", {x, right}));
  return Emit("MatMul", {left, t});
}

// upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None),
// upsample_bilinear2d.vec(input, output_size, align_corners, scale_factors) and
// upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h,
// scales_w).
Status Lowerer::UpsampleBilinear() {
  const std::string& op = node_->op();
  const bool backward = op == "aten.upsample_bilinear2d_backward.default";
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor(backward               ? "grad_output"
                                           : op.ends_with(".vec") ? "input"
                                                                  : "self"));
  SALUS_ASSIGN_OR_RETURN(bool align, Bool("align_corners"));
  std::optional<double> sh, sw;
  if (op.ends_with(".vec")) {
    if (!IsNone("scale_factors")) {
      SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* f, Arg("scale_factors"));
      if (f->kind_case() != v1::AtenArgument::kFloats || f->floats().v_size() != 2) {
        return Bad("scale_factors must hold two numbers");
      }
      sh = f->floats().v(0);
      sw = f->floats().v(1);
    }
  } else {
    if (!IsNone("scales_h")) {
      SALUS_ASSIGN_OR_RETURN(sh, Number("scales_h"));
    }
    if (!IsNone("scales_w")) {
      SALUS_ASSIGN_OR_RETURN(sw, Number("scales_w"));
    }
  }
  Shape to;
  if (backward) {
    SALUS_ASSIGN_OR_RETURN(to, Ints("input_size"));
  } else {
    SALUS_ASSIGN_OR_RETURN(to, DeclaredShape(0));
  }
  SALUS_ASSIGN_OR_RETURN(
      ValueId y, ByMatrices(x, to, backward, "bilinear resizing",
                            [&](int64_t in, int64_t out, bool transposed, int dim) {
                              return BilinearMatrix(in, out, align, dim == 2 ? sh : sw, transposed);
                            }));
  return Bind(0, y);
}

namespace {

// Reflection or replication padding along one dim as an [out, in] 0/1 matrix: output position
// o copies input position i = o - before, reflected about the ends (-i, 2(in-1) - i) or
// clamped to them (or its transpose, [in, out]). The padding's gradient along the dim is the
// transpose applied.
HostTensor PadGradientMatrix(int64_t in, int64_t before, int64_t after, bool reflect,
                             bool transposed) {
  const int64_t out = in + before + after;
  std::vector<float> m(static_cast<size_t>(in * out), 0.f);
  for (int64_t o = 0; o < out; ++o) {
    int64_t i = o - before;
    if (reflect) {
      if (i < 0) i = -i;
      if (i >= in) i = 2 * (in - 1) - i;
    } else {
      i = std::clamp<int64_t>(i, 0, in - 1);
    }
    m[transposed ? i * out + o : o * in + i] += 1.f;
  }
  return HostTensor::FromFloats(transposed ? Shape{in, out} : Shape{out, in}, m);
}

}  // namespace

// reflection_pad2d_backward and replication_pad2d_backward(grad_output, self, padding=[left,
// right, top, bottom]): each padded position's gradient added into the input position it
// copied, as two MatMuls with the 0/1 matrices PadGradientMatrix makes (the forward pads
// decompose into indexing).
Status Lowerer::PadBackward() {
  const bool reflect = node_->op() == "aten.reflection_pad2d_backward.default";
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> pad, Ints("padding"));
  const Shape xs = S(x), ys = S(dy);
  if (pad.size() != 4 || xs.size() < 3 || ys.size() != xs.size() || T(dy) != DataType::kFloat32) {
    return Bad("padding must be [left, right, top, bottom] of a float tensor with H and W");
  }
  const size_t r = xs.size();
  const int64_t hi = xs[r - 2], wi = xs[r - 1];
  for (int64_t p : pad) {
    if (p < 0) return Refuse("padding's gradient with negative padding");
  }
  if (reflect && (pad[0] >= wi || pad[1] >= wi || pad[2] >= hi || pad[3] >= hi)) {
    return Bad("reflection padding must be smaller than the input");
  }
  if (ys[r - 2] != hi + pad[2] + pad[3] || ys[r - 1] != wi + pad[0] + pad[1]) {
    return Bad("grad_output does not fit the padded input");
  }
  // dy [.., Ho, Wo] . W [Wo, Wi], then H^T [Hi, Ho] . that.
  const ValueId w = Constant(PadGradientMatrix(wi, pad[0], pad[1], reflect, false));
  const ValueId ht = Constant(PadGradientMatrix(hi, pad[2], pad[3], reflect, true));
  SALUS_ASSIGN_OR_RETURN(ValueId t, Emit("MatMul", {dy, w}));
  SALUS_ASSIGN_OR_RETURN(ValueId dx, Emit("MatMul", {ht, t}));
  return Bind(0, dx);
}

// ---------------------------------------------------------------------------------------------
// Linear algebra and normalisation.

Status Lowerer::Addmm() {
  SALUS_ASSIGN_OR_RETURN(ValueId c, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(ValueId a, Tensor("mat1"));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("mat2"));
  SALUS_ASSIGN_OR_RETURN(double beta, Number("beta"));
  SALUS_ASSIGN_OR_RETURN(double alpha, Number("alpha"));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gemm", {a, b, c},
                                         {{"alpha", FloatAttr(static_cast<float>(alpha))},
                                          {"beta", FloatAttr(static_cast<float>(beta))}}));
  return Bind(0, y);
}

Status Lowerer::MatMulOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId a, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("mat2"));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("MatMul", {a, b}));
  return Bind(0, y);
}

Status Lowerer::SoftmaxOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(x).size()));
  SALUS_ASSIGN_OR_RETURN(bool half, Bool("half_to_float"));
  if (half) return Refuse("half_to_float");
  const std::string engine = node_->op() == "aten._softmax.default" ? "Softmax" : "LogSoftmax";
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(engine, {x}, {{"axis", IntAttr(dim)}}));
  return Bind(0, y);
}

// _softmax_backward_data(grad_output, output, dim, input_dtype) and the log-softmax one: the
// engine's SalusSoftmaxGrad from the forward's output.
Status Lowerer::SoftmaxBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Tensor("output"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(y).size()));
  if (S(dy) != S(y) || T(y) != DataType::kFloat32) return Bad("grad_output and output differ");
  const bool log = node_->op() == "aten._log_softmax_backward_data.default";
  SALUS_ASSIGN_OR_RETURN(ValueId dx,
                         EmitShaped("SalusSoftmaxGrad", {y, dy},
                                    {{"axis", IntAttr(dim)},
                                     {"forward_op", StringAttr(log ? "LogSoftmax" : "Softmax")},
                                     {"opset", IntAttr(kAtenOpset)}},
                                    DataType::kFloat32, S(y)));
  return Bind(0, dx);
}

// threshold_backward(grad_output, self, threshold): ReLU's gradient (threshold 0, self its
// input or output, whose signs agree) as the engine's Relu backward; other thresholds as a
// comparison and a select.
Status Lowerer::ThresholdBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(double threshold, Number("threshold"));
  if (S(dy) != S(x) || T(x) != DataType::kFloat32 || T(dy) != DataType::kFloat32) {
    return Bad("grad_output and self must be float tensors of one shape");
  }
  if (threshold == 0) {
    SALUS_ASSIGN_OR_RETURN(
        ValueId dx, EmitShaped("SalusEltwiseGrad", {x, dy},
                               {{"forward_op", StringAttr("Relu")}, {"opset", IntAttr(kAtenOpset)}},
                               DataType::kFloat32, S(x)));
    return Bind(0, dx);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId keep, Emit("Greater", {x, Scalar(DataType::kFloat32, threshold)}));
  SALUS_ASSIGN_OR_RETURN(ValueId dx, Emit("Where", {keep, dy, Scalar(DataType::kFloat32, 0)}));
  return Bind(0, dx);
}

Status Lowerer::Gelu() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::string approximate, String("approximate"));
  if (approximate != "none" && approximate != "tanh")
    return Bad("approximate must be none or tanh");
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gelu", {x}, {{"approximate", StringAttr(approximate)}}));
  return Bind(0, y);
}

// gelu_backward(grad_output, self, approximate): GELU's gradient as the engine's one kernel
// (dY times Phi(x) + x phi(x), or the tanh form's derivative), where the decomposition would
// run erf, exp and five elementwise products one kernel at a time.
Status Lowerer::GeluBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::string approximate, String("approximate"));
  if (approximate != "none" && approximate != "tanh")
    return Bad("approximate must be none or tanh");
  if (S(dy) != S(x) || T(x) != DataType::kFloat32 || T(dy) != DataType::kFloat32) {
    return Bad("grad_output and self must be float tensors of one shape");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId dx, EmitShaped("SalusUnaryGrad", {x, dy},
                                                {{"forward_op", StringAttr("Gelu")},
                                                 {"approximate", StringAttr(approximate)},
                                                 {"opset", IntAttr(kAtenOpset)}},
                                                DataType::kFloat32, S(x)));
  return Bind(0, dx);
}

Status Lowerer::Convolution() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight"));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("bias", true));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> stride, Ints("stride"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> padding, Ints("padding"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dilation, Ints("dilation"));
  SALUS_ASSIGN_OR_RETURN(bool transposed, Bool("transposed"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> output_padding, Ints("output_padding"));
  SALUS_ASSIGN_OR_RETURN(int64_t groups, Int("groups"));
  const size_t spatial = S(x).size() - 2;
  if (S(x).size() < 3 || S(w).size() != S(x).size()) return Bad("input and weight ranks differ");
  auto expand = [&](std::vector<int64_t>& v) {
    if (v.size() == 1) v.assign(spatial, v[0]);
  };
  expand(stride), expand(padding), expand(dilation), expand(output_padding);
  if (stride.size() != spatial || padding.size() != spatial || dilation.size() != spatial) {
    return Bad("stride, padding and dilation must have one entry per spatial dim");
  }
  std::vector<int64_t> pads = padding;
  pads.insert(pads.end(), padding.begin(), padding.end());
  std::map<std::string, Attribute> attrs = {{"strides", IntsAttr(stride)},
                                            {"pads", IntsAttr(pads)},
                                            {"dilations", IntsAttr(dilation)},
                                            {"group", IntAttr(groups)}};
  if (transposed &&
      std::any_of(output_padding.begin(), output_padding.end(), [](int64_t p) { return p != 0; })) {
    if (output_padding.size() != spatial) return Bad("output_padding needs one entry per dim");
    attrs["output_padding"] = IntsAttr(output_padding);  // (extra rows at the end, ONNX's)
  }
  // Note [1-D convolutions]: the engine's convolutions are 2-D and 3-D, so a 1-D one (Conv1d)
  // runs as a 2-D one over a height of 1, its input, weight and output given that dim and
  // losing it.
  const bool one_d = spatial == 1;
  if (one_d) {
    SALUS_ASSIGN_OR_RETURN(x, AddHeight(x));
    SALUS_ASSIGN_OR_RETURN(w, AddHeight(w));
    attrs = {{"strides", IntsAttr({1, stride[0]})},
             {"pads", IntsAttr({0, padding[0], 0, padding[0]})},
             {"dilations", IntsAttr({1, dilation[0]})},
             {"group", IntAttr(groups)}};
    if (transposed && output_padding.size() == 1 && output_padding[0] != 0) {
      attrs["output_padding"] = IntsAttr({0, output_padding[0]});
    }
  }
  std::vector<ValueId> inputs = {x, w};
  if (b != kNoValue) inputs.push_back(b);
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit(transposed ? "ConvTranspose" : "Conv", inputs, attrs));
  if (one_d) {
    SALUS_ASSIGN_OR_RETURN(y, DropHeight(y));
  }
  return Bind(0, y);
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias).
Status Lowerer::ConvolutionBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight"));
  SALUS_ASSIGN_OR_RETURN(bool transposed, Bool("transposed"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> stride, Ints("stride"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> padding, Ints("padding"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dilation, Ints("dilation"));
  SALUS_ASSIGN_OR_RETURN(int64_t groups, Int("groups"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> mask, Ints("output_mask"));
  if (mask.size() != 3) return Bad("output_mask must have 3 entries");
  const size_t spatial = S(x).size() - 2;
  auto expand = [&](std::vector<int64_t>& v) {
    if (v.size() == 1) v.assign(spatial, v[0]);
  };
  expand(stride), expand(padding), expand(dilation);
  // Note [1-D convolutions]: computed as 2-D over a height of 1, the gradients losing it.
  const bool one_d = spatial == 1;
  if (one_d) {
    SALUS_ASSIGN_OR_RETURN(dy, AddHeight(dy));
    SALUS_ASSIGN_OR_RETURN(x, AddHeight(x));
    SALUS_ASSIGN_OR_RETURN(w, AddHeight(w));
    stride.insert(stride.begin(), 1);
    padding.insert(padding.begin(), 0);
    dilation.insert(dilation.begin(), 1);
  }
  std::vector<int64_t> pads = padding;
  pads.insert(pads.end(), padding.begin(), padding.end());
  std::map<std::string, Attribute> attrs = {
      {"strides", IntsAttr(stride)},      {"pads", IntsAttr(pads)},
      {"dilations", IntsAttr(dilation)},  {"group", IntAttr(groups)},
      {"forward_op", StringAttr("Conv")}, {"opset", IntAttr(kAtenOpset)}};
  if (one_d) one_d_results_ = true;
  auto wanted = [&](int k) { return mask[k] != 0 && k < Outputs() && node_->outputs(k) >= 0; };
  if (transposed) return TransposedConvolutionBackward(dy, x, w, attrs, wanted);
  if (wanted(0)) {
    auto a = attrs;
    a["x_shape"] = IntsAttr(S(x));
    SALUS_ASSIGN_OR_RETURN(ValueId dx,
                           EmitShaped("SalusConvGradData", {dy, w}, a, DataType::kFloat32, S(x)));
    SALUS_RETURN_IF_ERROR(BindConv(0, dx));
  }
  if (wanted(1) || wanted(2)) {
    Node n;
    n.op = "SalusConvGradWeights";
    n.name = NodeName();
    n.inputs = {x, dy};
    n.attrs = attrs;
    n.attrs["w_shape"] = IntsAttr(S(w));
    n.outputs = {NewValue(n.name, S(w))};
    if (wanted(2)) n.outputs.push_back(NewValue(n.name, {S(w)[0]}));
    const std::vector<ValueId> outs = n.outputs;
    SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
    if (wanted(1)) SALUS_RETURN_IF_ERROR(BindConv(1, outs[0]));
    if (wanted(2)) SALUS_RETURN_IF_ERROR(Bind(2, outs[1]));
  }
  return OkStatus();
}

// A transposed convolution is the data gradient of the convolution whose input has the
// transposed one's output shape and whose weight is the same tensor ([C_in, C_out / group,
// k...] read as a convolution's [C_out, C_in / group, k...]). So its input's gradient is that
// convolution of grad_output, and its weight's gradient is that convolution's weight
// gradient with grad_output as the input and the transposed input as the output's gradient.
// The bias gradient sums grad_output over all but the channel dim.
Status Lowerer::TransposedConvolutionBackward(ValueId dy, ValueId x, ValueId w,
                                              std::map<std::string, Attribute> attrs,
                                              const std::function<bool(int)>& wanted) {
  // (With output_padding, the transposed output has up to stride - 1 more rows at its end than
  // the convolution of the input's size needs; that convolution's output is still the input's
  // size, the extra rows only reaching it through the padding, as in PyTorch.)
  if (wanted(0)) {
    std::map<std::string, Attribute> conv = attrs;
    conv.erase("forward_op");
    conv.erase("opset");
    SALUS_ASSIGN_OR_RETURN(ValueId dx, Emit("Conv", {dy, w}, conv));
    SALUS_RETURN_IF_ERROR(BindConv(0, dx));
  }
  if (wanted(1)) {
    attrs["w_shape"] = IntsAttr(S(w));
    SALUS_ASSIGN_OR_RETURN(
        ValueId dw, EmitShaped("SalusConvGradWeights", {dy, x}, attrs, DataType::kFloat32, S(w)));
    SALUS_RETURN_IF_ERROR(BindConv(1, dw));
  }
  if (wanted(2)) {
    std::vector<int64_t> axes = {0};
    for (size_t a = 2; a < S(dy).size(); ++a) axes.push_back(static_cast<int64_t>(a));
    SALUS_ASSIGN_OR_RETURN(ValueId db, Reduce("ReduceSum", dy, axes, false));
    SALUS_RETURN_IF_ERROR(Bind(2, db));
  }
  return OkStatus();
}

Status Lowerer::MaxPool() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> kernel, Ints("kernel_size"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> stride, Ints("stride"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> padding, Ints("padding"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> dilation, Ints("dilation"));
  SALUS_ASSIGN_OR_RETURN(bool ceil, Bool("ceil_mode"));
  if (S(x).size() != 4) return Refuse("max pooling of a tensor that is not 4-D");
  auto two = [](std::vector<int64_t>& v, std::vector<int64_t> fallback) {
    if (v.empty()) v = std::move(fallback);
    if (v.size() == 1) v.push_back(v[0]);
  };
  two(kernel, {}), two(stride, kernel), two(padding, {0}), two(dilation, {1});
  for (int64_t d : dilation) {
    if (d != 1) return Refuse("dilated max pooling");
  }
  std::map<std::string, Attribute> attrs = {
      {"kernel_shape", IntsAttr(kernel)},
      {"strides", IntsAttr(stride)},
      {"pads", IntsAttr({padding[0], padding[1], padding[0], padding[1]})},
      {"ceil_mode", IntAttr(ceil ? 1 : 0)}};
  SALUS_ASSIGN_OR_RETURN(ValueId y, MaxPoolOf(x, std::move(attrs)));
  return Bind(0, y);
}

// MaxPool of x; SalusMaxPool, its taps kept for the backward, when the graph uses the indices.
StatusOr<ValueId> Lowerer::MaxPoolOf(ValueId x, std::map<std::string, Attribute> attrs) {
  if (Outputs() < 2 || node_->outputs(1) < 0) return Emit("MaxPool", {x}, std::move(attrs));
  Node probe;
  probe.op = "MaxPool";
  probe.attrs = attrs;
  const Shape xs = S(x);
  if (xs.size() != 4) return Refuse("max pooling of a tensor that is not 4-D");
  SALUS_ASSIGN_OR_RETURN(Window win,
                         ComputeWindow(probe, {xs[2], xs[3]}, probe.GetInts("kernel_shape"),
                                       probe.GetInt("ceil_mode", 0) != 0));
  const Shape ys = {xs[0], xs[1], win.out[0], win.out[1]};
  Node n;
  n.op = "SalusMaxPool";
  n.name = NodeName();
  n.inputs = {x};
  n.attrs = std::move(attrs);
  n.outputs = {NewValue(n.name, ys), NewValue(n.name, ys)};
  graph_.value(n.outputs[0]).type = DataType::kFloat32;
  graph_.value(n.outputs[1]).type = DataType::kInt64;
  const std::vector<ValueId> outs = n.outputs;
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  pool_taps_[node_->outputs(1)] = outs[1];
  return outs[0];
}

// The taps of the max pooling whose indices argument `indices` names.
StatusOr<ValueId> Lowerer::PoolTaps(const std::string& forward) {
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* ind, Arg("indices"));
  auto it = ind->kind_case() == v1::AtenArgument::kValue ? pool_taps_.find(ind->value())
                                                         : pool_taps_.end();
  if (it == pool_taps_.end()) return Refuse("indices that are not " + forward + " result");
  return it->second;
}

// The window's first maximum gets the gradient, as PyTorch's indices say; the engine reads
// its own taps of that maximum in their place.
Status Lowerer::MaxPoolBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId taps, PoolTaps("a max_pool2d_with_indices"));
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> kernel, Ints("kernel_size"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> stride, Ints("stride"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> padding, Ints("padding"));
  SALUS_ASSIGN_OR_RETURN(bool ceil, Bool("ceil_mode"));
  auto two = [](std::vector<int64_t>& v, std::vector<int64_t> fallback) {
    if (v.empty()) v = std::move(fallback);
    if (v.size() == 1) v.push_back(v[0]);
  };
  two(kernel, {}), two(stride, kernel), two(padding, {0});
  std::map<std::string, Attribute> attrs = {
      {"kernel_shape", IntsAttr(kernel)},
      {"strides", IntsAttr(stride)},
      {"pads", IntsAttr({padding[0], padding[1], padding[0], padding[1]})},
      {"ceil_mode", IntAttr(ceil ? 1 : 0)},
      {"forward_op", StringAttr("MaxPool")},
      {"opset", IntAttr(kAtenOpset)}};
  SALUS_ASSIGN_OR_RETURN(
      ValueId dx, EmitShaped("SalusPoolGrad", {x, dy, taps}, attrs, DataType::kFloat32, S(x)));
  return Bind(0, dx);
}

// The AveragePool attributes of avg_pool2d's arguments (kernel_size, stride=kernel_size,
// padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None) over a 4-D x, for
// the forward op and its gradient alike. With ceil_mode, PyTorch divides a window that hangs
// over the padding by its part inside it; the engine's divisors differ there, so that pair is
// refused (with padding; without, the divisors agree), as is a divisor override.
StatusOr<std::map<std::string, Attribute>> Lowerer::AvgPoolAttrs(const Shape& xs) {
  if (xs.size() != 4) return Refuse("average pooling of a tensor that is not 4-D");
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> kernel, Ints("kernel_size"));
  std::vector<int64_t> stride, padding = {0};
  SALUS_ASSIGN_OR_RETURN(stride, IntsOr("stride", stride));
  SALUS_ASSIGN_OR_RETURN(padding, IntsOr("padding", padding));
  bool ceil = false, include_pad = true;
  SALUS_ASSIGN_OR_RETURN(ceil, BoolOr("ceil_mode", ceil));
  SALUS_ASSIGN_OR_RETURN(include_pad, BoolOr("count_include_pad", include_pad));
  if (!IsNone("divisor_override")) return Refuse("average pooling with a divisor override");
  auto two = [](std::vector<int64_t>& v, std::vector<int64_t> fallback) {
    if (v.empty()) v = std::move(fallback);
    if (v.size() == 1) v.push_back(v[0]);
  };
  two(kernel, {}), two(stride, kernel), two(padding, {0});
  if (kernel.size() != 2 || stride.size() != 2 || padding.size() != 2) {
    return Bad("kernel_size, stride and padding must have one or two values");
  }
  // Without padding there is no padding to count: the windows' divisors are the same either way.
  if (padding[0] == 0 && padding[1] == 0) include_pad = false;
  if (ceil && include_pad)
    return Refuse("average pooling with ceil_mode, padding and count_include_pad");
  return std::map<std::string, Attribute>{
      {"kernel_shape", IntsAttr(kernel)},
      {"strides", IntsAttr(stride)},
      {"pads", IntsAttr({padding[0], padding[1], padding[0], padding[1]})},
      {"ceil_mode", IntAttr(ceil ? 1 : 0)},
      {"count_include_pad", IntAttr(include_pad ? 1 : 0)}};
}

Status Lowerer::AvgPool() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(auto attrs, AvgPoolAttrs(S(x)));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("AveragePool", {x}, attrs));
  return Bind(0, y);
}

Status Lowerer::AvgPoolBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(auto attrs, AvgPoolAttrs(S(x)));
  attrs["forward_op"] = StringAttr("AveragePool");
  attrs["opset"] = IntAttr(kAtenOpset);
  SALUS_ASSIGN_OR_RETURN(ValueId dx,
                         EmitShaped("SalusPoolGrad", {x, dy}, attrs, DataType::kFloat32, S(x)));
  return Bind(0, dx);
}

// _adaptive_avg_pool2d(self, output_size) and adaptive_max_pool2d where each output dim
// divides the input's: average or max pooling with windows of input / output, no overlap and
// no padding. Other sizes give windows of varying size, which the engine's pooling has not, and
// are refused.
namespace {
StatusOr<std::map<std::string, Attribute>> AdaptiveWindows(const Shape& xs, const Shape& ys,
                                                           const std::string& pooling) {
  if (xs.size() != 4 || ys.size() != 4) {
    return UnimplementedError("adaptive " + pooling + " pooling of a tensor that is not 4-D");
  }
  std::vector<int64_t> kernel;
  for (int d = 2; d < 4; ++d) {
    if (ys[d] <= 0 || xs[d] % ys[d] != 0) {
      return UnimplementedError("adaptive " + pooling + " pooling from " + ShapeString(xs) +
                                " to " + ShapeString(ys) + ", whose windows differ in size");
    }
    kernel.push_back(xs[d] / ys[d]);
  }
  return std::map<std::string, Attribute>{{"kernel_shape", IntsAttr(kernel)},
                                          {"strides", IntsAttr(kernel)},
                                          {"pads", IntsAttr({0, 0, 0, 0})}};
}
}  // namespace

// Both adaptive poolings: the engine's AveragePool or MaxPool (whose indices, as
// max_pool2d_with_indices', only the matching backward may use, through the taps).
Status Lowerer::AdaptivePool() {
  const bool max = node_->op() == "aten.adaptive_max_pool2d.default";
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(Shape ys, DeclaredShape(0));
  auto attrs = AdaptiveWindows(S(x), ys, max ? "max" : "average");
  if (!attrs.ok() && !max && S(x).size() == 4 && ys.size() == 4) {
    SALUS_ASSIGN_OR_RETURN(
        ValueId y, ByMatrices(x, ys, false, "adaptive average pooling", AdaptiveAverageMatrix));
    return Bind(0, y);
  }
  if (!attrs.ok()) return Refuse(std::string(attrs.status().message()));
  SALUS_ASSIGN_OR_RETURN(ValueId y,
                         max ? MaxPoolOf(x, *std::move(attrs)) : Emit("AveragePool", {x}, *attrs));
  return Bind(0, y);
}

Status Lowerer::AdaptivePoolBackward() {
  const bool max = node_->op() == "aten.adaptive_max_pool2d_backward.default";
  ValueId taps = kNoValue;
  if (max) {
    SALUS_ASSIGN_OR_RETURN(taps, PoolTaps("an adaptive_max_pool2d"));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  auto attrs = AdaptiveWindows(S(x), S(dy), max ? "max" : "average");
  if (!attrs.ok() && !max && S(x).size() == 4 && S(dy).size() == 4) {
    SALUS_ASSIGN_OR_RETURN(
        ValueId dx, ByMatrices(dy, S(x), true, "adaptive average pooling", AdaptiveAverageMatrix));
    return Bind(0, dx);
  }
  if (!attrs.ok()) return Refuse(std::string(attrs.status().message()));
  (*attrs)["forward_op"] = StringAttr(max ? "MaxPool" : "AveragePool");
  (*attrs)["opset"] = IntAttr(kAtenOpset);
  std::vector<ValueId> inputs = {x, dy};
  if (max) inputs.push_back(taps);
  SALUS_ASSIGN_OR_RETURN(
      ValueId dx, EmitShaped("SalusPoolGrad", std::move(inputs), *attrs, DataType::kFloat32, S(x)));
  return Bind(0, dx);
}

// _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training,
// momentum, eps) -> (out, save_mean, save_rstd, new_running_mean, new_running_var): the
// engine's SalusBatchNormTrain, which keeps PyTorch's arithmetic (biased batch variance for the
// output, unbiased for the running update) and updates the running statistics in place; its
// batch variance is remembered for native_batch_norm_backward.
Status Lowerer::BatchNormTrain() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight", true));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("bias", true));
  SALUS_ASSIGN_OR_RETURN(ValueId rm, Tensor("running_mean"));
  SALUS_ASSIGN_OR_RETURN(ValueId rv, Tensor("running_var"));
  SALUS_ASSIGN_OR_RETURN(bool training, Bool("training"));
  SALUS_ASSIGN_OR_RETURN(double momentum, Number("momentum"));
  SALUS_ASSIGN_OR_RETURN(double eps, Number("eps"));
  if (!training) return Refuse("_native_batch_norm_legit_functional outside training");
  const Shape xs = S(x);
  if (xs.size() < 2 || T(x) != DataType::kFloat32) return Bad("input must be float with channels");
  const Shape c = {xs[1]};
  // A module run twice in a step (two views through one encoder) is given the statistics its
  // first run left: the state itself, which that run's node (earlier in the engine's order)
  // updated in place.
  for (ValueId* stat : {&rm, &rv}) {
    auto updated = bn_updated_.find(*stat);
    if (updated != bn_updated_.end()) *stat = updated->second;
  }
  for (ValueId stat : {rm, rv}) {
    if (graph_.value(stat).kind != ValueKind::kState || S(stat) != c) {
      return Refuse("running statistics that are not state tensors of the channels' size");
    }
  }
  if (w == kNoValue) w = Filled(DataType::kFloat32, c, 1);
  if (b == kNoValue) b = Filled(DataType::kFloat32, c, 0);
  Node n;
  n.op = "SalusBatchNormTrain";
  n.name = NodeName();
  n.inputs = {x, w, b, rm, rv};
  // The engine's momentum weighs the old running value, PyTorch's the batch's.
  n.attrs = {{"epsilon", FloatAttr(static_cast<float>(eps))},
             {"momentum", FloatAttr(static_cast<float>(1.0 - momentum))}};
  auto value = [&](const Shape& shape) { return NewValue(n.name, shape); };
  n.outputs = {value(xs), value(c), value(c), value(c), value(c)};
  const std::vector<ValueId> outs = n.outputs;
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  SALUS_RETURN_IF_ERROR(Bind(0, outs[0]));
  SALUS_RETURN_IF_ERROR(Bind(1, outs[1]));
  SALUS_ASSIGN_OR_RETURN(ValueId ve, Emit("Add", {outs[2], Scalar(DataType::kFloat32, eps)}));
  SALUS_ASSIGN_OR_RETURN(ValueId sd, Emit("Sqrt", {ve}));
  SALUS_ASSIGN_OR_RETURN(ValueId rstd, Emit("Reciprocal", {sd}));
  SALUS_RETURN_IF_ERROR(Bind(2, rstd));
  SALUS_RETURN_IF_ERROR(Bind(3, outs[3]));
  SALUS_RETURN_IF_ERROR(Bind(4, outs[4]));
  bn_updated_[outs[3]] = rm;
  bn_updated_[outs[4]] = rv;
  if (Outputs() > 2 && node_->outputs(2) >= 0) {
    batch_stats_[node_->outputs(2)] = {outs[1], outs[2], static_cast<float>(eps)};
  }
  return OkStatus();
}

// native_batch_norm_backward with train=False: the gradient of a batch norm in eval mode (a
// model fine-tuned with frozen BatchNorm), an affine map per channel with k = 1 /
// sqrt(running_var + eps): dx = dy * weight * k, dweight = sum(dy * (x - running_mean) * k),
// dbias = sum(dy), the sums over all but the channel dim.
Status Lowerer::BatchNormEvalBackward(ValueId dy, ValueId x, ValueId w) {
  SALUS_ASSIGN_OR_RETURN(ValueId rm, Tensor("running_mean"));
  SALUS_ASSIGN_OR_RETURN(ValueId rv, Tensor("running_var"));
  SALUS_ASSIGN_OR_RETURN(double eps, Number("eps"));
  const Shape xs = S(x);
  if (xs.size() < 2 || S(dy) != xs || S(rm) != Shape{xs[1]} || S(rv) != Shape{xs[1]}) {
    return Bad("the running statistics do not fit the input " + ShapeString(xs));
  }
  const DataType f32 = DataType::kFloat32;
  SALUS_ASSIGN_OR_RETURN(ValueId ve, Emit("Add", {rv, Scalar(f32, eps)}));
  SALUS_ASSIGN_OR_RETURN(ValueId sd, Emit("Sqrt", {ve}));
  SALUS_ASSIGN_OR_RETURN(ValueId k, Emit("Reciprocal", {sd}));
  SALUS_ASSIGN_OR_RETURN(ValueId kc, PerChannel(k, xs.size()));
  std::vector<int64_t> not_channel = {0};
  for (size_t a = 2; a < xs.size(); ++a) not_channel.push_back(static_cast<int64_t>(a));
  auto wanted = [&](int i) { return i < Outputs() && node_->outputs(i) >= 0; };
  if (wanted(0)) {
    ValueId scale = kc;
    if (w != kNoValue) {
      SALUS_ASSIGN_OR_RETURN(ValueId wc, PerChannel(w, xs.size()));
      SALUS_ASSIGN_OR_RETURN(scale, Emit("Mul", {wc, kc}));
    }
    SALUS_ASSIGN_OR_RETURN(ValueId dx, Emit("Mul", {dy, scale}));
    SALUS_RETURN_IF_ERROR(Bind(0, dx));
  }
  if (wanted(1)) {
    SALUS_ASSIGN_OR_RETURN(ValueId rmc, PerChannel(rm, xs.size()));
    SALUS_ASSIGN_OR_RETURN(ValueId centred, Emit("Sub", {x, rmc}));
    SALUS_ASSIGN_OR_RETURN(ValueId xhat, Emit("Mul", {centred, kc}));
    SALUS_ASSIGN_OR_RETURN(ValueId prod, Emit("Mul", {dy, xhat}));
    SALUS_ASSIGN_OR_RETURN(ValueId dw, Reduce("ReduceSum", prod, not_channel, false));
    SALUS_RETURN_IF_ERROR(Bind(1, dw));
  }
  if (wanted(2)) {
    SALUS_ASSIGN_OR_RETURN(ValueId db, Reduce("ReduceSum", dy, not_channel, false));
    SALUS_RETURN_IF_ERROR(Bind(2, db));
  }
  return OkStatus();
}

// _native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps) -> (out,
// save_mean, save_rstd): batch norm from the batch's statistics with no running ones to update
// (InstanceNorm, as one batch of N * C channels). The mean and biased variance over all but
// the channel dim, in reductions; the backward is SalusBatchNormGrad, as for BatchNorm.
Status Lowerer::BatchNormNoStats() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight", true));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("bias", true));
  SALUS_ASSIGN_OR_RETURN(bool training, Bool("training"));
  SALUS_ASSIGN_OR_RETURN(double eps, Number("eps"));
  if (!training) return Refuse("batch norm without running statistics outside training");
  const Shape xs = S(x);
  if (xs.size() < 2 || T(x) != DataType::kFloat32) return Bad("input must be float with channels");
  const Shape c = {xs[1]};
  std::vector<int64_t> axes = {0};
  for (size_t a = 2; a < xs.size(); ++a) axes.push_back(static_cast<int64_t>(a));
  const DataType f32 = DataType::kFloat32;
  SALUS_ASSIGN_OR_RETURN(ValueId mean, Reduce("ReduceMean", x, axes, true));
  SALUS_ASSIGN_OR_RETURN(ValueId centred, Emit("Sub", {x, mean}));
  SALUS_ASSIGN_OR_RETURN(ValueId sq, Emit("Mul", {centred, centred}));
  SALUS_ASSIGN_OR_RETURN(ValueId var, Reduce("ReduceMean", sq, axes, true));
  SALUS_ASSIGN_OR_RETURN(ValueId ve, Emit("Add", {var, Scalar(f32, eps)}));
  SALUS_ASSIGN_OR_RETURN(ValueId sd, Emit("Sqrt", {ve}));
  SALUS_ASSIGN_OR_RETURN(ValueId rstd, Emit("Reciprocal", {sd}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Mul", {centred, rstd}));
  if (w != kNoValue) {
    SALUS_ASSIGN_OR_RETURN(ValueId wc, PerChannel(w, xs.size()));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Mul", {y, wc}));
  }
  if (b != kNoValue) {
    SALUS_ASSIGN_OR_RETURN(ValueId bc, PerChannel(b, xs.size()));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Add", {y, bc}));
  }
  SALUS_RETURN_IF_ERROR(Bind(0, y));
  SALUS_ASSIGN_OR_RETURN(ValueId mean_c, ReshapeTo(mean, c));
  SALUS_ASSIGN_OR_RETURN(ValueId var_c, ReshapeTo(var, c));
  SALUS_ASSIGN_OR_RETURN(ValueId rstd_c, ReshapeTo(rstd, c));
  SALUS_RETURN_IF_ERROR(Bind(1, mean_c));
  SALUS_RETURN_IF_ERROR(Bind(2, rstd_c));
  if (Outputs() > 2 && node_->outputs(2) >= 0) {
    batch_stats_[node_->outputs(2)] = {mean_c, var_c, static_cast<float>(eps)};
  }
  return OkStatus();
}

// repeat(self, repeats): each dim d of the input (after leading 1s up to repeats' length) as
// [1, size] expanded to [repeats[d], size], reshaped to [repeats[d] * size].
Status Lowerer::Repeat() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> repeats, Ints("repeats"));
  Shape xs = S(x);
  if (repeats.size() < xs.size()) return Bad("fewer repeats than the input has dims");
  xs.insert(xs.begin(), repeats.size() - xs.size(), 1);
  Shape spread, expanded, out;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (repeats[d] < 0) return Bad("a negative repeat");
    spread.insert(spread.end(), {1, xs[d]});
    expanded.insert(expanded.end(), {repeats[d], xs[d]});
    out.push_back(repeats[d] * xs[d]);
  }
  if (TooManyElements(out, int64_t{1} << 40)) return Bad("the repeated tensor is too large");
  SALUS_ASSIGN_OR_RETURN(ValueId sp, ReshapeTo(x, spread));
  SALUS_ASSIGN_OR_RETURN(ValueId e, ExpandTo(sp, expanded));
  SALUS_ASSIGN_OR_RETURN(ValueId y, ReshapeTo(e, out));
  return Bind(0, y);
}

// native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
// save_invstd, train, eps, output_mask) -> (grad_input, grad_weight, grad_bias), in training,
// from the statistics of the matching forward: SalusBatchNormGrad.
Status Lowerer::BatchNormBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_out"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight", true));
  SALUS_ASSIGN_OR_RETURN(bool train, Bool("train"));
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* invstd, Arg("save_invstd"));
  if (!train) return BatchNormEvalBackward(dy, x, w);
  if (invstd->kind_case() != v1::AtenArgument::kValue || batch_stats_.count(invstd->value()) == 0) {
    return Refuse("save_invstd that is not a training batch norm's result");
  }
  const BatchStats& st = batch_stats_.at(invstd->value());
  const Shape c = {S(x).at(1)};
  if (w == kNoValue) w = Filled(DataType::kFloat32, c, 1);
  Node n;
  n.op = "SalusBatchNormGrad";
  n.name = NodeName();
  n.inputs = {x, w, st.mean, st.var, dy};
  n.attrs = {{"epsilon", FloatAttr(st.eps)}};
  auto value = [&](const Shape& shape) { return NewValue(n.name, shape); };
  n.outputs = {value(S(x)), value(c), value(c)};
  const std::vector<ValueId> outs = n.outputs;
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  for (int k = 0; k < 3 && k < Outputs(); ++k) SALUS_RETURN_IF_ERROR(Bind(k, outs[k]));
  return OkStatus();
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
// output_mask) -> (grad_input, grad_weight, grad_bias): SalusLayerNormGrad, which recomputes
// the statistics from the input.
Status Lowerer::LayerNormBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_out"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> normalized, Ints("normalized_shape"));
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* rstd, Arg("rstd"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight", true));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("bias", true));
  if (rstd->kind_case() != v1::AtenArgument::kValue || layer_eps_.count(rstd->value()) == 0) {
    return Refuse("rstd that is not a native_layer_norm result");
  }
  const Shape xs = S(x);
  if (normalized.empty() || normalized.size() > xs.size()) return Bad("bad normalized_shape");
  const int64_t axis = static_cast<int64_t>(xs.size() - normalized.size());
  if (w == kNoValue) w = Filled(DataType::kFloat32, Shape(normalized), 1);
  Node n;
  n.op = "SalusLayerNormGrad";
  n.name = NodeName();
  n.inputs = {x, w, dy};
  n.attrs = {{"axis", IntAttr(axis)}, {"epsilon", FloatAttr(layer_eps_.at(rstd->value()))}};
  auto value = [&](const Shape& shape) { return NewValue(n.name, shape); };
  n.outputs = {value(xs), value(S(w)), b == kNoValue ? kNoValue : value(S(b))};
  const std::vector<ValueId> outs = n.outputs;
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  for (int k = 0; k < 3 && k < Outputs(); ++k) {
    if (outs[k] != kNoValue) SALUS_RETURN_IF_ERROR(Bind(k, outs[k]));
  }
  return OkStatus();
}

// _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
// momentum, eps) -> (out, empty, empty).
Status Lowerer::BatchNormEval() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight", true));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("bias", true));
  SALUS_ASSIGN_OR_RETURN(ValueId rm, Tensor("running_mean"));
  SALUS_ASSIGN_OR_RETURN(ValueId rv, Tensor("running_var"));
  SALUS_ASSIGN_OR_RETURN(double eps, Number("eps"));
  const Shape c = {S(x).at(1)};
  if (w == kNoValue) w = Filled(DataType::kFloat32, c, 1);
  if (b == kNoValue) b = Filled(DataType::kFloat32, c, 0);
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("BatchNormalization", {x, w, b, rm, rv},
                                         {{"epsilon", FloatAttr(static_cast<float>(eps))}}));
  SALUS_RETURN_IF_ERROR(Bind(0, y));
  for (int k = 1; k < Outputs(); ++k) {
    if (node_->outputs(k) < 0) continue;
    SALUS_ASSIGN_OR_RETURN(Shape s, DeclaredShape(k));
    SALUS_RETURN_IF_ERROR(Bind(k, Filled(DataType::kFloat32, s, 0)));
  }
  return OkStatus();
}

// native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd).
Status Lowerer::LayerNorm() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> normalized, Ints("normalized_shape"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight", true));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("bias", true));
  SALUS_ASSIGN_OR_RETURN(double eps, Number("eps"));
  const Shape xs = S(x);
  if (normalized.empty() || normalized.size() > xs.size()) return Bad("bad normalized_shape");
  const int64_t axis = static_cast<int64_t>(xs.size() - normalized.size());
  if (w == kNoValue) w = Filled(DataType::kFloat32, Shape(normalized), 1);
  std::vector<ValueId> inputs = {x, w};
  if (b != kNoValue) inputs.push_back(b);
  SALUS_ASSIGN_OR_RETURN(
      auto outs,
      EmitN("LayerNormalization", inputs,
            {{"axis", IntAttr(axis)}, {"epsilon", FloatAttr(static_cast<float>(eps))}}, 3));
  for (int k = 0; k < 3; ++k) SALUS_RETURN_IF_ERROR(Bind(k, outs[k]));
  if (Outputs() > 2 && node_->outputs(2) >= 0) {
    layer_eps_[node_->outputs(2)] = static_cast<float>(eps);
  }
  return OkStatus();
}

// A [C] vector as [1, C, 1, ...] of the given rank, to scale channels.
StatusOr<ValueId> Lowerer::PerChannel(ValueId v, size_t rank) {
  Shape shape(rank, 1);
  shape[1] = NumElements(S(v));
  return ReshapeTo(v, shape);
}

// native_group_norm(input, weight, bias, N, C, HxW, group, eps) -> (out, mean, rstd): the
// input as [N, group, C / group * HxW], normalised by LayerNormalization over its last axis,
// then scaled and shifted per channel; mean and rstd are [N, group].
Status Lowerer::GroupNorm() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight", true));
  SALUS_ASSIGN_OR_RETURN(ValueId b, Tensor("bias", true));
  SALUS_ASSIGN_OR_RETURN(int64_t n, Int("N"));
  SALUS_ASSIGN_OR_RETURN(int64_t c, Int("C"));
  SALUS_ASSIGN_OR_RETURN(int64_t hw, Int("HxW"));
  SALUS_ASSIGN_OR_RETURN(int64_t groups, Int("group"));
  SALUS_ASSIGN_OR_RETURN(double eps, Number("eps"));
  const Shape xs = S(x);
  if (T(x) != DataType::kFloat32) return Refuse("group norm of a non-float tensor");
  if (xs.size() < 2 || groups <= 0 || c % groups != 0 || n * c * hw != NumElements(xs) ||
      xs[0] != n || xs[1] != c) {
    return Bad("N, C, HxW and group do not fit the input " + ShapeString(xs));
  }
  const int64_t d = c / groups * hw;
  SALUS_ASSIGN_OR_RETURN(ValueId xr, ReshapeTo(x, {n, groups, d}));
  SALUS_ASSIGN_OR_RETURN(
      auto outs, EmitN("LayerNormalization", {xr, Filled(DataType::kFloat32, {d}, 1)},
                       {{"axis", IntAttr(2)}, {"epsilon", FloatAttr(static_cast<float>(eps))}}, 3));
  SALUS_ASSIGN_OR_RETURN(ValueId y, ReshapeTo(outs[0], xs));
  if (w != kNoValue) {
    SALUS_ASSIGN_OR_RETURN(ValueId wc, PerChannel(w, xs.size()));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Mul", {y, wc}));
  }
  if (b != kNoValue) {
    SALUS_ASSIGN_OR_RETURN(ValueId bc, PerChannel(b, xs.size()));
    SALUS_ASSIGN_OR_RETURN(y, Emit("Add", {y, bc}));
  }
  SALUS_RETURN_IF_ERROR(Bind(0, y));
  for (int k = 1; k < 3 && k < Outputs(); ++k) {
    if (node_->outputs(k) < 0) continue;
    SALUS_ASSIGN_OR_RETURN(ValueId stat, ReshapeTo(outs[k], {n, groups}));
    SALUS_RETURN_IF_ERROR(Bind(k, stat));
  }
  return OkStatus();
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
// output_mask) -> (dx, dweight, dbias), from the forward's statistics: with x^ the normalised
// input and g = grad_out * weight, per group dx = rstd * (g - mean(g) - x^ * mean(g * x^));
// dweight and dbias sum grad_out * x^ and grad_out over all but the channel dim. Only the
// results the graph uses are made.
Status Lowerer::GroupNormBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_out"));
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(ValueId mean, Tensor("mean"));
  SALUS_ASSIGN_OR_RETURN(ValueId rstd, Tensor("rstd"));
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight", true));
  SALUS_ASSIGN_OR_RETURN(int64_t n, Int("N"));
  SALUS_ASSIGN_OR_RETURN(int64_t c, Int("C"));
  SALUS_ASSIGN_OR_RETURN(int64_t hw, Int("HxW"));
  SALUS_ASSIGN_OR_RETURN(int64_t groups, Int("group"));
  const Shape xs = S(x);
  if (xs.size() < 2 || groups <= 0 || c % groups != 0 || n * c * hw != NumElements(xs) ||
      S(dy) != xs || NumElements(S(mean)) != n * groups || NumElements(S(rstd)) != n * groups) {
    return Bad("the arguments do not fit the input " + ShapeString(xs));
  }
  auto wanted = [&](int k) { return k < Outputs() && node_->outputs(k) >= 0; };
  const int64_t d = c / groups * hw;
  SALUS_ASSIGN_OR_RETURN(ValueId xr, ReshapeTo(x, {n, groups, d}));
  SALUS_ASSIGN_OR_RETURN(ValueId m, ReshapeTo(mean, {n, groups, 1}));
  SALUS_ASSIGN_OR_RETURN(ValueId r, ReshapeTo(rstd, {n, groups, 1}));
  SALUS_ASSIGN_OR_RETURN(ValueId centred, Emit("Sub", {xr, m}));
  SALUS_ASSIGN_OR_RETURN(ValueId xhat_r, Emit("Mul", {centred, r}));
  SALUS_ASSIGN_OR_RETURN(ValueId xhat, ReshapeTo(xhat_r, xs));
  std::vector<int64_t> not_channel = {0};
  for (size_t a = 2; a < xs.size(); ++a) not_channel.push_back(static_cast<int64_t>(a));
  if (wanted(0)) {
    ValueId g = dy;
    if (w != kNoValue) {
      SALUS_ASSIGN_OR_RETURN(ValueId wc, PerChannel(w, xs.size()));
      SALUS_ASSIGN_OR_RETURN(g, Emit("Mul", {dy, wc}));
    }
    SALUS_ASSIGN_OR_RETURN(ValueId gr, ReshapeTo(g, {n, groups, d}));
    SALUS_ASSIGN_OR_RETURN(ValueId mean_g, Reduce("ReduceMean", gr, {2}, true));
    SALUS_ASSIGN_OR_RETURN(ValueId gx, Emit("Mul", {gr, xhat_r}));
    SALUS_ASSIGN_OR_RETURN(ValueId mean_gx, Reduce("ReduceMean", gx, {2}, true));
    SALUS_ASSIGN_OR_RETURN(ValueId proj, Emit("Mul", {xhat_r, mean_gx}));
    SALUS_ASSIGN_OR_RETURN(ValueId t, Emit("Sub", {gr, mean_g}));
    SALUS_ASSIGN_OR_RETURN(t, Emit("Sub", {t, proj}));
    SALUS_ASSIGN_OR_RETURN(ValueId dxr, Emit("Mul", {t, r}));
    SALUS_ASSIGN_OR_RETURN(ValueId dx, ReshapeTo(dxr, xs));
    SALUS_RETURN_IF_ERROR(Bind(0, dx));
  }
  if (wanted(1)) {
    SALUS_ASSIGN_OR_RETURN(ValueId prod, Emit("Mul", {dy, xhat}));
    SALUS_ASSIGN_OR_RETURN(ValueId dw, Reduce("ReduceSum", prod, not_channel, false));
    SALUS_RETURN_IF_ERROR(Bind(1, dw));
  }
  if (wanted(2)) {
    SALUS_ASSIGN_OR_RETURN(ValueId db, Reduce("ReduceSum", dy, not_channel, false));
    SALUS_RETURN_IF_ERROR(Bind(2, db));
  }
  return OkStatus();
}

// _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None)
// -> (hy, cy, workspace), the cell of an LSTM layer, as PyTorch's fused kernel: the gates
// (input + hidden + biases) split in four along dim 1 into i, f, g, o; i, f and o through a
// sigmoid, g through tanh; cy = f * cx + i * g, hy = o * tanh(cy); the workspace keeps the
// activated gates [i, f, g, o] for the backward.
StatusOr<Lowerer::CellInputs> Lowerer::FusedCellInputs(const std::string& state, int gates) {
  CellInputs c;
  SALUS_ASSIGN_OR_RETURN(c.gi, Tensor("input_gates"));
  SALUS_ASSIGN_OR_RETURN(c.gh, Tensor("hidden_gates"));
  SALUS_ASSIGN_OR_RETURN(c.state, Tensor(state));
  SALUS_ASSIGN_OR_RETURN(c.bi, Tensor("input_bias", true));
  SALUS_ASSIGN_OR_RETURN(c.bh, Tensor("hidden_bias", true));
  const Shape ss = S(c.state);
  if (ss.size() != 2 || S(c.gi) != Shape{ss[0], gates * ss[1]} || S(c.gh) != S(c.gi) ||
      T(c.gi) != DataType::kFloat32) {
    return Bad("the gates must be float [batch, " + std::to_string(gates) +
               " * hidden] for a cell of " + ShapeString(ss));
  }
  c.hidden = ss[1];
  return c;
}

Status Lowerer::LstmCell() {
  SALUS_ASSIGN_OR_RETURN(CellInputs c, FusedCellInputs("cx", 4));
  const ValueId cx = c.state;
  SALUS_ASSIGN_OR_RETURN(ValueId gates, Emit("Add", {c.gi, c.gh}));
  for (ValueId bias : {c.bi, c.bh}) {
    if (bias == kNoValue) continue;
    SALUS_ASSIGN_OR_RETURN(gates, Emit("Add", {gates, bias}));
  }
  const int64_t h = c.hidden;
  std::vector<ValueId> act(4);
  for (int k = 0; k < 4; ++k) {
    SALUS_ASSIGN_OR_RETURN(act[k], Part(gates, k, h));
    SALUS_ASSIGN_OR_RETURN(act[k], Emit(k == 2 ? "Tanh" : "Sigmoid", {act[k]}));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId keep, Emit("Mul", {act[1], cx}));
  SALUS_ASSIGN_OR_RETURN(ValueId write, Emit("Mul", {act[0], act[2]}));
  SALUS_ASSIGN_OR_RETURN(ValueId cy, Emit("Add", {keep, write}));
  SALUS_ASSIGN_OR_RETURN(ValueId tc, Emit("Tanh", {cy}));
  SALUS_ASSIGN_OR_RETURN(ValueId hy, Emit("Mul", {act[3], tc}));
  SALUS_RETURN_IF_ERROR(Bind(0, hy));
  SALUS_RETURN_IF_ERROR(Bind(1, cy));
  if (Outputs() > 2 && node_->outputs(2) >= 0) {
    SALUS_ASSIGN_OR_RETURN(ValueId ws, Emit("Concat", act, {{"axis", IntAttr(1)}}));
    SALUS_RETURN_IF_ERROR(Bind(2, ws));
  }
  return OkStatus();
}

// _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias)
// -> (grad_gates, grad_cx, grad_bias), PyTorch's fused backward from the activated gates:
// with t = tanh(cy), dc = grad_hy * o * (1 - t^2) + grad_cy; the gates' gradients are
// dc * g * i(1 - i), dc * cx * f(1 - f), dc * i * (1 - g^2) and grad_hy * t * o(1 - o);
// grad_cx = dc * f; grad_bias sums the gates' gradients over the batch. A missing gradient
// (None) is zero.
Status Lowerer::LstmCellBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dhy, Tensor("grad_hy", true));
  SALUS_ASSIGN_OR_RETURN(ValueId dcy, Tensor("grad_cy", true));
  SALUS_ASSIGN_OR_RETURN(ValueId cx, Tensor("cx"));
  SALUS_ASSIGN_OR_RETURN(ValueId cy, Tensor("cy"));
  SALUS_ASSIGN_OR_RETURN(ValueId ws, Tensor("workspace"));
  const Shape cs = S(cx);
  if (cs.size() != 2 || S(cy) != cs || S(ws) != Shape{cs[0], 4 * cs[1]} ||
      (dhy != kNoValue && S(dhy) != cs) || (dcy != kNoValue && S(dcy) != cs)) {
    return Bad("the cell's tensors do not fit a cell of " + ShapeString(cs));
  }
  const DataType f32 = DataType::kFloat32;
  if (dhy == kNoValue) dhy = Filled(f32, cs, 0);
  const int64_t h = cs[1];
  std::vector<ValueId> gate(4);
  for (int k = 0; k < 4; ++k) {
    SALUS_ASSIGN_OR_RETURN(gate[k], Part(ws, k, h));
  }
  const ValueId one = Scalar(f32, 1);
  // v * (1 - v), a sigmoid's derivative from its value.
  auto sigmoid_slope = [&](ValueId v) -> StatusOr<ValueId> {
    SALUS_ASSIGN_OR_RETURN(ValueId rest, Emit("Sub", {one, v}));
    return Emit("Mul", {v, rest});
  };
  // 1 - v^2, tanh's derivative from its value.
  auto tanh_slope = [&](ValueId v) -> StatusOr<ValueId> {
    SALUS_ASSIGN_OR_RETURN(ValueId sq, Emit("Mul", {v, v}));
    return Emit("Sub", {one, sq});
  };
  SALUS_ASSIGN_OR_RETURN(ValueId tc, Emit("Tanh", {cy}));
  SALUS_ASSIGN_OR_RETURN(ValueId dout, Emit("Mul", {dhy, tc}));
  SALUS_ASSIGN_OR_RETURN(ValueId dc, Emit("Mul", {dhy, gate[3]}));
  SALUS_ASSIGN_OR_RETURN(ValueId slope, tanh_slope(tc));
  SALUS_ASSIGN_OR_RETURN(dc, Emit("Mul", {dc, slope}));
  if (dcy != kNoValue) {
    SALUS_ASSIGN_OR_RETURN(dc, Emit("Add", {dc, dcy}));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId di, Emit("Mul", {dc, gate[2]}));
  SALUS_ASSIGN_OR_RETURN(ValueId df, Emit("Mul", {dc, cx}));
  SALUS_ASSIGN_OR_RETURN(ValueId dg, Emit("Mul", {dc, gate[0]}));
  SALUS_ASSIGN_OR_RETURN(slope, sigmoid_slope(gate[0]));
  SALUS_ASSIGN_OR_RETURN(di, Emit("Mul", {di, slope}));
  SALUS_ASSIGN_OR_RETURN(slope, sigmoid_slope(gate[1]));
  SALUS_ASSIGN_OR_RETURN(df, Emit("Mul", {df, slope}));
  SALUS_ASSIGN_OR_RETURN(slope, tanh_slope(gate[2]));
  SALUS_ASSIGN_OR_RETURN(dg, Emit("Mul", {dg, slope}));
  SALUS_ASSIGN_OR_RETURN(slope, sigmoid_slope(gate[3]));
  SALUS_ASSIGN_OR_RETURN(dout, Emit("Mul", {dout, slope}));
  SALUS_ASSIGN_OR_RETURN(ValueId dgates,
                         Emit("Concat", {di, df, dg, dout}, {{"axis", IntAttr(1)}}));
  SALUS_RETURN_IF_ERROR(Bind(0, dgates));
  if (Outputs() > 1 && node_->outputs(1) >= 0) {
    SALUS_ASSIGN_OR_RETURN(ValueId dcx, Emit("Mul", {dc, gate[1]}));
    SALUS_RETURN_IF_ERROR(Bind(1, dcx));
  }
  if (Outputs() > 2 && node_->outputs(2) >= 0) {
    SALUS_ASSIGN_OR_RETURN(ValueId dbias, Reduce("ReduceSum", dgates, {0}, false));
    SALUS_RETURN_IF_ERROR(Bind(2, dbias));
  }
  return OkStatus();
}

// _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None)
// -> (hy, workspace), the cell of a GRU layer, as PyTorch's fused kernel: the gates split in
// three along dim 1 into r, z, n parts; r = sigmoid(ir + hr + biases), z likewise, and
// n = tanh(in + b_in + r * (hn + b_hn)); hy = n + z * (hx - n). The workspace keeps
// [r, z, n, hx, hn + b_hn] for the backward.
Status Lowerer::GruCell() {
  SALUS_ASSIGN_OR_RETURN(CellInputs c, FusedCellInputs("hx", 3));
  const ValueId hx = c.state, bi = c.bi, bh = c.bh;
  const int64_t h = c.hidden;
  // Each gate's input and hidden parts with their biases, in the kernel's order of additions.
  std::vector<ValueId> in(3), hid(3);
  for (int k = 0; k < 3; ++k) {
    SALUS_ASSIGN_OR_RETURN(in[k], Part(c.gi, k, h));
    SALUS_ASSIGN_OR_RETURN(hid[k], Part(c.gh, k, h));
  }
  auto biased = [&](ValueId v, ValueId bias, int k) -> StatusOr<ValueId> {
    if (bias == kNoValue) return v;
    SALUS_ASSIGN_OR_RETURN(ValueId b, Part(bias, k, h, 0));
    return Emit("Add", {v, b});
  };
  std::vector<ValueId> act(2);
  for (int k = 0; k < 2; ++k) {
    SALUS_ASSIGN_OR_RETURN(ValueId sum, Emit("Add", {in[k], hid[k]}));
    SALUS_ASSIGN_OR_RETURN(sum, biased(sum, bi, k));
    SALUS_ASSIGN_OR_RETURN(sum, biased(sum, bh, k));
    SALUS_ASSIGN_OR_RETURN(act[k], Emit("Sigmoid", {sum}));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId in_n, biased(in[2], bi, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId hn, biased(hid[2], bh, 2));
  SALUS_ASSIGN_OR_RETURN(ValueId reset, Emit("Mul", {act[0], hn}));
  SALUS_ASSIGN_OR_RETURN(ValueId n, Emit("Add", {in_n, reset}));
  SALUS_ASSIGN_OR_RETURN(n, Emit("Tanh", {n}));
  SALUS_ASSIGN_OR_RETURN(ValueId diff, Emit("Sub", {hx, n}));
  SALUS_ASSIGN_OR_RETURN(ValueId kept, Emit("Mul", {act[1], diff}));
  SALUS_ASSIGN_OR_RETURN(ValueId hy, Emit("Add", {n, kept}));
  SALUS_RETURN_IF_ERROR(Bind(0, hy));
  if (Outputs() > 1 && node_->outputs(1) >= 0) {
    SALUS_ASSIGN_OR_RETURN(ValueId ws,
                           Emit("Concat", {act[0], act[1], n, hx, hn}, {{"axis", IntAttr(1)}}));
    SALUS_RETURN_IF_ERROR(Bind(1, ws));
  }
  return OkStatus();
}

// _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias) -> (grad_input_gates,
// grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias), PyTorch's fused backward:
// with g = grad_hy, dz = g (hx - n) z(1 - z), dn = g (1 - z)(1 - n^2) and
// dr = dn (hn + b_hn) r(1 - r), the input gates' gradient is [dr, dz, dn], the hidden gates'
// [dr, dz, dn * r], grad_hx = g z, and the biases' gradients sum each over the batch.
Status Lowerer::GruCellBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId g, Tensor("grad_hy"));
  SALUS_ASSIGN_OR_RETURN(ValueId ws, Tensor("workspace"));
  const Shape gs = S(g);
  if (gs.size() != 2 || S(ws) != Shape{gs[0], 5 * gs[1]} || T(g) != DataType::kFloat32) {
    return Bad("grad_hy and the workspace do not fit a cell of " + ShapeString(gs));
  }
  const int64_t h = gs[1];
  std::vector<ValueId> w(5);
  for (int k = 0; k < 5; ++k) {
    SALUS_ASSIGN_OR_RETURN(w[k], Part(ws, k, h));
  }
  const ValueId r = w[0], z = w[1], n = w[2], hx = w[3], hn = w[4];
  const ValueId one = Scalar(DataType::kFloat32, 1);
  auto mul = [&](ValueId a, ValueId b) { return Emit("Mul", {a, b}); };
  auto sub = [&](ValueId a, ValueId b) { return Emit("Sub", {a, b}); };
  SALUS_ASSIGN_OR_RETURN(ValueId one_z, sub(one, z));
  SALUS_ASSIGN_OR_RETURN(ValueId hx_n, sub(hx, n));
  SALUS_ASSIGN_OR_RETURN(ValueId dz, mul(g, hx_n));
  SALUS_ASSIGN_OR_RETURN(dz, mul(dz, one_z));
  SALUS_ASSIGN_OR_RETURN(dz, mul(dz, z));
  SALUS_ASSIGN_OR_RETURN(ValueId dhx, mul(g, z));
  SALUS_ASSIGN_OR_RETURN(ValueId n2, mul(n, n));
  SALUS_ASSIGN_OR_RETURN(ValueId tanh_slope, sub(one, n2));
  SALUS_ASSIGN_OR_RETURN(ValueId dn, mul(g, one_z));
  SALUS_ASSIGN_OR_RETURN(dn, mul(dn, tanh_slope));
  SALUS_ASSIGN_OR_RETURN(ValueId dhn, mul(dn, r));
  SALUS_ASSIGN_OR_RETURN(ValueId one_r, sub(one, r));
  SALUS_ASSIGN_OR_RETURN(ValueId dr, mul(dn, hn));
  SALUS_ASSIGN_OR_RETURN(dr, mul(dr, one_r));
  SALUS_ASSIGN_OR_RETURN(dr, mul(dr, r));
  SALUS_ASSIGN_OR_RETURN(ValueId d_in, Emit("Concat", {dr, dz, dn}, {{"axis", IntAttr(1)}}));
  SALUS_ASSIGN_OR_RETURN(ValueId d_hid, Emit("Concat", {dr, dz, dhn}, {{"axis", IntAttr(1)}}));
  SALUS_RETURN_IF_ERROR(Bind(0, d_in));
  SALUS_RETURN_IF_ERROR(Bind(1, d_hid));
  SALUS_RETURN_IF_ERROR(Bind(2, dhx));
  const ValueId gates[2] = {d_in, d_hid};
  for (int k = 3; k < 5 && k < Outputs(); ++k) {
    if (node_->outputs(k) < 0) continue;
    SALUS_ASSIGN_OR_RETURN(ValueId db, Reduce("ReduceSum", gates[k - 3], {0}, false));
    SALUS_RETURN_IF_ERROR(Bind(k, db));
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Indexing.

Status Lowerer::Embedding() {
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight"));
  SALUS_ASSIGN_OR_RETURN(ValueId idx, Tensor("indices"));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gather", {w, idx}, {{"axis", IntAttr(0)}}));
  return Bind(0, y);
}

// index_put(self, indices, values, accumulate) with one index tensor on dim 0 and accumulate:
// the gradient of a gather along dim 0 (an embedding's), a scatter-add.
Status Lowerer::IndexPut() {
  SALUS_ASSIGN_OR_RETURN(ValueId self, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* list, Arg("indices"));
  SALUS_ASSIGN_OR_RETURN(ValueId values, Tensor("values"));
  SALUS_ASSIGN_OR_RETURN(bool accumulate, Bool("accumulate"));
  if (!accumulate) return Refuse("index_put without accumulate");
  // (int64: counts, as Embedding(scale_grad_by_freq=True) takes its indices'; added in
  // float, as integer sums are, exact below 2^24)
  if (T(self) != DataType::kFloat32 && T(self) != DataType::kInt64) {
    return Refuse("index_put into a bool tensor");
  }
  SALUS_ASSIGN_OR_RETURN(Indexed ix, IndexTensors(self, *list));
  // The values, one slice of the flattened self per index, scatter-added along its dim.
  const Shape flat = S(ix.flat);
  Shape want(flat.begin(), flat.begin() + ix.first);
  const Shape b = S(ix.linear);
  want.insert(want.end(), b.begin(), b.end());
  want.insert(want.end(), flat.begin() + ix.first + 1, flat.end());
  SALUS_ASSIGN_OR_RETURN(values, Cast(values, DataType::kFloat32));
  SALUS_ASSIGN_OR_RETURN(values, ExpandTo(values, want));
  SALUS_ASSIGN_OR_RETURN(ValueId scattered,
                         EmitShaped("SalusGatherGrad", {ix.linear, values},
                                    {{"axis", IntAttr(ix.first)}}, DataType::kFloat32, flat));
  SALUS_ASSIGN_OR_RETURN(scattered, ReshapeTo(scattered, S(self)));
  SALUS_ASSIGN_OR_RETURN(scattered, Cast(scattered, T(self)));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Add", {self, scattered}));
  return Bind(0, y);
}

// Note [Advanced indexing]: index(self, indices) and index_put(self, indices, values,
// accumulate) with int64 index tensors on consecutive dims (None for the dims before them,
// nothing or None after): self's indexed dims are flattened into one and the index tensors,
// broadcast together and wrapped where negative, become one linear index into it, so the
// result is a Gather along that dim (its gradient, the accumulating index_put, a scatter-add
// along it). Bool masks (a data-dependent shape) and index tensors on dims apart are refused.
StatusOr<Lowerer::Indexed> Lowerer::IndexTensors(ValueId self, const v1::AtenArgument& list) {
  if (list.kind_case() != v1::AtenArgument::kValues) return Bad("'indices' is not a list");
  const Shape xs = S(self);
  if (list.values().v_size() > static_cast<int>(xs.size())) return Bad("too many indices");
  std::vector<std::pair<int64_t, ValueId>> idx;
  for (int d = 0; d < list.values().v_size(); ++d) {
    const int v = list.values().v(d);
    if (v < 0) continue;
    SALUS_ASSIGN_OR_RETURN(ValueId t, ValueOf(v));
    if (T(t) == DataType::kBool) return Refuse("indexing by a bool mask");
    if (T(t) != DataType::kInt64) return Refuse("indexing by a non-int64 tensor");
    if (!idx.empty() && idx.back().first != d - 1) return Refuse("index tensors on dims apart");
    idx.emplace_back(d, t);
  }
  if (idx.empty()) return Bad("no index tensor");
  Indexed ix;
  ix.first = idx.front().first;
  ix.count = static_cast<int64_t>(idx.size());
  const DataType i64 = DataType::kInt64;
  int64_t stride = 1;
  for (auto it = idx.rbegin(); it != idx.rend(); ++it) {
    const int64_t size = xs[it->first];
    ValueId t = it->second;
    SALUS_ASSIGN_OR_RETURN(t, Wrapped(t, size));
    if (stride != 1) {
      SALUS_ASSIGN_OR_RETURN(t, Emit("Mul", {t, Scalar(i64, static_cast<double>(stride))}));
    }
    if (ix.linear == kNoValue) {
      ix.linear = t;
    } else {
      SALUS_ASSIGN_OR_RETURN(ix.linear, Emit("Add", {t, ix.linear}));
    }
    stride *= size;
  }
  Shape flat(xs.begin(), xs.begin() + ix.first);
  flat.push_back(stride);
  flat.insert(flat.end(), xs.begin() + ix.first + ix.count, xs.end());
  SALUS_ASSIGN_OR_RETURN(ix.flat, ReshapeTo(self, flat));
  return ix;
}

// Note [Embedding bags]: _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode,
// sparse, per_sample_weights, include_last_offset, padding_idx) -> (output, offset2bag,
// bag_size, max_indices) in sum (0) or mean (1) mode. Index i belongs to the last bag whose
// offset is at most i (counted from comparisons with the offsets); the rows weight[indices],
// times the per-sample weights and without padding_idx's, are scatter-added into their bags,
// and in mean mode divided by the bag's count (an empty bag stays 0). The backward gathers each
// index's bag gradient back, scaled the same way, and scatter-adds it into the weight's rows.
// Max mode, scale_grad_by_freq and sparse gradients are refused.
Status Lowerer::EmbeddingBag() {
  SALUS_ASSIGN_OR_RETURN(ValueId w, Tensor("weight"));
  SALUS_ASSIGN_OR_RETURN(ValueId idx, Tensor("indices"));
  SALUS_ASSIGN_OR_RETURN(ValueId offsets, Tensor("offsets"));
  SALUS_ASSIGN_OR_RETURN(int64_t mode, Int("mode"));
  SALUS_ASSIGN_OR_RETURN(ValueId psw, Tensor("per_sample_weights", true));
  bool last = false;
  SALUS_ASSIGN_OR_RETURN(last, BoolOr("include_last_offset", last));
  int64_t pad = -1;
  SALUS_ASSIGN_OR_RETURN(pad, IntOr("padding_idx", pad));
  if (mode != 0 && mode != 1) return Refuse("an embedding bag in max mode");
  const Shape ws = S(w);
  if (ws.size() != 2 || T(w) != DataType::kFloat32 || S(idx).size() != 1 ||
      S(offsets).size() != 1 || T(idx) != DataType::kInt64 || T(offsets) != DataType::kInt64) {
    return Bad(
        "an embedding bag needs a float [rows, dim] weight and 1-D int64 indices and "
        "offsets");
  }
  const int64_t n = S(idx)[0], bags = S(offsets)[0] - (last ? 1 : 0);
  if (bags < 0) return Bad("no offsets");
  const DataType f32 = DataType::kFloat32, i64 = DataType::kInt64;
  std::vector<int64_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = i;
  SALUS_ASSIGN_OR_RETURN(ValueId starts, Part(offsets, 0, bags, 0));
  SALUS_ASSIGN_OR_RETURN(starts, ReshapeTo(starts, {1, bags}));
  SALUS_ASSIGN_OR_RETURN(
      ValueId begun,
      Emit("LessOrEqual", {starts, Constant(HostTensor::FromInt64s({n, 1}, positions))}));
  SALUS_ASSIGN_OR_RETURN(begun, Cast(begun, f32));
  SALUS_ASSIGN_OR_RETURN(ValueId count, Reduce("ReduceSum", begun, {1}, false));
  SALUS_ASSIGN_OR_RETURN(ValueId bag_f, Emit("Sub", {count, Scalar(f32, 1)}));
  SALUS_ASSIGN_OR_RETURN(ValueId bag, Cast(bag_f, i64));
  SALUS_ASSIGN_OR_RETURN(ValueId rows, Emit("Gather", {w, idx}, {{"axis", IntAttr(0)}}));
  if (psw != kNoValue) {
    if (mode != 0) return Refuse("per-sample weights outside sum mode");
    SALUS_ASSIGN_OR_RETURN(ValueId pw, ReshapeTo(psw, {n, 1}));
    SALUS_ASSIGN_OR_RETURN(rows, Emit("Mul", {rows, pw}));
  }
  ValueId ones = Filled(f32, {n, 1}, 1);
  SALUS_ASSIGN_OR_RETURN(rows, WithoutPadding(rows, idx, pad, &ones));
  const std::map<std::string, Attribute> axis0 = {{"axis", IntAttr(0)}};
  SALUS_ASSIGN_OR_RETURN(ValueId out,
                         EmitShaped("SalusGatherGrad", {bag, rows}, axis0, f32, {bags, ws[1]}));
  SALUS_ASSIGN_OR_RETURN(ValueId sizes,
                         EmitShaped("SalusGatherGrad", {bag, ones}, axis0, f32, {bags, 1}));
  if (mode == 1) {
    SALUS_ASSIGN_OR_RETURN(ValueId divisor, Emit("Max", {sizes, Scalar(f32, 1)}));
    SALUS_ASSIGN_OR_RETURN(out, Emit("Div", {out, divisor}));
  }
  SALUS_RETURN_IF_ERROR(Bind(0, out));
  SALUS_ASSIGN_OR_RETURN(ValueId bag_size, ReshapeTo(sizes, {bags}));
  SALUS_ASSIGN_OR_RETURN(bag_size, Cast(bag_size, i64));
  // PyTorch leaves some of these results empty (offset2bag in sum mode): an empty result is
  // bound as such, and the backward finds the computed value through bag_results_.
  const ValueId results[3] = {bag, bag_size, kNoValue};
  for (int k = 1; k < 4 && k < Outputs(); ++k) {
    if (node_->outputs(k) < 0) continue;
    SALUS_ASSIGN_OR_RETURN(Shape declared, DeclaredShape(k));
    const ValueId made = results[k - 1];
    if (made != kNoValue && S(made) == declared) {
      SALUS_RETURN_IF_ERROR(Bind(k, made));
    } else {
      SALUS_RETURN_IF_ERROR(Bind(k, Filled(i64, declared, 0)));
    }
    if (made != kNoValue) bag_results_[node_->outputs(k)] = made;
  }
  return OkStatus();
}

StatusOr<ValueId> Lowerer::WithoutPadding(ValueId rows, ValueId idx, int64_t pad, ValueId* kept) {
  if (pad < 0) return rows;
  const int64_t n = NumElements(S(idx));
  SALUS_ASSIGN_OR_RETURN(ValueId is_pad,
                         Emit("Equal", {idx, Scalar(DataType::kInt64, static_cast<double>(pad))}));
  SALUS_ASSIGN_OR_RETURN(ValueId keep, Emit("Not", {is_pad}));
  SALUS_ASSIGN_OR_RETURN(keep, ReshapeTo(keep, {n, 1}));
  if (kept != nullptr) {
    SALUS_ASSIGN_OR_RETURN(*kept, Cast(keep, DataType::kFloat32));
  }
  return Emit("Where", {keep, rows, Scalar(DataType::kFloat32, 0)});
}

// _embedding_bag_dense_backward / _embedding_bag_backward (grad, indices, offset2bag,
// bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode, [sparse,]
// per_sample_weights, padding_idx): Note [Embedding bags].
Status Lowerer::EmbeddingBagBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId grad, Tensor("grad"));
  SALUS_ASSIGN_OR_RETURN(ValueId idx, Tensor("indices"));
  // offset2bag and bag_size as the forward computed them (Note [Embedding bags]).
  ValueId bag = kNoValue, bag_size = kNoValue;
  for (auto [name, v] : {std::pair<const char*, ValueId*>{"offset2bag", &bag},
                         std::pair<const char*, ValueId*>{"bag_size", &bag_size}}) {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* a, Arg(name));
    if (a->kind_case() != v1::AtenArgument::kValue || bag_results_.count(a->value()) == 0) {
      return Refuse(std::string(name) + " that is not an embedding bag's result");
    }
    *v = bag_results_.at(a->value());
  }
  SALUS_ASSIGN_OR_RETURN(int64_t rows_total, Int("num_weights"));
  SALUS_ASSIGN_OR_RETURN(bool by_freq, Bool("scale_grad_by_freq"));
  SALUS_ASSIGN_OR_RETURN(int64_t mode, Int("mode"));
  SALUS_ASSIGN_OR_RETURN(ValueId psw, Tensor("per_sample_weights", true));
  int64_t pad = -1;
  SALUS_ASSIGN_OR_RETURN(pad, IntOr("padding_idx", pad));
  if (!IsNone("sparse")) {
    SALUS_ASSIGN_OR_RETURN(bool sparse, Bool("sparse"));
    if (sparse) return Refuse("a sparse embedding bag gradient");
  }
  if (by_freq) return Refuse("an embedding bag gradient scaled by frequency");
  if (mode != 0 && mode != 1) return Refuse("an embedding bag in max mode");
  const Shape gs = S(grad);
  if (gs.size() != 2 || S(idx).size() != 1 || S(bag) != S(idx)) {
    return Bad("grad, indices and offset2bag do not fit an embedding bag");
  }
  const int64_t n = S(idx)[0];
  const DataType f32 = DataType::kFloat32;
  const std::map<std::string, Attribute> axis0 = {{"axis", IntAttr(0)}};
  SALUS_ASSIGN_OR_RETURN(ValueId rows, Emit("Gather", {grad, bag}, axis0));
  if (mode == 1) {
    SALUS_ASSIGN_OR_RETURN(ValueId size, Emit("Gather", {bag_size, bag}, axis0));
    SALUS_ASSIGN_OR_RETURN(size, Cast(size, f32));
    SALUS_ASSIGN_OR_RETURN(size, Emit("Max", {size, Scalar(f32, 1)}));
    SALUS_ASSIGN_OR_RETURN(size, ReshapeTo(size, {n, 1}));
    SALUS_ASSIGN_OR_RETURN(rows, Emit("Div", {rows, size}));
  }
  if (psw != kNoValue) {
    SALUS_ASSIGN_OR_RETURN(ValueId pw, ReshapeTo(psw, {n, 1}));
    SALUS_ASSIGN_OR_RETURN(rows, Emit("Mul", {rows, pw}));
  }
  SALUS_ASSIGN_OR_RETURN(rows, WithoutPadding(rows, idx, pad, nullptr));
  SALUS_ASSIGN_OR_RETURN(
      ValueId dw, EmitShaped("SalusGatherGrad", {idx, rows}, axis0, f32, {rows_total, gs[1]}));
  return Bind(0, dw);
}

Status Lowerer::Index() {
  SALUS_ASSIGN_OR_RETURN(ValueId self, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* list, Arg("indices"));
  SALUS_ASSIGN_OR_RETURN(Indexed ix, IndexTensors(self, *list));
  SALUS_ASSIGN_OR_RETURN(ValueId y,
                         Emit("Gather", {ix.flat, ix.linear}, {{"axis", IntAttr(ix.first)}}));
  return Bind(0, y);
}

// upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h, scales_w). Where
// each output size is a whole multiple k of the input's (and the scales, when given, are
// those k), each input element was copied into a k x k block, so its gradient is the block's
// sum. Other ratios (a U-Net's odd sizes) are the transposed 0/1 copy matrices per dim
// (ByMatrices with NearestMatrix): each input element gathers the gradients of the outputs
// that copied it.
Status Lowerer::UpsampleNearestBackward() {
  SALUS_ASSIGN_OR_RETURN(ValueId dy, Tensor("grad_output"));
  SALUS_ASSIGN_OR_RETURN(std::vector<int64_t> in, Ints("input_size"));
  const Shape ys = S(dy);
  if (in.size() != 4 || ys.size() != 4 || ys[0] != in[0] || ys[1] != in[1]) {
    return Bad("grad_output " + ShapeString(ys) + " does not fit input_size");
  }
  std::vector<int64_t> k;
  std::optional<double> scales[2];
  bool blocks_sum = true;
  for (int d = 2; d < 4; ++d) {
    const std::string scale = d == 2 ? "scales_h" : "scales_w";
    if (!IsNone(scale)) {
      SALUS_ASSIGN_OR_RETURN(scales[d - 2], Number(scale));
    }
    if (in[d] <= 0) return Bad("input_size " + ShapeString(in) + " is empty");
    k.push_back(ys[d] / in[d]);
    blocks_sum = blocks_sum && ys[d] % in[d] == 0 &&
                 (!scales[d - 2] || *scales[d - 2] == static_cast<double>(k.back()));
  }
  if (!blocks_sum) {
    SALUS_ASSIGN_OR_RETURN(ValueId dx,
                           ByMatrices(dy, in, true, "nearest resizing",
                                      [&](int64_t i, int64_t o, bool transposed, int dim) {
                                        return NearestMatrix(i, o, scales[dim - 2], transposed);
                                      }));
    return Bind(0, dx);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId blocks, ReshapeTo(dy, {in[0], in[1], in[2], k[0], in[3], k[1]}));
  SALUS_ASSIGN_OR_RETURN(ValueId dx, Reduce("ReduceSum", blocks, {3, 5}, false));
  return Bind(0, dx);
}

// A bool mask of `like`'s shape: true where the position along `dim` equals `index` (which
// has size 1 along `dim` and broadcasts along the others).
StatusOr<ValueId> Lowerer::OneHotAlong(ValueId index, int64_t dim, const Shape& like) {
  const Shape is = S(index);
  if (is.size() != like.size() || is[dim] != 1) {
    return Refuse("gather or scatter with an index that is not one position per slice");
  }
  for (size_t d = 0; d < is.size(); ++d) {
    if (static_cast<int64_t>(d) != dim && is[d] != like[d]) {
      return Refuse("gather or scatter with an index smaller than the tensor");
    }
  }
  Shape rs(like.size(), 1);
  rs[dim] = like[dim];
  std::vector<int64_t> positions(like[dim]);
  for (int64_t i = 0; i < like[dim]; ++i) positions[i] = i;
  const ValueId range = Constant(HostTensor::FromInt64s(rs, positions));
  SALUS_ASSIGN_OR_RETURN(index, Cast(index, DataType::kInt64));
  return Emit("Equal", {index, range});
}

// gather(self, dim, index) with one index per slice along dim (nll_loss's picking of the
// target's log-probability): a masked sum. An int64 or bool tensor, which has no gradient
// (BERT's token types gathered from a buffer), is the engine's GatherElements.
Status Lowerer::GatherOp() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(x).size()));
  SALUS_ASSIGN_OR_RETURN(ValueId index, Tensor("index"));
  if (T(x) != DataType::kFloat32) {
    SALUS_ASSIGN_OR_RETURN(index, Cast(index, DataType::kInt64));
    SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("GatherElements", {x, index}, {{"axis", IntAttr(dim)}}));
    return Bind(0, y);
  }
  if (!OnePerSlice(index, dim, S(x))) {  // any index shape: Note [Gathers by linear index]
    SALUS_ASSIGN_OR_RETURN(ValueId linear, LinearIndexAlong(index, dim, S(x)));
    SALUS_ASSIGN_OR_RETURN(ValueId flat, ReshapeTo(x, {NumElements(S(x))}));
    SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Gather", {flat, linear}, {{"axis", IntAttr(0)}}));
    return Bind(0, y);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId mask, OneHotAlong(index, dim, S(x)));
  SALUS_ASSIGN_OR_RETURN(ValueId picked, Emit("Where", {mask, x, Scalar(DataType::kFloat32, 0)}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Reduce("ReduceSum", picked, {dim}, true));
  return Bind(0, y);
}

// Whether `index` holds one position per slice of `like` along dim (nll_loss's form, which
// the masked sums and selects serve).
bool Lowerer::OnePerSlice(ValueId index, int64_t dim, const Shape& like) const {
  const Shape is = S(index);
  if (is.size() != like.size() || is[dim] != 1) return false;
  for (size_t d = 0; d < is.size(); ++d) {
    if (static_cast<int64_t>(d) != dim && is[d] != like[d]) return false;
  }
  return true;
}

// Note [Gathers by linear index]: gather(self, dim, index) reads self at each index element's
// own position with its coordinate along dim replaced by the index; so the elements' offsets
// in self flattened are index * stride(dim) plus each other dim's coordinate times its stride,
// added as broadcast constants. A Gather from the flattened tensor reads them, and
// scatter_add's SalusGatherGrad adds into them (in a fixed order, so results repeat exactly).
// Negative indices wrap (PyTorch refuses them).
StatusOr<ValueId> Lowerer::LinearIndexAlong(ValueId index, int64_t dim, const Shape& like) {
  const Shape is = S(index);
  if (T(index) != DataType::kInt64 || is.size() != like.size()) {
    return Bad("index must be int64 of the tensor's rank");
  }
  const DataType i64 = DataType::kInt64;
  std::vector<int64_t> stride(like.size(), 1);
  for (int d = static_cast<int>(like.size()) - 2; d >= 0; --d)
    stride[d] = stride[d + 1] * like[d + 1];
  for (size_t d = 0; d < is.size(); ++d) {
    if (static_cast<int64_t>(d) != dim && is[d] > like[d]) {
      return Bad("index is larger than the tensor along dim " + std::to_string(d));
    }
  }
  SALUS_ASSIGN_OR_RETURN(ValueId linear, Wrapped(index, like[dim]));
  SALUS_ASSIGN_OR_RETURN(linear,
                         Emit("Mul", {linear, Scalar(i64, static_cast<double>(stride[dim]))}));
  for (size_t d = 0; d < is.size(); ++d) {
    if (static_cast<int64_t>(d) == dim || is[d] == 1) continue;
    Shape along(is.size(), 1);
    along[d] = is[d];
    std::vector<int64_t> offsets(is[d]);
    for (int64_t i = 0; i < is[d]; ++i) offsets[i] = i * stride[d];
    SALUS_ASSIGN_OR_RETURN(linear,
                           Emit("Add", {linear, Constant(HostTensor::FromInt64s(along, offsets))}));
  }
  return linear;
}

// scatter_add(self, dim, index, src): src's elements (as many as index has) added into self at
// the positions Note [Gathers by linear index] gives.
Status Lowerer::ScatterAdd() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(ValueId index, Tensor("index"));
  SALUS_ASSIGN_OR_RETURN(ValueId src, Tensor("src"));
  if (T(x) != DataType::kFloat32) return Refuse("scatter_add into a non-float tensor");
  const Shape xs = S(x), is = S(index);
  if (xs.empty()) return Refuse("scatter_add into a 0-d tensor");
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, xs.size()));
  SALUS_ASSIGN_OR_RETURN(ValueId linear, FlatIndexAlong(index, dim, xs));
  SALUS_ASSIGN_OR_RETURN(src, Cast(src, DataType::kFloat32));
  const Shape ss = S(src);
  if (ss.size() != is.size()) return Bad("src and index differ in rank");
  if (ss != is) {  // only src's first index-shaped block is read
    std::vector<int64_t> starts(is.size(), 0), axes(is.size());
    for (size_t d = 0; d < is.size(); ++d) {
      if (is[d] > ss[d]) return Bad("index is larger than src");
      axes[d] = static_cast<int64_t>(d);
    }
    SALUS_ASSIGN_OR_RETURN(src, Emit("Slice", {src, Int64s(starts), Int64s(is), Int64s(axes)}));
  }
  SALUS_ASSIGN_OR_RETURN(ValueId added, AddedAt(linear, src, xs));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Add", {x, added}));
  return Bind(0, y);
}

// scatter(self, dim, index, value|src) with one index per slice along dim (nll_loss's
// gradient), or with a topk's indices along its dim (its gradient, a scatter into zeros):
// those positions are distinct, so writing src there is adding it into zeros at the positions
// of Note [Gathers by linear index], and self is kept where nothing was written.
Status Lowerer::Scatter() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("self"));
  SALUS_ASSIGN_OR_RETURN(int64_t dim, Int("dim"));
  SALUS_ASSIGN_OR_RETURN(dim, Axis(dim, S(x).size()));
  SALUS_ASSIGN_OR_RETURN(ValueId index, Tensor("index"));
  ValueId src = kNoValue;
  if (node_->op() == "aten.scatter.value") {
    SALUS_ASSIGN_OR_RETURN(src, TensorOrScalar("value", T(x)));
  } else {
    SALUS_ASSIGN_OR_RETURN(src, Tensor("src"));
    if (S(src) != S(index)) return Refuse("scatter with src shaped unlike index");
  }
  SALUS_ASSIGN_OR_RETURN(src, Cast(src, T(x)));
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* index_arg, Arg("index"));
  const auto distinct = index_arg->kind_case() == v1::AtenArgument::kValue
                            ? distinct_indices_.find(index_arg->value())
                            : distinct_indices_.end();
  if (!OnePerSlice(index, dim, S(x)) && distinct != distinct_indices_.end() &&
      distinct->second == dim && T(x) == DataType::kFloat32 && S(src) == S(index)) {
    const Shape xs = S(x);
    const DataType f32 = DataType::kFloat32;
    SALUS_ASSIGN_OR_RETURN(ValueId linear, FlatIndexAlong(index, dim, xs));
    SALUS_ASSIGN_OR_RETURN(ValueId placed, AddedAt(linear, src, xs));
    SALUS_ASSIGN_OR_RETURN(ValueId hits, AddedAt(linear, Filled(f32, S(linear), 1), xs));
    SALUS_ASSIGN_OR_RETURN(ValueId hit, Emit("Greater", {hits, Scalar(f32, 0.5)}));
    SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Where", {hit, placed, x}));
    return Bind(0, y);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId mask, OneHotAlong(index, dim, S(x)));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Emit("Where", {mask, src, x}));
  return Bind(0, y);
}

// native_dropout(input, p, train) -> (output, mask): only the identity forms.
Status Lowerer::Dropout() {
  SALUS_ASSIGN_OR_RETURN(ValueId x, Tensor("input"));
  SALUS_ASSIGN_OR_RETURN(double p, Number("p"));
  bool train = true;
  SALUS_ASSIGN_OR_RETURN(train, BoolOr("train", train));
  if (train && p != 0) return Refuse("dropout with p > 0 in training");
  SALUS_RETURN_IF_ERROR(Bind(0, x));
  if (Outputs() > 1 && node_->outputs(1) >= 0) {
    SALUS_RETURN_IF_ERROR(Bind(1, Filled(DataType::kBool, S(x), 1)));
  }
  return OkStatus();
}

// bernoulli.p(self, p) with the adaptor's draw index "salus_draw" = k: ones where a uniform
// draw of the stream (rng[0], rng[1] + k) is below p (Note [Random numbers] in the adaptor's
// trace.py; the graph's input "rng" holds the seed and the offset).
Status Lowerer::Empty() {
  if (Outputs() != 1 || node_->outputs(0) < 0) return Bad("empty without a result");
  SALUS_ASSIGN_OR_RETURN(Shape shape, DeclaredShape(0));
  if (TooManyElements(shape, int64_t{1} << 30)) return Bad("the tensor is too large");
  empties_.insert(node_->outputs(0));
  return OkStatus();
}

Status Lowerer::Bernoulli() {
  SALUS_ASSIGN_OR_RETURN(double p, Number("p"));
  SALUS_ASSIGN_OR_RETURN(int64_t k, Int("salus_draw"));
  if (!IsNone("generator")) return Refuse("bernoulli with a generator of its own");
  if (!(p >= 0 && p <= 1)) return Bad("p must be in [0, 1]");
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* self, Arg("self"));
  if (self->kind_case() != v1::AtenArgument::kValue || self->value() < 0 ||
      self->value() >= ag_.values_size()) {
    return Bad("'self' is not a tensor");
  }
  // Only self's shape matters: an `empty` stays unmade.
  const v1::AtenValue& like = ag_.values(self->value());
  const Shape shape(like.shape().begin(), like.shape().end());
  ValueId rng = graph_.Find("rng");
  if (rng == kNoValue || graph_.value(rng).kind != ValueKind::kInput ||
      T(rng) != DataType::kInt64 || S(rng) != Shape{2}) {
    return Bad("a random draw needs the graph's int64 [2] input 'rng'");
  }
  SALUS_ASSIGN_OR_RETURN(DataType type, DeclaredType(0));
  SALUS_ASSIGN_OR_RETURN(ValueId seed,
                         Emit("Add", {rng, Constant(HostTensor::FromInt64s({2}, {0, k}))}));
  Node n;
  n.op = "SalusPhiloxKeyCounter";
  n.name = NodeName();
  n.inputs = {seed};
  n.attrs["seed_bits"] = IntAttr(64);
  for (int64_t words : {1, 2}) {
    const ValueId v = NewValue(n.name, {words});
    graph_.value(v).type = DataType::kInt64;
    n.outputs.push_back(v);
  }
  const std::vector<ValueId> kc = n.outputs;
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  SALUS_ASSIGN_OR_RETURN(
      ValueId u, EmitShaped("SalusRandomUniform", {kc[0], kc[1]}, {}, DataType::kFloat32, shape));
  SALUS_ASSIGN_OR_RETURN(ValueId hit, Emit("Less", {u, Scalar(DataType::kFloat32, p)}));
  SALUS_ASSIGN_OR_RETURN(ValueId y, Cast(hit, type));
  return Bind(0, y);
}

// copy_(self, src) into a state value: the step's write of it.
Status Lowerer::CopyInto() {
  SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* self, Arg("self"));
  if (self->kind_case() != v1::AtenArgument::kValue) return Bad("'self' is not a tensor");
  SALUS_ASSIGN_OR_RETURN(ValueId var, ValueOf(self->value()));
  if (graph_.value(var).kind != ValueKind::kState) {
    return Refuse("copy_ into a value that is not state");
  }
  if (!written_.insert(self->value()).second) {
    return Bad("state value '" + graph_.value(var).name + "' is written twice");
  }
  SALUS_ASSIGN_OR_RETURN(ValueId src, Tensor("src"));
  SALUS_ASSIGN_OR_RETURN(src, Cast(src, T(var)));
  SALUS_ASSIGN_OR_RETURN(src, ExpandTo(src, S(var)));
  if (src == var) return Bind(0, var);
  Node n;
  n.op = "SalusAssign";
  n.name = NodeName();
  n.inputs = {var, src};
  n.attrs["mode"] = StringAttr("set");
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  return Bind(0, var);
}

// salus.sgd_update(param, grad, buf, lr, momentum, weight_decay, nesterov) -> (param, buf) and
// salus.adam_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps,
// weight_decay, decoupled) -> (param, exp_avg, exp_avg_sq, step): one optimizer update of one
// parameter (the adaptor's fused form of torch.optim's arithmetic). The engine's update
// kernels write the state in place, so the results are the state values themselves; no node
// may read the old values afterwards.
Status Lowerer::FusedUpdate() {
  const bool adam = node_->op() == "salus.adam_update.default";
  const std::vector<std::string> state_args =
      adam ? std::vector<std::string>{"param", "exp_avg", "exp_avg_sq", "step"}
           : std::vector<std::string>{"param", "buf"};
  std::vector<ValueId> state;
  for (const std::string& name : state_args) {
    SALUS_ASSIGN_OR_RETURN(const v1::AtenArgument* a, Arg(name));
    if (a->kind_case() != v1::AtenArgument::kValue) return Bad("'" + name + "' is not a tensor");
    SALUS_ASSIGN_OR_RETURN(ValueId v, ValueOf(a->value()));
    if (graph_.value(v).kind != ValueKind::kState || T(v) != DataType::kFloat32) {
      return Refuse("an update of '" + name + "' that is not a float state tensor");
    }
    if (last_read_[a->value()] > index_) {
      return Refuse("an update of '" + name + "' whose old value is read after it");
    }
    state.push_back(v);
  }
  SALUS_ASSIGN_OR_RETURN(ValueId grad, Tensor("grad"));
  SALUS_ASSIGN_OR_RETURN(ValueId lr, Tensor("lr"));
  if (S(grad) != S(state[0]) || T(grad) != DataType::kFloat32 || NumElements(S(lr)) != 1 ||
      T(lr) != DataType::kFloat32 || (adam && NumElements(S(state[3])) != 1)) {
    return Bad("gradient, learning rate or step of the wrong shape or type");
  }
  SALUS_ASSIGN_OR_RETURN(double wd, Number("weight_decay"));
  Node n;
  n.name = NodeName();
  n.attrs = {{"lr_input", IntAttr(1)}, {"weight_decay", FloatAttr(static_cast<float>(wd))}};
  if (adam) {
    SALUS_ASSIGN_OR_RETURN(double b1, Number("beta1"));
    SALUS_ASSIGN_OR_RETURN(double b2, Number("beta2"));
    SALUS_ASSIGN_OR_RETURN(double eps, Number("eps"));
    SALUS_ASSIGN_OR_RETURN(bool decoupled, Bool("decoupled"));
    n.op = "SalusAdamUpdate";
    n.inputs = {state[0], grad, state[1], state[2], state[3], lr};
    n.attrs["beta1"] = FloatAttr(static_cast<float>(b1));
    n.attrs["beta2"] = FloatAttr(static_cast<float>(b2));
    n.attrs["epsilon"] = FloatAttr(static_cast<float>(eps));
    n.attrs["decoupled_weight_decay"] = IntAttr(decoupled ? 1 : 0);
  } else {
    SALUS_ASSIGN_OR_RETURN(double momentum, Number("momentum"));
    SALUS_ASSIGN_OR_RETURN(bool nesterov, Bool("nesterov"));
    if (momentum == 0) return Refuse("a fused SGD update without momentum");
    n.op = "SalusSgdUpdate";
    n.inputs = {state[0], grad, state[1], lr};
    n.attrs["momentum"] = FloatAttr(static_cast<float>(momentum));
    n.attrs["nesterov"] = IntAttr(nesterov ? 1 : 0);
  }
  SALUS_RETURN_IF_ERROR(builder_.Add(std::move(n)));
  for (size_t k = 0; k < state.size(); ++k)
    SALUS_RETURN_IF_ERROR(Bind(static_cast<int>(k), state[k]));
  return OkStatus();
}

}  // namespace

StatusOr<Graph> AtenImporter::Import(const void* data, size_t size,
                                     const AtenImportOptions& options) {
  v1::AtenGraph ag;
  if (size > static_cast<size_t>(INT32_MAX) || !ag.ParseFromArray(data, static_cast<int>(size))) {
    return InvalidArgumentError(
        fmt::format("the ATen graph ({} bytes) is not a salus.v1.AtenGraph", size));
  }
  Lowerer lowerer(ag, options);
  return lowerer.Run();
}

std::vector<std::string> AtenImporter::SupportedOps() {
  std::vector<std::string> ops;
  for (const auto& [op, _] : Lowerer::Table()) ops.push_back(op);
  return ops;
}

}  // namespace salus::exec
