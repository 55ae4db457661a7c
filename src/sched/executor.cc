#include "sched/executor.h"

#include <fmt/format.h>

#include <set>

#include "common/logging.h"
#include "common/thread_priority.h"
#include "device/memory_provider.h"

namespace salus::sched {

StatusOr<std::unique_ptr<Executor>> Executor::Create(Engine::Options options) {
  // A session that gives up waiting for admission answers its queued iterations with the
  // reason, then the caller's callback runs.
  auto slot = std::make_shared<Executor*>(nullptr);
  auto user_failed = std::move(options.on_admission_failed);
  options.on_admission_failed = [slot, user_failed](SessionId id, const Status& status) {
    if (*slot != nullptr) (*slot)->AnswerQueued(id, status);
    if (user_failed) user_failed(id, status);
  };
  SALUS_ASSIGN_OR_RETURN(auto engine, Engine::Create(std::move(options)));
  std::unique_ptr<Executor> ex(new Executor(std::move(engine)));
  *slot = ex.get();
  return ex;
}

void Executor::AnswerQueued(SessionId id, const Status& status) {
  std::deque<Item> queued;
  {
    MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it != pending_.end()) {
      queued.swap(it->second);
      pending_.erase(it);
    }
  }
  for (Item& item : queued) {
    IterationRecord rec;
    rec.session = id;
    item.done(status, rec);
  }
}

void Executor::ExpireWaiting() {
  engine_->ExpireWaiting();
  Pump(std::nullopt);
}

Status Executor::Migrate(SessionId id, size_t device) {
  SALUS_RETURN_IF_ERROR(engine_->Migrate(id, device));
  Pump(std::nullopt);
  return OkStatus();
}

Executor::~Executor() { Shutdown(); }

StatusOr<bool> Executor::AddSession(SessionId id, const SessionSpec& spec) {
  {
    MutexLock lock(&mu_);
    if (shutting_down_) return UnavailableError("the scheduler is shutting down");
  }
  SALUS_ASSIGN_OR_RETURN(bool admitted, engine_->AddSession(id, spec));
  Pump(std::nullopt);
  return admitted;
}

Status Executor::RemoveSession(SessionId id) {
  auto dropped = engine_->RemoveSession(id);
  {
    MutexLock lock(&mu_);
    reap_pending_ = true;  // its lane may close now, or when its iteration in flight ends
  }
  AnswerQueued(id, CancelledError(fmt::format("session {} was closed", id)));
  Pump(std::nullopt);  // its memory may have admitted others
  return dropped.status();
}

Status Executor::Submit(SessionId id, Work work, Done done, bool counted) {
  {
    MutexLock lock(&mu_);
    if (shutting_down_) return UnavailableError("the scheduler is shutting down");
    auto& queue = pending_[id];
    queue.push_back(Item{std::move(work), std::move(done), counted});
    Status s = engine_->RequestIteration(id);
    if (!s.ok()) {
      queue.pop_back();
      if (queue.empty()) pending_.erase(id);
      return s;
    }
  }
  Pump(std::nullopt);
  return OkStatus();
}

void Executor::QueueTransfers() {
  std::vector<mem::Transfer> ts = engine_->TakeTransfers();
  if (ts.empty()) return;
  MutexLock lock(&copy_mu_);
  if (copy_stop_) return;  // shutting down: the memory manager frees what they held
  if (!copier_.joinable()) copier_ = std::thread([this] { CopyLoop(); });
  for (const mem::Transfer& t : ts) copies_.push_back(t);
  copy_cv_.NotifyOne();
}

void Executor::CopyLoop() {
  while (true) {
    mem::Transfer t;
    {
      MutexLock lock(&copy_mu_);
      while (copies_.empty() && !copy_stop_) copy_cv_.Wait(&copy_mu_);
      if (copies_.empty()) return;
      t = copies_.front();
      copies_.pop_front();
    }
    const Nanos start = engine_->clock().Now();
    const Status copy = RunCopy(*engine_, t);
    if (!copy.ok()) {
      logging::Get("sched")->error("session {}: paging copy failed: {}", t.session,
                                   copy.ToString());
    }
    const Status st = engine_->FinishTransfer(t, copy, engine_->clock().Now() - start);
    if (!st.ok()) {
      logging::Get("sched")->error("transfer {}: {}", t.id, st.ToString());
    }
    Pump(std::nullopt);
  }
}

std::optional<Executor::Job> Executor::Pump(std::optional<LaneId> self) {
  std::vector<Dispatch> ds = engine_->DispatchReady();
  QueueTransfers();
  if (auto hold = engine_->NextHoldDeadline()) ArmHoldTimer(*hold);
  std::optional<Job> mine;
  std::vector<Dispatch> orphans;
  {
    MutexLock lock(&mu_);
    for (Dispatch& d : ds) {
      auto pit = pending_.find(d.session);
      if (pit == pending_.end() || pit->second.empty()) {
        // The engine and the queues disagree: a broken invariant. End the iteration at once,
        // outside mu_ (Note [Lock order]: the engine's callbacks may take it).
        logging::Get("sched")->error("session {}: dispatched with no queued work", d.session);
        orphans.push_back(d);
        continue;
      }
      Job job{d, std::move(pit->second.front())};
      pit->second.pop_front();
      if (pit->second.empty()) pending_.erase(pit);
      if (self && d.lane == *self && !mine) {
        mine = std::move(job);
        continue;
      }
      auto& slot = workers_[d.lane];
      if (!slot) {
        slot = std::make_unique<Worker>();
        slot->lane_class = d.lane_class;
        Worker* w = slot.get();
        const LaneId lane = d.lane;
        w->thread = std::thread([this, lane, w] { WorkerLoop(lane, w); });
      }
      {
        MutexLock wl(&slot->mu);
        slot->job = std::move(job);
      }
      slot->cv.NotifyOne();
    }
    ReapWorkersLocked();
  }
  for (const Dispatch& d : orphans) engine_->Complete(d).status().IgnoreError();
  return mine;
}

