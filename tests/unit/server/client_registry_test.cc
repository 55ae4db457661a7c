// ClientRegistry on the manual clock: tokens bound to principals, leases, quotas.
#include "server/client_registry.h"

#include <gtest/gtest.h>

#include <set>

namespace salus::server {
namespace {

using namespace std::chrono_literals;

constexpr Nanos kLease = std::chrono::seconds(30);

TEST(ClientRegistryTest, TokenNamesItsClientOnlyForThePrincipalThatSaidHello) {
  ManualClock clock;
  ClientRegistry reg(&clock, kLease, Quotas{});
  std::string token;
  auto a = reg.Hello("uid:1000", &token);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(token.size(), 64u);  // 256 bits, hex
  EXPECT_EQ(a->principal, "uid:1000");
  EXPECT_NE(a->name.find("uid:1000"), std::string::npos);

  auto same = reg.Resolve(token, "uid:1000");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->id, a->id);
  // Another user holding the token, a made-up token, no token: all the same refusal.
  for (auto [t, p] : {std::pair{token, "uid:1001"}, std::pair{std::string(64, '0'), "uid:1000"},
                      std::pair{std::string(), "uid:1000"}}) {
    auto r = reg.Resolve(t, p);
    EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated) << p;
  }
}

TEST(ClientRegistryTest, EveryHelloGetsAFreshUnguessableToken) {
  ManualClock clock;
  ClientRegistry reg(&clock, kLease, Quotas{});
  std::set<std::string> tokens;
  std::set<uint64_t> ids;
  for (int i = 0; i < 100; ++i) {
    std::string token;
    auto c = reg.Hello("tcp:127.0.0.1", &token);
    ASSERT_TRUE(c.ok());
    tokens.insert(token);
    ids.insert(c->id);
  }
  EXPECT_EQ(tokens.size(), 100u);
  EXPECT_EQ(ids.size(), 100u);
}

TEST(ClientRegistryTest, LeaseRunsOutOnlyWhenSilentWithNothingInFlight) {
  ManualClock clock;
  ClientRegistry reg(&clock, kLease, Quotas{});
  std::string quiet_token, busy_token;
  auto quiet = reg.Hello("uid:1", &quiet_token);
  auto busy = reg.Hello("uid:1", &busy_token);
  ASSERT_TRUE(quiet.ok() && busy.ok());
  ASSERT_TRUE(reg.BeginRequest(busy->id).ok());  // a long iteration: owed a reply
  clock.Advance(kLease);
  EXPECT_TRUE(reg.Expire().empty()) << "expired at exactly the lease";
  clock.Advance(1s);
  EXPECT_EQ(reg.Expire(), std::vector<uint64_t>{quiet->id});
  EXPECT_EQ(reg.Resolve(quiet_token, "uid:1").status().code(), StatusCode::kUnauthenticated);
  // The reply goes out: the busy client was alive until then, and lives a lease from there.
  reg.EndRequest(busy->id);
  clock.Advance(kLease);
  EXPECT_TRUE(reg.Expire().empty());
  clock.Advance(1s);
  EXPECT_EQ(reg.Expire(), std::vector<uint64_t>{busy->id});
  EXPECT_EQ(reg.Count(), 0u);
}

// Note [Leases and stalls]: silence is measured up to the last time every request had been
// read, so a stall of the daemon longer than the lease expires no one before the requests
// queued meanwhile are read.
TEST(ClientRegistryTest, AStallOfTheDaemonIsNotTheClientsSilence) {
  ManualClock clock;
  ClientRegistry reg(&clock, kLease, Quotas{});
  std::string token;
  ASSERT_TRUE(reg.Hello("uid:1", &token).ok());
  const Nanos stalled_at = clock.Now();
  clock.Advance(kLease * 3);  // nothing read meanwhile
  EXPECT_TRUE(reg.Expire(stalled_at).empty());
  // The queued heartbeat is read: the client is renewed from now.
  ASSERT_TRUE(reg.Resolve(token, "uid:1").ok());
  EXPECT_TRUE(reg.Expire(clock.Now()).empty());
  clock.Advance(kLease + 1s);
  EXPECT_EQ(reg.Expire(clock.Now()).size(), 1u) << "silent for a lease of read time";
}

// The bytes of a client's unanswered requests are bounded per client (request_bytes) and for
// all clients together; a refused request counts nothing, and replies give the bytes back.
TEST(ClientRegistryTest, RequestBytesInFlightAreBounded) {
  ManualClock clock;
  Quotas q;
  q.request_bytes = 100;
  ClientRegistry reg(&clock, kLease, q, /*max_request_bytes=*/150);
  std::string ta, tb;
  auto a = reg.Hello("uid:1", &ta);
  auto b = reg.Hello("uid:2", &tb);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(reg.BeginRequest(a->id, 60).ok());
  Status over = reg.BeginRequest(a->id, 41);
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("request_bytes=100"), std::string::npos) << over;
  ASSERT_TRUE(reg.BeginRequest(a->id, 40).ok());
  Status all = reg.BeginRequest(b->id, 60);  // 100 + 60 > 150
  EXPECT_NE(all.message().find("limits.request_bytes"), std::string::npos) << all;
  EXPECT_EQ(reg.request_bytes(), 100u);
  reg.EndRequest(a->id, 60);
  EXPECT_TRUE(reg.BeginRequest(b->id, 60).ok());
  EXPECT_EQ(reg.request_bytes(), 100u);
}

