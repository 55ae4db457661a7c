// daemon_bench: what the daemon costs, measured against a real salus-server process.
//
//   build/benchmarks/daemon_bench [--server build/bin/salus-server] [--models benchmarks/models]
//                                 [--device cpu|cuda:N] [--json FILE]
//
// Every daemon it starts runs on --device, and the in-process runs of part 2 use it too.
//
// 1. round trip of an empty iteration (a synthetic session with P = E = 0 and no work) over
//    ipc and over tcp;
// 2. per-iteration time of a model calibrated to take about 10 ms, through the daemon versus
//    the same executable run in this process, measured in alternating blocks so both see the
//    same machine load;
// 3. the switch gap between two sessions sharing one lane (FAIR, single lane), each always
//    with an iteration queued: synthetic sessions (P = E = 1 MiB, 2 ms of sleep), then two
//    training sessions of the MLP (batch 64) whose iterations run on the device;
// 4. the daemon's resident memory with 500 idle sessions.
// Medians (and p90) are reported; the machine is shared, so only side-by-side ratios count.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/openmp_env.h"
#include "exec/executable.h"
#include "salus/client.h"
#include "salus/v1/salus.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
using salus::client::Client;
using salus::client::SessionOptions;
using salus::client::Tensor;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

class Daemon {
 public:
  Daemon(const std::string& server, const salus::exec::Device& device,
         const std::vector<std::string>& args) {
    dir_ = std::filesystem::temp_directory_path() / ("salus-bench-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    ipc_ = "ipc://" + (dir_ / "s.sock").string();
    tcp_ = "tcp://127.0.0.1:" + std::to_string(20000 + getpid() % 20000);
    std::vector<std::string> argv = {server,        "--listen", ipc_,       "--listen",   tcp_,
                                     "--log-level", "warn",     "--device", device.name()};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    for (int i = 0; i < 100; ++i) {
      Client::Options o;
      o.timeout = std::chrono::milliseconds(200);
      if (Client::Connect(ipc_, o).ok()) return;
    }
    std::fprintf(stderr, "daemon_bench: salus-server did not come up\n");
    std::exit(1);
  }
  ~Daemon() {
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    std::filesystem::remove_all(dir_);
  }
  const std::string& ipc() const { return ipc_; }
  const std::string& tcp() const { return tcp_; }
  // VmRSS of the daemon, bytes.
  uint64_t Rss() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    }
    return 0;
  }

 private:
  std::filesystem::path dir_;
  std::string ipc_, tcp_;
  pid_t pid_ = -1;
};