void Executor::RunJob(Job job) {
  std::optional<LaneId> lane = job.dispatch.lane;
  std::optional<Job> next = std::move(job);
  while (next) {
    Job j = std::move(*next);
    next.reset();
    // The iteration starts now, on its worker: whatever passed since the engine dispatched it
    // (a hand-off, a new worker thread) is part of the switch gap, not of its run time.
    const Nanos start = engine_->clock().Now();
    if (!j.dispatch.lane_first) j.dispatch.switch_gap += start - j.dispatch.started_at;
    j.dispatch.started_at = start;
    Status status = j.item.work(j.dispatch);
    auto rec = engine_->Complete(j.dispatch, j.item.counted);
    if (!rec.ok()) {
      logging::Get("sched")->error("session {}: completing an iteration: {}", j.dispatch.session,
                                   rec.status().ToString());
      if (status.ok()) status = rec.status();
    }
    j.item.done(status, rec.ok() ? *rec : IterationRecord{});
    {
      MutexLock lock(&mu_);
      idle_cv_.NotifyAll();
    }
    next = Pump(lane);
  }
}

void Executor::WorkerLoop(LaneId lane, Worker* w) {
  if (w->lane_class == mem::LaneClass::kInteractive) {
    // Before the first kernel, so that threads the kernels start inherit it.
    auto nice = SetCurrentThreadNice(kInteractiveNice);
    logging::Event("sched", "worker_priority",
                   {{"lane", lane},
                    {"class", "interactive"},
                    {"nice", nice.ok() ? *nice : 0},
                    {"raised", nice.ok() && *nice < 0}});
  }
  while (true) {
    std::optional<Job> job;
    {
      MutexLock lock(&w->mu);
      w->busy = false;
      while (!w->job && !w->stop) w->cv.Wait(&w->mu);
      if (!w->job) return;  // stop
      job = std::move(w->job);
      w->job.reset();
      w->busy = true;
    }
    RunJob(std::move(*job));
  }
}

void Executor::ReapWorkersLocked() {
  if (!reap_pending_) return;
  std::set<LaneId> live;
  for (const mem::LaneInfo& l : engine_->memory().Lanes()) live.insert(l.id);
  bool dead_lane_busy = false;  // its worker still runs the lane's last iteration
  for (auto it = workers_.begin(); it != workers_.end();) {
    Worker* w = it->second.get();
    if (live.count(it->first) != 0) {
      ++it;
      continue;
    }
    bool idle = false;
    {
      MutexLock wl(&w->mu);
      idle = !w->busy && !w->job;
      if (idle) w->stop = true;
    }
    if (!idle) {
      dead_lane_busy = true;
      ++it;
      continue;
    }
    // An idle worker waits on its own condition variable and exits without taking mu_, so
    // joining it here cannot deadlock.
    w->cv.NotifyOne();
    w->thread.join();
    it = workers_.erase(it);
  }
  reap_pending_ = dead_lane_busy;
}

void Executor::ArmHoldTimer(Nanos deadline) {
  MutexLock lock(&timer_mu_);
  if (timer_stop_) return;
  if (!timer_.joinable()) timer_ = std::thread([this] { TimerLoop(); });
  if (!timer_deadline_ || deadline < *timer_deadline_) {
    timer_deadline_ = deadline;
    timer_cv_.NotifyOne();
  }
}

void Executor::TimerLoop() {
  while (true) {
    {
      MutexLock lock(&timer_mu_);
      while (true) {
        if (timer_stop_) return;
        if (!timer_deadline_) {
          timer_cv_.Wait(&timer_mu_);
          continue;
        }
        const Nanos now = engine_->clock().Now();
        if (now >= *timer_deadline_) break;
        timer_cv_.WaitFor(&timer_mu_, *timer_deadline_ - now);
      }
      timer_deadline_.reset();
    }
    Pump(std::nullopt);  // re-arms the timer if a lane is still held, for a later deadline
  }
}

void Executor::Shutdown() {
  {
    MutexLock lock(&timer_mu_);
    timer_stop_ = true;
    timer_cv_.NotifyOne();
  }
  if (timer_.joinable() && timer_.get_id() != std::this_thread::get_id()) timer_.join();
  std::vector<SessionId> ids;
  {
    MutexLock lock(&mu_);
    if (shutting_down_ && workers_.empty()) return;
    shutting_down_ = true;
  }
  for (const SessionInfo& s : engine_->Sessions()) ids.push_back(s.id);
  for (SessionId id : ids) {
    engine_->RemoveSession(id).status().IgnoreError();  // gone already is fine
    AnswerQueued(id, UnavailableError("the scheduler is shutting down"));
  }
  std::map<LaneId, std::unique_ptr<Worker>> workers;
  {
    MutexLock lock(&mu_);
    while (engine_->RunningIterations() > 0) idle_cv_.Wait(&mu_);
    workers.swap(workers_);
  }
  {
    MutexLock lock(&copy_mu_);
    copy_stop_ = true;  // copies queued still run: each ends what its range is held for
    copy_cv_.NotifyOne();
  }
  if (copier_.joinable()) copier_.join();
  for (auto& [lane, w] : workers) {
    {
      MutexLock wl(&w->mu);
      w->stop = true;
    }
    w->cv.NotifyOne();
  }
  for (auto& [lane, w] : workers) w->thread.join();
}

size_t Executor::WorkerCount() const {
  MutexLock lock(&mu_);
  return workers_.size();
}

}  // namespace salus::sched
