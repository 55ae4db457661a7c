// The CUDA device runtime: pooled per-thread contexts (a non-blocking stream with cuDNN and
// cuBLAS handles bound to it, and pinned staging), stream-ordered copies, and the health check
// after a fault. Note [Device contexts] and Note [Staging] in exec/device.h.
#include <fmt/format.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/logging.h"
#include "exec/alignment.h"
#include "exec/cuda/cuda_util.h"
#include "exec/device.h"

namespace salus::exec {
namespace {

using cuda::CublasStatus;
using cuda::CudaStatus;
using cuda::CudnnStatus;

// A captured iteration, instantiated (Note [Device graphs]).
class CudaGraph final : public DeviceGraph {
 public:
  // `reserved`: the runtime's count of device memory outside the arena, which holds the
  // instantiated graph's `bytes` while it lives.
  CudaGraph(std::string device, std::atomic<uint64_t>* reserved)
      : device_(std::move(device)), reserved_(reserved) {}
  ~CudaGraph() override {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    reserved_->fetch_sub(bytes_);
  }
  Status Launch(DeviceContext* ctx) override {
    return CudaStatus(cudaGraphLaunch(exec_, ctx->stream),
                      device_ + ": launching the iteration's graph");
  }
  cudaGraphExec_t exec_ = nullptr;
  uint64_t bytes_ = 0;

 private:
  std::string device_;
  std::atomic<uint64_t>* reserved_;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  explicit CudaRuntime(int ordinal) : ordinal_(ordinal) {}

  Device device() const override { return {DeviceType::kCuda, ordinal_}; }
  bool host_accessible() const override { return false; }
  std::string name() const { return device().name(); }

  StatusOr<DeviceContext*> ThreadContext(bool high_priority) override;
  StatusOr<std::byte*> Staging(DeviceContext* ctx, size_t bytes) override;
  Status CopyToDevice(DeviceContext* ctx, void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return OkStatus();
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream),
                      name() + ": copy of " + std::to_string(bytes) + " bytes to the device");
  }
  Status CopyToHost(DeviceContext* ctx, void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return OkStatus();
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream),
                      name() + ": copy of " + std::to_string(bytes) + " bytes to the host");
  }
  Status Zero(DeviceContext* ctx, void* dst, size_t bytes) override {
    if (bytes == 0) return OkStatus();
    return CudaStatus(cudaMemsetAsync(dst, 0, bytes, ctx->stream),
                      name() + ": zeroing " + std::to_string(bytes) + " bytes");
  }
  Status Synchronize(DeviceContext* ctx) override {
    return CudaStatus(cudaStreamSynchronize(ctx->stream), name() + ": the iteration's kernels");
  }
  Status CheckHealth() override;
  bool supports_graphs() const override { return true; }
  StatusOr<std::unique_ptr<DeviceGraph>> Capture(DeviceContext* ctx,
                                                 const std::function<Status()>& enqueue,
                                                 std::unique_ptr<DeviceGraph> previous) override;
  uint64_t reserved_bytes() const override { return reserved_.load(); }
  StatusOr<std::byte*> Allocate(size_t bytes) override {
    SALUS_RETURN_IF_ERROR(SetDevice());
    void* p = nullptr;
    SALUS_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, AlignUp(bytes == 0 ? 1 : bytes)),
                                     fmt::format("{}: cudaMalloc of {} bytes", name(), bytes)));
    return static_cast<std::byte*>(p);
  }
  void Free(std::byte* ptr) override {
    if (SetDevice().ok()) cudaFree(ptr);
  }

  // Returns a thread's context to the pool when the thread ends.
  void Release(DeviceContext* ctx, bool high_priority);

 private:
  struct Owned {
    std::unique_ptr<DeviceContext> ctx;
    bool high_priority = false;
  };
  Status SetDevice();
  StatusOr<DeviceContext*> CreateContext(bool high_priority);

  const int ordinal_;
  std::mutex mu_;
  std::vector<DeviceContext*> free_[2];  // by priority
  std::vector<std::unique_ptr<DeviceContext>> all_;
  std::atomic<uint64_t> reserved_{0};
};

// The contexts this thread holds, handed back when it ends.
struct ThreadContexts {
  struct Entry {
    CudaRuntime* rt;
    bool high;
    DeviceContext* ctx;
  };
  std::vector<Entry> held;
  ~ThreadContexts() {
    for (const Entry& e : held) e.rt->Release(e.ctx, e.high);
  }
};
thread_local ThreadContexts tls_contexts;

