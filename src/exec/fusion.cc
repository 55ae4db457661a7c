#include "exec/fusion.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace salus::exec {

// How many nodes read each value; values that must stay materialised (fetches, graph outputs)
// count as read twice more, so no rewrite takes them for a single-consumer intermediate.
std::vector<int> ReadCounts(const Graph& g, const std::vector<ValueId>& keep) {
  std::vector<int> consumers(g.values().size(), 0);
  for (const Node& n : g.nodes()) {
    for (ValueId in : n.inputs) {
      if (in != kNoValue) ++consumers[in];
    }
  }
  for (ValueId id : keep) consumers[id] += 2;
  for (ValueId id : g.outputs()) consumers[id] += 2;
  return consumers;
}

bool WritesInPlace(const Node& n) {
  for (ValueId o : n.outputs) {
    if (o != kNoValue) return false;
  }
  return true;
}

// Drops the nodes marked dead and renumbers the producers of the rest.
void RemoveNodes(Graph* graph, const std::vector<bool>& dead) {
  Graph& g = *graph;
  std::vector<Node> live;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!dead[i]) live.push_back(std::move(g.nodes()[i]));
  }
  g.nodes() = std::move(live);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (ValueId o : g.nodes()[i].outputs) {
      if (o != kNoValue) g.value(o).producer = static_cast<int>(i);
    }
  }
}

namespace {

int CountDead(const std::vector<bool>& dead) {
  int n = 0;
  for (bool d : dead) n += d ? 1 : 0;
  return n;
}

// `node` (the single consumer of `producer`'s first output `v`) is absorbed: the producer now
// writes the node's output instead.
void Absorb(Graph* graph, Node* producer, const Node& node, ValueId v) {
  producer->outputs[0] = node.outputs[0];
  graph->value(v).producer = -1;
}

// The float contents of a compile-time constant, or nullptr.
const HostTensor* ConstantFloats(const Graph& g, ValueId id) {
  if (id == kNoValue) return nullptr;
  const Value& v = g.value(id);
  if (v.kind != ValueKind::kConstant || v.type != DataType::kFloat32) return nullptr;
  if (v.data.bytes.size() != v.bytes()) return nullptr;
  return &v.data;
}

// The bounds of a Clip whose min and max are known at compile time (attributes before opset
// 11, constant scalar inputs from it); false otherwise.
bool ConstantClipBounds(const Graph& g, const Node& clip, float* lo, float* hi) {
  if (g.opset() < 11) {
    *lo = clip.GetFloat("min", std::numeric_limits<float>::lowest());
    *hi = clip.GetFloat("max", std::numeric_limits<float>::max());
    return true;
  }
  *lo = -std::numeric_limits<float>::infinity();
  *hi = std::numeric_limits<float>::infinity();
  for (size_t i = 1; i < 3; ++i) {
    if (clip.input(i) == kNoValue) continue;
    const HostTensor* t = ConstantFloats(g, clip.input(i));
    if (t == nullptr || t->num_elements() != 1) return false;
    (i == 1 ? *lo : *hi) = t->floats()[0];
  }
  return *lo <= *hi;
}

}  // namespace

