// The engine's paging decisions (Note [Paging] in engine.cc) on a manual clock and the fake
// provider: which session is paged out for which, when, and that nothing runs paged out.
#include <gtest/gtest.h>

#include <map>

#include "common/units.h"
#include "device/fake_memory_provider.h"
#include "device/memory_provider.h"
#include "sched/engine.h"

namespace salus::sched {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t G = kGiB;

class PagingHarness {
 public:
  explicit PagingHarness(std::string_view policy, Nanos quantum = Nanos(0)) {
    provider_ = std::move(*device::CreateMemoryProvider("fake"));
    Engine::Options o;
    o.clock = &clock_;
    o.policy = std::move(*CreatePolicy(policy));
    // Every byte of host memory goes back to the provider (no host pool).
    o.devices =
        std::move(*MakeDevices(*o.policy, &clock_, {{"fake:0", provider_.get(), 10 * G, 2.0, 0}}));
    o.paging_quantum = quantum;
    o.page_out_idle = milliseconds(10);
    engine_ = std::move(*Engine::Create(std::move(o)));
  }

  bool Add(SessionId id, uint64_t p, int64_t iterations) {
    SessionSpec spec;
    spec.requirement = {p, 1 * G, mem::LaneClass::kBatch};
    spec.declared_iterations = iterations;
    spec.iteration_time_hint = seconds(1);
    return *engine_->AddSession(id, spec);
  }
  SessionState State(SessionId id) const { return engine_->Session(id)->state; }

  // Dispatches (DispatchReady); every dispatched session must be resident.
  std::vector<sched::Dispatch> Run() {
    std::vector<sched::Dispatch> ds = engine_->DispatchReady();
    for (const sched::Dispatch& d : ds) {
      EXPECT_EQ(*engine_->memory().ResidenceOf(d.session), mem::Residence::kResident);
      EXPECT_NE(d.persistent.address, nullptr);
      dispatched_.push_back(d.session);
    }
    return ds;
  }
  // Runs every copy that may run, one after another, each taking a second.
  int Copy() {
    int n = 0;
    for (auto ts = engine_->TakeTransfers(); !ts.empty(); ts = engine_->TakeTransfers()) {
      for (const mem::Transfer& t : ts) {
        clock_.Advance(seconds(1));
        EXPECT_TRUE(engine_->FinishTransfer(t, OkStatus(), seconds(1)).ok());
        EXPECT_TRUE(engine_->memory().CheckInvariants().ok());
        ++n;
      }
    }
    return n;
  }
  void Finish(const sched::Dispatch& d) {
    clock_.Advance(seconds(1));
    ASSERT_TRUE(engine_->Complete(d).ok());
  }

  ManualClock clock_;
  std::unique_ptr<device::MemoryProvider> provider_;
  std::unique_ptr<Engine> engine_;
  std::vector<SessionId> dispatched_;
};

TEST(EnginePagingTest, SrtfPagesOutTheLongerJobForAShorterOneAndBack) {
  PagingHarness h("srtf");
  ASSERT_TRUE(h.Add(1, 6 * G, 100));
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  auto ds = h.Run();
  ASSERT_EQ(ds.size(), 1u);
  // Admitted beyond capacity: paged out from the start.
  ASSERT_TRUE(h.Add(2, 6 * G, 2));
  EXPECT_EQ(h.State(2), SessionState::kPagedOut);
  ASSERT_TRUE(h.engine_->RequestIteration(2).ok());
  EXPECT_TRUE(h.Run().empty());  // the lane is busy and 1 is mid-iteration
  EXPECT_EQ(h.State(2), SessionState::kPagedOut);
  h.Finish(ds[0]);
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  // 2 has less left: 1 goes out between its iterations, 2 comes in.
  EXPECT_TRUE(h.Run().empty());  // 2's block waits for 1's copy out
  EXPECT_EQ(h.State(1), SessionState::kPagedOut);
  EXPECT_NE(h.engine_->Session(1)->reason.find("session 2"), std::string::npos);
  EXPECT_EQ(h.State(2), SessionState::kAdmitted);
  EXPECT_EQ(h.Copy(), 1);
  for (int i = 0; i < 2; ++i) {
    ds = h.Run();
    ASSERT_EQ(ds.size(), 1u);
    EXPECT_EQ(ds[0].session, 2u);
    h.Finish(ds[0]);
    if (i == 0) {
      ASSERT_TRUE(h.engine_->RequestIteration(2).ok());
    }
  }
  ASSERT_TRUE(h.engine_->RemoveSession(2).ok());
  // 1 comes back: its state is copied in before it may run.
  EXPECT_TRUE(h.Run().empty());
  EXPECT_EQ(h.State(1), SessionState::kAdmitted);
  EXPECT_TRUE(h.engine_->Session(1)->copying);
  EXPECT_EQ(h.Copy(), 1);
  ds = h.Run();
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].session, 1u);
  EXPECT_EQ(h.dispatched_, (std::vector<SessionId>{1, 2, 2, 1}));
  const PagingStats p = h.engine_->Paging();
  EXPECT_EQ(p.page_ins, 2u);
  EXPECT_EQ(p.page_outs, 1u);
  EXPECT_EQ(p.copies, 2u);
  EXPECT_EQ(p.copied_bytes, 12 * G);
}

