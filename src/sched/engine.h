// Engine: the iteration scheduler's mechanism.
//
// The engine is handed one memory manager per device (Note [Devices] in engine.cc; built
// with the policy's admission rule by MakeDevices) and owns them, with the per-lane queues
// of sessions with pending iterations. It is a synchronous state machine
// driven by events — AddSession, RemoveSession, RequestIteration, Complete — and Dispatch(),
// which starts every iteration that can start now: for each idle lane with runnable
// sessions, it asks the policy for a decision over a read-only snapshot, resolves the lane's
// memory (mem::MemoryManager::BeginIteration) and hands the caller a Dispatch to run. The
// daemon drives it with lane worker threads (Executor) and the real clock; the simulator
// drives it from a discrete-event loop with a ManualClock. Both run this same code.
//
// Guarantees: at most one iteration in flight per lane (invariant 2); work conservation —
// after Dispatch() returns, no lane is idle while it has a runnable session, unless its memory
// is blocked by lanes mid-iteration (it is retried after every Complete), its session is kept
// apart from one running on another lane of its device (Note [Introspective packing]; also
// retried after every Complete), or its policy holds it
// for a session expected back (Note [Anticipation], bounded by that session's hold window;
// whoever drives the engine calls DispatchReady() again at NextHoldDeadline()); policies only
// decide (invariant 6). Thread-safe: every method takes the engine's mutex; callbacks run
// without it.
//
// Each lane keeps the views of its runnable sessions up to date as events change them, so a
// boundary hands the policy a ready span instead of rebuilding it from every member.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/thread_annotations.h"
#include "mem/memory_manager.h"
#include "salus/status.h"
#include "sched/policy.h"

