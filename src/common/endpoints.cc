#include "common/endpoints.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

namespace salus {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string UserTmpDir() { return "/tmp/salus-" + std::to_string(getuid()); }

bool IsSocket(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

}  // namespace

std::string RuntimeDir() {
  if (std::string d = Env("RUNTIME_DIRECTORY"); !d.empty()) {
    return d.substr(0, d.find(':'));  // systemd may list several
  }
  if (std::string d = Env("XDG_RUNTIME_DIR"); !d.empty()) return d + "/salus";
  return UserTmpDir();
}

std::string DefaultIpcEndpoint() { return "ipc://" + RuntimeDir() + "/salus.sock"; }

std::string ClientEndpoint() {
  if (std::string e = Env("SALUS_ENDPOINT"); !e.empty()) return e;
  std::vector<std::string> dirs;
  if (std::string d = Env("XDG_RUNTIME_DIR"); !d.empty()) dirs.push_back(d + "/salus");
  dirs.push_back(UserTmpDir());
  dirs.push_back("/run/salus");
  for (const std::string& d : dirs) {
    if (IsSocket(d + "/salus.sock")) return "ipc://" + d + "/salus.sock";
  }
  return kDefaultTcpEndpoint;
}

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
