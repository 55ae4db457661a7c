#include "common/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/units.h"

namespace salus {
namespace {

Config MustParse(const char* text) {
  auto c = Config::FromJsonText(text, "test.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Config();
}

TEST(ConfigTest, ReadsTypedValues) {
  Config c = MustParse(R"({"memory": {"capacity": "16GiB", "reserve": 1024},
                            "policy": "fair", "threads": 4, "ratio": 0.5, "debug": true,
                            "listen": ["ipc:///tmp/a", "tcp://127.0.0.1:5501"]})");
  EXPECT_EQ(*c.GetBytes("memory.capacity"), 16 * kGiB);
  EXPECT_EQ(*c.GetBytes("memory.reserve"), 1024u);
  EXPECT_EQ(*c.GetString("policy"), "fair");
  EXPECT_EQ(*c.GetInt("threads"), 4);
  EXPECT_DOUBLE_EQ(*c.GetDouble("ratio"), 0.5);
  EXPECT_TRUE(*c.GetBool("debug"));
  EXPECT_EQ(c.GetStrings("listen")->size(), 2u);
  EXPECT_EQ(c.GetStrings("policy")->at(0), "fair");
}

TEST(ConfigTest, FallbacksOnlyForAbsentKeys) {
  Config c = MustParse(R"({"threads": "four"})");
  EXPECT_EQ(*c.GetInt("missing", 7), 7);
  EXPECT_EQ(*c.GetString("a.b.c", "x"), "x");
  auto wrong = c.GetInt("threads", 7);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("'threads'"), std::string::npos);
}

TEST(ConfigTest, ErrorsNameKeyAndOrigin) {
  Config c = MustParse(R"({"memory": {"capacity": "12XB"}})");
  auto bad = c.GetBytes("memory.capacity");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("memory.capacity"), std::string::npos);
  EXPECT_NE(bad.status().message().find("12XB"), std::string::npos);
  auto missing = c.GetString("policy");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("test.json"), std::string::npos);
}

TEST(ConfigTest, OverridesParseJsonOrString) {
  Config c = MustParse(R"({"memory": {"capacity": "16GiB"}, "policy": "fifo"})");
  ASSERT_TRUE(
      c.ApplyOverrides({"memory.capacity=8GiB", "policy=srtf", "threads=2", "new.nested.flag=true"})
          .ok());
  EXPECT_EQ(*c.GetBytes("memory.capacity"), 8 * kGiB);
  EXPECT_EQ(*c.GetString("policy"), "srtf");
  EXPECT_EQ(*c.GetInt("threads"), 2);
  EXPECT_TRUE(*c.GetBool("new.nested.flag"));
}

TEST(ConfigTest, RejectsBadOverrides) {
  Config c = MustParse(R"({"policy": "fifo"})");
  EXPECT_EQ(c.ApplyOverride("noequals").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ApplyOverride("=value").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ApplyOverride("a..b=1").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ApplyOverride("policy.sub=1").code(), StatusCode::kInvalidArgument);
}

TEST(ConfigTest, RejectsBadFiles) {
  EXPECT_EQ(Config::FromFile("/nonexistent/salus.json").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Config::FromJsonText("{not json", "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Config::FromJsonText("[1, 2]", "x").status().code(), StatusCode::kInvalidArgument);
}

TEST(ConfigTest, ReadsFileWithComments) {
  const auto path = std::filesystem::temp_directory_path() / "salus_config_test.json";
  {
    std::ofstream out(path);
    out << "{\n  // the scheduling policy\n  \"policy\": \"pack\"\n}\n";
  }
  auto c = Config::FromFile(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c->GetString("policy"), "pack");
  EXPECT_TRUE(c->Section("absent").empty());
}

// Note [Config mistakes].
TEST(ConfigTest, NearestNameForgivesCaseDashesAndSmallSlips) {
  const std::vector<std::string> known = {"metrics_listen", "memory", "policy", "lease_seconds"};
  EXPECT_EQ(NearestName("metrics-listen", known), "metrics_listen");
  EXPECT_EQ(NearestName("Policy", known), "policy");
  EXPECT_EQ(NearestName("memroy", known), "memory");
  EXPECT_EQ(NearestName("lease_second", known), "lease_seconds");
  EXPECT_EQ(NearestName("threads", known), "");
  EXPECT_EQ(DidYouMean("polcy", known), ": did you mean 'policy'?");
  EXPECT_EQ(DidYouMean("xyz", known), "");
}

TEST(ConfigTest, CheckKnownKeysNamesTheUnknownKeyAndWhere) {
  auto ok = CheckKnownKeys(nlohmann::json{{"policy", "fair"}}, "config 'x'", {"policy"});
  EXPECT_TRUE(ok.ok()) << ok;
  auto bad = CheckKnownKeys(nlohmann::json{{"polcy", "fair"}}, "config 'x'", {"policy", "memory"});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "unknown key 'polcy' in config 'x': did you mean 'policy'? (known: policy, memory)");
}

}  // namespace
}  // namespace salus
