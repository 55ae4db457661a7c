// salusctl: inspect and control a running salus-server.
//
//   salusctl [--endpoint EP] status            server, device, memory and session counts
//   salusctl [--endpoint EP] sessions [--json]
//   salusctl [--endpoint EP] memory [--json]   the memory map: lanes, blocks, free ranges
//   salusctl [--endpoint EP] close ID          close a session (the administrator: anyone's)
//   salusctl [--endpoint EP] move ID DEVICE    move a session to another device (admin)
//   salusctl [--endpoint EP] allocations [--json]  the allocations and their usage (admin)
//   salusctl [--endpoint EP] drain             finish in-flight work and stop the daemon
//   salusctl drain --snapshot DIR             ... writing a snapshot of the sessions to DIR
//                                             (on the daemon's host), which
//                                             `salus-server --restore DIR` takes up
//   salusctl keygen PREFIX                     a CURVE key pair: PREFIX.key and PREFIX.pub
//
// The default endpoint is the daemon's ipc socket, where its own user and root have the
// administrator role (they see every session and may drain); elsewhere a client sees its
// own sessions and the others' totals. --server-key and --secret-key reach a remote (CURVE)
// endpoint.
#include <sys/stat.h>
#include <zmq.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/endpoints.h"
#include "common/units.h"
#include "common/version.h"
#include "salus/client.h"

namespace po = boost::program_options;

namespace {

int Fail(const salus::Status& s) {
  std::cerr << "salusctl: " << s.ToString() << "\n";
  return 1;
}

// Writes a new CURVE key pair: PREFIX.key (the secret, readable by its owner only) and
// PREFIX.pub (the public key, to give to the other side).
int Keygen(const std::string& prefix) {
  char public_key[41] = {}, secret_key[41] = {};
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return Fail(salus::UnavailableError(std::string("cannot make a CURVE key pair: ") +
                                        zmq_strerror(zmq_errno())));
  }
  auto write = [](const std::string& path, const std::string& what, const char* key,
                  mode_t mode) -> salus::Status {
    const mode_t old = umask(0077);
    std::ofstream out(path, std::ios::trunc);
    umask(old);
    if (!out) {
      return salus::UnavailableError("cannot write '" + path + "': " + std::strerror(errno));
    }
    out << "# salus CURVE " << what << "\n" << key << "\n";
    out.close();
    if (chmod(path.c_str(), mode) != 0) {
      return salus::UnavailableError("cannot set the mode of '" + path + "'");
    }
    return salus::OkStatus();
  };
  if (auto s = write(prefix + ".key", "secret key: keep it private", secret_key, 0600); !s.ok()) {
    return Fail(s);
  }
  if (auto s = write(prefix + ".pub", "public key", public_key, 0644); !s.ok()) return Fail(s);
  std::printf("wrote %s.key (secret) and %s.pub (public: %s)\n", prefix.c_str(), prefix.c_str(),
              public_key);
  return 0;
}

