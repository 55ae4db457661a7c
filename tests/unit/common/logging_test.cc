#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

namespace salus {
namespace {

TEST(LoggingTest, OneLoggerPerModule) {
  auto a = logging::Get("mem");
  auto b = logging::Get("mem");
  auto c = logging::Get("sched");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(a->name(), "salus.mem");
}

TEST(LoggingTest, EventIsOneParseableLine) {
  nlohmann::json fields = {{"session", 3}, {"note", "two\nlines"}};
  const std::string line = logging::FormatEvent("admitted", fields);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  ASSERT_EQ(line.rfind("event: admitted ", 0), 0u);
  auto parsed = nlohmann::json::parse(line.substr(std::string("event: admitted ").size()));
  EXPECT_EQ(parsed["session"], 3);
  EXPECT_EQ(parsed["note"], "two\nlines");
}

// A client's long string (a name of megabytes) costs the log a bounded line.
TEST(LoggingTest, LongStringsAreCut) {
  nlohmann::json fields = {{"name", std::string(1 << 20, '\0')},
                           {"nested", {{"path", std::string(1000, 'a')}}},
                           {"short", "kept"}};
  const std::string line = logging::FormatEvent("session_created", fields);
  EXPECT_LT(line.size(), 4 * 1024u);
  auto parsed = nlohmann::json::parse(line.substr(std::string("event: session_created ").size()));
  EXPECT_EQ(parsed["short"], "kept");
  EXPECT_NE(parsed["nested"]["path"].get<std::string>().find("(744 more bytes)"),
            std::string::npos);
}

TEST(LoggingTest, EventsReachSinksAndLevelsFilter) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  logging::AddSink(sink);
  logging::Event("server", "ready", {{"port", 5501}});
  ASSERT_TRUE(logging::SetLevel("error").ok());
  logging::Get("server")->info("hidden");
  ASSERT_TRUE(logging::SetLevel("info").ok());
  logging::RemoveSink(sink);
  const std::string text = out.str();
  EXPECT_NE(text.find("event: ready {\"port\":5501}"), std::string::npos) << text;
  EXPECT_EQ(text.find("hidden"), std::string::npos);
}

TEST(LoggingTest, LifecycleEventsSurviveQuietLevels) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  logging::AddSink(sink);
  ASSERT_TRUE(logging::SetLevel("error").ok());
  logging::Lifecycle("ready", {{"pid", 1}});
  logging::Event("server", "quiet", {{"pid", 1}});
  ASSERT_TRUE(logging::SetLevel("off").ok());
  logging::Lifecycle("stopped", nlohmann::json::object());
  ASSERT_TRUE(logging::SetLevel("info").ok());
  logging::RemoveSink(sink);
  const std::string text = out.str();
  EXPECT_NE(text.find("event: ready {\"pid\":1}"), std::string::npos) << text;
  EXPECT_EQ(text.find("quiet"), std::string::npos);
  EXPECT_EQ(text.find("stopped"), std::string::npos);
}

TEST(LoggingTest, RejectsUnknownLevel) {
  Status s = logging::SetLevel("loud");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'loud'"), std::string::npos);
}

}  // namespace
}  // namespace salus
