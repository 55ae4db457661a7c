// Limits: what requests may make the daemon hold, daemon-wide (the "limits" section of the
// config; docs/operations.md, Limits). Per-client quotas are in client_registry.h.
//
// Every size a request declares is checked against one of these before memory is touched
// (Note [Compile budgets] in exec/compile_limits.h for models), and every queue a request can
// wait in is bounded; past a limit the request is RESOURCE_EXHAUSTED (DEADLINE_EXCEEDED for
// compile_seconds), naming the limit.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "exec/compile_limits.h"
#include "salus/status.h"

namespace salus::server {

struct Limits {
  // One model's compilation: host bytes of constants it may hold, nodes it may declare, and
  // seconds it may take (0: no deadline).
  uint64_t max_constant_bytes = exec::kDefaultMaxConstantBytes;
  int64_t max_nodes = exec::kDefaultMaxNodes;
  double compile_seconds = 120;
  // Threads compiling models; creations wait for one in per-principal, then per-client turns.
  uint64_t compile_threads = 2;
  // Longest name a request may give (a session's, a client's).
  uint64_t max_name_bytes = 256;
  // Largest shared buffer, and all shared buffers of all clients mapped together.
  uint64_t max_shared_buffer_bytes = 4 * kGiB;
  uint64_t shared_buffer_bytes = 1024 * kGiB;
  // Requests held back by the pacer per client (per principal for those without a client).
  uint64_t paced_requests = 1000;
  // Replies held for one connection that does not read them, beyond ZeroMQ's own queue: at
  // most this many, and at most reply_backlog_bytes of them (four times that for all).
  uint64_t reply_backlog = 10000;
  uint64_t reply_backlog_bytes = 256 * kMiB;
  // Bytes of all clients' unanswered requests together (envelopes and tensor frames, queued
  // iterations and creations included). 0: a quarter of the machine's physical memory.
  uint64_t request_bytes = 0;
  // Host memory all sessions hold outside the arena together (compiled models' constants and
  // sources), compilations in progress included. 0: half the machine's physical memory.
  uint64_t host_bytes = 0;

  // The "limits" section: keys as above, byte counts as integers or size strings ("4GiB").
  // Unknown keys are errors naming them.
  static StatusOr<Limits> FromJson(const nlohmann::json& section);
  // The compilation limits of one model (without a deadline).
  exec::CompileLimits Compile() const;
};

// Half of the machine's physical memory: host_bytes' default.
uint64_t DefaultHostBytes();
// A quarter of it: request_bytes' default.
uint64_t DefaultRequestBytes();

}  // namespace salus::server
