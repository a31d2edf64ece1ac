// Mesh: the full mesh of TCP connections of one job, on Boost.Asio -- one connection per pair of
// ranks (the lower rank connects, sends a hello with its rank and the job token, and both sides
// prove the job's secret over each other's nonce; strays are refused), TCP_NODELAY,
// length-prefixed frames tagged with a channel id. The wire format is in tcp_wire.h.
//
// Channels keep unrelated traffic apart: the transport's own (0), and a control and a data channel
// per process set. Messages on one (peer, channel) arrive in the order they were sent. Each
// (peer, channel) is used by one thread at a time, but different channels may be used from
// different threads at once (the control thread and one executor thread per process set).
//
// Send writes from the calling thread (one writer per peer at a time) and returns once its bytes
// are handed to the kernel. Receiving threads read the sockets themselves: one waiting for a peer
// reads that peer's frames (the kernel wakes the thread that wants them; frames for other
// channels go to per-(peer, channel) queues on the way). One I/O thread (started by Create)
// drains every peer while some thread is blocked writing or receiving -- so ranks writing to
// each other never wait for each other's programs -- and every 0.1 s (heartbeats, goodbyes,
// resets that arrive for nobody).
//
// Failure is per peer: when a connection closes or resets, every waiting or later call involving
// that peer fails with an UnknownError naming its rank and host (messages that arrived before stay
// readable). Close() shuts down gracefully: it half-closes every connection and waits (bounded)
// for the peers to do the same, so no message in flight is lost.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "rendezvous/store.h"

namespace hvdc {
namespace tcp {

struct MeshOptions {
  int rank = 0;
  int size = 1;
  // Static peer list (HVDC_TCP_PEERS): "host:port" of every rank; this rank listens on its own
  // port on `bind_host` (default: every interface). Mutually exclusive with `store`.
  std::vector<std::string> peers;
  // Rendezvous: this rank listens on an ephemeral port of `bind_host` (default: the store's
  // LocalAddress()), publishes "host:port" as rank_<r> and reads the others'.
  rendezvous::Store* store = nullptr;
  std::string bind_host;
  // Every hello carries it; a connection with another token is refused (tcp_wire.h: a hash of
  // what every rank must agree on).
  uint64_t job_token = 0;
  // The job's shared secret (HOROVOD_SECRET_KEY; may be empty): every connection proves it both
  // ways over fresh nonces (tcp_wire.h); a wrong proof is logged and the connection refused while
  // the mesh keeps waiting for the real peer. Never logged.
  std::string secret_key;
  // Bounds rendezvous and connection set-up, and Close()'s wait for the peers.
  std::chrono::milliseconds timeout{30000};
  // Heartbeats (0 = off): every peer_timeout / 4 the I/O thread sends each idle connection an
  // empty frame; a peer from which no byte arrives for peer_timeout is lost (stopped, hung or cut
  // off). Any received byte counts, so a long transfer never looks silent.
  std::chrono::milliseconds peer_timeout{0};
  // A lost peer ends the job (the transport's choice): once one is lost, every waiting and later
  // Send/Recv fails with its error, also towards the live peers -- a rank blocked on a live peer
  // that itself gave up would otherwise wait forever. Off, the other peers stay usable.
  bool end_on_loss = false;
  // A peer that said goodbye and then closed while an operation still waits for it fails that
  // operation as a lost peer (kPeerLost, HorovodInternalError in Python) instead of a plain error.
  // Set in an elastic job: a rank that leaves early (it saw another rank die and shut down to
  // re-form the world) means this world is over too, and the survivor must re-initialise.
  bool goodbye_is_loss = false;
  // Where the peer list came from, for error messages ("HVDC_TCP_PEERS", "TF_CONFIG", the
  // rendezvous service and its variables).
  std::string source = "HVDC_TCP_PEERS";
  // What chose bind_host, for error messages (tcp_identity.h, Identity::bind_origin); empty =
  // this rank's entry of the static list.
  std::string listen_origin;
};

// Splits "host:port" (IPv6 hosts in brackets); InvalidArgument naming `what` when malformed.
Status ParseHostPort(const std::string& entry, const std::string& what, std::string* host,
                     int* port);

class Mesh {
 public:
  // Largest frame accepted; larger messages must be split by the caller (SendLarge does).
  static constexpr uint64_t kMaxFrameBytes = 64ull << 20;  // tcp_wire.h: kMaxFrameLength

  static Status Create(const MeshOptions& options, std::shared_ptr<Mesh>* out);
  ~Mesh();  // Close()
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const;
  int size() const;
  // The host each rank was reached at (or, for lower ranks, announced as), for topology and errors.
  const std::vector<std::string>& hosts() const;

  // Writes one message (at most kMaxFrameBytes) from the calling thread.
  Status Send(int peer, uint32_t channel, const void* data, size_t bytes);
  // Waits for the next message from `peer` on `channel`.
  Status Recv(int peer, uint32_t channel, std::string* message);
  // Recv, then checks that the message has exactly `bytes` bytes and copies it to dst.
  Status RecvInto(int peer, uint32_t channel, void* dst, size_t bytes);
  // Hands a received message's buffer back for reuse by later frames (optional: large messages
  // read in a loop, such as data-plane segments, then cost no allocation).
  void Recycle(std::string&& message);
  // Nonblocking Recv: false when nothing is there yet; true with *message, or with *status set to
  // the peer's error.
  bool TryRecv(int peer, uint32_t channel, std::string* message, Status* status);
  // Any size: split into frames of at most kMaxFrameBytes (both ends must agree on `bytes`).
  Status SendLarge(int peer, uint32_t channel, const void* data, size_t bytes);
  Status RecvLarge(int peer, uint32_t channel, void* dst, size_t bytes);

  // OK while the connection to `peer` is healthy, else the error that ended it.
  Status PeerStatus(int peer);

  // Failure detection: `handler` is called (from the I/O thread or a sender, with the mesh's lock
  // held: it must not call back into the mesh) with the error of the first peer lost -- a
  // connection that closed or reset without the peer's orderly goodbye (Close() sends one), or a
  // protocol error. Called at once if a peer was already lost. A null handler stops the calls.
  void SetPeerLostHandler(std::function<void(const Status&)> handler);

  // Graceful shutdown (idempotent); later calls fail.
  void Close();

  class Impl;

 private:
  explicit Mesh(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tcp
}  // namespace hvdc
