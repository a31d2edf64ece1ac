// Internal to tcp_controller/: the state behind Mesh, shared by tcp_mesh.cc (the running mesh) and
// tcp_mesh_setup.cc (listening, rendezvous and connecting).
#pragma once

#include <boost/asio.hpp>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tcp_controller/tcp_mesh.h"

namespace hvdc {
namespace tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

// Wire constants. Integers are little-endian (every supported host is).
constexpr uint32_t kFrameMagic = 0x46445648;  // "HVDF"
constexpr uint32_t kHelloMagic = 0x48445648;  // "HVDH"
constexpr uint32_t kAckMagic = 0x41445648;    // "HVDA"
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kFrameHeaderBytes = 16;  // magic, channel, length (u64)
constexpr size_t kHelloBytes = 32;        // magic, version, rank, size, token (u64), reserved (u64)
constexpr size_t kAckBytes = 16;          // magic, version, rank, reserved

template <typename T>
void PutLe(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T GetLe(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A queued write: lives on the sender's stack until `done`.
struct SendRequest {
  uint8_t header[kFrameHeaderBytes];
  const void* data = nullptr;
  size_t bytes = 0;
  bool done = false;  // guarded by Mesh::Impl::mu
  Status status;      // guarded by Mesh::Impl::mu
};

struct Peer {
  std::unique_ptr<tcp::socket> socket;  // touched by the I/O thread only (after set-up)
  std::string host;
  std::string address;  // "host:port" as known, for messages
  // Read state (I/O thread only).
  uint8_t header[kFrameHeaderBytes] = {};
  uint32_t channel = 0;
  std::string body;
  // Guarded by Mesh::Impl::mu.
  std::deque<SendRequest*> sends;
  bool writing = false;
  bool eof = false;  // the peer half-closed (expected only once we are closing too)
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
  void ReadBody(int p, uint64_t length);
  void StartWrite(int p);
  // Records the peer's error (first one wins), fails its queued sends and closes its socket.
  // Called on the I/O thread with mu held.
  void FailPeerLocked(int p, const std::string& what, bool warn = true);
  std::string Describe(int p) const;

  const MeshOptions options;
  asio::io_context io;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  std::vector<Peer> peers;
  std::vector<std::string> hosts;

  std::mutex mu;  // guards the Peer fields marked so, inbox, closing, closed
  std::condition_variable cv;
  std::map<uint64_t, std::deque<std::string>> inbox;  // key: peer << 32 | channel
  bool closing = false;
  bool closed = false;
};

}  // namespace tcp
}  // namespace hvdc
