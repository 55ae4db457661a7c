// The simulator's event loop. Time is a double in seconds; the engine's ManualClock follows
// it in nanoseconds. Each step moves to the earliest next event (an arrival, an iteration's
// completion, a client's request, a hold or paging deadline, the end of a copy), advances
// every running iteration by the elapsed time × its speed, and applies the events at that
// time in a fixed order (requests, completions by lane id, copies in the order they ran, then
// arrivals in trace order), so a trace and seed always give the same result.
//
// Note [Simulated paging]
// With overcommit > 1 the engine admits sessions beyond what fits resident and pages their
// persistent blocks between the arena and host memory (Note [Paging] in sched/engine.cc): it
// decides what to page and when, as in the daemon. The simulator models only the copies'
// time. After every dispatch it takes the engine's ready transfers and queues them, in the
// order handed out, on one copy path (a FIFO bus): a copy starts when the previous one ends,
// or at once when the path is idle, and takes bytes / host_bandwidth. When it ends the
// simulator reports it (FinishTransfer, `took` = that duration) and dispatches again. Copies
// overlap iterations and do not slow them (copy engines run beside the compute units); a
// session paging in becomes runnable only when its copy ends, and a session admitted paged
// out has nothing to copy in. The fake provider's host memory and copies are no-ops, so only
// the modelled time matters. With overcommit 1 there is nothing to copy and the replay is the
// one without paging, step for step.
//
// Note [Simulated swapping]
// The daemon's swap planner (exec/swap_planner.h) needs a compiled model; a trace row has only
// P, E and an iteration time T. So the simulator offers each training job a family of points
// from one assumption: up to `swap_fraction` of E consists of activations that wait between
// their forward and backward uses and can sit in host memory meanwhile. Point k of n swaps
// X = E * swap_fraction * k / (n - 1) bytes: its lane is E - X, its copies move 2X bytes, out
// and back, taking c = 2X / host_bandwidth on the path, and hide behind compute for up to
// swap_overlap * T (the window between an activation's last forward and first backward use);
// what does not hide stalls compute, so the point takes T + max(0, c - swap_overlap * T) alone.
// Points that do not lower E are dropped. The job asks for E with the others as smaller lanes
// (mem::Requirement::smaller_ephemeral), admission grants the first that fits, and each unit
// runs at the fastest point whose E fits the lane it was dispatched into, as the daemon's
// ModelRuntime picks one.
//
// The jobs share one copy path: a swapping unit keeps the path busy for the share c / (its
// time alone) of its run. While the shares of the running units, plus one while a paging copy
// runs, sum to L > 1, every swapping unit progresses at 1 / L (and never faster than compute
// contention allows): the path is the bottleneck. Paging copies keep their full bandwidth (the
// engine pages between iterations, and a session waits for its copy in). With swap_fraction 0
// and no row asking for swapping, the replay is the one without swapping, step for step.
//
// Note [Simulated devices]
// With `devices` > 1 the engine schedules that many devices of `capacity` each (one fake
// provider each), placing, pinning (a trace row's `device`), moving (Note [Migration] in
// sched/engine.cc) and unpacking (Note [Introspective packing]) jobs as in the daemon. Each
// device has its own compute and its own copy path: the compute model above applies per
// device (the utilization of the iterations running on it), and a device's paging and swap
// copies queue on its own path; a move is one peer copy on the source's path (fake devices
// copy into each other as GPUs do), or, through host memory, a copy out on the source's path
// and a copy in on the target's. `interference` slows each iteration by a further factor of
// 1 + interference × (k − 1) while k run on its device, the cache and bandwidth contention
// that makes packed compute-bound jobs lose on real devices and that introspective packing
// detects. With one device and no interference the replay is the one before devices existed.
#include "tools/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <random>

#include "common/clock.h"
#include "device/memory_provider.h"
#include "sched/engine.h"

