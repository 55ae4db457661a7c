#include "tools/simulator.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/units.h"
#include "device/memory_provider.h"

namespace salus::tools {
namespace {

constexpr uint64_t kCap = 16 * kGiB;

TraceJob Job(std::string id, double submit, int64_t iters, double p_gib, double e_gib, double it_s,
             double util = 1.0) {
  TraceJob j;
  j.job_id = std::move(id);
  j.workload = "w";
  j.submit_s = submit;
  j.iterations = iters;
  j.persistent_bytes = static_cast<uint64_t>(p_gib * kGiB);
  j.ephemeral_bytes = static_cast<uint64_t>(e_gib * kGiB);
  j.iteration_s = it_s;
  j.utilization = util;
  return j;
}

SimResult Simulated(const std::vector<TraceJob>& jobs, const std::string& policy,
                    uint64_t cap = kCap, SimOptions o = {}) {
  auto provider = device::CreateMemoryProvider("fake");
  EXPECT_TRUE(provider.ok());
  o.policy = policy;
  o.capacity = cap;
  auto r = Simulate(jobs, o, provider->get());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : SimResult{};
}

TEST(SimulatorTest, ComputeBoundJobsGainNothingFromPacking) {
  // Two jobs of 10 × 1 s, each alone would take 10 s. Packed into two lanes with
  // utilization 1.0 each, both progress at half speed and finish at 20 s.
  std::vector<TraceJob> jobs = {Job("a", 0, 10, 1, 2, 1.0), Job("b", 0, 10, 1, 2, 1.0)};
  SimResult r = Simulated(jobs, "pack");
  EXPECT_EQ(r.summary["max_lanes"], 2);
  EXPECT_NEAR(r.jobs[0].finish_s, 20.0, 1e-6);
  EXPECT_NEAR(r.jobs[1].finish_s, 20.0, 1e-6);
  // With utilization 0.5 each they overlap perfectly and finish at 10 s.
  jobs = {Job("a", 0, 10, 1, 2, 1.0, 0.5), Job("b", 0, 10, 1, 2, 1.0, 0.5)};
  r = Simulated(jobs, "pack");
  EXPECT_NEAR(r.jobs[0].finish_s, 10.0, 1e-6);
  EXPECT_NEAR(r.summary["makespan_s"].get<double>(), 10.0, 1e-6);
}

TEST(SimulatorTest, FifoRunsJobsOneAfterAnother) {
  std::vector<TraceJob> jobs = {Job("long", 0, 100, 1, 2, 1.0), Job("short", 1, 5, 1, 2, 1.0)};
  SimResult r = Simulated(jobs, "fifo");
  EXPECT_NEAR(r.jobs[0].finish_s, 100, 1e-6);
  EXPECT_NEAR(r.jobs[1].first_start_s, 100, 1e-6);
  EXPECT_NEAR(r.jobs[1].finish_s, 105, 1e-6);
  EXPECT_NEAR(r.jobs[1].admitted_s, 100, 1e-6);
  // SRTF lets the short job in at the next boundary (t = 1 s).
  r = Simulated(jobs, "srtf");
  EXPECT_NEAR(r.jobs[1].first_start_s, 1, 1e-6);
  EXPECT_NEAR(r.jobs[1].finish_s, 6, 1e-6);
  EXPECT_NEAR(r.jobs[0].finish_s, 105, 1e-6);
}

TEST(SimulatorTest, RefusesJobsThatCanNeverFit) {
  std::vector<TraceJob> jobs = {Job("ok", 0, 3, 1, 2, 1.0), Job("huge", 0, 3, 10, 10, 1.0)};
  SimResult r = Simulated(jobs, "fair");
  EXPECT_TRUE(r.jobs[1].refused);
  EXPECT_NE(r.jobs[1].reason.find("RESOURCE_EXHAUSTED"), std::string::npos) << r.jobs[1].reason;
  EXPECT_EQ(r.summary["refused"], 1);
  EXPECT_EQ(r.summary["finished"], 1);
  EXPECT_EQ(JobResultJson(r.jobs[1])["status"], "refused");
}

// A synchronous client: 1 ms from each reply to its next request. Without anticipation the
// long job's queued iteration takes the lane at every such gap, so the short job's 5
// iterations of 1 s each take 9 s; with it they run back to back (5 s plus 4 turnarounds).
TEST(SimulatorTest, AnticipationKeepsAShortSynchronousJobAtItsSoloTime) {
  std::vector<TraceJob> jobs = {Job("long", 0, 100, 1, 2, 1.0), Job("short", 0.5, 5, 1, 2, 1.0)};
  SimOptions o;
  o.turnaround_s = 0.001;
  o.policy_options = {{"max_hold_ms", 0}};
  SimResult off = Simulated(jobs, "srtf", kCap, o);
  o.policy_options = nlohmann::json::object();
  SimResult on = Simulated(jobs, "srtf", kCap, o);
  const double solo = 5 + 4 * 0.001;
  // It starts at the long job's first boundary (1 s), half a second after it arrived.
  EXPECT_NEAR(on.jobs[1].finish_s - on.jobs[1].first_start_s, solo, 1e-6);
  EXPECT_NEAR(off.jobs[1].finish_s - off.jobs[1].first_start_s, 9.0, 1e-6);
  EXPECT_EQ(on.summary["holds"]["returned"], 4);
  EXPECT_EQ(on.summary["holds"]["expired"], 0);
  EXPECT_EQ(off.summary["holds"]["started"], 0);
  // A per-job turnaround in the trace overrides the default: back to back, no hold needed.
  jobs[1].turnaround_s = 0.0;
  SimResult own = Simulated(jobs, "srtf", kCap, o);
  EXPECT_NEAR(own.jobs[1].finish_s - own.jobs[1].first_start_s, 5.0, 1e-6);
  // FAIR never holds: the two alternate.
  EXPECT_EQ(Simulated(jobs, "fair", kCap, o).summary["holds"]["started"], 0);
}

TEST(SimulatorTest, PriorityRunsTheHigherLevelFirst) {
  std::vector<TraceJob> jobs = {Job("low", 0, 10, 1, 2, 1.0), Job("high", 0.5, 20, 1, 2, 1.0)};
  jobs[1].priority = 3;
  SimResult r = Simulated(jobs, "priority");
  EXPECT_NEAR(r.jobs[1].finish_s, 21.0, 1e-6);  // preempts at 1 s, runs 20 iterations
  EXPECT_NEAR(r.jobs[0].finish_s, 30.0, 1e-6);
}

TEST(SimulatorTest, PaperTraceUnderEveryPolicyKeepsTheSafetyCondition) {
  auto profiles = LoadProfiles(SALUS_SOURCE_DIR "/benchmarks/workloads/salus-p100-profiles.csv");
  ASSERT_TRUE(profiles.ok());
  auto jobs = LoadTrace(SALUS_SOURCE_DIR "/benchmarks/traces/paper-100.csv", *profiles);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  SimOptions o;
  o.quantum_s = 1.0;  // keeps the test fast; exactness is covered above
  double fifo_jct = 0, srtf_jct = 0;
  for (const char* policy : {"fifo", "srtf", "pack", "fair", "priority"}) {
    SimResult r = Simulated(*jobs, policy, kCap, o);
    EXPECT_EQ(r.summary["safety_violations"], 0) << policy;
    EXPECT_EQ(r.summary["finished"].get<size_t>() + r.summary["refused"].get<size_t>(), 100u);
    if (std::string(policy) == "fifo") {
      fifo_jct = r.summary["avg_jct_s"];
      EXPECT_EQ(r.summary["max_lanes"], 1);
    }
    if (std::string(policy) == "srtf") srtf_jct = r.summary["avg_jct_s"];
  }
  EXPECT_LT(srtf_jct, fifo_jct);
}

std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(SimulatorTest, SameTraceAndSeedGiveByteIdenticalOutput) {
  std::vector<TraceJob> jobs;
  for (int i = 0; i < 30; ++i) {
    jobs.push_back(Job("j" + std::to_string(i), i * 0.7, 20 + i, 0.5 + (i % 3), 1 + (i % 5),
                       0.05 * (1 + i % 4), 0.3 + 0.1 * (i % 7)));
  }
  SimOptions o;
  o.jitter = 0.2;
  o.seed = 42;
  const auto base = std::filesystem::temp_directory_path() / "salus_sim_determinism";
  std::string first_jobs, first_summary;
  for (int run = 0; run < 2; ++run) {
    SimResult r = Simulated(jobs, "fair", kCap, o);
    const auto dir = base / std::to_string(run);
    ASSERT_TRUE(WriteSimResult(r, dir.string()).ok());
    if (run == 0) {
      first_jobs = Slurp(dir / "jobs.jsonl");
      first_summary = Slurp(dir / "summary.json");
    } else {
      EXPECT_EQ(Slurp(dir / "jobs.jsonl"), first_jobs);
      EXPECT_EQ(Slurp(dir / "summary.json"), first_summary);
    }
  }
  // A different seed gives a different jittered run.
  o.seed = 43;
  SimResult other = Simulated(jobs, "fair", kCap, o);
  EXPECT_NE(other.summary.dump(), nlohmann::json::parse(first_summary).dump());
  std::filesystem::remove_all(base);
}

// Paging (Note [Simulated paging]): three jobs of P 1.5 GiB and E 0.5 GiB on a 4 GiB device.
// Two fit resident (ΣP + ΣL <= 4 GiB); the third would make ΣP 4.5 GiB, so without
// overcommit it waits for admission until one of the others leaves. With overcommit 1.5 (ΣP
// up to 6 GiB) it is admitted paged out at once, and paged in by paging another out.
constexpr uint64_t kPagingCap = 4 * kGiB;
constexpr uint64_t kPagingP = 3 * kGiB / 2;
// A copy of one P takes kCopyS on the copy path.
constexpr double kCopyS = 0.25;
constexpr double kPagingBandwidth = static_cast<double>(kPagingP) / kCopyS;

std::vector<TraceJob> PagingTrace() {
  return {Job("a", 0, 10, 1.5, 0.5, 1.0), Job("b", 0, 10, 1.5, 0.5, 1.0),
          Job("c", 0.5, 4, 1.5, 0.5, 1.0)};
}

SimOptions Overcommit(double overcommit, double bandwidth = kPagingBandwidth) {
  SimOptions o;
  o.overcommit = overcommit;
  o.host_bandwidth = bandwidth;
  return o;
}

TEST(SimulatorTest, OvercommitRunsJobsWhosePersistentMemoryExceedsTheDevice) {
  const std::vector<TraceJob> jobs = PagingTrace();
  for (const char* policy : {"srtf", "fair"}) {
    SCOPED_TRACE(policy);
    const SimResult off = Simulated(jobs, policy, kPagingCap, Overcommit(1.0));
    ASSERT_EQ(off.jobs.size(), 3u);
    // c waits for admission until a job leaves (at 10 s under SRTF, 20 s under FAIR).
    EXPECT_GE(off.jobs[2].admitted_s, 10.0);
    EXPECT_EQ(off.paging.copies, 0u);

    const SimResult on = Simulated(jobs, policy, kPagingCap, Overcommit(1.5));
    ASSERT_EQ(on.jobs.size(), 3u);
    EXPECT_EQ(on.summary["finished"], 3);
    EXPECT_EQ(on.summary["refused"], 0);
    EXPECT_EQ(on.summary["safety_violations"], 0);
    EXPECT_NEAR(on.jobs[2].admitted_s, 0.5, 1e-9);  // admitted paged out on arrival
    EXPECT_LT(on.jobs[2].finish_s - 0.5, off.jobs[2].finish_s - 0.5);
    const SimPagingResult& pg = on.paging;
    EXPECT_GT(pg.page_outs, 0u);
    // Every page-out is copied out and, for the job to finish, back in; c was admitted paged
    // out, so its first page-in copies nothing.
    EXPECT_EQ(pg.page_ins, pg.page_outs + 1);
    EXPECT_EQ(pg.copies, 2 * pg.page_outs);
    EXPECT_EQ(pg.copied_bytes, pg.copies * kPagingP);
    // The copy path was busy for exactly bytes / bandwidth.
    EXPECT_NEAR(pg.busy_s, static_cast<double>(pg.copied_bytes) / kPagingBandwidth, 1e-9);
    EXPECT_NEAR(pg.busy_s, static_cast<double>(pg.copies) * kCopyS, 1e-9);
    uint64_t job_page_outs = 0;
    for (const SimJobResult& r : on.jobs) {
      ASSERT_TRUE(r.page_outs.has_value());
      job_page_outs += *r.page_outs;
    }
    EXPECT_EQ(job_page_outs, pg.page_outs);
    const nlohmann::json& s = on.summary["paging"];
    EXPECT_EQ(s["page_ins"], pg.page_ins);
    EXPECT_EQ(s["page_outs"], pg.page_outs);
    EXPECT_EQ(s["copied_bytes"], pg.copied_bytes);
    EXPECT_DOUBLE_EQ(s["copy_busy_s"].get<double>(), pg.busy_s);
    EXPECT_DOUBLE_EQ(s["host_bandwidth_bytes_per_s"].get<double>(), kPagingBandwidth);
  }
}

// SRTF, one lane: a runs first. c (4 iterations, the shortest) arrives at 0.5 s paged out; at
// a's first boundary (1 s: a has been resident for the 1 s paging quantum and has run) a is
// paged out for it. c's block is placed when a's copy out ends, at 1.25 s, and c runs to
// 5.25 s. Its departure makes room: a is paged back in (5.25-5.5 s) while b, resident and
// runnable, takes the lane for one iteration; then a (shorter remaining) runs its 9 left, and
// b its 9.
TEST(SimulatorTest, PagingUnderSrtfExactly) {
  const std::vector<TraceJob> jobs = PagingTrace();
  const SimResult r = Simulated(jobs, "srtf", kPagingCap, Overcommit(1.5));
  ASSERT_EQ(r.jobs.size(), 3u);
  EXPECT_NEAR(r.jobs[2].first_start_s, 1 + kCopyS, 1e-9);
  EXPECT_NEAR(r.jobs[2].finish_s, 5 + kCopyS, 1e-9);
  EXPECT_NEAR(r.jobs[0].finish_s, 15 + kCopyS, 1e-9);
  EXPECT_NEAR(r.jobs[1].first_start_s, 5 + kCopyS, 1e-9);
  EXPECT_NEAR(r.jobs[1].finish_s, 24 + kCopyS, 1e-9);
  EXPECT_EQ(r.paging.page_outs, 1u);
  EXPECT_EQ(r.jobs[0].page_outs, 1u);
  // At a tenth of the bandwidth the copy takes ten times as long, and c starts that much later.
  const SimResult slow =
      Simulated(jobs, "srtf", kPagingCap, Overcommit(1.5, kPagingBandwidth / 10));
  ASSERT_EQ(slow.jobs.size(), 3u);
  EXPECT_NEAR(slow.jobs[2].first_start_s, 1 + 10 * kCopyS, 1e-9);
  EXPECT_NEAR(slow.paging.busy_s, 2 * 10 * kCopyS, 1e-9);
}

// FAIR, two lanes: a and b (P 1 GiB each) run side by side at half speed, so their first
// iterations end together at 2 s. c (P 3 GiB, no service yet) needs both paged out. Their two
// copies queue on the one copy path, a's then b's, and c's block is placed when the second
// ends: at 2 s + 2 copies, not 2 s + 1 as two parallel copies would give.
TEST(SimulatorTest, CopiesRunOneAtATimeOnOneCopyPath) {
  const std::vector<TraceJob> jobs = {Job("a", 0, 6, 1, 0.5, 1.0), Job("b", 0, 6, 1, 0.5, 1.0),
                                      Job("c", 0.5, 2, 3, 0.5, 1.0)};
  const double bandwidth = static_cast<double>(kGiB) / kCopyS;  // one P of a or b: kCopyS
  const SimResult r = Simulated(jobs, "fair", kPagingCap, Overcommit(1.5, bandwidth));
  ASSERT_EQ(r.jobs.size(), 3u);
  EXPECT_EQ(r.summary["finished"], 3);
  EXPECT_EQ(r.jobs[2].page_outs, 0u);
  EXPECT_NEAR(r.jobs[2].first_start_s, 2 + 2 * kCopyS, 1e-9);
  EXPECT_GE(r.paging.page_outs, 2u);
  EXPECT_NEAR(r.paging.busy_s, static_cast<double>(r.paging.copied_bytes) / bandwidth, 1e-9);
}

// Overcommit 1 is the replay without paging: whatever the paging options say, the output is
// byte for byte the default's, with no paging in it. On the paging trace that is today's
// admission wait (SRTF: a runs 0-10 s, c is admitted when a leaves and runs 10-14 s, b 14-24 s).
TEST(SimulatorTest, OvercommitOneIsTheReplayWithoutPaging) {
  std::vector<TraceJob> mixed;
  for (int i = 0; i < 30; ++i) {
    mixed.push_back(Job("j" + std::to_string(i), i * 0.7, 20 + i, 0.5 + (i % 3), 1 + (i % 5),
                        0.05 * (1 + i % 4), 0.3 + 0.1 * (i % 7)));
  }
  const std::vector<TraceJob> paging = PagingTrace();
  const std::vector<TraceJob>* traces[] = {&paging, &mixed};
  for (const std::vector<TraceJob>* jobs : traces) {
    for (const char* policy : {"fifo", "srtf", "pack", "fair", "priority"}) {
      SCOPED_TRACE(policy);
      const uint64_t cap = jobs == &paging ? kPagingCap : 8 * kGiB;
      const SimResult base = Simulated(*jobs, policy, cap);
      SimOptions o = Overcommit(1.0, 1.0);
      o.paging_quantum_ms = 1;
      const SimResult one = Simulated(*jobs, policy, cap, o);
      EXPECT_EQ(one.summary.dump(), base.summary.dump());
      EXPECT_FALSE(one.summary.contains("paging"));
      ASSERT_EQ(one.jobs.size(), base.jobs.size());
      for (size_t i = 0; i < one.jobs.size(); ++i) {
        EXPECT_EQ(JobResultJson(one.jobs[i]).dump(), JobResultJson(base.jobs[i]).dump());
        EXPECT_FALSE(one.jobs[i].page_outs.has_value());
      }
      EXPECT_EQ(one.paging.page_ins + one.paging.page_outs + one.paging.copies, 0u);
      EXPECT_EQ(one.paging.busy_s, 0.0);
    }
  }
  const SimResult r = Simulated(paging, "srtf", kPagingCap, Overcommit(1.0));
  ASSERT_EQ(r.jobs.size(), 3u);
  EXPECT_NEAR(r.jobs[0].finish_s, 10, 1e-9);
  EXPECT_NEAR(r.jobs[2].admitted_s, 10, 1e-9);
  EXPECT_NEAR(r.jobs[2].finish_s, 14, 1e-9);
  EXPECT_NEAR(r.jobs[1].finish_s, 24, 1e-9);
}

// Swapping (Note [Simulated swapping]). E 4 GiB, T 1 s, a quarter of E per point at 4 GiB/s:
// X = 1, 2, 3 GiB copy out and back in c = 0.5, 1, 1.5 s, of which 0.5 s hides behind compute.
TEST(SimulatorTest, SwapPointsFollowTheModel) {
  SimOptions o;
  o.swap_fraction = 0.75;
  o.host_bandwidth = 4.0 * kGiB;
  TraceJob job = Job("a", 0, 10, 1, 4, 1.0);
  std::vector<SimSwapPoint> p = SwapPoints(job, o);
  ASSERT_EQ(p.size(), 4u);
  const double factors[] = {1, 1, 1.5, 2};
  for (size_t k = 0; k < p.size(); ++k) {
    SCOPED_TRACE(k);
    EXPECT_EQ(p[k].ephemeral_bytes, (4 - k) * kGiB);
    EXPECT_EQ(p[k].copied_bytes, 2 * k * kGiB);
    EXPECT_DOUBLE_EQ(p[k].time_factor, factors[k]);
    EXPECT_DOUBLE_EQ(p[k].path_share, 0.5 * static_cast<double>(k) / factors[k]);
  }
  // A row's own fraction overrides the default; an inference job and fraction 0 swap nothing.
  job.swap_fraction = 0.5;
  p = SwapPoints(job, o);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p.back().ephemeral_bytes, 2 * kGiB);
  job.swap_fraction = 0;
  EXPECT_EQ(SwapPoints(job, o).size(), 1u);
  job.swap_fraction.reset();
  job.training = false;
  EXPECT_EQ(SwapPoints(job, o).size(), 1u);
  // Points that would not lower E (a tiny E) are dropped.
  TraceJob tiny = Job("t", 0, 1, 1, 0, 1.0);
  tiny.ephemeral_bytes = 2;
  p = SwapPoints(tiny, o);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].ephemeral_bytes, 1u);
}