namespace salus::sched {

struct SessionSpec {
  mem::Requirement requirement;  // P, E and the lane class
  int priority = 0;
  // What the client declared of its length; used for SRTF's remaining-time estimate.
  std::optional<int64_t> declared_iterations;
  std::optional<Nanos> declared_duration;
  // Expected time of one iteration before any is measured (e.g. a synthetic profile's).
  std::optional<Nanos> iteration_time_hint;
  // How long the session may wait for admission; forever when absent.
  std::optional<Nanos> admission_timeout;
  // The device it must run on (an index into the engine's devices); placed by the engine
  // (Note [Devices]) when absent.
  std::optional<size_t> device;
  // Iterations it ran before (a session restored from a snapshot): its count starts there.
  int64_t iterations_done = 0;
};

// One device the engine schedules: the name clients pin and the memory map shows ("cpu:0",
// "cuda:1"), and its memory manager.
struct EngineDevice {
  std::string name;
  std::unique_ptr<mem::MemoryManager> memory;
};

// What one device's memory manager is built from (see MakeDevices).
struct DeviceSpec {
  std::string name;
  device::MemoryProvider* provider = nullptr;  // not owned; outlives the engine
  uint64_t capacity = 0;                       // the arena's size C
  // Admission beyond capacity (mem::MemoryManager::Options::overcommit); 1: off.
  double overcommit = 1.0;
  // Freed host memory kept for the next page-out (mem::MemoryManager::Options); by default
  // what overcommit can page out at most, (overcommit - 1) × capacity, and with several
  // devices at least the capacity (moves between devices page out too).
  std::optional<uint64_t> host_pool_bytes = std::nullopt;
};

// The devices of an engine under `policy`: one memory manager each, with the policy's
// admission rule, `clock` for admission timeouts, and lane ids that no two devices share.
StatusOr<std::vector<EngineDevice>> MakeDevices(const Policy& policy, const Clock* clock,
                                                const std::vector<DeviceSpec>& specs);

// Runs transfer `t`'s copy on the providers of `engine`'s devices, as whoever drives the engine
// does before FinishTransfer: a peer copy into another device's block (Note [Migration]), or a
// copy to or from host memory.
class Engine;
Status RunCopy(const Engine& engine, const mem::Transfer& t);

// One started iteration, handed to whoever runs it, and given back to Complete().
struct Dispatch {
  SessionId session = 0;
  LaneId lane = 0;
  size_t device = 0;  // the index of the lane's device
  mem::LaneClass lane_class = mem::LaneClass::kBatch;
  uint64_t iteration = 0;  // the session's iteration index, from 0
  mem::LaneIteration lane_memory;
  mem::PersistentBlock persistent;
  Nanos requested_at{0};
  Nanos started_at{0};
  Nanos switch_gap{0};     // the lane's previous iteration end to this start; 0 for a lane's first
  bool lane_first = true;  // the first iteration this lane ran
};

struct IterationRecord {
  SessionId session = 0;
  LaneId lane = 0;
  mem::LaneClass lane_class = mem::LaneClass::kBatch;
  uint64_t iteration = 0;
  Nanos requested_at{0};
  Nanos started_at{0};
  Nanos finished_at{0};
  Nanos queue_delay{0};  // started - requested
  Nanos run_time{0};     // finished - started
  Nanos switch_gap{0};
  bool lane_first = true;
};

// A session's lifecycle, one state at a time (Note [Session lifecycle] in engine.cc):
//   waiting --admitted--> admitted <--iteration--> running
//   admitted --paged out to make room--> paged out --paged in--> admitted
//   running --removed--> closing --its iteration ends--> (gone)
// Admission beyond capacity (overcommit) admits straight into paged out.
enum class SessionState : uint8_t { kWaiting, kAdmitted, kRunning, kPagedOut, kClosing };
std::string_view SessionStateName(SessionState s);  // "waiting", "admitted", ...

struct SessionInfo {
  SessionId id = 0;
  std::optional<size_t> device;  // its device; none while it waits for any device
  SessionState state = SessionState::kWaiting;
  std::string reason;  // why it is in its state, where that says more (paged out for whom)
  LaneId lane = 0;
  mem::LaneClass lane_class = mem::LaneClass::kBatch;
  int priority = 0;
  int64_t iterations_done = 0;
  int pending = 0;
  bool running = false;
  Nanos total_service{0};
  double remaining_seconds = 0;
  double avg_iteration_seconds = 0;    // 0 until measured
  Nanos hold_window{0};                // Note [Anticipation]; 0 when the policy never holds
  size_t gaps_observed = 0;            // reply-to-request gaps seen (at most kGapHistory kept)
  bool copying = false;                // its state is being copied to or from host memory
  uint64_t ephemeral_bytes = 0;        // the E admission granted (0 while waiting)
  uint64_t page_outs = 0;              // times paged out
  uint64_t migrations = 0;             // times moved to another device
  std::optional<size_t> migrating_to;  // the device it is being moved to
};

// Introspective packing's decisions since the engine was created (Note [Introspective
// packing] in engine.cc): pairs of sessions measured side by side, and what became of them.
struct IntrospectionStats {
  uint64_t probes = 0;  // pairs run apart for a while to measure them alone
  uint64_t kept = 0;    // pairs kept packed: together they gain
  uint64_t apart = 0;   // pairs unpacked by no longer running them at the same time
  uint64_t moved = 0;   // pairs unpacked by moving one of them to another device
};

// Moves between devices since the engine was created (Note [Migration] in engine.cc).
struct MigrationStats {
  uint64_t started = 0;
  uint64_t finished = 0;
  uint64_t undone = 0;  // the target had no room any more when the copy out ended
};

// Paging since the engine was created (Note [Paging] in engine.cc).
struct PagingStats {
  uint64_t page_ins = 0;   // sessions made resident by paging in
  uint64_t page_outs = 0;  // sessions paged out to make room
  uint64_t copies = 0;     // transfers finished
  uint64_t copied_bytes = 0;
  Nanos copy_time{0};  // summed over finished transfers, as their runner reported
};

// Lanes held for anticipated sessions (Note [Anticipation]), since the engine was created.
struct HoldStats {
  uint64_t started = 0;   // holds begun
  uint64_t returned = 0;  // ended by the held session's own next iteration
  uint64_t expired = 0;   // ended otherwise: its window passed, it closed, or nothing waited
  Nanos idle{0};          // lane time spent held, up to the iteration that ended the hold
};

// Reply-to-request gaps a session's hold window is learned from.
inline constexpr size_t kGapHistory = 16;
// The learned window is the p90 gap plus 1/kHoldMarginDivisor of it (a 25% margin).
inline constexpr int kHoldMarginDivisor = 4;

class Engine {
 public:
  struct Options {
    const Clock* clock = nullptr;       // required
    std::vector<EngineDevice> devices;  // at least one (MakeDevices)
    std::unique_ptr<Policy> policy;     // required
    // Weight of the newest measurement in the moving average of iteration time.
    double ewma_alpha = 0.25;
    // Note [Paging]: a session made resident is not paged out for another before this much
    // time has passed and it has run an iteration; an idle one is paged out only when it has
    // not asked for an iteration for page_out_idle.
    Nanos paging_quantum = std::chrono::seconds(1);
    Nanos page_out_idle = std::chrono::milliseconds(50);
    // Note [Migration]: whether the engine moves sessions between devices by itself, to let
    // waiting ones in or to a device with no session (Migrate and introspective packing move
    // them regardless).
    bool defragment = true;
    // Note [Migration]: moves between devices whose providers copy into each other directly
    // (MemoryProvider::CanCopyToPeer: CPU devices, GPUs) take one peer copy; off, every move
    // goes through host memory (two copies).
    bool peer_moves = true;
    // A session that waited was admitted, or gave up (DEADLINE_EXCEEDED). Called without the
    // engine's lock, on the thread whose call caused it.
    std::function<void(SessionId, LaneId)> on_admitted;
    std::function<void(SessionId, const Status&)> on_admission_failed;
  };

