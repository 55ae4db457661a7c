// The CUDA provider on a real GPU; skips itself where the build or the machine has none.
#include <gtest/gtest.h>

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
  }
  uint64_t total_bytes_ = 0;
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

}  // namespace
}  // namespace salus::device
