// Snapshot files: written whole, read back verified, and refused when anything is damaged.
#include "server/snapshot.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/sha256.h"

namespace salus::server {
namespace {

namespace fs = std::filesystem;

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/salus-snapshot-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Two sessions: one with two state values, one that never ran (no state).
  static SnapshotData Sample() {
    SnapshotData d;
    d.manifest.set_protocol_version(1);
    d.manifest.set_server_version("test");
    v1::SnapshotClient* c = d.manifest.add_clients();
    c->set_id(3);
    c->set_name("c3/uid:1000");
    c->set_principal("uid:1000");
    c->set_token_sha256(std::string(32, 'h'));
    v1::SnapshotSession* s = d.manifest.add_sessions();
    s->set_session_id(77);
    s->set_client(3);
    s->mutable_create()->set_name("fit");
    s->set_iterations_done(5);
    v1::TensorSpec* w = s->add_state();
    w->set_name("w");
    w->set_dtype(v1::FLOAT32);
    w->add_shape(2);
    w->add_shape(3);
    v1::TensorSpec* step = s->add_state();
    step->set_name("step");
    step->set_dtype(v1::INT64);
    d.states.push_back(std::string(24, '\x01') + std::string(8, '\x02'));
    v1::SnapshotSession* waiting = d.manifest.add_sessions();
    waiting->set_session_id(78);
    waiting->set_client(3);
    d.states.emplace_back();
    return d;
  }

  std::string StateFile() const {
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind("state-", 0) == 0) return e.path().string();
    }
    return "";
  }

  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }
  static void Write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }

  std::string dir_;
};

TEST_F(SnapshotTest, WhatIsWrittenIsReadBack) {
  SnapshotData written = Sample();
  ASSERT_TRUE(WriteSnapshot(dir_, &written).ok());
  EXPECT_TRUE(HasSnapshot(dir_));
  auto read = ReadSnapshot(dir_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->manifest.format_version(), kSnapshotFormat);
  ASSERT_EQ(read->manifest.sessions_size(), 2);
  EXPECT_EQ(read->manifest.sessions(0).iterations_done(), 5);
  EXPECT_EQ(read->manifest.sessions(0).create().name(), "fit");
  EXPECT_EQ(read->states, written.states);
  EXPECT_TRUE(read->manifest.sessions(1).state_file().empty());
  EXPECT_EQ(read->manifest.clients(0).token_sha256(), std::string(32, 'h'));
  // A CreateSession is written once, in a file of its own, and not in the manifest.
  size_t specs = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    specs += e.path().filename().string().rfind("create-", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(specs, 2u);
  EXPECT_EQ(Read(dir_ + "/snapshot.pb").find("fit"), std::string::npos);
  // No temporary file is left behind.
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().string().find(".partial"), std::string::npos) << e.path();
  }
}

TEST_F(SnapshotTest, ANewSnapshotReplacesTheOldAndItsStateFiles) {
  SnapshotData first = Sample();
  first.manifest.set_written_unix_ms(1000);
  ASSERT_TRUE(WriteSnapshot(dir_, &first).ok());
  const std::string old_file = StateFile();
  SnapshotData second = Sample();
  second.manifest.set_written_unix_ms(2000);
  second.states[0][0] = '\x09';
  ASSERT_TRUE(WriteSnapshot(dir_, &second).ok());
  EXPECT_FALSE(fs::exists(old_file));
  auto read = ReadSnapshot(dir_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->states[0][0], '\x09');
}

TEST_F(SnapshotTest, DamageAnywhereRefusesTheWholeSnapshot) {
  struct Case {
    const char* what;
    std::function<void(const std::string& dir, const std::string& state)> damage;
    StatusCode code;
    const char* said;
  };
  const std::vector<Case> cases = {
      {"a flipped bit in a state file",
       [](const std::string&, const std::string& state) {
         std::string b = Read(state);
         b[3] ^= 0x10;
         Write(state, b);
       },
       StatusCode::kDataLoss, "its SHA-256"},
      {"a truncated state file",
       [](const std::string&, const std::string& state) { Write(state, Read(state).substr(1)); },
       StatusCode::kDataLoss, "truncated"},
      {"a damaged spec file",
       [](const std::string& dir, const std::string&) {
         for (const auto& e : fs::directory_iterator(dir)) {
           if (e.path().filename().string().rfind("create-", 0) != 0) continue;
           std::string b = Read(e.path().string());
           Write(e.path().string(), b + "x");
         }
       },
       StatusCode::kDataLoss, "snapshot spec file"},
      {"a missing state file",
       [](const std::string&, const std::string& state) { fs::remove(state); },
       StatusCode::kDataLoss, "is missing"},
      {"a flipped bit in the manifest",
       [](const std::string& dir, const std::string&) {
         const std::string m = dir + "/snapshot.pb";
         std::string b = Read(m);
         b[b.size() / 2] ^= 0x01;
         Write(m, b);
       },
       StatusCode::kDataLoss, "snapshot manifest"},
      {"a newer format",
       [](const std::string& dir, const std::string&) {
         v1::SnapshotFile f;
         ASSERT_TRUE(f.ParseFromString(Read(dir + "/snapshot.pb")));
         v1::Snapshot m;
         ASSERT_TRUE(m.ParseFromString(f.manifest()));
         m.set_format_version(kSnapshotFormat + 1);
         f.set_manifest(m.SerializeAsString());
         f.set_sha256(Sha256(f.manifest()));
         Write(dir + "/snapshot.pb", f.SerializeAsString());
       },
       StatusCode::kFailedPrecondition, "has format 2"},
  };
  for (const Case& c : cases) {
    fs::remove_all(dir_);
    SnapshotData d = Sample();
    ASSERT_TRUE(WriteSnapshot(dir_, &d).ok());
    c.damage(dir_, StateFile());
    auto read = ReadSnapshot(dir_);
    EXPECT_EQ(read.status().code(), c.code) << c.what << ": " << read.status();
    EXPECT_NE(read.status().message().find(c.said), std::string::npos)
        << c.what << ": " << read.status();
  }
}

TEST_F(SnapshotTest, ARetiredSnapshotIsNotThereToRestoreAgain) {
  EXPECT_EQ(ReadSnapshot(dir_).status().code(), StatusCode::kNotFound);
  SnapshotData d = Sample();
  ASSERT_TRUE(WriteSnapshot(dir_, &d).ok());
  ASSERT_TRUE(RetireSnapshot(dir_).ok());
  EXPECT_FALSE(HasSnapshot(dir_));
  EXPECT_TRUE(fs::exists(fs::path(dir_) / kSnapshotRestored));
}

}  // namespace
}  // namespace salus::server
