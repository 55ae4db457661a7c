#include "exec/device.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "exec/alignment.h"

namespace salus::exec {
namespace {

// The CPU: device memory is host memory, copies are memcpy, and there is nothing to wait for.
class CpuRuntime final : public DeviceRuntime {
 public:
  Device device() const override { return {}; }
  bool host_accessible() const override { return true; }
  StatusOr<DeviceContext*> ThreadContext(bool) override {
    thread_local DeviceContext ctx;
    return &ctx;
  }
  StatusOr<std::byte*> Staging(DeviceContext*, size_t) override {
    return FailedPreconditionError("the cpu device needs no staging");
  }
  Status CopyToDevice(DeviceContext*, void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return OkStatus();
  }
  Status CopyToHost(DeviceContext*, void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return OkStatus();
  }
  Status Zero(DeviceContext*, void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
    return OkStatus();
  }
  Status Synchronize(DeviceContext*) override { return OkStatus(); }
  Status CheckHealth() override { return OkStatus(); }
  uint64_t reserved_bytes() const override { return 0; }
  StatusOr<std::byte*> Allocate(size_t bytes) override {
    void* p = std::aligned_alloc(kAlignment, AlignUp(bytes == 0 ? 1 : bytes));
    if (p == nullptr)
      return ResourceExhaustedError("cpu: cannot allocate " + std::to_string(bytes));
    return static_cast<std::byte*>(p);
  }
  void Free(std::byte* ptr) override { std::free(ptr); }
};

}  // namespace

std::string DeviceTypeName(DeviceType d) { return d == DeviceType::kCpu ? "cpu" : "cuda"; }

std::string Device::name() const {
  return type == DeviceType::kCpu ? "cpu" : "cuda:" + std::to_string(ordinal);
}

StatusOr<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return Device{};
  if (text == "cuda") return Device{DeviceType::kCuda, 0};
  if (text.substr(0, 5) == "cuda:" && text.size() > 5) {
    int ordinal = -1;
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data() + 5, end, ordinal);
    if (ec == std::errc() && p == end && ordinal >= 0) return Device{DeviceType::kCuda, ordinal};
  }
  return InvalidArgumentError("device '" + std::string(text) +
                              "' is not one of cpu, cuda or cuda:N (N a GPU index)");
}

StatusOr<DeviceRuntime*> DeviceRuntime::For(const Device& device) {
  if (device.type == DeviceType::kCpu) {
    static CpuRuntime cpu;
    return &cpu;
  }
  return CudaRuntimeFor(device.ordinal);
}

#ifndef SALUS_HAVE_CUDA
StatusOr<DeviceRuntime*> CudaRuntimeFor(int ordinal) {
  return FailedPreconditionError("cuda:" + std::to_string(ordinal) +
                                 ": this build has no CUDA device (built without nvcc and cuDNN)");
}
#endif

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(DeviceRuntime* rt, size_t bytes) {
  DeviceBuffer b;
  SALUS_ASSIGN_OR_RETURN(b.ptr_, rt->Allocate(bytes));
  b.rt_ = rt;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) rt_->Free(ptr_);
    rt_ = o.rt_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) rt_->Free(ptr_);
}

}  // namespace salus::exec
