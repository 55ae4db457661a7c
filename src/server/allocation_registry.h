// AllocationRegistry: the shares of the daemon that its administrator grants (Note
// [Allocations] in allocation_registry.cc).
//
// An allocation is an id, a secret token, a memory budget, a latency class and priorities. A
// client that presents the token in Hello acts as the allocation; its sessions take their class
// and priority from it, and their P+E is charged to its budget here, keyed by session, so a
// session released twice (closed by its owner and by a revoke) is charged back once. The
// registry knows nothing of clients or sessions beyond those keys: the server drops the clients
// of a revoked allocation (ClientRegistry) and closes their sessions (SessionManager).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "salus/status.h"
#include "salus/v1/salus.pb.h"

namespace salus::server {

// The shortest allocation token Grant accepts, and the longest (tokens are random secrets the
// device plugin makes; a longer one buys nothing).
inline constexpr size_t kMinAllocationTokenChars = 32;
inline constexpr size_t kMaxAllocationTokenChars = 1024;
// Longest pod label ("namespace/name": 63 + 1 + 253 in Kubernetes).
inline constexpr size_t kMaxPodChars = 317;

// What the sessions of an allocation's clients get, as the allocation says now.
struct AllocationTerms {
  std::string id;
  uint64_t memory_bytes = 0;  // 0: no budget
  v1::LatencyClass latency_class = v1::LATENCY_BATCH;
  int32_t priority = 0;
  int32_t max_priority = 0;  // 0: the daemon's max_priority quota
};

// One allocation as ListAllocations and the metrics show it (token cleared, `clients` left 0:
// the ClientRegistry counts those).
struct AllocationUsage {
  v1::Allocation allocation;
  uint64_t iterations = 0;  // iterations its sessions ran while it existed
};

class AllocationRegistry {
 public:
  // Creates allocation `a.id()` (true) or updates it (false). INVALID_ARGUMENT naming the
  // field: an id outside [a-z0-9][a-z0-9.-]{0,62}; a token shorter than
  // kMinAllocationTokenChars (or empty for a new id), longer than kMaxAllocationTokenChars,
  // used by another id, or (for an existing id) not its own; priority outside the protocol's
  // [-100, 100], max_priority outside [0, 100], or priority above a non-zero max_priority; an
  // unknown latency class; a pod label over kMaxPodChars. Reply-only fields are ignored.
  StatusOr<bool> Grant(const v1::Allocation& a) EXCLUDES(mu_);
  // Forgets allocation `id` and what its sessions were charged; NOT_FOUND when there is none.
  Status Revoke(const std::string& id) EXCLUDES(mu_);
  // The terms of the allocation `token` names; UNAUTHENTICATED "unknown allocation token"
  // for anything else (an empty, unknown or revoked token), and no more than that.
  StatusOr<AllocationTerms> Resolve(const std::string& token) const EXCLUDES(mu_);
  // The terms of allocation `id`; NOT_FOUND when it was revoked.
  StatusOr<AllocationTerms> Terms(const std::string& id) const EXCLUDES(mu_);

  // Charges `bytes` (the session's P+E) to allocation `id`'s budget for `session`, or
  // RESOURCE_EXHAUSTED naming the allocation and its budget when they do not fit, or NOT_FOUND
  // when it was revoked; nothing changes unless it is OK.
  Status Reserve(const std::string& id, uint64_t session, uint64_t bytes) EXCLUDES(mu_);
  // Gives back what `session` was charged, if anything.
  void Release(const std::string& id, uint64_t session) EXCLUDES(mu_);
  // Whether `session` is still charged to allocation `id` (false once it was revoked).
  bool Holds(const std::string& id, uint64_t session) const EXCLUDES(mu_);
  // Counts one finished iteration of a session of allocation `id`.
  void IterationDone(const std::string& id) EXCLUDES(mu_);

  // Every allocation, by id.
  std::vector<AllocationUsage> List() const EXCLUDES(mu_);
  // Every allocation as granted, its token included: for a snapshot only (Note [Restarts] in
  // snapshot.cc), which Grant takes back.
  std::vector<v1::Allocation> Save() const EXCLUDES(mu_);
  size_t Count() const EXCLUDES(mu_);

 private:
  struct Entry {
    v1::Allocation allocation;                       // as granted; the reply-only fields unset
    std::unordered_map<uint64_t, uint64_t> charged;  // session -> its P+E
    uint64_t used_bytes = 0;                         // sum of `charged`
    uint64_t iterations = 0;
  };
  static AllocationTerms TermsOf(const Entry& e);

  mutable Mutex mu_;
  std::map<std::string, Entry> by_id_ GUARDED_BY(mu_);
  std::unordered_map<std::string, std::string> id_by_token_ GUARDED_BY(mu_);
};

}  // namespace salus::server
