// Mesh's receive path. Frames are read straight from a peer's socket by whichever thread holds
// that peer's read turn (Peer::reading): a receiver that finds nothing queued takes the turn and
// reads -- blocked on the socket itself, so the kernel wakes the thread that wants the bytes --
// delivering frames for other channels to their queues on the way; while no receiver holds it,
// the I/O thread is armed (an async_wait for readability) and reads whatever arrives, so a sender
// never waits for its receiver's program. The spare bodies it reuses live here too.
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
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

// How long a reader blocks on a socket before looking at the mesh again (a loss of another peer
// that ends the job also wakes it at once, through wake_fd).
constexpr int kReadSliceMs = 200;

}  // namespace

void Mesh::Impl::EndReadLocked(int p, const boost::system::error_code& ec) {
  Peer& pr = peers[p];
  const bool mid = pr.in_body || pr.header_got > 0;
  pr.read_ended = true;
  if (closing && !mid) {
    pr.eof = true;  // the peer's half-close, or our own final close
  } else if (!mid && ec == asio::error::eof && pr.said_bye) {
    // A peer that finished its job first: the error matters only to an operation still waiting
    // for that peer. In an elastic job that operation's world is over (options.goodbye_is_loss).
    const bool first_error = pr.error.ok();
    FailPeerLocked(p, "closed the connection", /*warn=*/false, /*lost=*/false);
    if (first_error && options.goodbye_is_loss) {
      pr.error = Status::PeerLost(
          fmt::format("TCP transport: {} shut down and left the job while this rank still "
                      "needed it",
                      Describe(p)));
    }
  } else if (pr.error.ok()) {
    FailPeerLocked(p, Ended(ec, mid));
  }
  if (pr.direct != nullptr) {
    PostedRecv* post = pr.direct;
    pr.direct = nullptr;
    post->status = pr.error.ok() ? Status::UnknownError("TCP transport: read aborted") : pr.error;
    posted.erase(Key(p, pr.channel));
    post->done = true;  // the receiver may return (and drop *post) once mu is released
  }
}

Mesh::Impl::ReadResult Mesh::Impl::ReadFrame(int p) {
  Peer& pr = peers[p];
  for (;;) {
    uint8_t* into;
    size_t want;
    if (!pr.in_body) {
      into = pr.header + pr.header_got;
      want = kFrameHeaderBytes - pr.header_got;
    } else {
      into = (pr.direct != nullptr ? pr.direct->dst : reinterpret_cast<uint8_t*>(&pr.body[0])) +
             pr.body_got;
      want = static_cast<size_t>(pr.length) - pr.body_got;
    }
    const ssize_t n = ::recv(pr.fd, into, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ReadResult::kAgain;
    if (n <= 0) {
      const boost::system::error_code ec =
          n == 0 ? boost::system::error_code(asio::error::eof)
                 : boost::system::error_code(errno, boost::system::system_category());
      {
        std::lock_guard<std::mutex> lock(mu);
        EndReadLocked(p, ec);
      }
      cv.notify_all();
      return ReadResult::kEnded;
    }
    pr.last_heard.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                        std::memory_order_relaxed);
    if (pr.in_body) {
      pr.body_got += static_cast<size_t>(n);
      if (pr.body_got < pr.length) continue;
      pr.in_body = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        const uint64_t key = Key(p, pr.channel);
        if (pr.direct != nullptr) {
          posted.erase(key);
          pr.direct->done = true;  // the receiver may return (and drop it) once mu is released
          pr.direct = nullptr;
        } else {
          inbox[key].push_back(std::move(pr.body));
          pr.body = std::string();
        }
      }
      cv.notify_all();  // unlocked: a waiter woken on this core would only block on mu
      return ReadResult::kFrame;
    }
    pr.header_got += static_cast<size_t>(n);
    if (pr.header_got < kFrameHeaderBytes) continue;
    pr.header_got = 0;
    FrameHeader frame;
    const std::string bad = DecodeFrameHeader(pr.header, &frame);
    std::unique_lock<std::mutex> lock(mu);
    if (!bad.empty()) {
      pr.read_ended = true;
      FailPeerLocked(p, fmt::format("sent a {}; connection dropped", bad));
      return ReadResult::kEnded;
    }
    pr.channel = frame.channel;
    pr.length = frame.length;
    if (pr.length == 0) {
      if (pr.channel == kHeartbeatChannel) continue;
      if (pr.channel == kByeChannel) {
        pr.said_bye = true;
        continue;
      }
      inbox[Key(p, pr.channel)].emplace_back();
      lock.unlock();
      cv.notify_all();
      return ReadResult::kFrame;
    }
    const uint64_t key = Key(p, pr.channel);
    auto post = posted.find(key);
    if (post != posted.end() && !post->second->taken && post->second->bytes == pr.length) {
      auto queued = inbox.find(key);
      if (queued == inbox.end() || queued->second.empty()) {
        post->second->taken = true;
        pr.direct = post->second;
      }
    }
    if (pr.direct == nullptr) pr.body = TakeSpareLocked(static_cast<size_t>(pr.length));
    lock.unlock();
    // Shrinking a reused body writes nothing; only new bytes are filled.
    if (pr.direct == nullptr) pr.body.resize(static_cast<size_t>(pr.length));
    pr.in_body = true;
    pr.body_got = 0;
  }
}

