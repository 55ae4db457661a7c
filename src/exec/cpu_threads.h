// How many threads each CPU step runs on (Note [Threads per step]).
#pragma once

#include "exec/graph.h"

namespace salus::exec {

// Note [Threads per step]
// oneDNN's primitives and the engine's own loops run on OpenMP's threads. Threads that wait
// passively (the daemon's default: a shared machine must not burn cores spinning) sleep between
// parallel regions, and waking them costs tens of microseconds, more than a small op's whole
// work: with 2 threads, inference of the exported Transformer took twice as long as with one.
// So each step gets a thread count when it is compiled: one thread when its work is below what
// its wake-ups cost, all of them otherwise. The work is the elements the step reads and writes
// for memory-bound ops, and its multiply-adds for convolutions and products; an LSTM wakes the
// threads at every time step, so its work is one step's. The step is created (oneDNN fixes its
// partitioning then) and run with that count. The thresholds are about 100 microseconds of one
// core's work: a Conv's region and the reorders around it each wake the threads.
inline constexpr int64_t kSerialElements = int64_t{1} << 18;  // read + written, 1 MiB of floats
inline constexpr int64_t kSerialMultiplyAdds = int64_t{1} << 23;

// The threads node `n` of `g` runs on, at most `max_threads`.
int StepThreads(const Graph& g, const Node& n, int max_threads);

// The OpenMP thread count of the calling thread's parallel regions, for one scope.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads);
  ~ScopedThreads();
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

// The calling thread's OpenMP thread count.
int MaxThreads();

}  // namespace salus::exec
