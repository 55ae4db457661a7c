#include "common/endpoints.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>

namespace salus {

std::string RuntimeDir() {
  if (const char* d = std::getenv("RUNTIME_DIRECTORY"); d != nullptr && *d != '\0') {
    std::string s(d);
    return s.substr(0, s.find(':'));  // systemd may list several
  }
  if (const char* d = std::getenv("XDG_RUNTIME_DIR"); d != nullptr && *d != '\0') {
    return std::string(d) + "/salus";
  }
  return fmt::format("/tmp/salus-{}", getuid());
}

std::string DefaultIpcEndpoint() { return fmt::format("ipc://{}/salus.sock", RuntimeDir()); }

bool IsLocalEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  std::string host = endpoint.substr(6);
  host = host.substr(0, host.rfind(':'));  // the port
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host.rfind("127.", 0) == 0 || host == "::1" || host == "localhost";
}

}  // namespace salus