namespace salus::tools {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Work below this many seconds counts as done (absorbs rounding of repeated subtraction).
constexpr double kWorkEpsilonS = 1e-9;
// Consecutive steps at which only a hold or paging deadline passed, with nothing running,
// copying or due, before the replay counts as stalled (a retry every 50 ms for over an hour).
constexpr uint64_t kMaxIdleSteps = 100000;

// A transfer on the copy path (Note [Simulated paging]).
struct QueuedCopy {
  mem::Transfer transfer;
  double took_s = 0;
  double end_s = 0;
};

struct Running {
  sched::Dispatch dispatch;
  size_t job = 0;
  double work_left_s = 0;  // at speed 1
  double path_share = 0;   // its swap point's (Note [Simulated swapping]); 0: not swapping
};

struct JobState {
  int64_t units = 0;     // scheduling units in the job
  int64_t per_unit = 1;  // iterations per unit
  double unit_s = 0;     // seconds per unit at speed 1, unswapped
  std::vector<SimSwapPoint> points;
};

// The fastest of `points` whose lane fits in `lane_bytes`; the last when none does.
const SimSwapPoint& PointFor(const std::vector<SimSwapPoint>& points, uint64_t lane_bytes) {
  for (const SimSwapPoint& p : points) {
    if (p.ephemeral_bytes <= lane_bytes) return p;
  }
  return points.back();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Nearest-rank percentile.
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

}  // namespace

std::vector<SimSwapPoint> SwapPoints(const TraceJob& job, const SimOptions& options) {
  std::vector<SimSwapPoint> points = {SimSwapPoint{job.ephemeral_bytes, 0, 1, 0}};
  const double fraction = job.training ? job.swap_fraction.value_or(options.swap_fraction) : 0;
  if (fraction <= 0 || options.swap_points < 2) return points;
  const double e = static_cast<double>(job.ephemeral_bytes);
  for (int k = 1; k < options.swap_points; ++k) {
    const double x = std::floor(e * fraction * k / (options.swap_points - 1));
    if (x < 1 || job.ephemeral_bytes - static_cast<uint64_t>(x) >= points.back().ephemeral_bytes) {
      continue;
    }
    const double copy_s = 2 * x / options.host_bandwidth;
    const double alone_s =
        job.iteration_s + std::max(0.0, copy_s - options.swap_overlap * job.iteration_s);
    points.push_back(SimSwapPoint{job.ephemeral_bytes - static_cast<uint64_t>(x),
                                  2 * static_cast<uint64_t>(x), alone_s / job.iteration_s,
                                  copy_s / alone_s});
  }
  return points;
}

nlohmann::json JobResultJson(const SimJobResult& r) {
  nlohmann::json j;
  j["job_id"] = r.job->job_id;
  j["workload"] = r.job->workload;
  j["submit_s"] = r.job->submit_s;
  if (r.refused) {
    j["status"] = "refused";
    j["reason"] = r.reason;
    return j;
  }
  j["status"] = "finished";
  j["admitted_s"] = r.admitted_s;
  j["first_start_s"] = r.first_start_s;
  j["finish_s"] = r.finish_s;
  j["jct_s"] = r.finish_s - r.job->submit_s;
  j["queuing_s"] = r.first_start_s - r.job->submit_s;
  j["lane"] = r.lane;
  if (r.page_outs) j["page_outs"] = *r.page_outs;
  if (r.swapped_units) j["swapped_units"] = *r.swapped_units;
  if (r.device) j["device"] = *r.device;
  if (r.migrations) j["migrations"] = *r.migrations;
  return j;
}

StatusOr<SimResult> Simulate(const std::vector<TraceJob>& jobs, const SimOptions& options,
                             device::MemoryProvider* provider) {
  if (options.jitter < 0 || options.jitter >= 1) {
    return InvalidArgumentError(fmt::format("jitter must be in [0, 1), got {}", options.jitter));
  }
  if (options.quantum_s < 0) {
    return InvalidArgumentError(fmt::format("quantum must be >= 0, got {}", options.quantum_s));
  }
  if (!(options.turnaround_s >= 0)) {
    return InvalidArgumentError(
        fmt::format("turnaround must be >= 0, got {}", options.turnaround_s));
  }
  if (!(options.overcommit >= 1) || std::isinf(options.overcommit)) {
    return InvalidArgumentError(
        fmt::format("overcommit must be a finite number >= 1, got {}", options.overcommit));
  }
  if (!(options.host_bandwidth > 0) || std::isinf(options.host_bandwidth)) {
    return InvalidArgumentError(
        fmt::format("host bandwidth must be > 0 bytes/s, got {}", options.host_bandwidth));
  }
  if (!(options.paging_quantum_ms >= 0) || std::isinf(options.paging_quantum_ms)) {
    return InvalidArgumentError(
        fmt::format("paging quantum must be >= 0 ms, got {}", options.paging_quantum_ms));
  }
  if (!(options.swap_fraction >= 0 && options.swap_fraction < 1)) {
    return InvalidArgumentError(
        fmt::format("swap fraction must be in [0, 1), got {}", options.swap_fraction));
  }
  if (options.swap_points < 2) {
    return InvalidArgumentError(
        fmt::format("swap points must be at least 2, got {}", options.swap_points));
  }
  if (!(options.swap_overlap >= 0 && options.swap_overlap <= 1)) {
    return InvalidArgumentError(
        fmt::format("swap overlap must be in [0, 1], got {}", options.swap_overlap));
  }
  if (options.devices < 1 || options.devices > 1024) {
    return InvalidArgumentError(
        fmt::format("devices must be in [1, 1024], got {}", options.devices));
  }
  if (!(options.interference >= 0) || std::isinf(options.interference)) {
    return InvalidArgumentError(
        fmt::format("interference must be a finite number >= 0, got {}", options.interference));
  }
  const bool paging = options.overcommit > 1;
  const size_t n_devices = static_cast<size_t>(options.devices);
  const bool multi = n_devices > 1;
  // Copies: paging's, and with several devices the moves' (Note [Simulated devices]).
  const bool copies = paging || multi;
  // Swapping is modelled when any job offers a swap point (Note [Simulated swapping]).
  const bool swapping = std::any_of(jobs.begin(), jobs.end(), [&](const TraceJob& j) {
    return SwapPoints(j, options).size() > 1;
  });
  SALUS_ASSIGN_OR_RETURN(auto policy, sched::CreatePolicy(options.policy, options.policy_options));

  ManualClock clock;
  SimResult result;
  result.jobs.resize(jobs.size());
  std::vector<JobState> state(jobs.size());
  std::vector<size_t> ready_to_request;  // jobs admitted from the queue, to start requesting
  // Lanes and committed memory change only on arrivals, admissions and departures; the
  // series and the safety check are sampled then, not after every iteration.
  bool memory_changed = true;
  // Session ids are trace positions + 1.
  auto job_of = [](mem::SessionId id) { return static_cast<size_t>(id - 1); };
  double now = 0;

  sched::Engine::Options eo;
  eo.clock = &clock;
  std::vector<std::unique_ptr<device::MemoryProvider>> more_providers;
  std::vector<sched::DeviceSpec> specs;
  for (size_t d = 0; d < n_devices; ++d) {
    device::MemoryProvider* p = provider;
    if (d > 0) {
      SALUS_ASSIGN_OR_RETURN(auto extra, device::CreateMemoryProvider("fake"));
      p = extra.get();
      more_providers.push_back(std::move(extra));
    }
    specs.push_back({fmt::format("sim:{}", d), p, options.capacity, options.overcommit});
  }
  SALUS_ASSIGN_OR_RETURN(eo.devices, sched::MakeDevices(*policy, &clock, specs));
  eo.defragment = options.defragment;
  eo.policy = std::move(policy);
  eo.paging_quantum = FromSeconds(options.paging_quantum_ms / 1000);
  eo.on_admitted = [&](mem::SessionId id, mem::LaneId lane) {
    const size_t j = job_of(id);
    result.jobs[j].admitted_s = now;
    result.jobs[j].lane = lane;
    ready_to_request.push_back(j);
    memory_changed = true;
  };
  eo.on_admission_failed = [&](mem::SessionId id, const Status& s) {
    const size_t j = job_of(id);
    result.jobs[j].refused = true;
    result.jobs[j].reason = s.ToString();
  };
  SALUS_ASSIGN_OR_RETURN(auto engine, sched::Engine::Create(std::move(eo)));

  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> jitter(1 - options.jitter, 1 + options.jitter);

  // Arrivals in time order, trace order within a time.
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs[a].submit_s < jobs[b].submit_s; });
  size_t next_arrival = 0;

  std::map<mem::LaneId, Running> running;
  // Clients' next requests, (time, job), earliest first.
  std::priority_queue<std::pair<double, size_t>, std::vector<std::pair<double, size_t>>,
                      std::greater<>>
      requests;
  nlohmann::json t_series = nlohmann::json::array(), lanes_series = nlohmann::json::array(),
                 mem_series = nlohmann::json::array();
  // The copy paths, one per device (Note [Simulated paging]): copies queued in order, the
  // first one running.
  std::vector<std::deque<QueuedCopy>> bus(n_devices);
  std::vector<double> bus_free_s(n_devices, 0.0);  // when the last queued copy ends
  result.device_busy_s.assign(n_devices, 0.0);
  uint64_t paging_events = 0;  // page-ins + page-outs at the last look
  uint64_t idle_steps = 0;
  size_t max_lanes = 0;
  size_t last_lanes = SIZE_MAX;
  uint64_t last_mem = UINT64_MAX;

  auto sample = [&] {
    if (!memory_changed) return;
    memory_changed = false;
    size_t lanes = 0;
    uint64_t committed = 0;
    for (size_t d = 0; d < n_devices; ++d) {
      const uint64_t c = engine->memory(d).CommittedBytes();
      if (c > options.capacity) ++result.safety_violations;
      lanes += engine->memory(d).Lanes().size();
      committed += c;
    }
    max_lanes = std::max(max_lanes, lanes);
    if (lanes != last_lanes || committed != last_mem) {
      t_series.push_back(now);
      lanes_series.push_back(lanes);
      mem_series.push_back(committed);
      last_lanes = lanes;
      last_mem = committed;
    }
  };

  // Queues the engine's ready copies on the copy path; notes paging for the memory series.
  auto take_transfers = [&] {
    for (mem::Transfer& t : engine->TakeTransfers()) {
      const double took = static_cast<double>(t.bytes) / options.host_bandwidth;
      double& free_s = bus_free_s[t.device_index];
      free_s = std::max(free_s, now) + took;
      bus[t.device_index].push_back(QueuedCopy{std::move(t), took, free_s});
    }
    const sched::PagingStats ps = engine->Paging();
    if (ps.page_ins + ps.page_outs != paging_events) {
      paging_events = ps.page_ins + ps.page_outs;
      memory_changed = true;
    }
  };

  auto request_all_ready = [&]() -> Status {
    for (size_t j : ready_to_request) {
      if (state[j].units > 0) SALUS_RETURN_IF_ERROR(engine->RequestIteration(j + 1));
    }
    ready_to_request.clear();
    return OkStatus();
  };

  std::vector<sched::Dispatch> dispatched;
  while (true) {
    // Start whatever can start now.
    SALUS_RETURN_IF_ERROR(request_all_ready());
    dispatched.clear();
    engine->DispatchReady(&dispatched);
    for (const sched::Dispatch& d : dispatched) {
      const size_t j = job_of(d.session);
      if (result.jobs[j].first_start_s < 0) result.jobs[j].first_start_s = now;
      if (result.jobs[j].lane == 0) result.jobs[j].lane = d.lane;  // admitted paged out
      if (multi) result.jobs[j].device = d.device;
      const SimSwapPoint& point = PointFor(state[j].points, d.lane_memory.size);
      double work = state[j].unit_s * point.time_factor;
      if (options.jitter > 0) work *= jitter(rng);
      if (point.copied_bytes > 0) {
        SimJobResult& jr = result.jobs[j];
        jr.swapped_units = jr.swapped_units.value_or(0) + 1;
        ++result.swapping.units;
        result.swapping.copied_bytes += point.copied_bytes * state[j].per_unit;
      }
      running.emplace(d.lane, Running{d, j, work, point.path_share});
    }
    if (copies) take_transfers();
    sample();

    // Per device: compute contention (and interference) slows every unit; copy path
    // contention the swapping ones.
    std::vector<double> util(n_devices, 0.0), path_load(n_devices, 0.0);
    std::vector<int> on_device(n_devices, 0);
    for (size_t d = 0; d < n_devices; ++d) path_load[d] = bus[d].empty() ? 0 : 1;
    for (const auto& [lane, r] : running) {
      util[r.dispatch.device] += jobs[r.job].utilization;
      path_load[r.dispatch.device] += r.path_share;
      on_device[r.dispatch.device]++;
    }
    auto speed_of = [&](const Running& r) {
      const size_t d = r.dispatch.device;
      double speed = util[d] > 1 ? 1.0 / util[d] : 1.0;
      if (options.interference > 0 && on_device[d] > 1) {
        speed /= 1 + options.interference * (on_device[d] - 1);
      }
      if (r.path_share > 0 && path_load[d] > 1) speed = std::min(speed, 1.0 / path_load[d]);
      return speed;
    };
    double t_done = kInf;
    for (const auto& [lane, r] : running) {
      t_done = std::min(t_done, now + r.work_left_s / speed_of(r));
    }
    const double t_arrival =
        next_arrival < order.size() ? jobs[order[next_arrival]].submit_s : kInf;
    const double t_request = requests.empty() ? kInf : requests.top().first;
    // A held lane is decided again when its hold ends (Note [Anticipation]).
    const std::optional<Nanos> hold = engine->NextHoldDeadline();
    const double t_hold = hold ? ToSeconds(*hold) : kInf;
    double t_copy = kInf;
    for (const std::deque<QueuedCopy>& b : bus) {
      if (!b.empty()) t_copy = std::min(t_copy, b.front().end_s);
    }
    if (t_done == kInf && t_arrival == kInf && t_request == kInf && t_hold == kInf &&
        t_copy == kInf) {
      break;
    }

    const double t = std::min({t_done, t_arrival, t_request, t_hold, t_copy});
    if (running.empty() && t_copy == kInf && t_arrival == kInf && t_request == kInf) {
      if (++idle_steps > kMaxIdleSteps) {
        return InternalError(
            fmt::format("simulation stalled at {} s: only hold or paging deadlines for {} steps",
                        now, kMaxIdleSteps));
      }
    } else {
      idle_steps = 0;
    }
    for (auto& [lane, r] : running) r.work_left_s -= (t - now) * speed_of(r);
    for (size_t d = 0; d < n_devices; ++d) {
      if (on_device[d] > 0) result.device_busy_s[d] += t - now;
    }
    now = t;
    clock.Set(FromSeconds(now));
    // Seconds round-trip to nanoseconds inexactly: never stop short of the hold's end.
    if (hold && t == t_hold) clock.Set(*hold);

    // Clients' requests due by t.
    while (!requests.empty() && requests.top().first <= now) {
      const size_t j = requests.top().second;
      requests.pop();
      SALUS_RETURN_IF_ERROR(engine->RequestIteration(j + 1));
    }

    // Completions at t, in lane order.
    for (auto it = running.begin(); it != running.end();) {
      if (it->second.work_left_s > kWorkEpsilonS) {
        ++it;
        continue;
      }
      const Running r = it->second;
      it = running.erase(it);
      SALUS_RETURN_IF_ERROR(engine->Complete(r.dispatch).status());
      ++result.iterations;
      SimJobResult& jr = result.jobs[r.job];
      if (++jr.units_done >= state[r.job].units) {
        jr.finish_s = now;
        if (paging || multi) {
          SALUS_ASSIGN_OR_RETURN(const sched::SessionInfo info,
                                 engine->Session(r.dispatch.session));
          if (paging) jr.page_outs = info.page_outs;
          if (multi) jr.migrations = info.migrations;
        }
        SALUS_RETURN_IF_ERROR(engine->RemoveSession(r.dispatch.session).status());
        memory_changed = true;
      } else if (const double turnaround = jobs[r.job].turnaround_s.value_or(options.turnaround_s);
                 turnaround > 0) {
        requests.emplace(now + turnaround, r.job);
      } else {
        SALUS_RETURN_IF_ERROR(engine->RequestIteration(r.dispatch.session));
      }
    }

    // Copies that end by t, in the order they ran, device by device.
    for (std::deque<QueuedCopy>& b : bus) {
      while (!b.empty() && b.front().end_s <= now) {
        const QueuedCopy c = std::move(b.front());
        b.pop_front();
        result.paging.busy_s += c.took_s;
        SALUS_RETURN_IF_ERROR(
            engine->FinishTransfer(c.transfer, OkStatus(), FromSeconds(c.took_s)));
        memory_changed = true;
      }
    }

    // Arrivals at t.
    while (next_arrival < order.size() && jobs[order[next_arrival]].submit_s <= now) {
      const size_t j = order[next_arrival++];
      const TraceJob& job = jobs[j];
      memory_changed = true;
      SimJobResult& jr = result.jobs[j];
      jr.job = &job;
      JobState& js = state[j];
      js.per_unit =
          options.quantum_s > 0
              ? std::max<int64_t>(1, static_cast<int64_t>(options.quantum_s / job.iteration_s))
              : 1;
      js.units = (job.iterations + js.per_unit - 1) / js.per_unit;
      js.unit_s =
          job.iteration_s * static_cast<double>(job.iterations) / static_cast<double>(js.units);
      js.points = SwapPoints(job, options);
      if (swapping) jr.swapped_units = 0;
      const mem::SessionId id = j + 1;
      sched::SessionSpec spec;
      spec.requirement = {job.persistent_bytes, job.ephemeral_bytes};
      for (size_t k = 1; k < js.points.size(); ++k) {
        spec.requirement.smaller_ephemeral.push_back(js.points[k].ephemeral_bytes);
      }
      spec.priority = job.priority;
      if (job.device) spec.device = static_cast<size_t>(*job.device);
      spec.declared_iterations = js.units;
      spec.iteration_time_hint = FromSeconds(js.unit_s);
      auto admitted = engine->AddSession(id, spec);
      if (!admitted.ok()) {
        jr.refused = true;
        jr.reason = admitted.status().ToString();
        continue;
      }
      if (*admitted) {
        auto info = engine->Session(id);
        jr.admitted_s = now;
        jr.lane = info.ok() ? info->lane : 0;
        ready_to_request.push_back(j);
      }
    }
  }
  for (size_t j = 0; j < jobs.size(); ++j) result.jobs[j].job = &jobs[j];

  // A job neither refused nor finished means the replay stalled: a bug, never silent.
  for (const SimJobResult& r : result.jobs) {
    if (!r.refused && r.finish_s < 0) {
      return InternalError(fmt::format("simulation stalled: job '{}' (line {}) never finished",
                                       r.job->job_id, r.job->line));
    }
  }

  std::vector<double> jcts, queuing;
  double first_submit = kInf, last_finish = 0;
  size_t refused = 0;
  for (const SimJobResult& r : result.jobs) {
    if (r.refused) {
      ++refused;
      continue;
    }
    jcts.push_back(r.finish_s - r.job->submit_s);
    queuing.push_back(r.first_start_s - r.job->submit_s);
    first_submit = std::min(first_submit, r.job->submit_s);
    last_finish = std::max(last_finish, r.finish_s);
  }
  auto mean = [](const std::vector<double>& v) {
    return v.empty() ? 0.0
                     : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  };
  nlohmann::json& s = result.summary;
  s["policy"] = options.policy;
  s["capacity_bytes"] = options.capacity;
  s["seed"] = options.seed;
  s["jobs"] = jobs.size();
  s["finished"] = jcts.size();
  s["refused"] = refused;
  s["makespan_s"] = jcts.empty() ? 0.0 : last_finish - first_submit;
  s["avg_jct_s"] = mean(jcts);
  s["p95_jct_s"] = Percentile(jcts, 0.95);
  s["avg_queuing_s"] = mean(queuing);
  s["max_lanes"] = max_lanes;
  s["safety_violations"] = result.safety_violations;
  s["scheduling_units"] = result.iterations;
  const sched::HoldStats holds = engine->Holds();
  s["holds"] = {{"started", holds.started},
                {"returned", holds.returned},
                {"expired", holds.expired},
                {"idle_s", ToSeconds(holds.idle)}};
  s["series"] = {{"t_s", t_series}, {"lanes", lanes_series}, {"memory_bytes", mem_series}};
  const sched::PagingStats ps = engine->Paging();
  result.paging.page_ins = ps.page_ins;
  result.paging.page_outs = ps.page_outs;
  result.paging.copies = ps.copies;
  result.paging.copied_bytes = ps.copied_bytes;
  for (const SimJobResult& r : result.jobs) {
    if (r.swapped_units.value_or(0) > 0) ++result.swapping.jobs;
  }
  if (multi) {  // absent with one device, as swapping's and paging's below
    const double makespan = s["makespan_s"].get<double>();
    nlohmann::json utilization = nlohmann::json::array();
    for (const double busy : result.device_busy_s) {
      utilization.push_back(makespan > 0 ? busy / makespan : 0.0);
    }
    const sched::MigrationStats m = engine->Migrations();
    const sched::IntrospectionStats in = engine->Introspection();
    s["devices"] = {
        {"count", n_devices},
        {"defragment", options.defragment},
        {"interference", options.interference},
        {"busy_s", result.device_busy_s},
        {"utilization", utilization},
        {"migrations", {{"started", m.started}, {"finished", m.finished}, {"undone", m.undone}}},
        {"pairs",
         {{"probes", in.probes}, {"kept", in.kept}, {"apart", in.apart}, {"moved", in.moved}}}};
  }
  if (swapping) {  // absent without swapping, as paging's below
    s["swapping"] = {
        {"swap_fraction", options.swap_fraction}, {"swap_points", options.swap_points},
        {"swap_overlap", options.swap_overlap},   {"jobs_swapped", result.swapping.jobs},
        {"swapped_units", result.swapping.units}, {"copied_bytes", result.swapping.copied_bytes}};
  }
  if (paging) {  // absent without paging, so such a replay's output is what it always was
    s["paging"] = {{"overcommit", options.overcommit},
                   {"host_bandwidth_bytes_per_s", options.host_bandwidth},
                   {"paging_quantum_ms", options.paging_quantum_ms},
                   {"page_ins", result.paging.page_ins},
                   {"page_outs", result.paging.page_outs},
                   {"copies", result.paging.copies},
                   {"copied_bytes", result.paging.copied_bytes},
                   {"copy_busy_s", result.paging.busy_s}};
  }
  return result;
}

Status WriteSimResult(const SimResult& result, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InvalidArgumentError(fmt::format("cannot create '{}': {}", dir, ec.message()));
  {
    std::ofstream out(std::filesystem::path(dir) / "jobs.jsonl");
    if (!out) return InvalidArgumentError(fmt::format("cannot write '{}/jobs.jsonl'", dir));
    for (const SimJobResult& r : result.jobs) out << JobResultJson(r).dump() << "\n";
  }
  std::ofstream out(std::filesystem::path(dir) / "summary.json");
  if (!out) return InvalidArgumentError(fmt::format("cannot write '{}/summary.json'", dir));
  out << result.summary.dump(2) << "\n";
  return OkStatus();
}

}  // namespace salus::tools
