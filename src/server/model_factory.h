// The factory of model sessions: compiles a CreateSession's ONNX model with the execution
// engine for the daemon's device.
#pragma once

#include <cstdint>
#include <string>

#include "server/session_manager.h"

namespace salus::server {

// The factory for `device`, or an empty function when this build cannot run models there.
// Each model's compilation may make at most `max_folded_bytes` of constants by folding.
SessionManager::ModelFactory MakeModelFactory(const std::string& device, uint64_t max_folded_bytes);

// The engine's default for `max_folded_bytes` (1 GiB).
uint64_t DefaultMaxFoldedBytes();

}  // namespace salus::server