// Note [BatchNorm folding]: an inference BatchNormalization after a Conv is
// y = (conv(x, W) + B - mean) * s + b with s = scale / sqrt(var + eps) per output channel, which
// is conv(x, W * s) + (B - mean) * s + b. The folded weights and bias are new constants (W may
// be read elsewhere); the originals, no longer read, drop out of persistent memory.
int FoldBatchNorm(Graph* graph, const FusionOptions& options) {
  Graph& g = *graph;
  const std::vector<int> consumers = ReadCounts(g, options.keep);
  std::vector<bool> dead(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& bn = g.nodes()[i];
    if (bn.op != "BatchNormalization" || bn.inputs.size() != 5) continue;
    if (bn.GetInt("training_mode", 0) != 0) continue;
    bool extra_outputs = false;
    for (size_t o = 1; o < bn.outputs.size(); ++o) extra_outputs |= bn.outputs[o] != kNoValue;
    if (extra_outputs) continue;
    const ValueId v = bn.inputs[0];
    const int p = g.value(v).producer;
    if (p < 0 || consumers[v] != 1 || g.nodes()[p].op != "Conv") continue;
    Node& conv = g.nodes()[p];
    if (conv.Has("fused_activation") || conv.input(3) != kNoValue) continue;
    const HostTensor* w = ConstantFloats(g, conv.inputs[1]);
    const HostTensor* b = conv.input(2) == kNoValue ? nullptr : ConstantFloats(g, conv.inputs[2]);
    if (w == nullptr || (conv.input(2) != kNoValue && b == nullptr)) continue;
    const HostTensor* scale = ConstantFloats(g, bn.inputs[1]);
    const HostTensor* shift = ConstantFloats(g, bn.inputs[2]);
    const HostTensor* mean = ConstantFloats(g, bn.inputs[3]);
    const HostTensor* var = ConstantFloats(g, bn.inputs[4]);
    if (!scale || !shift || !mean || !var || w->shape.empty()) continue;
    const int64_t channels = w->shape[0];
    if (scale->num_elements() != channels || shift->num_elements() != channels ||
        mean->num_elements() != channels || var->num_elements() != channels) {
      continue;
    }
    const float eps = bn.GetFloat("epsilon", 1e-5f);
    HostTensor folded_w(DataType::kFloat32, w->shape);
    HostTensor folded_b(DataType::kFloat32, {channels});
    const int64_t per_channel = channels > 0 ? w->num_elements() / channels : 0;
    for (int64_t c = 0; c < channels; ++c) {
      const float s = scale->floats()[c] / std::sqrt(var->floats()[c] + eps);
      for (int64_t e = 0; e < per_channel; ++e) {
        folded_w.floats()[c * per_channel + e] = w->floats()[c * per_channel + e] * s;
      }
      const float bias = b != nullptr ? b->floats()[c] : 0.f;
      folded_b.floats()[c] = (bias - mean->floats()[c]) * s + shift->floats()[c];
    }
    const std::string stem = conv.name.empty() ? std::string("conv") : conv.name;
    Value wv;
    wv.name = g.UniqueName(stem + ".folded_weight");
    wv.shape = folded_w.shape;
    wv.kind = ValueKind::kConstant;
    wv.data = std::move(folded_w);
    Value bv;
    bv.name = g.UniqueName(stem + ".folded_bias");
    bv.shape = folded_b.shape;
    bv.kind = ValueKind::kConstant;
    bv.data = std::move(folded_b);
    // AddValue may move the value table: no Value references are held past this point.
    const ValueId wid = g.AddValue(std::move(wv));
    const ValueId bid = g.AddValue(std::move(bv));
    Node& c = g.nodes()[p];
    c.inputs.resize(3, kNoValue);
    c.inputs[1] = wid;
    c.inputs[2] = bid;
    Absorb(&g, &c, g.nodes()[i], v);
    dead[i] = true;
  }
  RemoveNodes(&g, dead);
  return CountDead(dead);
}

// Note [Fused bias]: Add(conv(x), b), b one value per output channel (TensorFlow's BiasAdd
// after a convolution, on NHWC activations when the Conv is channels-last), becomes the Conv's
// bias input, so the sum is made as the convolution writes (and a Relu after it fuses too). When
// b is computed after the Conv, the Conv moves to the Add's place. CPU only.
int FuseConvBias(Graph* graph, const FusionOptions& options) {
  if (options.device != DeviceType::kCpu) return 0;
  Graph& g = *graph;
  const std::vector<int> consumers = ReadCounts(g, options.keep);
  std::vector<bool> dead(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& add = g.nodes()[i];
    if (add.op != "Add" || add.inputs.size() != 2 || add.outputs.size() != 1) continue;
    for (int k = 0; k < 2; ++k) {
      const ValueId v = add.inputs[k], b = add.inputs[1 - k];
      const int p = g.value(v).producer;
      if (p < 0 || dead[p] || consumers[v] != 1 || v == b) continue;
      Node& conv = g.nodes()[p];
      if (conv.op != "Conv" || conv.input(2) != kNoValue || conv.input(3) != kNoValue ||
          conv.Has("fused_activation")) {
        continue;
      }
      const Shape& out = g.value(v).shape;
      if (out.size() != 4 || g.value(add.outputs[0]).shape != out) continue;
      if (g.value(v).type != DataType::kFloat32 || g.value(b).type != DataType::kFloat32) continue;
      // The channel dim: last when the Conv writes NHWC, else the second.
      const size_t c = conv.Has(kChannelsLastAttr) ? 3 : 1;
      Shape bs = g.value(b).shape;
      if (bs.size() > out.size()) continue;
      while (bs.size() < out.size()) bs.insert(bs.begin(), 1);
      bool per_channel = true;
      for (size_t d = 0; d < out.size(); ++d) per_channel &= bs[d] == (d == c ? out[c] : 1);
      if (!per_channel) continue;
      const int bp = g.value(b).producer;
      if (bp < p) {
        conv.inputs.resize(3, kNoValue);
        conv.inputs[2] = b;
        Absorb(&g, &conv, add, v);
        dead[i] = true;
        break;
      }
      // b is made after the Conv (a Squeeze of the bias variable's read): the Conv runs where
      // the Add did instead, unless something in between writes in place (a node without
      // outputs), which might change what it reads.
      bool effects = false;
      for (size_t j = p + 1; j < i; ++j) effects |= WritesInPlace(g.nodes()[j]);
      if (effects || bp >= static_cast<int>(i)) continue;
      Node moved = conv;
      moved.inputs.resize(3, kNoValue);
      moved.inputs[2] = b;
      moved.outputs[0] = add.outputs[0];
      g.value(v).producer = -1;
      g.nodes()[i] = std::move(moved);
      dead[p] = true;
      break;
    }
  }
  RemoveNodes(&g, dead);
  return CountDead(dead);
}

