#include "server/client_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "common/config.h"
#include "common/sha256.h"
#include "common/units.h"

namespace salus::server {
namespace {

// Bytes of randomness in a client token (hex on the wire).
constexpr size_t kTokenBytes = 32;

void FillRandom(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {  // only with a kernel older than 3.17: nothing secure to fall back to
      std::fprintf(stderr, "salus-server: getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

std::string NewToken() {
  std::array<unsigned char, kTokenBytes> bytes;
  FillRandom(bytes.data(), bytes.size());
  std::string out;
  for (unsigned char b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

}  // namespace

// Note [Client identity]
// A client is not its connection: a DEALER that reconnects (a daemon restart of the network
// path, a dropped TCP link) keeps its work, and a ZeroMQ routing id is chosen by the peer, so
// anyone may present another's. Instead Hello issues 256 random bits, the token, which the
// client carries on every request; sessions and shared buffers belong to the token's client.
// The token is also bound to the principal the transport authenticated when Hello arrived
// (the Unix user of an ipc peer, the CURVE key of a remote one; loopback TCP is one
// unauthenticated principal per address), so a token that leaks to another user is useless to
// them. The client lives while requests carrying its token keep arriving within the lease, or
// a reply is still owed to it; then the registry forgets the token and the server closes what
// the client owned. A request with a forgotten token is UNAUTHENTICATED: the client says Hello
// again and starts afresh (its old sessions are gone). The registry keeps only each token's
// SHA-256, which is what a snapshot writes too (Note [Restarts] in snapshot.cc): a client a
// restarted daemon took up presents its token as before.

std::string AllocationPrincipal(const std::string& allocation) { return "alloc:" + allocation; }

uint64_t SecureRandom64() {
  uint64_t v = 0;
  FillRandom(&v, sizeof(v));
  return v;
}

Status QuotaExceeded(std::string_view name, uint64_t limit, std::string_view what) {
  return ResourceExhaustedError(
      fmt::format("quota {}={} reached: {} (the daemon's config, \"quotas\")", name, limit, what));
}

StatusOr<Quotas> Quotas::FromJson(const nlohmann::json& section) {
  Quotas q;
  if (section.is_null()) return q;
  if (!section.is_object()) return InvalidArgumentError("\"quotas\" must be an object");
  for (const auto& [key, value] : section.items()) {
    uint64_t* field = key == "sessions"                ? &q.sessions
                      : key == "persistent_bytes"      ? &q.persistent_bytes
                      : key == "requests_in_flight"    ? &q.requests_in_flight
                      : key == "shared_buffers"        ? &q.shared_buffers
                      : key == "clients_per_principal" ? &q.clients_per_principal
                      : key == "requests_per_second"   ? &q.requests_per_second
                      : key == "max_priority"          ? &q.max_priority
                      : key == "shared_buffer_bytes"   ? &q.shared_buffer_bytes
                      : key == "host_bytes"            ? &q.host_bytes
                      : key == "request_bytes"         ? &q.request_bytes
                                                       : nullptr;
    if (field == nullptr) {
      const std::vector<std::string> names = {"sessions",
                                              "persistent_bytes",
                                              "requests_in_flight",
                                              "shared_buffers",
                                              "shared_buffer_bytes",
                                              "clients_per_principal",
                                              "requests_per_second",
                                              "max_priority",
                                              "host_bytes",
                                              "request_bytes"};
      return InvalidArgumentError(fmt::format("unknown quota \"{}\"{} (expected {})", key,
                                              DidYouMean(key, names), fmt::join(names, ", ")));
    }
    const bool bytes_key = key == "persistent_bytes" || key == "host_bytes" ||
                           key == "shared_buffer_bytes" || key == "request_bytes";
    if (value.is_number_unsigned()) {
      *field = value.get<uint64_t>();
    } else if (value.is_string() && bytes_key) {
      auto bytes = ParseBytes(value.get<std::string>());
      if (!bytes.ok()) {
        return InvalidArgumentError(fmt::format("quota \"{}\": {}", key, bytes.status().message()));
      }
      *field = *bytes;
    } else {
      return InvalidArgumentError(
          fmt::format("quota \"{}\" must be a non-negative integer{}, got {}", key,
                      bytes_key ? " or a size such as \"4GiB\"" : "", value.dump()));
    }
  }
  return q;
}

StatusOr<ClientRef> ClientRegistry::Hello(const std::string& principal, std::string* token,
                                          const std::string& allocation) {
  const std::string who = allocation.empty() ? principal : AllocationPrincipal(allocation);
  MutexLock lock(&mu_);
  uint64_t& count = per_principal_[who];
  if (quotas_.clients_per_principal != 0 && count >= quotas_.clients_per_principal) {
    return QuotaExceeded("clients_per_principal", quotas_.clients_per_principal,
                         fmt::format("{} has that many clients with live leases", who));
  }
  Client c;
  c.ref.id = next_id_++;
  c.ref.name = fmt::format("c{}/{}", c.ref.id, who);
  c.ref.principal = who;
  c.ref.allocation = allocation;
  c.bound_to = principal;
  *token = NewToken();
  c.token = Sha256(*token);
  c.last_seen = clock_->Now();
  ++count;
  by_token_[c.token] = c.ref.id;
  ClientRef ref = c.ref;
  clients_.emplace(ref.id, std::move(c));
  return ref;
}

StatusOr<ClientRef> ClientRegistry::Resolve(const std::string& token,
                                            const std::string& principal) {
  if (token.empty()) {
    return UnauthenticatedError(
        "this request needs a client: send Hello first and carry its client_token");
  }
  const std::string hashed = Sha256(token);
  MutexLock lock(&mu_);
  auto t = by_token_.find(hashed);
  if (t != by_token_.end()) {
    Client& c = clients_.at(t->second);
    if (c.bound_to == principal) {
      c.last_seen = clock_->Now();
      return c.ref;
    }
  }
  return UnauthenticatedError(
      "the client_token is unknown or its lease expired: send Hello again (sessions of an "
      "expired client are closed)");
}

Status ClientRegistry::BeginRequest(uint64_t client, uint64_t bytes) {
  MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return UnauthenticatedError("the client's lease expired");
  Client& c = it->second;
  if (quotas_.requests_in_flight != 0 && c.in_flight >= quotas_.requests_in_flight) {
    return QuotaExceeded("requests_in_flight", quotas_.requests_in_flight,
                         "wait for replies before sending more");
  }
  if (quotas_.request_bytes != 0 &&
      (bytes > quotas_.request_bytes || c.in_flight_bytes > quotas_.request_bytes - bytes)) {
    return QuotaExceeded("request_bytes", quotas_.request_bytes,
                         fmt::format("this request has {} and the client's unanswered ones {}",
                                     FormatBytes(bytes), FormatBytes(c.in_flight_bytes)));
  }
  if (max_request_bytes_ != 0 &&
      (bytes > max_request_bytes_ || request_bytes_ > max_request_bytes_ - bytes)) {
    return ResourceExhaustedError(fmt::format(
        "this request has {} and all clients' unanswered ones {}: over limits.request_bytes={}",
        FormatBytes(bytes), FormatBytes(request_bytes_), FormatBytes(max_request_bytes_)));
  }
  ++c.in_flight;
  c.in_flight_bytes += bytes;
  request_bytes_ += bytes;
  return OkStatus();
}

void ClientRegistry::EndRequest(uint64_t client, uint64_t bytes) {
  MutexLock lock(&mu_);
  SALUS_DCHECK(request_bytes_ >= bytes, "request bytes underflow");
  request_bytes_ -= std::min(bytes, request_bytes_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (c.in_flight > 0) --c.in_flight;
  c.in_flight_bytes -= std::min(bytes, c.in_flight_bytes);
  c.last_seen = clock_->Now();
}

uint64_t ClientRegistry::request_bytes() const {
  MutexLock lock(&mu_);
  return request_bytes_;
}

// Note [Leases and stalls]
// A lease is the time a client may stay silent, and silence is only what the daemon could have
// heard. When the daemon itself stalls (stopped by a signal, swapped out, its I/O thread held
// up), requests pile up unread in its sockets, and clients that kept sending would look silent
// when it resumes. So expiry measures silence up to the last moment the frontend had read
// everything that had arrived (RpcFrontend::caught_up), not up to now: after a stall, the
// queued requests are read, and renew their clients, before anyone is expired; the grace equals
// the stall. A stall of the whole process (SIGSTOP, the host suspended) stops the frontend and
// the housekeeping alike, and when both resume the housekeeping may run before the frontend
// has read what waits; so the server also forgives every client the time its housekeeping
// stood still (Forgive).
std::vector<uint64_t> ClientRegistry::Expire(std::optional<Nanos> read_up_to) {
  std::vector<uint64_t> gone;
  MutexLock lock(&mu_);
  const Nanos now = read_up_to ? std::min(*read_up_to, clock_->Now()) : clock_->Now();
  for (auto it = clients_.begin(); it != clients_.end();) {
    const Client& c = it->second;
    if (c.in_flight > 0 || now <= c.last_seen || now - c.last_seen <= lease_) {
      ++it;
      continue;
    }
    gone.push_back(c.ref.id);
    it = Erase(it);
  }
  return gone;
}

void ClientRegistry::Forgive(Nanos stall) {
  MutexLock lock(&mu_);
  const Nanos now = clock_->Now();
  for (auto& [id, c] : clients_) c.last_seen = std::min(now, c.last_seen + stall);
}

std::unordered_map<uint64_t, ClientRegistry::Client>::iterator ClientRegistry::Erase(
    std::unordered_map<uint64_t, Client>::iterator it) {
  const Client& c = it->second;
  by_token_.erase(c.token);
  if (auto p = per_principal_.find(c.ref.principal); p != per_principal_.end()) {
    if (--p->second == 0) per_principal_.erase(p);
  }
  return clients_.erase(it);
}

std::vector<uint64_t> ClientRegistry::DropAllocation(const std::string& allocation) {
  std::vector<uint64_t> gone;
  if (allocation.empty()) return gone;
  MutexLock lock(&mu_);
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (it->second.ref.allocation != allocation) {
      ++it;
      continue;
    }
    gone.push_back(it->first);
    it = Erase(it);
  }
  return gone;
}

void ClientRegistry::Forget(uint64_t client) {
  MutexLock lock(&mu_);
  if (auto it = clients_.find(client); it != clients_.end()) Erase(it);
}

size_t ClientRegistry::Count() const {
  MutexLock lock(&mu_);
  return clients_.size();
}

std::optional<ClientRegistry::Saved> ClientRegistry::Save(uint64_t client) const {
  MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return std::nullopt;
  return Saved{it->second.ref, it->second.bound_to, it->second.token};
}

Status ClientRegistry::Restore(const Saved& saved) {
  if (saved.ref.id == 0 || saved.token_sha256.size() != kSha256Bytes) {
    return InvalidArgumentError(fmt::format("client {}: no id or no token", saved.ref.name));
  }
  MutexLock lock(&mu_);
  if (clients_.count(saved.ref.id) != 0 || by_token_.count(saved.token_sha256) != 0) {
    return AlreadyExistsError(fmt::format("client {} is here already", saved.ref.name));
  }
  Client c;
  c.ref = saved.ref;
  c.bound_to = saved.bound_to;
  c.token = saved.token_sha256;
  c.last_seen = clock_->Now();
  next_id_ = std::max(next_id_, c.ref.id + 1);
  ++per_principal_[c.ref.principal];
  by_token_[c.token] = c.ref.id;
  clients_.emplace(c.ref.id, std::move(c));
  return OkStatus();
}

size_t ClientRegistry::CountOf(const std::string& principal) const {
  MutexLock lock(&mu_);
  auto it = per_principal_.find(principal);
  return it == per_principal_.end() ? 0 : it->second;
}

}  // namespace salus::server
