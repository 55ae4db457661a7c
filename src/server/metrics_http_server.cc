#include "server/metrics_http_server.h"

#include <fmt/format.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/logging.h"

namespace salus::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// A request larger than this is refused (413).
constexpr size_t kMaxRequestBytes = 8 * 1024;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const MetricsHttpServer::Render& render,
             const MetricsHttpServer::Health& health)
      : stream_(std::move(socket)), render_(render), health_(health) {}

  void Start() {
    parser_.body_limit(kMaxRequestBytes);
    parser_.header_limit(kMaxRequestBytes);
    stream_.expires_after(std::chrono::seconds(10));
    http::async_read(
        stream_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec) return;  // closed, timed out or malformed: nothing to answer
    const auto& req = parser_.get();
    auto res = std::make_shared<http::response<http::string_body>>();
    res->version(req.version());
    res->set(http::field::server, "salus-server");
    res->keep_alive(false);
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res->result(http::status::method_not_allowed);
      res->set(http::field::allow, "GET, HEAD");
      res->body() = "method not allowed\n";
    } else if (path == "/metrics") {
      res->result(http::status::ok);
      res->set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res->body() = render_();
    } else if (path == "/healthz") {
      const bool ok = health_();
      res->result(ok ? http::status::ok : http::status::service_unavailable);
      res->set(http::field::content_type, "text/plain");
      res->body() = ok ? "ok\n" : "draining\n";
    } else {
      res->result(http::status::not_found);
      res->set(http::field::content_type, "text/plain");
      res->body() = "not found: /metrics and /healthz are served\n";
    }
    if (req.method() == http::verb::head) {
      res->content_length(res->body().size());
      res->body().clear();
    }
    res->prepare_payload();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  const MetricsHttpServer::Render& render_;
  const MetricsHttpServer::Health& health_;
};

}  // namespace

struct MetricsHttpServer::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  Render render;
  Health health;
  std::thread thread;

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) std::make_shared<Connection>(std::move(socket), render, health)->Start();
      Accept();
    });
  }
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Create(const std::string& listen,
                                                                       Render metrics,
                                                                       Health healthy) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgumentError(
        fmt::format("metrics address '{}' must be HOST:PORT, e.g. 127.0.0.1:9464", listen));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  unsigned long port = 0;
  try {
    size_t used = 0;
    port = std::stoul(listen.substr(colon + 1), &used);
    if (used != listen.size() - colon - 1 || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return InvalidArgumentError(fmt::format("metrics address '{}': bad port", listen));
  }
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(metrics);
  impl->health = std::move(healthy);
  beast::error_code ec;
  const auto addr = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return InvalidArgumentError(fmt::format("metrics address '{}': bad host", listen));
  const tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return UnavailableError(
        fmt::format("cannot listen for metrics on '{}': {}", listen, ec.message()));
  }
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl)));
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  asio::post(impl_->io, [this] {
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->io.stop();
  });
  impl_->thread.join();
}

std::string MetricsHttpServer::address() const {
  beast::error_code ec;
  const auto ep = impl_->acceptor.local_endpoint(ec);
  return fmt::format("{}:{}", ep.address().to_string(), ep.port());
}

}  // namespace salus::server
