#include "server/allocation_registry.h"

#include <fmt/format.h>

#include <cstdlib>

#include "common/check.h"
#include "common/units.h"
#include "server/client_registry.h"

namespace salus::server {
namespace {

// An allocation id: [a-z0-9][a-z0-9.-]{0,62} (a DNS label, dots allowed, so a pod's uid or a
// "<node>.<n>" name fits).
constexpr size_t kMaxIdChars = 63;

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > kMaxIdChars) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(id[0])) return false;
  for (char c : id) {
    if (!alnum(c) && c != '.' && c != '-') return false;
  }
  return true;
}

Status Invalid(std::string_view field, std::string what) {
  return InvalidArgumentError(fmt::format("allocation.{}: {}", field, what));
}

}  // namespace

// Note [Allocations]
// On a node shared by pods, the node's device plugin (the administrator, root over the ipc
// socket) grants each pod's share of the daemon as an allocation: an id, a secret token it
// hands to the pod ($SALUS_ALLOCATION_TOKEN), a memory budget, a latency class and priorities.
// A client that presents the token in Hello becomes a client of the allocation: its principal
// is "alloc:<id>", whichever transport principal said Hello (the token is its proof), and its
// role is always the user's, so a pod running as root gains nothing over the daemon. The
// client token Hello returns is bound to the transport principal as any other (Note [Client
// identity]). A pod's several processes are several clients of one allocation: the
// per-principal clients quota counts them, and the budget is theirs together.
//
// Budget: when CreateSession has compiled a session and knows its P and E, it charges P+E to
// the allocation (Reserve); past memory_bytes the session is RESOURCE_EXHAUSTED and nothing
// else changes. Within the budget the session queues for device memory as any other (a full
// device makes it wait, never fail). Closing the session, however it happens, gives the bytes
// back (Release). Charges are keyed by session id, so a release that comes twice counts once.
//
// Revoke forgets the allocation and its charges at once: its token is UNAUTHENTICATED from then
// on and Reserve fails, so a CreateSession racing the revoke cannot charge it. The server then
// drops the allocation's clients and closes their sessions as a lease expiry would; a session
// whose creation was past Reserve but not yet registered finds its charge gone (Holds) and
// removes itself.

AllocationTerms AllocationRegistry::TermsOf(const Entry& e) {
  AllocationTerms t;
  t.id = e.allocation.id();
  t.memory_bytes = e.allocation.memory_bytes();
  t.latency_class = e.allocation.latency_class();
  t.priority = e.allocation.priority();
  t.max_priority = e.allocation.max_priority();
  return t;
}

StatusOr<bool> AllocationRegistry::Grant(const v1::Allocation& a) {
  if (!ValidId(a.id())) {
    return Invalid("id", fmt::format("'{}' is not a valid id (expected [a-z0-9][a-z0-9.-]{{0,{}}})",
                                     a.id().substr(0, kMaxIdChars + 1), kMaxIdChars - 1));
  }
  if (std::abs(a.priority()) > kMaxPriority) {
    return Invalid("priority",
                   fmt::format("must be in [-{0}, {0}], got {1}", kMaxPriority, a.priority()));
  }
  if (a.max_priority() < 0 || a.max_priority() > kMaxPriority) {
    return Invalid("max_priority", fmt::format("must be in [0, {}] (0: the daemon's max_priority "
                                               "quota), got {}",
                                               kMaxPriority, a.max_priority()));
  }
  if (a.max_priority() > 0 && a.priority() > a.max_priority()) {
    return Invalid("priority",
                   fmt::format("{} is above max_priority {}", a.priority(), a.max_priority()));
  }
  if (!v1::LatencyClass_IsValid(a.latency_class())) {
    return Invalid("latency_class", fmt::format("must be BATCH (0) or INTERACTIVE (1), got {}",
                                                static_cast<int>(a.latency_class())));
  }
  if (a.pod().size() > kMaxPodChars) {
    return Invalid("pod", fmt::format("{} characters, more than {}", a.pod().size(), kMaxPodChars));
  }
  if (a.token().size() > kMaxAllocationTokenChars) {
    return Invalid("token", fmt::format("longer than {} characters", kMaxAllocationTokenChars));
  }
  MutexLock lock(&mu_);
  auto existing = by_id_.find(a.id());
  const bool created = existing == by_id_.end();
  std::string token = a.token();
  if (!created && token.empty()) token = existing->second.allocation.token();
  if (token.size() < kMinAllocationTokenChars) {
    return Invalid("token", fmt::format("needs at least {} characters{}", kMinAllocationTokenChars,
                                        token.empty() ? " (a new allocation needs a token)" : ""));
  }
  if (auto owner = id_by_token_.find(token); owner != id_by_token_.end()) {
    if (owner->second != a.id()) return Invalid("token", "is already used by another allocation");
  } else if (!created) {
    return Invalid("token",
                   fmt::format("differs from allocation {}'s: leave it empty to keep it, or "
                               "revoke the allocation and grant it anew",
                               a.id()));
  }
  v1::Allocation stored;
  stored.set_id(a.id());
  stored.set_token(token);
  stored.set_memory_bytes(a.memory_bytes());
  stored.set_latency_class(a.latency_class());
  stored.set_priority(a.priority());
  stored.set_max_priority(a.max_priority());
  stored.set_pod(a.pod());
  if (created) {
    Entry e;
    e.allocation = std::move(stored);
    by_id_.emplace(a.id(), std::move(e));
    id_by_token_.emplace(token, a.id());
  } else {
    existing->second.allocation = std::move(stored);
  }
  return created;
}