// Two jobs of P 0.5 GiB and E 5 GiB on a 5 GiB device: neither fits unswapped, so without
// swapping both are refused. Swapping 3/4 of E (one point: E' 1.25 GiB, 7.5 GiB copied per
// iteration at 7.5 GiB/s: 1 s, half of it hidden) a job alone takes 1.5 s an iteration and
// keeps the copy path busy 2/3 of the time. Together (two lanes: 1 + 2.5 <= 5 GiB) the path
// is the bottleneck at 4/3 load: each iteration takes 2 s, and 10 of each end at 20 s, the
// path busy all along.
TEST(SimulatorTest, SwappingRunsJobsWhoseLaneDoesNotFitAndTheyShareTheCopyPath) {
  constexpr uint64_t cap = 5 * kGiB;
  const TraceJob a = Job("a", 0, 10, 0.5, 5, 1.0, 0.25), b = Job("b", 0, 10, 0.5, 5, 1.0, 0.25);
  SimOptions o;
  o.swap_fraction = 0.75;
  o.swap_points = 2;
  o.host_bandwidth = 7.5 * kGiB;

  const SimResult off = Simulated({a, b}, "pack", cap);
  EXPECT_EQ(off.summary["refused"], 2);

  const SimResult alone = Simulated({a}, "pack", cap, o);
  ASSERT_EQ(alone.jobs.size(), 1u);
  EXPECT_NEAR(alone.jobs[0].finish_s, 15, 1e-9);
  EXPECT_EQ(alone.jobs[0].swapped_units, 10);

  const std::vector<TraceJob> jobs = {a, b};  // results point into their trace
  const SimResult both = Simulated(jobs, "pack", cap, o);
  ASSERT_EQ(both.jobs.size(), 2u);
  EXPECT_EQ(both.summary["max_lanes"], 2);
  EXPECT_EQ(both.summary["safety_violations"], 0);
  for (const SimJobResult& r : both.jobs) {
    EXPECT_NEAR(r.finish_s, 20, 1e-9);
    EXPECT_EQ(r.swapped_units, 10);
  }
  EXPECT_EQ(both.swapping.jobs, 2u);
  EXPECT_EQ(both.swapping.units, 20u);
  EXPECT_EQ(both.swapping.copied_bytes, 20 * 15 * kGiB / 2);
  const nlohmann::json& s = both.summary["swapping"];
  EXPECT_EQ(s["swapped_units"], 20);
  EXPECT_EQ(s["copied_bytes"], both.swapping.copied_bytes);
  EXPECT_EQ(JobResultJson(both.jobs[0])["swapped_units"], 10);
}