int Status(salus::client::Client& c) {
  auto stats = c.StatsJson();
  if (!stats.ok()) return Fail(stats.status());
  const auto j = nlohmann::json::parse(*stats);
  const auto& info = c.server();
  std::printf("server     salus-server %s (protocol %u)\n", info.server_version.c_str(),
              info.protocol_version);
  std::printf("device     %s, policy %s\n", info.device.c_str(), info.policy.c_str());
  std::printf("you        %s (%s)\n", info.principal.c_str(), info.role.c_str());
  if (j.value("device_reserved_bytes", 0ull) > 0) {
    std::printf("reserved   %s of device memory outside the arena (streams, library handles)\n",
                salus::FormatBytes(j.value("device_reserved_bytes", 0ull)).c_str());
  }
  if (const std::string lost = j.value("device_lost", std::string("OK")); lost != "OK") {
    std::printf("DEVICE     %s\n", lost.c_str());
  }
  std::printf("memory     %s committed of %s (%zu lanes)\n",
              salus::FormatBytes(j.value("committed_bytes", 0ull)).c_str(),
              salus::FormatBytes(j.value("capacity_bytes", 0ull)).c_str(),
              j.value("lanes", size_t{0}));
  // One line per device where there are several (stats list a one-device daemon's too).
  const auto devices = j.value("devices", nlohmann::json::array());
  if (devices.size() > 1) {
    for (const auto& d : devices) {
      std::printf("  %-8s %s committed of %s (%zu lanes, %zu waiting)\n",
                  d.value("device", std::string()).c_str(),
                  salus::FormatBytes(d.value("committed_bytes", 0ull)).c_str(),
                  salus::FormatBytes(d.value("capacity_bytes", 0ull)).c_str(),
                  d.value("lanes", size_t{0}), d.value("waiting", size_t{0}));
    }
  }
  std::printf("sessions   %zu (%zu waiting for memory), %zu iterations running\n",
              j.value("sessions", size_t{0}), j.value("waiting", size_t{0}),
              j.value("running_iterations", size_t{0}));
  std::printf("buffers    %zu shared buffers registered\n", j.value("shared_buffers", size_t{0}));
  std::printf("state      %s\n", j.value("draining", false) ? "draining" : "serving");
  return 0;
}

