// The TCP Transport (what Horovod users know as the "gloo" controller): no MPI, ranks found
// through the environment, one TCP mesh (tcp_mesh.h) carrying every process set's control channel
// and data plane on channels of their own.
//
// Identity, in this order (Config holds the variables):
//  1. HVDC_TCP_PEERS=host:port,... (index = rank) with HOROVOD_RANK: rank r listens on the port of
//     its own entry (on HOROVOD_GLOO_IFACE's address if given, else every interface); HOROVOD_SIZE,
//     when set, must equal the number of entries.
//  2. HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT with HOROVOD_RANK and HOROVOD_SIZE: rank r listens on an
//     ephemeral port (HOROVOD_GLOO_IFACE's address, else the address it reaches the service from),
//     publishes it as /<scope>/rank_<r> (HVDC_TCP_RENDEZVOUS_SCOPE, default "global") and reads
//     every other rank's.
// Every wait is bounded by HOROVOD_GLOO_TIMEOUT_SECONDS. Local and cross rank/size come from
// HOROVOD_LOCAL_RANK/_SIZE and HOROVOD_CROSS_RANK/_SIZE when set, else from which ranks share a
// host. Channel ids: 0 is the transport's own (CheckAgreement, CreateProcessSet); the k-th process
// set created (0 = the global set) uses 2k+1 for control and 2k+2 for data, so every rank derives
// the same ids from the (collective, ordered) creation calls.
#pragma once

#include <memory>

#include "core/config.h"
#include "core/status.h"
#include "core/transport.h"
#include "tcp_controller/tcp_mesh.h"

namespace hvdc {

// InvalidArgument naming the variable when the identity is missing or inconsistent; UnknownError
// naming the peer (or the rendezvous service) when the mesh cannot be built in time.
Status MakeTcpTransport(const Config& config, std::unique_ptr<Transport>* out);

// The transport over a mesh already built (tests build theirs over an in-memory store). Topology as
// above (the Config's variables override what the hosts imply). `mesh_ends_on_loss`: the mesh was
// made with MeshOptions::end_on_loss (Transport::loss_ends_every_wait).
Status MakeTcpTransportOverMesh(std::shared_ptr<tcp::Mesh> mesh, const Config& config,
                                std::unique_ptr<Transport>* out, bool mesh_ends_on_loss = false);

}  // namespace hvdc