// Admission grants a swap point only when the unswapped lane cannot be admitted. On 6 GiB, a
// (P 1, E 2) runs unswapped. b (P 1, E 4.5) cannot join it (1 + 1 + 4.5 > 6 GiB), so without
// swapping it waits for a to leave; swapping 60% of E (E' 1.8 GiB, its copies hidden) it opens
// a lane beside a at once and both end at 10 s.
TEST(SimulatorTest, SwappingGrantsTheFirstLaneThatFits) {
  const TraceJob a = Job("a", 0, 10, 1, 2, 1.0, 0.5), b = Job("b", 0, 10, 1, 4.5, 1.0, 0.5);
  SimOptions o;
  o.swap_fraction = 0.6;
  o.swap_points = 2;
  o.host_bandwidth = 10.8 * kGiB;  // 2.7 GiB out and back: 0.5 s, all of it hidden
  const SimResult base = Simulated({a, b}, "pack", 6 * kGiB);
  EXPECT_NEAR(base.jobs[1].admitted_s, 10, 1e-9);
  EXPECT_NEAR(base.jobs[1].finish_s, 20, 1e-9);
  const SimResult r = Simulated({a, b}, "pack", 6 * kGiB, o);
  ASSERT_EQ(r.jobs.size(), 2u);
  EXPECT_EQ(r.jobs[0].swapped_units, 0);
  EXPECT_EQ(r.jobs[1].swapped_units, 10);
  EXPECT_NEAR(r.jobs[1].admitted_s, 0, 1e-9);
  EXPECT_NEAR(r.jobs[0].finish_s, 10, 1e-9);
  EXPECT_NEAR(r.jobs[1].finish_s, 10, 1e-9);
  EXPECT_EQ(r.summary["max_lanes"], 2);
  EXPECT_EQ(r.swapping.jobs, 1u);
}