int Sessions(salus::client::Client& c, bool json) {
  salus::client::OtherSessions others;
  auto list = c.ListSessions(&others);
  if (!list.ok()) return Fail(list.status());
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& s : *list) {
      out.push_back({{"session_id", s.id},
                     {"name", s.name},
                     {"kind", s.kind},
                     {"state", s.state},
                     {"device", s.device},
                     {"lane", s.lane},
                     {"priority", s.priority},
                     {"latency_class", s.interactive ? "interactive" : "batch"},
                     {"persistent_bytes", s.persistent_bytes},
                     {"ephemeral_bytes", s.ephemeral_bytes},
                     {"iterations_done", s.iterations_done},
                     {"iterations_declared", s.iterations_declared},
                     {"avg_iteration_seconds", s.avg_iteration_seconds},
                     {"client_id", s.client_id},
                     {"job", s.job}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("%-6s %-16s %-9s %-9s %-8s %5s %4s %-11s %10s %10s %12s %9s\n", "ID", "NAME", "KIND",
              "STATE", "DEVICE", "LANE", "PRIO", "CLASS", "P", "E", "ITERATIONS", "ITER ms");
  for (const auto& s : *list) {
    const std::string iters = s.iterations_declared > 0 ? std::to_string(s.iterations_done) + "/" +
                                                              std::to_string(s.iterations_declared)
                                                        : std::to_string(s.iterations_done);
    std::printf("%-6llu %-16s %-9s %-9s %-8s %5llu %4d %-11s %10s %10s %12s %9.2f\n",
                static_cast<unsigned long long>(s.id), s.name.substr(0, 16).c_str(), s.kind.c_str(),
                s.state.c_str(), s.device.empty() ? "-" : s.device.c_str(),
                static_cast<unsigned long long>(s.lane), s.priority,
                s.interactive ? "interactive" : "batch",
                salus::FormatBytes(s.persistent_bytes).c_str(),
                salus::FormatBytes(s.ephemeral_bytes).c_str(), iters.c_str(),
                s.avg_iteration_seconds * 1e3);
  }
  if (others.sessions > 0) {
    std::printf("and %llu sessions of other clients (%llu waiting), %s persistent, %s ephemeral\n",
                static_cast<unsigned long long>(others.sessions),
                static_cast<unsigned long long>(others.waiting),
                salus::FormatBytes(others.persistent_bytes).c_str(),
                salus::FormatBytes(others.ephemeral_bytes).c_str());
  }
  return 0;
}

int Allocations(salus::client::Client& c, bool json) {
  auto list = c.ListAllocations();
  if (!list.ok()) return Fail(list.status());
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& a : *list) {
      out.push_back({{"id", a.id},
                     {"pod", a.pod},
                     {"memory_bytes", a.memory_bytes},
                     {"used_bytes", a.used_bytes},
                     {"latency_class", a.interactive ? "interactive" : "batch"},
                     {"priority", a.priority},
                     {"max_priority", a.max_priority},
                     {"sessions", a.sessions},
                     {"clients", a.clients}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("%-24s %-32s %10s %10s %-11s %4s %7s %8s %7s\n", "ID", "POD", "BUDGET", "USED",
              "CLASS", "PRIO", "MAXPRIO", "SESSIONS", "CLIENTS");
  for (const auto& a : *list) {
    std::printf("%-24s %-32s %10s %10s %-11s %4d %7s %8u %7u\n", a.id.c_str(),
                a.pod.empty() ? "-" : a.pod.c_str(),
                a.memory_bytes == 0 ? "-" : salus::FormatBytes(a.memory_bytes).c_str(),
                salus::FormatBytes(a.used_bytes).c_str(), a.interactive ? "interactive" : "batch",
                a.priority, a.max_priority == 0 ? "-" : std::to_string(a.max_priority).c_str(),
                a.sessions, a.clients);
  }
  return 0;
}

void PrintMap(const nlohmann::json& j);

int Memory(salus::client::Client& c, bool json) {
  auto map = c.MemoryMapJson();
  if (!map.ok()) return Fail(map.status());
  const auto j = nlohmann::json::parse(*map);
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  // Several devices: one map each.
  if (j.contains("devices")) {
    for (const auto& d : j["devices"]) {
      std::printf("device %s, ", d.value("device", std::string()).c_str());
      PrintMap(d);
      std::printf("\n");
    }
    return 0;
  }
  PrintMap(j);
  return 0;
}

void PrintMap(const nlohmann::json& j) {
  std::printf("capacity %s\n\n", salus::FormatBytes(j.value("capacity", 0ull)).c_str());
  std::printf("%-12s %-8s %14s %12s  %s\n", "KIND", "ID", "OFFSET", "SIZE", "SESSIONS");
  for (const auto& l : j.value("lanes", nlohmann::json::array())) {
    std::string sessions;
    for (const auto& s : l.value("sessions", nlohmann::json::array())) {
      sessions += (sessions.empty() ? "" : ",") + std::to_string(s.get<uint64_t>());
    }
    std::printf("%-12s %-8llu %14llu %12s  %s\n", "lane",
                static_cast<unsigned long long>(l.value("id", 0ull)),
                static_cast<unsigned long long>(l.value("offset", 0ull)),
                salus::FormatBytes(l.value("size", 0ull)).c_str(), sessions.c_str());
  }
  for (const auto& b : j.value("persistent_blocks", nlohmann::json::array())) {
    std::printf("%-12s %-8llu %14llu %12s  %llu\n", "persistent",
                static_cast<unsigned long long>(b.value("session", 0ull)),
                static_cast<unsigned long long>(b.value("offset", 0ull)),
                salus::FormatBytes(b.value("size", 0ull)).c_str(),
                static_cast<unsigned long long>(b.value("session", 0ull)));
  }
  for (const auto& f : j.value("free_ranges", nlohmann::json::array())) {
    std::printf("%-12s %-8s %14llu %12s\n", "free", "-",
                static_cast<unsigned long long>(f.value("offset", 0ull)),
                salus::FormatBytes(f.value("size", 0ull)).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string endpoint = salus::ClientEndpoint(), command, argument, device, server_key, secret_key,
              snapshot;
  po::options_description desc(
      "salusctl: inspect and control a running salus-server\n\n"
      "commands: status | sessions | memory | allocations | close ID | move ID DEVICE | drain | "
      "keygen PREFIX | endpoint\n\n"
      "options");
  desc.add_options()("help,h", "show this help")("version", "print the version and exit")(
      "endpoint", po::value(&endpoint),
      "the daemon (default: $SALUS_ENDPOINT, else a local daemon's ipc socket, else "
      "tcp://127.0.0.1:5501; `salusctl endpoint` prints which)")(
      "server-key", po::value(&server_key),
      "the daemon's CURVE public key or key file, for a remote endpoint")(
      "secret-key", po::value(&secret_key), "this client's CURVE secret key or key file")(
      "json", "print JSON (sessions, memory, allocations)")("command", po::value(&command),
                                                            "the command")(
      "argument", po::value(&argument), "the command's argument")("device", po::value(&device),
                                                                  "move's device")(
      "snapshot", po::value(&snapshot),
      "drain: write a snapshot of the sessions to this directory, on the daemon's host, for "
      "salus-server --restore");
  po::positional_options_description pos;
  pos.add("command", 1).add("argument", 1).add("device", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "salusctl: " << e.what() << "\n\n" << desc;
    return 2;
  }
  if (vm.count("version")) {
    std::cout << salus::VersionText("salusctl");
    return 0;
  }
  if (vm.count("help") || command.empty()) {
    std::cout << desc;
    return command.empty() && !vm.count("help") ? 2 : 0;
  }
  if (command == "endpoint") {  // which daemon a client reaches (Note [Default endpoint])
    std::cout << endpoint << "\n";
    return 0;
  }
  if (command == "keygen") {
    if (argument.empty()) {
      std::cerr << "salusctl: keygen needs a path prefix, e.g. salusctl keygen /etc/salus/server\n";
      return 2;
    }
    return Keygen(argument);
  }
  if (command != "status" && command != "sessions" && command != "memory" && command != "drain" &&
      command != "close" && command != "move" && command != "allocations") {
    std::cerr << "salusctl: unknown command '" << command << "'\n\n" << desc;
    return 2;
  }
  salus::client::Client::Options o;
  o.name = "salusctl";
  o.timeout = std::chrono::milliseconds(5000);
  o.server_key = server_key;
  o.secret_key = secret_key;
  auto client = salus::client::Client::Connect(endpoint, o);
  if (!client.ok()) return Fail(client.status());
  const bool json = vm.count("json") > 0;
  if (command == "status") return Status(**client);
  if (command == "sessions") return Sessions(**client, json);
  if (command == "memory") return Memory(**client, json);
  if (command == "allocations") return Allocations(**client, json);
  if (command == "close" || command == "move") {
    char* end = nullptr;
    const unsigned long long id = std::strtoull(argument.c_str(), &end, 10);
    if (argument.empty() || *end != '\0' || (command == "move" && device.empty())) {
      std::cerr << "salusctl: " << command << " needs a session id"
                << (command == "move" ? " and a device" : "")
                << " (salusctl sessions lists them)\n";
      return 2;
    }
    if (command == "move") {
      auto moved = (*client)->MoveSession(id, device);
      if (!moved.ok()) return Fail(moved.status());
      std::cout << "moving session " << id << " from " << moved->first << " to " << moved->second
                << "\n";
      return 0;
    }
    if (auto s = (*client)->CloseSession(id); !s.ok()) return Fail(s);
    std::cout << "closed session " << id << "\n";
    return 0;
  }
  if (!snapshot.empty()) {
    // The daemon writes it, from its own working directory: name it absolutely.
    std::error_code ec;
    snapshot = std::filesystem::absolute(snapshot, ec).string();
  }
  if (auto s = (*client)->Drain(snapshot); !s.ok()) return Fail(s);
  std::cout << (snapshot.empty()
                    ? "draining: in-flight iterations finish, then the daemon exits\n"
                    : "draining: queued iterations finish, the sessions are written to " +
                          snapshot + ", then the daemon exits\n");
  return 0;
}
