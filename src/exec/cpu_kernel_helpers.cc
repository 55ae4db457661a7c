#include "exec/cpu_kernel_helpers.h"

#include <cmath>

#include "exec/dnnl_kernel.h"
#include "exec/window.h"

namespace salus::exec {

using dnnl::algorithm;

Status RequireFloat(const Node& n, const Graph& g, std::initializer_list<size_t> inputs) {
  auto check = [&](ValueId id) -> Status {
    if (id == kNoValue) return OkStatus();
    const Value& v = g.value(id);
    if (v.type != DataType::kFloat32) {
      return UnimplementedError("node '" + n.name + "': op " + n.op + " on " +
                                DataTypeName(v.type) + " tensor '" + v.name + "'");
    }
    return OkStatus();
  };
  if (inputs.size() == 0) {
    for (ValueId id : n.inputs) SALUS_RETURN_IF_ERROR(check(id));
  } else {
    for (size_t i : inputs) SALUS_RETURN_IF_ERROR(check(n.input(i)));
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.op == "Dropout" && i == 1) continue;
    SALUS_RETURN_IF_ERROR(check(n.outputs[i]));
  }
  return OkStatus();
}

dnnl::memory::desc AnyLayout(const dnnl::memory::desc& d) {
  return dnnl::memory::desc(d.dims(), dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
}

StatusOr<EltwiseSpec> EltwiseFor(const Node& n) {
  const std::string op = n.GetString("forward_op", n.op);
  if (op == "Relu") return EltwiseSpec{algorithm::eltwise_relu, 0.f, 0.f};
  if (op == "LeakyRelu")
    return EltwiseSpec{algorithm::eltwise_relu, n.GetFloat("alpha", 0.01f), 0.f};
  if (op == "Sigmoid") return EltwiseSpec{algorithm::eltwise_logistic, 0.f, 0.f};
  if (op == "Tanh") return EltwiseSpec{algorithm::eltwise_tanh, 0.f, 0.f};
  if (op == "Exp") return EltwiseSpec{algorithm::eltwise_exp, 0.f, 0.f};
  if (op == "Log") return EltwiseSpec{algorithm::eltwise_log, 0.f, 0.f};
  if (op == "Sqrt") return EltwiseSpec{algorithm::eltwise_sqrt, 0.f, 0.f};
  if (op == "Neg") return EltwiseSpec{algorithm::eltwise_linear, -1.f, 0.f};
  if (op == "Abs") return EltwiseSpec{algorithm::eltwise_abs, 0.f, 0.f};
  if (op == "Elu") return EltwiseSpec{algorithm::eltwise_elu, n.GetFloat("alpha", 1.f), 0.f};
  if (op == "Softplus") return EltwiseSpec{algorithm::eltwise_soft_relu, 0.f, 0.f};
  return UnimplementedError("node '" + n.name + "': op " + op + " is not an eltwise op");
}

StatusOr<SoftmaxSpec> SoftmaxFor(const Node& n, const Graph& g, ValueId x) {
  if (x == kNoValue) x = n.inputs[0];
  const Shape& s = g.value(x).shape;
  const int64_t rank = s.size();
  const int opset = static_cast<int>(n.GetInt("opset", g.opset()));
  int64_t axis = n.GetInt("axis", opset >= 13 ? -1 : 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= std::max<int64_t>(rank, 1)) {
    return InvalidArgumentError(n.Describe() + ": axis out of range");
  }
  SoftmaxSpec spec;
  if (rank == 0) {
    spec.shape = {1};
    spec.axis = 0;
  } else if (opset >= 13) {
    spec.shape = s;
    spec.axis = static_cast<int>(axis);
  } else {
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= s[i];
    spec.shape = {outer, NumElements(s) / std::max<int64_t>(outer, 1)};
    spec.axis = 1;
  }
  return spec;
}

StatusOr<ConvSpec> ConvFor(const Node& n, const Shape& xs, const Shape& ws, const std::string& op) {
  const int64_t group = n.GetInt("group", 1);
  std::vector<int64_t> spatial(xs.begin() + 2, xs.end()), kernel(ws.begin() + 2, ws.end());
  ConvSpec c;
  Window win;
  Shape out;
  if (op == "Conv") {
    SALUS_ASSIGN_OR_RETURN(win, ComputeWindow(n, spatial, kernel, false));
    out = {xs[0], ws[0]};
    if (group == 1) {
      c.weights = PlainDesc(ws);
    } else {
      Shape gw = {group, ws[0] / group};
      gw.insert(gw.end(), ws.begin() + 1, ws.end());
      c.weights = PlainDesc(gw);
    }
    c.bias = PlainDesc({ws[0]});
  } else {
    SALUS_ASSIGN_OR_RETURN(win, ComputeTransposedWindow(n, spatial, kernel));
    const int64_t ocg = ws[1], icg = ws[0] / group, khw = NumElements(kernel);
    out = {xs[0], ocg * group};
    if (group == 1) {
      c.weights = StridedDesc({ocg, icg, kernel[0], kernel[1]}, {khw, ocg * khw, kernel[1], 1});
    } else {
      c.weights = StridedDesc({group, ocg, icg, kernel[0], kernel[1]},
                              {icg * ocg * khw, khw, ocg * khw, kernel[1], 1});
    }
    c.bias = PlainDesc({ocg * group});
  }
  out.insert(out.end(), win.out.begin(), win.out.end());
  c.src = PlainDesc(xs);
  c.dst = PlainDesc(out);
  for (size_t i = 0; i < win.rank(); ++i) {
    c.strides.push_back(win.strides[i]);
    c.dilates.push_back(win.dilations[i] - 1);
    c.pad_l.push_back(win.pad_begin[i]);
    c.pad_r.push_back(win.pad_end[i]);
  }
  return c;
}

StatusOr<PoolSpec> PoolFor(const Node& n, const Shape& xs, const std::string& op) {
  std::vector<int64_t> spatial(xs.begin() + 2, xs.end());
  PoolSpec p;
  Shape out = {xs[0], xs[1]};
  if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    p.alg = op == "GlobalMaxPool" ? algorithm::pooling_max : algorithm::pooling_avg_exclude_padding;
    for (int64_t s : spatial) {
      out.push_back(1);
      p.kernel.push_back(s);
      p.strides.push_back(1);
      p.dilation.push_back(0);
      p.pad_l.push_back(0);
      p.pad_r.push_back(0);
    }
  } else {
    SALUS_ASSIGN_OR_RETURN(Window win, ComputeWindow(n, spatial, n.GetInts("kernel_shape"),
                                                     n.GetInt("ceil_mode", 0) != 0));
    if (op == "MaxPool") {
      p.alg = algorithm::pooling_max;
    } else {
      p.alg = n.GetInt("count_include_pad", 0) != 0 ? algorithm::pooling_avg_include_padding
                                                    : algorithm::pooling_avg_exclude_padding;
      if (n.GetInt("ceil_mode", 0) != 0 && n.GetInt("count_include_pad", 0) != 0) {
        return UnimplementedError(n.Describe() + ": ceil_mode with count_include_pad");
      }
    }
    out.insert(out.end(), win.out.begin(), win.out.end());
    for (size_t i = 0; i < win.rank(); ++i) {
      p.kernel.push_back(win.kernel[i]);
      p.strides.push_back(win.strides[i]);
      p.dilation.push_back(win.dilations[i] - 1);
      p.pad_l.push_back(win.pad_begin[i]);
      p.pad_r.push_back(win.pad_end[i]);
    }
  }
  p.src = PlainDesc(xs);
  p.dst = PlainDesc(out);
  return p;
}