// Swap fraction 0 is the replay without swapping, whatever the other swap options say.
TEST(SimulatorTest, SwapFractionZeroIsTheReplayWithoutSwapping) {
  std::vector<TraceJob> jobs;
  for (int i = 0; i < 20; ++i) {
    jobs.push_back(Job("j" + std::to_string(i), i * 0.5, 10 + i, 0.5 + (i % 3), 1 + (i % 5),
                       0.05 * (1 + i % 4), 0.3 + 0.1 * (i % 7)));
  }
  for (const char* policy : {"fifo", "srtf", "pack", "fair"}) {
    SCOPED_TRACE(policy);
    const SimResult base = Simulated(jobs, policy, 8 * kGiB);
    SimOptions o;
    o.swap_points = 5;
    o.swap_overlap = 0.1;
    const SimResult zero = Simulated(jobs, policy, 8 * kGiB, o);
    EXPECT_EQ(zero.summary.dump(), base.summary.dump());
    EXPECT_FALSE(zero.summary.contains("swapping"));
    for (const SimJobResult& j : zero.jobs) EXPECT_FALSE(j.swapped_units.has_value());
  }
}

// Several devices (Note [Simulated devices]). Two compute-bound jobs of 10 x 1 s: on one
// device PACK packs them and both end at 20 s; pinned to two devices each has its own compute
// and both end at 10 s. Unpinned on two devices, best fit packs them on device 0 (they gain
// nothing and lose nothing there, so introspection keeps them), as on one device.
TEST(SimulatorTest, DevicesHaveTheirOwnCompute) {
  std::vector<TraceJob> jobs = {Job("a", 0, 10, 1, 2, 1.0), Job("b", 0, 10, 1, 2, 1.0)};
  SimOptions o;
  o.devices = 2;
  jobs[1].device = 1;
  const SimResult r = Simulated(jobs, "pack", kCap, o);
  ASSERT_EQ(r.jobs.size(), 2u);
  EXPECT_EQ(r.jobs[0].device, 0u);
  EXPECT_EQ(r.jobs[1].device, 1u);
  EXPECT_NEAR(r.jobs[0].finish_s, 10, 1e-6);
  EXPECT_NEAR(r.jobs[1].finish_s, 10, 1e-6);
  const nlohmann::json& d = r.summary["devices"];
  EXPECT_EQ(d["count"], 2);
  EXPECT_NEAR(d["utilization"][0].get<double>(), 1.0, 1e-6);
  EXPECT_NEAR(d["utilization"][1].get<double>(), 1.0, 1e-6);
  EXPECT_EQ(JobResultJson(r.jobs[1])["device"], 1);
  // On one device the same jobs share its compute (the pin is cleared: there is no device 1).
  std::vector<TraceJob> unpinned = jobs;
  unpinned[1].device.reset();
  const SimResult one = Simulated(unpinned, "pack");
  ASSERT_EQ(one.jobs.size(), 2u);
  EXPECT_NEAR(one.jobs[0].finish_s, 20, 1e-6);
  EXPECT_NEAR(one.jobs[1].finish_s, 20, 1e-6);
  EXPECT_FALSE(JobResultJson(one.jobs[0]).contains("device"));
  EXPECT_FALSE(one.summary.contains("devices"));
  // Unpinned on two devices, best fit packs them on device 0, as on one device; with the
  // engine's own moves off they stay there and finish as on one device.
  SimOptions stay = o;
  stay.defragment = false;
  const SimResult packed = Simulated(unpinned, "pack", kCap, stay);
  ASSERT_EQ(packed.jobs.size(), 2u);
  EXPECT_EQ(packed.jobs[0].device, 0u);
  EXPECT_EQ(packed.jobs[1].device, 0u);
  EXPECT_NEAR(packed.jobs[1].finish_s, 20, 1e-6);
  // With them on, once resident for the paging quantum one moves to the idle device (Note
  // [Migration]): both finish near the 10 s of the pinned ones, well before 20 s.
  const SimResult spread = Simulated(unpinned, "pack", kCap, o);
  ASSERT_EQ(spread.jobs.size(), 2u);
  EXPECT_NE(spread.jobs[0].device, spread.jobs[1].device);
  EXPECT_EQ(spread.summary["devices"]["migrations"]["finished"], 1);
  EXPECT_LT(spread.summary["makespan_s"].get<double>(), 12);
  // A pin past the devices is refused with the engine's reason, not an abort.
  jobs[1].device = 5;
  const SimResult bad = Simulated(jobs, "pack", kCap, o);
  ASSERT_EQ(bad.jobs.size(), 2u);
  EXPECT_TRUE(bad.jobs[1].refused);
  EXPECT_NE(bad.jobs[1].reason.find("no device 5"), std::string::npos) << bad.jobs[1].reason;
  EXPECT_NEAR(bad.jobs[0].finish_s, 10, 1e-6);
}

