// Training forms of the ops that behave differently when a model trains, as PyTorch's
// model.train() makes them:
//   - BatchNormalization normalises with the batch's statistics and updates its running
//     statistics in place ("SalusBatchNormTrain"; Note [BatchNorm running statistics]);
//   - Dropout drops elements at random, reproducibly from the session's seed
//     ("SalusDropoutTrain"; Note [Dropout mask] in element_math.h).
// A training compile rewrites these nodes before autodiff, whatever training_mode the model
// was exported with; inference compiles keep the ONNX ops.
#pragma once

#include <cstdint>

#include "exec/graph.h"
#include "salus/status.h"

namespace salus::exec {

// The seed a session gets when it names none (CompileOptions::seed 0).
inline constexpr uint64_t kDefaultDropoutSeed = 0x5a1055eedULL;

// Rewrites every BatchNormalization and Dropout node of `graph` into its training form.
// Running statistics become persistent state (not trainable) initialised from the model;
// each Dropout gets an iteration counter in persistent memory. Bad attributes are
// InvalidArgument, running statistics that are not initializers Unimplemented, naming the
// node.
Status LowerTrainingOps(Graph* graph, uint64_t seed);

}  // namespace salus::exec
