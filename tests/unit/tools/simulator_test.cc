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
}

}  // namespace
}  // namespace salus::tools
