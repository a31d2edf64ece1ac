#include "tcp_controller/tcp_mesh.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/logging.h"
#include "tcp_controller/tcp_mesh_impl.h"

namespace hvdc {
namespace tcp {
namespace {

uint64_t Key(int peer, uint32_t channel) { return (static_cast<uint64_t>(peer) << 32) | channel; }

}  // namespace

std::string Mesh::Impl::Describe(int p) const {
  return fmt::format("rank {} ({})", p, peers[p].address.empty() ? "?" : peers[p].address);
}

void Mesh::Impl::Start() {
  work = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(
      io.get_executor());
  for (int p = 0; p < options.size; ++p) {
    if (p != options.rank) StartRead(p);
  }
  thread = std::thread([this] { io.run(); });
}

void Mesh::Impl::StartRead(int p) {
  Peer& peer = peers[p];
  asio::async_read(*peer.socket, asio::buffer(peer.header, kFrameHeaderBytes),
                   [this, p](const boost::system::error_code& ec, size_t) {
                     Peer& pr = peers[p];
                     std::unique_lock<std::mutex> lock(mu);
                     if (ec) {
                       if (closing) {  // the peer's half-close, or our own final close
                         pr.eof = true;
                         cv.notify_all();
                       } else if (ec == asio::error::eof) {
                         // A peer that finished its job first ends like this too: the error matters
                         // only to an operation still waiting for that peer.
                         FailPeerLocked(p, "closed the connection", /*warn=*/false);
                       } else {
                         FailPeerLocked(p, fmt::format("connection failed: {}", ec.message()));
                       }
                       return;
                     }
                     const uint32_t magic = GetLe<uint32_t>(pr.header);
                     pr.channel = GetLe<uint32_t>(pr.header + 4);
                     const uint64_t length = GetLe<uint64_t>(pr.header + 8);
                     if (magic != kFrameMagic || length > kMaxFrameBytes) {
                       FailPeerLocked(p, fmt::format("sent a garbage frame (magic {:#x}, length "
                                                     "{}); connection dropped",
                                                     magic, length));
                       return;
                     }
                     if (length == 0) {
                       inbox[Key(p, pr.channel)].emplace_back();
                       cv.notify_all();
                       lock.unlock();
                       StartRead(p);
                       return;
                     }
                     lock.unlock();
                     ReadBody(p, length);
                   });
}

void Mesh::Impl::ReadBody(int p, uint64_t length) {
  Peer& peer = peers[p];
  peer.body.resize(static_cast<size_t>(length));
  asio::async_read(*peer.socket, asio::buffer(&peer.body[0], peer.body.size()),
                   [this, p](const boost::system::error_code& ec, size_t) {
                     Peer& pr = peers[p];
                     std::unique_lock<std::mutex> lock(mu);
                     if (ec) {
                       if (pr.error.ok()) {
                         FailPeerLocked(p, fmt::format("connection failed in the middle of a "
                                                       "message: {}",
                                                       ec == asio::error::eof ? "closed by the peer"
                                                                              : ec.message()));
                       }
                       return;
                     }
                     inbox[Key(p, pr.channel)].push_back(std::move(pr.body));
                     pr.body = std::string();
                     cv.notify_all();
                     lock.unlock();
                     StartRead(p);
                   });
}

void Mesh::Impl::StartWrite(int p) {
  Peer& peer = peers[p];
  SendRequest* req = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (peer.sends.empty()) {
      peer.writing = false;
      return;
    }
    req = peer.sends.front();
  }
  std::array<asio::const_buffer, 2> buffers = {asio::buffer(req->header, kFrameHeaderBytes),
                                               asio::buffer(req->data, req->bytes)};
  asio::async_write(*peer.socket, buffers, [this, p](const boost::system::error_code& ec, size_t) {
    Peer& pr = peers[p];
    {
      std::lock_guard<std::mutex> lock(mu);
      if (ec) {
        FailPeerLocked(p, fmt::format("send failed: {}", ec.message()));
        return;
      }
      // The peer failed (read side) after this write had completed: its queue is already failed.
      if (!pr.error.ok() || pr.sends.empty()) return;
      SendRequest* done = pr.sends.front();
      pr.sends.pop_front();
      done->done = true;
      cv.notify_all();
    }
    StartWrite(p);
  });
}

void Mesh::Impl::FailPeerLocked(int p, const std::string& what, bool warn) {
  Peer& peer = peers[p];
  if (peer.error.ok()) {
    peer.error = Status::UnknownError(fmt::format("TCP transport: {} {}", Describe(p), what));
    if (warn && !closing) {
      LogWarning("{}", peer.error.message());
    } else {
      LogDebug("{}", peer.error.message());
    }
  }
  for (SendRequest* req : peer.sends) {
    req->status = peer.error;
    req->done = true;
  }
  peer.sends.clear();
  peer.writing = false;
  boost::system::error_code ignored;
  if (peer.socket) peer.socket->close(ignored);
  cv.notify_all();
}

Mesh::Mesh(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Mesh::~Mesh() { Close(); }

int Mesh::rank() const { return impl_->options.rank; }
int Mesh::size() const { return impl_->options.size; }
const std::vector<std::string>& Mesh::hosts() const { return impl_->hosts; }

Status Mesh::Create(const MeshOptions& options, std::shared_ptr<Mesh>* out) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument(
        fmt::format("TCP transport: rank {} is not in [0, {})", options.rank, options.size));
  }
  auto impl = std::make_unique<Impl>(options);
  HVDC_RETURN_IF_ERROR(impl->Connect());
  if (options.size > 1) impl->Start();
  out->reset(new Mesh(std::move(impl)));
  return Status::OK();
}

