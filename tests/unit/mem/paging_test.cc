// Paging persistent blocks to host memory and admission beyond capacity (Note [Paging]),
// on the fake provider: copies are transfers the test finishes when it chooses.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "mem/admission.h"
#include "test_util.h"

namespace salus::mem {
namespace {

constexpr uint64_t M = kMiB;

struct PagingHarness : testing::Harness {
  explicit PagingHarness(std::shared_ptr<const AdmissionRule> rule = sched::PackRule(),
                         double overcommit = 1.5)
      : Harness(100 * M, std::move(rule), overcommit) {}

  Residence Of(SessionId s) const { return *manager->ResidenceOf(s); }
  // Finishes every copy that may run now, and those that become ready by that.
  int FinishAll() {
    int n = 0;
    for (auto ts = manager->TakeTransfers(); !ts.empty(); ts = manager->TakeTransfers()) {
      for (const Transfer& t : ts) {
        EXPECT_TRUE(FinishTransfer(t.id).ok());
        EXPECT_TRUE(manager->CheckInvariants().ok()) << manager->CheckInvariants();
        ++n;
      }
    }
    return n;
  }
};

TEST(PagingTest, OvercommitAdmitsPagedOutWithinTheRatio) {
  PagingHarness h;
  ASSERT_NE(h.AdmitNow(1, 60 * M, 10 * M), 0u);
  auto g = h.manager->Admit(2, {60 * M, 10 * M});
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_FALSE((*g)->resident);
  EXPECT_EQ((*g)->lane, 0u);
  EXPECT_EQ(h.Of(2), Residence::kPagedOut);
  // 60 + 60 + 40 > 1.5 × 100: waits.
  h.AdmitWaits(3, 40 * M, 10 * M);
  EXPECT_EQ(h.manager->CommittedBytes(), 70 * M);  // only what is resident counts against C
  const MemoryStatsSnapshot s = h.manager->StatsSnapshot();
  EXPECT_EQ(s.paged_bytes, 60 * M);
  EXPECT_EQ(s.paged_sessions, 1u);
  EXPECT_EQ(h.manager->Persistent(2).status().code(), StatusCode::kFailedPrecondition);
  // Releasing the resident one admits the waiting one paged out (nothing is resident to make
  // room for it by itself... it fits resident now).
  ASSERT_TRUE(h.Release(1).ok());
  ASSERT_EQ(h.admitted.size(), 1u);
  EXPECT_TRUE(h.admitted[0].resident);
  EXPECT_TRUE(h.manager->CheckInvariants().ok());
}

TEST(PagingTest, WithoutOvercommitNothingIsAdmittedPagedOut) {
  PagingHarness h(sched::PackRule(), 1.0);
  ASSERT_NE(h.AdmitNow(1, 60 * M, 10 * M), 0u);
  h.AdmitWaits(2, 60 * M, 10 * M);
}

TEST(PagingTest, PageInPagesOutTheCandidatesItNeedsAndCopiesInOrder) {
  PagingHarness h;
  const LaneId lane1 = h.AdmitNow(1, 60 * M, 10 * M);
  ASSERT_TRUE(h.manager->Admit(2, {60 * M, 10 * M}).ok());
  // A fresh session pages in with nothing to copy; session 1 goes out first.
  auto r = h.PageIn(2, std::vector<SessionId>{1});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->resident);
  EXPECT_EQ(r->paged_out, (std::vector<SessionId>{1}));
  EXPECT_EQ(h.Of(1), Residence::kPagingOut);
  EXPECT_EQ(h.Of(2), Residence::kResident);
  EXPECT_NE(r->lane, 0u);
  EXPECT_NE(r->lane, lane1);  // its lane closed with session 1 gone
  // Session 2's block lies where session 1's is still being copied out.
  EXPECT_EQ(h.manager->Persistent(2).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(h.manager->BeginIteration(r->lane, 2).status().code(), StatusCode::kUnavailable);
  auto ts = h.manager->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_TRUE(ts[0].to_host);
  EXPECT_EQ(ts[0].session, 1u);
  EXPECT_EQ(ts[0].bytes, 60 * M);
  EXPECT_TRUE(h.manager->TakeTransfers().empty());  // each handed out once
  ASSERT_TRUE(h.FinishTransfer(ts[0].id).ok());
  EXPECT_EQ(h.Of(1), Residence::kPagedOut);
  EXPECT_TRUE(h.manager->Persistent(2).ok());
  EXPECT_EQ(h.provider.live_host_bytes(), 60 * M);

  // And back: 1 pages in for 2. Its copy in waits for 2's copy out.
  r = h.PageIn(1, std::vector<SessionId>{2});
  ASSERT_TRUE(r.ok() && r->resident);
  EXPECT_EQ(h.Of(1), Residence::kPagingIn);
  EXPECT_EQ(h.manager->Persistent(1).status().code(), StatusCode::kUnavailable);
  ts = h.manager->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);  // 2's copy out only
  EXPECT_EQ(ts[0].session, 2u);
  ASSERT_TRUE(h.FinishTransfer(ts[0].id).ok());
  ts = h.manager->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);  // now 1's copy in
  EXPECT_FALSE(ts[0].to_host);
  EXPECT_EQ(ts[0].session, 1u);
  EXPECT_EQ(h.manager->Persistent(1).status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(h.FinishTransfer(ts[0].id).ok());
  EXPECT_EQ(h.Of(1), Residence::kResident);
  EXPECT_TRUE(h.manager->Persistent(1).ok());
  const MemoryStatsSnapshot s = h.manager->StatsSnapshot();
  EXPECT_EQ(s.page_outs, 2u);
  EXPECT_EQ(s.page_ins, 1u);
  EXPECT_EQ(s.paged_in_bytes, 60 * M);
  EXPECT_EQ(h.provider.live_host_bytes(), 60 * M);  // 2's state
  ASSERT_TRUE(h.Release(2).ok());
  ASSERT_TRUE(h.Release(1).ok());
  EXPECT_EQ(h.provider.live_host_bytes(), 0u);
  EXPECT_TRUE(h.manager->CheckInvariants().ok());
}

TEST(PagingTest, TheHostPoolReusesFreedHostMemory) {
  device::FakeMemoryProvider fake;
  MemoryManager::Options o;
  o.provider = &fake;
  o.capacity = 100 * M;
  o.rule = sched::PackRule();
  o.overcommit = 2.0;
  o.host_pool_bytes = 60 * M;
  auto m = std::move(MemoryManager::Create(o)).value();
  ASSERT_TRUE(m->Admit(1, {60 * M, 10 * M}).ok());
  ASSERT_TRUE(m->Admit(2, {60 * M, 10 * M}).ok());
  auto finish = [&] {
    for (const Transfer& t : m->TakeTransfers()) ASSERT_TRUE(m->FinishTransfer(t.id).ok());
    for (const Transfer& t : m->TakeTransfers()) ASSERT_TRUE(m->FinishTransfer(t.id).ok());
  };
  for (int round = 0; round < 4; ++round) {
    const SessionId in = round % 2 == 0 ? 2 : 1, out = round % 2 == 0 ? 1 : 2;
    ASSERT_TRUE(m->PageIn(in, std::vector<SessionId>{out})->resident);
    finish();
    // One block's worth of host memory: the page-in's freed copy serves the next page-out.
    EXPECT_EQ(fake.live_host_bytes(), round == 0 ? 60 * M : 120 * M) << "round " << round;
  }
  EXPECT_EQ(m->StatsSnapshot().host_pool_bytes, 60 * M);
  m.reset();
  EXPECT_EQ(fake.live_host_bytes(), 0u);
}

TEST(SmallerLaneTest, AdmissionGrantsTheFirstLaneThatFits) {
  testing::Harness h(100 * M);
  ASSERT_NE(h.AdmitNow(1, 60 * M, 30 * M), 0u);
  // 10 MiB free beside a lane of 30: E = 40 and 38 would need the lane grown past what is
  // free; 15 joins it.
  auto g = h.manager->Admit(2, {5 * M, 40 * M, LaneClass::kBatch, {38 * M, 15 * M, 10 * M}});
  ASSERT_TRUE(g.ok() && g->has_value()) << g.status();
  EXPECT_EQ((*g)->ephemeral_bytes, 15 * M);
  EXPECT_EQ(h.manager->CommittedBytes(), 95 * M);
  ASSERT_TRUE(h.Release(2).ok());
  ASSERT_TRUE(h.Release(1).ok());
  // Never fits only when even the smallest lane does not.
  EXPECT_EQ(h.manager->Admit(3, {95 * M, 10 * M, LaneClass::kBatch, {5 * M}}).status().code(),
            StatusCode::kOk);
  EXPECT_EQ(h.manager->Admit(4, {96 * M, 10 * M, LaneClass::kBatch, {5 * M}}).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(h.manager->CheckInvariants().ok());
}

TEST(PagingTest, PageInWaitsWhenNoCandidateMakesRoom) {
  PagingHarness h;
  ASSERT_NE(h.AdmitNow(1, 60 * M, 10 * M), 0u);
  ASSERT_TRUE(h.manager->Admit(2, {60 * M, 10 * M}).ok());
  auto r = h.PageIn(2, {});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->resident);
  EXPECT_EQ(h.Of(1), Residence::kResident);
  EXPECT_EQ(h.PageIn(1, {}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.PageIn(9, {}).status().code(), StatusCode::kNotFound);
}

TEST(PagingTest, ASessionMidIterationIsNeverPagedOut) {
  PagingHarness h;
  const LaneId lane1 = h.AdmitNow(1, 60 * M, 10 * M);
  ASSERT_TRUE(h.manager->Admit(2, {60 * M, 10 * M}).ok());
  ASSERT_TRUE(h.manager->BeginIteration(lane1, 1).ok());
  auto r = h.PageIn(2, std::vector<SessionId>{1});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->resident);
  EXPECT_EQ(h.Of(1), Residence::kResident);
  ASSERT_TRUE(h.manager->EndIteration(lane1).ok());
  r = h.PageIn(2, std::vector<SessionId>{1});
  ASSERT_TRUE(r.ok() && r->resident);
}

TEST(PagingTest, ReleaseDuringACopyFreesItsHostMemoryWhenTheCopyEnds) {
  PagingHarness h;
  ASSERT_NE(h.AdmitNow(1, 60 * M, 10 * M), 0u);
  ASSERT_TRUE(h.manager->Admit(2, {60 * M, 10 * M}).ok());
  ASSERT_TRUE(h.PageIn(2, std::vector<SessionId>{1})->resident);
  auto ts = h.manager->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);
  ASSERT_TRUE(h.Release(1).ok());  // mid-copy out
  EXPECT_EQ(h.provider.live_host_bytes(), 60 * M);
  EXPECT_EQ(h.manager->Persistent(2).status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(h.FinishTransfer(ts[0].id).ok());
  EXPECT_EQ(h.provider.live_host_bytes(), 0u);
  EXPECT_TRUE(h.manager->Persistent(2).ok());
  EXPECT_EQ(h.FinishTransfer(ts[0].id).code(), StatusCode::kNotFound);
  EXPECT_TRUE(h.manager->CheckInvariants().ok());
}

TEST(PagingTest, ReleaseBeforeItsCopyOutStartsFreesItsRangeAtOnce) {
  // A session paged out and closed before its copy to host was handed out: no copy runs, and
  // the session paged in over its range copies in at once (it waited for that range).
  PagingHarness h;
  ASSERT_NE(h.AdmitNow(1, 60 * M, 10 * M), 0u);
  ASSERT_TRUE(h.manager->Admit(2, {60 * M, 10 * M}).ok());
  ASSERT_TRUE(h.PageIn(2, std::vector<SessionId>{1})->resident);
  ASSERT_EQ(h.FinishAll(), 1);  // 1 out
  ASSERT_TRUE(h.PageIn(1, std::vector<SessionId>{2})->resident);
  EXPECT_EQ(h.Of(1), Residence::kPagingIn);
  ASSERT_TRUE(h.Release(2).ok());  // its copy out not yet taken
  auto ts = h.manager->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].session, 1u);
  EXPECT_FALSE(ts[0].to_host);
  ASSERT_TRUE(h.FinishTransfer(ts[0].id).ok());
  EXPECT_EQ(h.Of(1), Residence::kResident);
  EXPECT_TRUE(h.manager->Persistent(1).ok());
  EXPECT_EQ(h.provider.live_host_bytes(), 0u);
  EXPECT_TRUE(h.manager->CheckInvariants().ok());
}

