// Mesh's receive path: the I/O thread's reads (frame headers, bodies into queues or straight into
// a posted destination), the spare bodies it reuses, and the receiving calls.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "tcp_controller/tcp_mesh.h"
#include "tcp_controller/tcp_mesh_impl.h"

namespace hvdc {
namespace tcp {
namespace {

// Why a connection ended without the peer's goodbye, for the lost-peer message. A killed process's
// kernel closes its connections (eof), or resets those with unread data: the same story.
std::string Ended(const boost::system::error_code& ec, bool mid_message) {
  const char* where = mid_message ? " in the middle of a message" : "";
  if (ec == asio::error::eof || ec == asio::error::connection_reset) {
    return fmt::format(
        "closed the connection without shutting down{} (the process exited or was killed{})", where,
        ec == asio::error::eof ? "" : "; the connection was reset");
  }
  return fmt::format("connection failed{}: {}", where, ec.message());
}

}  // namespace

void Mesh::Impl::StartRead(int p) {
  Peer& peer = peers[p];
  asio::async_read(
      *peer.socket, asio::buffer(peer.header, kFrameHeaderBytes),
      [this, p](const boost::system::error_code& ec, size_t) {
        Peer& pr = peers[p];
        pr.last_heard = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lock(mu);
        if (ec) {
          if (closing) {  // the peer's half-close, or our own final close
            pr.eof = true;
            cv.notify_all();
          } else if (ec == asio::error::eof && pr.said_bye) {
            // A peer that finished its job first: the error matters only to an
            // operation still waiting for that peer.
            FailPeerLocked(p, "closed the connection", /*warn=*/false,
                           /*lost=*/false);
          } else {
            FailPeerLocked(p, Ended(ec, /*mid_message=*/false));
          }
          return;
        }
        FrameHeader frame;
        const std::string bad = DecodeFrameHeader(pr.header, &frame);
        if (!bad.empty()) {
          FailPeerLocked(p, fmt::format("sent a {}; connection dropped", bad));
          return;
        }
        pr.channel = frame.channel;
        const uint64_t length = frame.length;
        if (length == 0 && pr.channel == kHeartbeatChannel) {
          lock.unlock();
          StartRead(p);
          return;
        }
        if (length == 0 && pr.channel == kByeChannel) {
          pr.said_bye = true;
          lock.unlock();
          StartRead(p);
          return;
        }
        if (length == 0) {
          inbox[Key(p, pr.channel)].emplace_back();
          cv.notify_all();
          lock.unlock();
          StartRead(p);
          return;
        }
        const uint64_t key = Key(p, pr.channel);
        auto post = posted.find(key);
        if (post != posted.end() && !post->second->taken && post->second->bytes == length) {
          auto queued = inbox.find(key);
          if (queued == inbox.end() || queued->second.empty()) {
            post->second->taken = true;
            PostedRecv* target = post->second;
            lock.unlock();
            ReadDirect(p, target, 0);
            return;
          }
        }
        pr.body = TakeSpareLocked(static_cast<size_t>(length));
        lock.unlock();
        // Shrinking a reused body writes nothing; only new bytes are filled.
        pr.body.resize(static_cast<size_t>(length));
        ReadBody(p, 0);
      });
}

void Mesh::Impl::ReadDirect(int p, PostedRecv* post, size_t offset) {
  Peer& peer = peers[p];
  peer.socket->async_read_some(
      asio::buffer(post->dst + offset, post->bytes - offset),
      [this, p, post, offset](const boost::system::error_code& ec, size_t n) {
        Peer& pr = peers[p];
        pr.last_heard = std::chrono::steady_clock::now();
        if (!ec && offset + n < post->bytes) {
          ReadDirect(p, post, offset + n);
          return;
        }
        std::unique_lock<std::mutex> lock(mu);
        if (ec && pr.error.ok()) {
          FailPeerLocked(p, Ended(ec, /*mid_message=*/true));
        }
        if (ec) {
          post->status =
              pr.error.ok() ? Status::UnknownError("TCP transport: read aborted") : pr.error;
        }
        posted.erase(Key(p, pr.channel));
        post->done = true;  // the receiver may return (and drop *post) once mu is released
        cv.notify_all();
        if (ec) return;
        lock.unlock();
        StartRead(p);
      });
}

Status Mesh::Impl::RecvDirect(int peer, uint32_t channel, void* dst, size_t bytes, bool* direct) {
  *direct = false;
  const uint64_t key = Key(peer, channel);
  Peer& p = peers[peer];
  PostedRecv post;
  post.dst = static_cast<uint8_t*>(dst);
  post.bytes = bytes;
  {
    std::unique_lock<std::mutex> lock(mu);
    auto queued = inbox.find(key);
    const bool ready = (queued != inbox.end() && !queued->second.empty()) || !p.error.ok() ||
                       p.eof || closed || closing || EndedLocked() || posted.count(key) > 0;
    if (!ready) {
      posted[key] = &post;
      cv.wait(lock, [&] {
        if (post.done) return true;
        if (post.taken) return false;
        auto it = inbox.find(key);
        return (it != inbox.end() && !it->second.empty()) || !p.error.ok() || p.eof || closed ||
               EndedLocked();
      });
      if (post.done) {
        *direct = true;
        return post.status;
      }
      posted.erase(key);  // withdrawn before the I/O thread took it
    }
  }
  return Status::OK();
}

std::string Mesh::Impl::TakeSpareLocked(size_t length) {
  for (size_t i = 0; i < spare.size(); ++i) {
    if (spare[i].capacity() >= length) {
      std::string body = std::move(spare[i]);
      spare[i] = std::move(spare.back());
      spare.pop_back();
      spare_bytes -= body.capacity();
      return body;
    }
  }
  return std::string();
}

void Mesh::Impl::ReadBody(int p, size_t offset) {
  Peer& peer = peers[p];
  // Piece by piece, so every byte that arrives counts as a sign of life (heartbeats).
  peer.socket->async_read_some(asio::buffer(&peer.body[offset], peer.body.size() - offset),
                               [this, p, offset](const boost::system::error_code& ec, size_t n) {
                                 Peer& pr = peers[p];
                                 pr.last_heard = std::chrono::steady_clock::now();
                                 if (!ec && offset + n < pr.body.size()) {
                                   ReadBody(p, offset + n);
                                   return;
                                 }
                                 std::unique_lock<std::mutex> lock(mu);
                                 if (ec) {
                                   if (pr.error.ok()) {
                                     FailPeerLocked(p, Ended(ec, /*mid_message=*/true));
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
  if (m.EndedLocked()) {
    *status = m.first_lost;
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
    return (it != m.inbox.end() && !it->second.empty()) || !p.error.ok() || p.eof || m.closed ||
           m.EndedLocked();
  });
  lock.unlock();
  TryRecv(peer, channel, message, &status);
  return status;
}

Status Mesh::RecvInto(int peer, uint32_t channel, void* dst, size_t bytes) {
  std::string message;
  if (bytes >= Impl::kPostMinBytes) {
    if (peer < 0 || peer >= impl_->options.size || peer == impl_->options.rank) {
      return Status::InvalidArgument(fmt::format("TCP transport: cannot receive from {}", peer));
    }
    bool direct = false;
    HVDC_RETURN_IF_ERROR(impl_->RecvDirect(peer, channel, dst, bytes, &direct));
    if (direct) return Status::OK();
  }
  HVDC_RETURN_IF_ERROR(Recv(peer, channel, &message));
  if (message.size() != bytes) {
    return Status::PreconditionError(fmt::format(
        "TCP transport: {} sent {} bytes on channel {} where this rank expected {} (the ranks "
        "disagree about the operation)",
        impl_->Describe(peer), message.size(), channel, bytes));
  }
  if (bytes > 0) std::memcpy(dst, message.data(), bytes);
  Recycle(std::move(message));
  return Status::OK();
}

void Mesh::Recycle(std::string&& message) {
  Impl& m = *impl_;
  const size_t capacity = message.capacity();
  if (capacity < Impl::kSpareMinBytes) return;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.spare.size() < Impl::kSpareMaxBuffers && m.spare_bytes + capacity <= Impl::kSpareMaxBytes) {
    m.spare_bytes += capacity;
    m.spare.push_back(std::move(message));
  }
}

Status Mesh::RecvLarge(int peer, uint32_t channel, void* dst, size_t bytes) {
  auto* p = static_cast<uint8_t*>(dst);
  return ForEachFrame(
      bytes, [&](size_t offset, size_t n) { return RecvInto(peer, channel, p + offset, n); });
}

}  // namespace tcp
}  // namespace hvdc
