// ClientRegistry: who is talking to the daemon, and what each may still ask for.
//
// A client is made by Hello and named by a secret token (Note [Client identity]) that every
// later request carries. The registry binds each token to the principal that said Hello,
// renews the client's lease on each of its requests, counts its requests in flight (a client
// owed a reply is alive, however long the reply takes) and forgets it when its lease runs out;
// the server then closes what it owned. The per-client request quota and the clients-per-
// principal quota are enforced here; the session, memory and buffer quotas where those things
// live (SessionManager).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/thread_annotations.h"
#include "salus/status.h"

namespace salus::server {

// The highest session priority the protocol allows (and the lowest, negated): under the
// PRIORITY and FAIR policies a weight, so it is bounded.
inline constexpr int32_t kMaxPriority = 100;

// Per-client limits (0: none). See docs/operations.md, Security.
struct Quotas {
  uint64_t sessions = 0;
  uint64_t persistent_bytes = 0;
  uint64_t requests_in_flight = 1024;
  // Bytes of those requests (envelopes and tensor frames) one client may have unanswered.
  uint64_t request_bytes = 4 * (uint64_t{1} << 30);
  uint64_t shared_buffers = 64;
  // Bytes of shared buffers one client may have mapped together.
  uint64_t shared_buffer_bytes = 64 * (uint64_t{1} << 30);
  // Host memory one client's sessions may hold outside the arena (their compiled models'
  // constants and sources; SessionRuntime::host_bytes).
  uint64_t host_bytes = 0;
  uint64_t clients_per_principal = 4096;
  // The highest priority a client's session may ask for (the protocol allows 100): under the
  // PRIORITY and FAIR policies priority is a share of the device, so this bounds what one
  // tenant can claim over the others.
  uint64_t max_priority = 100;
  // Requests other than work (CreateSession, RunIteration, RegisterBuffer: bounded by
  // requests_in_flight and the policy) answered per second per client, or per principal for
  // requests without a client; past it replies are paced (RequestPacer).
  uint64_t requests_per_second = 1000;

  // The "quotas" section of the config: keys as above; persistent_bytes may be a size
  // string. Unknown keys are errors naming them.
  static StatusOr<Quotas> FromJson(const nlohmann::json& section);
};

// RESOURCE_EXHAUSTED naming the quota `name` and its `limit`.
Status QuotaExceeded(std::string_view name, uint64_t limit, std::string_view what);

// "alloc:<id>": the principal of every client of allocation `id` (Note [Allocations] in
// allocation_registry.cc).
std::string AllocationPrincipal(const std::string& allocation);

// 64 bits from the kernel's cryptographic generator.
uint64_t SecureRandom64();

// A live client, as the requests it sends resolve to.
struct ClientRef {
  uint64_t id = 0;   // internal, never on the wire
  std::string name;  // public: "c<N>/<principal>"
  // "uid:1000", "curve:<key>", "tcp:127.0.0.1", or for a client of an allocation
  // "alloc:<id>" (Note [Allocations] in allocation_registry.cc)
  std::string principal;
  std::string allocation;  // the allocation it acts for; empty: none
};

class ClientRegistry {
 public:
  // `max_request_bytes`: bytes of unanswered requests of all clients together (0: no bound).
  ClientRegistry(const Clock* clock, Nanos lease, Quotas quotas, uint64_t max_request_bytes = 0)
      : clock_(clock), lease_(lease), quotas_(quotas), max_request_bytes_(max_request_bytes) {}

  // A new client for `principal` (whom the transport authenticated); its token is written to
  // *token. With an `allocation` the client acts for it: its principal, which the
  // clients_per_principal quota counts, is "alloc:<allocation>", while its token still works
  // only for `principal`.
  StatusOr<ClientRef> Hello(const std::string& principal, std::string* token,
                            const std::string& allocation = "") EXCLUDES(mu_);
  // The live client `token` names, when it was issued to `principal`; renews its lease.
  // Anything else (empty, unknown, expired, another principal's) is UNAUTHENTICATED, and says
  // no more than that.
  StatusOr<ClientRef> Resolve(const std::string& token, const std::string& principal) EXCLUDES(mu_);
  // Counts a request of `client` of `bytes` in flight, or refuses it at the requests_in_flight
  // or request_bytes quota, or past the daemon's bound on all requests' bytes.
  Status BeginRequest(uint64_t client, uint64_t bytes = 0) EXCLUDES(mu_);
  // Its reply went out: the client was alive until now. `bytes` as given to BeginRequest.
  void EndRequest(uint64_t client, uint64_t bytes = 0) EXCLUDES(mu_);
  // Bytes of all clients' unanswered requests.
  uint64_t request_bytes() const EXCLUDES(mu_);
  // Forgets the clients silent for longer than the lease with nothing in flight; returns them.
  // Silence is measured up to `read_up_to`, the last time every request that had arrived was
  // read (now when absent): Note [Leases and stalls].
  std::vector<uint64_t> Expire(std::optional<Nanos> read_up_to = std::nullopt) EXCLUDES(mu_);
  // The daemon stood still for `stall` (its housekeeping ran that late): every client's
  // silence is shortened by as much (Note [Leases and stalls]).
  void Forgive(Nanos stall) EXCLUDES(mu_);
  // Forgets the clients of `allocation` at once (it was revoked), whatever they have in
  // flight; returns them. Their tokens are UNAUTHENTICATED from then on.
  std::vector<uint64_t> DropAllocation(const std::string& allocation) EXCLUDES(mu_);
  // Forgets one client at once.
  void Forget(uint64_t client) EXCLUDES(mu_);
  size_t Count() const EXCLUDES(mu_);
  // Live clients whose principal is `principal`.
  size_t CountOf(const std::string& principal) const EXCLUDES(mu_);

  // A client as a snapshot keeps it (Note [Restarts] in server/snapshot.cc): its token only
  // as its SHA-256, which is all the registry itself keeps.
  struct Saved {
    ClientRef ref;
    std::string bound_to;      // the transport's principal its token works for
    std::string token_sha256;  // 32 bytes
  };
  // Live client `client`, or nothing.
  std::optional<Saved> Save(uint64_t client) const EXCLUDES(mu_);
  // Takes up a client of an earlier run of the daemon with its id, name and token; its lease
  // starts now. ALREADY_EXISTS when the id or the token is taken.
  Status Restore(const Saved& saved) EXCLUDES(mu_);

 private:
  struct Client {
    ClientRef ref;
    std::string token;     // its SHA-256: a read of the daemon's memory yields no usable token
    std::string bound_to;  // the transport's principal at Hello: the token works only for it
    Nanos last_seen{0};
    uint64_t in_flight = 0;
    uint64_t in_flight_bytes = 0;
  };
  // Removes `it`'s token and principal count and the client; returns the next client.
  std::unordered_map<uint64_t, Client>::iterator Erase(
      std::unordered_map<uint64_t, Client>::iterator it) REQUIRES(mu_);

  const Clock* clock_;
  const Nanos lease_;
  const Quotas quotas_;
  const uint64_t max_request_bytes_;
  mutable Mutex mu_;
  uint64_t request_bytes_ GUARDED_BY(mu_) = 0;  // of all clients' unanswered requests
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::unordered_map<std::string, uint64_t> by_token_ GUARDED_BY(mu_);  // by SHA-256
  std::unordered_map<uint64_t, Client> clients_ GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> per_principal_ GUARDED_BY(mu_);
};

}  // namespace salus::server