TEST(PagingTest, AFailedCopyLosesOnlyItsSession) {
  PagingHarness h;
  ASSERT_NE(h.AdmitNow(1, 60 * M, 10 * M), 0u);
  ASSERT_TRUE(h.manager->Admit(2, {60 * M, 10 * M}).ok());
  ASSERT_TRUE(h.PageIn(2, std::vector<SessionId>{1})->resident);
  auto ts = h.manager->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);
  ASSERT_TRUE(h.FinishTransfer(ts[0].id, InternalError("bus error")).ok());
  ASSERT_EQ(h.failed.size(), 1u);
  EXPECT_EQ(h.failed[0].first, 1u);
  EXPECT_EQ(h.failed[0].second.code(), StatusCode::kInternal);
  EXPECT_NE(h.failed[0].second.message().find("bus error"), std::string::npos);
  EXPECT_EQ(h.manager->ResidenceOf(1).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(h.manager->Persistent(2).ok());
  EXPECT_EQ(h.provider.live_host_bytes(), 0u);
}

TEST(PagingTest, SingleLaneAndExclusiveRulesPageOutWhatTheyMust) {
  {
    PagingHarness h(sched::ExclusiveRule(), 3.0);
    ASSERT_NE(h.AdmitNow(1, 10 * M, 10 * M), 0u);
    ASSERT_TRUE(h.manager->Admit(2, {10 * M, 10 * M}).ok());
    EXPECT_EQ(h.Of(2), Residence::kPagedOut);  // one resident at a time, however small
    EXPECT_FALSE(h.PageIn(2, {})->resident);
    auto r = h.PageIn(2, std::vector<SessionId>{1});
    ASSERT_TRUE(r.ok() && r->resident);
    EXPECT_EQ(r->paged_out, (std::vector<SessionId>{1}));
    h.FinishAll();
  }
  {
    PagingHarness h(sched::SingleLaneRule(), 2.0);
    ASSERT_NE(h.AdmitNow(1, 40 * M, 10 * M), 0u);
    ASSERT_NE(h.AdmitNow(2, 30 * M, 10 * M), 0u);
    ASSERT_TRUE(h.manager->Admit(3, {40 * M, 10 * M}).ok());
    // Candidates in the policy's order: the rule takes the shortest prefix that makes room.
    auto r = h.PageIn(3, std::vector<SessionId>{2, 1});
    ASSERT_TRUE(r.ok() && r->resident);
    EXPECT_EQ(r->paged_out, (std::vector<SessionId>{2}));
    h.FinishAll();
    EXPECT_EQ(h.manager->Lanes().size(), 1u);
  }
}

