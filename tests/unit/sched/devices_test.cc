// Several devices in one engine (Note [Devices] in engine.cc), on a manual clock and the fake
// provider: where sessions are placed, pinning, waiting for any device, and the safety
// condition of every device under random load.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "common/units.h"
#include "device/memory_provider.h"
#include "mem/admission.h"
#include "sched/engine.h"

namespace salus::sched {
namespace {

using std::chrono::seconds;

constexpr uint64_t G = kGiB;

class DevicesHarness {
 public:
  DevicesHarness(std::string_view policy, std::vector<uint64_t> capacities, double overcommit = 1.0,
                 bool defragment = true, bool peer_moves = true) {
    Engine::Options o;
    o.clock = &clock_;
    o.defragment = defragment;
    o.peer_moves = peer_moves;
    o.policy = std::move(*CreatePolicy(policy));
    std::vector<DeviceSpec> specs;
    for (size_t i = 0; i < capacities.size(); ++i) {
      providers_.push_back(std::move(*device::CreateMemoryProvider("fake")));
      specs.push_back(
          {"fake:" + std::to_string(i), providers_.back().get(), capacities[i], overcommit});
    }
    auto devices = MakeDevices(*o.policy, &clock_, specs);
    EXPECT_TRUE(devices.ok()) << devices.status();
    o.devices = std::move(*devices);
    o.on_admitted = [this](SessionId id, LaneId) { admitted_later_.push_back(id); };
    o.on_admission_failed = [this](SessionId id, const Status& s) { failed_[id] = s; };
    engine_ = std::move(*Engine::Create(std::move(o)));
  }

  StatusOr<bool> Add(SessionId id, uint64_t p, uint64_t e, std::optional<size_t> pin = {},
                     std::optional<Nanos> timeout = {}) {
    SessionSpec spec;
    spec.requirement = {p, e, mem::LaneClass::kBatch};
    spec.device = pin;
    spec.admission_timeout = timeout;
    return engine_->AddSession(id, spec);
  }
  std::optional<size_t> DeviceOf(SessionId id) const { return engine_->Session(id)->device; }
  // Every device keeps resident ΣP + ΣL ≤ C and its invariants.
  void CheckSafety() const {
    for (size_t d = 0; d < engine_->device_count(); ++d) {
      const mem::MemoryManager& m = engine_->memory(d);
      EXPECT_LE(m.CommittedBytes(), m.capacity()) << "device " << d;
      const Status inv = m.CheckInvariants();
      EXPECT_TRUE(inv.ok()) << "device " << d << ": " << inv;
    }
  }

