// AllocationRegistry: grant validation, updates and their tokens, resolving a token, the memory
// budget, revoke; and ClientRegistry's side of it (clients of an allocation), on the manual
// clock.
#include "server/allocation_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "server/client_registry.h"

namespace salus::server {
namespace {

constexpr Nanos kLease = std::chrono::seconds(30);
constexpr uint64_t kMiB = uint64_t{1} << 20;
const std::string kToken(32, 'a');
const std::string kOtherToken(40, 'b');

v1::Allocation Alloc(const std::string& id, const std::string& token, uint64_t memory = 0) {
  v1::Allocation a;
  a.set_id(id);
  a.set_token(token);
  a.set_memory_bytes(memory);
  return a;
}

// The field an INVALID_ARGUMENT names ("allocation.<field>: ...").
std::string FieldOf(const Status& s) {
  const std::string& m = s.message();
  const size_t dot = m.find('.'), colon = m.find(':');
  if (s.code() != StatusCode::kInvalidArgument || dot == std::string::npos || colon < dot) {
    return "(" + s.ToString() + ")";
  }
  return m.substr(dot + 1, colon - dot - 1);
}

TEST(AllocationRegistryTest, GrantRefusesBadFieldsNamingThem) {
  struct Case {
    const char* scenario;
    v1::Allocation allocation;
    const char* field;
  };
  auto with = [](auto change) {
    v1::Allocation a = Alloc("a1", kToken);
    change(a);
    return a;
  };
  const Case cases[] = {
      {"empty id", Alloc("", kToken), "id"},
      {"upper case", Alloc("A1", kToken), "id"},
      {"starts with a dash", Alloc("-a", kToken), "id"},
      {"a slash", Alloc("ns/pod", kToken), "id"},
      {"64 characters", Alloc(std::string(64, 'a'), kToken), "id"},
      {"no token", Alloc("a1", ""), "token"},
      {"31 characters", Alloc("a1", std::string(31, 'x')), "token"},
      {"priority above the protocol's", with([](auto& a) { a.set_priority(101); }), "priority"},
      {"priority below it", with([](auto& a) { a.set_priority(-101); }), "priority"},
      {"negative ceiling", with([](auto& a) { a.set_max_priority(-1); }), "max_priority"},
      {"ceiling above 100", with([](auto& a) { a.set_max_priority(101); }), "max_priority"},
      {"priority above its ceiling", with([](auto& a) {
         a.set_priority(10);
         a.set_max_priority(5);
       }),
       "priority"},
      {"unknown class",
       with([](auto& a) { a.set_latency_class(static_cast<v1::LatencyClass>(7)); }),
       "latency_class"},
      {"pod label too long", with([](auto& a) { a.set_pod(std::string(kMaxPodChars + 1, 'p')); }),
       "pod"},
  };
  for (const Case& c : cases) {
    AllocationRegistry reg;
    auto granted = reg.Grant(c.allocation);
    EXPECT_EQ(FieldOf(granted.status()), c.field) << c.scenario;
    EXPECT_EQ(reg.Count(), 0u) << c.scenario;
  }
  // The edges that are fine: 63 characters, dots and dashes, the extreme priorities.
  AllocationRegistry reg;
  EXPECT_TRUE(reg.Grant(Alloc(std::string(63, 'z'), kToken)).ok());
  v1::Allocation edge = Alloc("node-1.pod.0", kOtherToken);
  edge.set_priority(-100);
  edge.set_max_priority(100);
  auto ok = reg.Grant(edge);
  ASSERT_TRUE(ok.ok()) << ok.status();
}

TEST(AllocationRegistryTest, UpdateKeepsTheTokenOrRefusesAnother) {
  AllocationRegistry reg;
  auto first = reg.Grant(Alloc("a1", kToken, 64 * kMiB));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  // The same again: fine, and not created.
  auto again = reg.Grant(Alloc("a1", kToken, 64 * kMiB));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  // An empty token keeps the stored one; the other fields replace (the pod arrives later).
  v1::Allocation update = Alloc("a1", "", 128 * kMiB);
  update.set_pod("default/trainer");
  update.set_latency_class(v1::LATENCY_INTERACTIVE);
  auto updated = reg.Grant(update);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_FALSE(*updated);
  auto terms = reg.Resolve(kToken);
  ASSERT_TRUE(terms.ok()) << terms.status();
  EXPECT_EQ(terms->id, "a1");
  EXPECT_EQ(terms->memory_bytes, 128 * kMiB);
  EXPECT_EQ(terms->latency_class, v1::LATENCY_INTERACTIVE);
  // Another token for the same id is refused, and changes nothing.
  EXPECT_EQ(FieldOf(reg.Grant(Alloc("a1", kOtherToken, 1)).status()), "token");
  EXPECT_EQ(reg.Resolve(kOtherToken).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(reg.Terms("a1")->memory_bytes, 128 * kMiB);
  // A token another id holds is refused for a new id.
  EXPECT_EQ(FieldOf(reg.Grant(Alloc("a2", kToken)).status()), "token");
  EXPECT_EQ(reg.Count(), 1u);
  // The listing has the update and never the token.
  const auto list = reg.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].allocation.pod(), "default/trainer");
  EXPECT_TRUE(list[0].allocation.token().empty());
}

TEST(AllocationRegistryTest, ResolveSaysNoMoreThanUnknown) {
  AllocationRegistry reg;
  ASSERT_TRUE(reg.Grant(Alloc("a1", kToken)).ok());
  for (const std::string& token : {std::string(), std::string(32, 'x'), kToken + "a"}) {
    const Status s = reg.Resolve(token).status();
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated);
    EXPECT_EQ(s.message(), "unknown allocation token");
  }
  ASSERT_TRUE(reg.Resolve(kToken).ok());
}

