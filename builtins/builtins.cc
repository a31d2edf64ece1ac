// What this build contains (the hook core/builtin.h declares): the host backend over MPI, TCP or
// the in-memory world, and the NCCL backend when it was built.
#include "core/build_config.h"
#include "core/builtin.h"
#include "local_controller/local_world.h"
#include "ops/cpu/host_backend.h"
#include "tcp_controller/tcp_transport.h"
#if HVDC_HAVE_MPI
#include "liveness/liveness.h"
#include "mpi_controller/mpi_transport.h"
#endif
#if HVDC_HAVE_NCCL
#include "ops/nccl/nccl_backend.h"
#endif

namespace hvdc {

void RegisterBuiltins(Builtins* out) {
  out->backends.push_back(MakeHostBackend());
#if HVDC_HAVE_NCCL
  out->backends.push_back(MakeNcclBackend());  // device memory (device >= 0)
#endif
#if HVDC_HAVE_MPI
  out->mpi_transport = [](const Config& config, const InitOptions& opts,
                          std::unique_ptr<Transport>* transport) {
    MpiTransportOptions mpi;
    mpi.ranks = opts.ranks;
    mpi.borrowed_comm = opts.mpi_comm;
    mpi.peer_watch = liveness::Start;  // MPI cannot tell a lost peer; a heartbeat mesh can
    return MakeMpiTransport(config, mpi, transport);
  };
#endif
  out->tcp_transport = MakeTcpTransport;
  out->single_transport = [] { return MakeLocalTransport(LocalWorld::Create(1), 0); };
  out->mpi_built = HVDC_HAVE_MPI != 0;
  out->gloo_built = true;
  out->cuda_built = HVDC_HAVE_NCCL != 0;
}

}  // namespace hvdc