Status Mesh::Send(int peer, uint32_t channel, const void* data, size_t bytes) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.options.size || peer == m.options.rank) {
    return Status::InvalidArgument(fmt::format("TCP transport: cannot send to rank {}", peer));
  }
  if (bytes > kMaxFrameBytes) {
    return Status::InvalidArgument(
        fmt::format("TCP transport: a message of {} bytes exceeds {}", bytes, kMaxFrameBytes));
  }
  SendRequest req;
  PutLe<uint32_t>(req.header, kFrameMagic);
  PutLe<uint32_t>(req.header + 4, channel);
  PutLe<uint64_t>(req.header + 8, bytes);
  req.data = data;
  req.bytes = bytes;
  Peer& p = m.peers[peer];
  std::unique_lock<std::mutex> lock(m.mu);
  if (m.closed) return Status::UnknownError("TCP transport: the mesh is closed");
  if (!p.error.ok()) return p.error;
  p.sends.push_back(&req);
  if (!p.writing) {
    p.writing = true;
    asio::post(m.io, [&m, peer] { m.StartWrite(peer); });
  }
  m.cv.wait(lock, [&] { return req.done; });
  return req.status;
}

bool Mesh::TryRecv(int peer, uint32_t channel, std::string* message, Status* status) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.options.size || peer == m.options.rank) {
    *status = Status::InvalidArgument(fmt::format("TCP transport: cannot receive from {}", peer));
    return true;
  }
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.inbox.find(Key(peer, channel));
  if (it != m.inbox.end() && !it->second.empty()) {
    *message = std::move(it->second.front());
    it->second.pop_front();
    *status = Status::OK();
    return true;
  }
  if (!m.peers[peer].error.ok()) {
    *status = m.peers[peer].error;
    return true;
  }
  if (m.closed || m.peers[peer].eof) {
    *status = Status::UnknownError(fmt::format(
        "TCP transport: {} has shut down (nothing more will arrive)", m.Describe(peer)));
    return true;
  }
  return false;
}

Status Mesh::Recv(int peer, uint32_t channel, std::string* message) {
  Impl& m = *impl_;
  Status status;
  if (TryRecv(peer, channel, message, &status)) return status;
  std::unique_lock<std::mutex> lock(m.mu);
  const uint64_t key = Key(peer, channel);
  Peer& p = m.peers[peer];
  m.cv.wait(lock, [&] {
    auto it = m.inbox.find(key);
    return (it != m.inbox.end() && !it->second.empty()) || !p.error.ok() || p.eof || m.closed;
  });
  lock.unlock();
  TryRecv(peer, channel, message, &status);
  return status;
}

Status Mesh::RecvInto(int peer, uint32_t channel, void* dst, size_t bytes) {
  std::string message;
  HVDC_RETURN_IF_ERROR(Recv(peer, channel, &message));
  if (message.size() != bytes) {
    return Status::PreconditionError(fmt::format(
        "TCP transport: {} sent {} bytes on channel {} where this rank expected {} (the ranks "
        "disagree about the operation)",
        impl_->Describe(peer), message.size(), channel, bytes));
  }
  if (bytes > 0) std::memcpy(dst, message.data(), bytes);
  return Status::OK();
}

Status Mesh::SendLarge(int peer, uint32_t channel, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t offset = 0;
  do {
    const size_t n = std::min<size_t>(bytes - offset, kMaxFrameBytes);
    HVDC_RETURN_IF_ERROR(Send(peer, channel, p + offset, n));
    offset += n;
  } while (offset < bytes);
  return Status::OK();
}

Status Mesh::RecvLarge(int peer, uint32_t channel, void* dst, size_t bytes) {
  auto* p = static_cast<uint8_t*>(dst);
  size_t offset = 0;
  do {
    const size_t n = std::min<size_t>(bytes - offset, kMaxFrameBytes);
    HVDC_RETURN_IF_ERROR(RecvInto(peer, channel, p + offset, n));
    offset += n;
  } while (offset < bytes);
  return Status::OK();
}

Status Mesh::PeerStatus(int peer) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (peer < 0 || peer >= impl_->options.size) {
    return Status::InvalidArgument(fmt::format("TCP transport: no rank {}", peer));
  }
  return impl_->peers[peer].error;
}

void Mesh::Close() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.closing) return;
    m.closing = true;
  }
  if (!m.thread.joinable()) {
    std::lock_guard<std::mutex> lock(m.mu);
    m.closed = true;
    return;
  }
  // Half-close every connection (after the writes already queued), then wait for the peers'.
  asio::post(m.io, [&m] {
    for (int p = 0; p < m.options.size; ++p) {
      if (p == m.options.rank || !m.peers[p].socket) continue;
      boost::system::error_code ignored;
      m.peers[p].socket->shutdown(tcp::socket::shutdown_send, ignored);
    }
  });
  {
    std::unique_lock<std::mutex> lock(m.mu);
    const bool all = m.cv.wait_for(lock, m.options.timeout, [&] {
      for (int p = 0; p < m.options.size; ++p) {
        if (p != m.options.rank && !m.peers[p].eof && m.peers[p].error.ok()) return false;
      }
      return true;
    });
    if (!all) {
      LogWarning(
          "TCP transport: rank {} closed its connections without every peer closing theirs "
          "within {} ms",
          m.options.rank, m.options.timeout.count());
    }
    m.closed = true;
    m.cv.notify_all();
  }
  asio::post(m.io, [&m] {
    for (Peer& p : m.peers) {
      boost::system::error_code ignored;
      if (p.socket) p.socket->close(ignored);
    }
  });
  m.work.reset();
  m.thread.join();
}

}  // namespace tcp
}  // namespace hvdc
