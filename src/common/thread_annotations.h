// Clang thread-safety annotations (-Wthread-safety) and an annotated mutex.
//
// libstdc++'s std::mutex carries no capability attributes, so code that wants the analysis
// uses salus::Mutex and salus::MutexLock, and marks what each mutex guards with GUARDED_BY.
// Under GCC the macros expand to nothing.
#pragma once

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define SALUS_THREAD_ATTR(x) __attribute__((x))
#else
#define SALUS_THREAD_ATTR(x)
#endif

#define CAPABILITY(x) SALUS_THREAD_ATTR(capability(x))
#define SCOPED_CAPABILITY SALUS_THREAD_ATTR(scoped_lockable)
#define GUARDED_BY(x) SALUS_THREAD_ATTR(guarded_by(x))
#define PT_GUARDED_BY(x) SALUS_THREAD_ATTR(pt_guarded_by(x))
#define REQUIRES(...) SALUS_THREAD_ATTR(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) SALUS_THREAD_ATTR(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) SALUS_THREAD_ATTR(acquire_capability(__VA_ARGS__))
#define RELEASE(...) SALUS_THREAD_ATTR(release_capability(__VA_ARGS__))
#define RETURN_CAPABILITY(x) SALUS_THREAD_ATTR(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS SALUS_THREAD_ATTR(no_thread_safety_analysis)

namespace salus {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // For std::condition_variable_any and std::unique_lock.
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

// A condition variable that waits on a salus::Mutex held by the caller.
class CondVar {
 public:
  void Wait(Mutex* mu) REQUIRES(mu) { cv_.wait(*mu); }
  template <typename Pred>
  void Wait(Mutex* mu, Pred pred) REQUIRES(mu) {
    cv_.wait(*mu, pred);
  }
  template <typename Duration>
  std::cv_status WaitFor(Mutex* mu, Duration d) REQUIRES(mu) {
    return cv_.wait_for(*mu, d);
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace salus