TEST(EnginePagingTest, FifoKeepsTheHeadResidentWhileItHasWork) {
  PagingHarness h("fifo");
  ASSERT_TRUE(h.Add(1, 2 * G, 3));
  ASSERT_TRUE(h.Add(2, 2 * G, 3));  // fits, but FIFO runs one session at a time
  EXPECT_EQ(h.State(2), SessionState::kPagedOut);
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  ASSERT_TRUE(h.engine_->RequestIteration(2).ok());
  for (int i = 0; i < 3; ++i) {
    auto ds = h.Run();
    ASSERT_EQ(ds.size(), 1u);
    EXPECT_EQ(ds[0].session, 1u);
    h.Finish(ds[0]);
    if (i < 2) {
      ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
    }
    EXPECT_EQ(h.State(2), SessionState::kPagedOut);
  }
  ASSERT_TRUE(h.engine_->RemoveSession(1).ok());
  auto ds = h.Run();  // admitted paged out: nothing to copy in
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].session, 2u);
  EXPECT_EQ(h.Copy(), 0);
}

TEST(EnginePagingTest, AnIdleSessionIsPagedOutForOneWithWork) {
  PagingHarness h("pack");
  ASSERT_TRUE(h.Add(1, 6 * G, 10));
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  auto ds = h.Run();
  h.Finish(ds[0]);  // and 1 asks for nothing more
  ASSERT_TRUE(h.Add(2, 6 * G, 10));
  ASSERT_TRUE(h.engine_->RequestIteration(2).ok());
  h.clock_.Advance(milliseconds(5));
  h.Run();
  EXPECT_EQ(h.State(1), SessionState::kAdmitted);  // idle for less than page_out_idle
  h.clock_.Advance(milliseconds(10));
  h.Run();
  EXPECT_EQ(h.State(1), SessionState::kPagedOut);
  h.Copy();
  ds = h.Run();
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].session, 2u);
}

TEST(EnginePagingTest, APagedInSessionKeepsItsPlaceForAQuantum) {
  PagingHarness h("srtf", seconds(5));
  ASSERT_TRUE(h.Add(1, 6 * G, 100));
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  auto ds = h.Run();
  ASSERT_TRUE(h.Add(2, 6 * G, 2));
  ASSERT_TRUE(h.engine_->RequestIteration(2).ok());
  h.Finish(ds[0]);  // t = 1 s
  for (int t = 1; t < 5; ++t) {
    ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
    ds = h.Run();
    ASSERT_EQ(ds.size(), 1u);
    EXPECT_EQ(ds[0].session, 1u) << "at " << t << " s";
    h.Finish(ds[0]);
  }
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  h.Run();  // t = 5 s: its quantum is over
  EXPECT_EQ(h.State(1), SessionState::kPagedOut);
}

TEST(EnginePagingTest, RemovingPagedOutAndPagingSessionsFreesTheirState) {
  PagingHarness h("srtf");
  ASSERT_TRUE(h.Add(1, 6 * G, 100));
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  auto ds = h.Run();
  ASSERT_TRUE(h.Add(2, 6 * G, 2));
  ASSERT_TRUE(h.Add(3, 6 * G, 2));
  ASSERT_TRUE(h.engine_->RequestIteration(2).ok());
  h.Finish(ds[0]);
  ASSERT_TRUE(h.engine_->RequestIteration(1).ok());
  h.Run();  // 1 paging out for 2
  auto ts = h.engine_->TakeTransfers();
  ASSERT_EQ(ts.size(), 1u);
  ASSERT_TRUE(h.engine_->RemoveSession(1).ok());  // mid-copy
  ASSERT_TRUE(h.engine_->RemoveSession(3).ok());  // never resident
  ASSERT_TRUE(h.engine_->FinishTransfer(ts[0], OkStatus(), seconds(1)).ok());
  ASSERT_TRUE(h.engine_->RemoveSession(2).ok());
  EXPECT_TRUE(h.engine_->Sessions().empty());
  auto* fake = dynamic_cast<device::FakeMemoryProvider*>(h.provider_.get());
  ASSERT_NE(fake, nullptr);
  EXPECT_EQ(fake->live_host_bytes(), 0u);
  EXPECT_EQ(h.engine_->memory().CommittedBytes(), 0u);
}

}  // namespace
}  // namespace salus::sched