// Random arrivals, departures, page-ins, iterations and copies finishing in any order: the
// resident safety condition and the overcommit bound hold at every step, and no iteration of a
// session begins unless it is resident.
TEST(PagingPropertyTest, ResidentSafetyAtEveryStep) {
  for (const auto& rule : {sched::PackRule(), sched::SingleLaneRule(), sched::ExclusiveRule()}) {
    SCOPED_TRACE(::testing::Message() << "rule " << rule->name());
    PagingHarness h(rule, 1.75);
    std::mt19937_64 rng(17);
    auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    std::set<SessionId> live;
    std::vector<Transfer> copies;
    std::map<LaneId, SessionId> in_iteration;
    SessionId next = 1;
    uint64_t page_ins = 0, began = 0;
    for (int step = 0; step < 4000; ++step) {
      const int r = static_cast<int>(rng() % 100);
      if (r < 15) {
        const uint64_t p = (1 + pick(40)) * M, e = (1 + pick(20)) * M;
        auto g = h.manager->Admit(next, {p, e});
        ASSERT_TRUE(g.ok()) << g.status();
        live.insert(next++);
      } else if (r < 25 && !live.empty()) {
        const SessionId s = *std::next(live.begin(), static_cast<long>(pick(live.size())));
        bool running = false;
        for (const auto& [lane, who] : in_iteration) running |= who == s;
        if (running) continue;
        ASSERT_TRUE(h.Release(s).ok());
        live.erase(s);
      } else if (r < 45 && !live.empty()) {
        const SessionId s = *std::next(live.begin(), static_cast<long>(pick(live.size())));
        auto res = h.manager->ResidenceOf(s);
        if (!res.ok() || *res != Residence::kPagedOut) continue;
        std::vector<SessionId> candidates(live.begin(), live.end());
        std::shuffle(candidates.begin(), candidates.end(), rng);
        auto pr = h.PageIn(s, candidates);
        ASSERT_TRUE(pr.ok()) << pr.status();
        page_ins += pr->resident;
      } else if (r < 65) {
        const std::vector<LaneInfo> lanes = h.manager->Lanes();
        if (lanes.empty()) continue;
        const LaneInfo& l = lanes[pick(lanes.size())];
        if (in_iteration.contains(l.id)) continue;
        const LaneId lane = l.id;
        const SessionId s = l.sessions[pick(l.sessions.size())];
        auto it = h.manager->BeginIteration(lane, s);
        if (it.ok()) {
          ASSERT_EQ(*h.manager->ResidenceOf(s), Residence::kResident);
          in_iteration[lane] = s;
          ++began;
        }
      } else if (r < 80 && !in_iteration.empty()) {
        auto it = std::next(in_iteration.begin(), static_cast<long>(pick(in_iteration.size())));
        ASSERT_TRUE(h.manager->EndIteration(it->first).ok());
        in_iteration.erase(it);
      } else {
        for (const Transfer& t : h.manager->TakeTransfers()) copies.push_back(t);
        if (copies.empty()) continue;
        const size_t i = pick(copies.size());
        ASSERT_TRUE(h.FinishTransfer(copies[i].id).ok());
        copies.erase(copies.begin() + static_cast<long>(i));
      }
      ASSERT_TRUE(h.manager->CheckInvariants().ok()) << h.manager->CheckInvariants();
      const MemoryStatsSnapshot s = h.manager->StatsSnapshot();
      ASSERT_LE(s.persistent_committed_bytes + s.ephemeral_committed_bytes, 100 * M);
      ASSERT_LE(static_cast<double>(s.persistent_committed_bytes + s.paged_bytes), 175.0 * M);
    }
    // And nothing is left stuck: once the iterations and copies end, every admitted session
    // is resident (its block usable) or paged out.
    for (const auto& [lane, who] : in_iteration) ASSERT_TRUE(h.manager->EndIteration(lane).ok());
    for (const Transfer& t : copies) ASSERT_TRUE(h.FinishTransfer(t.id).ok());
    h.FinishAll();
    for (const SessionId s : live) {
      auto res = h.manager->ResidenceOf(s);
      if (!res.ok()) continue;  // waiting for admission
      EXPECT_TRUE(*res == Residence::kResident || *res == Residence::kPagedOut)
          << "session " << s << " is " << ResidenceName(*res);
      if (*res == Residence::kResident) {
        EXPECT_TRUE(h.manager->Persistent(s).ok()) << s;
      }
    }
    EXPECT_GT(page_ins, 50u);
    EXPECT_GT(began, 200u);
  }
}

}  // namespace
}  // namespace salus::mem
