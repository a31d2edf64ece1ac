#include "tcp_controller/tcp_mesh.h"

#include <fmt/format.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/logging.h"
#include "tcp_controller/tcp_mesh_impl.h"

namespace hvdc {
namespace tcp {

std::string Mesh::Impl::Describe(int p) const {
  return fmt::format("rank {} ({})", p, peers[p].address.empty() ? "?" : peers[p].address);
}

void Mesh::Impl::Start() {
  work = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(
      io.get_executor());
  wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (int p = 0; p < options.size; ++p) {
      if (p == options.rank) continue;
      boost::system::error_code ignored;
      peers[p].socket->native_non_blocking(true, ignored);  // readers and writers poll
      // Out of the reactor: the threads read and write the descriptor themselves; the watch
      // registers it again only while the I/O thread must read (ArmLocked).
      peers[p].fd = peers[p].socket->release(ignored);
      peers[p].watch = std::make_unique<asio::posix::stream_descriptor>(io);
      peers[p].last_heard.store(std::chrono::steady_clock::now().time_since_epoch().count());
      ArmLocked(p);
    }
  }
  beat = std::make_unique<asio::steady_timer>(io);
  last_beat_sent = std::chrono::steady_clock::now();
  ArmBeat();
  thread = std::thread([this] { io.run(); });
}

void Mesh::Impl::ArmBeat() {
  beat->expires_after(options.peer_timeout.count() > 0 ? std::min<std::chrono::milliseconds>(
                                                             kDrainPeriod, options.peer_timeout / 4)
                                                       : kDrainPeriod);
  beat->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Beat();
  });
}

void Mesh::Impl::Beat() {
  const auto now = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mu);
    if (closing) return;
    // What arrived for nobody: heartbeats, a goodbye, the end of a connection.
    for (int p = 0; p < options.size; ++p) {
      if (p != options.rank) DrainLocked(p, lock);
    }
  }
  if (options.peer_timeout.count() == 0) {
    ArmBeat();
    return;
  }
  const bool send_beats = now - last_beat_sent >= options.peer_timeout / 4;
  if (send_beats) last_beat_sent = now;
  for (int p = 0; p < options.size; ++p) {
    if (p == options.rank) continue;
    Peer& peer = peers[p];
    // Send only when no writer is active and nothing is queued in the kernel: then the 16 bytes
    // go out whole at once, and this thread never waits. Queued bytes reach the peer anyway.
    std::unique_lock<std::mutex> send_lock(peer.send_mu, std::try_to_lock);
    int queued = 1;
    if (send_beats && send_lock.owns_lock() && ::ioctl(peer.fd, SIOCOUTQ, &queued) == 0 &&
        queued == 0) {
      uint8_t header[kFrameHeaderBytes];
      PutLe<uint32_t>(header, kFrameMagic);
      PutLe<uint32_t>(header + 4, kHeartbeatChannel);
      PutLe<uint64_t>(header + 8, 0);
      (void)::send(peer.fd, header, kFrameHeaderBytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (send_lock.owns_lock()) send_lock.unlock();
    const std::chrono::steady_clock::time_point last_heard(
        std::chrono::steady_clock::duration(peer.last_heard.load(std::memory_order_relaxed)));
    int unread = 0;
    if (now - last_heard > options.peer_timeout && ::ioctl(peer.fd, FIONREAD, &unread) == 0 &&
        unread == 0) {
      std::lock_guard<std::mutex> lock(mu);
      // A peer that said goodbye owes us nothing more.
      if (peer.error.ok() && !closing && !peer.said_bye && !peer.eof) {
        FailPeerLocked(
            p, fmt::format("sent nothing for {:.1f} s (HOROVOD_PEER_TIMEOUT_SECONDS={:g}): it is "
                           "stopped, hung or cut off",
                           std::chrono::duration<double>(now - last_heard).count(),
                           options.peer_timeout.count() / 1000.0));
      }
    }
  }
  ArmBeat();
}

Status Mesh::Impl::WriteFrame(int p, uint32_t channel, const void* data, size_t bytes) {
  Peer& peer = peers[p];
  uint8_t header[kFrameHeaderBytes];
  PutLe<uint32_t>(header, kFrameMagic);
  PutLe<uint32_t>(header + 4, channel);
  PutLe<uint64_t>(header + 8, bytes);
  iovec iov[2] = {{header, kFrameHeaderBytes}, {const_cast<void*>(data), bytes}};
  // While this write is blocked on a full socket it wants the I/O thread reading (io_wanted).
  struct Blocked {
    Mesh::Impl* m;
    bool wanted = false;
    ~Blocked() {
      if (!wanted) return;
      std::lock_guard<std::mutex> lock(m->mu);
      --m->io_wanted;
    }
  } blocked{this};
  int first = 0;
  while (first < 2) {
    msghdr msg = {};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = 2 - first;
    const ssize_t n = ::sendmsg(peer.fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // The kernel's buffer is full until the peer reads. It may be blocked writing to us (or to a
      // rank that writes to us): while we wait, our I/O thread drains every peer.
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!peer.error.ok()) return peer.error;
        if (!blocked.wanted) {
          blocked.wanted = true;
          ++io_wanted;
          for (int q = 0; q < options.size; ++q) {
            if (q != options.rank) ArmLocked(q);
          }
        }
      }
      pollfd pfd = {peer.fd, POLLOUT, 0};
      ::poll(&pfd, 1, 1000);
      std::lock_guard<std::mutex> lock(mu);
      if (!peer.error.ok()) return peer.error;
      continue;
    }
    if (n < 0) {
      const int err = errno;
      std::lock_guard<std::mutex> lock(mu);
      FailPeerLocked(p, fmt::format("send failed: {}", std::strerror(err)));
      return peer.error;
    }
    size_t done = static_cast<size_t>(n);
    while (first < 2 && done >= iov[first].iov_len) {
      done -= iov[first].iov_len;
      ++first;
    }
    if (first < 2) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + done;
      iov[first].iov_len -= done;
    }
  }
  return Status::OK();
}

