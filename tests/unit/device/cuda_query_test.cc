#include "device/cuda_query.h"

#include <gtest/gtest.h>

namespace salus::device {
namespace {

// Runs everywhere: with no GPU (or no CUDA in the build) the query must say so cleanly.
TEST(CudaQueryTest, ReportsDevicesOrWhyNot) {
  const CudaAvailability cuda = QueryCuda();
#ifdef SALUS_HAVE_CUDA
  EXPECT_TRUE(cuda.compiled);
  EXPECT_GT(cuda.runtime_version, 0);
#else
  EXPECT_FALSE(cuda.compiled);
#endif
  if (cuda.devices.empty()) {
    EXPECT_EQ(cuda.reason.rfind("no GPU", 0), 0u) << cuda.reason;
  } else {
    EXPECT_TRUE(cuda.reason.empty());
    for (const auto& d : cuda.devices) {
      EXPECT_GT(d.total_bytes, 0u);
      EXPECT_FALSE(d.name.empty());
    }
  }
}

}  // namespace
}  // namespace salus::device
