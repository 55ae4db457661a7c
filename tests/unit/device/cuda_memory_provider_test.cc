// The CUDA provider on a real GPU; skips itself where the build or the machine has none.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "common/units.h"
#include "device/cuda_query.h"
#include "device/memory_provider.h"

namespace salus::device {
namespace {

class CudaMemoryProviderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaAvailability cuda = QueryCuda();
    if (cuda.devices.empty()) GTEST_SKIP() << cuda.reason;
    total_bytes_ = cuda.devices[0].total_bytes;
    for (const auto& d : cuda.devices) ordinals_.push_back(d.ordinal);
  }
  uint64_t total_bytes_ = 0;
  std::vector<int> ordinals_;
};

TEST_F(CudaMemoryProviderTest, TakesAnArenaAndGivesItBack) {
  auto provider = CreateMemoryProvider("cuda:0");
  ASSERT_TRUE(provider.ok()) << provider.status();
  EXPECT_FALSE((*provider)->host_accessible());
  auto arena = (*provider)->Allocate(256 * kMiB);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*arena) % (*provider)->alignment(), 0u);
  EXPECT_TRUE((*provider)->Free(*arena, 256 * kMiB).ok());
}

TEST_F(CudaMemoryProviderTest, TooLargeArenaNamesTheSize) {
  auto provider = CreateMemoryProvider("cuda:0");
  ASSERT_TRUE(provider.ok());
  const uint64_t too_much = total_bytes_ * 4;
  const auto arena = (*provider)->Allocate(too_much);
  ASSERT_FALSE(arena.ok());
  EXPECT_EQ(arena.status().code(), StatusCode::kResourceExhausted) << arena.status();
  EXPECT_NE(arena.status().message().find(FormatBytes(too_much)), std::string::npos)
      << arena.status();
}

TEST_F(CudaMemoryProviderTest, NoSuchGpuIsUnavailable) {
  auto provider = CreateMemoryProvider("cuda:4096");
  ASSERT_TRUE(provider.ok());
  const auto arena = (*provider)->Allocate(kMiB);
  ASSERT_FALSE(arena.ok());
  EXPECT_EQ(arena.status().code(), StatusCode::kUnavailable) << arena.status();
}

// A move's one copy (Note [Migration] in src/sched/engine.cc): from an arena on cuda:0 into one
// on every GPU of the machine, cuda:0 itself included (two arenas of one GPU), byte for byte.
TEST_F(CudaMemoryProviderTest, CopiesIntoAnotherArenaByPeerCopy) {
  constexpr uint64_t kBytes = 3 * kMiB + 256;
  auto from = CreateMemoryProvider("cuda:0");
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ((*from)->kind(), "cuda");
  auto src = (*from)->Allocate(kBytes);
  ASSERT_TRUE(src.ok()) << src.status();
  auto host = (*from)->AllocateHost(kBytes);
  ASSERT_TRUE(host.ok()) << host.status();
  for (uint64_t i = 0; i < kBytes; ++i) (*host)[i] = static_cast<std::byte>(i * 13 + 5);
  ASSERT_TRUE((*from)->CopyToDevice(*src, *host, kBytes).ok());
  auto back = (*from)->AllocateHost(kBytes);
  ASSERT_TRUE(back.ok()) << back.status();
  for (const int ordinal : ordinals_) {
    SCOPED_TRACE("into cuda:" + std::to_string(ordinal));
    auto to = CreateMemoryProvider("cuda:" + std::to_string(ordinal));
    ASSERT_TRUE(to.ok()) << to.status();
    ASSERT_TRUE((*from)->CanCopyToPeer(**to));
    auto dst = (*to)->Allocate(kBytes);
    ASSERT_TRUE(dst.ok()) << dst.status();
    const Status copied = (*from)->CopyToPeer(*dst, **to, *src, kBytes);
    ASSERT_TRUE(copied.ok()) << copied;
    std::fill(*back, *back + kBytes, std::byte{0});
    ASSERT_TRUE((*to)->CopyToHost(*back, *dst, kBytes).ok());
    EXPECT_TRUE(std::equal(*back, *back + kBytes, *host));
    EXPECT_TRUE((*to)->Free(*dst, kBytes).ok());
  }
  // Not into host memory: that is CopyToHost's.
  auto cpu = CreateMemoryProvider("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE((*from)->CanCopyToPeer(**cpu));
  EXPECT_EQ((*from)->CopyToPeer(*back, **cpu, *src, kBytes).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*from)->FreeHost(*back, kBytes).ok());
  EXPECT_TRUE((*from)->FreeHost(*host, kBytes).ok());
  EXPECT_TRUE((*from)->Free(*src, kBytes).ok());
}

}  // namespace
}  // namespace salus::device
