// Internal to tcp_controller/: the state behind Mesh, shared by tcp_mesh.cc (the running mesh) and
// tcp_mesh_setup.cc (listening, rendezvous and connecting).
#pragma once

#include <algorithm>
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
  // Reads and the final close are the I/O thread's (after set-up); writes go straight to `fd` from
  // the sending thread (one at a time: send_mu), so a send costs no thread hand-off. The socket is
  // only shut down, never closed, while the mesh runs, so `fd` stays valid for the writers.
  std::unique_ptr<tcp::socket> socket;
  int fd = -1;
  std::mutex send_mu;  // serializes the writers of this peer; taken before Mesh::Impl::mu
  std::string host;
  std::string address;  // "host:port" as known, for messages
  // Read state (I/O thread only).
  uint8_t header[kFrameHeaderBytes] = {};
  uint32_t channel = 0;
  std::string body;
  std::chrono::steady_clock::time_point last_heard;  // the last byte received (heartbeats)
  // Guarded by Mesh::Impl::mu.
  bool eof = false;       // the peer half-closed (expected only once we are closing too)
  bool said_bye = false;  // the peer announced an orderly close (kByeChannel)
  Status error;
};

class Mesh::Impl {
 public:
  explicit Impl(const MeshOptions& options) : options(options), peers(options.size) {}

  // Set-up (tcp_mesh_setup.cc): listens, rendezvouses and connects every pair.
  Status Connect();
  // Running (tcp_mesh.cc).
  void Start();  // starts the reads and the I/O thread
  void StartRead(int p);
  void ReadBody(int p, size_t offset);
  // Heartbeats: sends them to idle connections and fails silent peers (I/O thread).
  void ArmBeat();
  void Beat();
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
  // A receive posted by RecvInto before its frame arrived: the I/O thread reads that frame's body
  // straight into `dst` when its length matches (no copy, no buffer), else queues it as usual.
  // Lives on the receiver's stack; once `taken`, the receiver waits for `done`.
  struct PostedRecv {
    uint8_t* dst = nullptr;
    size_t bytes = 0;
    bool taken = false;  // the I/O thread is reading the body into dst
    bool done = false;   // dst holds the frame, or `status` says why not
    Status status;
  };
  std::map<uint64_t, PostedRecv*> posted;  // guarded by mu; key as inbox
  static constexpr size_t kPostMinBytes = 64 << 10;
  // Reads the rest of a posted receive's body (I/O thread).
  void ReadDirect(int p, PostedRecv* post, size_t offset);
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
