// A memory manager over the fake provider and a manual clock, recording the admission events
// its calls return.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/units.h"
#include "device/fake_memory_provider.h"
#include "mem/memory_manager.h"
#include "sched/admission_rules.h"

namespace salus::mem::testing {

struct Harness {
  explicit Harness(uint64_t capacity, std::shared_ptr<const AdmissionRule> rule = sched::PackRule(),
                   double overcommit = 1.0) {
    MemoryManager::Options o;
    o.provider = &provider;
    o.capacity = capacity;
    o.rule = std::move(rule);
    o.overcommit = overcommit;
    o.clock = &clock;
    auto m = MemoryManager::Create(std::move(o));
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) manager = std::move(m).value();
  }

  // Admits and expects a grant now; returns its lane (0 on failure).
  LaneId AdmitNow(SessionId s, uint64_t p, uint64_t e) { return AdmitNow(s, Requirement{p, e}); }
  LaneId AdmitNow(SessionId s, const Requirement& req) {
    auto g = manager->Admit(s, req);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return 0;
    EXPECT_TRUE(g->has_value()) << "session " << s << " was queued";
    return g->has_value() ? (*g)->lane : 0;
  }

  // Admits and expects to wait.
  void AdmitWaits(SessionId s, uint64_t p, uint64_t e, std::optional<Nanos> timeout = {}) {
    AdmitWaits(s, Requirement{p, e}, timeout);
  }
  void AdmitWaits(SessionId s, const Requirement& req, std::optional<Nanos> timeout = {}) {
    auto g = manager->Admit(s, req, timeout);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_FALSE(g->has_value()) << "session " << s << " was admitted";
  }

  // The manager's calls that return admission events, recording them in `admitted` and
  // `failed`.
  Status Release(SessionId s) { return Recorded(manager->Release(s)); }
  void CancelWaiting(SessionId s) { Record(manager->CancelWaiting(s)); }
  void ExpireWaiting() { Record(manager->ExpireWaiting()); }
  Status FinishTransfer(uint64_t transfer, const Status& copy = OkStatus()) {
    return Recorded(manager->FinishTransfer(transfer, copy));
  }
  StatusOr<PageInResult> PageIn(SessionId s, std::span<const SessionId> candidates) {
    auto r = manager->PageIn(s, candidates);
    if (r.ok()) Record(std::move(r->events));
    return r;
  }
  void Record(AdmissionEvents events) {
    admitted.insert(admitted.end(), events.admitted.begin(), events.admitted.end());
    failed.insert(failed.end(), events.failed.begin(), events.failed.end());
  }
  Status Recorded(StatusOr<AdmissionEvents> events) {
    if (!events.ok()) return events.status();
    Record(std::move(*events));
    return OkStatus();
  }

  uint64_t LaneSize(LaneId id) const {
    for (const LaneInfo& l : manager->Lanes()) {
      if (l.id == id) return l.size;
    }
    return UINT64_MAX;
  }
  uint64_t LaneOffset(LaneId id) const {
    for (const LaneInfo& l : manager->Lanes()) {
      if (l.id == id) return l.offset;
    }
    return UINT64_MAX;
  }

  device::FakeMemoryProvider provider;
  ManualClock clock;
  std::unique_ptr<MemoryManager> manager;
  std::vector<Grant> admitted;
  std::vector<std::pair<SessionId, Status>> failed;
};

}  // namespace salus::mem::testing
