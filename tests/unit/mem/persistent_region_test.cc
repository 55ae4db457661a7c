#include "mem/persistent_region.h"

#include <gtest/gtest.h>

namespace salus::mem {
namespace {

using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

TEST(PersistentRegionTest, GrowsDownFromTheCapacity) {
  PersistentRegion r(1000);
  EXPECT_EQ(r.floor(), 1000u);
  EXPECT_EQ(r.Place(100), 900u);
  EXPECT_EQ(r.Place(50), 850u);
  EXPECT_EQ(r.extent(), 150u);
  EXPECT_EQ(r.block_bytes(), 150u);
}

TEST(PersistentRegionTest, HolesAreReusedBestFitAndMerged) {
  PersistentRegion r(1000);
  const uint64_t a = r.Place(100);  // [900, 1000)
  const uint64_t b = r.Place(50);   // [850, 900)
  const uint64_t c = r.Place(200);  // [650, 850)
  const uint64_t d = r.Place(30);   // [620, 650)
  ASSERT_EQ(d, 620u);
  ASSERT_TRUE(r.Remove(a));
  ASSERT_TRUE(r.Remove(c));
  EXPECT_EQ(r.Holes(), (Ranges{{650, 200}, {900, 100}}));
  // 80 bytes: best fit is the 100-byte hole, placed at its top end.
  EXPECT_EQ(r.ExtentWith(80), 380u);
  EXPECT_EQ(r.Place(80), 920u);
  // 300 bytes fit no hole: below the floor.
  EXPECT_EQ(r.ExtentWith(300), 680u);
  ASSERT_TRUE(r.Remove(b));  // merges [650, 850), [850, 900) and [900, 920)
  EXPECT_EQ(r.Holes(), (Ranges{{650, 270}}));
  EXPECT_FALSE(r.Remove(b));
}

TEST(PersistentRegionTest, FreeingTheLowestBlockRaisesTheFloor) {
  PersistentRegion r(1000);
  r.Place(100);                    // [900, 1000)
  const uint64_t b = r.Place(50);  // [850, 900)
  const uint64_t c = r.Place(25);  // [825, 850)
  ASSERT_TRUE(r.Remove(b));
  EXPECT_EQ(r.floor(), 825u);
  ASSERT_TRUE(r.Remove(c));  // the hole above it goes too
  EXPECT_EQ(r.floor(), 900u);
  EXPECT_TRUE(r.Holes().empty());
  EXPECT_EQ(r.extent(), 100u);
}

}  // namespace
}  // namespace salus::mem