  ManualClock clock_;
  std::vector<std::unique_ptr<device::MemoryProvider>> providers_;
  std::unique_ptr<Engine> engine_;
  std::vector<SessionId> admitted_later_;
  std::map<SessionId, Status> failed_;
};

TEST(EngineDevicesTest, MakeDevicesNamesEachAndKeepsLaneIdsApart) {
  DevicesHarness h("pack", {10 * G, 10 * G});
  ASSERT_EQ(h.engine_->device_count(), 2u);
  EXPECT_EQ(h.engine_->device_name(1), "fake:1");
  EXPECT_EQ(h.engine_->DeviceIndex("fake:1"), 1u);
  EXPECT_FALSE(h.engine_->DeviceIndex("fake:2").has_value());
  std::set<LaneId> lanes;
  for (SessionId s = 1; s <= 4; ++s) {
    ASSERT_TRUE(*h.Add(s, 1 * G, 1 * G, s % 2));
    lanes.insert(h.engine_->Session(s)->lane);
    EXPECT_EQ(h.DeviceOf(s), s % 2);
  }
  EXPECT_EQ(lanes.size(), 4u);  // every session opened a lane of its own, each id unique
  // A name given twice, or no device, is an error.
  auto policy = CreatePolicy("pack");
  ASSERT_TRUE(policy.ok());
  EXPECT_EQ(MakeDevices(**policy, &h.clock_,
                        {{"a", h.providers_[0].get(), G}, {"a", h.providers_[1].get(), G}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeDevices(**policy, &h.clock_, {}).status().code(), StatusCode::kInvalidArgument);
}

// Algorithm 1 across devices: where the device's rule joins an existing lane (no new lane
// memory) first, then the device that leaves the least memory unused (best fit), then the
// lowest index.
TEST(EngineDevicesTest, PlacementPrefersJoiningALane) {
  DevicesHarness h("pack", {10 * G, 6 * G});
  ASSERT_TRUE(*h.Add(1, 1 * G, 2 * G));  // both empty, device 0 leaves 7 GiB, device 1 3 GiB
  EXPECT_EQ(h.DeviceOf(1), 1u);
  ASSERT_TRUE(*h.Add(2, 3 * G, 4 * G, 0));  // pinned: device 0 has 3 GiB left
  // P 1, E 3 GiB: device 0 has no room for a new lane but joins 2's lane (1 GiB left); device
  // 1 would open one and leave nothing unused. Joining wins.
  ASSERT_TRUE(*h.Add(3, 1 * G, 3 * G));
  EXPECT_EQ(h.DeviceOf(3), 0u);
  EXPECT_EQ(h.engine_->Session(3)->lane, h.engine_->Session(2)->lane);
  // Two new lanes of equal fit: the lowest index.
  DevicesHarness even("pack", {8 * G, 8 * G});
  ASSERT_TRUE(*even.Add(1, 1 * G, 1 * G));
  EXPECT_EQ(even.DeviceOf(1), 0u);
  h.CheckSafety();
}

// Runs every session's iterations back to back, each taking `each`, for `rounds` rounds,
// finishing every copy the engine asks for at once.
void RunRounds(DevicesHarness& h, const std::vector<SessionId>& ids, int rounds, Nanos each) {
  for (int r = 0; r < rounds; ++r) {
    for (SessionId id : ids) ASSERT_TRUE(h.engine_->RequestIteration(id).ok());
    for (int pass = 0; pass < 4; ++pass) {
      for (const mem::Transfer& tr : h.engine_->TakeTransfers()) {
        ASSERT_TRUE(h.engine_->FinishTransfer(tr, OkStatus(), Nanos(0)).ok());
      }
      std::vector<Dispatch> ds = h.engine_->DispatchReady();
      h.clock_.Advance(each);
      for (const Dispatch& d : ds) ASSERT_TRUE(h.engine_->Complete(d).ok());
    }
    h.CheckSafety();
  }
}

// Placement is memory-first, so two sessions that fit one device share it beside an idle one;
// once they have been resident for a paging quantum, with nothing waiting, the engine moves
// one (the smaller P) to the device with no session, and no further (Note [Migration]).
TEST(EngineDevicesTest, ADeviceWithNoSessionTakesOneFromABusyOne) {
  for (const char* policy : {"srtf", "pack", "fair"}) {
    SCOPED_TRACE(policy);
    DevicesHarness h(policy, {10 * G, 10 * G});
    ASSERT_TRUE(*h.Add(1, 2 * G, 1 * G));
    ASSERT_TRUE(*h.Add(2, 1 * G, 1 * G));
    ASSERT_EQ(h.DeviceOf(1), 0u);
    ASSERT_EQ(h.DeviceOf(2), 0u);  // best fit: beside 1
    RunRounds(h, {1, 2}, 2, std::chrono::milliseconds(100));
    EXPECT_EQ(h.engine_->Migrations().started, 0u);  // 0.8 s, within the quantum: no move yet
    RunRounds(h, {1, 2}, 12, std::chrono::milliseconds(100));
    EXPECT_EQ(h.DeviceOf(1), 0u);
    EXPECT_EQ(h.DeviceOf(2), 1u);  // the smaller P moved
    EXPECT_EQ(h.engine_->Migrations().finished, 1u);
    RunRounds(h, {1, 2}, 20, std::chrono::milliseconds(100));
    EXPECT_EQ(h.engine_->Migrations().started, 1u);  // one each: nothing more to spread
  }
}

// Pinned sessions stay where their clients put them, and without the engine's own moves
// nothing spreads.
TEST(EngineDevicesTest, PinnedSessionsAndNoMovesDoNotSpread) {
  DevicesHarness pinned("fair", {10 * G, 10 * G});
  ASSERT_TRUE(*pinned.Add(1, 1 * G, 1 * G, 0));
  ASSERT_TRUE(*pinned.Add(2, 1 * G, 1 * G, 0));
  RunRounds(pinned, {1, 2}, 30, std::chrono::milliseconds(100));
  EXPECT_EQ(pinned.engine_->Migrations().started, 0u);
  DevicesHarness off("fair", {10 * G, 10 * G}, 1.0, /*defragment=*/false);
  ASSERT_TRUE(*off.Add(1, 1 * G, 1 * G));
  ASSERT_TRUE(*off.Add(2, 1 * G, 1 * G));
  RunRounds(off, {1, 2}, 30, std::chrono::milliseconds(100));
  EXPECT_EQ(off.engine_->Migrations().started, 0u);
  EXPECT_EQ(off.DeviceOf(2), 0u);
}

// A device lost to a fault is out of service: nothing is placed on it, moved to it or off it;
// a pin to it is refused with the reason; the others go on.
TEST(EngineDevicesTest, ALostDeviceIsOutOfService) {
  DevicesHarness h("fair", {10 * G, 10 * G});
  ASSERT_TRUE(*h.Add(1, 1 * G, 1 * G));
  ASSERT_EQ(h.DeviceOf(1), 0u);
  ASSERT_TRUE(*h.Add(2, 1 * G, 1 * G));
  ASSERT_EQ(h.DeviceOf(2), 0u);
  ASSERT_TRUE(h.engine_->SetDeviceLost(0, UnavailableError("cuda:0: illegal address")).ok());
  EXPECT_EQ(h.engine_->SetDeviceLost(2, UnavailableError("x")).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(h.engine_->DeviceLost(0).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(h.engine_->DeviceLost(1).ok());
  // Device 1 is idle and device 0 holds two, but nothing spreads off a lost device.
  h.clock_.Advance(seconds(5));
  h.engine_->DispatchReady();
  EXPECT_EQ(h.engine_->Migrations().started, 0u);
  // Placement takes the other device, even where device 0 would fit best.
  ASSERT_TRUE(*h.Add(3, 1 * G, 1 * G));
  EXPECT_EQ(h.DeviceOf(3), 1u);
  auto pinned = h.Add(4, 1 * G, 1 * G, 0);
  EXPECT_EQ(pinned.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(pinned.status().message().find("illegal address"), std::string::npos)
      << pinned.status();
  // No move off it (its memory cannot be read) or onto it.
  EXPECT_EQ(h.engine_->Migrate(1, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.engine_->Migrate(3, 0).code(), StatusCode::kFailedPrecondition);
  // Its sessions stay until closed; with every device lost, nothing is admitted, and a session
  // that waited for the second device alone fails when it is lost.
  EXPECT_EQ(h.DeviceOf(1), 0u);
  ASSERT_FALSE(*h.Add(6, 17 * G / 2, 1 * G, 1));  // waits for room on device 1
  ASSERT_TRUE(h.engine_->SetDeviceLost(1, UnavailableError("cuda:1: ECC")).ok());
  ASSERT_EQ(h.failed_.count(6), 1u);
  EXPECT_EQ(h.failed_[6].code(), StatusCode::kUnavailable);
  EXPECT_NE(h.failed_[6].message().find("ECC"), std::string::npos) << h.failed_[6];
  EXPECT_FALSE(h.engine_->Session(6).ok());
  EXPECT_EQ(h.engine_->memory(1).WaitingCount(), 0u);
  EXPECT_EQ(h.Add(5, 1 * G, 1 * G).status().code(), StatusCode::kUnavailable);
  for (SessionId id : {1, 2, 3}) EXPECT_TRUE(h.engine_->RemoveSession(id).ok());
  h.CheckSafety();
}

TEST(EngineDevicesTest, BestFitKeepsTheLargerHoleForALargerJob) {
  DevicesHarness h("pack", {10 * G, 10 * G});
  ASSERT_TRUE(*h.Add(1, 5 * G, 1 * G, 0));  // device 0: 4 GiB left
  ASSERT_TRUE(*h.Add(2, 1 * G, 1 * G, 1));  // device 1: 8 GiB left
  // P 1 GiB, E 2 GiB: a new lane on either; device 0 leaves 1 GiB, device 1 would leave 5.
  ASSERT_TRUE(*h.Add(3, 1 * G, 2 * G));
  EXPECT_EQ(h.DeviceOf(3), 0u);
  // So a job needing 7 GiB still fits device 1.
  ASSERT_TRUE(*h.Add(4, 2 * G, 5 * G));
  EXPECT_EQ(h.DeviceOf(4), 1u);
  h.CheckSafety();
}

TEST(EngineDevicesTest, BadPinsAndJobsThatFitNowhereAreRefused) {
  DevicesHarness h("pack", {4 * G, 8 * G});
  auto bad = h.Add(1, G, G, 2);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("no device 2"), std::string::npos) << bad.status();
  // Fits the larger device only: placed there, and refused when pinned to the smaller one.
  auto small = h.Add(2, 3 * G, 3 * G, 0);
  EXPECT_EQ(small.status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(*h.Add(2, 3 * G, 3 * G));
  EXPECT_EQ(h.DeviceOf(2), 1u);
  auto never = h.Add(3, 6 * G, 3 * G);
  EXPECT_EQ(never.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(never.status().message().find("any device"), std::string::npos) << never.status();
  EXPECT_FALSE(h.engine_->Session(3).ok());
}

// A session that fits no device now waits for any device and is admitted by the first that
// frees room; one pinned to a device waits for that device only.
TEST(EngineDevicesTest, AWaitingSessionTakesTheFirstDeviceThatFreesRoom) {
  DevicesHarness h("pack", {4 * G, 4 * G});
  ASSERT_TRUE(*h.Add(1, 2 * G, 2 * G));
  ASSERT_TRUE(*h.Add(2, 2 * G, 2 * G));
  EXPECT_EQ(h.DeviceOf(1), 0u);
  EXPECT_EQ(h.DeviceOf(2), 1u);
  ASSERT_FALSE(*h.Add(3, 2 * G, 2 * G, 0));  // pinned to device 0
  ASSERT_FALSE(*h.Add(4, 2 * G, 2 * G));     // any device
  EXPECT_FALSE(h.DeviceOf(4).has_value());
  EXPECT_EQ(h.engine_->Session(4)->state, SessionState::kWaiting);
  EXPECT_EQ(h.engine_->Session(3)->device, 0u);
  // Device 1 frees first: 4 goes there; 3 keeps waiting for device 0.
  ASSERT_TRUE(h.engine_->RemoveSession(2).ok());
  EXPECT_EQ(h.admitted_later_, (std::vector<SessionId>{4}));
  EXPECT_EQ(h.DeviceOf(4), 1u);
  EXPECT_EQ(h.engine_->Session(3)->state, SessionState::kWaiting);
  ASSERT_TRUE(h.engine_->RemoveSession(1).ok());
  EXPECT_EQ(h.admitted_later_, (std::vector<SessionId>{4, 3}));
  EXPECT_EQ(h.DeviceOf(3), 0u);
  h.CheckSafety();
}

TEST(EngineDevicesTest, WaitingForAnyDeviceTimesOutAndCancels) {
  DevicesHarness h("pack", {4 * G, 4 * G});
  ASSERT_TRUE(*h.Add(1, 3 * G, 1 * G));
  ASSERT_TRUE(*h.Add(2, 3 * G, 1 * G));
  ASSERT_FALSE(*h.Add(3, 2 * G, 1 * G, std::nullopt, seconds(5)));
  ASSERT_FALSE(*h.Add(4, 2 * G, 1 * G));
  h.clock_.Advance(seconds(4));
  h.engine_->ExpireWaiting();
  EXPECT_TRUE(h.failed_.empty());
  h.clock_.Advance(seconds(1));
  h.engine_->ExpireWaiting();
  ASSERT_EQ(h.failed_.count(3), 1u);
  EXPECT_EQ(h.failed_[3].code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(h.failed_[3].message().find("any device"), std::string::npos);
  EXPECT_FALSE(h.engine_->Session(3).ok());
  // Removing a session that waits for any device cancels it quietly; nothing is admitted.
  EXPECT_EQ(*h.engine_->RemoveSession(4), 0);
  ASSERT_TRUE(h.engine_->RemoveSession(1).ok());
  EXPECT_TRUE(h.admitted_later_.empty());
}

// Lanes on different devices run at once, and each dispatch names its lane's device.
TEST(EngineDevicesTest, DispatchesNameTheirDevice) {
  DevicesHarness h("fifo", {4 * G, 4 * G});
  ASSERT_TRUE(*h.Add(1, 1 * G, 2 * G, 0));
  ASSERT_TRUE(*h.Add(2, 1 * G, 2 * G, 1));
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  ASSERT_TRUE(h.engine_->RequestIteration(2).ok());
  std::vector<Dispatch> ds = h.engine_->DispatchReady();
  ASSERT_EQ(ds.size(), 2u);
  for (const Dispatch& d : ds) {
    EXPECT_EQ(d.device, d.session - 1);
    const std::vector<mem::LaneInfo> lanes = h.engine_->memory(d.device).Lanes();
    ASSERT_EQ(lanes.size(), 1u);
    EXPECT_EQ(lanes[0].id, d.lane);
  }
  for (const Dispatch& d : ds) ASSERT_TRUE(h.engine_->Complete(d).ok());
}

// Property: random arrivals, sizes, pins and departures on three devices under every policy,
// with and without overcommit. At every step each device keeps its safety condition; no
// session runs on a device other than its own or while paged out; every session is admitted
// once its way is clear and finishes.
TEST(EngineDevicesTest, RandomLoadKeepsEveryDeviceSafe) {
  uint64_t moves = 0;
  for (const char* policy : {"fifo", "srtf", "pack", "fair"}) {
    for (const auto& [overcommit, peer] : {std::pair{1.0, true}, {1.5, true}, {1.0, false}}) {
      SCOPED_TRACE(std::string(policy) + " overcommit " + std::to_string(overcommit) +
                   (peer ? ", peer moves" : ", moves through host memory"));
      DevicesHarness h(policy, {4 * G, 6 * G, 8 * G}, overcommit, true, peer);
      std::mt19937_64 rng(7);
      std::map<SessionId, int> left;  // iterations left, for admitted sessions
      std::set<SessionId> live;
      SessionId next = 1;
      std::vector<Dispatch> running;
      std::set<size_t> devices_used;
      size_t waited_for_any = 0;
      for (int step = 0; step < 400; ++step) {
        if (rng() % 2 == 0 && next < 80) {
          const uint64_t p = (1 + rng() % 8) * G / 4, e = (1 + rng() % 8) * G / 4;
          std::optional<size_t> pin;
          if (rng() % 4 == 0) pin = rng() % 3;
          auto r = h.Add(next, p, e, pin);
          if (r.ok() && !*r && !pin) ++waited_for_any;
          if (r.ok()) {
            live.insert(next);
            left[next] = 2 + static_cast<int>(rng() % 10);
          }
          ++next;
        }
        for (const SessionId s : live) {
          auto info = h.engine_->Session(s);
          if (info.ok() && info->pending == 0 && !info->running &&
              info->state != SessionState::kWaiting) {
            ASSERT_TRUE(h.engine_->RequestIteration(s).ok());
          }
        }
        for (const Dispatch& d : h.engine_->DispatchReady()) {
          devices_used.insert(d.device);
          EXPECT_EQ(h.engine_->Session(d.session)->device, d.device);
          EXPECT_EQ(*h.engine_->memory(d.device).ResidenceOf(d.session), mem::Residence::kResident);
          running.push_back(d);
        }
        for (const mem::Transfer& t : h.engine_->TakeTransfers()) {
          ASSERT_TRUE(h.engine_->FinishTransfer(t, OkStatus(), seconds(0)).ok());
        }
        h.CheckSafety();
        h.clock_.Advance(seconds(1));
        if (!running.empty()) {
          const size_t k = rng() % running.size();
          const Dispatch d = running[k];
          running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
          ASSERT_TRUE(h.engine_->Complete(d).ok());
          if (--left[d.session] == 0) {
            ASSERT_TRUE(h.engine_->RemoveSession(d.session).ok());
            live.erase(d.session);
          }
        }
        h.CheckSafety();
      }
      // Drain: no arrivals; everything admitted runs to its end.
      for (int step = 0; step < 5000 && !live.empty(); ++step) {
        for (const SessionId s : live) {
          auto info = h.engine_->Session(s);
          if (info.ok() && info->pending == 0 && !info->running &&
              info->state != SessionState::kWaiting) {
            ASSERT_TRUE(h.engine_->RequestIteration(s).ok());
          }
        }
        for (const Dispatch& d : h.engine_->DispatchReady()) running.push_back(d);
        for (const mem::Transfer& t : h.engine_->TakeTransfers()) {
          ASSERT_TRUE(h.engine_->FinishTransfer(t, OkStatus(), seconds(0)).ok());
        }
        h.clock_.Advance(seconds(1));
        if (running.empty()) continue;
        const Dispatch d = running.front();
        running.erase(running.begin());
        ASSERT_TRUE(h.engine_->Complete(d).ok());
        if (--left[d.session] == 0) {
          ASSERT_TRUE(h.engine_->RemoveSession(d.session).ok());
          live.erase(d.session);
        }
        h.CheckSafety();
      }
      EXPECT_TRUE(live.empty()) << live.size() << " sessions never finished";
      EXPECT_EQ(devices_used.size(), 3u);
      const MigrationStats m = h.engine_->Migrations();
      EXPECT_EQ(m.started, m.finished + m.undone);
      moves += m.finished;
      if (overcommit == 1.0) {
        EXPECT_GT(waited_for_any, 0u);  // the load did contend
      }
      EXPECT_TRUE(h.failed_.empty());
    }
  }
  EXPECT_GT(moves, 0u);  // defragmentation moved sessions under some policy
}

// Migration (Note [Migration]): runs every copy the engine hands out on its device's
// provider, in order, until none is left; returns how many ran.
int RunCopies(Engine& engine) {
  int n = 0;
  for (auto ts = engine.TakeTransfers(); !ts.empty(); ts = engine.TakeTransfers()) {
    for (const mem::Transfer& t : ts) {
      const Status copy = RunCopy(engine, t);
      EXPECT_TRUE(copy.ok()) << copy;
      EXPECT_TRUE(engine.FinishTransfer(t, copy, seconds(0)).ok());
      ++n;
    }
  }
  return n;
}

// A moved session's persistent state arrives byte for byte in the other device's arena, and it
// runs there: by one peer copy into the target's block (host arenas copy into each other), or,
// with peer moves off, through host memory (out, then in).
void MoveKeepsState(bool peer);

TEST(EngineMigrationTest, AMovedSessionKeepsItsStateAndRunsOnTheTarget) {
  for (const bool peer : {true, false}) {
    SCOPED_TRACE(peer ? "peer copy" : "through host memory");
    MoveKeepsState(peer);
  }
}

void MoveKeepsState(bool peer) {
  ManualClock clock;
  Engine::Options o;
  o.clock = &clock;
  o.peer_moves = peer;
  o.policy = std::move(*CreatePolicy("fair"));
  auto a = std::move(*device::CreateMemoryProvider("host"));
  auto b = std::move(*device::CreateMemoryProvider("host"));
  o.devices = std::move(*MakeDevices(*o.policy, &clock,
                                     {{"cpu:0", a.get(), 8 * kMiB}, {"cpu:1", b.get(), 8 * kMiB}}));
  auto engine = std::move(*Engine::Create(std::move(o)));
  SessionSpec spec;
  spec.requirement = {1 * kMiB + 100, 2 * kMiB};
  ASSERT_TRUE(*engine->AddSession(1, spec));
  ASSERT_TRUE(engine->RequestIteration(1).ok());
  std::vector<Dispatch> ds = engine->DispatchReady();
  ASSERT_EQ(ds.size(), 1u);
  ASSERT_EQ(ds[0].device, 0u);
  std::vector<std::byte> pattern(spec.requirement.persistent_bytes);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>(i * 7 + 3);
  std::memcpy(ds[0].persistent.address, pattern.data(), pattern.size());
  // Mid-iteration it cannot move.
  EXPECT_EQ(engine->Migrate(1, 1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine->Complete(ds[0]).ok());
  EXPECT_EQ(engine->Migrate(1, 0).code(), StatusCode::kFailedPrecondition);  // there already
  EXPECT_EQ(engine->Migrate(1, 2).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine->Migrate(1, 1).ok());
  SessionInfo info = *engine->Session(1);
  if (peer) {  // placed on the target at once, its block filled from the source's
    EXPECT_EQ(info.state, SessionState::kAdmitted);
    EXPECT_EQ(info.device, 1u);
    EXPECT_TRUE(info.copying);
    EXPECT_NE(info.reason.find("from cpu:0"), std::string::npos) << info.reason;
    EXPECT_GT(engine->memory(1).CommittedBytes(), 0u);
  } else {
    EXPECT_EQ(info.state, SessionState::kPagedOut);
    EXPECT_EQ(info.migrating_to, 1u);
    EXPECT_NE(info.reason.find("cpu:1"), std::string::npos) << info.reason;
  }
  EXPECT_EQ(engine->memory(0).CommittedBytes(), 0u);
  // Mid-move it neither moves again nor runs.
  EXPECT_EQ(engine->Migrate(1, 0).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine->RequestIteration(1).ok());
  EXPECT_TRUE(engine->DispatchReady().empty());  // its state is on its way
  EXPECT_EQ(RunCopies(*engine), peer ? 1 : 2);   // one into cpu:1, or out of cpu:0 and in
  info = *engine->Session(1);
  EXPECT_EQ(info.device, 1u);
  EXPECT_EQ(info.state, SessionState::kAdmitted);
  EXPECT_FALSE(info.copying);
  EXPECT_EQ(info.migrations, 1u);
  EXPECT_FALSE(info.migrating_to.has_value());
  ds = engine->DispatchReady();
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].device, 1u);
  EXPECT_EQ(std::memcmp(ds[0].persistent.address, pattern.data(), pattern.size()), 0);
  ASSERT_TRUE(engine->Complete(ds[0]).ok());
  const MigrationStats m = engine->Migrations();
  EXPECT_EQ(m.started, 1u);
  EXPECT_EQ(m.finished, 1u);
  EXPECT_EQ(m.undone, 0u);
  EXPECT_TRUE(engine->memory(0).CheckInvariants().ok());
  EXPECT_TRUE(engine->memory(1).CheckInvariants().ok());
}

// Two host devices and a session of `p` bytes on device 0, between iterations, for the peer
// move tests.
struct PeerMove {
  PeerMove() {
    Engine::Options o;
    o.clock = &clock;
    o.policy = std::move(*CreatePolicy("fair"));
    for (int i = 0; i < 2; ++i)
      providers.push_back(std::move(*device::CreateMemoryProvider("host")));
    o.devices = std::move(*MakeDevices(
        *o.policy, &clock,
        {{"cpu:0", providers[0].get(), 8 * kMiB}, {"cpu:1", providers[1].get(), 8 * kMiB}}));
    o.on_admission_failed = [this](SessionId id, const Status& st) { failed.emplace_back(id, st); };
    engine = std::move(*Engine::Create(std::move(o)));
    SessionSpec spec;
    spec.requirement = {2 * kMiB, 1 * kMiB};
    EXPECT_TRUE(*engine->AddSession(1, spec));
  }
  void CheckBoth() const {
    for (size_t d = 0; d < 2; ++d) {
      const Status st = engine->memory(d).CheckInvariants();
      EXPECT_TRUE(st.ok()) << "device " << d << ": " << st;
    }
  }
  ManualClock clock;
  std::vector<std::unique_ptr<device::MemoryProvider>> providers;
  std::unique_ptr<Engine> engine;
  std::vector<std::pair<SessionId, Status>> failed;
};

// Closed while its peer copy is in flight: both devices let it go, the copy still ends (its
// ranges stay in use until then), and both arenas are empty afterwards.
TEST(EngineMigrationTest, ASessionClosedMidPeerMoveLeavesBothDevices) {
  PeerMove m;
  ASSERT_TRUE(m.engine->Migrate(1, 1).ok());
  std::vector<mem::Transfer> ts = m.engine->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);
  ASSERT_NE(ts[0].peer, nullptr);
  ASSERT_TRUE(m.engine->RemoveSession(1).ok());
  m.CheckBoth();
  device::MemoryProvider& p = m.engine->provider(0);
  ASSERT_TRUE(p.CopyToPeer(ts[0].peer, m.engine->provider(1), ts[0].device, ts[0].bytes).ok());
  ASSERT_TRUE(m.engine->FinishTransfer(ts[0], OkStatus(), seconds(0)).ok());
  EXPECT_TRUE(m.engine->TakeTransfers().empty());
  EXPECT_EQ(m.engine->memory(0).CommittedBytes(), 0u);
  EXPECT_EQ(m.engine->memory(1).CommittedBytes(), 0u);
  EXPECT_TRUE(m.engine->Sessions().empty());
  EXPECT_TRUE(m.failed.empty());
  m.CheckBoth();
}

// A peer copy that fails loses the session's state: it is failed once (INTERNAL), on neither
// device afterwards.
TEST(EngineMigrationTest, AFailedPeerCopyFailsTheSessionOnce) {
  PeerMove m;
  ASSERT_TRUE(m.engine->Migrate(1, 1).ok());
  std::vector<mem::Transfer> ts = m.engine->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);
  ASSERT_TRUE(
      m.engine->FinishTransfer(ts[0], InternalError("the link went down"), seconds(0)).ok());
  ASSERT_EQ(m.failed.size(), 1u);
  EXPECT_EQ(m.failed[0].first, 1u);
  EXPECT_EQ(m.failed[0].second.code(), StatusCode::kInternal);
  EXPECT_NE(m.failed[0].second.message().find("link went down"), std::string::npos)
      << m.failed[0].second;
  EXPECT_FALSE(m.engine->Session(1).ok());
  EXPECT_EQ(m.engine->memory(0).CommittedBytes(), 0u);
  EXPECT_EQ(m.engine->memory(1).CommittedBytes(), 0u);
  EXPECT_EQ(m.engine->Migrations().finished, 0u);
  m.CheckBoth();
  // Later moves work.
  SessionSpec spec;
  spec.requirement = {1 * kMiB, 1 * kMiB};
  ASSERT_TRUE(*m.engine->AddSession(2, spec));
  ASSERT_TRUE(m.engine->Migrate(2, 1).ok());
  EXPECT_EQ(RunCopies(*m.engine), 1);
  EXPECT_EQ(m.engine->Session(2)->device, 1u);
  EXPECT_EQ(m.engine->Migrations().finished, 1u);
  m.CheckBoth();
}

// A waiting session that would fit a device once an idle session left it: the engine moves
// that session to a device with room (after the paging quantum), and admits the waiting one.
TEST(EngineMigrationTest, DefragmentingMoveAdmitsAWaitingSession) {
  DevicesHarness h("fair", {4 * G, 4 * G});
  ASSERT_TRUE(*h.Add(1, 2 * G, 1 * G));     // placed on device 0
  ASSERT_TRUE(*h.Add(2, 1 * G, 1 * G, 1));  // pinned to device 1: stays there
  EXPECT_EQ(h.DeviceOf(1), 0u);
  ASSERT_FALSE(*h.Add(3, 2 * G, 1 * G, 0));  // needs device 0 without session 1
  EXPECT_TRUE(h.engine_->DispatchReady().empty());
  EXPECT_EQ(h.engine_->Migrations().started, 0u);  // 1 was admitted less than a quantum ago
  // Every session is idle: no event will come, so the engine names when to look again.
  const std::optional<Nanos> again = h.engine_->NextHoldDeadline();
  ASSERT_TRUE(again.has_value());
  ASSERT_GT(*again, h.clock_.Now());
  h.clock_.Advance(*again - h.clock_.Now() - Nanos(1));
  EXPECT_TRUE(h.engine_->DispatchReady().empty());
  EXPECT_EQ(h.engine_->Migrations().started, 0u);  // not yet
  EXPECT_EQ(h.engine_->NextHoldDeadline(), again);
  h.clock_.Advance(Nanos(1));
  EXPECT_TRUE(h.engine_->DispatchReady().empty());
  EXPECT_EQ(h.engine_->Migrations().started, 1u);
  EXPECT_FALSE(h.engine_->NextHoldDeadline().has_value());  // nothing waits now
  EXPECT_EQ(h.DeviceOf(1), 1u);  // a peer move: on the target at once, its state copying in
  EXPECT_TRUE(h.engine_->Session(1)->copying);
  EXPECT_EQ(h.admitted_later_, (std::vector<SessionId>{3}));  // into the room 1 left
  EXPECT_EQ(h.DeviceOf(3), 0u);
  EXPECT_EQ(RunCopies(*h.engine_), 1);
  EXPECT_FALSE(h.engine_->Session(1)->copying);
  EXPECT_EQ(h.engine_->Migrations().finished, 1u);
  EXPECT_EQ(h.DeviceOf(2), 1u);
  h.CheckSafety();
  // Both run, each on its device.
  for (SessionId s : {1, 2, 3}) ASSERT_TRUE(h.engine_->RequestIteration(s).ok());
  std::map<SessionId, size_t> ran;
  for (int round = 0; round < 3; ++round) {
    for (const Dispatch& d : h.engine_->DispatchReady()) {
      ran[d.session] = d.device;
      ASSERT_TRUE(h.engine_->Complete(d).ok());
    }
  }
  EXPECT_EQ(ran, (std::map<SessionId, size_t>{{1, 1}, {2, 1}, {3, 0}}));
}

TEST(EngineMigrationTest, PinnedSessionsAreNotMoved) {
  DevicesHarness h("fair", {4 * G, 4 * G});
  ASSERT_TRUE(*h.Add(1, 2 * G, 1 * G, 0));
  ASSERT_FALSE(*h.Add(3, 2 * G, 1 * G, 0));
  h.clock_.Advance(seconds(5));
  h.engine_->DispatchReady();
  EXPECT_EQ(h.engine_->Migrations().started, 0u);
  EXPECT_EQ(h.engine_->Session(3)->state, SessionState::kWaiting);
}

// Through host memory, the target lost its room while the copy out ran: the move is undone,
// and the session pages back in on its own device when it runs (no overcommit needed). (A
// peer move holds the target's room from its start.)
TEST(EngineMigrationTest, AMoveWhoseTargetFilledUpIsUndone) {
  DevicesHarness h("fair", {4 * G, 4 * G}, 1.0, true, /*peer_moves=*/false);
  ASSERT_TRUE(*h.Add(1, 2 * G, 1 * G, 0));
  ASSERT_TRUE(h.engine_->Migrate(1, 1).ok());
  ASSERT_TRUE(*h.Add(2, 2 * G, 1 * G, 1));  // takes device 1's room meanwhile
  EXPECT_EQ(RunCopies(*h.engine_), 1);      // the copy out only
  EXPECT_EQ(h.engine_->Migrations().undone, 1u);
  SessionInfo info = *h.engine_->Session(1);
  EXPECT_EQ(info.device, 0u);
  EXPECT_EQ(info.state, SessionState::kPagedOut);
  EXPECT_NE(info.reason.find("no room"), std::string::npos) << info.reason;
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  EXPECT_TRUE(h.engine_->DispatchReady().empty());  // paged back in: copying
  EXPECT_EQ(RunCopies(*h.engine_), 1);
  std::vector<Dispatch> ds = h.engine_->DispatchReady();
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].device, 0u);
  ASSERT_TRUE(h.engine_->Complete(ds[0]).ok());
  h.CheckSafety();
  // A target without room is refused up front.
  EXPECT_EQ(h.engine_->Migrate(1, 1).code(), StatusCode::kFailedPrecondition);
}

// Introspective packing (Note [Introspective packing]). A closed loop on the manual clock:
// every session always has its next iteration requested; one alone on its device takes 1 s an
// iteration, and while two run on one device each progresses at 1 / `together` of that.
struct PackLoop {
  explicit PackLoop(DevicesHarness& harness, double together) : h(harness), t(together) {}

  // Each session's first `cold_iterations` iterations take `cold` times the work (a GPU's
  // first iterations load kernels and library state).
  int cold_iterations = 0;
  double cold = 1.0;
  std::map<SessionId, int> started;

  // Runs until `completions` iterations ended; returns how many of them overlapped another
  // iteration of their device at some moment.
  int Run(int completions) {
    int overlapped = 0;
    for (int done = 0; done < completions;) {
      for (const Dispatch& d : h.engine_->DispatchReady()) {
        running.push_back({d, started[d.session]++ < cold_iterations ? cold : 1.0, false});
      }
      for (const mem::Transfer& tr : h.engine_->TakeTransfers()) {
        EXPECT_TRUE(h.engine_->FinishTransfer(tr, OkStatus(), seconds(0)).ok());
      }
      if (running.empty()) {
        // Every session has work: nothing running now would stall the engine for good.
        ADD_FAILURE() << "nothing dispatched after " << done << " completions";
        return overlapped;
      }
      std::map<size_t, int> per_device;
      for (const Job& j : running) per_device[j.d.device]++;
      auto rate = [&](const Job& j) { return per_device[j.d.device] > 1 ? 1.0 / t : 1.0; };
      for (Job& j : running) j.shared = j.shared || per_device[j.d.device] > 1;
      double step = 1e9;
      for (const Job& j : running) step = std::min(step, j.left / rate(j));
      h.clock_.Advance(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(step)));
      for (Job& j : running) j.left -= step * rate(j);
      for (auto it = running.begin(); it != running.end();) {
        if (it->left > 1e-9) {
          ++it;
          continue;
        }
        EXPECT_TRUE(h.engine_->Complete(it->d).ok());
        EXPECT_TRUE(h.engine_->RequestIteration(it->d.session).ok());
        overlapped += it->shared ? 1 : 0;
        ++done;
        it = running.erase(it);
      }
    }
    return overlapped;
  }

  struct Job {
    Dispatch d;
    double left;
    bool shared;
  };
  DevicesHarness& h;
  double t;
  std::vector<Job> running;
};

// Two sessions that each take 3x as long together (gain 1/3 + 1/3 < 1): measured side by side,
// probed apart (neither ran alone before), then kept apart for good.
TEST(EngineIntrospectionTest, APairSlowerTogetherIsUnpacked) {
  DevicesHarness h("pack", {8 * G});
  ASSERT_TRUE(*h.Add(1, 1 * G, 2 * G));
  ASSERT_TRUE(*h.Add(2, 1 * G, 2 * G));
  EXPECT_NE(h.engine_->Session(1)->lane, h.engine_->Session(2)->lane);  // packed
  for (SessionId s : {1, 2}) ASSERT_TRUE(h.engine_->RequestIteration(s).ok());
  PackLoop loop(h, 3.0);
  EXPECT_GT(loop.Run(16), 0);  // 2 unmeasured warm-up iterations each, then the samples
  IntrospectionStats st = h.engine_->Introspection();
  EXPECT_EQ(st.probes, 1u);
  EXPECT_EQ(st.apart, 1u);
  EXPECT_EQ(st.kept + st.moved, 0u);
  // From now on they never overlap.
  loop.running.clear();
  EXPECT_EQ(loop.Run(20), 0);
}

// Three sessions unpacked from one another take turns, the longest waiting first: none starves
// and the device never idles while one of them has work.
TEST(EngineIntrospectionTest, SessionsKeptApartTakeTurns) {
  DevicesHarness h("pack", {8 * G});
  for (SessionId s : {1, 2, 3}) {
    ASSERT_TRUE(*h.Add(s, 1 * G, 1 * G));
    ASSERT_TRUE(h.engine_->RequestIteration(s).ok());
  }
  PackLoop loop(h, 4.0);
  loop.Run(30);
  EXPECT_EQ(h.engine_->Introspection().apart, 3u);
  loop.running.clear();
  std::map<SessionId, int64_t> before;
  for (const SessionInfo& s : h.engine_->Sessions()) before[s.id] = s.iterations_done;
  EXPECT_EQ(loop.Run(30), 0);  // never side by side again
  // Round robin: each of the three ran its share of the 30.
  for (const SessionInfo& s : h.engine_->Sessions()) {
    EXPECT_GE(s.iterations_done - before[s.id], 9) << "session " << s.id;
  }
}

// Together each takes 1.2x as long (gain 1/1.2 + 1/1.2 = 1.67): kept packed.
TEST(EngineIntrospectionTest, APairThatGainsStaysPacked) {
  DevicesHarness h("pack", {8 * G});
  ASSERT_TRUE(*h.Add(1, 1 * G, 2 * G));
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  PackLoop loop(h, 1.2);
  loop.Run(6);  // 1 alone: its warm-up, then its solo samples
  ASSERT_TRUE(*h.Add(2, 1 * G, 2 * G));
  ASSERT_TRUE(h.engine_->RequestIteration(2).ok());
  loop.Run(16);
  IntrospectionStats st = h.engine_->Introspection();
  EXPECT_EQ(st.kept, 1u);
  EXPECT_EQ(st.probes, 1u);  // 2 never ran alone: probed apart for its time without 1
  EXPECT_EQ(st.apart + st.moved, 0u);
  EXPECT_GT(loop.Run(10), 5);  // still side by side
}

// A pair that gains, whose first two iterations each take 20x a warm one (as a GPU's first
// iterations do): the warm-up iterations are not measured, so the pair stays packed.
TEST(EngineIntrospectionTest, WarmUpIterationsAreNotMeasured) {
  DevicesHarness h("pack", {8 * G});
  for (SessionId s : {1, 2}) {
    ASSERT_TRUE(*h.Add(s, 1 * G, 2 * G));
    ASSERT_TRUE(h.engine_->RequestIteration(s).ok());
  }
  PackLoop loop(h, 1.2);
  loop.cold_iterations = 2;
  loop.cold = 20.0;
  loop.Run(30);
  IntrospectionStats st = h.engine_->Introspection();
  EXPECT_EQ(st.kept, 1u);
  EXPECT_EQ(st.apart + st.moved, 0u);
  EXPECT_GT(loop.Run(10), 5);  // still side by side
}

// With another device free, unpacking moves one of the pair there, and both run at full speed.
// (The engine's own moves are off: spreading would move one there first.)
TEST(EngineIntrospectionTest, UnpackingMovesASessionToAFreeDevice) {
  DevicesHarness h("pack", {8 * G, 8 * G}, 1.0, /*defragment=*/false);
  ASSERT_TRUE(*h.Add(1, 1 * G, 2 * G));
  ASSERT_TRUE(*h.Add(2, 2 * G, 2 * G));
  ASSERT_EQ(h.DeviceOf(1), 0u);
  ASSERT_EQ(h.DeviceOf(2), 0u);  // best fit packs it beside 1
  for (SessionId s : {1, 2}) ASSERT_TRUE(h.engine_->RequestIteration(s).ok());
  PackLoop loop(h, 3.0);
  loop.Run(20);
  IntrospectionStats st = h.engine_->Introspection();
  EXPECT_EQ(st.moved, 1u);
  EXPECT_EQ(h.DeviceOf(1), 1u);  // the smaller P moved
  EXPECT_EQ(h.engine_->Migrations().finished, 1u);
  loop.running.clear();
  EXPECT_EQ(loop.Run(10), 0);  // no longer on one device
}

TEST(EngineIntrospectionTest, OffWhenThePolicySaysSo) {
  DevicesHarness off("pack", {8 * G});
  // Rebuilt with the option: the harness takes the policy by name only.
  Engine::Options o;
  o.clock = &off.clock_;
  o.policy = std::move(*CreatePolicy("pack", {{"introspect", false}}));
  o.devices =
      std::move(*MakeDevices(*o.policy, &off.clock_, {{"f", off.providers_[0].get(), 8 * G}}));
  off.engine_ = std::move(*Engine::Create(std::move(o)));
  ASSERT_TRUE(*off.Add(1, 1 * G, 2 * G));
  ASSERT_TRUE(*off.Add(2, 1 * G, 2 * G));
  for (SessionId s : {1, 2}) ASSERT_TRUE(off.engine_->RequestIteration(s).ok());
  PackLoop loop(off, 3.0);
  EXPECT_EQ(loop.Run(30), 30);  // always side by side
  const IntrospectionStats st = off.engine_->Introspection();
  EXPECT_EQ(st.probes + st.kept + st.apart + st.moved, 0u);
  for (const nlohmann::json& bad :
       {nlohmann::json{{"introspect", 1}}, nlohmann::json{{"min_gain", 0}},
        nlohmann::json{{"samples", 0}}, nlohmann::json{{"nope", 1}}}) {
    EXPECT_EQ(CreatePolicy("pack", bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace salus::sched
