#include "common/openmp_env.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>

namespace salus {

void EnsurePassiveOpenMpWait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  setenv("GOMP_SPINCOUNT", kOpenMpSpinCount, 0);  // a value the environment gave is kept
  // Execute the binary by its real path, not /proc/self/exe: the kernel names the process
  // after the path's last component, and tools (ps, pkill, top) should see "salus-server".
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) {
    path[n] = '\0';
    execv(path, argv);
  }
  execv("/proc/self/exe", argv);
}

}  // namespace salus
