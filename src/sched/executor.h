// Executor: drives an Engine with real threads, for the daemon.
//
// Each lane has one worker thread (created when the lane first runs, joined when the lane is
// gone), so at most one iteration runs per lane and lanes run in parallel. Callers Submit()
// an iteration as a callable; it runs on the lane's worker when the policy picks its session.
// Note [Inline dispatch]: when an iteration ends, the worker that ran it completes it in the
// engine and asks for the next dispatch itself; a dispatch for its own lane it runs at once,
// on the same thread, so the switch between two sessions of a lane costs one scheduling
// decision and no thread hand-off. Nothing sleeps or polls: workers wait on condition
// variables and every event (submit, completion, admission, removal) pumps the engine; a
// lane the policy holds for an anticipated session (Note [Anticipation]) is pumped again by a
// timer thread at the hold's end, if nothing else pumped it first. Paging's copies (Note
// [Paging] in engine.cc) run on one copy thread, in the order the engine hands them out,
// overlapped with the lanes' iterations; each finished copy pumps the engine.
//
// Note [Lock order]: a thread that holds more than one lock took them in this order:
//   Executor::mu_ -> Engine::mu_ -> a MemoryManager's mu_ -> the provider's own (host pool);
//   Executor::mu_ -> Worker::mu.
// Executor::copy_mu_ and timer_mu_ are leaves: nothing is taken under them. The engine calls
// its memory managers only under its own lock, and they call nobody back (they return their
// admission events). The engine's callbacks (on_admitted, on_admission_failed) run with no
// engine lock held and may take Executor::mu_ (answering queued work) and the server's
// SessionManager::mu_, so no engine call that can report admissions (AddSession,
// RemoveSession, Complete, DispatchReady, ExpireWaiting, FinishTransfer, Migrate) is made
// under Executor::mu_; RequestIteration, which reports nothing, is. The server's
// SessionManager::mu_ is never held across a call into the executor.
// Workers of interactive lanes run at a higher OS priority (kInteractiveNice) where the
// process may raise it, at the default otherwise; the code path is the same.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/thread_annotations.h"
#include "sched/engine.h"

namespace salus::sched {

class Executor {
 public:
  // Runs one iteration; its status is handed to Done.
  using Work = std::function<Status(const Dispatch&)>;
  // Called exactly once per Submit: after the work ran (with its status and record), or with
  // CANCELLED (session removed) or UNAVAILABLE (shutdown) if it never ran.
  using Done = std::function<void(const Status&, const IterationRecord&)>;

  static StatusOr<std::unique_ptr<Executor>> Create(Engine::Options options);
  ~Executor();

  StatusOr<bool> AddSession(SessionId id, const SessionSpec& spec) EXCLUDES(mu_);
  // Removes the session: queued iterations are answered CANCELLED; one in flight finishes
  // normally and the session's memory returns after it.
  Status RemoveSession(SessionId id) EXCLUDES(mu_);
  // `counted` false: the work is not an iteration of the job (see Engine::Complete), though
  // it is queued, scheduled and run like one.
  Status Submit(SessionId id, Work work, Done done, bool counted = true) EXCLUDES(mu_);
  // Stops accepting work, answers queued iterations UNAVAILABLE, removes every session,
  // waits for iterations in flight to end and joins the workers. Idempotent.
  void Shutdown() EXCLUDES(mu_);
  // Times out sessions that waited too long for admission; their queued iterations are
  // answered DEADLINE_EXCEEDED.
  void ExpireWaiting() EXCLUDES(mu_);
  // Moves a session to another device between its iterations (Engine::Migrate), and starts
  // the copies.
  Status Migrate(SessionId id, size_t device) EXCLUDES(mu_);

  Engine& engine() { return *engine_; }
  size_t WorkerCount() const EXCLUDES(mu_);

 private:
  struct Item {
    Work work;
    Done done;
    bool counted = true;
  };
  struct Job {
    Dispatch dispatch;
    Item item;
  };
  struct Worker {
    std::thread thread;
    mem::LaneClass lane_class = mem::LaneClass::kBatch;
    Mutex mu;
    CondVar cv;
    std::optional<Job> job GUARDED_BY(mu);
    bool busy GUARDED_BY(mu) = false;
    bool stop GUARDED_BY(mu) = false;
  };

  explicit Executor(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}
  // Starts what the engine can dispatch; returns the dispatch for `self` (run it inline).
  std::optional<Job> Pump(std::optional<LaneId> self) EXCLUDES(mu_);
  void WorkerLoop(LaneId lane, Worker* w);
  // Makes the timer thread pump the engine at `deadline` (the earliest asked for wins).
  void ArmHoldTimer(Nanos deadline) EXCLUDES(timer_mu_);
  void TimerLoop() EXCLUDES(timer_mu_);
  void RunJob(Job job);
  void ReapWorkersLocked() REQUIRES(mu_);
  // Answers every queued (not started) iteration of the session with `status`.
  void AnswerQueued(SessionId id, const Status& status) EXCLUDES(mu_);

  std::unique_ptr<Engine> engine_;
  mutable Mutex mu_;
  CondVar idle_cv_;  // signalled when an iteration ends (for Shutdown)
  bool shutting_down_ GUARDED_BY(mu_) = false;
  std::unordered_map<SessionId, std::deque<Item>> pending_ GUARDED_BY(mu_);
  std::map<LaneId, std::unique_ptr<Worker>> workers_ GUARDED_BY(mu_);
  // A session left since the last reap that found every worker's lane alive: only then can a
  // lane have closed, so only then does Pump look for workers to join.
  bool reap_pending_ GUARDED_BY(mu_) = false;

  void CopyLoop() EXCLUDES(copy_mu_);
  // Hands the engine's ready copies to the copy thread (started at the first).
  void QueueTransfers() EXCLUDES(copy_mu_);

  // The copy thread. A leaf lock.
  Mutex copy_mu_;
  CondVar copy_cv_;
  std::thread copier_;
  std::deque<mem::Transfer> copies_ GUARDED_BY(copy_mu_);
  bool copy_stop_ GUARDED_BY(copy_mu_) = false;

  // The hold timer (started at the first hold). A leaf lock: nothing else is taken under it.
  Mutex timer_mu_;
  CondVar timer_cv_;
  std::thread timer_;
  std::optional<Nanos> timer_deadline_ GUARDED_BY(timer_mu_);
  bool timer_stop_ GUARDED_BY(timer_mu_) = false;
};

}  // namespace salus::sched