// Inference only: the Relu's (or Clip's) gradient needs its input, which this removes.
int FuseActivations(Graph* graph, const FusionOptions& options) {
  Graph& g = *graph;
  const std::vector<int> consumers = ReadCounts(g, options.keep);
  std::vector<bool> dead(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& act = g.nodes()[i];
    if ((act.op != "Relu" && act.op != "Clip") || act.outputs.size() != 1) continue;
    const ValueId v = act.inputs[0];
    const int p = g.value(v).producer;
    if (p < 0 || consumers[v] != 1 || g.value(v).type != DataType::kFloat32) continue;
    Node& producer = g.nodes()[p];
    if (producer.op != "Conv" && producer.op != "Gemm") continue;
    if (producer.Has("fused_activation") || producer.input(3) != kNoValue) continue;
    if (act.op == "Relu") {
      producer.attrs["fused_activation"] = StringAttr("Relu");
    } else {
      float lo = 0, hi = 0;
      // Clip only into a Conv; cuDNN's clipped Relu has a lower bound of 0.
      if (producer.op != "Conv" || !ConstantClipBounds(g, act, &lo, &hi)) continue;
      if (options.device == DeviceType::kCuda && lo != 0.f) continue;
      producer.attrs["fused_activation"] = StringAttr("Clip");
      producer.attrs["fused_min"] = FloatAttr(lo);
      producer.attrs["fused_max"] = FloatAttr(hi);
    }
    Absorb(&g, &producer, act, v);
    dead[i] = true;
  }
  RemoveNodes(&g, dead);
  return CountDead(dead);
}

// Note [Fused residual sum]: Add(conv(x), other) becomes a Conv with `other` as its fourth
// input; the kernel seeds its destination with `other` and accumulates the convolution into
// it (oneDNN's sum post-op), then applies any fused activation (a Relu right after the Add is
// absorbed too). The Conv must come after `other`'s producer, so that `other` is computed when
// it runs: of two Conv operands the later one is fused. `other` stays an ordinary input, read
// before the destination is written, and is planned apart from the output like any input.
int FuseResidualAdd(Graph* graph, const FusionOptions& options) {
  if (options.device != DeviceType::kCpu) return 0;
  Graph& g = *graph;
  std::vector<int> consumers = ReadCounts(g, options.keep);
  std::vector<bool> dead(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& add = g.nodes()[i];
    if (add.op != "Add" || add.inputs.size() != 2 || add.outputs.size() != 1) continue;
    const Shape& out = g.value(add.outputs[0]).shape;
    int chosen = -1;
    for (int k = 0; k < 2; ++k) {
      const ValueId v = add.inputs[k], other = add.inputs[1 - k];
      const int p = g.value(v).producer;
      if (p < 0 || dead[p] || consumers[v] != 1 || v == other) continue;
      const Node& conv = g.nodes()[p];
      if (conv.op != "Conv" || conv.Has("fused_activation") || conv.input(3) != kNoValue) continue;
      if (g.value(v).type != DataType::kFloat32 || g.value(v).shape != out ||
          g.value(other).shape != out || g.value(other).type != DataType::kFloat32) {
        continue;
      }
      if (g.value(other).producer >= p) continue;  // not computed yet when the Conv runs
      if (chosen < 0 || p > g.value(add.inputs[chosen]).producer) chosen = k;
    }
    if (chosen < 0) continue;
    const ValueId v = add.inputs[chosen], other = add.inputs[1 - chosen];
    const int p = g.value(v).producer;
    Node& conv = g.nodes()[p];
    conv.inputs.resize(4, kNoValue);
    conv.inputs[3] = other;
    Absorb(&g, &conv, add, v);
    dead[i] = true;
    // A Relu that alone reads the sum becomes the Conv's activation, after the sum.
    const ValueId sum = conv.outputs[0];
    if (consumers[sum] != 1) continue;
    for (size_t j = i + 1; j < g.nodes().size(); ++j) {
      const Node& relu = g.nodes()[j];
      if (relu.op != "Relu" || relu.inputs[0] != sum || relu.outputs.size() != 1) continue;
      conv.attrs["fused_activation"] = StringAttr("Relu");
      Absorb(&g, &conv, relu, sum);
      dead[j] = true;
      break;
    }
  }
  RemoveNodes(&g, dead);
  return CountDead(dead);
}

