// Mesh set-up: listen, learn every rank's address (static list or rendezvous store), then connect
// every pair -- all on the mesh's io_context, run by the calling thread until done or the deadline.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/logging.h"
#include "tcp_controller/tcp_mesh_impl.h"

namespace hvdc {
namespace tcp {

Status ParseHostPort(const std::string& entry, const std::string& what, std::string* host,
                     int* port) {
  std::string h, p;
  if (!entry.empty() && entry[0] == '[') {
    const size_t close = entry.find(']');
    if (close == std::string::npos || close + 1 >= entry.size() || entry[close + 1] != ':') {
      return Status::InvalidArgument(
          fmt::format("{}: '{}' is not host:port ([v6-address]:port)", what, entry));
    }
    h = entry.substr(1, close - 1);
    p = entry.substr(close + 2);
  } else {
    const size_t colon = entry.rfind(':');
    if (colon == std::string::npos || entry.find(':') != colon) {
      return Status::InvalidArgument(fmt::format("{}: '{}' is not host:port", what, entry));
    }
    h = entry.substr(0, colon);
    p = entry.substr(colon + 1);
  }
  const bool digits = !p.empty() && p.size() <= 5 &&
                      std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int n = digits ? std::stoi(p) : -1;
  if (h.empty() || n < 0 || n > 65535) {
    return Status::InvalidArgument(
        fmt::format("{}: '{}' is not host:port with a port in [0, 65535]", what, entry));
  }
  *host = h;
  *port = n;
  return Status::OK();
}

namespace {

using Clock = std::chrono::steady_clock;

std::string JoinInts(const std::vector<int>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

// Shared by the handlers of one set-up (kept alive by them until they have all run).
struct Setup {
  Mesh::Impl* mesh = nullptr;
  tcp::acceptor* acceptor = nullptr;
  std::vector<std::string> last_error;  // per higher rank: why the last attempt failed
  std::vector<std::shared_ptr<tcp::socket>> pending;  // sockets in handshake (closed at the end)
  std::vector<std::shared_ptr<asio::steady_timer>> timers;
  int connected = 0;
  bool finished = false;

  bool Done() const { return connected == mesh->options.size - 1; }
  void Adopt(int q, std::shared_ptr<tcp::socket> s) {
    boost::system::error_code ignored;
    s->set_option(tcp::no_delay(true), ignored);
    mesh->peers[q].socket = std::make_unique<tcp::socket>(std::move(*s));
    if (++connected == mesh->options.size - 1) mesh->io.stop();
  }
};

void FillHello(uint8_t* b, const MeshOptions& o) {
  std::memset(b, 0, kHelloBytes);
  PutLe<uint32_t>(b, kHelloMagic);
  PutLe<uint32_t>(b + 4, kProtocolVersion);
  PutLe<int32_t>(b + 8, o.rank);
  PutLe<int32_t>(b + 12, o.size);
  PutLe<uint64_t>(b + 16, o.job_token);
}

// Accepts connections from lower ranks; refuses (logs and drops) anything else.
void AcceptNext(std::shared_ptr<Setup> st) {
  auto s = std::make_shared<tcp::socket>(st->mesh->io);
  st->acceptor->async_accept(*s, [st, s](const boost::system::error_code& ec) {
    if (ec || st->finished) return;
    AcceptNext(st);
    st->pending.push_back(s);
    auto hello = std::make_shared<std::array<uint8_t, kHelloBytes>>();
    asio::async_read(
        *s, asio::buffer(*hello), [st, s, hello](const boost::system::error_code& e, size_t) {
          if (e || st->finished) return;
          const MeshOptions& o = st->mesh->options;
          boost::system::error_code ignored;
          const auto from = s->remote_endpoint(ignored);
          const uint8_t* b = hello->data();
          const int rank = GetLe<int32_t>(b + 8);
          std::string refuse;
          if (GetLe<uint32_t>(b) != kHelloMagic || GetLe<uint32_t>(b + 4) != kProtocolVersion) {
            refuse = "not a horovod_compat TCP hello";
          } else if (GetLe<uint64_t>(b + 16) != o.job_token) {
            refuse = "a different job token (a process of another job?)";
          } else if (GetLe<int32_t>(b + 12) != o.size) {
            refuse = fmt::format("world size {} (ours is {})", GetLe<int32_t>(b + 12), o.size);
          } else if (rank < 0 || rank >= o.rank) {
            refuse = fmt::format("rank {} (only ranks below {} connect to it)", rank, o.rank);
          } else if (st->mesh->peers[rank].socket) {
            refuse = fmt::format("rank {}, which is already connected", rank);
          }
          if (!refuse.empty()) {
            LogWarning("TCP transport: rank {} refused a connection from {}:{}: {}", o.rank,
                       from.address().to_string(), from.port(), refuse);
            s->close(ignored);
            return;
          }
          auto ack = std::make_shared<std::array<uint8_t, kAckBytes>>();
          PutLe<uint32_t>(ack->data(), kAckMagic);
          PutLe<uint32_t>(ack->data() + 4, kProtocolVersion);
          PutLe<int32_t>(ack->data() + 8, o.rank);
          PutLe<int32_t>(ack->data() + 12, 0);
          asio::async_write(*s, asio::buffer(*ack),
                            [st, s, ack, rank](const boost::system::error_code& e2, size_t) {
                              if (e2 || st->finished || st->mesh->peers[rank].socket) return;
                              if (st->mesh->peers[rank].address.empty()) {
                                boost::system::error_code ig;
                                st->mesh->peers[rank].address =
                                    s->remote_endpoint(ig).address().to_string();
                              }
                              st->Adopt(rank, s);
                            });
        });
  });
}

void ConnectTo(std::shared_ptr<Setup> st, int q, tcp::resolver::results_type endpoints,
               int backoff_ms);

void Retry(std::shared_ptr<Setup> st, int q, tcp::resolver::results_type endpoints, int backoff_ms,
           std::string why) {
  st->last_error[q] = std::move(why);
  if (st->finished) return;
  auto timer = std::make_shared<asio::steady_timer>(st->mesh->io);
  st->timers.push_back(timer);
  timer->expires_after(std::chrono::milliseconds(backoff_ms));
  timer->async_wait([st, q, endpoints, backoff_ms, timer](const boost::system::error_code& ec) {
    if (ec || st->finished) return;
    ConnectTo(st, q, endpoints, std::min(backoff_ms * 2, 200));
  });
}

void ConnectTo(std::shared_ptr<Setup> st, int q, tcp::resolver::results_type endpoints,
               int backoff_ms) {
  auto s = std::make_shared<tcp::socket>(st->mesh->io);
  st->pending.push_back(s);
  asio::async_connect(
      *s, endpoints,
      [st, q, s, endpoints, backoff_ms](const boost::system::error_code& ec, const tcp::endpoint&) {
        if (st->finished) return;
        if (ec) return Retry(st, q, endpoints, backoff_ms, ec.message());
        auto buf = std::make_shared<std::array<uint8_t, kHelloBytes>>();
        FillHello(buf->data(), st->mesh->options);
        asio::async_write(
            *s, asio::buffer(*buf),
            [st, q, s, endpoints, backoff_ms, buf](const boost::system::error_code& e, size_t) {
              if (st->finished) return;
              if (e) return Retry(st, q, endpoints, backoff_ms, e.message());
              asio::async_read(
                  *s, asio::buffer(buf->data(), kAckBytes),
                  [st, q, s, endpoints, backoff_ms, buf](const boost::system::error_code& e2,
                                                         size_t) {
                    if (st->finished) return;
                    if (e2) {
                      return Retry(st, q, endpoints, backoff_ms,
                                   e2 == asio::error::eof
                                       ? "it closed the connection after our hello (another "
                                         "job's process on that port, or a wrong job token?)"
                                       : e2.message());
                    }
                    const uint8_t* b = buf->data();
                    if (GetLe<uint32_t>(b) != kAckMagic || GetLe<int32_t>(b + 8) != q) {
                      return Retry(st, q, endpoints, backoff_ms,
                                   "its answer was not a horovod_compat acknowledgement from "
                                   "that rank");
                    }
                    st->Adopt(q, s);
                  });
            });
      });
}

// Static list: every address is known. Store: publish ours, then poll for the others'.
Status GatherAddresses(Mesh::Impl* m, const std::string& advertised, Clock::time_point deadline) {
  const MeshOptions& o = m->options;
  if (o.store == nullptr) {
    for (int q = 0; q < o.size; ++q) m->peers[q].address = o.peers[q];
    return Status::OK();
  }
  HVDC_RETURN_IF_ERROR(o.store->Set(fmt::format("rank_{}", o.rank), advertised));
  m->peers[o.rank].address = advertised;
  std::vector<int> missing;
  for (int q = 0; q < o.size; ++q) {
    if (q != o.rank) missing.push_back(q);
  }
  int backoff_ms = 10;
  while (!missing.empty()) {
    std::vector<int> still;
    for (int q : missing) {
      std::string value;
      bool found = false;
      HVDC_RETURN_IF_ERROR(o.store->Get(fmt::format("rank_{}", q), &value, &found));
      if (found) {
        m->peers[q].address = value;
      } else {
        still.push_back(q);
      }
    }
    missing.swap(still);
    if (missing.empty()) break;
    if (Clock::now() >= deadline) {
      return Status::UnknownError(fmt::format(
          "TCP transport: rank {} timed out after {} s waiting at the {} for ranks {} to register "
          "(HOROVOD_GLOO_TIMEOUT_SECONDS; were they started, with HOROVOD_SIZE={}?)",
          o.rank, std::chrono::duration_cast<std::chrono::seconds>(o.timeout).count(),
          o.store->Describe(), JoinInts(missing), o.size));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
  return Status::OK();
}

}  // namespace

Status Mesh::Impl::Connect() {
  const MeshOptions& o = options;
  const Clock::time_point deadline = Clock::now() + o.timeout;
  if (o.store == nullptr && static_cast<int>(o.peers.size()) != o.size) {
    return Status::InvalidArgument(
        fmt::format("TCP transport: {} lists {} addresses for a world of {} ranks", o.source,
                    o.peers.size(), o.size));
  }
  hosts.assign(o.size, "");
  if (o.size == 1) {
    hosts[0] = o.store ? o.store->LocalAddress() : (o.peers.empty() ? "" : o.peers[0]);
    return Status::OK();
  }
  // Listen.
  std::string bind_host = o.bind_host;
  int port = 0;
  if (o.store == nullptr) {
    std::string own_host;
    HVDC_RETURN_IF_ERROR(ParseHostPort(
        o.peers[o.rank], fmt::format("{} entry {}", o.source, o.rank), &own_host, &port));
    if (bind_host.empty()) bind_host = own_host.find(':') != std::string::npos ? "::" : "0.0.0.0";
  } else if (bind_host.empty()) {
    bind_host = o.store->LocalAddress();
  }
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(bind_host, ec);
  if (ec) {
    return Status::InvalidArgument(fmt::format(
        "TCP transport: cannot listen on '{}': not an IP address ({})", bind_host, ec.message()));
  }
  tcp::acceptor acceptor(io);
  const tcp::endpoint listen_at(address, static_cast<uint16_t>(port));
  acceptor.open(listen_at.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(listen_at, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::UnknownError(
        fmt::format("TCP transport: rank {} cannot listen on {}:{}{}: {}", o.rank, bind_host, port,
                    o.store ? "" : fmt::format(" (its {} entry '{}')", o.source, o.peers[o.rank]),
                    ec.message()));
  }
  const int bound_port = acceptor.local_endpoint(ec).port();
  HVDC_RETURN_IF_ERROR(
      GatherAddresses(this, fmt::format("{}:{}", bind_host, bound_port), deadline));
  for (int q = 0; q < o.size; ++q) {
    int p = 0;
    HVDC_RETURN_IF_ERROR(
        ParseHostPort(peers[q].address, fmt::format("address of rank {}", q), &hosts[q], &p));
  }

  // Connect: lower ranks connect to higher ones; accept from the lower ones.
  auto st = std::make_shared<Setup>();
  st->mesh = this;
  st->acceptor = &acceptor;
  st->last_error.assign(o.size, "");
  if (o.rank > 0) AcceptNext(st);
  tcp::resolver resolver(io);
  for (int q = o.rank + 1; q < o.size; ++q) {
    std::string host;
    int p = 0;
    HVDC_RETURN_IF_ERROR(ParseHostPort(peers[q].address, "", &host, &p));
    auto endpoints = resolver.resolve(host, std::to_string(p), ec);
    if (ec) {
      return Status::UnknownError(
          fmt::format("TCP transport: rank {} cannot resolve rank {}'s host '{}': {}", o.rank, q,
                      host, ec.message()));
    }
    ConnectTo(st, q, endpoints, 10);
  }
  const auto left = deadline - Clock::now();
  if (left > Clock::duration::zero()) io.run_for(left);
  st->finished = true;
  acceptor.close(ec);
  for (auto& s : st->pending) s->close(ec);
  for (auto& t : st->timers) t->cancel();
  io.restart();
  io.run();  // the cancelled handlers (they return at once: st->finished)
  io.restart();
  if (st->Done()) return Status::OK();

  std::vector<std::string> why;
  for (int q = 0; q < o.size; ++q) {
    if (q == o.rank || peers[q].socket) continue;
    if (q < o.rank) {
      why.push_back(fmt::format("rank {} ({}) never connected to this rank at {}:{}", q,
                                peers[q].address, bind_host, bound_port));
    } else {
      why.push_back(fmt::format("rank {} at {}: {}", q, peers[q].address,
                                st->last_error[q].empty() ? "no answer" : st->last_error[q]));
    }
  }
  for (Peer& p : peers) p.socket.reset();
  return Status::UnknownError(
      fmt::format("TCP transport: rank {} could not connect to every rank within {} ms: {}", o.rank,
                  o.timeout.count(), fmt::join(why, "; ")));
}

}  // namespace tcp
}  // namespace hvdc
