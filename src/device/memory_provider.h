// The raw memory provider: the lower of the allocator's two layers (see docs/device.md).
//
// A provider hands out whole ranges of device memory and knows nothing of sessions, lanes or
// placement; the memory manager (src/mem) takes one range, the arena, at start-up and places
// everything inside it. Implementations:
//   host  one anonymous mapping (MAP_NORESERVE: pages are committed only when touched);
//   cuda  one cudaMalloc on one GPU (built only with the CUDA device);
//   fake  non-dereferenceable addresses, for tests and the simulator, with a "fuse" that
//         makes every call after the N-th fail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "salus/status.h"

namespace salus::device {

class MemoryProvider {
 public:
  virtual ~MemoryProvider() = default;

  // "host", "fake" or "cuda:0".
  virtual std::string name() const = 0;
  // The kind of memory it hands out, the same for every provider whose memory another can
  // copy state to and from through host memory: "host", "fake", "cuda" (every GPU: pinned host
  // memory of one is usable by all). Sessions move only between devices of one kind.
  virtual std::string kind() const { return name(); }
  // Whether host code may read and write the addresses it returns.
  virtual bool host_accessible() const = 0;
  // Every range it returns starts at a multiple of this.
  virtual uint64_t alignment() const = 0;

  // One contiguous range of `bytes`. InvalidArgument for zero bytes; ResourceExhausted (or
  // Unavailable for a device that cannot be used at all) naming the size when the range
  // cannot be had. Thread-safe.
  virtual StatusOr<std::byte*> Allocate(uint64_t bytes) = 0;
  // Returns a range from Allocate, with the size it was allocated with. InvalidArgument when
  // the range is not one this provider handed out. Thread-safe.
  virtual Status Free(std::byte* ptr, uint64_t bytes) = 0;

  // Host memory for state paged out of this provider's memory (the memory manager's host
  // pool): pinned where the device copies from it asynchronously. The default is page-aligned
  // host memory. ResourceExhausted naming the size when it cannot be had. Thread-safe.
  virtual StatusOr<std::byte*> AllocateHost(uint64_t bytes);
  virtual Status FreeHost(std::byte* ptr, uint64_t bytes);
  // Blocking copies between `bytes` of this provider's memory and host memory from
  // AllocateHost, on the calling thread (on a GPU: on a copy stream of the provider's own, so
  // they overlap kernels running on other streams). The default copies with memcpy and is
  // FailedPrecondition for memory that is not host-accessible. Thread-safe.
  virtual Status CopyToHost(std::byte* host, const std::byte* device, uint64_t bytes);
  virtual Status CopyToDevice(std::byte* device, const std::byte* host, uint64_t bytes);
  // Whether CopyToPeer can copy from this provider's memory into `to`'s in one copy.
  virtual bool CanCopyToPeer(const MemoryProvider& to) const {
    return host_accessible() && to.host_accessible();
  }
  // A blocking copy of `bytes` from this provider's memory at `src` into `to`'s at `dst`, on
  // the calling thread (a move between devices, Note [Migration] in src/sched/engine.cc). The
  // default copies with memcpy between host-accessible memories and is FailedPrecondition
  // otherwise; between GPUs it is a peer copy (direct where the GPUs have peer access, staged
  // by the driver otherwise). Thread-safe.
  virtual Status CopyToPeer(std::byte* dst, MemoryProvider& to, const std::byte* src,
                            uint64_t bytes);
};

// A provider by the name a configuration uses: "cpu" or "host", "fake", "cuda" (= "cuda:0")
// or "cuda:N". InvalidArgument for an unknown name or a malformed ordinal; FailedPrecondition
// for "cuda" in a build without the CUDA device.
StatusOr<std::unique_ptr<MemoryProvider>> CreateMemoryProvider(std::string_view name);

}  // namespace salus::device
