// MetricsHttpServer: /metrics (Prometheus text) and /healthz over HTTP/1.1, with Boost.Beast
// on one thread of its own. It binds loopback unless told otherwise. Every other path is 404,
// every method but GET and HEAD 405.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "salus/status.h"

namespace salus::server {

class MetricsHttpServer {
 public:
  using Render = std::function<std::string()>;
  using Health = std::function<bool()>;

  // `listen` is HOST:PORT (port 0 picks a free one).
  static StatusOr<std::unique_ptr<MetricsHttpServer>> Create(const std::string& listen,
                                                             Render metrics, Health healthy);
  ~MetricsHttpServer();
  void Stop();
  // HOST:PORT as bound.
  std::string address() const;

 private:
  struct Impl;
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace salus::server
