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
  // Sessions expected back soon (Note [Anticipation]); `hold`: the pick holds the lane for
  // `expect` instead of running it.
  std::vector<SessionView> anticipated = {};
  bool hold = false;
};

void RunTable(std::string_view policy_name, const std::vector<Case>& cases,
              const nlohmann::json& options = {}) {
  auto policy = CreatePolicy(policy_name, options);
  ASSERT_TRUE(policy.ok()) << policy.status();
  for (const Case& c : cases) {
    LaneSnapshot snap{seconds(100), 1, c.runnable, c.anticipated};
    const Decision d = (*policy)->Pick(snap);
    EXPECT_EQ(d.next, c.expect) << policy_name << ": " << c.scenario;
    EXPECT_EQ(d.hold, c.hold) << policy_name << ": " << c.scenario;
    if (d.hold) {
      for (const SessionView& v : c.anticipated) {
        if (v.id == d.next) {
          EXPECT_EQ(d.hold_until, v.expected_by) << c.scenario;
        }
      }
    }
  }
}

// An anticipated session: `remaining` seconds left, expected back by 100 s + `ms`.
SessionView Back(SessionId id, uint64_t seq, double remaining, int64_t ms, int prio = 0) {
  SessionView v = S(id, seq);
  v.remaining_seconds = remaining;
  v.priority = prio;
  v.expected_by = seconds(100) + std::chrono::milliseconds(ms);
  return v;
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
                       // Two of undeclared length: the least served, so they share the lane.
                       {"undeclared: least served",
                        {[&] {
                           auto v = rem(1, 0, INFINITY);
                           v.total_service = seconds(5);
                           return v;
                         }(),
                         rem(2, 1, INFINITY)},
                        2},
                   });
}

TEST(SrtfPolicyTest, Anticipation) {
  auto rem = [](SessionId id, uint64_t seq, double r) {
    SessionView v = S(id, seq);
    v.remaining_seconds = r;
    return v;
  };
  const std::vector<Case> cases = {
      // The short job just replied and is expected back: the long one does not get the lane.
      {"shorter session expected back: hold", {rem(1, 0, 3600)}, 2, {Back(2, 1, 60, 2)}, true},
      // The session expected back is the longer one: run what is here.
      {"longer session expected back: run", {rem(1, 0, 60)}, 1, {Back(2, 1, 3600, 2)}, false},
      // Equal remaining time: ties go as in Pick (admission order), so no hold for a later one.
      {"tie: no hold for the later admitted", {rem(1, 0, 60)}, 1, {Back(2, 1, 60, 2)}, false},
      // Of several expected back, the shortest is the one held for.
      {"hold for the shortest expected",
       {rem(1, 0, 3600)},
       3,
       {Back(2, 1, 600, 2), Back(3, 2, 60, 1)},
       true},
      // A runnable session shorter than every anticipated one runs.
      {"runnable shortest: run", {rem(1, 0, 10)}, 1, {Back(2, 1, 60, 2)}, false},
  };
  RunTable("srtf", cases);
  RunTable("priority", cases);
}

TEST(PriorityPolicyTest, Table) {
  auto pr = [](SessionId id, uint64_t seq, int prio, double r) {
    SessionView v = S(id, seq);
    v.priority = prio;
    v.remaining_seconds = r;
    return v;
  };
  RunTable(
      "priority",
      {
          // Strict priority: the higher level runs, however long it is.
          {"higher level first", {pr(1, 0, 0, 1), pr(2, 1, 5, 3600)}, 2},
          // Within a level: shortest remaining time.
          {"srtf within a level", {pr(1, 0, 2, 600), pr(2, 1, 2, 60), pr(3, 2, 0, 1)}, 2},
          // Same level and remaining time: the earlier admitted.
          {"tie broken by admission", {pr(4, 5, 1, 60), pr(5, 2, 1, 60)}, 5},
          // A higher-priority session expected back holds a lower level's lane.
          {"higher level expected back: hold", {pr(1, 0, 0, 1)}, 2, {Back(2, 1, 3600, 2, 3)}, true},
          // A lower level expected back never holds a higher one.
          {"lower level expected back: run", {pr(1, 0, 3, 3600)}, 1, {Back(2, 1, 1, 2, 0)}, false},
      });
}

TEST(PolicyAnticipationTest, OnlySrtfAndPriorityHold) {
  const std::vector<SessionView> runnable = {S(1, 0)};
  std::vector<SessionView> back = {Back(2, 1, 0, 2, 5)};
  for (const std::string& name : PolicyNames()) {
    auto policy = CreatePolicy(name);
    ASSERT_TRUE(policy.ok()) << policy.status();
    const bool holds = name == "srtf" || name == "priority";
    EXPECT_EQ((*policy)->anticipation().max_hold, holds ? kDefaultMaxHold : Nanos(0)) << name;
    if (!holds) {
      // FAIR and PACK never hold, even when handed an anticipated session.
      EXPECT_FALSE((*policy)->Pick(LaneSnapshot{seconds(100), 1, runnable, back}).hold) << name;
    }
  }
}

TEST(PolicyAnticipationTest, Options) {
  auto srtf = CreatePolicy("srtf", {{"max_hold_ms", 5}, {"min_hold_ms", 1.5}});
  ASSERT_TRUE(srtf.ok()) << srtf.status();
  EXPECT_EQ((*srtf)->anticipation().max_hold, std::chrono::milliseconds(5));
  EXPECT_EQ((*srtf)->anticipation().min_hold, std::chrono::microseconds(1500));
  auto off = CreatePolicy("priority", {{"max_hold_ms", 0}});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ((*off)->anticipation().max_hold, Nanos(0));
  // Bad values are refused, naming the option.
  for (const nlohmann::json& bad :
       {nlohmann::json{{"max_hold_ms", -1}}, nlohmann::json{{"max_hold_ms", "2"}},
        nlohmann::json{{"min_hold_ms", 3}, {"max_hold_ms", 2}}}) {
    auto p = CreatePolicy("srtf", bad);
    ASSERT_FALSE(p.ok()) << bad.dump();
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("_hold_ms"), std::string::npos) << p.status();
  }
  // FAIR and PACK have no such option.
  EXPECT_FALSE(CreatePolicy("fair", {{"max_hold_ms", 2}}).ok());
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

TEST(PolicyRegistryTest, CreatesByNameWithAdmissionRules) {
  EXPECT_EQ(PolicyNames(), (std::vector<std::string>{"fifo", "srtf", "pack", "fair", "priority"}));
  EXPECT_EQ((*CreatePolicy("Priority"))->admission_rule(), SingleLaneRule());
  EXPECT_EQ((*CreatePolicy("fifo"))->admission_rule(), ExclusiveRule());
  EXPECT_EQ((*CreatePolicy("SRTF"))->admission_rule(), SingleLaneRule());
  EXPECT_EQ((*CreatePolicy("pack"))->admission_rule(), PackRule());
  EXPECT_EQ((*CreatePolicy("fair"))->admission_rule(), PackRule());
  EXPECT_EQ((*CreatePolicy("fair", {{"single_lane", true}}))->admission_rule(), SingleLaneRule());
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
