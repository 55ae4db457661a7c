// MemoryManager: the arena, the persistent region, lanes, Algorithm 1 and the admission queue.
//
// CONTRACT (the scheduler and the server code against this; the implementation may add to it
// but keeps these signatures and semantics):
//
// - The arena [0, C) is taken once at Create() from a device::MemoryProvider. The persistent
//   region grows down from C, the ephemeral region grows up from 0 and is cut into lanes.
// - Admit(session, {P, E}) runs the admission rule of the configured mode:
//     kPack        Algorithm 1 of DESIGN.md (new lane / best-match join / grow / queue);
//     kSingleLane  one shared lane grown to the largest E; admitted if ΣP + P + max(L, E) ≤ C;
//     kExclusive   one session on the device at a time (admitted iff none is admitted).
//   It returns the Grant when admitted now, std::nullopt when the session waits in the
//   admission queue (it is admitted later and reported through Options::on_admitted), or
//   RESOURCE_EXHAUSTED at once when it can never fit (P + E > C), with P, E and C in human
//   units in the message. Invariant 1 (ΣP + ΣL ≤ C) holds after every call.
// - Release(session) frees its persistent block and its lane membership (the lane shrinks to
//   the largest remaining E, or closes), then re-tries the admission queue in order; each
//   session admitted by that is reported through on_admitted (called without internal locks
//   held, on the caller's thread).
// - CancelWaiting / ExpireWaiting remove queued sessions (the latter those whose timeout has
//   passed on the injected clock); each is reported through on_admission_failed with
//   CANCELLED or DEADLINE_EXCEEDED.
// - BeginIteration(lane) resolves the lane's current base address (applying a pending grow,
//   shrink or relocation, which is legal only now because lanes are empty between
//   iterations) and returns a LaneIteration whose allocator serves this iteration.
//   It returns UNAVAILABLE when the lane cannot be placed yet because lanes that are
//   mid-iteration occupy the range it needs; the caller retries after any EndIteration.
//   EndIteration(lane) releases everything the iteration allocated.
// - Every method is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "salus/status.h"

namespace salus::device {
class MemoryProvider;
}

namespace salus::mem {

using SessionId = uint64_t;
using LaneId = uint64_t;

struct Requirement {
  uint64_t persistent_bytes = 0;  // P
  uint64_t ephemeral_bytes = 0;   // E
};

enum class AdmissionMode {
  kPack,        // PACK, FAIR: Algorithm 1, as many lanes as the safety condition allows
  kSingleLane,  // SRTF, FAIR's single-lane option
  kExclusive,   // FIFO: no sharing
};

struct Grant {
  SessionId session = 0;
  LaneId lane = 0;
};

// One iteration's view of its lane. Valid between BeginIteration and EndIteration.
struct LaneIteration {
  LaneId lane = 0;
  uint64_t base = 0;      // arena offset of the lane
  uint64_t size = 0;      // lane size in bytes
  std::byte* address = nullptr;  // provider address of the lane base (not dereferenceable on
                                 // the fake provider)
  class LaneAllocator* allocator = nullptr;
};

struct PersistentBlock {
  uint64_t offset = 0;  // arena offset
  uint64_t size = 0;
  std::byte* address = nullptr;
};

struct LaneInfo {
  LaneId id = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::vector<SessionId> sessions;
  bool in_iteration = false;
};

class MemoryManager {
 public:
  struct Options {
    device::MemoryProvider* provider = nullptr;  // not owned; outlives the manager
    uint64_t capacity = 0;                        // C
    AdmissionMode mode = AdmissionMode::kPack;
    const Clock* clock = nullptr;  // for admission timeouts; SteadyClock when null
    std::function<void(const Grant&)> on_admitted;
    std::function<void(SessionId, const Status&)> on_admission_failed;
  };

  static StatusOr<std::unique_ptr<MemoryManager>> Create(Options options);
  virtual ~MemoryManager() = default;

  virtual StatusOr<std::optional<Grant>> Admit(SessionId session, Requirement req,
                                               std::optional<Nanos> timeout = std::nullopt) = 0;
  virtual Status Release(SessionId session) = 0;
  virtual void CancelWaiting(SessionId session) = 0;
  virtual void ExpireWaiting() = 0;

  virtual StatusOr<PersistentBlock> Persistent(SessionId session) const = 0;
  virtual StatusOr<LaneIteration> BeginIteration(LaneId lane) = 0;
  virtual Status EndIteration(LaneId lane) = 0;

  virtual uint64_t capacity() const = 0;
  virtual std::vector<LaneInfo> Lanes() const = 0;
  virtual size_t WaitingCount() const = 0;
  // ΣP + ΣL: what the safety condition bounds by C.
  virtual uint64_t CommittedBytes() const = 0;
  // Statistics per region, lane and session, and the memory map (see docs/memory.md).
  virtual nlohmann::json Stats() const = 0;
  virtual nlohmann::json MemoryMap() const = 0;
};

}  // namespace salus::mem
