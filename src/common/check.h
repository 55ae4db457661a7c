// SALUS_DCHECK: an invariant check that runs in debug builds (NDEBUG unset: the dev, asan
// and tsan presets) and compiles to nothing in release builds.
//
// It is for broken invariants only, never for input a request can carry: a failure prints
// the condition, a message and the place, then aborts.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace salus::internal {

[[noreturn]] inline void DcheckFailed(const char* condition, const std::string& message,
                                      const char* file, int line) {
  std::fprintf(stderr, "%s:%d: invariant broken: %s: %s\n", file, line, condition, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace salus::internal

#ifdef NDEBUG
#define SALUS_DCHECK_IS_ON 0
// The condition is still type-checked but never evaluated.
#define SALUS_DCHECK(condition, message) \
  do {                                   \
    if (false) {                         \
      (void)(condition);                 \
      (void)(message);                   \
    }                                    \
  } while (false)
#else
#define SALUS_DCHECK_IS_ON 1
#define SALUS_DCHECK(condition, message)                                          \
  do {                                                                            \
    if (!(condition)) {                                                           \
      ::salus::internal::DcheckFailed(#condition, (message), __FILE__, __LINE__); \
    }                                                                             \
  } while (false)
#endif
