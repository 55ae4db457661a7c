#include "server/request_pacer.h"

#include <algorithm>

namespace salus::server {

void RequestPacer::Refill(Bucket& b, Nanos now) const {
  const double burst = std::max(rate_, 1.0);  // one second's worth
  b.tokens = std::min(burst, b.tokens + rate_ * ToSeconds(now - b.refilled));
  b.refilled = now;
}

bool RequestPacer::Offer(const std::string& key, Work work) {
  if (rate_ <= 0) {
    work();
    return true;
  }
  {
    MutexLock lock(&mu_);
    const Nanos now = clock_->Now();
    auto [it, fresh] = buckets_.try_emplace(key);
    Bucket& b = it->second;
    if (fresh) {
      b.tokens = std::max(rate_, 1.0);
      b.refilled = now;
    }
    Refill(b, now);
    if (!b.waiting.empty() || b.tokens < 1) {
      if ((max_held_ != 0 && b.waiting.size() >= max_held_) ||
          (max_held_total_ != 0 && held_ >= max_held_total_)) {
        return false;
      }
      b.waiting.push_back(std::move(work));
      ++held_;
      return true;
    }
    b.tokens -= 1;
  }
  work();  // outside the lock: it may answer, or offer more
  return true;
}

size_t RequestPacer::Release() {
  std::vector<Work> ready;
  {
    MutexLock lock(&mu_);
    const Nanos now = clock_->Now();
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      Bucket& b = it->second;
      Refill(b, now);
      while (!b.waiting.empty() && b.tokens >= 1) {
        ready.push_back(std::move(b.waiting.front()));
        b.waiting.pop_front();
        b.tokens -= 1;
        --held_;
      }
      // A full bucket with nothing waiting is the same as none: forget it.
      if (b.waiting.empty() && b.tokens >= std::max(rate_, 1.0)) {
        it = buckets_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Work& w : ready) w();
  return ready.size();
}

void RequestPacer::Flush() {
  std::vector<Work> all;
  {
    MutexLock lock(&mu_);
    for (auto& [key, b] : buckets_) {
      for (Work& w : b.waiting) all.push_back(std::move(w));
    }
    buckets_.clear();
    held_ = 0;
  }
  for (Work& w : all) w();
}

size_t RequestPacer::held() const {
  MutexLock lock(&mu_);
  return held_;
}

}  // namespace salus::server