  static StatusOr<std::unique_ptr<Engine>> Create(Options options);
  ~Engine();

  // true: admitted now; false: waiting for memory. RESOURCE_EXHAUSTED when it can never fit
  // (on its pinned device, or on any), ALREADY_EXISTS for a live id, INVALID_ARGUMENT for a
  // bad spec or an unknown device.
  StatusOr<bool> AddSession(SessionId id, const SessionSpec& spec) EXCLUDES(mu_);
  // Removes a session. A waiting session leaves the queue; an admitted one frees its memory
  // now, or — with an iteration in flight — when Complete() sees that iteration end.
  // Pending (not started) iterations are dropped; returns how many.
  StatusOr<int> RemoveSession(SessionId id) EXCLUDES(mu_);
  // The session wants one more iteration (requests queue up per session).
  Status RequestIteration(SessionId id) EXCLUDES(mu_);
  // Starts every iteration that can start now.
  std::vector<Dispatch> DispatchReady() EXCLUDES(mu_);
  // The same, appending to `out` (lets a caller that dispatches millions of times reuse it).
  void DispatchReady(std::vector<Dispatch>* out) EXCLUDES(mu_);
  // The iteration `d` finished now. `counted` false: it used the lane but was no iteration of
  // the job (a state-only request): neither iterations_done nor the iteration-time average
  // and remaining-time estimate see it; FAIR's lane service does.
  StatusOr<IterationRecord> Complete(const Dispatch& d, bool counted = true) EXCLUDES(mu_);
  // Times out sessions that waited too long for admission (reported via on_admission_failed).
  void ExpireWaiting() EXCLUDES(mu_);
  // Paging's copies that may start now (Note [Paging]): whoever drives the engine runs each
  // (MemoryProvider::CopyToHost / CopyToDevice) on its copy path and reports it with
  // FinishTransfer, taking `took` to copy; then dispatches again.
  std::vector<mem::Transfer> TakeTransfers() EXCLUDES(mu_);
  Status FinishTransfer(const mem::Transfer& transfer, const Status& copy, Nanos took)
      EXCLUDES(mu_);
  PagingStats Paging() const EXCLUDES(mu_);
  // Moves a session, between its iterations, to `device` (Note [Migration]): its state goes
  // out to host memory and into the target's arena, and it runs there. FAILED_PRECONDITION
  // while it waits, runs, copies or moves already, when the target cannot take it now, or
  // when the two devices' memory is not of one kind; INVALID_ARGUMENT for an unknown device.
  Status Migrate(SessionId id, size_t device) EXCLUDES(mu_);
  MigrationStats Migrations() const EXCLUDES(mu_);
  // Takes `device` out of service for good (a GPU whose context a fault corrupted, Note
  // [Devices]): no session is placed on it, moved to it or moved off it from now on, and one
  // pinned to it is refused with UNAVAILABLE naming the device and `why`, and so are those
  // already waiting for it alone (on_admission_failed). Sessions already there stay until
  // their owners close them (their iterations fail with the device's error, which the caller
  // reports). INVALID_ARGUMENT for an unknown device.
  Status SetDeviceLost(size_t device, const Status& why) EXCLUDES(mu_);
  // OK, or why `device` was lost.
  Status DeviceLost(size_t device) const EXCLUDES(mu_);
  IntrospectionStats Introspection() const EXCLUDES(mu_);