void DepthToSpaceMap(const Shape& x, int64_t b, bool dcr,
                     const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = x[0], c = x[1], h = x[2], w = x[3], co = c / (b * b);
  int64_t in = 0;
  for (int64_t in_n = 0; in_n < n; ++in_n) {
    for (int64_t ci = 0; ci < c; ++ci) {
      int64_t i, j, cc;
      if (dcr) {
        i = ci / (b * co);
        j = (ci / co) % b;
        cc = ci % co;
      } else {
        cc = ci / (b * b);
        i = (ci / b) % b;
        j = ci % b;
      }
      for (int64_t hh = 0; hh < h; ++hh) {
        const int64_t row = ((in_n * co + cc) * h * b + hh * b + i) * w * b;
        for (int64_t ww = 0; ww < w; ++ww) fn(in++, row + ww * b + j);
      }
    }
  }
}

StatusOr<SceSpec> SceFor(const Node& n, const Graph& g) {
  const Shape& s = g.value(n.inputs[0]).shape;
  SceSpec spec;
  spec.n = s[0];
  spec.c = s[1];
  for (size_t i = 2; i < s.size(); ++i) spec.d *= s[i];
  spec.has_ignore = n.Has("ignore_index");
  spec.ignore_index = n.GetInt("ignore_index", 0);
  const std::string red = n.GetString("reduction", "mean");
  spec.reduction = red == "mean" ? 0 : red == "sum" ? 1 : 2;
  return spec;
}

void SceForward(const SceSpec& s, const float* scores, const int64_t* labels, const float* weights,
                float* logp, float* loss) {
  double total = 0, weight_sum = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    for (int64_t j = 0; j < s.d; ++j) {
      const int64_t label = labels[i * s.d + j];
      float l = 0, wt = 0;
      // With no classes there is nothing to normalise and every label is out of range.
      if (s.c > 0) {
        const float* x = scores + i * s.c * s.d + j;
        float* lp = logp + i * s.c * s.d + j;
        float mx = -INFINITY;
        for (int64_t k = 0; k < s.c; ++k) mx = std::max(mx, x[k * s.d]);
        double sum = 0;
        for (int64_t k = 0; k < s.c; ++k) sum += std::exp(static_cast<double>(x[k * s.d] - mx));
        const float lse = mx + static_cast<float>(std::log(sum));
        for (int64_t k = 0; k < s.c; ++k) lp[k * s.d] = x[k * s.d] - lse;
        if (!(s.has_ignore && label == s.ignore_index) && label >= 0 && label < s.c) {
          wt = weights ? weights[label] : 1.f;
          l = -wt * lp[label * s.d];
        }
      }
      if (s.reduction == 2) loss[i * s.d + j] = l;
      total += l;
      weight_sum += wt;
    }
  }
  if (s.reduction == 1) loss[0] = static_cast<float>(total);
  if (s.reduction == 0) loss[0] = weight_sum > 0 ? static_cast<float>(total / weight_sum) : 0.f;
}

}  // namespace salus::exec
