#include "common/openmp_env.h"

#include <unistd.h>

#include <cstdlib>

namespace salus {

void EnsurePassiveOpenMpWait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);
}

}  // namespace salus
