// Inference graph rewrites: each replaces a chain of nodes with fewer nodes that compute the
// same values (to float rounding). Executable::Build runs them on inference compiles only,
// after the fetches are resolved; a training compile keeps every node (the backward pass reads
// the intermediates these rewrites remove). No rewrite removes a value that is fetched or is a
// graph output, nor one that another node still reads.
//
//   FoldBatchNorm: Conv -> BatchNormalization (inference form, scale/B/mean/var constants)
//     becomes one Conv whose weights and bias are the folded constants (Note [BatchNorm
//     folding]). Any device.
//   FuseConvBias: Conv -> Add(conv, b) with b one value per output channel becomes the Conv
//     with bias input b (Note [Fused bias]). CPU only.
//   FuseActivations: Conv or Gemm -> Relu, and Conv -> Clip with constant bounds (ReLU6),
//     become the Conv or Gemm with attribute `fused_activation` ("Relu" or "Clip", the bounds
//     in `fused_min`/`fused_max`). Any device: every Conv and Gemm kernel honours it.
//   FuseResidualAdd: Conv -> Add(conv, other) [-> Relu] becomes a Conv with a fourth input
//     `other` (after X, W and the optional B) that it adds to its output before the
//     activation (Note [Fused residual sum]). CPU only (the oneDNN sum post-op).
//
// ApplyInferenceFusions runs them in that order, so Conv -> BN -> Relu, Conv -> BiasAdd -> Relu
// and Conv -> BN -> Add -> Relu each become one Conv.
//
//   KeepBlockedLayouts (CPU, after the fusions; Note [Blocked layouts] in dnnl_kernel.h): a
//     Conv output read only by Convs stays in oneDNN's channel-blocked layout, so the reorders
//     to row-major and back between them disappear. It marks the Convs with `dst_block` and
//     `src_block` (the channel block).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "exec/device.h"
#include "exec/graph.h"

