#include "tools/trace.h"

#include <gtest/gtest.h>

namespace salus::tools {
namespace {

std::map<std::string, Profile> Profiles() {
  std::map<std::string, Profile> p;
  p["resnet50_25"] = {"resnet50_25", "training", 100, 1000, 0.1};
  p["vgg16eval_1"] = {"vgg16eval_1", "inference", 500, 200, std::nullopt};
  return p;
}

TEST(TraceTest, ParsesProfileRowsAndOverrides) {
  auto jobs = ParseTrace(
      "job_id,workload,submit_time_s,iterations,persistent_mb,ephemeral_mb,iteration_s,"
      "utilization\n"
      "a,resnet50_25,0,10,,,,\n"
      "b,resnet50_25,1.5,20,200,,0.5,0.4\n"
      "c,custom,3,5,10,20,1,\n",
      "t.csv", Profiles());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ((*jobs)[0].persistent_bytes, 100 * kProfileMegabyte);
  EXPECT_EQ((*jobs)[0].ephemeral_bytes, 1000 * kProfileMegabyte);
  EXPECT_DOUBLE_EQ((*jobs)[0].iteration_s, 0.1);
  EXPECT_DOUBLE_EQ((*jobs)[0].utilization, 1.0);
  EXPECT_EQ((*jobs)[1].persistent_bytes, 200 * kProfileMegabyte);
  EXPECT_EQ((*jobs)[1].ephemeral_bytes, 1000 * kProfileMegabyte);
  EXPECT_DOUBLE_EQ((*jobs)[1].iteration_s, 0.5);
  EXPECT_DOUBLE_EQ((*jobs)[1].utilization, 0.4);
  EXPECT_EQ((*jobs)[2].workload, "custom");
  EXPECT_EQ((*jobs)[2].line, 4);
}

// Each bad trace gets INVALID_ARGUMENT naming the line (and what is wrong).
TEST(TraceTest, BadTracesNameTheLine) {
  struct Case {
    const char* scenario;
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"missing column", "job_id,workload,iterations\na,resnet50_25,1\n",
       "t.csv:1: missing column(s) submit_time_s"},
      {"unknown workload", "job_id,workload,submit_time_s,iterations\na,nope,0,1\n",
       "t.csv:2: unknown workload 'nope'"},
      {"negative submit time", "job_id,workload,submit_time_s,iterations\na,resnet50_25,-1,1\n",
       "t.csv:2: column 'submit_time_s': -1 must be >= 0"},
      {"zero iterations", "job_id,workload,submit_time_s,iterations\na,resnet50_25,0,0\n",
       "t.csv:2: column 'iterations': 0 must be > 0"},
      {"fractional iterations", "job_id,workload,submit_time_s,iterations\na,resnet50_25,0,2.5\n",
       "t.csv:2: column 'iterations': 2.5 is not a whole number"},
      {"not a number", "job_id,workload,submit_time_s,iterations\na,resnet50_25,soon,1\n",
       "t.csv:2: column 'submit_time_s': 'soon' is not a number"},
      {"wrong field count", "job_id,workload,submit_time_s,iterations\na,resnet50_25,0\n",
       "t.csv:2: expected 4 fields, got 3"},
      {"duplicate id",
       "job_id,workload,submit_time_s,iterations\na,resnet50_25,0,1\na,resnet50_25,0,1\n",
       "t.csv:3: duplicate job_id 'a'"},
      {"inference profile without time",
       "job_id,workload,submit_time_s,iterations\na,vgg16eval_1,0,1\n",
       "t.csv:2: workload 'vgg16eval_1' has no measured iteration time"},
      {"negative override",
       "job_id,workload,submit_time_s,iterations,ephemeral_mb\na,resnet50_25,0,1,-5\n",
       "t.csv:2: column 'ephemeral_mb': -5 must be >= 0"},
      {"empty", "", "t.csv: no header line"},
  };
  for (const Case& c : cases) {
    auto r = ParseTrace(c.text, "t.csv", Profiles());
    ASSERT_FALSE(r.ok()) << c.scenario;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.scenario;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.scenario << ": " << r.status().message();
  }
}

TEST(TraceTest, ParsesTurnaroundAndPriority) {
  auto jobs = ParseTrace(
      "job_id,workload,submit_time_s,iterations,turnaround_s,priority\n"
      "a,resnet50_25,0,10,0.002,3\n"
      "b,resnet50_25,1,10,,\n",
      "t.csv", Profiles());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ((*jobs)[0].turnaround_s, 0.002);
  EXPECT_EQ((*jobs)[0].priority, 3);
  EXPECT_FALSE((*jobs)[1].turnaround_s.has_value());
  EXPECT_EQ((*jobs)[1].priority, 0);
  for (const char* bad :
       {"a,resnet50_25,0,1,-1,0\n", "a,resnet50_25,0,1,0,high\n", "a,resnet50_25,0,1,0,1000\n"}) {
    auto r = ParseTrace(std::string("job_id,workload,submit_time_s,iterations,turnaround_s,"
                                    "priority\n") +
                            bad,
                        "t.csv", Profiles());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("t.csv:2: column '"), std::string::npos) << r.status();
  }
}

TEST(TraceTest, ParsesSwapFractionAndKind) {
  auto jobs = ParseTrace(
      "job_id,workload,submit_time_s,iterations,iteration_s,swap_fraction\n"
      "a,resnet50_25,0,10,,0.4\n"
      "b,resnet50_25,1,10,,\n"
      "c,vgg16eval_1,1,10,0.01,\n",
      "t.csv", Profiles());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_FALSE((*jobs)[2].training);  // an inference profile
  EXPECT_EQ((*jobs)[0].swap_fraction, 0.4);
  EXPECT_FALSE((*jobs)[1].swap_fraction.has_value());
  EXPECT_TRUE((*jobs)[0].training);
  for (const char* bad : {"a,resnet50_25,0,1,1\n", "a,resnet50_25,0,1,-0.5\n"}) {
    auto r =
        ParseTrace(std::string("job_id,workload,submit_time_s,iterations,swap_fraction\n") + bad,
                   "t.csv", Profiles());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("t.csv:2: column 'swap_fraction'"), std::string::npos)
        << r.status();
  }
}

TEST(TraceTest, ParsesDevicePins) {
  auto jobs = ParseTrace(
      "job_id,workload,submit_time_s,iterations,device\n"
      "a,resnet50_25,0,10,2\n"
      "b,resnet50_25,1,10,\n",
      "t.csv", Profiles());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ((*jobs)[0].device, 2);
  EXPECT_FALSE((*jobs)[1].device.has_value());
  for (const char* bad : {"a,resnet50_25,0,1,-1\n", "a,resnet50_25,0,1,gpu\n"}) {
    auto r = ParseTrace(std::string("job_id,workload,submit_time_s,iterations,device\n") + bad,
                        "t.csv", Profiles());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("t.csv:2: column 'device'"), std::string::npos)
        << r.status();
  }
}

TEST(TraceTest, LoadsTheShippedProfiles) {
  auto p = LoadProfiles(SALUS_SOURCE_DIR "/benchmarks/workloads/salus-p100-profiles.csv");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), 96u);
  EXPECT_DOUBLE_EQ(p->at("alexnet_100").persistent_mb, 353.9);
  EXPECT_FALSE(p->at("alexneteval_1").iteration_s.has_value());
  EXPECT_EQ(LoadProfiles("/nonexistent.csv").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace salus::tools
