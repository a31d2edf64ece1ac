// PeerWatch: a side channel that tells a transport when a peer rank is lost, for a transport that
// cannot tell by itself (Open MPI without ULFM never reports a dead rank to the survivors). The
// transport owns it and hands it the handler of Transport::SetPeerLostHandler. Which one a
// transport gets is decided at the composition root (builtins/), so the transport never names the
// side channel's own transport (the MPI transport gets liveness/, a heartbeat mesh over TCP).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/config.h"
#include "core/status.h"
#include "core/transport.h"

namespace hvdc {

class PeerWatch {
 public:
  virtual ~PeerWatch() = default;
  // As Transport::SetPeerLostHandler: the first lost peer, with an error naming its rank and host.
  virtual void SetPeerLostHandler(Transport::PeerLostHandler handler) = 0;
  // Orderly close (a goodbye to every peer, so none reports this rank lost). Idempotent.
  virtual void Close() = 0;
  // What it watches, for the log ("rank 2 at 10.0.0.3, heartbeat timeout 6 s").
  virtual const std::string& description() const = 0;
};

// The collectives over the watched transport's world that setting up a PeerWatch needs, answered
// by that transport. Every rank calls each one, in the same order. `what` names the step for an
// error message ("" when the call needs no label).
class WorldCollectives {
 public:
  virtual ~WorldCollectives() = default;
  // root's `bytes` bytes of buf to every rank.
  virtual Status Broadcast(void* buf, int64_t bytes, int root, const char* what) = 0;
  // Every rank's `bytes` bytes of send, in rank order, into recv (world size * bytes).
  virtual Status Allgather(const void* send, int64_t bytes, void* recv, const char* what) = 0;
};

// Starts a PeerWatch: collective over the world (every rank calls it, with the same config);
// world size > 1.
using PeerWatchFactory =
    std::function<Status(const Config& config, const Topology& topology, WorldCollectives* world,
                         std::unique_ptr<PeerWatch>* out)>;

}  // namespace hvdc
