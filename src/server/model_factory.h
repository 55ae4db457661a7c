// The factory of model sessions: compiles a CreateSession's ONNX model with the execution
// engine for the daemon's device.
#pragma once

#include <string>

#include "server/session_manager.h"

namespace salus::server {

// The factory for `device`, or an empty function when this build cannot run models there.
SessionManager::ModelFactory MakeModelFactory(const std::string& device);

}  // namespace salus::server