TEST(ClientRegistryTest, ResolvingRenewsTheLease) {
  ManualClock clock;
  ClientRegistry reg(&clock, kLease, Quotas{});
  std::string token;
  ASSERT_TRUE(reg.Hello("uid:1", &token).ok());
  for (int i = 0; i < 5; ++i) {
    clock.Advance(20s);
    ASSERT_TRUE(reg.Resolve(token, "uid:1").ok());
    EXPECT_TRUE(reg.Expire().empty());
  }
}

TEST(ClientRegistryTest, RequestsInFlightQuotaRefusesAndRecovers) {
  ManualClock clock;
  Quotas q;
  q.requests_in_flight = 2;
  ClientRegistry reg(&clock, kLease, q);
  std::string token;
  auto c = reg.Hello("uid:1", &token);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(reg.BeginRequest(c->id).ok());
  ASSERT_TRUE(reg.BeginRequest(c->id).ok());
  const Status third = reg.BeginRequest(c->id);
  EXPECT_EQ(third.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("requests_in_flight=2"), std::string::npos) << third;
  reg.EndRequest(c->id);
  EXPECT_TRUE(reg.BeginRequest(c->id).ok());
}

TEST(ClientRegistryTest, ClientsPerPrincipalQuotaCountsLiveClientsOnly) {
  ManualClock clock;
  Quotas q;
  q.clients_per_principal = 2;
  ClientRegistry reg(&clock, kLease, q);
  std::string t;
  ASSERT_TRUE(reg.Hello("uid:1", &t).ok());
  ASSERT_TRUE(reg.Hello("uid:1", &t).ok());
  const auto third = reg.Hello("uid:1", &t);
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("clients_per_principal=2"), std::string::npos);
  EXPECT_TRUE(reg.Hello("uid:2", &t).ok()) << "another principal is not limited by uid:1";
  clock.Advance(kLease + 1s);
  EXPECT_EQ(reg.Expire().size(), 3u);
  EXPECT_TRUE(reg.Hello("uid:1", &t).ok());
}

TEST(QuotasTest, ParsesTheConfigSectionAndNamesWhatIsWrong) {
  auto q = Quotas::FromJson(nlohmann::json::parse(
      R"({"sessions": 3, "persistent_bytes": "1GiB", "requests_in_flight": 8,
          "shared_buffers": 2, "clients_per_principal": 16, "max_priority": 5})"));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->sessions, 3u);
  EXPECT_EQ(q->persistent_bytes, uint64_t{1} << 30);
  EXPECT_EQ(q->requests_in_flight, 8u);
  EXPECT_EQ(q->shared_buffers, 2u);
  EXPECT_EQ(q->clients_per_principal, 16u);
  EXPECT_EQ(q->max_priority, 5u);
  const Quotas defaults;
  auto none = Quotas::FromJson(nlohmann::json());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->requests_in_flight, defaults.requests_in_flight);

  for (const char* bad : {R"({"sesions": 1})", R"({"sessions": -1})", R"({"sessions": "3"})",
                          R"({"persistent_bytes": "lots"})", R"([1])"}) {
    auto r = Quotas::FromJson(nlohmann::json::parse(bad));
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(Quotas::FromJson(nlohmann::json::parse(R"({"sesions": 1})"))
                .status()
                .message()
                .find("sesions"),
            std::string::npos);
}

TEST(ClientRegistryTest, ARestoredClientIsNamedByTheTokenItHadAndKeepsNoTokenItself) {
  ManualClock clock;
  std::string token;
  std::optional<ClientRegistry::Saved> saved;
  {
    ClientRegistry before(&clock, kLease, Quotas{});
    auto a = before.Hello("uid:1000", &token);
    ASSERT_TRUE(a.ok());
    saved = before.Save(a->id);
    ASSERT_TRUE(saved.has_value());
    EXPECT_EQ(saved->token_sha256.size(), 32u);
    EXPECT_EQ(saved->token_sha256.find(token), std::string::npos);  // only its hash
    EXPECT_FALSE(before.Save(a->id + 1).has_value());
  }
  ClientRegistry after(&clock, kLease, Quotas{});
  ASSERT_TRUE(after.Restore(*saved).ok());
  EXPECT_EQ(after.Restore(*saved).code(), StatusCode::kAlreadyExists);
  auto back = after.Resolve(token, "uid:1000");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, saved->ref.id);
  EXPECT_EQ(back->name, saved->ref.name);
  // Still bound to its principal; and a new client never takes its id.
  EXPECT_EQ(after.Resolve(token, "uid:1001").status().code(), StatusCode::kUnauthenticated);
  std::string other;
  auto fresh = after.Hello("uid:1000", &other);
  ASSERT_TRUE(fresh.ok());
  EXPECT_GT(fresh->id, saved->ref.id);
  EXPECT_EQ(after.CountOf("uid:1000"), 2u);
  // Its lease starts at the restore: silent past it, it is forgotten as any client.
  clock.Advance(kLease + 1s);
  EXPECT_EQ(after.Expire().size(), 2u);
  EXPECT_EQ(after.Resolve(token, "uid:1000").status().code(), StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace salus::server
