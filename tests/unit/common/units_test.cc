#include "common/units.h"

#include <gtest/gtest.h>

namespace salus {
namespace {

struct ParseCase {
  const char* text;
  uint64_t bytes;
};

TEST(ParseBytesTest, AcceptsUnits) {
  const ParseCase cases[] = {
      {"0", 0},
      {"4096", 4096},
      {"16GiB", 16 * kGiB},
      {"512MiB", 512 * kMiB},
      {"1.5GB", 1500000000ULL},
      {"1.5GiB", 3 * kGiB / 2},
      {"2KiB", 2048},
      {"2kb", 2000},
      {"3 MB", 3000000},
      {"8G", 8 * kGiB},
      {"1t", kTiB},
      {"  64B ", 64},
      {"1.5KiB", 1536},
      {"0.1B", 0},  // rounds down to whole bytes
  };
  for (const auto& c : cases) {
    auto got = ParseBytes(c.text);
    ASSERT_TRUE(got.ok()) << c.text << ": " << got.status();
    EXPECT_EQ(*got, c.bytes) << c.text;
  }
}

TEST(ParseBytesTest, RejectsBadInputNamingIt) {
  const char* bad[] = {"",
                       "   ",
                       "-1GiB",
                       "GiB",
                       "12XB",
                       "1..5GiB",
                       "1.2.3",
                       ".",
                       "abc",
                       "99999999999999999999",
                       "20000000TiB",
                       "1e3",
                       "16 GiB extra"};
  for (const char* text : bad) {
    auto got = ParseBytes(text);
    ASSERT_FALSE(got.ok()) << "accepted '" << text << "'";
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << got.status();
  }
  EXPECT_NE(ParseBytes("12XB").status().message().find("unknown unit 'XB'"), std::string::npos);
  EXPECT_NE(ParseBytes("-3").status().message().find("negative"), std::string::npos);
}

TEST(FormatBytesTest, PicksLargestUnit) {
  EXPECT_EQ(FormatBytes(0), "0B");
  EXPECT_EQ(FormatBytes(100), "100B");
  EXPECT_EQ(FormatBytes(1024), "1KiB");
  EXPECT_EQ(FormatBytes(16 * kGiB), "16GiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.5GiB");
  EXPECT_EQ(FormatBytes(512 * kMiB), "512MiB");
  EXPECT_EQ(FormatBytes(2 * kTiB), "2TiB");
  EXPECT_EQ(FormatBytes(1234567), "1.18MiB");
}

TEST(FormatBytesTest, RoundTripsWholeUnits) {
  for (uint64_t v : {kKiB, 3 * kMiB, 5 * kGiB, 7 * kTiB, uint64_t{1536}}) {
    auto back = ParseBytes(FormatBytes(v));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, v);
  }
}

}  // namespace
}  // namespace salus
