// The device layer of the execution engine: which device an executable runs on, the context
// its kernels run with, and the copies into and out of device memory.
//
// Note [Device contexts]: a kernel gets its device's context with every run (KernelArgs::ctx)
// instead of reaching for globals. On the CPU the context is empty and costs nothing. On CUDA
// it carries the CUDA stream the iteration runs on and the cuDNN and cuBLAS handles bound to
// that stream. Contexts belong to threads: the first time a thread asks for a device's context
// it sets the device on the thread and takes a context from the device's pool (creating one
// when the pool is empty); when the thread ends, the context goes back to the pool. The
// daemon runs each lane's iterations on the lane's own worker thread, so each lane runs on its
// own stream; interactive lanes get high-priority streams. Creating streams and handles is
// slow (milliseconds) and takes device memory outside the arena, so pooled contexts are reused
// by later workers, and the memory they took is counted in reserved_bytes().
//
// Note [Staging]: feeds may be in a client's shared memory, where a read can fault (SIGBUS)
// and the daemon guards reads on the calling thread only. So a feed is first copied by the
// CPU, on the calling thread, into the context's pinned host staging buffer, and only then
// moved to the device asynchronously on the stream. Fetches come back the same way. An
// iteration ends with its stream synchronised, so the staging buffer and the lane are free
// when Run returns and the lane may move (docs/architecture.md, rules 3 and 4).
//
// Note [Device graphs]: on CUDA an executable records the kernels of its iteration once, as a
// CUDA graph captured from its stream (Capture), and from then on launches the graph (one call)
// instead of its kernels one by one. A graph holds the addresses it was captured with, so it
// is replayed only while the persistent base and the lane's base are the ones it was captured
// at; when either moved (paging, a lane relocated or another lane), the iteration is captured
// again and the executable graph updated in place (cudaGraphExecUpdate: same kernels, new
// parameters), or replaced where the update is refused. Feeds and fetches stay outside the
// graph, as ordinary copies on the stream. Kernels only queue work on the stream, so capturing
// them changes nothing in what they compute: a replay gives the results of a launch, bit for
// bit. A capture that fails (a library call that cannot be captured) turns graphs off for that
// executable, which then launches kernel by kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "salus/status.h"

// Opaque CUDA types, so that exec's headers need no CUDA headers.
struct CUstream_st;
struct cudnnContext;
struct cublasContext;

namespace salus::exec {

enum class DeviceType { kCpu, kCuda };

std::string DeviceTypeName(DeviceType d);

struct Device {
  DeviceType type = DeviceType::kCpu;
  int ordinal = 0;  // GPU index for kCuda; 0 for the CPU

  std::string name() const;  // "cpu", "cuda:0"
  bool operator==(const Device&) const = default;
};

// "cpu", "cuda" (= cuda:0) or "cuda:N". InvalidArgument naming the text otherwise.
StatusOr<Device> ParseDevice(std::string_view text);

// What a kernel runs with (Note [Device contexts]).
struct DeviceContext {
  Device device;
  CUstream_st* stream = nullptr;    // cudaStream_t: the stream every kernel launches on
  cudnnContext* cudnn = nullptr;    // cudnnHandle_t bound to `stream`
  cublasContext* cublas = nullptr;  // cublasHandle_t bound to `stream`
  // Pinned host memory for feeds and fetches (Note [Staging]); grown by Staging().
  std::byte* staging = nullptr;
  size_t staging_bytes = 0;
};

// An iteration's recorded work (Note [Device graphs]).
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Queues the recorded work on ctx's stream.
  virtual Status Launch(DeviceContext* ctx) = 0;
  // Whether the Capture that returned it updated an earlier graph in place.
  bool updated = false;
};

// The runtime of one device: contexts, copies and (for tools and tests) plain allocations.
// Process-wide: one per device, created on first use, never destroyed.
class DeviceRuntime {
 public:
  // The runtime of `device`. FailedPrecondition when the build has no CUDA device;
  // Unavailable ("no GPU: ...") when the GPU cannot be used.
  static StatusOr<DeviceRuntime*> For(const Device& device);

  virtual ~DeviceRuntime() = default;
  virtual Device device() const = 0;
  // Whether host code may dereference device addresses.
  virtual bool host_accessible() const = 0;

  // The calling thread's context (Note [Device contexts]). Sets the device on the thread.
  virtual StatusOr<DeviceContext*> ThreadContext(bool high_priority = false) = 0;
  // At least `bytes` of pinned staging in `ctx`; the returned pointer is valid until the next
  // call on the same context.
  virtual StatusOr<std::byte*> Staging(DeviceContext* ctx, size_t bytes) = 0;

  // Copies on ctx's stream, in stream order with the kernels. Host memory must stay valid (and
  // unchanged) until Synchronize unless it is ctx's staging buffer.
  virtual Status CopyToDevice(DeviceContext* ctx, void* dst, const void* src, size_t bytes) = 0;
  virtual Status CopyToHost(DeviceContext* ctx, void* dst, const void* src, size_t bytes) = 0;
  virtual Status Zero(DeviceContext* ctx, void* dst, size_t bytes) = 0;
  // Waits for everything queued on ctx's stream; the first error of its asynchronous work.
  virtual Status Synchronize(DeviceContext* ctx) = 0;

  // Whether the device is still usable after an error: a fault that corrupts a CUDA context
  // (an illegal address, say) is sticky and fails every later call. Unavailable naming the
  // device and the error when it is not.
  virtual Status CheckHealth() = 0;
  // Device memory the runtime holds outside any arena: the CUDA context's and the pooled
  // library handles' fixed memory, as measured when each was created. 0 on the CPU.
  virtual uint64_t reserved_bytes() const = 0;

  // Plain device allocations for tools and tests (the daemon uses src/device's providers).
  // Aligned to kAlignment.
  virtual StatusOr<std::byte*> Allocate(size_t bytes) = 0;
  virtual void Free(std::byte* ptr) = 0;

  // Records what `enqueue` queues on ctx's stream, without running it, as a graph to launch;
  // with `previous`, updates that graph in place when it can (Note [Device graphs]).
  // Unimplemented on devices without graphs (the CPU).
  virtual StatusOr<std::unique_ptr<DeviceGraph>> Capture(DeviceContext* ctx,
                                                         const std::function<Status()>& enqueue,
                                                         std::unique_ptr<DeviceGraph> previous) {
    return UnimplementedError(device().name() + " has no device graphs");
  }
  virtual bool supports_graphs() const { return false; }
};

// The CUDA runtime of GPU `ordinal` (exec/cuda/cuda_runtime.cc); only in CUDA builds.
StatusOr<DeviceRuntime*> CudaRuntimeFor(int ordinal);

// A device allocation freed on destruction; for tools and tests.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> Allocate(DeviceRuntime* rt, size_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();
  std::byte* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  DeviceRuntime* rt_ = nullptr;
  std::byte* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace salus::exec
