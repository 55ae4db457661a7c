#include "common/thread_priority.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace salus {

StatusOr<int> SetCurrentThreadNice(int nice) {
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  if (current == -1 && errno != 0) {
    return InternalError(fmt::format("getpriority: {}", std::strerror(errno)));
  }
  if (nice >= current) {
    // Lowering one's own priority is always allowed.
    if (setpriority(PRIO_PROCESS, tid, nice) != 0) {
      return InternalError(fmt::format("setpriority({}): {}", nice, std::strerror(errno)));
    }
    return nice;
  }
  if (setpriority(PRIO_PROCESS, tid, nice) == 0) return nice;
  if (errno != EPERM && errno != EACCES) {
    return InternalError(fmt::format("setpriority({}): {}", nice, std::strerror(errno)));
  }
  // Unprivileged: RLIMIT_NICE allows down to 20 - rlim_cur.
  rlimit limit{};
  if (getrlimit(RLIMIT_NICE, &limit) == 0 && limit.rlim_cur > 0) {
    const int floor = 20 - static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 40));
    const int allowed = std::max(nice, floor);
    if (allowed < current && setpriority(PRIO_PROCESS, tid, allowed) == 0) return allowed;
  }
  return current;
}

}  // namespace salus
