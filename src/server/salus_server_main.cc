// salus-server: the Salus daemon.
//
//   salus-server [--config FILE] [--listen EP]... [--listen-remote EP]... [--device cpu|cuda:N]
//                [--memory 16GiB] [--policy fifo|srtf|pack|fair|priority] [--log-level info]
//                [--metrics-listen HOST:PORT] [--state-dir DIR] [--restore DIR]
//   salus-server [--config FILE] [flags] --check-config    check the config, start nothing
//   salus-server --version
//
// Flags override the config file (JSON: listen, listen_remote, device, memory, policy,
// policy_options, metrics_listen, log_level, lease_seconds, limits, quotas, security.curve,
// state_dir; see docs/operations.md). SIGTERM and SIGINT drain the daemon: it stops
// admitting, finishes the iterations in flight, answers every waiter and exits 0; with a state
// directory it writes a snapshot of the sessions there first, which the next start restores.
#include <signal.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <iostream>
#include <thread>

#include "common/config.h"
#include "common/logging.h"
#include "common/openmp_env.h"
#include "common/version.h"
#include "server/model_factory.h"
#include "server/server.h"
#include "server/server_config.h"

namespace po = boost::program_options;

namespace {

int Fail(const salus::Status& s) {
  std::cerr << "salus-server: " << s.ToString() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  salus::EnsurePassiveOpenMpWait(argv);  // Note [OpenMP wait policy]
  std::vector<std::string> listen, listen_remote;
  std::string config_path, device, memory, policy, policy_options, log_level, metrics_listen,
      max_folded_bytes, state_dir, restore;
  double lease_seconds = 0, overcommit = 1.0, paging_quantum_ms = 0;
  int64_t snapshot_every = 0;
  po::options_description desc("salus-server: the Salus GPU execution service");
  desc.add_options()("help,h", "show this help")("version", "print the version and exit")(
      "check-config",
      "check the config file and flags (every key, the policy's options, the devices' names) and "
      "exit: 0 when the daemon would accept them")("config", po::value(&config_path),
                                                   "JSON config file")(
      "listen", po::value(&listen)->composing(),
      "endpoint to serve on (repeatable), e.g. ipc:///run/salus/salus.sock, tcp://127.0.0.1:5501; "
      "a tcp endpoint that is not loopback speaks CURVE")(
      "listen-remote", po::value(&listen_remote)->composing(),
      "endpoint to serve on with CURVE even on a loopback address (repeatable)")(
      "device", po::value(&device),
      "cpu (default), cpu:N (N CPU devices), cuda:N, cuda:all, or a comma list of devices")(
      "memory", po::value(&memory), "the arena's capacity, e.g. 16GiB")(
      "policy", po::value(&policy), "fifo, srtf, pack, fair (default) or priority")(
      "policy-options", po::value(&policy_options), "the policy's options as a JSON object")(
      "log-level", po::value(&log_level), "trace, debug, info (default), warn, error")(
      "metrics-listen", po::value(&metrics_listen), "HOST:PORT for /metrics and /healthz")(
      "lease-seconds", po::value(&lease_seconds), "a silent client's sessions close after this")(
      "overcommit", po::value(&overcommit),
      "admit sessions while their persistent memory is within RATIO x the arena, paging to host "
      "memory what does not fit (default 1: off)")(
      "paging-quantum-ms", po::value(&paging_quantum_ms),
      "a session paged in keeps its place at least this long (default 1000)")(
      "max-folded-bytes", po::value(&max_folded_bytes),
      "host bytes of constants one model's compilation may hold, e.g. 1GiB (the default); the "
      "same as limits.max_constant_bytes")(
      "state-dir", po::value(&state_dir),
      "keep the sessions across restarts: a drain (SIGTERM) writes a snapshot here, and a start "
      "restores the snapshot it finds here")(
      "snapshot-every", po::value(&snapshot_every),
      "with --state-dir, also write a snapshot after every N iterations (of all sessions), so a "
      "crash loses at most about N")(
      "restore", po::value(&restore),
      "restore the sessions of the snapshot in this directory (it must be there and verify)")(
      "discard-invalid-snapshot",
      "start without the snapshot's sessions when it does not verify, instead of refusing to "
      "start");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "salus-server: " << e.what() << "\n\n" << desc;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (vm.count("version")) {
    std::cout << salus::VersionText("salus-server");
    return 0;
  }

  // Config file first, flags on top.
  salus::Config config;
  if (!config_path.empty()) {
    auto c = salus::Config::FromFile(config_path);
    if (!c.ok()) return Fail(c.status());
    config = std::move(*c);
  }
  std::vector<std::string> overrides;
  if (vm.count("device")) overrides.push_back("device=\"" + device + "\"");
  if (vm.count("memory")) overrides.push_back("memory=\"" + memory + "\"");
  if (vm.count("policy")) overrides.push_back("policy=\"" + policy + "\"");
  if (vm.count("log-level")) overrides.push_back("log_level=\"" + log_level + "\"");
  if (vm.count("metrics-listen")) overrides.push_back("metrics_listen=\"" + metrics_listen + "\"");
  if (vm.count("max-folded-bytes")) {
    overrides.push_back("max_folded_bytes=\"" + max_folded_bytes + "\"");
  }
  if (vm.count("overcommit")) overrides.push_back("overcommit=" + std::to_string(overcommit));
  if (vm.count("paging-quantum-ms")) {
    overrides.push_back("paging_quantum_ms=" + std::to_string(paging_quantum_ms));
  }
  if (vm.count("lease-seconds"))
    overrides.push_back("lease_seconds=" + std::to_string(lease_seconds));
  if (vm.count("policy-options")) overrides.push_back("policy_options=" + policy_options);
  if (vm.count("state-dir")) overrides.push_back("state_dir=" + nlohmann::json(state_dir).dump());
  if (vm.count("snapshot-every")) {
    overrides.push_back("snapshot_every_iterations=" + std::to_string(snapshot_every));
  }
  if (!listen.empty()) overrides.push_back("listen=" + nlohmann::json(listen).dump());
  if (!listen_remote.empty()) {
    overrides.push_back("listen_remote=" + nlohmann::json(listen_remote).dump());
  }
  if (auto s = config.ApplyOverrides(overrides); !s.ok()) return Fail(s);

  std::string level;
  auto options = salus::server::OptionsFromConfig(config, &level);
  if (!options.ok()) return Fail(options.status());
  if (auto s = salus::logging::SetLevel(level); !s.ok()) return Fail(s);
  if (vm.count("check-config")) {
    std::cout << "salus-server: the config is valid (" << config.origin() << ", policy "
              << options->policy << ", device " << options->device << ")\n";
    return 0;
  }
  salus::server::ServerOptions o = std::move(*options);
  o.restore_dir = restore;
  o.discard_invalid_snapshot = vm.count("discard-invalid-snapshot") > 0;
  salus::server::RouteProtobufLogs();
  auto devices = salus::server::DeviceNames(o.device);
  if (!devices.ok()) return Fail(devices.status().WithContext("--device"));
  o.model_factory =
      salus::server::MakeModelFactory(*devices, o.limits.Compile(),
                                      std::chrono::duration_cast<salus::Nanos>(
                                          std::chrono::duration<double>(o.limits.compile_seconds)));

  // Block the drain signals in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = salus::server::Server::Create(std::move(o));
  if (!server.ok()) return Fail(server.status());
  if (auto s = (*server)->Start(); !s.ok()) return Fail(s);

  salus::server::Server* srv = server->get();
  std::thread signal_waiter([srv, signals] {
    int sig = 0;
    while (sigwait(&signals, &sig) == 0) {
      salus::logging::Lifecycle("signal", {{"signal", sig}});
      srv->Drain();
      return;
    }
  });
  (*server)->Wait();
  // Wake the signal thread if the drain came from a Drain request instead of a signal.
  pthread_kill(signal_waiter.native_handle(), SIGTERM);
  signal_waiter.join();
  server->reset();
  return 0;
}
