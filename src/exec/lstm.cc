#include "exec/lstm.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace salus::exec {
namespace {

// The forward node's optional inputs the engine does not support.
constexpr size_t kSequenceLensInput = 4;
constexpr size_t kPeepholeInput = 7;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

Status CheckActivations(const Node& n, int64_t dirs) {
  if (n.Has("activation_alpha") || n.Has("activation_beta")) {
    return UnimplementedError(n.Describe() + ": activation_alpha/activation_beta");
  }
  if (!n.Has("activations")) return OkStatus();
  const Attribute& a = n.attrs.at("activations");
  std::vector<std::string> names = a.strings;
  if (a.kind == Attribute::Kind::kString) names = {a.s};
  bool ok = static_cast<int64_t>(names.size()) == 3 * dirs;
  for (size_t k = 0; ok && k < names.size(); ++k) {
    ok = Lower(names[k]) == (k % 3 == 0 ? "sigmoid" : "tanh");
  }
  if (ok) return OkStatus();
  std::string list;
  for (const std::string& s : names) list += (list.empty() ? "" : ",") + s;
  return UnimplementedError(n.Describe() + ": activations [" + list +
                            "]; only Sigmoid,Tanh,Tanh per direction are supported");
}

}  // namespace

Shape LstmSpec::YShape() const {
  return batch_major ? Shape{batch, seq, dirs, hidden} : Shape{seq, dirs, batch, hidden};
}

Shape LstmSpec::StateShape() const {
  return batch_major ? Shape{batch, dirs, hidden} : Shape{dirs, batch, hidden};
}

StatusOr<LstmSpec> LstmFor(const Node& n, const Graph& g, ValueId x, ValueId w, ValueId r,
                           ValueId b, ValueId initial_h, ValueId initial_c) {
  auto invalid = [&](const std::string& what) {
    return InvalidArgumentError(n.Describe() + ": " + what);
  };
  if (x == kNoValue || w == kNoValue || r == kNoValue) return invalid("X, W and R are required");
  for (ValueId id : {x, w, r, b, initial_h, initial_c}) {
    if (id != kNoValue && g.value(id).type != DataType::kFloat32) {
      return UnimplementedError(n.Describe() + ": input '" + g.value(id).name + "' of type " +
                                DataTypeName(g.value(id).type) + "; only float32");
    }
  }
  LstmSpec s;
  const std::string direction = n.GetString("direction", "forward");
  if (direction == "bidirectional") {
    s.dirs = 2;
  } else if (direction == "reverse") {
    s.reverse = true;
  } else if (direction != "forward") {
    return invalid("unknown direction '" + direction + "'");
  }
  const int64_t layout = n.GetInt("layout", 0);
  if (layout != 0 && layout != 1) return invalid("layout " + std::to_string(layout));
  if (layout == 1 && g.opset() < 14) return invalid("layout is an attribute from opset 14");
  s.batch_major = layout == 1;
  SALUS_RETURN_IF_ERROR(CheckActivations(n, s.dirs));
  if (n.Has("clip")) return UnimplementedError(n.Describe() + ": clip");
  if (n.GetInt("input_forget", 0) != 0) return UnimplementedError(n.Describe() + ": input_forget");

  const Shape& xs = g.value(x).shape;
  const Shape& ws = g.value(w).shape;
  const Shape& rs = g.value(r).shape;
  if (xs.size() != 3) return invalid("X must be 3-D, got " + ShapeString(xs));
  s.seq = s.batch_major ? xs[1] : xs[0];
  s.batch = s.batch_major ? xs[0] : xs[1];
  s.input = xs[2];
  if (ws.size() != 3 || ws[0] != s.dirs || ws[1] % 4 != 0 || ws[2] != s.input) {
    return invalid("W must be [" + std::to_string(s.dirs) + ", 4*hidden_size, " +
                   std::to_string(s.input) + "], got " + ShapeString(ws));
  }
  s.hidden = ws[1] / 4;
  if (n.Has("hidden_size") && n.GetInt("hidden_size", 0) != s.hidden) {
    return invalid("hidden_size " + std::to_string(n.GetInt("hidden_size", 0)) + " but W is " +
                   ShapeString(ws));
  }
  if (rs != Shape{s.dirs, 4 * s.hidden, s.hidden}) {
    return invalid("R must be " + ShapeString({s.dirs, 4 * s.hidden, s.hidden}) + ", got " +
                   ShapeString(rs));
  }
  s.has_b = b != kNoValue;
  if (s.has_b && g.value(b).shape != Shape{s.dirs, 8 * s.hidden}) {
    return invalid("B must be " + ShapeString({s.dirs, 8 * s.hidden}) + ", got " +
                   ShapeString(g.value(b).shape));
  }
  s.has_h0 = initial_h != kNoValue;
  s.has_c0 = initial_c != kNoValue;
  for (ValueId id : {initial_h, initial_c}) {
    if (id != kNoValue && g.value(id).shape != s.StateShape()) {
      return invalid("'" + g.value(id).name + "' must be " + ShapeString(s.StateShape()) +
                     ", got " + ShapeString(g.value(id).shape));
    }
  }
  return s;
}