Status AllocationRegistry::Revoke(const std::string& id) {
  MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return NotFoundError(fmt::format("allocation '{}' does not exist", id));
  id_by_token_.erase(it->second.allocation.token());
  by_id_.erase(it);
  return OkStatus();
}

StatusOr<AllocationTerms> AllocationRegistry::Resolve(const std::string& token) const {
  MutexLock lock(&mu_);
  auto it = token.empty() ? id_by_token_.end() : id_by_token_.find(token);
  if (it == id_by_token_.end()) return UnauthenticatedError("unknown allocation token");
  return TermsOf(by_id_.at(it->second));
}

StatusOr<AllocationTerms> AllocationRegistry::Terms(const std::string& id) const {
  MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return NotFoundError(fmt::format("allocation '{}' was revoked", id));
  return TermsOf(it->second);
}

Status AllocationRegistry::Reserve(const std::string& id, uint64_t session, uint64_t bytes) {
  MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return NotFoundError(fmt::format("allocation '{}' was revoked", id));
  Entry& e = it->second;
  const uint64_t budget = e.allocation.memory_bytes();
  if (budget != 0 && (bytes > budget || e.used_bytes > budget - bytes)) {
    return ResourceExhaustedError(
        fmt::format("allocation {} memory_bytes={} reached: this session needs {} (P+E) and the "
                    "allocation's {} open sessions hold {} of its {}",
                    id, budget, FormatBytes(bytes), e.charged.size(), FormatBytes(e.used_bytes),
                    FormatBytes(budget)));
  }
  auto [charge, fresh] = e.charged.emplace(session, bytes);
  if (!fresh) {  // charged again: the new size replaces the old
    SALUS_DCHECK(charge->second <= e.used_bytes, "an allocation's charges exceed its total");
    e.used_bytes -= charge->second;
    charge->second = bytes;
  }
  e.used_bytes += bytes;
  return OkStatus();
}

void AllocationRegistry::Release(const std::string& id, uint64_t session) {
  MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  Entry& e = it->second;
  auto charge = e.charged.find(session);
  if (charge == e.charged.end()) return;
  SALUS_DCHECK(charge->second <= e.used_bytes, "an allocation's charges exceed its total");
  e.used_bytes -= charge->second;
  e.charged.erase(charge);
}

bool AllocationRegistry::Holds(const std::string& id, uint64_t session) const {
  MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  return it != by_id_.end() && it->second.charged.count(session) != 0;
}

void AllocationRegistry::IterationDone(const std::string& id) {
  MutexLock lock(&mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) ++it->second.iterations;
}

std::vector<v1::Allocation> AllocationRegistry::Save() const {
  MutexLock lock(&mu_);
  std::vector<v1::Allocation> out;
  out.reserve(by_id_.size());
  for (const auto& [id, e] : by_id_) out.push_back(e.allocation);
  return out;
}

std::vector<AllocationUsage> AllocationRegistry::List() const {
  MutexLock lock(&mu_);
  std::vector<AllocationUsage> out;
  out.reserve(by_id_.size());
  for (const auto& [id, e] : by_id_) {
    AllocationUsage u;
    u.allocation = e.allocation;
    u.allocation.clear_token();
    u.allocation.set_used_bytes(e.used_bytes);
    u.allocation.set_sessions(static_cast<uint32_t>(e.charged.size()));
    u.iterations = e.iterations;
    out.push_back(std::move(u));
  }
  return out;
}

size_t AllocationRegistry::Count() const {
  MutexLock lock(&mu_);
  return by_id_.size();
}

}  // namespace salus::server