// With interference packed jobs lose (1/1.5 each beside the other, on top of sharing compute):
// introspective PACK measures the pair and moves one to the idle device; without
// introspection they stay packed and finish later. (The engine's own moves are off: spreading
// would move one to the idle device before the pair is measured.)
TEST(SimulatorTest, IntrospectionMovesALosingPairApartAcrossDevices) {
  const std::vector<TraceJob> jobs = {Job("a", 0, 40, 1, 2, 1.0), Job("b", 0, 40, 2, 2, 1.0)};
  SimOptions o;
  o.devices = 2;
  o.defragment = false;
  o.interference = 0.5;
  const SimResult r = Simulated(jobs, "pack", kCap, o);
  ASSERT_EQ(r.jobs.size(), 2u);
  const nlohmann::json& d = r.summary["devices"];
  EXPECT_EQ(d["pairs"]["moved"], 1);
  EXPECT_EQ(d["migrations"]["finished"], 1);
  EXPECT_EQ(r.jobs[0].migrations.value_or(0) + r.jobs[1].migrations.value_or(0), 1u);
  EXPECT_NE(r.jobs[0].device, r.jobs[1].device);
  o.policy_options = {{"introspect", false}};
  const SimResult packed = Simulated(jobs, "pack", kCap, o);
  ASSERT_EQ(packed.jobs.size(), 2u);
  EXPECT_EQ(packed.summary["devices"]["migrations"]["started"], 0);
  EXPECT_GT(packed.summary["makespan_s"].get<double>(),
            1.5 * r.summary["makespan_s"].get<double>());
}

