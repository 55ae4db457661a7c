// The daemon's endpoints as clients and the daemon itself name them.
#pragma once

#include <string>

namespace salus {

// The directory of the daemon's ipc socket: $RUNTIME_DIRECTORY (systemd), else
// $XDG_RUNTIME_DIR/salus, else /tmp/salus-<uid>.
std::string RuntimeDir();

// ipc://<RuntimeDir()>/salus.sock: where the daemon's own user (and root) administer it.
std::string DefaultIpcEndpoint();

// Whether `endpoint` can be reached only from this host: ipc, inproc, and tcp on a loopback
// address (127.0.0.0/8, ::1, localhost).
bool IsLocalEndpoint(const std::string& endpoint);

}  // namespace salus
