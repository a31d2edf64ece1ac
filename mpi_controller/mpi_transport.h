// The MPI Transport: ranks from MPI (managed, borrowed communicator or rank subset; see
// mpi_context.h), and per process set one communicator for control (MpiControlChannel) and another
// for data (MakeMpiHostComm), so negotiation never shares a communicator with the data plane.
//
//   std::unique_ptr<Transport> transport;
//   HVDC_RETURN_IF_ERROR(MakeMpiTransport(config, MpiTransportOptions{}, &transport));
#pragma once

#include <memory>
#include <vector>

#include "core/config.h"
#include "core/peer_watch.h"
#include "core/status.h"
#include "core/transport.h"

namespace hvdc {

struct MpiTransportOptions {
  // The MPI_COMM_WORLD ranks that form the world (hvd.init(comm=[...])); empty: all of them.
  std::vector<int> ranks;
  // A borrowed MPI_Comm* (hvd.init(comm=mpi4py_comm)); duplicated, never freed by us.
  void* borrowed_comm = nullptr;
  // The liveness side channel (HOROVOD_MPI_LIVENESS): started over the world when the config asks
  // for it and the world has more than one rank; null: none. builtins/ supplies it.
  PeerWatchFactory peer_watch;
};

// Initializes MPI if nobody has (requesting MPI_THREAD_MULTIPLE, or MPI_THREAD_SERIALIZED when
// config.mpi_threads_disable) and builds the world. threads_supported() is true only when MPI
// provides MPI_THREAD_MULTIPLE and threads are not disabled. Finalize() frees the communicators;
// MPI, if we initialized it, is finalized at process exit (mpi_context.h), so a later init()
// finds it ready.
Status MakeMpiTransport(const Config& config, const MpiTransportOptions& opts,
                        std::unique_ptr<Transport>* out);

}  // namespace hvdc