Status CudaRuntime::SetDevice() {
  // Asked of the CUDA runtime, not remembered: other code (discovery, the memory providers)
  // sets a thread's device too, and a daemon of several GPUs calls them from lane workers.
  int current = -1;
  const cudaError_t got = cudaGetDevice(&current);
  if (got == cudaSuccess && current == ordinal_) return OkStatus();
  if (got != cudaSuccess) cudaGetLastError();
  return CudaStatus(cudaSetDevice(ordinal_), name() + ": cudaSetDevice");
}

StatusOr<DeviceContext*> CudaRuntime::ThreadContext(bool high_priority) {
  SALUS_RETURN_IF_ERROR(SetDevice());
  for (const ThreadContexts::Entry& e : tls_contexts.held) {
    if (e.rt == this && e.high == high_priority) return e.ctx;
  }
  DeviceContext* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& pool = free_[high_priority ? 1 : 0];
    if (!pool.empty()) {
      ctx = pool.back();
      pool.pop_back();
    }
  }
  if (ctx == nullptr) {
    SALUS_ASSIGN_OR_RETURN(ctx, CreateContext(high_priority));
  }
  tls_contexts.held.push_back({this, high_priority, ctx});
  return ctx;
}

StatusOr<DeviceContext*> CudaRuntime::CreateContext(bool high_priority) {
  size_t free_before = 0, free_after = 0, total = 0;
  SALUS_RETURN_IF_ERROR(
      CudaStatus(cudaMemGetInfo(&free_before, &total), name() + ": cudaMemGetInfo"));
  auto ctx = std::make_unique<DeviceContext>();
  ctx->device = device();
  int least = 0, greatest = 0;
  SALUS_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                                   name() + ": stream priorities"));
  cudaStream_t stream = nullptr;
  SALUS_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking,
                                                                high_priority ? greatest : least),
                                   name() + ": creating a stream"));
  ctx->stream = stream;
  cudnnHandle_t cudnn = nullptr;
  SALUS_RETURN_IF_ERROR(CudnnStatus(cudnnCreate(&cudnn), name() + ": creating a cuDNN handle"));
  ctx->cudnn = cudnn;
  SALUS_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetStream(cudnn, stream), name() + ": binding cuDNN to the stream"));
  cublasHandle_t cublas = nullptr;
  SALUS_RETURN_IF_ERROR(CublasStatus(cublasCreate(&cublas), name() + ": creating a cuBLAS handle"));
  ctx->cublas = cublas;
  SALUS_RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(cublas, stream), name() + ": binding cuBLAS to the stream"));
  // Plain float math: no TF32 (results must match the CPU); the kernels hand cuBLAS its
  // workspace from their planned scratch (Note [cuBLAS workspace] in blas_kernels.cc).
  SALUS_RETURN_IF_ERROR(
      CublasStatus(cublasSetMathMode(cublas, CUBLAS_PEDANTIC_MATH), name() + ": cuBLAS math mode"));
  SALUS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), name() + ": new stream"));
  SALUS_RETURN_IF_ERROR(
      CudaStatus(cudaMemGetInfo(&free_after, &total), name() + ": cudaMemGetInfo"));
  const uint64_t took = free_before > free_after ? free_before - free_after : 0;
  reserved_ += took;
  logging::Event("exec", "cuda_context",
                 {{"device", name()},
                  {"priority", high_priority ? "high" : "normal"},
                  {"bytes", took},
                  {"reserved_bytes", reserved_.load()}});
  std::lock_guard<std::mutex> lock(mu_);
  all_.push_back(std::move(ctx));
  return all_.back().get();
}

StatusOr<std::byte*> CudaRuntime::Staging(DeviceContext* ctx, size_t bytes) {
  if (bytes <= ctx->staging_bytes) return ctx->staging;
  if (ctx->staging) {
    SALUS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(ctx->stream), name() + ": staging"));
    cudaFreeHost(ctx->staging);
    ctx->staging = nullptr;
    ctx->staging_bytes = 0;
  }
  // Grow geometrically so that a session whose feeds grow does not reallocate every time.
  size_t want = std::max<size_t>(bytes, size_t{1} << 20);
  void* p = nullptr;
  SALUS_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&p, want, cudaHostAllocPortable),
                                   fmt::format("{}: pinned staging of {} bytes", name(), want)));
  ctx->staging = static_cast<std::byte*>(p);
  ctx->staging_bytes = want;
  return ctx->staging;
}

