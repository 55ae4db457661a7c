// SharedBuffer against real POSIX shared memory: names are checked, sizes are checked, and an
// owner that truncates its object mid-read costs the read its bytes, never the process.
#include "server/shared_buffer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace salus::server {
namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 30;

// A shared-memory object this test owns, unlinked when done.
class Object {
 public:
  explicit Object(size_t bytes, unsigned char fill = 1)
      : name_("/salus-test-" + std::to_string(getpid()) + "-" + std::to_string(seq_++)) {
    fd_ = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    std::vector<unsigned char> bytes_of(bytes, fill);
    EXPECT_EQ(pwrite(fd_, bytes_of.data(), bytes, 0), static_cast<ssize_t>(bytes));
  }
  ~Object() {
    close(fd_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  int fd() const { return fd_; }

 private:
  static inline int seq_ = 0;
  std::string name_;
  int fd_ = -1;
};

TEST(SharedBufferTest, OpensAndMapsAnObject) {
  Object obj(8192, 7);
  auto b = SharedBuffer::Open(obj.name(), 8192, getuid(), kMaxBytes);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->size(), 8192u);
  EXPECT_EQ(static_cast<int>((*b)->data()[8191]), 7);
  EXPECT_TRUE((*b)->CheckIntact().ok());
}

TEST(SharedBufferTest, RefusesBadNamesMissingObjectsAndShortObjects) {
  Object obj(4096);
  struct Case {
    std::string name;
    uint64_t bytes;
    StatusCode code;
  };
  const std::vector<Case> cases = {
      {"/dev-shm-other", 16, StatusCode::kInvalidArgument},
      {"salus-no-slash", 16, StatusCode::kInvalidArgument},
      {"/salus-", 16, StatusCode::kInvalidArgument},
      {"/salus-a/b", 16, StatusCode::kInvalidArgument},
      {"/salus-" + std::string(300, 'a'), 16, StatusCode::kInvalidArgument},
      {"/salus-missing-" + std::to_string(getpid()), 16, StatusCode::kNotFound},
      {obj.name(), 0, StatusCode::kInvalidArgument},
      {obj.name(), 8192, StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    auto b = SharedBuffer::Open(c.name, c.bytes, getuid(), kMaxBytes);
    ASSERT_FALSE(b.ok()) << c.name;
    EXPECT_EQ(b.status().code(), c.code) << c.name << ": " << b.status();
    EXPECT_FALSE(b.status().message().empty());
  }
}

// Note [Whose buffer]: only a regular file of the caller's own user, reached without a
// symbolic link, within the size limit; a FIFO is refused without blocking.
TEST(SharedBufferTest, MapsOnlyTheCallersOwnRegularObjects) {
  Object obj(8192);
  auto other_user = SharedBuffer::Open(obj.name(), 8192, getuid() + 1, kMaxBytes);
  EXPECT_EQ(other_user.status().code(), StatusCode::kPermissionDenied) << other_user.status();
  EXPECT_NE(other_user.status().message().find("owned by"), std::string::npos);
  auto too_large = SharedBuffer::Open(obj.name(), 8192, getuid(), 4096);
  EXPECT_EQ(too_large.status().code(), StatusCode::kResourceExhausted) << too_large.status();
  EXPECT_NE(too_large.status().message().find("limits.max_shared_buffer_bytes"), std::string::npos);

  const std::string fifo = "/salus-fifo-" + std::to_string(getpid());
  ASSERT_EQ(mkfifo(("/dev/shm" + fifo).c_str(), 0600), 0);
  auto f = SharedBuffer::Open(fifo, 4096, getuid(), kMaxBytes);  // must not block
  unlink(("/dev/shm" + fifo).c_str());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status();
  EXPECT_NE(f.status().message().find("regular file"), std::string::npos);

  const std::string link = "/salus-link-" + std::to_string(getpid());
  ASSERT_EQ(symlink(("/dev/shm" + obj.name()).c_str(), ("/dev/shm" + link).c_str()), 0);
  auto l = SharedBuffer::Open(link, 4096, getuid(), kMaxBytes);
  unlink(("/dev/shm" + link).c_str());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument) << l.status();
}

TEST(SharedBufferTest, TruncationDuringAGuardedReadYieldsZerosAndMarksTheBuffer) {
  constexpr size_t kBytes = 16 * 4096;
  Object obj(kBytes, 1);
  auto b = SharedBuffer::Open(obj.name(), kBytes, getuid(), kMaxBytes);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(ftruncate(obj.fd(), 4096), 0);  // the owner shrinks it behind the daemon's back
  EXPECT_FALSE((*b)->CheckIntact().ok());
  std::vector<unsigned char> dst(kBytes, 9);
  {
    SharedReadScope guard({*b});
    std::memcpy(dst.data(), (*b)->data(), kBytes);  // faults past 4 KiB: survived
  }
  EXPECT_TRUE((*b)->faulted());
  EXPECT_EQ(dst[0], 1);
  EXPECT_EQ(dst[4095], 1);
  EXPECT_EQ(dst[4096], 0);
  EXPECT_EQ(dst[kBytes - 1], 0);
  const Status s = (*b)->CheckIntact();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(obj.name()), std::string::npos);
}

TEST(SharedBufferDeathTest, AFaultOutsideAGuardedReadStillKillsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Object obj(2 * 4096, 1);
        auto b = SharedBuffer::Open(obj.name(), 2 * 4096, getuid(), kMaxBytes);
        if (!b.ok()) std::abort();
        shm_unlink(obj.name().c_str());  // this process dies below: leave nothing behind
        if (ftruncate(obj.fd(), 0) != 0) std::abort();
        volatile std::byte c = (*b)->data()[4096];  // no SharedReadScope: not ours
        (void)c;
        std::exit(0);
      },
      "");
}

}  // namespace
}  // namespace salus::server
