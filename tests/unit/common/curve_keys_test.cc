// CURVE key text and the daemon's endpoint helpers.
#include "common/curve_keys.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/endpoints.h"

namespace salus {
namespace {

// A key ZeroMQ's own test vectors use (RFC 32's example public key).
constexpr char kKey[] = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";

std::string WriteFile(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("salus-keys-test-" + std::to_string(getpid()) + "-" + name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(CurveKeysTest, RecognisesZ85Keys) {
  EXPECT_TRUE(IsZ85Key(kKey));
  EXPECT_FALSE(IsZ85Key(std::string(kKey).substr(1)));
  EXPECT_FALSE(IsZ85Key(std::string(kKey) + "a"));
  EXPECT_FALSE(IsZ85Key(std::string(39, 'a') + "~"));  // '~' is not in the alphabet
}

TEST(CurveKeysTest, ReadsKeyFilesWithCommentsAndNamesBadOnes) {
  const std::string good = WriteFile("good", std::string("# a comment\n\n  ") + kKey + "  \n");
  auto key = ReadKeyFile(good);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, kKey);
  auto resolved = ResolveKey(good);
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(*resolved, kKey);
  EXPECT_EQ(*ResolveKey(kKey), kKey);  // inline

  const std::string two = WriteFile("two", std::string(kKey) + "\n" + kKey + "\n");
  EXPECT_EQ(ReadKeyFile(two).status().code(), StatusCode::kInvalidArgument);
  auto list = ReadKeyList(two);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);

  const std::string junk = WriteFile("junk", "not a key\n");
  const Status bad = ReadKeyFile(junk).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(junk), std::string::npos) << bad;
  EXPECT_EQ(ReadKeyFile("/nonexistent/salus.key").status().code(), StatusCode::kNotFound);
  for (const auto& p : {good, two, junk}) std::filesystem::remove(p);
}

TEST(EndpointsTest, OnlyIpcAndLoopbackAreLocal) {
  for (const char* ep : {"ipc:///run/salus/salus.sock", "inproc://x", "tcp://127.0.0.1:5501",
                         "tcp://127.1.2.3:1", "tcp://localhost:5501", "tcp://[::1]:5501"}) {
    EXPECT_TRUE(IsLocalEndpoint(ep)) << ep;
  }
  for (const char* ep : {"tcp://0.0.0.0:5501", "tcp://*:5501", "tcp://10.0.0.4:5501",
                         "tcp://eth0:5501", "tcp://[::]:5501", "udp://127.0.0.1:1"}) {
    EXPECT_FALSE(IsLocalEndpoint(ep)) << ep;
  }
  EXPECT_EQ(DefaultIpcEndpoint().rfind("ipc://", 0), 0u);
}

}  // namespace
}  // namespace salus
