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

// Per-client limits (0: none). See docs/operations.md, Security.
struct Quotas {
  uint64_t sessions = 0;
  uint64_t persistent_bytes = 0;
  uint64_t requests_in_flight = 1024;
  uint64_t shared_buffers = 64;
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

// 64 bits from the kernel's cryptographic generator.
uint64_t SecureRandom64();

// A live client, as the requests it sends resolve to.
struct ClientRef {
  uint64_t id = 0;        // internal, never on the wire
  std::string name;       // public: "c<N>/<principal>"
  std::string principal;  // "uid:1000", "curve:<key>", "tcp:127.0.0.1"
};

class ClientRegistry {
 public:
  ClientRegistry(const Clock* clock, Nanos lease, Quotas quotas)
      : clock_(clock), lease_(lease), quotas_(quotas) {}

  // A new client for `principal`; its token is written to *token.
  StatusOr<ClientRef> Hello(const std::string& principal, std::string* token) EXCLUDES(mu_);
  // The live client `token` names, when it was issued to `principal`; renews its lease.
  // Anything else (empty, unknown, expired, another principal's) is UNAUTHENTICATED, and says
  // no more than that.
  StatusOr<ClientRef> Resolve(const std::string& token, const std::string& principal) EXCLUDES(mu_);
  // Counts a request of `client` in flight, or refuses it at the requests_in_flight quota.
  Status BeginRequest(uint64_t client) EXCLUDES(mu_);
  // Its reply went out: the client was alive until now.
  void EndRequest(uint64_t client) EXCLUDES(mu_);
  // Forgets the clients silent for longer than the lease with nothing in flight; returns them.
  std::vector<uint64_t> Expire() EXCLUDES(mu_);
  size_t Count() const EXCLUDES(mu_);

 private:
  struct Client {
    ClientRef ref;
    std::string token;
    Nanos last_seen{0};
    uint64_t in_flight = 0;
  };
  const Clock* clock_;
  const Nanos lease_;
  const Quotas quotas_;
  mutable Mutex mu_;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::unordered_map<std::string, uint64_t> by_token_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Client> clients_ GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> per_principal_ GUARDED_BY(mu_);
};

}  // namespace salus::server
