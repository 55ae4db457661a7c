// The swap planner on synthetic lifetimes (its points, its schedules, its split plans), and
// the executable running the reference models at the planner's lowest E: the same losses and
// the same trained state, bit for bit, in a smaller lane.
#include "exec/swap_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "model_builder.h"

namespace salus::exec {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A chain of n forward steps and n backward steps, the shape of a plain network's training
// iteration. Forward step i reads a[i-1] (the fed input x for i = 0) and defines a[i];
// backward step n + j reads g[j-1] (a[n-1], the loss, for j = 0) and the forward input of
// forward step n-1-j, and defines g[j]. Buffers: x, a[0..n), g[0..n).
SwapProblem Chain(int n, uint64_t activation_bytes, double step_seconds, double bandwidth) {
  SwapProblem p;
  p.backward.assign(2 * n, false);
  for (int s = n; s < 2 * n; ++s) p.backward[s] = true;
  p.step_seconds.assign(2 * n, step_seconds);
  p.bandwidth = bandwidth;
  // x: fed, read by forward step 0 and by the last backward step.
  p.buffers.push_back({{activation_bytes, -1, 2 * n - 1}, {0, 2 * n - 1}, true});
  for (int i = 0; i < n; ++i) {
    SwapBuffer a{{activation_bytes, i, i}, {}, true};
    if (i + 1 < n) a.uses.push_back(i + 1);
    a.uses.push_back(i == n - 1 ? n : 2 * n - 2 - i);
    a.lifetime.last = a.uses.back();
    p.buffers.push_back(a);
  }
  for (int j = 0; j < n; ++j) {
    SwapBuffer g{{activation_bytes, n + j, n + j}, {}, true};
    if (j + 1 < n) g.uses = {n + j + 1};
    if (!g.uses.empty()) g.lifetime.last = g.uses.back();
    p.buffers.push_back(g);
  }
  return p;
}

// A problem of random buffers: each defined at a random step (or fed), read at a few later
// ones; a random cut between forward and backward steps.
SwapProblem RandomProblem(uint32_t seed) {
  std::mt19937 rng(seed);
  const int num_steps = std::uniform_int_distribution<int>(4, 40)(rng);
  const int cut = std::uniform_int_distribution<int>(1, num_steps - 1)(rng);
  SwapProblem p;
  for (int s = 0; s < num_steps; ++s) p.backward.push_back(s >= cut);
  std::uniform_real_distribution<double> seconds(1e-4, 2e-3);
  for (int s = 0; s < num_steps; ++s) p.step_seconds.push_back(seconds(rng));
  p.bandwidth = std::uniform_real_distribution<double>(1e8, 1e10)(rng);
  const int num_buffers = std::uniform_int_distribution<int>(1, 60)(rng);
  for (int b = 0; b < num_buffers; ++b) {
    SwapBuffer buf;
    buf.lifetime.size = std::uniform_int_distribution<uint64_t>(1, 4 * kMiB)(rng);
    buf.lifetime.first = std::uniform_int_distribution<int>(-1, num_steps - 1)(rng);
    const int reads = std::uniform_int_distribution<int>(0, 4)(rng);
    for (int r = 0; r < reads && buf.lifetime.first + 1 < num_steps; ++r) {
      buf.uses.push_back(std::uniform_int_distribution<int>(std::max(buf.lifetime.first + 1, 0),
                                                            num_steps - 1)(rng));
    }
    std::sort(buf.uses.begin(), buf.uses.end());
    buf.uses.erase(std::unique(buf.uses.begin(), buf.uses.end()), buf.uses.end());
    buf.lifetime.last = buf.uses.empty() ? buf.lifetime.first : buf.uses.back();
    buf.swappable = std::uniform_int_distribution<int>(0, 9)(rng) != 0;
    p.buffers.push_back(buf);
  }
  return p;
}

// Everything a point promises: its schedule is well formed, a swapped buffer is read by no
// step while it is away, no two buffers live at one step share a byte, and E is the plan's
// peak.
void CheckPoint(const SwapProblem& p, const SwapPoint& point) {
  uint64_t host = 0;
  for (const Swap& s : point.swaps) {
    const SwapBuffer& b = p.buffers[s.buffer];
    SCOPED_TRACE("swap of buffer " + std::to_string(s.buffer));
    EXPECT_TRUE(b.swappable);
    EXPECT_EQ(s.out_done, s.out + 2);
    EXPECT_GE(s.in_issue, s.out + 3);
    EXPECT_LE(s.in_issue, s.in);
    EXPECT_GE(s.out, b.lifetime.first);
    for (int u : b.uses) EXPECT_TRUE(u <= s.out || u >= s.in) << "read at step " << u;
    EXPECT_TRUE(std::binary_search(b.uses.begin(), b.uses.end(), s.in));
    EXPECT_EQ(s.host_offset, host);
    host += AlignUp(b.lifetime.size);
  }
  EXPECT_EQ(point.host_bytes, host);
  const std::vector<PlannedBuffer> split = SwapPlanner::SplitLifetimes(p, point.swaps);
  ASSERT_EQ(point.plan.offsets.size(), split.size());
  uint64_t peak = 0;
  for (size_t i = 0; i < split.size(); ++i) {
    if (split[i].size == 0) continue;
    const uint64_t end_i = point.plan.offsets[i] + AlignUp(split[i].size);
    peak = std::max(peak, end_i);
    EXPECT_EQ(point.plan.offsets[i] % kAlignment, 0u);
    for (size_t j = i + 1; j < split.size(); ++j) {
      if (split[j].size == 0) continue;
      const bool live_together = split[i].first <= split[j].last && split[j].first <= split[i].last;
      const uint64_t end_j = point.plan.offsets[j] + AlignUp(split[j].size);
      const bool share_bytes = point.plan.offsets[i] < end_j && point.plan.offsets[j] < end_i;
      EXPECT_FALSE(live_together && share_bytes) << "buffers " << i << " and " << j;
    }
  }
  EXPECT_EQ(point.ephemeral_bytes, peak);
  EXPECT_DOUBLE_EQ(point.expected_seconds, SwapPlanner::ExpectedSeconds(p, point.swaps));
}

void CheckPoints(const SwapProblem& p, const std::vector<SwapPoint>& points, size_t max_points) {
  ASSERT_FALSE(points.empty());
  EXPECT_LE(points.size(), max_points);
  EXPECT_TRUE(points.front().swaps.empty());
  for (size_t i = 0; i < points.size(); ++i) {
    SCOPED_TRACE("point " + std::to_string(i));
    CheckPoint(p, points[i]);
    if (i == 0) continue;
    EXPECT_LT(points[i].ephemeral_bytes, points[i - 1].ephemeral_bytes);
    // Each point saves at least 1% (SwapPlannerOptions::min_saving) of the unswapped E.
    EXPECT_LE(points[i].ephemeral_bytes + points[0].ephemeral_bytes / 100,
              points[i - 1].ephemeral_bytes);
    EXPECT_GT(points[i].expected_seconds, points[i - 1].expected_seconds);
    EXPECT_FALSE(points[i].swaps.empty());
  }
}

TEST(SwapPlannerTest, ChainOffersFallingE) {
  // 8 forward steps of 1 MiB activations: the backward pass needs them all at its start.
  const SwapProblem p = Chain(8, kMiB, 1e-3, 4e9);
  const std::vector<SwapPoint> points = SwapPlanner::Plan(p);
  CheckPoints(p, points, 5);
  ASSERT_GE(points.size(), 3u);
  // Unswapped, a[0..7] and x are live at step 8 with g[0]: 10 MiB. Swapping leaves little
  // more than the frontier of the two passes.
  EXPECT_GE(points.front().ephemeral_bytes, 10 * kMiB);
  EXPECT_LE(points.back().ephemeral_bytes, points.front().ephemeral_bytes / 2);
}

TEST(SwapPlannerTest, MaxPointsIsRespected) {
  const SwapProblem p = Chain(24, kMiB, 1e-3, 4e9);
  for (size_t max_points : {2u, 3u, 6u}) {
    SCOPED_TRACE("max_points " + std::to_string(max_points));
    const std::vector<SwapPoint> points = SwapPlanner::Plan(p, {max_points});
    CheckPoints(p, points, max_points);
    EXPECT_EQ(points.size(), max_points);
  }
}

TEST(SwapPlannerTest, NothingToSwap) {
  // A plain forward chain: every buffer is read by the next step only, no gap to swap in.
  SwapProblem p;
  p.backward.assign(8, false);
  p.step_seconds.assign(8, 1e-3);
  p.bandwidth = 4e9;
  for (int s = 0; s + 1 < 8; ++s) p.buffers.push_back({{kMiB, s, s + 1}, {s + 1}, true});
  std::vector<SwapPoint> points = SwapPlanner::Plan(p);
  ASSERT_EQ(points.size(), 1u);
  CheckPoint(p, points[0]);
  // Nothing swappable: scratch and fetches only.
  p = Chain(6, kMiB, 1e-3, 4e9);
  for (SwapBuffer& b : p.buffers) b.swappable = false;
  points = SwapPlanner::Plan(p);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_TRUE(points[0].swaps.empty());
}

TEST(SwapPlannerTest, CandidatesNeedAFreeStep) {
  // A buffer read again right after the pass turns cannot be away for a whole step.
  SwapProblem p;
  p.backward = {false, false, true, true, true};
  p.step_seconds.assign(5, 1e-3);
  p.bandwidth = 1e9;
  p.buffers.push_back({{kMiB, 0, 2}, {1, 2}, true});  // out 1, in 2
  p.buffers.push_back({{kMiB, 0, 4}, {1, 3}, true});  // out 1, in 3: one step short
  p.buffers.push_back({{kMiB, 0, 4}, {4}, true});     // out 0, in 4: swappable
  p.buffers.push_back({{kMiB, 2, 4}, {4}, true});     // defined in the backward pass: too close
  Swap s;
  EXPECT_FALSE(SwapPlanner::MakeSwap(p, 0, true, &s));
  EXPECT_FALSE(SwapPlanner::MakeSwap(p, 1, true, &s));
  ASSERT_TRUE(SwapPlanner::MakeSwap(p, 2, true, &s));
  EXPECT_EQ(s.out, 0);
  EXPECT_EQ(s.out_done, 2);
  EXPECT_EQ(s.in, 4);
  // The copy back takes 1.05 ms: issued before step 3 it would be 0.05 ms late, so it is
  // issued before step 3 anyway, the earliest a free step allows.
  EXPECT_EQ(s.in_issue, 3);
  EXPECT_FALSE(SwapPlanner::MakeSwap(p, 3, true, &s));
}

TEST(SwapPlannerTest, CopyBackIsIssuedAsLateAsHidesIt) {
  SwapProblem p;
  p.backward = {false, false, false, false, false, false, true, true};
  p.step_seconds.assign(8, 1e-3);
  p.bandwidth = 1e9;                                    // 1 MB: 1 ms
  p.buffers.push_back({{1'500'000, 0, 7}, {7}, true});  // 1.5 ms: two steps hide it
  Swap s;
  ASSERT_TRUE(SwapPlanner::MakeSwap(p, 0, true, &s));
  EXPECT_EQ(s.in, 7);
  EXPECT_EQ(s.in_issue, 5);
  // Just in time: issued right before the read, the region lives shortest.
  ASSERT_TRUE(SwapPlanner::MakeSwap(p, 0, false, &s));
  EXPECT_EQ(s.in_issue, 7);
}

TEST(SwapPlannerTest, WithoutOverlapCopiesBlockTheSteps) {
  SwapProblem p;
  p.backward = {false, false, false, false, false, false, true, true};
  p.step_seconds.assign(8, 1e-3);
  p.bandwidth = 1e9;
  p.overlap = false;
  p.buffers.push_back({{1'500'000, 0, 7}, {7}, true});
  Swap s;
  ASSERT_TRUE(SwapPlanner::MakeSwap(p, 0, true, &s));
  EXPECT_EQ(s.in_issue, 7);  // right before the read: nothing to hide it behind
  // Eight steps and two copies of 1.5 ms, one after another.
  EXPECT_NEAR(SwapPlanner::ExpectedSeconds(p, {s}), 8e-3 + 3e-3, 1e-12);
  SwapProblem chain = Chain(8, kMiB, 1e-3, 4e9);
  chain.overlap = false;
  CheckPoints(chain, SwapPlanner::Plan(chain), 5);
}

TEST(SwapPlannerTest, ExpectedSecondsSerializesCopies) {
  struct Case {
    const char* scenario;
    double bandwidth;
    std::vector<Swap> swaps;
    double expected;
  };
  // Six steps of 1 ms, two forward buffers of 1 MB read again at step 5.
  SwapProblem p;
  p.backward = {false, false, false, true, true, true};
  p.step_seconds.assign(6, 1e-3);
  p.buffers.push_back({{1'000'000, 0, 5}, {5}, true});
  p.buffers.push_back({{1'000'000, 0, 5}, {5}, true});
  const double issue = kSwapIssueSeconds;
  const std::vector<Case> cases = {
      // No swaps: the steps alone.
      {"none", 1e9, {}, 6e-3},
      // One round trip of 1 ms each way, both hidden behind a step.
      {"one hidden", 1e9, {{0, 0, 2, 4, 5, 0}}, 6e-3 + 2 * issue},
      // Two copies out queue on the one path after step 0: the second is over at 3 ms, so
      // step 2 waits for it from 2 ms (the issues of both vanish in the wait) and ends at
      // 4 ms; the copies back, issued before steps 3 and 4, end at 5 ms and 6 ms + an issue,
      // within steps 3 and 4 (each 1 ms + an issue); step 5 ends at 7 ms + two issues.
      {"two queued", 1e9, {{0, 0, 2, 3, 5, 0}, {1, 0, 2, 4, 5, 1}}, 7e-3 + 2 * issue},
      // A slow path: each copy takes 4 ms. The copy out, issued at 1 ms, ends at 5 ms: step 2
      // waits for it and ends at 6 ms; the copy back, issued at 7 ms before step 4, ends at
      // 11 ms: step 5 waits for it and ends at 12 ms.
      {"slow path", 2.5e8, {{0, 0, 2, 4, 5, 0}}, 12e-3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    p.bandwidth = c.bandwidth;
    EXPECT_NEAR(SwapPlanner::ExpectedSeconds(p, c.swaps), c.expected, 1e-9);
  }
}

TEST(SwapPlannerTest, RandomProblemsKeepTheirPromises) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const SwapProblem p = RandomProblem(seed);
    const size_t max_points = 2 + seed % 5;
    CheckPoints(p, SwapPlanner::Plan(p, {max_points}), max_points);
    if (::testing::Test::HasFailure()) break;
  }
}

