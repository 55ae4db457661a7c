#include "server/shared_buffer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string_view>

#include "common/check.h"

namespace salus::server {
namespace {

// Note [Truncated shared buffers]
// A SIGBUS handler may not take locks or allocate, so each reading thread publishes the
// address ranges it is about to read in thread-local storage (SharedReadScope), and the
// handler only compares the faulting address with them. Mapping an anonymous page over the
// faulting one (MAP_FIXED) makes the interrupted instruction succeed when the handler
// returns; it reads zeros. A fault outside every scoped range is not ours: the previous
// disposition is restored and the access faults again, with the default (or sanitizer's)
// behaviour.
constexpr size_t kMaxScoped = SharedReadScope::kMaxBuffers;

// Where POSIX shared-memory objects live (shm_open's folder on Linux).
constexpr char kShmDir[] = "/dev/shm";

struct ScopedRange {
  const std::byte* begin;
  const std::byte* end;
  std::atomic<bool>* faulted;
};

thread_local ScopedRange t_ranges[kMaxScoped];
thread_local size_t t_count = 0;

struct sigaction g_previous;
uintptr_t g_page_size = 4096;

void OnSigbus(int sig, siginfo_t* info, void* ctx) {
  const auto* addr = static_cast<const std::byte*>(info->si_addr);
  for (size_t i = 0; i < t_count; ++i) {
    if (addr < t_ranges[i].begin || addr >= t_ranges[i].end) continue;
    const uintptr_t page = reinterpret_cast<uintptr_t>(addr) & ~(g_page_size - 1);
    void* p = mmap(reinterpret_cast<void*>(page), g_page_size, PROT_READ,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      t_ranges[i].faulted->store(true, std::memory_order_relaxed);
      return;
    }
  }
  sigaction(SIGBUS, &g_previous, nullptr);  // not ours: fault again, as before
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

bool ValidName(const std::string& name) {
  static constexpr std::string_view kPrefix = "/salus-";
  if (name.size() <= kPrefix.size() || name.size() > SharedBuffer::kMaxNameLength ||
      name.compare(0, kPrefix.size(), kPrefix) != 0) {
    return false;
  }
  for (size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

}  // namespace

// Note [Whose buffer]
// The daemon maps a shared buffer with its own privileges, which may be greater than the
// client's (root, or the daemon's own user). So it maps only what the client could have made
// itself: a regular file in /dev/shm (not a FIFO, whose open would block the daemon until a
// writer came, nor a device), reached without following a symbolic link, and owned by the
// client's own Unix user, which the kernel told the daemon for the client's ipc connection
// (SO_PEERCRED; Note [Principals] in rpc_frontend.cc). A root-only object, or another user's
// staging buffer caught between its creation and its unlink, is therefore refused, and so is
// any buffer from a client whose Unix user the daemon cannot know (loopback TCP, CURVE). The
// open is non-blocking and its size is capped before anything is mapped.
StatusOr<std::shared_ptr<SharedBuffer>> SharedBuffer::Open(const std::string& shm_name,
                                                           uint64_t bytes, uid_t caller_uid,
                                                           uint64_t max_bytes) {
  if (!ValidName(shm_name)) {
    return InvalidArgumentError(fmt::format(
        "shared buffer name '{}' is not of the form /salus-<letters, digits, '.', '_', '-'> "
        "(at most {} characters)",
        shm_name.substr(0, kMaxNameLength), kMaxNameLength));
  }
  if (bytes == 0) return InvalidArgumentError(fmt::format("shared buffer '{}': 0 bytes", shm_name));
  if (bytes > max_bytes) {
    return ResourceExhaustedError(fmt::format(
        "shared buffer '{}' of {} bytes is larger than limits.max_shared_buffer_bytes={}", shm_name,
        bytes, max_bytes));
  }
  const std::string path = std::string(kShmDir) + shm_name;
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = fmt::format("cannot open shared buffer '{}' on the server's host: {}",
                                        shm_name, std::strerror(err));
    if (err == ENOENT) return NotFoundError(why);
    if (err == EACCES) return PermissionDeniedError(why);
    if (err == ELOOP) {
      return InvalidArgumentError(fmt::format(
          "shared buffer '{}' is a symbolic link; it must be the object itself", shm_name));
    }
    return InvalidArgumentError(why);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgumentError(fmt::format(
        "shared buffer '{}' is not a regular file (a FIFO, device or socket)", shm_name));
  }
  if (st.st_uid != caller_uid) {
    close(fd);
    return PermissionDeniedError(fmt::format(
        "shared buffer '{}' is owned by uid {}, not by the caller (uid {}): a client may map only "
        "its own objects",
        shm_name, st.st_uid, caller_uid));
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    close(fd);
    return InvalidArgumentError(
        fmt::format("shared buffer '{}' holds {} bytes, not the {} declared", shm_name,
                    static_cast<long long>(st.st_size), bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return ResourceExhaustedError(
        fmt::format("cannot map shared buffer '{}': {}", shm_name, std::strerror(err)));
  }
  InstallSigbusHandler();
  return std::shared_ptr<SharedBuffer>(
      new SharedBuffer(shm_name, fd, static_cast<std::byte*>(p), bytes));
}

SharedBuffer::~SharedBuffer() {
  munmap(data_, size_);
  close(fd_);
}

Status SharedBuffer::CheckIntact() const {
  struct stat st {};
  if (faulted() || fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < size_) {
    return FailedPreconditionError(
        fmt::format("shared buffer '{}' was truncated by its owner and cannot be used", name_));
  }
  return OkStatus();
}

SharedReadScope::SharedReadScope(const std::vector<std::shared_ptr<SharedBuffer>>& buffers) {
  t_count = 0;
  for (const auto& b : buffers) {
    if (t_count == kMaxScoped) {  // callers refuse iterations that read more
      SALUS_DCHECK(false, "more shared buffers than a SharedReadScope guards");
      break;
    }
    t_ranges[t_count] = {b->data_, b->data_ + b->size_, &b->faulted_};
    std::atomic_signal_fence(std::memory_order_seq_cst);
    ++t_count;
  }
}

SharedReadScope::~SharedReadScope() {
  t_count = 0;
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

}  // namespace salus::server
