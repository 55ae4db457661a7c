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
// core's work: a Conv's region and the reorders around it each wake the threads. With only two
// threads they are four times higher (kTwoThreadFactor): a step gains at most half its time
// there, and the second core is the one the daemon's I/O and its clients share. On the 2-core
// development machine the training steps of the PyTorch Transformer encoder and CNN took 8.9
// and 6.9 ms with the base thresholds, 6.8 and 5.3 ms with four times them (one thread: 6.9
// and 6.0 ms).
inline constexpr int64_t kSerialElements = int64_t{1} << 18;  // read + written, 1 MiB of floats
inline constexpr int64_t kSerialMultiplyAdds = int64_t{1} << 23;
inline constexpr int64_t kTwoThreadFactor = 4;

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