void CudaRuntime::Release(DeviceContext* ctx, bool high_priority) {
  cudaStreamSynchronize(ctx->stream);
  cudaGetLastError();
  std::lock_guard<std::mutex> lock(mu_);
  free_[high_priority ? 1 : 0].push_back(ctx);
}

// Thread-local capture: other threads' work (other lanes, allocations) neither joins this
// graph nor invalidates it.
StatusOr<std::unique_ptr<DeviceGraph>> CudaRuntime::Capture(DeviceContext* ctx,
                                                            const std::function<Status()>& enqueue,
                                                            std::unique_ptr<DeviceGraph> previous) {
  SALUS_RETURN_IF_ERROR(
      CudaStatus(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal),
                 name() + ": starting a graph capture"));
  const Status queued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(ctx->stream, &graph);
  struct Owned {
    cudaGraph_t g;
    ~Owned() {
      if (g != nullptr) cudaGraphDestroy(g);
    }
  } owned{graph};
  SALUS_RETURN_IF_ERROR(queued.WithContext(name() + ": capturing the iteration"));
  SALUS_RETURN_IF_ERROR(CudaStatus(ended, name() + ": ending a graph capture"));
  if (previous != nullptr) {
    auto* prev = static_cast<CudaGraph*>(previous.get());
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(prev->exec_, graph, &info) == cudaSuccess) {
      previous->updated = true;
      return previous;
    }
    cudaGetLastError();  // the refusal is not sticky: instantiate instead
  }
  // The instantiated graph's device memory (its nodes' parameters, uploaded here rather than
  // at the first launch) lies outside the arena: measured as a context's is, and counted in
  // reserved_bytes() until the graph is destroyed. Best effort: where a step of the
  // measurement fails, the graph counts nothing and the first launch uploads it.
  size_t free_before = 0, free_after = 0, total = 0;
  const bool measured_before = cudaMemGetInfo(&free_before, &total) == cudaSuccess;
  auto fresh = std::make_unique<CudaGraph>(name(), &reserved_);
  SALUS_RETURN_IF_ERROR(CudaStatus(cudaGraphInstantiate(&fresh->exec_, graph, 0),
                                   name() + ": instantiating the iteration's graph"));
  if (measured_before && cudaGraphUpload(fresh->exec_, ctx->stream) == cudaSuccess &&
      cudaStreamSynchronize(ctx->stream) == cudaSuccess &&
      cudaMemGetInfo(&free_after, &total) == cudaSuccess && free_before > free_after) {
    fresh->bytes_ = free_before - free_after;
    reserved_ += fresh->bytes_;
    logging::Event(
        "exec", "cuda_graph",
        {{"device", name()}, {"bytes", fresh->bytes_}, {"reserved_bytes", reserved_.load()}});
  }
  cudaGetLastError();  // a failed measurement is not the iteration's error
  return std::unique_ptr<DeviceGraph>(std::move(fresh));
}

Status CudaRuntime::CheckHealth() {
  // A non-sticky error was already cleared where it was reported; a sticky one (the context is
  // corrupt) is returned by every later call, cudaDeviceSynchronize included.
  cudaError_t err = cudaSetDevice(ordinal_);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err == cudaSuccess) return OkStatus();
  return UnavailableError(fmt::format(
      "{} is lost: {} ({}); every session on it has failed, and the daemon must be restarted to "
      "use it again",
      name(), cudaGetErrorName(err), cudaGetErrorString(err)));
}

}  // namespace

StatusOr<DeviceRuntime*> CudaRuntimeFor(int ordinal) {
  static std::mutex mu;
  static std::map<int, CudaRuntime*>* runtimes = new std::map<int, CudaRuntime*>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = runtimes->find(ordinal);
  if (it != runtimes->end()) return it->second;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return UnavailableError(fmt::format("cuda:{}: no GPU: {} ({})", ordinal, cudaGetErrorName(err),
                                        cudaGetErrorString(err)));
  }
  if (ordinal >= count) {
    return UnavailableError(fmt::format("cuda:{}: no GPU: this machine has {} CUDA device{}",
                                        ordinal, count, count == 1 ? "" : "s"));
  }
  auto* rt = new CudaRuntime(ordinal);  // never destroyed: threads hand contexts back at exit
  (*runtimes)[ordinal] = rt;
  return rt;
}

}  // namespace salus::exec
