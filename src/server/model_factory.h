// The factory of model sessions: compiles a CreateSession's model with the execution engine
// for the daemon's devices (Note [Sessions follow their device] in model_runtime.h).
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"
#include "exec/compile_limits.h"
#include "server/session_manager.h"

namespace salus::server {

// The factory for the daemon's `devices` (DeviceNames), or an empty function when this build
// cannot run models on them. Each model's compilation is bounded by `limits` (Note [Compile
// budgets] in exec/compile_limits.h) and must end within `compile_time` of its start
// (DEADLINE_EXCEEDED otherwise; 0: no deadline).
SessionManager::ModelFactory MakeModelFactory(const std::vector<std::string>& devices,
                                              const exec::CompileLimits& limits,
                                              Nanos compile_time);

}  // namespace salus::server
