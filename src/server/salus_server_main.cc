// salus-server: the Salus daemon.
//
//   salus-server [--config FILE] [--listen EP]... [--listen-remote EP]... [--device cpu|cuda:N]
//                [--memory 16GiB] [--policy fifo|srtf|pack|fair|priority] [--log-level info]
//                [--metrics-listen HOST:PORT]
//
// Flags override the config file (JSON: listen, listen_remote, device, memory, policy,
// policy_options, metrics_listen, log_level, lease_seconds, limits, quotas, security.curve;
// see docs/operations.md). SIGTERM and SIGINT drain the daemon: it stops
// admitting, finishes the iterations in flight, answers every waiter and exits 0.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <iostream>
#include <thread>

#include "common/config.h"
#include "common/curve_keys.h"
#include "common/logging.h"
#include "common/openmp_env.h"
#include "common/units.h"
#include "server/model_factory.h"
#include "server/server.h"

namespace po = boost::program_options;

namespace {

int Fail(const salus::Status& s) {
  std::cerr << "salus-server: " << s.ToString() << "\n";
  return 1;
}

// The "security.curve" section: key files, allowed and administrator keys, open mode.
salus::Status ReadSecurity(const salus::Config& config, salus::server::SecurityOptions* out) {
  using salus::StatusOr;
  auto keys = [&](const char* list_key, const char* file_key,
                  std::vector<std::string>* into) -> salus::Status {
    if (config.Has(list_key)) {
      SALUS_ASSIGN_OR_RETURN(std::vector<std::string> listed, config.GetStrings(list_key));
      for (const std::string& k : listed) {
        SALUS_ASSIGN_OR_RETURN(std::string key, salus::ResolveKey(k));
        into->push_back(std::move(key));
      }
    }
    if (config.Has(file_key)) {
      SALUS_ASSIGN_OR_RETURN(std::string path, config.GetString(file_key));
      SALUS_ASSIGN_OR_RETURN(std::vector<std::string> listed, salus::ReadKeyList(path));
      into->insert(into->end(), listed.begin(), listed.end());
    }
    return salus::OkStatus();
  };
  if (config.Has("security.curve.secret_key_file")) {
    SALUS_ASSIGN_OR_RETURN(std::string path, config.GetString("security.curve.secret_key_file"));
    SALUS_ASSIGN_OR_RETURN(out->curve_secret_key, salus::ReadKeyFile(path));
    struct stat st {};
    if (stat(path.c_str(), &st) == 0 && (st.st_mode & 0077) != 0) {
      salus::logging::Get("server")->warn(
          "the secret key file '{}' can be read by other users (mode {:o}): chmod 600 it", path,
          st.st_mode & 0777);
    }
  }
  SALUS_RETURN_IF_ERROR(
      keys("security.curve.client_keys", "security.curve.client_keys_file", &out->client_keys));
  SALUS_RETURN_IF_ERROR(
      keys("security.curve.admin_keys", "security.curve.admin_keys_file", &out->admin_keys));
  SALUS_ASSIGN_OR_RETURN(out->open, config.GetBool("security.curve.open", false));
  return salus::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  salus::EnsurePassiveOpenMpWait(argv);  // Note [OpenMP wait policy]
  std::vector<std::string> listen, listen_remote;
  std::string config_path, device, memory, policy, policy_options, log_level, metrics_listen,
      max_folded_bytes;
  double lease_seconds = 0, overcommit = 1.0, paging_quantum_ms = 0;
  po::options_description desc("salus-server: the Salus GPU execution service");
  desc.add_options()("help,h", "show this help")("config", po::value(&config_path),
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
      "same as limits.max_constant_bytes");
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
  if (auto s = config.ApplyOverrides(overrides); !s.ok()) return Fail(s);

  salus::server::ServerOptions o;
  auto get_string = [&](const char* key, std::string* out) -> salus::Status {
    auto v = config.GetString(key, *out);
    if (!v.ok()) return v.status();
    *out = *v;
    return salus::OkStatus();
  };
  std::string level = "info";
  for (auto [key, out] :
       {std::pair{"device", &o.device}, std::pair{"policy", &o.policy},
        std::pair{"metrics_listen", &o.metrics_listen}, std::pair{"log_level", &level}}) {
    if (auto s = get_string(key, out); !s.ok()) return Fail(s);
  }
  if (auto s = salus::logging::SetLevel(level); !s.ok()) return Fail(s);
  salus::server::RouteProtobufLogs();
  auto mem = config.GetBytes("memory", 0);
  if (!mem.ok()) return Fail(mem.status());
  o.memory = *mem;
  if (!listen.empty()) {
    o.listen = listen;
  } else if (config.Has("listen")) {
    auto l = config.GetStrings("listen");
    if (!l.ok()) return Fail(l.status());
    o.listen = *l;
  }
  if (!listen_remote.empty()) {
    o.security.listen_remote = listen_remote;
  } else if (config.Has("listen_remote")) {
    auto l = config.GetStrings("listen_remote");
    if (!l.ok()) return Fail(l.status());
    o.security.listen_remote = *l;
  }
  if (auto s = ReadSecurity(config, &o.security); !s.ok()) return Fail(s);
  auto quotas = salus::server::Quotas::FromJson(
      config.json().contains("quotas") ? config.json()["quotas"] : nlohmann::json());
  if (!quotas.ok()) return Fail(quotas.status());
  o.quotas = *quotas;
  auto lease = config.GetDouble("lease_seconds", 30.0);
  if (!lease.ok()) return Fail(lease.status());
  if (!(*lease > 0)) return Fail(salus::InvalidArgumentError("lease_seconds must be positive"));
  o.lease = salus::FromSeconds(*lease);
  auto ratio = config.GetDouble("overcommit", 1.0);
  if (!ratio.ok()) return Fail(ratio.status());
  o.overcommit = *ratio;
  auto quantum = config.GetDouble("paging_quantum_ms", 1000.0);
  if (!quantum.ok()) return Fail(quantum.status());
  if (!(*quantum >= 0) || *quantum > 3.6e6) {
    return Fail(salus::InvalidArgumentError("paging_quantum_ms must be in [0, 3600000]"));
  }
  o.paging_quantum = salus::FromSeconds(*quantum / 1000.0);
  if (vm.count("policy-options")) {
    o.policy_options = nlohmann::json::parse(policy_options, nullptr, false);
    if (o.policy_options.is_discarded()) {
      return Fail(salus::InvalidArgumentError("--policy-options is not valid JSON"));
    }
  } else {
    o.policy_options = config.Section("policy_options");
  }
  auto limits = salus::server::Limits::FromJson(
      config.json().contains("limits") ? config.json()["limits"] : nlohmann::json());
  if (!limits.ok()) return Fail(limits.status());
  o.limits = *limits;
  // max_folded_bytes (and --max-folded-bytes): the older name of limits.max_constant_bytes.
  if (config.Has("max_folded_bytes")) {
    auto folded = config.GetBytes("max_folded_bytes");
    if (!folded.ok()) return Fail(folded.status());
    o.limits.max_constant_bytes = *folded;
  }
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
