// Mesh set-up: listen, learn every rank's address (static list or rendezvous store), then connect
// every pair -- all on the mesh's io_context, run by the calling thread until done or the deadline.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <set>
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
  std::vector<bool> claimed;  // per lower rank: a connection proved it and is being acknowledged
  std::vector<std::shared_ptr<tcp::socket>> pending;  // sockets in handshake (closed at the end)
  std::vector<std::shared_ptr<asio::steady_timer>> timers;
  int connected = 0;
  bool finished = false;
  std::set<std::string> warned;  // refusals logged as warnings (repeats go to the debug log)

  // Logs `message` as a warning the first time `key` is seen in this set-up, else as debug (a
  // peer retrying every 200 ms with the wrong secret would flood the log).
  void Warn(const std::string& key, const std::string& message) {
    if (warned.insert(key).second) {
      LogWarning("{}", message);
    } else {
      LogDebug("{}", message);
    }
  }

  bool Done() const { return connected == mesh->options.size - 1; }
  void Adopt(int q, std::shared_ptr<tcp::socket> s) {
    boost::system::error_code ignored;
    s->set_option(tcp::no_delay(true), ignored);
    mesh->peers[q].socket = std::make_unique<tcp::socket>(std::move(*s));
    if (++connected == mesh->options.size - 1) mesh->io.stop();
  }
};

std::string Endpoint(tcp::socket& s) {
  boost::system::error_code ec;
  const auto from = s.remote_endpoint(ec);
  if (ec) return "?";
  return fmt::format("{}:{}", from.address().to_string(), from.port());
}

std::string HostOf(const std::string& endpoint) { return endpoint.substr(0, endpoint.rfind(':')); }

// Logs why the connection from `from` was refused and drops it (the mesh keeps waiting).
void Refuse(Setup* st, tcp::socket& s, const std::string& from, const std::string& why) {
  st->Warn(HostOf(from) + " " + why,
           fmt::format("TCP transport: rank {} refused a connection from {}: {}",
                       st->mesh->options.rank, from, why));
  boost::system::error_code ignored;
  s.close(ignored);
}

// An incoming connection failed or ended during the handshake: drops it, and logs it unless it
// ended before its first byte (a port probe).
void Dropped(Setup* st, tcp::socket& s, const std::string& from, const char* stage,
             const boost::system::error_code& e, bool silent = false) {
  boost::system::error_code ignored;
  s.close(ignored);
  if (silent) {
    LogDebug("TCP transport: rank {}: {} closed the connection without a word",
             st->mesh->options.rank, from);
    return;
  }
  const std::string what =
      std::string(stage) == "proof"
          ? fmt::format(
                "it closed the connection instead of proving the job's secret (did it "
                "refuse our proof: a different HOROVOD_SECRET_KEY?): {}",
                e.message())
          : fmt::format("it ended in the middle of the handshake (truncated {}: {})", stage,
                        e.message());
  st->Warn(HostOf(from) + " " + stage,
           fmt::format("TCP transport: rank {} refused a connection from {}: {}",
                       st->mesh->options.rank, from, what));
}

// Handshake state of one incoming connection.
struct Incoming {
  std::shared_ptr<tcp::socket> socket;
  std::string from;
  uint8_t hello[kHelloBytes] = {};
  uint8_t challenge[kChallengeBytes] = {};
  uint8_t proof[kProofBytes] = {};
  uint8_t ack[kAckBytes] = {};
  Nonce nonce = {};
  int rank = -1;
};

void AcceptProof(std::shared_ptr<Setup> st, std::shared_ptr<Incoming> in) {
  asio::async_read(
      *in->socket, asio::buffer(in->proof), [st, in](const boost::system::error_code& e, size_t) {
        if (st->finished) return;
        if (e) return Dropped(st.get(), *in->socket, in->from, "proof", e);
        const MeshOptions& o = st->mesh->options;
        std::string why = CheckProof(in->proof, o.secret_key, in->hello, in->nonce, o.rank);
        if (why.empty() && (st->mesh->peers[in->rank].socket || st->claimed[in->rank])) {
          why = fmt::format("rank {}, which is already connected", in->rank);
        }
        if (!why.empty()) {
          return Refuse(st.get(), *in->socket,
                        fmt::format("{} (claiming rank {})", in->from, in->rank), why);
        }
        st->claimed[in->rank] = true;  // a second process proving the same rank is refused
        EncodeAck(in->ack, o.rank);
        asio::async_write(*in->socket, asio::buffer(in->ack),
                          [st, in](const boost::system::error_code& e2, size_t) {
                            if (st->finished) return;
                            if (e2) {  // the peer will retry
                              st->claimed[in->rank] = false;
                              return Dropped(st.get(), *in->socket, in->from, "ack", e2);
                            }
                            Peer& peer = st->mesh->peers[in->rank];
                            if (peer.address.empty()) peer.address = in->from;
                            st->Adopt(in->rank, in->socket);
                          });
      });
}

