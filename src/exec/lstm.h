// The ONNX LSTM op: what the engine supports of it, its shape inference, and the geometry the
// forward kernel ("LSTM") and the backward kernel ("SalusLstmGrad") share.
//
// Supported: inputs X, W, R and the optional B, initial_h, initial_c; outputs Y, Y_h, Y_c,
// each optional; direction forward, reverse or bidirectional; layout 0 ([seq, batch, ...]) and,
// from opset 14, layout 1 ([batch, seq, ...]); the default activations (Sigmoid, Tanh, Tanh).
// Refused with Unimplemented: sequence_lens, peepholes (P), other activations, clip and
// input_forget. Gate order in W, R and B is ONNX's: i, o, f, c.
//
// "SalusLstmGrad" carries the forward node's attributes; its inputs are (X, W, R, B,
// initial_h, initial_c, dY, dY_h, dY_c), kNoValue where absent, and its outputs (dX, dW, dR,
// dB, d_initial_h, d_initial_c), kNoValue where not needed, each of its forward input's shape.
#pragma once

#include <cstdint>

#include "exec/graph.h"
#include "salus/status.h"

namespace salus::exec {

struct LstmSpec {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0;
  int64_t dirs = 1;          // 2 when bidirectional
  bool reverse = false;      // direction "reverse" (direction 0 runs backwards in time)
  bool batch_major = false;  // layout 1
  bool has_b = false, has_h0 = false, has_c0 = false;

  // Row of X (and of any per-time-step buffer kept in X's order) for time t and batch b.
  int64_t Row(int64_t t, int64_t b) const { return batch_major ? b * seq + t : t * batch + b; }
  // Offset of (t, direction d, b, 0) in Y.
  int64_t YOffset(int64_t t, int64_t d, int64_t b) const {
    return (batch_major ? (b * seq + t) * dirs + d : (t * dirs + d) * batch + b) * hidden;
  }
  // Offset of (direction d, b, 0) in Y_h, Y_c, initial_h and initial_c.
  int64_t StateOffset(int64_t d, int64_t b) const {
    return (batch_major ? b * dirs + d : d * batch + b) * hidden;
  }
  // Whether direction d runs from the last time step to the first.
  bool Backwards(int64_t d) const { return d == 1 || reverse; }
  Shape YShape() const;
  Shape StateShape() const;  // Y_h, Y_c, initial_h, initial_c
};

// Validates an LSTM node (or a SalusLstmGrad node carrying its attributes) given its forward
// inputs (kNoValue where absent): shapes, types and attributes. InvalidArgument for
// inconsistent shapes, Unimplemented for what the engine does not support; both name the node.
StatusOr<LstmSpec> LstmFor(const Node& n, const Graph& g, ValueId x, ValueId w, ValueId r,
                           ValueId b, ValueId initial_h, ValueId initial_c);

// LstmFor for forward LSTM node `n`, refusing its inputs sequence_lens and P.
StatusOr<LstmSpec> LstmForwardSpec(const Node& n, const Graph& g);

// LstmFor for SalusLstmGrad node `n` (inputs X, W, R, B, initial_h, initial_c, dY, dY_h, dY_c;
// outputs dX, dW, dR, dB, d_initial_h, d_initial_c): also checks that each gradient input is a
// float of its forward output's shape, and each output has the shape of a present input.
StatusOr<LstmSpec> LstmGradSpec(const Node& n, const Graph& g);

// Shape inference of forward LSTM node `n` of `graph`: sets its outputs' types and shapes.
Status InferLstmShapes(Graph* graph, const Node& n);

}  // namespace salus::exec
