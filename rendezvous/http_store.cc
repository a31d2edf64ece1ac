#include "rendezvous/http_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <cstdlib>
#include <thread>

#include "rendezvous/hmac_sha256.h"

namespace hvdc {
namespace rendezvous {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// Runs the operations started on `io` until they finish or `timeout` passes; then closes the socket
// so nothing outlives the call. Returns false on timeout.
bool RunFor(asio::io_context& io, tcp::socket& socket, std::chrono::milliseconds timeout) {
  io.restart();
  io.run_for(timeout);
  if (io.stopped()) return true;
  boost::system::error_code ignored;
  socket.close(ignored);
  io.restart();
  io.run();  // lets the cancelled handlers run
  return false;
}

// Connects `socket` to host:port within the deadline; *what describes the failure.
bool Connect(asio::io_context& io, tcp::socket& socket, const std::string& host, int port,
             std::chrono::milliseconds timeout, std::string* what) {
  tcp::resolver resolver(io);
  boost::system::error_code ec = asio::error::timed_out;
  resolver.async_resolve(
      host, std::to_string(port),
      [&](const boost::system::error_code& e, tcp::resolver::results_type r) {
        ec = e;
        if (e) return;
        ec = asio::error::timed_out;
        asio::async_connect(
            socket, r, [&](const boost::system::error_code& e2, const tcp::endpoint&) { ec = e2; });
      });
  if (!RunFor(io, socket, timeout)) {
    resolver.cancel();
    *what = "timed out";
    return false;
  }
  if (ec) {
    *what = ec.message();
    return false;
  }
  return true;
}

}  // namespace

Status HttpStore::Create(const std::string& host, int port, const std::string& scope,
                         std::chrono::milliseconds timeout, std::unique_ptr<HttpStore>* out) {
  std::unique_ptr<HttpStore> store(new HttpStore(host, port, scope, timeout));
  asio::io_context io;
  tcp::socket socket(io);
  std::string what;
  // The service may come up a little after the workers (jobs started by hand): retry until the
  // deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int backoff_ms = 10;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() > 0 && Connect(io, socket, host, port, left, &what)) break;
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff_ms) >= deadline) {
      return Status::UnknownError(
          fmt::format("cannot reach the rendezvous service at {}:{} (HOROVOD_GLOO_RENDEZVOUS_ADDR/"
                      "HOROVOD_GLOO_RENDEZVOUS_PORT): {} (tried for {} ms, "
                      "HOROVOD_GLOO_TIMEOUT_SECONDS)",
                      host, port, what, timeout.count()));
    }
    boost::system::error_code ignored;
    socket.close(ignored);
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
  boost::system::error_code ec;
  store->local_address_ = socket.local_endpoint(ec).address().to_string();
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
  *out = std::move(store);
  return Status::OK();
}

std::string HttpStore::Describe() const {
  return fmt::format("rendezvous service http://{}:{}/{}", host_, port_, scope_);
}

Status HttpStore::Request(const std::string& method, const std::string& key,
                          const std::string& body, int* code, std::string* response) {
  asio::io_context io;
  tcp::socket socket(io);
  std::string what;
  const std::string path = fmt::format("/{}/{}", scope_, key);
  if (!Connect(io, socket, host_, port_, timeout_, &what)) {
    return Status::UnknownError(
        fmt::format("{} {} at {}:{} failed: cannot connect: {}", method, path, host_, port_, what));
  }
  std::string signature;
  if (!secret_.empty()) {
    signature = fmt::format("X-Hvdc-Signature: {}\r\n",
                            ToHex(HmacSha256Of(secret_, method + "\n" + path + "\n" + body)));
  }
  const std::string request = fmt::format(
      "{} {} HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n{}Content-Length: {}\r\n\r\n{}",
      method, path, host_, port_, signature, body.size(), body);
  std::string reply;
  boost::system::error_code ec = asio::error::timed_out;
  asio::async_write(socket, asio::buffer(request), [&](const boost::system::error_code& e, size_t) {
    ec = e;
    if (e) return;
    ec = asio::error::timed_out;
    // The server closes the connection after the response.
    asio::async_read(socket, asio::dynamic_buffer(reply),
                     [&](const boost::system::error_code& e2, size_t) { ec = e2; });
  });
  if (!RunFor(io, socket, timeout_)) ec = asio::error::timed_out;
  if (ec && ec != asio::error::eof) {
    return Status::UnknownError(
        fmt::format("{} {} at {}:{} failed: {}", method, path, host_, port_, ec.message()));
  }
  // "HTTP/1.1 200 OK\r\n...\r\n\r\nbody"
  const size_t head_end = reply.find("\r\n\r\n");
  if (reply.compare(0, 5, "HTTP/") != 0 || head_end == std::string::npos) {
    return Status::UnknownError(fmt::format("{} {} at {}:{}: not an HTTP response ({} bytes)",
                                            method, path, host_, port_, reply.size()));
  }
  const size_t sp = reply.find(' ');
  *code = std::atoi(reply.c_str() + sp + 1);
  std::string head = reply.substr(0, head_end);
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string payload = reply.substr(head_end + 4);
  const size_t cl = head.find("\r\ncontent-length:");
  if (cl != std::string::npos) {
    const long long n = std::atoll(head.c_str() + cl + 17);
    if (n < 0 || static_cast<size_t>(n) > payload.size()) {
      return Status::UnknownError(
          fmt::format("{} {} at {}:{}: truncated response ({} of {} body bytes)", method, path,
                      host_, port_, payload.size(), n));
    }
    payload.resize(static_cast<size_t>(n));
  }
  *response = std::move(payload);
  return Status::OK();
}

Status HttpStore::Forbidden(const std::string& method, const std::string& key) const {
  return Status::UnknownError(fmt::format(
      "{} /{}/{} at {}:{} was refused (HTTP 403): the rendezvous service wants requests signed "
      "with the job's secret, and HOROVOD_SECRET_KEY is {} (start the ranks with horovodrun "
      "--gloo, or give them the service's HOROVOD_SECRET_KEY)",
      method, scope_, key, host_, port_, secret_.empty() ? "not set" : "a different one"));
}

Status HttpStore::Set(const std::string& key, const std::string& value) {
  int code = 0;
  std::string response;
  HVDC_RETURN_IF_ERROR(Request("PUT", key, value, &code, &response));
  if (code == 403) return Forbidden("PUT", key);
  if (code != 200) {
    return Status::UnknownError(
        fmt::format("PUT /{}/{} at {}:{} answered HTTP {}", scope_, key, host_, port_, code));
  }
  return Status::OK();
}

Status HttpStore::Get(const std::string& key, std::string* value, bool* found) {
  int code = 0;
  std::string response;
  HVDC_RETURN_IF_ERROR(Request("GET", key, "", &code, &response));
  if (code == 403) return Forbidden("GET", key);
  *found = code == 200;
  if (code == 200) {
    *value = std::move(response);
  } else if (code != 404) {
    return Status::UnknownError(
        fmt::format("GET /{}/{} at {}:{} answered HTTP {}", scope_, key, host_, port_, code));
  }
  return Status::OK();
}

}  // namespace rendezvous
}  // namespace hvdc
