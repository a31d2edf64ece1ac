// Internal to tcp_controller/: the state behind Mesh, shared by tcp_mesh.cc (the running mesh) and
// tcp_mesh_setup.cc (listening, rendezvous and connecting).
#pragma once

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
  bool closing = false;
  bool closed = false;
  std::function<void(const Status&)> on_lost;  // guarded by mu; called with mu held
  Status first_lost;                           // guarded by mu: the first loss reported
};

}  // namespace tcp
}  // namespace hvdc
