// The reference models (benchmarks/models/*.onnx, written by make_models.py) train on seeded
// synthetic data: each model's loss must fall at least 5x within a bounded number of steps.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "model_builder.h"

namespace salus::exec {
namespace {

using testing::Memory;
using testing::RunHost;

constexpr int64_t kBatch = 32;

std::string ReadModel(const std::string& name) {
  std::ifstream f(std::string(SALUS_MODELS_DIR) + "/" + name + ".onnx", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Inputs of one training step.
using Batch = std::function<std::vector<std::pair<std::string, HostTensor>>(int step)>;

struct Result {
  float initial = 0, final = 0;
  int steps = 0;
};

Result Train(const std::string& name, std::map<std::string, Shape> shapes,
             const OptimizerOptions& opt, int max_steps, const Batch& batch) {
  CompileOptions o;
  o.mode = Mode::kTraining;
  o.loss = "loss";
  o.optimizer = opt;
  o.input_shapes = std::move(shapes);
  o.profile = getenv("SALUS_EXEC_PROFILE") != nullptr;
  auto exe = Executable::Compile(ReadModel(name), o);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  Memory mem(**exe);
  Result r;
  for (int s = 0; s < max_steps; ++s) {
    auto named = batch(s);
    std::vector<HostTensor> feeds;
    for (const TensorInfo& info : (*exe)->inputs()) {
      for (auto& [n, t] : named) {
        if (n == info.name) feeds.push_back(t);
      }
    }
    auto out = RunHost(**exe, mem, feeds);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return r;
    const float loss = (*out)[0].floats()[0];
    EXPECT_TRUE(std::isfinite(loss));
    if (s == 0) r.initial = loss;
    r.final = loss;
    r.steps = s + 1;
    if (loss * 5 <= r.initial) break;
  }
  std::cout << "event: train " << name << " P=" << (*exe)->persistent_bytes()
            << " E=" << (*exe)->ephemeral_bytes() << " initial=" << r.initial
            << " final=" << r.final << " steps=" << r.steps << "\n";
  for (const auto& [op, sec] : (*exe)->Profile()) {
    if (o.profile) std::cout << "  " << op << " " << sec << " s\n";
  }
  return r;
}

// Ten classes, each a fixed random prototype plus noise; one fixed batch.
Batch Classification(Shape x_shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t per = NumElements(x_shape) / x_shape[0];
  std::vector<std::vector<float>> protos(10, std::vector<float>(per));
  for (auto& p : protos) {
    for (float& v : p) v = normal(rng);
  }
  HostTensor x(DataType::kFloat32, x_shape);
  HostTensor labels(DataType::kInt64, {x_shape[0]});
  for (int64_t i = 0; i < x_shape[0]; ++i) {
    const int64_t l = i % 10;
    labels.int64s()[i] = l;
    for (int64_t j = 0; j < per; ++j) x.floats()[i * per + j] = protos[l][j] + 0.5f * normal(rng);
  }
  return [x, labels](int) {
    return std::vector<std::pair<std::string, HostTensor>>{{"x", x}, {"labels", labels}};
  };
}

OptimizerOptions Sgd(float lr, float momentum) {
  OptimizerOptions o;
  o.learning_rate = lr;
  o.momentum = momentum;
  return o;
}

OptimizerOptions Adam(float lr) {
  OptimizerOptions o;
  o.kind = OptimizerOptions::Kind::kAdam;
  o.learning_rate = lr;
  return o;
}

TEST(ModelsTest, Mlp) {
  Result r = Train("mlp", {{"x", {kBatch, 784}}, {"labels", {kBatch}}}, Sgd(0.01f, 0.9f), 100,
                   Classification({kBatch, 784}, 1));
  EXPECT_LE(r.final * 5, r.initial);
}

TEST(ModelsTest, LeNet5) {
  Result r = Train("lenet5", {{"x", {kBatch, 1, 28, 28}}, {"labels", {kBatch}}}, Sgd(0.01f, 0.9f),
                   150, Classification({kBatch, 1, 28, 28}, 2));
  EXPECT_LE(r.final * 5, r.initial);
}

TEST(ModelsTest, ResNet) {
  Result r = Train("resnet", {{"x", {kBatch, 3, 32, 32}}, {"labels", {kBatch}}}, Adam(1e-3f), 150,
                   Classification({kBatch, 3, 32, 32}, 3));
  EXPECT_LE(r.final * 5, r.initial);
}

TEST(ModelsTest, Espcn) {
  // Smooth 48x48 images (sums of random sinusoids in [0, 1]); the input is their 3x3 average.
  constexpr int64_t kN = 8;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  HostTensor target(DataType::kFloat32, {kN, 1, 48, 48}), x(DataType::kFloat32, {kN, 1, 16, 16});
  for (int64_t n = 0; n < kN; ++n) {
    float fx[3], fy[3], ph[3];
    for (int k = 0; k < 3; ++k) {
      fx[k] = 0.05f + 0.2f * u(rng);
      fy[k] = 0.05f + 0.2f * u(rng);
      ph[k] = 6.28f * u(rng);
    }
    for (int i = 0; i < 48; ++i) {
      for (int j = 0; j < 48; ++j) {
        float v = 0;
        for (int k = 0; k < 3; ++k) v += std::sin(fx[k] * i + fy[k] * j + ph[k]);
        target.floats()[(n * 48 + i) * 48 + j] = 0.5f + v / 6.f;
      }
    }
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) {
        float s = 0;
        for (int a = 0; a < 3; ++a) {
          for (int b = 0; b < 3; ++b) s += target.floats()[(n * 48 + 3 * i + a) * 48 + 3 * j + b];
        }
        x.floats()[(n * 16 + i) * 16 + j] = s / 9.f;
      }
    }
  }
  Result r =
      Train("espcn", {{"x", {kN, 1, 16, 16}}, {"target", {kN, 1, 48, 48}}}, Adam(1e-3f), 300,
            [x, target](int) {
              return std::vector<std::pair<std::string, HostTensor>>{{"x", x}, {"target", target}};
            });
  EXPECT_LE(r.final * 5, r.initial);
}

TEST(ModelsTest, Vae) {
  // Data on a 5-dimensional manifold: x = sigmoid(A z); fresh noise eps every step.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> a(784 * 5);
  for (float& v : a) v = 2.f * normal(rng);
  HostTensor x(DataType::kFloat32, {kBatch, 784});
  for (int64_t i = 0; i < kBatch; ++i) {
    float z[5];
    for (float& v : z) v = normal(rng);
    for (int64_t j = 0; j < 784; ++j) {
      float s = 0;
      for (int k = 0; k < 5; ++k) s += a[j * 5 + k] * z[k];
      x.floats()[i * 784 + j] = 1.f / (1.f + std::exp(-s));
    }
  }
  auto noise = std::make_shared<std::mt19937>(6);
  Result r = Train("vae", {{"x", {kBatch, 784}}, {"eps", {kBatch, 20}}}, Adam(1e-3f), 400,
                   [x, noise](int) {
                     std::normal_distribution<float> n01(0.f, 1.f);
                     HostTensor eps(DataType::kFloat32, {kBatch, 20});
                     for (int64_t i = 0; i < eps.num_elements(); ++i) eps.floats()[i] = n01(*noise);
                     return std::vector<std::pair<std::string, HostTensor>>{{"x", x}, {"eps", eps}};
                   });
  EXPECT_LE(r.final * 5, r.initial);
}

}  // namespace
}  // namespace salus::exec