void Mesh::Impl::FailPeerLocked(int p, const std::string& what, bool warn, bool lost) {
  Peer& peer = peers[p];
  if (peer.error.ok()) {
    // A lost peer (not one that said goodbye first) is kPeerLost: Python raises
    // HorovodInternalError for it.
    std::string message = fmt::format("TCP transport: {} {}", Describe(p), what);
    peer.error =
        lost ? Status::PeerLost(std::move(message)) : Status::UnknownError(std::move(message));
    if (warn && !closing) {
      LogWarning("{}", peer.error.message());
    } else {
      LogDebug("{}", peer.error.message());
    }
    if (lost && !closing && first_lost.ok()) {
      first_lost = peer.error;
      if (on_lost) on_lost(first_lost);
      // Readers blocked on other peers' sockets must see the end too.
      if (EndedLocked() && wake_fd >= 0) (void)::eventfd_write(wake_fd, 1);
    }
  }
  // Shut down, not closed: a writer may be using the descriptor (Close() closes it at the end).
  if (peer.fd >= 0) ::shutdown(peer.fd, SHUT_RDWR);
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
  Peer& p = m.peers[peer];
  std::lock_guard<std::mutex> send_lock(p.send_mu);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.closed || m.closing) return Status::UnknownError("TCP transport: the mesh is closed");
    if (!p.error.ok()) return p.error;
    if (m.EndedLocked()) return m.first_lost;
  }
  return m.WriteFrame(peer, channel, data, bytes);
}

Status Mesh::SendLarge(int peer, uint32_t channel, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  return ForEachFrame(bytes,
                      [&](size_t offset, size_t n) { return Send(peer, channel, p + offset, n); });
}

Status Mesh::PeerStatus(int peer) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (peer < 0 || peer >= impl_->options.size) {
    return Status::InvalidArgument(fmt::format("TCP transport: no rank {}", peer));
  }
  return impl_->peers[peer].error;
}

void Mesh::SetPeerLostHandler(std::function<void(const Status&)> handler) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->on_lost = std::move(handler);
  if (impl_->on_lost && !impl_->first_lost.ok()) impl_->on_lost(impl_->first_lost);
}

void Mesh::Close() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.closing) return;
    m.closing = true;
    // From now on the I/O thread reads everything: the peers' goodbyes and half-closes.
    for (int p = 0; p < m.options.size; ++p) {
      if (p != m.options.rank && m.peers[p].watch) m.ArmLocked(p);
    }
  }
  if (!m.thread.joinable()) {
    std::lock_guard<std::mutex> lock(m.mu);
    m.closed = true;
    return;
  }
  // Half-close every connection (no writer is active: Close() follows every operation), then wait
  // for the peers'.
  for (int p = 0; p < m.options.size; ++p) {
    if (p == m.options.rank || m.peers[p].fd < 0) continue;
    std::lock_guard<std::mutex> send_lock(m.peers[p].send_mu);
    bool healthy;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      healthy = m.peers[p].error.ok();
    }
    // The goodbye first: the end of the connection that follows is then no failure to the peer.
    if (healthy) (void)m.WriteFrame(p, kByeChannel, nullptr, 0);
    ::shutdown(m.peers[p].fd, SHUT_WR);
  }
  {
    // Heartbeats stop while closing, so this wait watches the silence itself: a peer that has
    // sent nothing for the peer timeout is dead or cut off (a live one beats until it closes,
    // and then half-closes too) and is not waited for -- else a survivor's shutdown after a
    // host's loss would last the whole connect timeout, or until the link came back.
    const auto silent = [&m](int p, std::chrono::steady_clock::time_point now) {
      if (m.options.peer_timeout.count() == 0) return false;
      const std::chrono::steady_clock::time_point heard(std::chrono::steady_clock::duration(
          m.peers[p].last_heard.load(std::memory_order_relaxed)));
      return now - heard > m.options.peer_timeout;
    };
    const auto deadline = std::chrono::steady_clock::now() + m.options.timeout;
    const auto poll = m.options.peer_timeout.count() > 0
                          ? std::min<std::chrono::milliseconds>(m.options.peer_timeout / 4,
                                                                std::chrono::milliseconds(250))
                          : m.options.timeout;
    std::unique_lock<std::mutex> lock(m.mu);
    bool all = false;
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      all = true;
      for (int p = 0; p < m.options.size; ++p) {
        if (p != m.options.rank && !m.peers[p].eof && m.peers[p].error.ok() && !silent(p, now)) {
          all = false;
        }
      }
      if (all || now >= deadline) break;
      m.cv.wait_for(lock, std::min<std::chrono::steady_clock::duration>(poll, deadline - now));
    }
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
    if (m.beat) m.beat->cancel();
    for (Peer& p : m.peers) {
      if (p.watch && p.watch->is_open()) (void)p.watch->release();
      if (p.fd >= 0) ::close(p.fd);
    }
  });
  m.work.reset();
  m.thread.join();
  if (m.wake_fd >= 0) ::close(m.wake_fd);
  m.wake_fd = -1;
}

}  // namespace tcp
}  // namespace hvdc