// Accepts connections from lower ranks; refuses (logs and drops) anything else. A stray that
// sends nothing only holds its socket until the set-up ends (the next accept is already waiting).
void AcceptNext(std::shared_ptr<Setup> st) {
  auto s = std::make_shared<tcp::socket>(st->mesh->io);
  st->acceptor->async_accept(*s, [st, s](const boost::system::error_code& ec) {
    if (st->finished) return;
    if (ec) {  // e.g. out of descriptors: keep accepting, but not in a busy loop
      LogWarning("TCP transport: rank {} failed to accept a connection: {}", st->mesh->options.rank,
                 ec.message());
      auto timer = std::make_shared<asio::steady_timer>(st->mesh->io);
      st->timers.push_back(timer);
      timer->expires_after(std::chrono::milliseconds(50));
      timer->async_wait([st, timer](const boost::system::error_code& e) {
        if (!e && !st->finished) AcceptNext(st);
      });
      return;
    }
    AcceptNext(st);
    st->pending.push_back(s);
    auto in = std::make_shared<Incoming>();
    in->socket = s;
    in->from = Endpoint(*s);
    // The magic and version first: a stray is refused at once, not after 48 bytes.
    asio::async_read(
        *s, asio::buffer(in->hello, kHelloPrefixBytes),
        [st, in](const boost::system::error_code& e, size_t n) {
          if (st->finished) return;
          if (e) return Dropped(st.get(), *in->socket, in->from, "hello", e, n == 0);
          const std::string why = CheckHelloPrefix(in->hello);
          if (!why.empty()) return Refuse(st.get(), *in->socket, in->from, why);
          asio::async_read(
              *in->socket,
              asio::buffer(in->hello + kHelloPrefixBytes, kHelloBytes - kHelloPrefixBytes),
              [st, in](const boost::system::error_code& e2, size_t) {
                if (st->finished) return;
                if (e2) return Dropped(st.get(), *in->socket, in->from, "hello", e2);
                const MeshOptions& o = st->mesh->options;
                HelloCheck self;
                self.rank = o.rank;
                self.size = o.size;
                self.job_token = o.job_token;
                std::string why2 = CheckHello(in->hello, self, &in->rank);
                if (why2.empty() && (st->mesh->peers[in->rank].socket || st->claimed[in->rank])) {
                  why2 = fmt::format("rank {}, which is already connected", in->rank);
                }
                if (!why2.empty()) return Refuse(st.get(), *in->socket, in->from, why2);
                in->nonce = RandomNonce();
                EncodeChallenge(in->challenge, o.rank, in->nonce,
                                AcceptorProof(o.secret_key, in->hello, in->nonce, o.rank));
                asio::async_write(*in->socket, asio::buffer(in->challenge),
                                  [st, in](const boost::system::error_code& e3, size_t) {
                                    if (st->finished) return;
                                    if (e3) {
                                      return Dropped(st.get(), *in->socket, in->from, "challenge",
                                                     e3);
                                    }
                                    AcceptProof(st, in);
                                  });
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

// Handshake state of one outgoing connection attempt (to rank q).
struct Outgoing {
  std::shared_ptr<Setup> st;
  int q = 0;
  tcp::resolver::results_type endpoints;
  int backoff_ms = 10;
  std::shared_ptr<tcp::socket> socket;
  uint8_t hello[kHelloBytes] = {};
  uint8_t challenge[kChallengeBytes] = {};
  uint8_t proof[kProofBytes] = {};
  uint8_t ack[kAckBytes] = {};

  // Drops this attempt; a new one follows after the backoff.
  void Fail(std::string why) {
    boost::system::error_code ignored;
    socket->close(ignored);
    Retry(st, q, endpoints, backoff_ms, std::move(why));
  }
};

void ReadAck(std::shared_ptr<Outgoing> out) {
  asio::async_read(
      *out->socket, asio::buffer(out->ack), [out](const boost::system::error_code& e, size_t) {
        if (out->st->finished) return;
        if (e) {
          return out->Fail(e == asio::error::eof
                               ? "it refused our proof of the job's secret (HOROVOD_SECRET_KEY "
                                 "differs?) or already has a connection from this rank"
                               : e.message());
        }
        const std::string why = CheckAck(out->ack, out->q);
        if (!why.empty()) return out->Fail(why);
        out->st->Adopt(out->q, out->socket);
      });
}

void ReadChallenge(std::shared_ptr<Outgoing> out) {
  asio::async_read(
      *out->socket, asio::buffer(out->challenge),
      [out](const boost::system::error_code& e, size_t) {
        if (out->st->finished) return;
        if (e) {
          return out->Fail(e == asio::error::eof
                               ? "it closed the connection after our hello (another job's "
                                 "process on that port, or a different peer list?)"
                               : e.message());
        }
        const MeshOptions& o = out->st->mesh->options;
        const std::string why = CheckChallenge(out->challenge, o.secret_key, out->hello, out->q);
        if (!why.empty()) {
          out->st->Warn(fmt::format("to {} {}", out->q, why),
                        fmt::format("TCP transport: rank {} refused the process at {} (where rank "
                                    "{} should be): {}",
                                    o.rank, Endpoint(*out->socket), out->q, why));
          return out->Fail(why);
        }
        Nonce nonce;
        std::memcpy(nonce.data(), out->challenge + 16, kNonceBytes);
        EncodeProof(out->proof, ConnectorProof(o.secret_key, out->hello, nonce, out->q));
        asio::async_write(*out->socket, asio::buffer(out->proof),
                          [out](const boost::system::error_code& e2, size_t) {
                            if (out->st->finished) return;
                            if (e2) return out->Fail(e2.message());
                            ReadAck(out);
                          });
      });
}

void ConnectTo(std::shared_ptr<Setup> st, int q, tcp::resolver::results_type endpoints,
               int backoff_ms) {
  auto out = std::make_shared<Outgoing>();
  out->st = st;
  out->q = q;
  out->endpoints = endpoints;
  out->backoff_ms = backoff_ms;
  out->socket = std::make_shared<tcp::socket>(st->mesh->io);
  st->pending.push_back(out->socket);
  asio::async_connect(*out->socket, endpoints,
                      [out](const boost::system::error_code& ec, const tcp::endpoint&) {
                        if (out->st->finished) return;
                        if (ec) return out->Fail(ec.message());
                        const MeshOptions& o = out->st->mesh->options;
                        EncodeHello(out->hello, o.rank, o.size, o.job_token, RandomNonce());
                        asio::async_write(*out->socket, asio::buffer(out->hello),
                                          [out](const boost::system::error_code& e, size_t) {
                                            if (out->st->finished) return;
                                            if (e) return out->Fail(e.message());
                                            ReadChallenge(out);
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
      // The transport's description names the service's variables and who set them.
      const std::string where =
          o.source == MeshOptions().source ? "the " + o.store->Describe() : o.source;
      return Status::UnknownError(fmt::format(
          "TCP transport: rank {} timed out after {} s waiting at {} for ranks {} to register "
          "(HOROVOD_GLOO_TIMEOUT_SECONDS; were they started, with HOROVOD_SIZE={}?)",
          o.rank, std::chrono::duration_cast<std::chrono::seconds>(o.timeout).count(), where,
          JoinInts(missing), o.size));
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
                    !o.listen_origin.empty() ? fmt::format(" ({})", o.listen_origin)
                    : o.store                ? ""
                              : fmt::format(" (its {} entry '{}')", o.source, o.peers[o.rank]),
                    ec.message()));
  }
  const int bound_port = acceptor.local_endpoint(ec).port();
  // Listening on every interface (asked for): the others reach us at the store's local address.
  std::string advertised =
      address.is_unspecified() && o.store ? o.store->LocalAddress() : bind_host;
  if (advertised.find(':') != std::string::npos) advertised = "[" + advertised + "]";
  HVDC_RETURN_IF_ERROR(
      GatherAddresses(this, fmt::format("{}:{}", advertised, bound_port), deadline));
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
  st->claimed.assign(o.size, false);
  if (o.rank > 0) AcceptNext(st);
  tcp::resolver resolver(io);
  for (int q = o.rank + 1; q < o.size; ++q) {
    std::string host;
    int p = 0;
    HVDC_RETURN_IF_ERROR(ParseHostPort(peers[q].address, "", &host, &p));
    auto endpoints = resolver.resolve(host, std::to_string(p), ec);
    if (ec) {
      return Status::UnknownError(
          fmt::format("TCP transport: rank {} cannot resolve rank {}'s host '{}' (from {}): {}",
                      o.rank, q, host, o.source, ec.message()));
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
      fmt::format("TCP transport: rank {} could not connect to every rank within {} ms "
                  "(addresses from {}): {}",
                  o.rank, o.timeout.count(), o.source, fmt::join(why, "; ")));
}

}  // namespace tcp
}  // namespace hvdc
