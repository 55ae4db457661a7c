// The factory of model sessions: compiles a CreateSession's model with the execution engine
// for the daemon's devices (Note [Sessions follow their device] in model_runtime.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/session_manager.h"

namespace salus::server {

// The factory for the daemon's `devices` (DeviceNames), or an empty function when this build
// cannot run models on them. Each model's compilation may make at most `max_folded_bytes` of
// constants by folding.
SessionManager::ModelFactory MakeModelFactory(const std::vector<std::string>& devices,
                                              uint64_t max_folded_bytes);

// The engine's default for `max_folded_bytes` (1 GiB).
uint64_t DefaultMaxFoldedBytes();

}  // namespace salus::server
