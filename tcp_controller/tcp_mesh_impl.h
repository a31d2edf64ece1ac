// Internal to tcp_controller/: the state behind Mesh, shared by tcp_mesh.cc (the running mesh) and
// tcp_mesh_setup.cc (listening, rendezvous and connecting).
#pragma once

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tcp_controller/tcp_mesh.h"
#include "tcp_controller/tcp_wire.h"

namespace hvdc {
namespace tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

// The key of a (peer, channel) queue: peer << 32 | channel.
inline uint64_t Key(int peer, uint32_t channel) {
  return (static_cast<uint64_t>(peer) << 32) | channel;
}

// Calls piece(offset, n) for each frame a message of `bytes` is split into (Mesh::kMaxFrameBytes
// at most; one empty frame for an empty message), stopping at the first error.
template <typename Piece>
Status ForEachFrame(size_t bytes, Piece piece) {
  size_t offset = 0;
  do {
    const size_t n = std::min<size_t>(bytes - offset, Mesh::kMaxFrameBytes);
    HVDC_RETURN_IF_ERROR(piece(offset, n));
    offset += n;
  } while (offset < bytes);
  return Status::OK();
}

// An empty frame on this channel says "I am closing in order": the end of the connection that
// follows is no failure. A connection that ends without it is a lost peer.
constexpr uint32_t kByeChannel = 0xffffffffu;
// Empty frames on this channel only say "alive" (MeshOptions::peer_timeout).
constexpr uint32_t kHeartbeatChannel = 0xfffffffeu;

struct Peer {
  // Writes go straight to `fd` from the sending thread (one at a time: send_mu), so a send costs no
  // thread hand-off. Reads too come straight from `fd`, by whichever thread holds the peer's read
  // turn (`reading`): a receiver waiting for this peer reads its own frames (the kernel wakes it,
  // not the I/O thread), and while no receiver waits the I/O thread reads whatever arrives, so a
  // sender never waits for the receiver's program. The socket is only shut down, never closed,
  // while the mesh runs, so `fd` stays valid.
  std::unique_ptr<tcp::socket> socket;  // set-up only: Start() takes its descriptor
  int fd = -1;
  // The I/O thread's view of `fd`: registered with its reactor only while it is wanted to read
  // (a registered descriptor wakes the I/O thread on every packet, armed or not).
  std::unique_ptr<asio::posix::stream_descriptor> watch;
  std::mutex send_mu;  // serializes the writers of this peer; taken before Mesh::Impl::mu
  std::string host;
  std::string address;  // "host:port" as known, for messages
  // The frame being read: touched only by the holder of the read turn.
  uint8_t header[kFrameHeaderBytes] = {};
  size_t header_got = 0;
  bool in_body = false;
  uint32_t channel = 0;
  uint64_t length = 0;
  size_t body_got = 0;
  std::string body;
  struct PostedRecv* direct = nullptr;  // the body goes straight to a posted receive
  // The last byte received, as steady_clock ticks (heartbeats; written by any reader).
  std::atomic<int64_t> last_heard{0};
  // Guarded by Mesh::Impl::mu.
  bool reading = false;     // a thread holds the read turn
  bool armed = false;       // the I/O thread waits for the socket to become readable
  bool read_ended = false;  // end of stream or an error: nothing more is read
  int turn_waiters = 0;     // receivers waiting for the read turn
  bool eof = false;         // the peer half-closed (expected only once we are closing too)
  bool said_bye = false;    // the peer announced an orderly close (kByeChannel)
  Status error;
};

// A receive posted by RecvInto before its frame arrived: the reader reads that frame's body
// straight into `dst` when its length matches (no copy, no buffer), else queues it as usual.
// Lives on the receiver's stack; once `taken`, the receiver waits for `done`. Guarded by mu.
struct PostedRecv {
  uint8_t* dst = nullptr;
  size_t bytes = 0;
  bool taken = false;  // a reader is reading the body into dst
  bool done = false;   // dst holds the frame, or `status` says why not
  Status status;
};

class Mesh::Impl {
 public:
  explicit Impl(const MeshOptions& options) : options(options), peers(options.size) {}

