// Table tests: given this lane snapshot, expect this pick.
#include "sched/policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace salus::sched {
namespace {

using std::chrono::seconds;

SessionView S(SessionId id, uint64_t admit_seq) {
  SessionView v;
  v.id = id;
  v.admit_seq = admit_seq;
  return v;
}

struct Case {
  const char* scenario;
  std::vector<SessionView> runnable;
  SessionId expect;
};

void RunTable(std::string_view policy_name, const std::vector<Case>& cases,
              const nlohmann::json& options = {}) {
  auto policy = CreatePolicy(policy_name, options);
  ASSERT_TRUE(policy.ok()) << policy.status();
  for (const Case& c : cases) {
    LaneSnapshot snap{seconds(100), 1, c.runnable};
    EXPECT_EQ((*policy)->Pick(snap).next, c.expect) << policy_name << ": " << c.scenario;
  }
}

TEST(FifoPolicyTest, Table) {
  RunTable("fifo", {
                       // One session on the device: it runs.
                       {"single session", {S(7, 3)}, 7},
                       // Several runnable: the earliest admitted runs all its iterations first.
                       {"earliest admitted wins", {S(1, 5), S(2, 2), S(3, 9)}, 2},
                       // Priority does not reorder FIFO.
                       {"priority ignored",
                        {[] {
                           auto v = S(1, 4);
                           v.priority = 9;
                           return v;
                         }(),
                         S(2, 1)},
                        2},
                   });
}

TEST(SrtfPolicyTest, Table) {
  auto rem = [](SessionId id, uint64_t seq, double r, int prio = 0) {
    SessionView v = S(id, seq);
    v.remaining_seconds = r;
    v.priority = prio;
    return v;
  };
  RunTable("srtf", {
                       // A long job running and a shorter arrival: the shorter preempts.
                       {"shortest remaining wins", {rem(1, 0, 3600), rem(2, 1, 60)}, 2},
                       // Equal remaining time: the higher priority goes first.
                       {"tie broken by priority", {rem(1, 0, 60, 0), rem(2, 1, 60, 5)}, 2},
                       // Equal remaining and priority: the earlier admitted.
                       {"tie broken by admission", {rem(3, 7, 60), rem(4, 2, 60)}, 4},
                       // An undeclared (infinite) job yields to any declared one.
                       {"unknown length last", {rem(1, 0, INFINITY), rem(2, 1, 1e6)}, 2},
                   });
}

TEST(PackPolicyTest, Table) {
  auto req = [](SessionId id, uint64_t seq, int64_t at_s, int prio = 0) {
    SessionView v = S(id, seq);
    v.requested_at = seconds(at_s);
    v.priority = prio;
    return v;
  };
  RunTable("pack", {
                       // Iterations run in the order they were requested.
                       {"oldest request first", {req(1, 0, 50), req(2, 1, 10), req(3, 2, 30)}, 2},
                       // Requests at the same moment: priority, then admission order.
                       {"same time, priority", {req(1, 0, 10), req(2, 1, 10, 1)}, 2},
                       {"same time, admission", {req(5, 4, 10), req(6, 3, 10)}, 6},
                   });
}

TEST(FairPolicyTest, Table) {
  auto svc = [](SessionId id, uint64_t seq, int64_t service_s, int prio = 0) {
    SessionView v = S(id, seq);
    v.service = seconds(service_s);
    v.priority = prio;
    return v;
  };
  RunTable(
      "fair",
      {
          // The session with the least attained service runs next.
          {"least service first", {svc(1, 0, 30), svc(2, 1, 10), svc(3, 2, 20)}, 2},
          // Priority 2 has weight 3: 50 s of its service counts as 16.7 s, less than 20 s.
          {"weighted by priority", {svc(1, 0, 20), svc(2, 1, 50, 2)}, 2},
          // A negative priority weighs less: 10 s at priority -1 counts as 20 s, more than 15 s.
          {"negative priority", {svc(1, 0, 10, -1), svc(2, 1, 15)}, 2},
          // Equal service: the earlier admitted.
          {"tie broken by admission", {svc(4, 9, 0), svc(5, 3, 0)}, 5},
      });
}

TEST(PolicyRegistryTest, CreatesByNameWithAdmissionModes) {
  EXPECT_EQ(PolicyNames(), (std::vector<std::string>{"fifo", "srtf", "pack", "fair"}));
  EXPECT_EQ((*CreatePolicy("fifo"))->admission_mode(), mem::AdmissionMode::kExclusive);
  EXPECT_EQ((*CreatePolicy("SRTF"))->admission_mode(), mem::AdmissionMode::kSingleLane);
  EXPECT_EQ((*CreatePolicy("pack"))->admission_mode(), mem::AdmissionMode::kPack);
  EXPECT_EQ((*CreatePolicy("fair"))->admission_mode(), mem::AdmissionMode::kPack);
  EXPECT_EQ((*CreatePolicy("fair", {{"single_lane", true}}))->admission_mode(),
            mem::AdmissionMode::kSingleLane);
}

TEST(PolicyRegistryTest, RejectsBadNamesAndOptions) {
  auto bad = CreatePolicy("lottery");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'lottery'"), std::string::npos);
  auto opt = CreatePolicy("pack", {{"single_lane", true}});
  ASSERT_FALSE(opt.ok());
  EXPECT_NE(opt.status().message().find("'single_lane'"), std::string::npos);
  EXPECT_FALSE(CreatePolicy("fair", {{"single_lane", "yes"}}).ok());
  EXPECT_FALSE(CreatePolicy("fifo", nlohmann::json::array()).ok());
}

TEST(PriorityWeightTest, Monotonic) {
  EXPECT_DOUBLE_EQ(PriorityWeight(0), 1.0);
  EXPECT_DOUBLE_EQ(PriorityWeight(2), 3.0);
  EXPECT_DOUBLE_EQ(PriorityWeight(-1), 0.5);
  for (int p = -10; p < 10; ++p) EXPECT_LT(PriorityWeight(p), PriorityWeight(p + 1));
  for (int p : {-500, -128, -3, 0, 7, 128, 129, 1000}) {
    EXPECT_DOUBLE_EQ(InversePriorityWeight(p), 1.0 / PriorityWeight(p)) << p;
  }
}

}  // namespace
}  // namespace salus::sched
