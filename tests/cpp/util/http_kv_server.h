// A minimal HTTP key-value service like the launcher's rendezvous (PUT/GET /<scope>/<key>; one
// thread, one request per connection, no signatures), for tests that rendezvous over HTTP without
// starting the Python service.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hvdc {
namespace tcp_test {

// A minimal HTTP key-value service like the launcher's (one thread, one request per connection).
class TinyKvServer {
 public:
  TinyKvServer()
      : acceptor_(io_,
                  boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)) {
    thread_ = std::thread([this] { Serve(); });
  }
  ~TinyKvServer() {
    stop_ = true;
    boost::system::error_code ec;
    boost::asio::ip::tcp::socket poke(io_);
    poke.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }
  int port() const { return acceptor_.local_endpoint().port(); }
  // The paths ("/<scope>/<key>") PUT so far.
  std::vector<std::string> Paths() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [path, value] : kv_) out.push_back(path);
    return out;
  }

 private:
  void Serve() {
    while (!stop_) {
      boost::asio::ip::tcp::socket s(io_);
      boost::system::error_code ec;
      acceptor_.accept(s, ec);
      if (ec || stop_) continue;
      std::string req;
      char buf[4096];
      size_t head_end = std::string::npos;
      while (head_end == std::string::npos) {
        size_t n = s.read_some(boost::asio::buffer(buf), ec);
        if (ec) break;
        req.append(buf, n);
        head_end = req.find("\r\n\r\n");
      }
      if (head_end == std::string::npos) continue;  // a connection without a request
      const size_t cl = req.find("Content-Length: ");
      const size_t len = cl == std::string::npos ? 0 : std::stoul(req.substr(cl + 16));
      while (req.size() < head_end + 4 + len) {
        size_t n = s.read_some(boost::asio::buffer(buf), ec);
        if (ec) break;
        req.append(buf, n);
      }
      const std::string method = req.substr(0, req.find(' '));
      const size_t p0 = req.find(' ') + 1;
      const std::string path = req.substr(p0, req.find(' ', p0) - p0);
      std::string reply;
      std::lock_guard<std::mutex> lock(mu_);
      if (method == "PUT") {
        kv_[path] = req.substr(head_end + 4, len);
        reply = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
      } else if (kv_.count(path)) {
        reply = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(kv_[path].size()) +
                "\r\n\r\n" + kv_[path];
      } else {
        reply = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
      }
      boost::asio::write(s, boost::asio::buffer(reply), ec);
    }
  }

  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<std::string, std::string> kv_;
  std::thread thread_;
};

}  // namespace tcp_test
}  // namespace hvdc