  // Set-up (tcp_mesh_setup.cc): listens, rendezvouses and connects every pair.
  Status Connect();
  // Running (tcp_mesh.cc).
  void Start();  // arms the reads and starts the I/O thread
  // Receiving (tcp_mesh_recv.cc). The holder of p's read turn reads one frame without blocking.
  enum class ReadResult { kFrame, kAgain, kEnded };
  ReadResult ReadFrame(int p);
  // Ends p's read side after `ec` (mid-frame or not); mu held.
  void EndReadLocked(int p, const boost::system::error_code& ec);
  // Lets the I/O thread watch p (mu held) while it is wanted (WantIoLocked): an async_wait for
  // readability, then a check for bytes that arrived before it (the reactor is edge-triggered:
  // those would raise no event).
  void ArmLocked(int p);
  // The I/O thread reads as soon as bytes arrive only while some thread is blocked -- a writer
  // on a full socket, or a receiver waiting on one peer (a peer may be blocked writing to us:
  // someone must drain it) -- or the mesh is closing (the peers' goodbyes). Otherwise the
  // receivers read for themselves, and the drain timer (kDrainPeriod) reads what arrives for
  // nobody -- heartbeats, a goodbye, a reset -- so no thread is woken per message only to hand
  // it over. The descriptor a receiver reads is its own meanwhile (ArmLocked skips it).
  bool WantIoLocked() const { return io_wanted > 0 || closing; }
  int io_wanted = 0;  // threads blocked writing or receiving; guarded by mu
  static constexpr std::chrono::milliseconds kDrainPeriod{100};
  // Reads whatever p has without blocking, if nobody else is reading it (mu held on entry and
  // exit, released while reading).
  void DrainLocked(int p, std::unique_lock<std::mutex>& lock);
  // Gives p's read turn back (mu held): the next waiting receiver takes it, else the I/O thread
  // watches p if wanted. Returns true when waiters must be notified.
  bool ReleaseTurnLocked(int p);
  void OnReadable(int p, bool from_wait, const boost::system::error_code& ec);
  // Waits until done() (mu held) -- reading p's frames itself while nobody else does.
  template <typename Done>
  void WaitReading(int p, std::unique_lock<std::mutex>& lock, Done done);
  // Written once the mesh ends for every call (EndedLocked): wakes readers blocked on a socket.
  int wake_fd = -1;
  // The drain timer (I/O thread, every kDrainPeriod): reads idle peers, sends heartbeats to idle
  // connections (every peer_timeout / 4) and fails silent peers.
  void ArmBeat();
  void Beat();
  std::chrono::steady_clock::time_point last_beat_sent;
  // Writes one frame to p from the calling thread (holding p's send_mu).
  Status WriteFrame(int p, uint32_t channel, const void* data, size_t bytes);
  // Records the peer's error (first one wins) and shuts its connection down (waking any writer).
  // Unless `lost` is false (an orderly close) or we are closing, reports the peer lost. Called
  // with mu held.
  void FailPeerLocked(int p, const std::string& what, bool warn = true, bool lost = true);
  std::string Describe(int p) const;

  const MeshOptions options;
  asio::io_context io;
  std::unique_ptr<asio::steady_timer> beat;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  std::vector<Peer> peers;
  std::vector<std::string> hosts;

  std::mutex mu;  // guards the Peer fields marked so, inbox, closing, closed (after send_mu)
  std::condition_variable cv;
  std::map<uint64_t, std::deque<std::string>> inbox;  // key: peer << 32 | channel
  // Frame bodies handed back by the readers (Mesh::Recycle), reused for later frames: a steady
  // stream of segments then needs no allocation, no fresh pages and no zero-filling.
  std::vector<std::string> spare;  // guarded by mu
  size_t spare_bytes = 0;          // their capacities, guarded by mu
  static constexpr size_t kSpareMinBytes = 64 << 10;
  static constexpr size_t kSpareMaxBytes = 32 << 20;
  static constexpr size_t kSpareMaxBuffers = 4;
  std::map<uint64_t, PostedRecv*> posted;  // guarded by mu; key as inbox
  static constexpr size_t kPostMinBytes = 64 << 10;
  // RecvInto for large messages: posts dst when nothing is queued yet; *direct tells whether the
  // frame landed there (or failed on the way: the status says why).
  // *direct false: nothing landed in dst (a frame of another size is queued, or the peer failed):
  // the caller receives as usual.
  Status RecvDirect(int peer, uint32_t channel, void* dst, size_t bytes, bool* direct);
  // A body for a frame of `length` bytes: a spare one that holds it, else a new one (called with
  // mu held; the caller sizes it after unlocking).
  std::string TakeSpareLocked(size_t length);
  bool closing = false;
  bool closed = false;
  std::function<void(const Status&)> on_lost;  // guarded by mu; called with mu held
  Status first_lost;                           // guarded by mu: the first loss reported
  // True once a peer is lost and options.end_on_loss: every call fails with first_lost (mu held).
  bool EndedLocked() const { return options.end_on_loss && !first_lost.ok(); }
};

}  // namespace tcp
}  // namespace hvdc
