// A seeded property test: random arrivals, departures, cancellations, timeouts, iterations and
// allocations on the fake provider. After every step the safety condition holds (ΣP + ΣL ≤ C,
// checked against an independent model of who is admitted), no two live allocations or
// blocks overlap, and the statistics account for every byte.
//
// SALUS_MEM_PROPERTY_STEPS overrides the number of steps (default 100,000) and
// SALUS_MEM_PROPERTY_SEED the seed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "mem/lane_allocator.h"
#include "test_util.h"

namespace salus::mem {
namespace {

constexpr uint64_t kDefaultSteps = 100'000;
constexpr uint64_t kCapacity = kGiB;
constexpr uint64_t kUnit = kMiB;  // sizes are random multiples of this, some unaligned
// How often the full (quadratic) checks run, in steps.
constexpr uint64_t kFullCheckEvery = 4;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

uint64_t Rounded(uint64_t b) {
  return (b + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

struct Model {
  std::map<SessionId, Requirement> admitted;  // rounded
  std::map<SessionId, LaneId> lane_of;
  std::map<SessionId, Requirement> waiting;
  std::set<SessionId> expirable;
};

struct Running {
  LaneIteration it;
  std::optional<SessionId> session;
  std::vector<LaneAllocator::Allocation> dynamic;
  std::vector<std::pair<uint64_t, uint64_t>> planned;  // absolute (address, size)
  uint64_t live_bytes = 0;
};

TEST(MemoryManagerPropertyTest, RandomWorkloadKeepsEveryInvariant) {
  const uint64_t steps = EnvOr("SALUS_MEM_PROPERTY_STEPS", kDefaultSteps);
  const uint64_t seed = EnvOr("SALUS_MEM_PROPERTY_SEED", 20261121);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };

  for (const std::shared_ptr<const AdmissionRule>& mode :
       {sched::PackRule(), sched::SingleLaneRule(), sched::ExclusiveRule()}) {
    SCOPED_TRACE(::testing::Message() << "rule " << mode->name());
    testing::Harness h(kCapacity, mode);
    Model model;
    std::map<LaneId, Running> running;
    SessionId next_session = 1;
    uint64_t admitted_count = 0, waited_count = 0, iterations = 0, allocations = 0;
    uint64_t expected_alloc_bytes = 0, expected_freed_bytes = 0;
    // The pack rule runs most of the steps; the other rules share the rest.
    const uint64_t mode_steps = mode == sched::PackRule() ? steps * 6 / 10 : steps * 2 / 10;

    auto on_granted = [&](const Grant& g) {
      auto w = model.waiting.find(g.session);
      ASSERT_NE(w, model.waiting.end()) << "granted a session that was not waiting";
      model.admitted[g.session] = w->second;
      model.lane_of[g.session] = g.lane;
      model.waiting.erase(w);
      model.expirable.erase(g.session);
      ++admitted_count;
    };

    for (uint64_t step = 0; step < mode_steps; ++step) {
      const uint64_t r = pick(100);
      if (r < 14) {
        // Arrival: sizes up to 40% of C each, sometimes unaligned, sometimes zero.
        const SessionId s = next_session++;
        Requirement req{pick(410) * kUnit + (pick(4) == 0 ? pick(kUnit) : 0),
                        pick(410) * kUnit + (pick(4) == 0 ? pick(kUnit) : 0)};
        if (pick(8) == 0) req.persistent_bytes = 0;
        // Three jobs and sessions of no job (Note [Jobs]: the exclusive rule's tenant).
        req.job = pick(4);
        std::optional<Nanos> timeout;
        if (pick(3) == 0) timeout = std::chrono::milliseconds(1 + pick(100));
        auto g = h.manager->Admit(s, req, timeout);
        ASSERT_TRUE(g.ok()) << g.status();
        const Requirement rounded{Rounded(req.persistent_bytes), Rounded(req.ephemeral_bytes)};
        if (g->has_value()) {
          model.admitted[s] = rounded;
          model.lane_of[s] = (*g)->lane;
          ++admitted_count;
        } else {
          model.waiting[s] = rounded;
          if (timeout) model.expirable.insert(s);
          ++waited_count;
        }
      } else if (r < 24 && !model.admitted.empty()) {
        // Departure of a random admitted session (its lane may be mid-iteration).
        auto it = std::next(model.admitted.begin(), pick(model.admitted.size()));
        const SessionId s = it->first;
        model.admitted.erase(it);
        model.lane_of.erase(s);
        h.admitted.clear();
        ASSERT_TRUE(h.Release(s).ok());
        for (const Grant& g : h.admitted) on_granted(g);
      } else if (r < 26 && !model.waiting.empty()) {
        auto it = std::next(model.waiting.begin(), pick(model.waiting.size()));
        const SessionId s = it->first;
        h.failed.clear();
        if (pick(2) == 0) {
          h.CancelWaiting(s);
        } else {
          ASSERT_TRUE(h.Release(s).ok());
        }
        ASSERT_EQ(h.failed.size(), 1u);
        EXPECT_EQ(h.failed[0].second.code(), StatusCode::kCancelled);
        model.waiting.erase(s);
        model.expirable.erase(s);
      } else if (r < 28) {
        h.clock.Advance(std::chrono::milliseconds(pick(30)));
        h.failed.clear();
        h.ExpireWaiting();
        for (const auto& [s, st] : h.failed) {
          EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
          ASSERT_TRUE(model.expirable.erase(s)) << "expired a session without a timeout";
          model.waiting.erase(s);
        }
      } else if (r < 45) {
        // Begin an iteration on a random lane, for a random member session or none.
        const std::vector<LaneInfo> lanes = h.manager->Lanes();
        if (lanes.empty()) continue;
        const LaneInfo& lane = lanes[pick(lanes.size())];
        std::optional<SessionId> session;
        if (pick(2) == 0) session = lane.sessions[pick(lane.sessions.size())];
        auto it = session ? h.manager->BeginIteration(lane.id, *session)
                          : h.manager->BeginIteration(lane.id);
        if (lane.in_iteration) {
          ASSERT_EQ(it.status().code(), StatusCode::kFailedPrecondition);
          continue;
        }
        if (!it.ok()) {
          ASSERT_EQ(it.status().code(), StatusCode::kUnavailable) << it.status();
          continue;
        }
        ASSERT_EQ(it->size, lane.size);
        ASSERT_EQ(it->base, lane.offset);
        Running run;
        run.it = *it;
        run.session = session;
        if (pick(2) == 0 && it->size > 0) {
          // A plan of consecutive tensors covering part of the lane.
          const uint64_t plan = pick(it->size + 1);
          ASSERT_TRUE(it->allocator->ReservePlan(plan).ok());
          uint64_t at = 0;
          while (at < plan) {
            const uint64_t n = std::min(plan - at, 1 + pick(plan / 4 + 1));
            auto p = it->allocator->AllocatePlanned(at, n);
            ASSERT_TRUE(p.ok()) << p.status();
            run.planned.emplace_back(reinterpret_cast<uint64_t>(*p), n);
            run.live_bytes += n;
            expected_alloc_bytes += n;
            at += n;
          }
        }
        running.emplace(lane.id, std::move(run));
        ++iterations;
      } else if (r < 85 && !running.empty()) {
        // Dynamic allocations and frees in a running lane.
        Running& run = std::next(running.begin(), pick(running.size()))->second;
        if (run.dynamic.empty() || pick(3) != 0) {
          const uint64_t n = 1 + pick(run.it.size / 3 + 1);
          auto a = run.it.allocator->Allocate(n);
          if (a.ok()) {
            ASSERT_GE(a->size, n);
            run.dynamic.push_back(*a);
            run.live_bytes += a->size;
            expected_alloc_bytes += a->size;
            ++allocations;
          } else {
            ASSERT_EQ(a.status().code(), StatusCode::kResourceExhausted) << a.status();
          }
        } else {
          const size_t k = pick(run.dynamic.size());
          ASSERT_TRUE(run.it.allocator->Free(run.dynamic[k]).ok());
          run.live_bytes -= run.dynamic[k].size;
          expected_freed_bytes += run.dynamic[k].size;
          run.dynamic[k] = run.dynamic.back();
          run.dynamic.pop_back();
        }
      } else if (!running.empty()) {
        auto it = std::next(running.begin(), pick(running.size()));
        expected_freed_bytes += it->second.live_bytes;
        ASSERT_TRUE(h.manager->EndIteration(it->first).ok());
        running.erase(it);
      }

      // --- The safety condition, against the model.
      uint64_t sum_p = 0;
      for (const auto& [s, req] : model.admitted) sum_p += req.persistent_bytes;
      std::map<LaneId, uint64_t> lane_size;
      for (const auto& [s, req] : model.admitted) {
        uint64_t& l = lane_size[model.lane_of.at(s)];
        l = std::max(l, req.ephemeral_bytes);
      }
      uint64_t sum_l = 0;
      for (const auto& [l, size] : lane_size) sum_l += size;
      ASSERT_LE(sum_p + sum_l, kCapacity) << "step " << step;
      ASSERT_EQ(h.manager->CommittedBytes(), sum_p + sum_l) << "step " << step;
      ASSERT_EQ(h.manager->WaitingCount(), model.waiting.size());

      if (step % kFullCheckEvery != 0) continue;
      const Status inv = h.manager->CheckInvariants();
      ASSERT_TRUE(inv.ok()) << "step " << step << ": " << inv;

      // --- No two live allocations or placed blocks overlap, anywhere in the arena.
      std::vector<std::pair<uint64_t, uint64_t>> live;
      uint64_t live_bytes = 0;
      for (const auto& [id, run] : running) {
        const auto base = reinterpret_cast<uint64_t>(run.it.address);
        for (const auto& [o, n] : run.it.allocator->LiveRanges()) {
          ASSERT_LE(o + n, run.it.size);
          live.emplace_back(base + o, n);
        }
        live_bytes += run.live_bytes;
      }
      for (const auto& [s, req] : model.admitted) {
        auto b = h.manager->Persistent(s);
        if (b.ok() && b->size > 0)
          live.emplace_back(reinterpret_cast<uint64_t>(b->address), b->size);
      }
      std::sort(live.begin(), live.end());
      for (size_t i = 1; i < live.size(); ++i) {
        ASSERT_LE(live[i - 1].first + live[i - 1].second, live[i].first)
            << "step " << step << ": overlapping live ranges";
      }
      const uint64_t arena = device::FakeMemoryProvider::kFakeBase;
      if (!live.empty()) {
        ASSERT_GE(live.front().first, arena);
        ASSERT_LE(live.back().first + live.back().second, arena + kCapacity);
      }

      // --- Statistics account for every byte.
      const MemoryStatsSnapshot snap = h.manager->StatsSnapshot();
      ASSERT_TRUE(snap.persistent.Balanced());
      ASSERT_TRUE(snap.ephemeral.Balanced());
      ASSERT_EQ(snap.persistent.current_bytes, sum_p);
      ASSERT_EQ(snap.persistent_committed_bytes, sum_p);
      ASSERT_EQ(snap.ephemeral_committed_bytes, sum_l);
      ASSERT_EQ(snap.ephemeral.current_bytes, live_bytes) << "step " << step;
      ASSERT_EQ(snap.ephemeral.allocated_bytes, expected_alloc_bytes);
      ASSERT_EQ(snap.ephemeral.freed_bytes, expected_freed_bytes);
      ASSERT_EQ(snap.admitted_sessions, model.admitted.size());
      uint64_t session_p = 0;
      for (const SessionStats& s : snap.sessions) {
        ASSERT_EQ(s.requirement.persistent_bytes, model.admitted.at(s.session).persistent_bytes);
        ASSERT_EQ(s.lane, model.lane_of.at(s.session));
        session_p += s.persistent.current_bytes;
      }
      ASSERT_EQ(session_p, sum_p);
      for (const LaneStats& l : snap.lanes) {
        ASSERT_TRUE(l.ephemeral.Balanced());
        ASSERT_EQ(l.size, lane_size.at(l.lane));
      }
    }
    // Drain: end every iteration and release everyone; the queue empties or stays consistent.
    for (const auto& [id, run] : running) ASSERT_TRUE(h.manager->EndIteration(id).ok());
    while (!model.admitted.empty()) {
      const SessionId s = model.admitted.begin()->first;
      model.admitted.erase(model.admitted.begin());
      h.admitted.clear();
      ASSERT_TRUE(h.Release(s).ok());
      for (const Grant& g : h.admitted) on_granted(g);
    }
    EXPECT_TRUE(h.manager->CheckInvariants().ok());
    EXPECT_EQ(h.manager->CommittedBytes(), 0u);
    const MemoryStatsSnapshot end = h.manager->StatsSnapshot();
    EXPECT_EQ(end.persistent.current_bytes, 0u);
    EXPECT_EQ(end.ephemeral.current_bytes, 0u);
    EXPECT_EQ(end.ephemeral.allocated_bytes, end.ephemeral.freed_bytes);
    std::printf(
        "rule %s: %llu steps, %llu admitted, %llu queued, %llu iterations, "
        "%llu dynamic allocations\n",
        std::string(mode->name()).c_str(), static_cast<unsigned long long>(mode_steps),
        static_cast<unsigned long long>(admitted_count),
        static_cast<unsigned long long>(waited_count), static_cast<unsigned long long>(iterations),
        static_cast<unsigned long long>(allocations));
    // The workload exercised what it claims to.
    EXPECT_GT(admitted_count, mode_steps / 50);
    EXPECT_GT(waited_count, mode_steps / 100);
    EXPECT_GT(iterations, mode_steps / 50);
    if (mode == sched::PackRule()) {
      EXPECT_GT(allocations, mode_steps / 20);
    }
  }
}

}  // namespace
}  // namespace salus::mem
