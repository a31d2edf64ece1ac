// The liveness side channel of the MPI transport (HOROVOD_MPI_LIVENESS, on by default), a
// PeerWatch (core/peer_watch.h) that builtins/ gives the MPI transport.
//
// Open MPI without ULFM never tells a survivor that a rank died, and a blocked MPI call cannot be
// woken: when the launcher keeps the survivors alive (`mpirun --enable-recovery`), they hang
// forever. So beside MPI every rank keeps a heartbeat-only TCP mesh (tcp_controller's Mesh, no
// data ever crosses it): a connection that closes or resets without the orderly goodbye, or a
// peer silent past HOROVOD_PEER_TIMEOUT_SECONDS, is reported through the Transport's peer-lost
// handler, and the runtime fails every pending operation and ends the process as over TCP.
//
// Set-up is collective over the watched transport's world (WorldCollectives; MPI answers them):
// each rank listens on an ephemeral port of its address (LivenessAddress), one allgather
// exchanges "host:port", and the mesh connects. A rank that cannot take part still joins both
// collectives, so every rank fails init with an error instead of hanging. Cost: the mesh's I/O
// thread sleeps in epoll; a timer wakes it every HOROVOD_PEER_TIMEOUT_SECONDS / 4 to send each
// peer a 16-byte heartbeat. The data path never touches it.
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "core/peer_watch.h"
#include "core/status.h"
#include "core/transport.h"

namespace hvdc {
namespace liveness {

// The address this rank listens at: HOROVOD_GLOO_IFACE's (the first listed interface with an
// address), else 127.0.0.1 when every rank runs on this host, else this host name's first
// non-loopback IPv4 address, else the first non-loopback interface's. InvalidArgument (naming
// HOROVOD_GLOO_IFACE and HOROVOD_MPI_LIVENESS) when there is none.
Status LivenessAddress(const Config& config, bool single_host, std::string* address);

// A PeerWatchFactory: collective over `world` (every rank calls it, with the same config); world
// size > 1.
Status Start(const Config& config, const Topology& topology, WorldCollectives* world,
             std::unique_ptr<PeerWatch>* out);

}  // namespace liveness
}  // namespace hvdc
