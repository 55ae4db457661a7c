// The daemon's endpoints as clients and the daemon itself name them. Standard C++ only: the
// TensorFlow plugin compiles endpoints.cc into itself as well.
#pragma once

#include <string>

namespace salus {

// The directory of the daemon's ipc socket: $RUNTIME_DIRECTORY (systemd), else
// $XDG_RUNTIME_DIR/salus, else /tmp/salus-<uid>.
std::string RuntimeDir();

// ipc://<RuntimeDir()>/salus.sock: where the daemon's own user (and root) administer it.
std::string DefaultIpcEndpoint();

// The daemon's default tcp endpoint, tcp://127.0.0.1:5501.
inline constexpr const char* kDefaultTcpEndpoint = "tcp://127.0.0.1:5501";

// Note [Default endpoint]
// Every client (salusctl, the C++ and Python clients, the TensorFlow plugin, the PyTorch
// device) finds the daemon the same way when not told: $SALUS_ENDPOINT; else the first of these
// ipc sockets that exists: a daemon the user started ($XDG_RUNTIME_DIR/salus/salus.sock, then
// /tmp/salus-<uid>/salus.sock, where such a daemon puts it), then the system service's
// (/run/salus/salus.sock); else tcp://127.0.0.1:5501, where every daemon also listens by
// default. The Python client's salus.default_endpoint() is the same search
// (tests/python/test_endpoints.py holds them equal); `salusctl endpoint` prints the result.
std::string ClientEndpoint();

// Whether `endpoint` can be reached only from this host: ipc, inproc, and tcp on a loopback
// address (127.0.0.0/8, ::1, localhost).
bool IsLocalEndpoint(const std::string& endpoint);

}  // namespace salus
