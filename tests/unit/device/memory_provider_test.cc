#include "device/memory_provider.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/units.h"
#include "device/fake_memory_provider.h"
#include "device/host_memory_provider.h"

namespace salus::device {
namespace {

TEST(HostMemoryProviderTest, MapsWritableMemoryAndGivesItBack) {
  HostMemoryProvider host;
  auto p = host.Allocate(4 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % host.alignment(), 0u);
  EXPECT_EQ(host.mapped_bytes(), 4 * kMiB);
  std::memset(*p, 0xab, 4 * kMiB);
  EXPECT_EQ(static_cast<unsigned char>((*p)[4 * kMiB - 1]), 0xab);
  EXPECT_TRUE(host.Free(*p, 4 * kMiB).ok());
  EXPECT_EQ(host.mapped_bytes(), 0u);
}

// MAP_NORESERVE: a large arena costs address space only.
TEST(HostMemoryProviderTest, LargeArenaIsNotCommittedUpFront) {
  HostMemoryProvider host;
  auto p = host.Allocate(16 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status();
  (*p)[0] = std::byte{1};
  (*p)[16 * kGiB - 1] = std::byte{2};
  EXPECT_TRUE(host.Free(*p, 16 * kGiB).ok());
}

TEST(HostMemoryProviderTest, ImpossibleArenaNamesTheSize) {
  HostMemoryProvider host;
  const auto p = host.Allocate(1ULL << 62);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("4194304TiB"), std::string::npos) << p.status();
  EXPECT_EQ(host.Allocate(0).status().code(), StatusCode::kInvalidArgument);
}

TEST(FakeMemoryProviderTest, HandsOutDisjointAlignedFakeAddresses) {
  FakeMemoryProvider fake;
  EXPECT_FALSE(fake.host_accessible());
  auto a = fake.Allocate(1000);
  auto b = fake.Allocate(5000);
  ASSERT_TRUE(a.ok() && b.ok());
  const auto ua = reinterpret_cast<uint64_t>(*a);
  const auto ub = reinterpret_cast<uint64_t>(*b);
  EXPECT_GE(ua, FakeMemoryProvider::kFakeBase);
  EXPECT_GE(ub, ua + 1000);
  EXPECT_EQ(ub % fake.alignment(), 0u);
  EXPECT_EQ(fake.live_bytes(), 6000u);
  EXPECT_EQ(fake.Free(*a, 999).code(), StatusCode::kInvalidArgument);  // wrong size
  EXPECT_TRUE(fake.Free(*a, 1000).ok());
  EXPECT_EQ(fake.Free(*a, 1000).code(), StatusCode::kInvalidArgument);  // twice
  EXPECT_TRUE(fake.Free(*b, 5000).ok());
  EXPECT_EQ(fake.live_bytes(), 0u);
}

TEST(FakeMemoryProviderTest, FuseFailsEveryCallAfterTheNth) {
  FakeMemoryProvider fake({.device_bytes = FakeMemoryProvider::kMaxDeviceBytes, .fuse = 2});
  EXPECT_TRUE(fake.Allocate(kKiB).ok());
  EXPECT_TRUE(fake.Allocate(kKiB).ok());
  const auto third = fake.Allocate(kKiB);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("fuse"), std::string::npos);
  EXPECT_FALSE(fake.Allocate(kKiB).ok());
  EXPECT_EQ(fake.allocate_calls(), 4u);
}

TEST(FakeMemoryProviderTest, DeviceSizeLimitsLiveBytes) {
  FakeMemoryProvider fake({.device_bytes = 16 * kGiB, .fuse = std::nullopt});
  auto a = fake.Allocate(10 * kGiB);
  ASSERT_TRUE(a.ok());
  const auto b = fake.Allocate(8 * kGiB);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("8GiB"), std::string::npos) << b.status();
  EXPECT_TRUE(fake.Free(*a, 10 * kGiB).ok());
  EXPECT_TRUE(fake.Allocate(8 * kGiB).ok());
}

// Moves between CPU devices copy one host arena into the other (Note [Migration]); the fake
// devices copy into each other as GPUs do, moving nothing; host and fake memory do not mix.
TEST(MemoryProviderTest, PeerCopies) {
  auto a = CreateMemoryProvider("host");
  auto b = CreateMemoryProvider("host");
  auto fake = CreateMemoryProvider("fake");
  ASSERT_TRUE(a.ok() && b.ok() && fake.ok());
  EXPECT_EQ((*a)->kind(), "host");
  EXPECT_EQ((*fake)->kind(), "fake");
  auto src = (*a)->Allocate(kMiB);
  auto dst = (*b)->Allocate(kMiB);
  ASSERT_TRUE(src.ok() && dst.ok());
  for (uint64_t i = 0; i < kMiB; ++i) (*src)[i] = static_cast<std::byte>(i * 31 + 7);
  ASSERT_TRUE((*a)->CanCopyToPeer(**b));
  ASSERT_TRUE((*a)->CopyToPeer(*dst, **b, *src, kMiB).ok());
  EXPECT_EQ(std::memcmp(*src, *dst, kMiB), 0);
  EXPECT_FALSE((*a)->CanCopyToPeer(**fake));
  EXPECT_FALSE((*fake)->CanCopyToPeer(**a));
  EXPECT_EQ((*a)->CopyToPeer(*dst, **fake, *src, kMiB).code(), StatusCode::kFailedPrecondition);
  auto f1 = (*fake)->Allocate(kMiB);
  ASSERT_TRUE(f1.ok());
  EXPECT_TRUE((*fake)->CanCopyToPeer(**fake));
  EXPECT_TRUE((*fake)->CopyToPeer(*f1, **fake, *f1, kMiB).ok());
  EXPECT_TRUE((*fake)->Free(*f1, kMiB).ok());
  EXPECT_TRUE((*a)->Free(*src, kMiB).ok());
  EXPECT_TRUE((*b)->Free(*dst, kMiB).ok());
}

TEST(CreateMemoryProviderTest, ByName) {
  for (const char* name : {"cpu", "host"}) {
    auto p = CreateMemoryProvider(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->name(), "host");
    EXPECT_TRUE((*p)->host_accessible());
  }
  auto fake = CreateMemoryProvider("fake");
  ASSERT_TRUE(fake.ok());
  EXPECT_EQ((*fake)->name(), "fake");

  const auto unknown = CreateMemoryProvider("tpu");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'tpu'"), std::string::npos);
  for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "cuda0", "cuda:1x"}) {
    EXPECT_EQ(CreateMemoryProvider(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
#ifdef SALUS_HAVE_CUDA
  auto cuda = CreateMemoryProvider("cuda:1");
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ((*cuda)->name(), "cuda:1");
#else
  EXPECT_EQ(CreateMemoryProvider("cuda").status().code(), StatusCode::kFailedPrecondition);
#endif
}

}  // namespace
}  // namespace salus::device