void Mesh::Impl::ArmLocked(int p) {
  Peer& pr = peers[p];
  if (pr.armed || pr.reading || pr.read_ended || closed || !WantIoLocked()) return;
  if (!pr.watch->is_open()) {
    boost::system::error_code ec;
    pr.watch->assign(pr.fd, ec);
    if (ec) {
      FailPeerLocked(p, fmt::format("cannot watch the connection: {}", ec.message()));
      return;
    }
  }
  pr.armed = true;
  // Any thread may start the wait (under mu): the I/O thread runs its completion.
  pr.watch->async_wait(
      asio::posix::stream_descriptor::wait_read,
      [this, p](const boost::system::error_code& ec) { OnReadable(p, /*from_wait=*/true, ec); });
  pollfd pfd = {pr.fd, POLLIN, 0};
  if (::poll(&pfd, 1, 0) > 0) {
    asio::post(io, [this, p] { OnReadable(p, /*from_wait=*/false, {}); });
  }
}

void Mesh::Impl::OnReadable(int p, bool from_wait, const boost::system::error_code& ec) {
  Peer& pr = peers[p];
  std::unique_lock<std::mutex> lock(mu);
  if (from_wait) pr.armed = false;
  if (closed) return;
  if (ec == asio::error::operation_aborted) return;  // the mesh is closing
  bool notify = false;
  // A holder of the turn reads (and re-arms, if wanted, when it gives the turn back).
  if (!pr.reading && !pr.read_ended) {
    pr.reading = true;
    lock.unlock();
    while (ReadFrame(p) == ReadResult::kFrame) {
    }
    lock.lock();
    notify = ReleaseTurnLocked(p);
  }
  if (!pr.armed && !WantIoLocked() && pr.watch->is_open()) {
    // Not wanted any more: out of the reactor, so packets stop waking this thread.
    (void)pr.watch->release();
  }
  lock.unlock();
  if (notify) cv.notify_all();
}

bool Mesh::Impl::ReleaseTurnLocked(int p) {
  Peer& pr = peers[p];
  pr.reading = false;
  if (pr.turn_waiters > 0) return true;  // a receiver takes the turn over
  ArmLocked(p);
  return false;
}

void Mesh::Impl::DrainLocked(int p, std::unique_lock<std::mutex>& lock) {
  Peer& pr = peers[p];
  if (pr.reading || pr.read_ended || closed) return;
  pr.reading = true;
  lock.unlock();
  while (ReadFrame(p) == ReadResult::kFrame) {
  }
  lock.lock();
  if (ReleaseTurnLocked(p)) cv.notify_all();
}

template <typename Done>
void Mesh::Impl::WaitReading(int p, std::unique_lock<std::mutex>& lock, Done done) {
  Peer& pr = peers[p];
  while (!done()) {
    if (pr.reading || pr.read_ended || closing) {
      ++pr.turn_waiters;
      cv.wait(lock);
      --pr.turn_waiters;
      continue;
    }
    pr.reading = true;
    auto done_unlocked = [&] {  // the condition re-checked while we hold the turn, mu released
      std::lock_guard<std::mutex> relock(*lock.mutex());
      return done();
    };
    // While we wait on p, the I/O thread drains the other peers (one of them may be blocked
    // writing to us). p itself is ours: an I/O thread armed for it (a writer is blocked) finds
    // the turn taken when our bytes wake it, and goes back to waiting.
    ++io_wanted;
    for (int q = 0; q < options.size; ++q) {
      if (q != options.rank) ArmLocked(q);
    }
    lock.unlock();
    for (;;) {
      const ReadResult r = ReadFrame(p);
      if (r == ReadResult::kEnded) break;
      if (r == ReadResult::kFrame) {
        if (done_unlocked()) break;
        continue;
      }
      pollfd pfd[2] = {{pr.fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      const int ready = ::poll(pfd, 2, kReadSliceMs);
      if ((ready == 0 || pfd[1].revents != 0) && done_unlocked()) break;
    }
    lock.lock();
    --io_wanted;
    pr.reading = false;
    if (pr.turn_waiters > 0) cv.notify_all();  // another receiver takes the turn over
  }
  // Whoever leaves last with the turn free hands the socket back to the I/O thread (a receiver
  // handed the turn may find its frame delivered already and never take it).
  if (!pr.reading && pr.turn_waiters == 0) ArmLocked(p);
}

Status Mesh::Impl::RecvDirect(int peer, uint32_t channel, void* dst, size_t bytes, bool* direct) {
  *direct = false;
  const uint64_t key = Key(peer, channel);
  Peer& p = peers[peer];
  PostedRecv post;
  post.dst = static_cast<uint8_t*>(dst);
  post.bytes = bytes;
  std::unique_lock<std::mutex> lock(mu);
  auto queued = inbox.find(key);
  const bool ready = (queued != inbox.end() && !queued->second.empty()) || !p.error.ok() || p.eof ||
                     closed || closing || EndedLocked() || posted.count(key) > 0;
  if (ready) return Status::OK();
  posted[key] = &post;
  WaitReading(peer, lock, [&] {
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
  posted.erase(key);  // withdrawn before any reader took it
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

bool Mesh::TryRecv(int peer, uint32_t channel, std::string* message, Status* status) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.options.size || peer == m.options.rank) {
    *status = Status::InvalidArgument(fmt::format("TCP transport: cannot receive from {}", peer));
    return true;
  }
  std::unique_lock<std::mutex> lock(m.mu);
  auto it = m.inbox.find(Key(peer, channel));
  if (it == m.inbox.end() || it->second.empty()) {
    m.DrainLocked(peer, lock);  // nothing queued: read what has arrived (if nobody else is)
    it = m.inbox.find(Key(peer, channel));
  }
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
  m.WaitReading(peer, lock, [&] {
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
