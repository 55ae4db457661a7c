// RequestPacer: at most `rate` requests per second per key, the rest held back and run later.
//
// A token bucket per key (a client, or a principal without one) holds up to one second of
// requests; a request that finds a token (and nothing of its key already waiting) runs at once,
// any other waits in its key's queue, in order, until Release finds tokens for it. A client
// that floods cheap requests and waits for the replies is thereby slowed to the rate, and the
// daemon spends no more than that on it; one that does not wait fills its requests-in-flight
// quota and is refused from then on. See docs/operations.md, Security.
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

  // rate 0: no limit.
  RequestPacer(const Clock* clock, double rate) : clock_(clock), rate_(rate) {}

  // Runs `work` now when `key` has a token, else keeps it for Release. Never blocks.
  void Offer(const std::string& key, Work work) EXCLUDES(mu_);
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
  mutable Mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_ GUARDED_BY(mu_);
};

}  // namespace salus::server
