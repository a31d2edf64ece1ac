// The MPI liveness side channel (HOROVOD_MPI_LIVENESS, on by default).
//
// Open MPI without ULFM never tells a survivor that a rank died, and a blocked MPI call cannot be
// woken: when the launcher keeps the survivors alive (`mpirun --enable-recovery`), they hang
// forever. So beside MPI every rank keeps a heartbeat-only TCP mesh (tcp_controller's Mesh, no
// data ever crosses it): a connection that closes or resets without the orderly goodbye, or a
// peer silent past HOROVOD_PEER_TIMEOUT_SECONDS, is reported through the Transport's peer-lost
// handler, and the runtime fails every pending operation and ends the process as over TCP.
//
// Set-up is collective over the world communicator: each rank listens on an ephemeral port of its
// address (LivenessAddress), one MPI_Allgather exchanges "host:port", and the mesh connects. A
// rank that cannot take part still joins both collectives, so every rank fails init with an error
// instead of hanging. Cost: the mesh's I/O thread sleeps in epoll; a timer wakes it every
// HOROVOD_PEER_TIMEOUT_SECONDS / 4 to send each peer a 16-byte heartbeat. The data path never
// touches it.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <memory>
#include <string>

#include "core/config.h"
#include "core/status.h"
#include "core/transport.h"

namespace hvdc {
namespace tcp {
class Mesh;
}

namespace mpi {

// The address this rank listens at: HOROVOD_GLOO_IFACE's (the first listed interface with an
// address), else 127.0.0.1 when every rank runs on this host, else this host name's first
// non-loopback IPv4 address, else the first non-loopback interface's. InvalidArgument (naming
// HOROVOD_GLOO_IFACE and HOROVOD_MPI_LIVENESS) when there is none.
Status LivenessAddress(const Config& config, bool single_host, std::string* address);

class Liveness {
 public:
  // Collective over `world` (every rank calls it, with the same config); world size > 1.
  static Status Start(const Config& config, MPI_Comm world, const Topology& topology,
                      std::unique_ptr<Liveness>* out);
  ~Liveness();  // Close()
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // As Transport::SetPeerLostHandler: the first lost peer, with an error naming its rank and host.
  void SetPeerLostHandler(Transport::PeerLostHandler handler);
  // Orderly close (a goodbye to every peer, so none reports this rank lost). Idempotent.
  void Close();
  // "rank 2 at 10.0.0.3, heartbeat timeout 6 s", for the log.
  const std::string& description() const { return description_; }

 private:
  Liveness(std::shared_ptr<tcp::Mesh> mesh, std::string description);
  std::shared_ptr<tcp::Mesh> mesh_;
  const std::string description_;
};

}  // namespace mpi
}  // namespace hvdc
