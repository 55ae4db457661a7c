// A real salus-server child process on an ipc endpoint in a fresh directory, for the C++
// integration tests; SIGTERM (a drain) when the object goes. SALUS_SERVER_BIN names the
// binary of the same build tree; $SALUS_SERVER, when set, another (a copy of the test run
// elsewhere, as on the GPU machine).
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "salus/client.h"

namespace salus::testing {

class DaemonProcess {
 public:
  explicit DaemonProcess(const char* policy = "pack", const char* name = "salus-it",
                         const char* device = "cpu") {
    dir_ = std::filesystem::temp_directory_path() /
           (std::string(name) + "-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    endpoint_ = "ipc://" + (dir_ / "salus.sock").string();
    const char* env = std::getenv("SALUS_SERVER");
    const char* server = env != nullptr && *env != '\0' ? env : SALUS_SERVER_BIN;
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // a test that dies (a sanitizer abort) leaves no daemon
      execl(server, server, "--listen", endpoint_.c_str(), "--memory", "2GiB", "--policy", policy,
            "--log-level", "warn", "--device", device, static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~DaemonProcess() {
    Stop();
    std::filesystem::remove_all(dir_);
  }
  // SIGTERM, then the daemon's exit code (0 after a clean drain; a sanitizer's report makes it
  // non-zero), or -1 if it died of a signal. Idempotent.
  int Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      pid_ = -1;
    }
    return exit_code_;
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  // Waits until a Hello succeeds (up to about 20 s: sanitizer builds start slowly).
  bool WaitReady() const {
    client::Client::Options o;
    o.timeout = std::chrono::milliseconds(500);
    for (int i = 0; i < 40; ++i) {
      if (client::Client::Connect(endpoint_, o).ok()) return true;
    }
    return false;
  }

 private:
  std::filesystem::path dir_;
  std::string endpoint_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

}  // namespace salus::testing