namespace salus::exec {

struct FusionOptions {
  DeviceType device = DeviceType::kCpu;
  // Values that must stay materialised (fetches); graph outputs are always kept.
  std::vector<ValueId> keep;
};

// Shared by the rewrites: how many nodes read each value, the values in `keep` and the graph
// outputs counting as read twice more (so none is taken for a single-reader intermediate); and
// dropping the nodes marked dead, renumbering the producers of the rest.
std::vector<int> ReadCounts(const Graph& g, const std::vector<ValueId>& keep);
// Whether `n` has no outputs: such a node (SalusAssign and its kind) writes in place, so a
// rewrite must not move a read of what it takes across it.
bool WritesInPlace(const Node& n);
void RemoveNodes(Graph* graph, const std::vector<bool>& dead);

// Each returns the number of nodes it removed. A pattern that does not qualify is left as it
// is: none of them fails.
int FoldBatchNorm(Graph* graph, const FusionOptions& options);
int FuseConvBias(Graph* graph, const FusionOptions& options);
int FuseActivations(Graph* graph, const FusionOptions& options);
int FuseResidualAdd(Graph* graph, const FusionOptions& options);

// fusion_seq.cc: the exporter's exact-GELU chain (Div/Mul by sqrt 2, Erf, Add 1, two Muls)
// becomes one Gelu node. Inference and training (before autodiff: Gelu has a gradient). Any
// device (the CPU and CUDA both have a Gelu kernel). Not run by ApplyInferenceFusions.
int FuseGelu(Graph* graph, const FusionOptions& options);

// Note [Transposed operands]: a Transpose of a Transpose becomes one Transpose of the first's
// input, or none when the two undo each other (the readers of the result, unless it is fetched
// or a graph output, read that input instead), and a Transpose that swaps only the last two dims
// and is read by a MatMul or a 2-D Gemm is folded into that product, which then reads the
// untransposed tensor with its last two strides swapped (MatMul's attributes kMatMulTransA /
// kMatMulTransB, Gemm's transA / transB toggled). A Transpose left unread, and neither fetched nor
// a graph output, is removed; one that something else still reads stays. Inference and training
// (after autodiff: it removes only values that nothing else reads), any device (the CPU and CUDA
// MatMul and Gemm kernels honour the attributes). Run by Executable::Build whenever it fuses; not
// part of ApplyInferenceFusions. `boundary`, when given, is a node index (a training graph's first
// backward node) moved to keep naming the same node.
inline constexpr const char* kMatMulTransA = "trans_a";
inline constexpr const char* kMatMulTransB = "trans_b";
int FoldTransposes(Graph* graph, const FusionOptions& options, size_t* boundary = nullptr);

// The shapes MatMul node `n` reads: `a` and `b` (its inputs' shapes) with their last two dims
// swapped where kMatMulTransA / kMatMulTransB say so. InvalidArgument naming the node when a
// transposed operand has fewer than two dims. (Shape inference and every MatMul kernel.)
Status ApplyMatMulTransposes(const Node& n, Shape* a, Shape* b);

// Marks the values between Convs that stay in a layout of `block` channels (8 or 16); returns
// how many. Only values whose channels are a whole number of blocks qualify, so a blocked value
// takes exactly the bytes of its row-major form and the memory plan is unchanged.
int KeepBlockedLayouts(Graph* graph, const FusionOptions& options, int64_t block);

// Note [Channels-last convolutions]: on the CPU, a 4-D Conv, SalusConvGradData or
// SalusConvGradWeights (or pooling, below) whose node carries kChannelsLastAttr reads and
// writes its activations (X, Y, dX, dY) as NHWC tensors: those values have NHWC shapes while the
// node's attributes stay in NCHW terms (x_shape), and oneDNN reads them through channels-last
// memory descriptors. AdoptChannelsLast sets it where Transposes from NHWC feed every activation a
// node reads and every reader of its activation output is a Transpose back to NHWC (the TensorFlow
// importer's lowering of NHWC convolutions, Note [NHWC lowering]): the node reads the Transposes'
// inputs, the readers of the Transposes back read its output, and the Transposes, read by nothing,
// are not run. Fetched values and graph outputs are never rewritten. Returns how many nodes it
// changed. CPU only: the CUDA kernels take NCHW.
// Such a node's filter, when a Transpose from HWIO (TensorFlow's filter layout) is all that
// made it OIHW, is read as HWIO too (kFilterHwioAttr: the value has the HWIO shape, the node's
// attributes stay OIHW), and a weight gradient that only Transposes back to HWIO read writes
// HWIO itself.
// MaxPool, AveragePool and SalusPoolGrad without taps between such Transposes are channels-last
// the same way: oneDNN pools NHWC with its JIT kernels, so they also skip the reorders to and
// from the blocked layout of Note [Blocked pooling].
inline constexpr const char* kChannelsLastAttr = "channels_last";
inline constexpr const char* kFilterHwioAttr = "filter_hwio";
int AdoptChannelsLast(Graph* graph, const FusionOptions& options);
// The NCHW shape of the NHWC `shape` a channels-last node reads (other shapes as they are), and
// the OIHW shape of an HWIO filter's.
Shape NchwOf(const Shape& shape);
Shape OihwOf(const Shape& hwio);

// Note [Fused elementwise chains] (fusion_eltwise.cc): FuseElementwise makes each chain of
// float32 Add, Sub, Mul, Div, Sqrt and Neg nodes whose intermediates have one reader (and are
// neither fetched nor graph outputs) one SalusFusedElementwise node, and folds the chain into a
// SalusAssign that reads its result (the node then writes the variable in place). Its inputs
// are the chain's outside operands, each with the output's element count or one element (a
// scalar, broadcast); attribute kFusedProgramAttr lists three ints per operation in order: an
// ElementwiseOpcode and two operands, an operand >= 0 naming an input and one < 0 the result of
// operation -1 - operand. With kFusedAssignAttr ("set", "add", "sub") the node has no output and
// input 0 is the variable it writes. Each element is computed by the same float operations in
// the same order as the chain's nodes did, so results are bit for bit the unfused ones. Run by
// Executable::Build on CPU inference compiles (TensorFlow and ATen steps carry their training
// inside such graphs) after ApplyInferenceFusions; returns the number of nodes it removed.
enum class ElementwiseOpcode : int64_t { kAdd = 0, kSub, kMul, kDiv, kSqrt, kNeg };
inline constexpr const char* kFusedElementwiseOp = "SalusFusedElementwise";
inline constexpr const char* kFusedProgramAttr = "program";
inline constexpr const char* kFusedAssignAttr = "assign";
// The most operations one fused node runs (its kernel keeps a block of each result on the
// stack).
inline constexpr int kMaxFusedOperations = 24;
int FuseElementwise(Graph* graph, const FusionOptions& options);

// FoldBatchNorm, FuseConvBias, FuseActivations and FuseResidualAdd, in that order.
void ApplyInferenceFusions(Graph* graph, const FusionOptions& options);

}  // namespace salus::exec
