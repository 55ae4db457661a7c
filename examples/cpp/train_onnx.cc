// The C++ client: trains an ONNX classifier in salus-server for a few steps.
//
//   build/bin/salus-example-train-onnx [MODEL.onnx] [STEPS]
//
// MODEL has inputs x [64, 784] (float) and labels [64] (int64) and an output "loss", as
// benchmarks/models/mlp.onnx does (the default). The daemon is the one every client finds: an
// empty endpoint means $SALUS_ENDPOINT, a local daemon's ipc socket, or tcp://127.0.0.1:5501.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "salus/client.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

int Fail(const salus::Status& s) {
  std::fprintf(stderr, "train_onnx: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : SALUS_EXAMPLE_MODEL;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 50;
  constexpr int64_t kBatch = 64, kFeatures = 784, kClasses = 10;

  auto client = salus::client::Client::Connect("");
  if (!client.ok()) return Fail(client.status());
  std::printf("salus-server %s, device %s\n", (*client)->server().server_version.c_str(),
              (*client)->server().device.c_str());

  salus::client::SessionOptions o;
  o.model = ReadFile(model);
  if (o.model.empty()) {
    std::fprintf(stderr, "train_onnx: cannot read %s\n", model.c_str());
    return 2;
  }
  o.mode = salus::client::Mode::kTrain;
  o.inputs = {{"x", {kBatch, kFeatures}}, {"labels", {kBatch}}};
  o.loss = "loss";
  o.optimizer.lr = 0.01;
  o.name = "cpp-example";
  auto session = (*client)->CreateSession(o);
  if (!session.ok()) return Fail(session.status());

  // Ten classes, each a noisy copy of its prototype.
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int64_t> label(0, kClasses - 1);
  std::vector<float> prototypes(kClasses * kFeatures);
  for (float& v : prototypes) v = normal(rng);
  for (int step = 0; step < steps; ++step) {
    std::vector<float> x(kBatch * kFeatures);
    std::vector<int64_t> labels(kBatch);
    for (int64_t i = 0; i < kBatch; ++i) {
      labels[i] = label(rng);
      for (int64_t j = 0; j < kFeatures; ++j) {
        x[i * kFeatures + j] = prototypes[labels[i] * kFeatures + j] + normal(rng);
      }
    }
    auto out = (*session)->Run({salus::client::Tensor::Floats("x", {kBatch, kFeatures}, x),
                                salus::client::Tensor::Int64s("labels", {kBatch}, labels)},
                               {"loss"});
    if (!out.ok()) return Fail(out.status());
    if (step % 10 == 0 || step == steps - 1) {
      std::printf("step %4d  loss %.4f\n", step, out->at("loss").floats()[0]);
    }
  }
  return 0;
}