  StatusOr<SessionInfo> Session(SessionId id) const EXCLUDES(mu_);
  std::vector<SessionInfo> Sessions() const EXCLUDES(mu_);
  size_t RunningIterations() const EXCLUDES(mu_);
  // Lanes that had a runnable session at the last DispatchReady() but could not start it
  // because lanes mid-iteration occupy the memory they need (retried after each Complete).
  std::vector<LaneId> BlockedLanes() const EXCLUDES(mu_);
  // Lanes the last DispatchReady() left idle for an anticipated session, with runnable work.
  std::vector<LaneId> HeldLanes() const EXCLUDES(mu_);
  // The earliest end of a hold the last DispatchReady() made, when a paged-out session that
  // found no room may find it (Note [Paging]), or when a session waiting for a device may be
  // helped by a move (Note [Migration]): call DispatchReady() again then (a request or close
  // of the held session ends a hold sooner, and is followed by a dispatch anyway). nullopt
  // when no lane is held and nothing waits to page in or to be admitted.
  std::optional<Nanos> NextHoldDeadline() const EXCLUDES(mu_);
  HoldStats Holds() const EXCLUDES(mu_);
  const Policy& policy() const { return *policy_; }
  size_t device_count() const { return devices_.size(); }
  const std::string& device_name(size_t device) const { return devices_.at(device).name; }
  // The index of the device named `name`, or nullopt.
  std::optional<size_t> DeviceIndex(std::string_view name) const;
  // The same, or INVALID_ARGUMENT naming `name` and the devices there are.
  StatusOr<size_t> FindDevice(std::string_view name) const;
  mem::MemoryManager& memory(size_t device = 0) { return *devices_.at(device).memory; }
  const mem::MemoryManager& memory(size_t device = 0) const { return *devices_.at(device).memory; }
  const Clock& clock() const { return *clock_; }
  device::MemoryProvider& provider(size_t device = 0) const {
    return devices_.at(device).memory->provider();
  }