Shape NchwOf(const Shape& shape) {
  return shape.size() == 4 ? Shape{shape[0], shape[3], shape[1], shape[2]} : shape;
}

int AdoptChannelsLast(Graph* graph, const FusionOptions& options) {
  if (options.device != DeviceType::kCpu) return 0;
  Graph& g = *graph;
  std::vector<Node>& nodes = g.nodes();
  std::vector<bool> kept(g.values().size(), false);
  for (ValueId v : options.keep) kept[v] = true;
  for (ValueId v : g.outputs()) kept[v] = true;
  std::vector<std::vector<int>> readers(g.values().size());
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    for (ValueId v : nodes[i].inputs) {
      if (v != kNoValue) readers[v].push_back(i);
    }
  }
  const std::vector<int64_t> to_nchw = {0, 3, 1, 2}, to_nhwc = {0, 2, 3, 1};
  auto transpose = [&](int i, const std::vector<int64_t>& perm) {
    const Node& t = nodes[i];
    return t.op == "Transpose" && t.inputs.size() == 1 && t.outputs.size() == 1 &&
           t.GetInts("perm") == perm;
  };
  // The NHWC tensor a Transpose turned into `v`, or kNoValue.
  auto nhwc_source = [&](ValueId v) -> ValueId {
    if (v == kNoValue || g.value(v).shape.size() != 4) return kNoValue;
    const int p = g.value(v).producer;
    return p >= 0 && transpose(p, to_nchw) ? nodes[p].inputs[0] : kNoValue;
  };
  // Whether every reader of `v` is a Transpose by `perm`, and none of that is kept.
  auto read_as = [&](ValueId v, const std::vector<int64_t>& perm) {
    if (v == kNoValue || kept[v] || readers[v].empty()) return false;
    for (int r : readers[v]) {
      if (!transpose(r, perm) || kept[nodes[r].outputs[0]]) return false;
    }
    return true;
  };
  auto read_as_nhwc = [&](ValueId v) { return read_as(v, to_nhwc); };
  const std::vector<int64_t> hwio_to_oihw = {3, 2, 0, 1}, oihw_to_hwio = {2, 3, 1, 0};
  std::vector<ValueId> remap(g.values().size(), kNoValue);
  int changed = 0;
  for (Node& n : nodes) {
    const bool conv = n.op == "Conv" || n.op == "SalusConvGradData";
    const bool weights = n.op == "SalusConvGradWeights";
    // Pools without taps: their workspace's layout would have to agree between the two nodes.
    const bool pool = (n.op == "MaxPool" || n.op == "AveragePool") && n.outputs.size() == 1;
    const bool pool_grad = n.op == "SalusPoolGrad" && n.input(2) == kNoValue;
    if (!(conv || weights || pool || pool_grad) || n.Has(kChannelsLastAttr) || n.Has("src_block") ||
        n.Has("dst_block") || n.input(3) != kNoValue || n.inputs.empty() || n.outputs.empty() ||
        g.value(n.inputs[0]).shape.size() != 4) {
      continue;
    }
    // Nodes reading two activations (X and dY); all but the weight gradient write one.
    const bool two = weights || pool_grad;
    const ValueId a = nhwc_source(n.inputs[0]);
    const ValueId b = two ? nhwc_source(n.input(1)) : kNoValue;
    if (a == kNoValue || (two && b == kNoValue) || (!weights && !read_as_nhwc(n.outputs[0]))) {
      continue;
    }
    n.inputs[0] = a;
    if (two) n.inputs[1] = b;
    if (!weights) {
      const ValueId y = n.outputs[0];
      Value& out = g.value(y);
      out.shape = {out.shape[0], out.shape[2], out.shape[3], out.shape[1]};
      for (int r : readers[y]) remap[nodes[r].outputs[0]] = y;
    }
    n.attrs[kChannelsLastAttr] = IntAttr(1);
    ++changed;
    // The filter: HWIO read (or, for the weight gradient, written) in place of the Transposes to
    // and from OIHW around it.
    if (conv) {
      const ValueId w = n.inputs[1];
      const int p = w != kNoValue ? g.value(w).producer : -1;
      if (p >= 0 && transpose(p, hwio_to_oihw) && g.value(w).shape.size() == 4) {
        n.inputs[1] = nodes[p].inputs[0];
        n.attrs[kFilterHwioAttr] = IntAttr(1);
      }
    } else if (weights && n.outputs.size() == 1 && read_as(n.outputs[0], oihw_to_hwio)) {
      const ValueId dw = n.outputs[0];
      Value& out = g.value(dw);
      out.shape = {out.shape[2], out.shape[3], out.shape[1], out.shape[0]};
      for (int r : readers[dw]) remap[nodes[r].outputs[0]] = dw;
      n.attrs[kFilterHwioAttr] = IntAttr(1);
    }
  }
  for (Node& n : nodes) {
    for (ValueId& v : n.inputs) {
      if (v != kNoValue && remap[v] != kNoValue) v = remap[v];
    }
  }
  return changed;
}