std::unique_ptr<Client> MustConnect(const std::string& ep, Client::Options o = {}) {
  auto c = Client::Connect(ep, o);
  if (!c.ok()) {
    std::fprintf(stderr, "daemon_bench: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*c);
}

template <typename T>
T Must(salus::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "daemon_bench: %s\n", v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*v);
}

void Must(const salus::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "daemon_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

nlohmann::json RoundTrip(const Daemon& d) {
  nlohmann::json out;
  for (const auto& [name, ep] : {std::pair{"ipc", d.ipc()}, std::pair{"tcp", d.tcp()}}) {
    auto c = MustConnect(ep);
    SessionOptions o;
    o.synthetic = salus::client::Synthetic{0, 0, 0};
    auto s = Must(c->CreateSession(o));
    std::vector<double> us, queue_us;
    for (int i = 0; i < 3000; ++i) {
      const auto t0 = Clock::now();
      Must(s->Run());
      if (i >= 200) {
        us.push_back(Ms(Clock::now() - t0) * 1e3);
        queue_us.push_back(s->last_stats().queue_delay_us);
      }
    }
    out[name] = {{"median_us", Percentile(us, 0.5)},
                 {"p90_us", Percentile(us, 0.9)},
                 {"queue_delay_median_us", Percentile(queue_us, 0.5)},
                 {"samples", us.size()}};
    std::printf(
        "round trip, empty iteration, %s: median %.1f us, p90 %.1f us (of which %.1f us from "
        "the request's arrival at the scheduler to the iteration's start)\n",
        name, Percentile(us, 0.5), Percentile(us, 0.9), Percentile(queue_us, 0.5));
  }
  return out;
}

// A request the daemon's I/O thread answers itself (a Heartbeat): the round trip without a
// lane worker, sent from a bare DEALER so no client library is involved either.
// Times 3,000 request/reply round trips of `payload` on `dealer` (the first 200 warm up) and
// prints them under `label`.
nlohmann::json TimeDealer(zmq::socket_t& dealer, const std::string& payload, const char* label) {
  std::vector<double> us;
  for (int i = 0; i < 3000; ++i) {
    const auto t0 = Clock::now();
    dealer.send(zmq::buffer(payload));
    zmq::message_t reply;
    if (!dealer.recv(reply)) break;
    if (i >= 200) us.push_back(Ms(Clock::now() - t0) * 1e3);
  }
  std::printf("%s: median %.1f us, p90 %.1f us\n", label, Percentile(us, 0.5), Percentile(us, 0.9));
  return {{"median_us", Percentile(us, 0.5)}, {"p90_us", Percentile(us, 0.9)}};
}

nlohmann::json HeartbeatRoundTrip(const Daemon& d) {
  zmq::context_t ctx(1);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(d.ipc());
  salus::v1::Request req;
  req.set_request_id(1);
  req.mutable_heartbeat();
  return TimeDealer(dealer, req.SerializeAsString(),
                    "round trip, heartbeat (answered by the I/O thread), ipc");
}

struct ModelRun {
  std::unique_ptr<salus::exec::Executable> exe;
  std::vector<Tensor> feeds;
  std::vector<const void*> feed_ptrs;
  salus::exec::DeviceBuffer p, e;
  std::vector<float> loss = std::vector<float>(1);
};

// A classifier model: input x of shape {batch, sample...}, int64 labels of shape {batch}.
struct Classifier {
  const char* name;
  std::vector<int64_t> sample;  // x's shape without the batch
};

std::vector<int64_t> XShape(const Classifier& m, int64_t batch) {
  std::vector<int64_t> shape = {batch};
  shape.insert(shape.end(), m.sample.begin(), m.sample.end());
  return shape;
}

std::vector<Tensor> Feeds(const Classifier& m, int64_t batch) {
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0, 1);
  const auto shape = XShape(m, batch);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<float> x(count);
  for (auto& v : x) v = n(rng);
  std::vector<int64_t> y(batch);
  for (auto& v : y) v = static_cast<int64_t>(rng() % 10);
  return {Tensor::Floats("x", shape, x), Tensor::Int64s("labels", {batch}, y)};
}

ModelRun Compile(const Classifier& m, const std::string& model, int64_t batch,
                 const salus::exec::Device& device) {
  salus::exec::CompileOptions o;
  o.device = device;
  o.input_shapes = {{"x", XShape(m, batch)}, {"labels", {batch}}};
  o.mode = salus::exec::Mode::kTraining;
  o.loss = "loss";
  o.optimizer.learning_rate = 0.01f;
  ModelRun r;
  r.exe = Must(salus::exec::Executable::Compile(model, o));
  r.p = Must(salus::exec::DeviceBuffer::Allocate(r.exe->runtime(), r.exe->persistent_bytes()));
  r.e = Must(salus::exec::DeviceBuffer::Allocate(r.exe->runtime(), r.exe->ephemeral_bytes()));
  Must(r.exe->InitializePersistent(r.p.get()));
  r.feeds = Feeds(m, batch);
  for (const auto& info : r.exe->inputs()) {
    for (const auto& f : r.feeds) {
      if (f.name == info.name) r.feed_ptrs.push_back(f.data.data());
    }
  }
  return r;
}

double RunLocal(ModelRun& r) {
  std::vector<void*> fetches = {r.loss.data()};
  const auto t0 = Clock::now();
  if (!r.exe->Run(r.p.get(), r.e.get(), r.feed_ptrs, fetches).ok()) std::exit(1);
  return Ms(Clock::now() - t0);
}

nlohmann::json Overhead(const Daemon& d, const salus::exec::Device& device,
                        const std::string& models, const Classifier& m) {
  const std::string model = ReadFile(models + "/" + m.name + ".onnx");
  // Calibrate the batch so one in-process iteration takes about 10 ms.
  // The batch used is the measured one closest to 10 ms (by ratio), never an unmeasured guess.
  int64_t batch = 16, best = 16;
  double best_error = 1e9;
  for (int round = 0; round < 10; ++round) {
    ModelRun r = Compile(m, model, batch, device);
    std::vector<double> t;
    for (int i = 0; i < 15; ++i) t.push_back(RunLocal(r));
    const double ms = Percentile(t, 0.5);
    const double error = std::abs(std::log(ms / 10.0));
    if (error < best_error) best_error = error, best = batch;
    if (ms > 8.5 && ms < 12) break;
    batch =
        std::clamp<int64_t>(static_cast<int64_t>(static_cast<double>(batch) * 10.0 / ms), 8, 8192);
  }
  batch = best;
  ModelRun local = Compile(m, model, batch, device);
  // Two clients: one that sends every feed in a frame, one as connected by default, which
  // stages large feeds in shared memory it owns (a copy per iteration).
  Client::Options frames_only;
  frames_only.stage_feeds_from = 0;
  auto c = MustConnect(d.ipc(), frames_only);
  auto c_staged = MustConnect(d.ipc());
  SessionOptions o;
  o.model = model;
  o.inputs = {{"x", XShape(m, batch)}, {"labels", {batch}}};
  o.loss = "loss";
  o.optimizer.lr = 0.01;
  auto s = Must(c->CreateSession(o));
  auto s_staged = Must(c_staged->CreateSession(o));
  uint64_t feed_bytes = 0;
  for (const auto& f : local.feeds) feed_bytes += f.data.size();
  // Feeds in a shared buffer, two slots (a pipelined iteration's batch would be written into
  // one while the previous iteration reads the other). The batch is written once, before
  // timing, as the in-process run's batch is: a loader writes batches in place either way.
  auto shm = Must(c->CreateSharedBuffer(2 * feed_bytes));
  std::vector<Tensor> slots[2];
  for (int slot = 0; slot < 2; ++slot) {
    uint64_t offset = static_cast<uint64_t>(slot) * feed_bytes;
    for (const Tensor& f : local.feeds) {
      std::memcpy(shm->data() + offset, f.data.data(), f.data.size());
      slots[slot].push_back(Tensor::InBuffer(f.name, f.dtype, f.shape, *shm, offset));
      offset += f.data.size();
    }
  }
  auto shm_feeds = [&](int slot) { return slots[slot]; };
  // Seven ways to run, in short alternating blocks so all see the same machine load:
  // in-process; through the daemon with feeds in frames, staged by the client, or placed in
  // the shared buffer by the caller, each one call at a time and pipelined. Pipelined, the
  // next iteration is submitted (with frames or staged, its feeds copied into a new batch, as a
  // training loop's input pipeline would) before the current one is collected, so its bytes
  // travel while the lane computes; per-iteration time is then the interval between
  // completions. A mode's overhead is the median over blocks of the block's median ratio to
  // the in-process block.
  constexpr int kBlocks = 30, kPerBlock = 8;
  enum class Feeds { kFrames, kStaged, kShared };
  struct Mode {
    const char* name;
    Feeds feeds;
    bool pipelined;
    std::vector<double> ms, ratio;
    std::vector<double> outside_us;  // one call at a time: round trip less queue and run
  };
  std::vector<Mode> modes = {
      {"frames, one call at a time", Feeds::kFrames, false, {}, {}, {}},
      {"frames, pipelined", Feeds::kFrames, true, {}, {}, {}},
      {"staged, one call at a time", Feeds::kStaged, false, {}, {}, {}},
      {"staged, pipelined", Feeds::kStaged, true, {}, {}, {}},
      {"shared buffer, one call at a time", Feeds::kShared, false, {}, {}, {}},
      {"shared buffer, pipelined", Feeds::kShared, true, {}, {}, {}}};
  std::vector<double> local_ms, daemon_run_ms;
  for (int i = 0; i < 5; ++i) {  // warm all
    RunLocal(local);
    Must(s->Run(local.feeds, {"loss"}));
    Must(s_staged->Run(local.feeds, {"loss"}));
  }
  for (int block = 0; block < kBlocks; ++block) {
    std::vector<double> l;
    for (int i = 0; i < kPerBlock; ++i) l.push_back(RunLocal(local));
    local_ms.insert(local_ms.end(), l.begin(), l.end());
    for (Mode& mode : modes) {
      auto feeds = [&](int i) {
        return mode.feeds == Feeds::kShared ? shm_feeds(i % 2) : local.feeds;
      };
      salus::client::Session* session = mode.feeds == Feeds::kStaged ? s_staged.get() : s.get();
      std::vector<double> t;
      if (!mode.pipelined) {
        for (int i = 0; i < kPerBlock; ++i) {
          const auto t0 = Clock::now();
          Must(session->Run(feeds(i), {"loss"}));
          t.push_back(Ms(Clock::now() - t0));
          const auto& st = session->last_stats();
          mode.outside_us.push_back(t.back() * 1e3 - st.queue_delay_us - st.run_us);
          if (mode.feeds == Feeds::kFrames) daemon_run_ms.push_back(s->last_stats().run_us / 1e3);
        }
      } else {
        std::deque<std::unique_ptr<salus::client::PendingIteration>> inflight;
        inflight.push_back(Must(session->Submit(feeds(0), {"loss"})));
        auto last = Clock::now();
        for (int i = 0; i <= kPerBlock; ++i) {
          inflight.push_back(Must(session->Submit(feeds(i + 1), {"loss"})));
          Must(inflight.front()->Wait());
          inflight.pop_front();
          const auto now = Clock::now();
          if (i > 0) t.push_back(Ms(now - last));  // the first interval includes the fill
          last = now;
        }
        Must(inflight.front()->Wait());
      }
      mode.ratio.push_back(Percentile(t, 0.5) / Percentile(l, 0.5));
      mode.ms.insert(mode.ms.end(), t.begin(), t.end());
    }
  }
  const double lm = Percentile(local_ms, 0.5), rm = Percentile(daemon_run_ms, 0.5);
  std::printf(
      "~10 ms model (%s, batch %lld, training, %.0f KiB of feeds): in-process median %.3f ms, "
      "in the lane %.3f ms\n",
      m.name, static_cast<long long>(batch), feed_bytes / 1024.0, lm, rm);
  nlohmann::json out = {{"model", m.name},
                        {"batch", batch},
                        {"feed_bytes", feed_bytes},
                        {"in_process_median_ms", lm},
                        {"daemon_run_median_ms", rm},
                        {"blocks", kBlocks},
                        {"per_block", kPerBlock},
                        {"modes", nlohmann::json::array()}};
  for (const Mode& mode : modes) {
    const double pct = (Percentile(mode.ratio, 0.5) - 1) * 100;
    std::printf("  %-34s %.3f ms per iteration: overhead %+.1f%%", mode.name,
                Percentile(mode.ms, 0.5), pct);
    nlohmann::json row = {
        {"mode", mode.name}, {"median_ms", Percentile(mode.ms, 0.5)}, {"overhead_pct", pct}};
    if (!mode.outside_us.empty()) {
      std::printf(" (%.0f us outside the iteration)", Percentile(mode.outside_us, 0.5));
      row["outside_us"] = Percentile(mode.outside_us, 0.5);
    }
    std::printf("\n");
    out["modes"].push_back(row);
  }
  return out;
}

// The floor under any round trip: a bare ZeroMQ DEALER -> ROUTER echo over ipc between two
// threads of this process with a ZeroMQ context (and I/O thread) each, with no protobuf and
// no scheduling.
nlohmann::json ZmqEcho(const std::string& endpoint) {
  // Two contexts, so each side has its own ZeroMQ I/O thread, as a client and the daemon do.
  zmq::context_t server_ctx(1), ctx(1);
  zmq::socket_t router(server_ctx, zmq::socket_type::router);
  router.bind(endpoint);
  std::thread echo([&] {
    for (int i = 0; i < 3000; ++i) {
      std::vector<zmq::message_t> msg;
      if (!zmq::recv_multipart(router, std::back_inserter(msg))) return;
      zmq::send_multipart(router, msg);
    }
  });
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.connect(endpoint);
  nlohmann::json out =
      TimeDealer(dealer, "ping", "bare ZeroMQ echo over ipc (the transport's floor)");
  echo.join();
  return out;
}

// The same echo, but the echo side first keeps every core busy for 10 ms (as a lane's
// iteration does) and reports how long that took: the time outside it is the floor under a
// model iteration's round trip, when the threads involved slept through a long iteration.
nlohmann::json ZmqEchoAfterWork(const std::string& endpoint) {
  constexpr int kRounds = 200;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  zmq::context_t server_ctx(1), ctx(1);
  zmq::socket_t router(server_ctx, zmq::socket_type::router);
  router.bind(endpoint);
  std::thread echo([&] {
    auto spin = [] {
      const auto end = Clock::now() + std::chrono::milliseconds(10);
      while (Clock::now() < end) {
      }
    };
    for (int i = 0; i < kRounds; ++i) {
      std::vector<zmq::message_t> msg;
      if (!zmq::recv_multipart(router, std::back_inserter(msg))) return;
      const auto t0 = Clock::now();
      std::vector<std::thread> helpers;
      for (unsigned k = 1; k < cores; ++k) helpers.emplace_back(spin);
      spin();
      for (auto& h : helpers) h.join();
      const double busy_us = Ms(Clock::now() - t0) * 1e3;
      msg.back().rebuild(&busy_us, sizeof(busy_us));
      zmq::send_multipart(router, msg);
    }
  });
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.connect(endpoint);
  std::vector<double> us;
  for (int i = 0; i < kRounds; ++i) {
    const auto t0 = Clock::now();
    dealer.send(zmq::str_buffer("ping"));
    zmq::message_t reply;
    if (!dealer.recv(reply) || reply.size() != sizeof(double)) break;
    const double total_us = Ms(Clock::now() - t0) * 1e3;
    if (i >= 20) us.push_back(total_us - *static_cast<const double*>(reply.data()));
  }
  echo.join();
  std::printf(
      "bare ZeroMQ echo over ipc after 10 ms of work on all %u cores (time outside the work): "
      "median %.1f us, p90 %.1f us\n",
      cores, Percentile(us, 0.5), Percentile(us, 0.9));
  return {{"median_us", Percentile(us, 0.5)}, {"p90_us", Percentile(us, 0.9)}};
}

// Two sessions made by `options` share the daemon's one lane, each in its own thread always
// with an iteration queued, until one has run 600; the gaps after each one's first 50.
nlohmann::json SwitchGap(const Daemon& d, const char* what, const SessionOptions& options,
                         const std::vector<Tensor>& feeds) {
  std::atomic<bool> stop{false};
  std::vector<double> gaps[2];
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      auto c = MustConnect(d.ipc());
      auto s = Must(c->CreateSession(options));
      for (int i = 0; i < 600 && !stop; ++i) {
        Must(s->Run(feeds, {}));
        if (i >= 50) gaps[k].push_back(s->last_stats().switch_gap_us);
      }
      stop = true;
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> all = gaps[0];
  all.insert(all.end(), gaps[1].begin(), gaps[1].end());
  std::printf(
      "switch gap, two %s sessions sharing one lane: median %.1f us, p90 %.1f us (%zu "
      "samples)\n",
      what, Percentile(all, 0.5), Percentile(all, 0.9), all.size());
  return {{"median_us", Percentile(all, 0.5)},
          {"p90_us", Percentile(all, 0.9)},
          {"samples", all.size()}};
}

nlohmann::json SwitchGaps(const std::string& server, const salus::exec::Device& device,
                          const std::string& models) {
  Daemon d(server, device,
           {"--memory", "1GiB", "--policy", "fair", "--policy-options", "{\"single_lane\":true}"});
  SessionOptions synthetic;
  synthetic.synthetic = salus::client::Synthetic{1 << 20, 1 << 20, 0.002};
  nlohmann::json out = SwitchGap(d, "synthetic", synthetic, {});
  const Classifier mlp{"mlp", {784}};
  constexpr int64_t kBatch = 64;
  SessionOptions training;
  training.model = ReadFile(models + "/mlp.onnx");
  training.inputs = {{"x", XShape(mlp, kBatch)}, {"labels", {kBatch}}};
  training.loss = "loss";
  training.optimizer.lr = 0.01;
  out["mlp_training"] = SwitchGap(d, "MLP training", training, Feeds(mlp, kBatch));
  return out;
}

nlohmann::json IdleSessions(const std::string& server, const salus::exec::Device& device) {
  Daemon d(server, device, {"--memory", "4GiB", "--policy", "pack"});
  auto c = MustConnect(d.ipc());
  const uint64_t before = d.Rss();
  std::vector<std::unique_ptr<salus::client::Session>> sessions;
  for (int i = 0; i < 500; ++i) {
    SessionOptions o;
    o.synthetic = salus::client::Synthetic{64 << 10, 64 << 10, 0};
    o.name = "idle-" + std::to_string(i);
    sessions.push_back(Must(c->CreateSession(o)));
  }
  const uint64_t after = d.Rss();
  auto list = Must(c->ListSessions());
  std::printf(
      "500 idle sessions: daemon RSS %.1f MiB before, %.1f MiB after (%.1f KiB per session), "
      "%zu listed\n",
      before / 1048576.0, after / 1048576.0,
      (static_cast<double>(after) - static_cast<double>(before)) / 500 / 1024, list.size());
  return {{"sessions", list.size()},
          {"rss_before_bytes", before},
          {"rss_after_bytes", after},
          {"per_session_bytes", (static_cast<double>(after) - static_cast<double>(before)) / 500}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string server = "build/bin/salus-server", models = "benchmarks/models", json_out, only,
              device_name = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--server")
      server = argv[i + 1];
    else if (flag == "--models")
      models = argv[i + 1];
    else if (flag == "--json")
      json_out = argv[i + 1];
    else if (flag == "--only")
      only = argv[i + 1];
    else if (flag == "--device")
      device_name = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: daemon_bench [--server PATH] [--models DIR] [--device cpu|cuda:N] "
                   "[--json FILE] [--only round_trip|overhead|switch_gap|idle_sessions]\n");
      return 2;
    }
  }
  const auto parsed = salus::exec::ParseDevice(device_name);
  if (!parsed.ok()) {
    std::fprintf(stderr, "daemon_bench: --device: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  const salus::exec::Device device = *parsed;
  salus::EnsurePassiveOpenMpWait(argv);  // as the daemon: Note [OpenMP wait policy]
  auto want = [&](const char* part) { return only.empty() || only == part; };
  nlohmann::json out;
  if (want("round_trip") || want("overhead")) {
    Daemon d(server, device, {"--memory", "2GiB", "--policy", "fair"});
    if (want("round_trip")) {
      out["round_trip"] = RoundTrip(d);
      out["heartbeat"] = HeartbeatRoundTrip(d);
      out["zmq_echo"] = ZmqEcho(d.ipc() + ".echo");
    }
    if (want("overhead")) out["zmq_echo_after_work"] = ZmqEchoAfterWork(d.ipc() + ".echo2");
    if (want("overhead")) {
      out["overhead"] =
          nlohmann::json::array({Overhead(d, device, models, {"mlp", {784}}),
                                 Overhead(d, device, models, {"resnet", {3, 32, 32}})});
    }
  }
  if (want("switch_gap")) out["switch_gap"] = SwitchGaps(server, device, models);
  if (want("idle_sessions")) out["idle_sessions"] = IdleSessions(server, device);
  if (!json_out.empty()) std::ofstream(json_out) << out.dump(2) << "\n";
  return 0;
}
