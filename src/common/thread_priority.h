// The OS scheduling priority of the calling thread (Linux: its nice value; per thread, and
// inherited by threads it creates afterwards, such as an OpenMP team's).
#pragma once

#include "salus/status.h"

namespace salus {

// Lowest (most favoured) nice value the daemon asks for on latency-sensitive workers.
inline constexpr int kInteractiveNice = -15;

// Sets the calling thread's nice value to `nice`, or as close to it as the process is allowed
// (RLIMIT_NICE; raising priority without CAP_SYS_NICE is refused). Returns the nice value the
// thread has afterwards; an error only when the system call fails for another reason.
StatusOr<int> SetCurrentThreadNice(int nice);

}  // namespace salus