 private:
  static constexpr size_t kUnplaced = static_cast<size_t>(-1);
  struct SessionRec {
    SessionId id = 0;
    SessionSpec spec;
    size_t device = kUnplaced;                // kUnplaced only while it waits for any device
    std::optional<Nanos> admission_deadline;  // while it waits for any device
    SessionState state = SessionState::kWaiting;
    std::string reason;
    LaneId lane = 0;  // 0 unless admitted, running or closing
    uint64_t admit_seq = 0;
    std::vector<Nanos> requests;  // request times of pending iterations, oldest first
    size_t requests_head = 0;
    // Note [Paging]: a copy of its state is running; when it became resident; iterations
    // done then; when its last iteration ended or it last asked for one.
    bool copying = false;
    Nanos resident_since{0};
    int64_t iterations_at_resident = 0;
    Nanos last_ran{0};
    Nanos last_request{0};
    uint64_t page_outs = 0;
    uint64_t granted_ephemeral = 0;
    std::optional<size_t> migrate_to;  // Note [Migration]: its copy out is moving it there
    // Note [Migration]: a peer copy from this device is filling its block here.
    std::optional<size_t> moving_from;
    uint64_t migrations = 0;
    // Note [Introspective packing]: its iteration time with no other lane of its device
    // running (EWMA, < 0 until measured), and the sessions it has a pair record with.
    double solo_seconds = -1;
    size_t solo_samples = 0;
    // Since when it has been kept apart from a partner without starting (its turn among
    // sessions kept apart from each other: the longest waiting first).
    std::optional<Nanos> apart_since;
    std::vector<SessionId> partners;
    Nanos service{0};
    Nanos total_service{0};
    int64_t iterations_done = 0;
    double ewma_seconds = -1;  // < 0 until measured
    // Index of its view in its lane's `runnable`, or kNotRunnable.
    size_t view = kNotRunnable;
    // Note [Anticipation]: when its last iteration ended with nothing pending (the reply went
    // out and nothing came back yet); the ring of observed gaps; the window they give.
    std::optional<Nanos> idle_since;
    std::array<Nanos, kGapHistory> gaps{};
    size_t gaps_observed = 0;
    // Recomputed from `gaps` when first needed after a new gap (most sessions never idle at
    // a boundary, and sorting the gaps at every request would cost more than the decision).
    mutable Nanos hold_window{0};
    mutable bool hold_window_stale = false;
  };
  static constexpr size_t kNotRunnable = static_cast<size_t>(-1);
  struct Hold {
    SessionId session = 0;
    Nanos until{0};
    Nanos since{0};
  };
  struct LaneRec {
    size_t device = 0;
    // Note [Introspective packing]: the session of its iteration in flight, and the sessions
    // of the device's other lanes that ran at some moment of it.
    SessionId running = 0;
    std::vector<SessionId> met;
    mem::LaneClass lane_class = mem::LaneClass::kBatch;
    std::vector<SessionId> members;
    std::vector<SessionView> runnable;  // members with a pending iteration, any order
    std::vector<SessionId> idle;        // members with idle_since set (anticipation candidates)
    bool busy = false;
    bool blocked = false;      // runnable work, but its memory is held by lanes mid-iteration
    std::optional<Hold> hold;  // left idle for an anticipated session by the last decision
    bool has_run = false;
    Nanos last_end{0};
  };
  struct Notices {
    std::vector<std::pair<SessionId, LaneId>> admitted;
    std::vector<std::pair<SessionId, Status>> failed;
  };
  explicit Engine(Options options);
  bool Live(const SessionRec& s) const {
    return s.state == SessionState::kAdmitted || s.state == SessionState::kRunning;
  }
  void OnAdmittedLocked(SessionId id, size_t device, const mem::Grant& grant) REQUIRES(mu_);
  mem::MemoryManager& MemoryOf(const SessionRec& s) const { return *devices_[s.device].memory; }
  // Note [Devices]: the device where Algorithm 1 places `req` best now, or nullopt.
  std::optional<size_t> PlaceLocked(const mem::Requirement& req) const REQUIRES(mu_);
  // Admits sessions waiting for any device that some device can take now, in arrival order.
  void RetryUnplacedLocked(Notices* notices) REQUIRES(mu_);
  // Note [Migration]: the best device other than `except` that admits `req` resident now.
  std::optional<size_t> TargetLocked(const mem::Requirement& req, size_t except) const
      REQUIRES(mu_);
  // What the session holds: P and the E it was granted.
  static mem::Requirement HeldLocked(const SessionRec& s);
  Status MigrateLocked(SessionRec& s, size_t to, const std::string& why, Notices* notices)
      REQUIRES(mu_);
  // Note [Migration]: the move in one peer copy; false, with nothing changed, where the
  // target's block cannot be placed at once (the move then goes through host memory).
  StatusOr<bool> MoveByPeerLocked(SessionRec& s, size_t to, const std::string& why,
                                  Notices* notices) REQUIRES(mu_);
  // The peer copy `t` of a move ended with `copy`.
  void FinishPeerMoveLocked(const mem::Transfer& t, const Status& copy, Notices* notices)
      REQUIRES(mu_);
  void FinishMigrationLocked(SessionRec& s, Nanos now, Notices* notices) REQUIRES(mu_);
  // Note [Migration]: moves one session when that lets a waiting session in, or, when nothing
  // waits, to a device with no session from one with several (SpreadLocked).
  void DefragmentLocked(Nanos now, Notices* notices) REQUIRES(mu_);
  void SpreadLocked(Nanos now, Notices* notices) REQUIRES(mu_);
  // Note [Introspective packing].
  struct PairRec {
    enum class State : uint8_t { kMeasuring, kProbing, kKept, kApart };
    State state = State::kMeasuring;
    // Per member (first: the lower id): iteration seconds with the other running beside it
    // (EWMA), how many sessions of other lanes it met in those iterations (EWMA, >= 1), and
    // how many iterations that holds.
    std::array<double, 2> with{-1, -1}, with_k{1, 1};
    std::array<size_t, 2> with_n{0, 0};
  };
  using PairKey = std::pair<SessionId, SessionId>;  // lower id first
  static PairKey KeyOf(SessionId a, SessionId b) { return a < b ? PairKey{a, b} : PairKey{b, a}; }
  // Records that `lane` starts `session` while the device's other busy lanes run theirs.
  void NoteStartLocked(LaneId lane_id, LaneRec& lane, SessionId session) REQUIRES(mu_);
  // Whether `s` must not start on its device now: a pair of it with a running session is
  // kept apart (or probed apart), or with a runnable one that has waited for it longer.
  bool KeptApartLocked(SessionRec& s, Nanos now) REQUIRES(mu_);
  // Takes one iteration's time of `s`, which met the sessions `met` (LaneRec::met), into its
  // pairs; decides pairs that have enough of it.
  void MeasureLocked(SessionRec& s, const std::vector<SessionId>& met, double seconds,
                     Notices* notices) REQUIRES(mu_);
  void DecidePairLocked(const PairKey& key, PairRec& pair, Notices* notices) REQUIRES(mu_);
  void ForgetPairsLocked(const SessionRec& s) REQUIRES(mu_);
  void JoinLaneLocked(SessionRec& s, LaneId lane) REQUIRES(mu_);
  // Note [Paging]: pages in paged-out sessions with work, in the policy's order.
  void PageInLocked(Nanos now, Notices* notices) REQUIRES(mu_);
  void DispatchLanesLocked(Nanos now, std::vector<Dispatch>* out) REQUIRES(mu_);
  // What a paging decision sees of a session (Note [Paging]).
  SessionView PagingViewLocked(const SessionRec& s) const REQUIRES(mu_);
  std::optional<Nanos> NextCandidacyLocked(Nanos now) const REQUIRES(mu_);
  bool MayPageOutLocked(const SessionRec& v, const SessionView& in, Nanos now) const REQUIRES(mu_);
  void LeaveLaneLocked(SessionId id, LaneId lane) REQUIRES(mu_);
  Status ReleaseLocked(SessionId id, Notices* notices) REQUIRES(mu_);
  // Takes in what a memory manager call admitted or failed, to be reported by Notify.
  void ApplyEventsLocked(size_t device, mem::AdmissionEvents events, Notices* notices)
      REQUIRES(mu_);
  void Notify(const Notices& notices);
  double RemainingSecondsLocked(const SessionRec& s) const REQUIRES(mu_);
  // What a policy sees of the session now (requested_at: its oldest pending request).
  SessionView ViewLocked(const SessionRec& s) const REQUIRES(mu_);
  // Brings the session's view in its lane's `runnable` up to date (adds, refreshes or removes).
  void RefreshViewLocked(SessionRec& s) REQUIRES(mu_);
  void RemoveViewLocked(SessionRec& s, LaneRec& lane) REQUIRES(mu_);
  void StopIdlingLocked(SessionRec& s, LaneRec* lane) REQUIRES(mu_);
  // Takes a closing session out of its lane's runnable views and anticipation candidates.
  void DetachLocked(SessionRec& s) REQUIRES(mu_);
  Nanos HoldWindowLocked(const SessionRec& s) const REQUIRES(mu_);
  Nanos CurrentHoldWindowLocked(const SessionRec& s) const REQUIRES(mu_);
  bool AnticipatedLocked(const SessionRec& s, Nanos now) const REQUIRES(mu_);
  void EndHoldLocked(LaneRec& lane, SessionId next, Nanos now) REQUIRES(mu_);
  int PendingLocked(const SessionRec& s) const {
    return static_cast<int>(s.requests.size() - s.requests_head);
  }

