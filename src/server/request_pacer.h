// RequestPacer: at most `rate` requests per second per key, the rest held back and run later.
//
// A token bucket per key (a client, or a principal without one) holds up to one second of
// requests; a request that finds a token (and nothing of its key already waiting) runs at once,
// any other waits in its key's queue, in order, until Release finds tokens for it. A client
// that floods cheap requests and waits for the replies is thereby slowed to the rate, and the
// daemon spends no more than that on it; one that does not wait fills its requests-in-flight
// quota and is refused from then on. A key holds at most `max_held` requests back, and all keys
// together `max_held_total` (for requests without a client, whose principal has no such quota):
// past either Offer refuses the request, which the caller answers at once. See
// docs/operations.md, Security.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/thread_annotations.h"

namespace salus::server {

class RequestPacer {
 public:
  using Work = std::function<void()>;

  // rate 0: no limit (nothing is ever held). max_held, max_held_total 0: no bound.
  RequestPacer(const Clock* clock, double rate, uint64_t max_held = 0, uint64_t max_held_total = 0)
      : clock_(clock), rate_(rate), max_held_(max_held), max_held_total_(max_held_total) {}

  // Runs `work` now when `key` has a token, else keeps it for Release; returns false (and
  // neither runs nor keeps `work`) when the key, or all keys, hold as many as they may. Never
  // blocks.
  [[nodiscard]] bool Offer(const std::string& key, Work work) EXCLUDES(mu_);
  // Runs the held work that has tokens now; returns how many ran. Call it periodically.
  size_t Release() EXCLUDES(mu_);
  // Runs everything still held, tokens or not (at shutdown).
  void Flush() EXCLUDES(mu_);
  size_t held() const EXCLUDES(mu_);

 private:
  struct Bucket {
    double tokens = 0;
    Nanos refilled{0};
    std::deque<Work> waiting;
  };
  void Refill(Bucket& b, Nanos now) const;

  const Clock* clock_;
  const double rate_;
  const uint64_t max_held_;
  const uint64_t max_held_total_;
  uint64_t held_ GUARDED_BY(mu_) = 0;
  mutable Mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_ GUARDED_BY(mu_);
};

}  // namespace salus::server
