// Parameters the CPU forward and backward kernels of one op share (oneDNN descriptors derived
// from a node's attributes and shapes), and the loops both directions use.
#pragma once

#include <functional>
#include <initializer_list>
#include <oneapi/dnnl/dnnl.hpp>

#include "exec/element_math.h"
#include "exec/graph.h"
#include "exec/kernel.h"
#include "salus/status.h"

namespace salus::exec {

// Unimplemented unless the listed inputs (all present ones when empty) and every output are
// float32.
Status RequireFloat(const Node& n, const Graph& g, std::initializer_list<size_t> inputs = {});

// Pad's pads and constant value as both devices read them (shape inference has checked the
// pads): a float32 tensor, or an int64 one (labels shifted for a next-token loss).
struct PadSpec {
  std::vector<int64_t> pads;
  bool int64 = false;
  float float_value = 0.f;
  int64_t int_value = 0;
};
StatusOr<PadSpec> PadSpecOf(const Node& n, const Graph& g);

// Unimplemented unless Dropout node `n` passes its input through: ratio and training_mode are
// compile-time constants, and training mode drops nothing (ratio 0). Both devices' Dropout is a
// copy (and a mask of ones).
Status RequireDropoutIsIdentity(const Node& n, const Graph& g);

// The same dims with format_tag::any, for primitives that pick their own layout.
dnnl::memory::desc AnyLayout(const dnnl::memory::desc& d);

struct EltwiseSpec {
  dnnl::algorithm alg;
  float alpha = 0, beta = 0;
};
// The eltwise algorithm of a unary op (the op named by attribute "forward_op" for grads).
StatusOr<EltwiseSpec> EltwiseFor(const Node& n);
// oneDNN's backward of that algorithm over plain tensors of `shape`: inputs (X, dY), output dX.
std::unique_ptr<Kernel> EltwiseBackwardKernel(const EltwiseSpec& spec, const Shape& shape);

struct SoftmaxSpec {
  Shape shape;  // the shape the softmax runs over (2-D before opset 13)
  int axis = 0;
};
// `n` is a Softmax/LogSoftmax node or a grad node carrying its attributes; `x` its input.
StatusOr<SoftmaxSpec> SoftmaxFor(const Node& n, const Graph& g, ValueId x = kNoValue);

struct ConvSpec {
  dnnl::memory::desc src, weights, bias, dst;
  dnnl::memory::dims strides, dilates, pad_l, pad_r;
};
// For Conv/ConvTranspose (or a grad node carrying the forward attributes), given the forward
// X and W shapes (X's in NCHW terms: see ActivationShape).
StatusOr<ConvSpec> ConvFor(const Node& n, const Shape& xs, const Shape& ws, const std::string& op);
// The NCHW shape of an activation value `shape` of convolution node `n`: its NHWC shape
// reordered when the node is channels-last (Note [Channels-last convolutions] in fusion.h).
Shape ActivationShape(const Node& n, const Shape& shape);
// The OIHW shape of filter value `shape` of such a node: its HWIO shape reordered when the node
// reads HWIO.
Shape FilterShape(const Node& n, const Shape& shape);

struct PoolSpec {
  dnnl::algorithm alg;
  dnnl::memory::desc src, dst;
  dnnl::memory::dims strides, kernel, dilation, pad_l, pad_r;
};
StatusOr<PoolSpec> PoolFor(const Node& n, const Shape& xs, const std::string& op);

// Note [Blocked pooling]: oneDNN pools plain NCHW tensors with a loop of its own that is not
// vectorised ("simple_nchw"); in the channel-blocked layout (nChw8c, nChw16c with AVX-512) its
// JIT kernels do it. On an AVX2 machine a ResNet-shaped CNN's MaxPool took 6.9 ms of a 31.7 ms
// training step and its gradient 5.2 ms. So 4-D pooling runs blocked, its inputs and outputs
// reordered around it (the reorders are JIT kernels as well). The layout for `plain` (NCHW
// dims) that node `n` pools in: NHWC for a channels-last node (Note [Channels-last
// convolutions] in fusion.h), whose tensors are NHWC already and need no reorder, else blocked.
dnnl::memory::desc PoolLayout(const Node& n, const dnnl::memory::desc& plain);

// Note [Pooling taps]: SalusMaxPool's second output, Taps (int64, Y's shape), is what the
// device's SalusPoolGrad reads instead of finding each window's maximum again; its contents
// are the device's own and nothing else reads them. On the CPU it holds oneDNN's max-pooling
// workspace (a byte or an int per output element, in Y's blocked layout) when that fits in
// Taps' bytes; when it does not (an s32 workspace over a few channels padded to a block), the
// forward leaves Taps unwritten and the gradient runs the forward again, as SalusPoolGrad
// without Taps does. Both kernels decide from the same primitive descriptor, so they agree.
bool WorkspaceFitsTaps(const dnnl::memory::desc& workspace, const Shape& y);
// Both devices' check of the taps: SalusMaxPool's output Taps, or SalusPoolGrad's input Taps
// where given, are int64 with the pooled output's shape, and SalusPoolGrad takes them only
// after a max pooling. InvalidArgument naming the node otherwise.
Status CheckPoolTaps(const Node& n, const Graph& g);

// Calls fn(input offset, output offset) for every element of DepthToSpace over x (NCHW), in
// input order; the offsets are element_math.h's DepthToSpaceTarget.
void DepthToSpaceMap(const Shape& x, int64_t block, bool dcr,
                     const std::function<void(int64_t, int64_t)>& fn);

// SceSpec is element_math.h's, which the CUDA device shares.
StatusOr<SceSpec> SceFor(const Node& n, const Graph& g);
// log-probabilities into logp (n*c*d) and the loss into loss. Labels outside [0, c) count as
// ignored, so bad data cannot index out of bounds. Each row is element_math.h's SceRow, summed
// in row order.
void SceForward(const SceSpec& s, const float* scores, const int64_t* labels, const float* weights,
                float* logp, float* loss);

}  // namespace salus::exec