Shape OihwOf(const Shape& hwio) {
  return hwio.size() == 4 ? Shape{hwio[3], hwio[2], hwio[0], hwio[1]} : hwio;
}

int KeepBlockedLayouts(Graph* graph, const FusionOptions& options, int64_t block) {
  Graph& g = *graph;
  const int num_values = static_cast<int>(g.values().size());
  std::vector<bool> kept(num_values, false);
  for (ValueId id : options.keep) kept[id] = true;
  for (ValueId id : g.outputs()) kept[id] = true;
  // Candidates: a Conv's 4-D float output, channels a whole number of blocks, read only by
  // Convs, as their X or as the other operand of their fused sum.
  std::vector<bool> blocked(num_values, false);
  for (ValueId id = 0; id < num_values; ++id) {
    const Value& v = g.value(id);
    blocked[id] = !kept[id] && v.kind == ValueKind::kIntermediate && v.producer >= 0 &&
                  v.type == DataType::kFloat32 && v.shape.size() == 4 && v.shape[1] % block == 0 &&
                  g.nodes()[v.producer].op == "Conv";
  }
  for (const Node& n : g.nodes()) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      if (v != kNoValue && !(n.op == "Conv" && (i == 0 || i == 3))) blocked[v] = false;
    }
  }
  // A fused sum starts from its other operand in the destination's layout: both are blocked
  // or neither is.
  for (bool changed = true; changed;) {
    changed = false;
    for (const Node& n : g.nodes()) {
      if (n.op != "Conv" || n.input(3) == kNoValue) continue;
      const ValueId other = n.inputs[3], out = n.outputs[0];
      if (blocked[other] != blocked[out]) {
        blocked[other] = blocked[out] = false;
        changed = true;
      }
    }
  }
  int count = 0;
  for (Node& n : g.nodes()) {
    if (n.op != "Conv") continue;
    if (blocked[n.inputs[0]]) n.attrs["src_block"] = IntAttr(block);
    if (blocked[n.outputs[0]]) {
      n.attrs["dst_block"] = IntAttr(block);
      ++count;
    }
  }
  return count;
}

namespace {

// A Transpose's permutation for an input of `rank` dims (ONNX's default reverses them).
std::vector<int64_t> PermOf(const Node& t, size_t rank) {
  std::vector<int64_t> perm = t.GetInts("perm");
  if (perm.empty()) {
    for (size_t i = 0; i < rank; ++i) perm.push_back(static_cast<int64_t>(rank - 1 - i));
  }
  return perm;
}

bool SwapsLastTwo(const std::vector<int64_t>& perm) {
  const size_t rank = perm.size();
  if (rank < 2) return false;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return perm[rank - 2] == static_cast<int64_t>(rank - 1) &&
         perm[rank - 1] == static_cast<int64_t>(rank - 2);
}

// The Transpose node producing `v`, or nullptr.
const Node* TransposeOf(const Graph& g, ValueId v) {
  const int p = g.value(v).producer;
  if (p < 0) return nullptr;
  const Node& t = g.nodes()[p];
  return t.op == "Transpose" && t.inputs.size() == 1 ? &t : nullptr;
}

}  // namespace