  const Clock* clock_;
  std::unique_ptr<Policy> policy_;
  const std::vector<EngineDevice> devices_;
  double ewma_alpha_;
  std::function<void(SessionId, LaneId)> on_admitted_;
  std::function<void(SessionId, const Status&)> on_admission_failed_;

  mutable Mutex mu_;
  std::unordered_map<SessionId, SessionRec> sessions_ GUARDED_BY(mu_);
  std::map<LaneId, LaneRec> lanes_ GUARDED_BY(mu_);
  std::vector<SessionId> unplaced_ GUARDED_BY(mu_);  // waiting for any device, in order
  std::vector<Status> lost_ GUARDED_BY(mu_);         // per device: OK, or why it was lost
  uint64_t next_admit_seq_ GUARDED_BY(mu_) = 0;
  size_t running_ GUARDED_BY(mu_) = 0;
  std::vector<SessionView> anticipated_ GUARDED_BY(mu_);    // scratch of DispatchReady
  std::vector<SessionView> apart_scratch_ GUARDED_BY(mu_);  // scratch of DispatchReady
  const AnticipationOptions anticipation_;
  HoldStats holds_ GUARDED_BY(mu_);
  const bool paging_;
  const Nanos paging_quantum_, page_out_idle_;
  PagingStats paging_stats_ GUARDED_BY(mu_);
  MigrationStats migration_stats_ GUARDED_BY(mu_);
  const IntrospectionOptions introspection_;
  const bool defragment_;
  const bool peer_moves_;
  std::map<PairKey, PairRec> pairs_ GUARDED_BY(mu_);
  IntrospectionStats introspection_stats_ GUARDED_BY(mu_);
  size_t migrations_in_flight_ GUARDED_BY(mu_) = 0;
  Nanos next_defragment_ GUARDED_BY(mu_){0};  // Note [Migration]: no search before then
  // When sessions wait and no move started: the next search (NextHoldDeadline).
  std::optional<Nanos> defragment_deadline_ GUARDED_BY(mu_);
  static constexpr Nanos kMinDefragmentInterval = std::chrono::milliseconds(10);
  std::vector<SessionView> page_scratch_ GUARDED_BY(mu_);
  std::set<SessionId> paged_out_ GUARDED_BY(mu_);  // sessions in kPagedOut
  std::optional<Nanos> next_hold_deadline_ GUARDED_BY(mu_);
  std::optional<Nanos> paging_deadline_ GUARDED_BY(mu_);  // Note [Paging]: re-check then
};

}  // namespace salus::sched