// ---- The executable at the planner's points -------------------------------------------------

std::string ReadModel(const std::string& name) {
  std::ifstream f(std::string(SALUS_MODELS_DIR) + "/" + name + ".onnx", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Host memory for one CPU executable with guard bytes around the lane, which must hold
// exactly ephemeral_bytes(): a plan that reached past E would overwrite them.
struct GuardedMemory {
  static constexpr size_t kGuard = 4096;
  static constexpr std::byte kPattern{0x5a};
  explicit GuardedMemory(const Executable& exe)
      : persistent(exe.persistent_bytes() + kAlignment),
        lane(exe.ephemeral_bytes() + 2 * kGuard + kAlignment, kPattern),
        lane_bytes(exe.ephemeral_bytes()) {
    Status st = exe.InitializePersistent(p());
    if (!st.ok()) ADD_FAILURE() << st.ToString();
  }
  std::byte* p() { return testing::Memory::Align(persistent); }
  std::byte* l() { return testing::Memory::Align(lane) + kGuard; }
  bool GuardsIntact() {
    for (size_t i = 0; i < kGuard; ++i) {
      if (l()[-1 - static_cast<ptrdiff_t>(i)] != kPattern || l()[lane_bytes + i] != kPattern) {
        return false;
      }
    }
    return true;
  }
  std::vector<std::byte> persistent, lane;
  size_t lane_bytes;
};

struct ModelCase {
  std::string name;
  std::map<std::string, Shape> shapes;
};

// Seeded feeds for one step: floats in [0, 1), int64 labels of 10 classes.
std::vector<HostTensor> Feeds(const Executable& exe, int step) {
  std::mt19937 rng(1000 + step);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<HostTensor> feeds;
  for (const TensorInfo& info : exe.inputs()) {
    HostTensor t(info.type, info.shape);
    if (info.type == DataType::kInt64) {
      for (int64_t i = 0; i < t.num_elements(); ++i) t.int64s()[i] = i % 10;
    } else {
      for (int64_t i = 0; i < t.num_elements(); ++i) t.floats()[i] = u(rng);
    }
    feeds.push_back(std::move(t));
  }
  return feeds;
}

StatusOr<std::unique_ptr<Executable>> CompileTraining(const ModelCase& m,
                                                      uint64_t max_ephemeral_bytes = 0,
                                                      SwapCopies copies = SwapCopies::kThread) {
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer.kind = OptimizerOptions::Kind::kAdam;
  o.optimizer.learning_rate = 1e-3f;
  o.input_shapes = m.shapes;
  o.max_ephemeral_bytes = max_ephemeral_bytes;
  o.swap_copies = copies;
  return Executable::Compile(ReadModel(m.name), o);
}

class SwapModelsTest : public ::testing::TestWithParam<std::tuple<ModelCase, SwapCopies>> {};

// Trains the model a few steps unswapped and at the lowest E offered, side by side: the
// losses and the whole persistent state (weights, Adam's moments) stay bit-identical.
TEST_P(SwapModelsTest, LowestPointTrainsBitIdentically) {
  constexpr int kSteps = 3;
  const auto& [m, copies] = GetParam();
  auto plain = CompileTraining(m);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto swapped = CompileTraining(m, 0, copies);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  const std::vector<SwapPoint>& points = (*swapped)->SwapPoints();
  ASSERT_GE(points.size(), 2u) << "nothing to swap in " << m.name;
  ASSERT_TRUE((*swapped)->SelectSwapPoint(points.size() - 1).ok());
  EXPECT_EQ((*swapped)->selected_swap_point(), points.size() - 1);
  EXPECT_EQ((*swapped)->ephemeral_bytes(), points.back().ephemeral_bytes);
  EXPECT_LT((*swapped)->ephemeral_bytes(), (*plain)->ephemeral_bytes());
  EXPECT_EQ((*plain)->ephemeral_bytes(), points.front().ephemeral_bytes);
  std::cout << "event: swap " << m.name << " E=" << (*plain)->ephemeral_bytes() << " -> "
            << (*swapped)->ephemeral_bytes() << " swaps=" << points.back().swaps.size()
            << " points=" << points.size() << "\n";

  GuardedMemory plain_mem(**plain), swapped_mem(**swapped);
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<HostTensor> feeds = Feeds(**plain, step);
    std::vector<const void*> in;
    for (const HostTensor& f : feeds) in.push_back(f.bytes.data());
    float plain_loss = 0, swapped_loss = 1;
    std::vector<void*> out{&plain_loss};
    ASSERT_TRUE((*plain)->Run(plain_mem.p(), plain_mem.l(), in, out).ok());
    out = {&swapped_loss};
    Status st = (*swapped)->Run(swapped_mem.p(), swapped_mem.l(), in, out);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(std::memcmp(&plain_loss, &swapped_loss, sizeof(float)), 0)
        << "step " << step << ": " << plain_loss << " vs " << swapped_loss;
    EXPECT_TRUE(swapped_mem.GuardsIntact()) << "step " << step;
  }
  EXPECT_EQ(std::memcmp(plain_mem.p(), swapped_mem.p(), (*plain)->persistent_bytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    ReferenceModels, SwapModelsTest,
    ::testing::Combine(
        ::testing::Values(ModelCase{"mlp", {{"x", {8, 784}}, {"labels", {8}}}},
                          ModelCase{"lenet5", {{"x", {8, 1, 28, 28}}, {"labels", {8}}}},
                          ModelCase{"resnet", {{"x", {8, 3, 32, 32}}, {"labels", {8}}}},
                          ModelCase{"espcn", {{"x", {4, 1, 16, 16}}, {"target", {4, 1, 48, 48}}}},
                          ModelCase{"vae", {{"x", {8, 784}}, {"eps", {8, 20}}}}),
        ::testing::Values(SwapCopies::kThread, SwapCopies::kInline)),
    [](const ::testing::TestParamInfo<std::tuple<ModelCase, SwapCopies>>& info) {
      return std::get<0>(info.param).name +
             (std::get<1>(info.param) == SwapCopies::kThread ? "_thread" : "_inline");
    });

// Four sessions train at once, each at its lowest point, their copies all on the device's one
// copy path (Note [Shared copy path]): each gets the losses it gets training alone, unswapped.
TEST(SwapExecutableTest, ConcurrentJobsShareTheCopyPath) {
  constexpr int kJobs = 4, kSteps = 3;
  const ModelCase m{"mlp", {{"x", {8, 784}}, {"labels", {8}}}};
  auto plain = CompileTraining(m);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::vector<float> expected;
  {
    GuardedMemory mem(**plain);
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<HostTensor> feeds = Feeds(**plain, step);
      std::vector<const void*> in;
      for (const HostTensor& f : feeds) in.push_back(f.bytes.data());
      float loss = 0;
      std::vector<void*> out{&loss};
      ASSERT_TRUE((*plain)->Run(mem.p(), mem.l(), in, out).ok());
      expected.push_back(loss);
    }
  }
  std::vector<std::unique_ptr<Executable>> jobs;
  for (int j = 0; j < kJobs; ++j) {
    auto x = CompileTraining(m, 0, SwapCopies::kThread);
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_TRUE((*x)->SelectSwapPoint((*x)->SwapPoints().size() - 1).ok());
    jobs.push_back(std::move(*x));
  }
  std::vector<std::vector<float>> got(kJobs);
  std::vector<std::thread> threads;
  for (int j = 0; j < kJobs; ++j) {
    threads.emplace_back([&, j] {
      GuardedMemory mem(*jobs[j]);
      for (int step = 0; step < kSteps; ++step) {
        const std::vector<HostTensor> feeds = Feeds(*jobs[j], step);
        std::vector<const void*> in;
        for (const HostTensor& f : feeds) in.push_back(f.bytes.data());
        float loss = 0;
        std::vector<void*> out{&loss};
        if (!jobs[j]->Run(mem.p(), mem.l(), in, out).ok()) return;
        got[j].push_back(loss);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int j = 0; j < kJobs; ++j) EXPECT_EQ(got[j], expected) << "job " << j;
}

TEST(SwapExecutableTest, EveryPointOfOneModelMatches) {
  const ModelCase m{"lenet5", {{"x", {8, 1, 28, 28}}, {"labels", {8}}}};
  auto exe = CompileTraining(m);
  ASSERT_TRUE(exe.ok()) << exe.status();
  const size_t num_points = (*exe)->SwapPoints().size();
  ASSERT_GE(num_points, 2u);
  std::vector<float> losses;
  std::vector<std::byte> first_state;
  for (size_t i = 0; i < num_points; ++i) {
    SCOPED_TRACE("point " + std::to_string(i));
    ASSERT_TRUE((*exe)->SelectSwapPoint(i).ok());
    GuardedMemory mem(**exe);  // the initial state again
    for (int step = 0; step < 2; ++step) {
      const std::vector<HostTensor> feeds = Feeds(**exe, step);
      std::vector<const void*> in;
      for (const HostTensor& f : feeds) in.push_back(f.bytes.data());
      float loss = 0;
      std::vector<void*> out{&loss};
      Status st = (*exe)->Run(mem.p(), mem.l(), in, out);
      ASSERT_TRUE(st.ok()) << st;
      if (i == 0) {
        losses.push_back(loss);
      } else {
        EXPECT_EQ(std::memcmp(&loss, &losses[step], sizeof(float)), 0) << "step " << step;
      }
    }
    EXPECT_TRUE(mem.GuardsIntact());
    std::vector<std::byte> state(mem.p(), mem.p() + (*exe)->persistent_bytes());
    if (i == 0) {
      first_state = state;
    } else {
      EXPECT_TRUE(state == first_state);
    }
  }
}

TEST(SwapExecutableTest, MaxEphemeralBytesPicksTheFastestFit) {
  const ModelCase m{"mlp", {{"x", {8, 784}}, {"labels", {8}}}};
  auto plain = CompileTraining(m);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<SwapPoint>& points = (*plain)->SwapPoints();
  ASSERT_GE(points.size(), 2u);
  // Just below the first point's E: the second point, the fastest that fits.
  auto fit = CompileTraining(m, points[0].ephemeral_bytes - 1);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ((*fit)->selected_swap_point(), 1u);
  EXPECT_EQ((*fit)->ephemeral_bytes(), points[1].ephemeral_bytes);
  // A limit above E swaps nothing.
  auto roomy = CompileTraining(m, points[0].ephemeral_bytes);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ((*roomy)->selected_swap_point(), 0u);
  // Below every point: refused.
  auto tight = CompileTraining(m, points.back().ephemeral_bytes - 1);
  ASSERT_FALSE(tight.ok());
  EXPECT_EQ(tight.status().code(), StatusCode::kResourceExhausted) << tight.status();
  // No such point.
  EXPECT_EQ((*plain)->SelectSwapPoint(points.size()).code(), StatusCode::kInvalidArgument);
}

TEST(SwapExecutableTest, ReplanWithMeasuredTimesStillMatches) {
  const ModelCase m{"mlp", {{"x", {8, 784}}, {"labels", {8}}}};
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.input_shapes = m.shapes;
  o.profile = true;
  auto exe = Executable::Compile(ReadModel(m.name), o);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto plain = Executable::Compile(ReadModel(m.name), o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  testing::Memory warm(**exe);
  ASSERT_TRUE(testing::RunHost(**exe, warm, Feeds(**exe, 0)).ok());
  ASSERT_TRUE((*exe)->ReplanSwaps().ok());
  const std::vector<SwapPoint>& points = (*exe)->SwapPoints();
  ASSERT_GE(points.size(), 2u);
  ASSERT_TRUE((*exe)->SelectSwapPoint(points.size() - 1).ok());
  GuardedMemory mem(**exe), plain_mem(**plain);
  for (int step = 0; step < 2; ++step) {
    const std::vector<HostTensor> feeds = Feeds(**exe, step);
    std::vector<const void*> in;
    for (const HostTensor& f : feeds) in.push_back(f.bytes.data());
    float loss = 0, plain_loss = 1;
    std::vector<void*> out{&loss};
    ASSERT_TRUE((*exe)->Run(mem.p(), mem.l(), in, out).ok());
    out = {&plain_loss};
    ASSERT_TRUE((*plain)->Run(plain_mem.p(), plain_mem.l(), in, out).ok());
    EXPECT_EQ(std::memcmp(&loss, &plain_loss, sizeof(float)), 0) << "step " << step;
  }
  EXPECT_TRUE(mem.GuardsIntact());
}

TEST(SwapExecutableTest, InferenceHasOnePoint) {
  CompileOptions o;
  o.input_shapes = {{"x", {4, 784}}, {"labels", {4}}};
  o.fetches = {"loss"};
  auto exe = Executable::Compile(ReadModel("mlp"), o);
  ASSERT_TRUE(exe.ok()) << exe.status();
  ASSERT_EQ((*exe)->SwapPoints().size(), 1u);
  EXPECT_TRUE((*exe)->SwapPoints()[0].swaps.empty());
  EXPECT_EQ((*exe)->SwapPoints()[0].ephemeral_bytes, (*exe)->ephemeral_bytes());
}

}  // namespace
}  // namespace salus::exec
