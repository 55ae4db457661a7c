// SharedBuffer: a client's POSIX shared-memory object, mapped read-only into the daemon, so
// feeds placed in it reach a lane with one copy (into lane memory) and none through a socket.
//
// A client may truncate its object while the daemon reads it; a read beyond the new end
// raises SIGBUS. So every read of a buffer happens inside a SharedReadScope on the reading
// thread: the daemon's SIGBUS handler, finding the faulting address in one of that thread's
// scoped buffers, maps a zero page over it, marks the buffer faulted and lets the read go on.
// The iteration then fails with DATA_LOSS and the buffer is refused from then on; no other
// session is touched (Note [Truncated shared buffers] in shared_buffer.cc).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "salus/status.h"

namespace salus::server {

class SharedBuffer {
 public:
  // Names must look like "/salus-<letters, digits, '.', '_', '-'>".
  static constexpr size_t kMaxNameLength = 200;

  // Opens and maps `shm_name`, which must hold at least `bytes` (at most `max_bytes`) and be a
  // regular file owned by `caller_uid`, the Unix user of the client that asks (Note [Whose
  // buffer] in shared_buffer.cc); never blocks. Errors name the object.
  static StatusOr<std::shared_ptr<SharedBuffer>> Open(const std::string& shm_name, uint64_t bytes,
                                                      uid_t caller_uid, uint64_t max_bytes);
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  const std::string& name() const { return name_; }
  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // True once a read found the object truncated: the buffer must not be used again.
  bool faulted() const { return faulted_.load(std::memory_order_relaxed); }
  // FAILED_PRECONDITION when the object is now shorter than registered (or faulted before).
  Status CheckIntact() const;

 private:
  friend class SharedReadScope;
  SharedBuffer(std::string name, int fd, std::byte* data, uint64_t size)
      : name_(std::move(name)), fd_(fd), data_(data), size_(size) {}
  std::string name_;
  int fd_;
  std::byte* data_;
  uint64_t size_;
  std::atomic<bool> faulted_{false};
};

// While alive, reads of `buffers` on this thread are guarded against truncation. Not nestable.
class SharedReadScope {
 public:
  // Most distinct buffers one scope (one iteration) may read.
  static constexpr size_t kMaxBuffers = 16;

  explicit SharedReadScope(const std::vector<std::shared_ptr<SharedBuffer>>& buffers);
  ~SharedReadScope();
  SharedReadScope(const SharedReadScope&) = delete;
  SharedReadScope& operator=(const SharedReadScope&) = delete;
};

}  // namespace salus::server