TEST(AllocationRegistryTest, BudgetCountsEverySessionOfTheAllocation) {
  AllocationRegistry reg;
  ASSERT_TRUE(reg.Grant(Alloc("a1", kToken, 256 * kMiB)).ok());
  ASSERT_TRUE(reg.Grant(Alloc("a2", kOtherToken)).ok());  // no budget
  // Two sessions (of any of its clients) fill it exactly.
  ASSERT_TRUE(reg.Reserve("a1", 1, 200 * kMiB).ok());
  ASSERT_TRUE(reg.Reserve("a1", 2, 56 * kMiB).ok());
  // One byte more is refused, naming the allocation and the budget; nothing changes.
  const Status over = reg.Reserve("a1", 3, 1);
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("allocation a1 memory_bytes=268435456 reached"), std::string::npos)
      << over;
  EXPECT_FALSE(reg.Holds("a1", 3));
  // A session larger than the whole budget (no wrap-around).
  EXPECT_EQ(reg.Reserve("a1", 4, ~uint64_t{0}).code(), StatusCode::kResourceExhausted);
  auto usage = reg.List();
  EXPECT_EQ(usage[0].allocation.used_bytes(), 256 * kMiB);
  EXPECT_EQ(usage[0].allocation.sessions(), 2u);
  // A release frees room; a second release of the same session counts once.
  reg.Release("a1", 1);
  reg.Release("a1", 1);
  reg.Release("a1", 99);  // never charged
  EXPECT_EQ(reg.List()[0].allocation.used_bytes(), 56 * kMiB);
  EXPECT_TRUE(reg.Reserve("a1", 3, 200 * kMiB).ok());
  EXPECT_TRUE(reg.Holds("a1", 3));
  // Without a budget anything goes; iterations are counted per allocation.
  EXPECT_TRUE(reg.Reserve("a2", 5, ~uint64_t{0} / 2).ok());
  reg.IterationDone("a2");
  reg.IterationDone("a2");
  reg.IterationDone("gone");
  usage = reg.List();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].iterations, 0u);
  EXPECT_EQ(usage[1].iterations, 2u);
}

TEST(AllocationRegistryTest, RevokeForgetsTokenAndCharges) {
  AllocationRegistry reg;
  ASSERT_TRUE(reg.Grant(Alloc("a1", kToken, 64 * kMiB)).ok());
  ASSERT_TRUE(reg.Reserve("a1", 7, kMiB).ok());
  ASSERT_TRUE(reg.Revoke("a1").ok());
  EXPECT_EQ(reg.Resolve(kToken).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(reg.Terms("a1").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(reg.Holds("a1", 7));
  EXPECT_EQ(reg.Reserve("a1", 8, 1).code(), StatusCode::kNotFound);
  reg.Release("a1", 7);  // a session closing after the revoke: nothing to give back
  EXPECT_EQ(reg.Revoke("a1").code(), StatusCode::kNotFound);
  EXPECT_EQ(reg.Count(), 0u);
  // The id and the token may be granted again, from nothing.
  auto again = reg.Grant(Alloc("a1", kToken, 64 * kMiB));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again);
  EXPECT_EQ(reg.List()[0].allocation.used_bytes(), 0u);
}

TEST(AllocationClientsTest, ClientOfAnAllocationIsItsPrincipalBoundToTheTransport) {
  ManualClock clock;
  Quotas quotas;
  quotas.clients_per_principal = 2;
  ClientRegistry reg(&clock, kLease, quotas);
  std::string t1, t2, t3, plain_token;
  auto c1 = reg.Hello("uid:0", &t1, "a1");
  ASSERT_TRUE(c1.ok()) << c1.status();
  EXPECT_EQ(c1->principal, "alloc:a1");
  EXPECT_EQ(c1->allocation, "a1");
  EXPECT_NE(c1->name.find("alloc:a1"), std::string::npos);
  // Its token works for the transport principal that said Hello, and no other.
  EXPECT_TRUE(reg.Resolve(t1, "uid:0").ok());
  EXPECT_EQ(reg.Resolve(t1, "alloc:a1").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(reg.Resolve(t1, "uid:1000").status().code(), StatusCode::kUnauthenticated);
  // The clients quota counts the allocation's clients, from whichever transport.
  ASSERT_TRUE(reg.Hello("uid:1000", &t2, "a1").ok());
  EXPECT_EQ(reg.Hello("uid:1001", &t3, "a1").status().code(), StatusCode::kResourceExhausted);
  auto plain = reg.Hello("uid:0", &plain_token);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(reg.CountOf("alloc:a1"), 2u);
  EXPECT_EQ(reg.CountOf("uid:0"), 1u);
  // Revoking drops them at once, in flight or not; the plain client stays.
  ASSERT_TRUE(reg.BeginRequest(c1->id).ok());
  auto dropped = reg.DropAllocation("a1");
  std::sort(dropped.begin(), dropped.end());
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(dropped[0], c1->id);
  EXPECT_EQ(reg.Resolve(t1, "uid:0").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(reg.Resolve(t2, "uid:1000").status().code(), StatusCode::kUnauthenticated);
  EXPECT_TRUE(reg.Resolve(plain_token, "uid:0").ok());
  EXPECT_EQ(reg.CountOf("alloc:a1"), 0u);
  EXPECT_EQ(reg.Count(), 1u);
  reg.EndRequest(c1->id);  // its reply goes out after the drop: nothing to do
  // A dropped client never comes back at expiry.
  clock.Advance(kLease + std::chrono::seconds(1));
  const auto expired = reg.Expire();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], plain->id);
}

}  // namespace
}  // namespace salus::server