// A waiting job gets in by a move: a (P 2) is placed on device 0; b, pinned to device 0, needs
// all of it; device 1 takes a, and b runs. With defragmentation off, b waits for a to end.
TEST(SimulatorTest, DefragmentationMovesAJobForAPinnedOne) {
  std::vector<TraceJob> jobs = {Job("a", 0, 20, 2, 1, 1.0), Job("b", 5, 5, 2, 1, 1.0)};
  jobs[1].device = 0;
  SimOptions o;
  o.devices = 2;
  const SimResult r = Simulated(jobs, "fifo", 4 * kGiB, o);
  ASSERT_EQ(r.jobs.size(), 2u);
  EXPECT_EQ(r.summary["devices"]["migrations"]["finished"], 1);
  EXPECT_EQ(r.jobs[0].device, 1u);
  EXPECT_LT(r.jobs[1].finish_s, 15);
  o.defragment = false;
  const SimResult off = Simulated(jobs, "fifo", 4 * kGiB, o);
  ASSERT_EQ(off.jobs.size(), 2u);
  EXPECT_EQ(off.summary["devices"]["migrations"]["started"], 0);
  EXPECT_GE(off.jobs[1].admitted_s, 20);
}

TEST(SimulatorTest, RandomTraceOnThreeDevicesIsSafeUnderEveryPolicy) {
  std::vector<TraceJob> jobs;
  for (int i = 0; i < 60; ++i) {
    jobs.push_back(Job("j" + std::to_string(i), i * 0.4, 5 + i % 7, 0.5 + (i % 4), 1 + (i % 3),
                       0.1 * (1 + i % 3), 0.4 + 0.1 * (i % 6)));
    if (i % 9 == 0) jobs.back().device = i % 3;
  }
  for (const char* policy : {"fifo", "srtf", "pack", "fair", "priority"}) {
    SCOPED_TRACE(policy);
    SimOptions o;
    o.devices = 3;
    o.interference = 0.3;
    const SimResult r = Simulated(jobs, policy, 8 * kGiB, o);
    EXPECT_EQ(r.summary["safety_violations"], 0);
    EXPECT_EQ(r.summary["finished"].get<size_t>() + r.summary["refused"].get<size_t>(), 60u);
    EXPECT_EQ(r.summary["refused"], 0);
  }
}

TEST(SimulatorTest, RejectsBadOptions) {
  auto provider = device::CreateMemoryProvider("fake");
  ASSERT_TRUE(provider.ok());
  SimOptions o;
  o.capacity = kCap;
  o.policy = "nope";
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.policy = "fair";
  o.jitter = 1.5;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.jitter = 0;
  o.overcommit = 0.5;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.overcommit = 1.5;
  o.host_bandwidth = 0;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.host_bandwidth = kDefaultHostBandwidthBytesPerS;
  o.paging_quantum_ms = -1;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.paging_quantum_ms = 1000;
  o.swap_fraction = 1;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.swap_fraction = 0.5;
  o.swap_points = 1;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.swap_points = 3;
  o.swap_overlap = 1.5;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.swap_overlap = 0.5;
  o.devices = 0;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.devices = 2;
  o.interference = -1;
  EXPECT_EQ(Simulate({}, o, provider->get()).status().code(), StatusCode::kInvalidArgument);
  o.interference = 0;
  EXPECT_TRUE(Simulate({}, o, provider->get()).ok());
}

}  // namespace
}  // namespace salus::tools