// Note [Transposed operands] (fusion.h).
int FoldTransposes(Graph* graph, const FusionOptions& options, size_t* boundary) {
  Graph& g = *graph;
  std::vector<bool> kept(g.values().size(), false);
  for (ValueId id : options.keep) kept[id] = true;
  for (ValueId id : g.outputs()) kept[id] = true;
  // Chains first, in graph order, so that each Transpose already reads its chain's root. A
  // Transpose that ends up leaving its input as it is (a chain that undoes itself: a layout
  // made contiguous and turned back) is read through: its readers read the input.
  std::vector<ValueId> same(g.values().size(), kNoValue);
  for (Node& n : g.nodes()) {
    if (n.op != "Transpose" || n.inputs.size() != 1) continue;
    const Node* inner = TransposeOf(g, n.inputs[0]);
    const ValueId root = inner == nullptr ? n.inputs[0] : inner->inputs[0];
    const size_t rank = g.value(root).shape.size();
    std::vector<int64_t> perm = PermOf(n, rank);
    if (perm.size() != rank) continue;
    if (inner != nullptr) {
      const std::vector<int64_t> first = PermOf(*inner, rank);
      if (first.size() != rank) continue;
      bool valid = true;
      for (size_t i = 0; i < rank && valid; ++i) {
        valid = perm[i] >= 0 && perm[i] < static_cast<int64_t>(rank);
        if (valid) perm[i] = first[perm[i]];
      }
      if (!valid) continue;
      n.inputs[0] = root;
      n.attrs["perm"] = IntsAttr(perm);
    }
    bool identity = true;
    for (size_t i = 0; i < rank; ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
    if (identity && n.outputs.size() == 1 && !kept[n.outputs[0]]) same[n.outputs[0]] = root;
  }
  for (Node& n : g.nodes()) {
    if (n.op == "Transpose") continue;
    for (ValueId& in : n.inputs) {
      while (in != kNoValue && same[in] != kNoValue) in = same[in];
    }
  }
  for (Node& n : g.nodes()) {
    const bool gemm = n.op == "Gemm";
    if (n.op != "MatMul" && !gemm) continue;
    for (size_t i = 0; i < 2 && i < n.inputs.size(); ++i) {
      const Node* t = n.inputs[i] == kNoValue ? nullptr : TransposeOf(g, n.inputs[i]);
      if (t == nullptr) continue;
      const ValueId x = t->inputs[0];
      const size_t rank = g.value(x).shape.size();
      if ((gemm && rank != 2) || !SwapsLastTwo(PermOf(*t, rank))) continue;
      const char* attr =
          gemm ? (i == 0 ? "transA" : "transB") : (i == 0 ? kMatMulTransA : kMatMulTransB);
      n.attrs[attr] = IntAttr(n.GetInt(attr, 0) != 0 ? 0 : 1);
      n.inputs[i] = x;
    }
  }
  // Transposes nobody reads any more (last to first, so that a chain's inner ones go too).
  std::vector<int> reads = ReadCounts(g, options.keep);
  std::vector<bool> dead(g.nodes().size(), false);
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    if (n.op != "Transpose" || n.outputs.size() != 1 || reads[n.outputs[0]] != 0) continue;
    dead[i] = true;
    if (boundary != nullptr && i < *boundary) --*boundary;
    g.value(n.outputs[0]).producer = -1;
    for (ValueId in : n.inputs) {
      if (in != kNoValue) --reads[in];
    }
  }
  RemoveNodes(&g, dead);
  return CountDead(dead);
}

Status ApplyMatMulTransposes(const Node& n, Shape* a, Shape* b) {
  const bool ta = n.GetInt(kMatMulTransA, 0) != 0, tb = n.GetInt(kMatMulTransB, 0) != 0;
  if ((ta && a->size() < 2) || (tb && b->size() < 2)) {
    return InvalidArgumentError(n.Describe() + ": a transposed operand needs two dims or more");
  }
  if (ta) std::swap((*a)[a->size() - 2], a->back());
  if (tb) std::swap((*b)[b->size() - 2], b->back());
  return OkStatus();
}

void ApplyInferenceFusions(Graph* graph, const FusionOptions& options) {
  FoldBatchNorm(graph, options);
  FuseConvBias(graph, options);
  FuseActivations(graph, options);
  FuseResidualAdd(graph, options);
}

}  // namespace salus::exec