StatusOr<LstmSpec> LstmForwardSpec(const Node& n, const Graph& g) {
  if (n.input(kSequenceLensInput) != kNoValue) {
    return UnimplementedError(n.Describe() + ": sequence_lens (all sequences must be full length)");
  }
  if (n.input(kPeepholeInput) != kNoValue) {
    return UnimplementedError(n.Describe() + ": peepholes (input P)");
  }
  return LstmFor(n, g, n.input(0), n.input(1), n.input(2), n.input(3), n.input(5), n.input(6));
}

StatusOr<LstmSpec> LstmGradSpec(const Node& n, const Graph& g) {
  SALUS_ASSIGN_OR_RETURN(LstmSpec spec, LstmFor(n, g, n.input(0), n.input(1), n.input(2),
                                                n.input(3), n.input(4), n.input(5)));
  const Shape state = spec.StateShape();
  const Shape grads_in[] = {spec.YShape(), state, state};
  for (size_t i = 0; i < 3; ++i) {
    const ValueId id = n.input(6 + i);
    if (id != kNoValue &&
        (g.value(id).shape != grads_in[i] || g.value(id).type != DataType::kFloat32)) {
      return InvalidArgumentError(n.Describe() + ": gradient input " + std::to_string(6 + i) +
                                  " is " + ShapeString(g.value(id).shape) + ", expected float " +
                                  ShapeString(grads_in[i]));
    }
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] == kNoValue) continue;
    if (n.input(i) == kNoValue) {
      return InvalidArgumentError(n.Describe() + ": output " + std::to_string(i) +
                                  " is the gradient of an absent input");
    }
    if (g.value(n.outputs[i]).shape != g.value(n.input(i)).shape) {
      return InvalidArgumentError(n.Describe() + ": output " + std::to_string(i) + " is " +
                                  ShapeString(g.value(n.outputs[i]).shape) + ", expected " +
                                  ShapeString(g.value(n.input(i)).shape));
    }
  }
  return spec;
}

Status InferLstmShapes(Graph* graph, const Node& n) {
  Graph& g = *graph;
  SALUS_ASSIGN_OR_RETURN(LstmSpec s, LstmForwardSpec(n, g));
  if (n.outputs.size() > 3) return InvalidArgumentError(n.Describe() + ": more than 3 outputs");
  bool any = false;
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] == kNoValue) continue;
    any = true;
    Value& v = g.value(n.outputs[i]);
    v.type = DataType::kFloat32;
    v.shape = i == 0 ? s.YShape() : s.StateShape();
  }
  if (!any) return InvalidArgumentError(n.Describe() + ": no output");
  return OkStatus();
}

}  // namespace salus::exec
