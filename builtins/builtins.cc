// What this build contains (the hook core/builtin.h declares): the host backend over MPI, TCP or
// the in-memory world, the NCCL backend when it was built, and the transports in order of
// precedence. The launch environments take precedence thus:
//   1. HOROVOD_CONTROLLER=gloo                                        -> TCP
//   2. an MPI launcher's environment (mpirun)                         -> MPI
//   3. Horovod's Gloo variables, HOROVOD_CPU_OPERATIONS=gloo, or HVDC_TCP_PEERS (which hvd.init()
//      writes from a TF_CONFIG of more than one task)                 -> TCP
//   4. init(comm=...) or a rank subset                                -> MPI
//   5. otherwise: one rank, no launcher
// TCP's entry comes first and recognises 1 and 3 (stepping aside for 2); MPI's recognises 2 and 4.
// Under MPI and TCP, a process set whose ranks share a host moves its data through shared memory
// (shm_controller/, docs/shm.md); the transport keeps control and every set across hosts.
#include <memory>
#include <utility>

#include "core/build_config.h"
#include "core/builtin.h"
#include "local_controller/local_world.h"
#include "ops/cpu/host_backend.h"
#include "shm_controller/shm_transport.h"
#include "tcp_controller/tcp_transport.h"
#if HVDC_HAVE_MPI
#include "liveness/liveness.h"
#include "mpi_controller/mpi_transport.h"
#endif
#if HVDC_HAVE_NCCL
#include "ops/nccl/nccl_backend.h"
#endif

namespace hvdc {
namespace {

bool WithMpiArguments(const InitOptions& opts) { return opts.mpi_comm || !opts.ranks.empty(); }

// The shared-memory plane under a transport that was made (HVDC_SHM=0: the transport alone,
// unless hierarchical collectives are asked for: the wrapper then makes their host and cross
// groups, the host groups over the transport).
Status WithShm(const Config& config, Status made, std::unique_ptr<Transport>* out) {
  const bool wrap =
      config.shm_enabled || config.hierarchical_allreduce || config.hierarchical_allgather;
  if (made.ok() && *out && wrap) {
    *out = shm::MakeShmTransport(std::move(*out), shm::ShmOptions::FromConfig(config));
  }
  return made;
}

// The TCP transport when asked for by name, or when its identity variables are set -- except that
// an mpirun job stays MPI unless HOROVOD_CONTROLLER=gloo says otherwise.
bool RecognisesTcp(const Config& config, const InitOptions&) {
  if (config.controller == "gloo") return true;
  if (config.under_launcher) return false;
  return config.cpu_operations == "gloo" || !config.tcp_peers.empty() ||
         !config.gloo.rendezvous_addr.empty();
}

Status MakeTcp(const Config& config, const InitOptions& opts, std::unique_ptr<Transport>* out) {
  if (WithMpiArguments(opts)) {
    return Status::InvalidArgument(
        "init(comm=...) needs MPI, but the TCP (gloo) transport was selected "
        "(HOROVOD_CONTROLLER/HOROVOD_CPU_OPERATIONS=gloo, HVDC_TCP_PEERS or "
        "HOROVOD_GLOO_RENDEZVOUS_ADDR)");
  }
  return WithShm(config, MakeTcpTransport(config, out), out);
}

// Under mpirun, or given MPI's ranks (a communicator or a subset) by init().
bool RecognisesMpi(const Config& config, const InitOptions& opts) {
  return config.under_launcher || WithMpiArguments(opts);
}

#if HVDC_HAVE_MPI
Status MakeMpi(const Config& config, const InitOptions& opts, std::unique_ptr<Transport>* out) {
  MpiTransportOptions mpi;
  mpi.ranks = opts.ranks;
  mpi.borrowed_comm = opts.mpi_comm;
  mpi.peer_watch = liveness::Start;  // MPI cannot tell a lost peer; a heartbeat mesh can
  return WithShm(config, MakeMpiTransport(config, mpi, out), out);
}
#endif

// Rank 0 of 1, no launcher.
Status MakeSingle(const Config&, const InitOptions&, std::unique_ptr<Transport>* out) {
  *out = MakeLocalTransport(LocalWorld::Create(1), 0);
  return Status::OK();
}

}  // namespace

void RegisterBuiltins(Builtins* out) {
  out->backends.push_back(MakeHostBackend());
#if HVDC_HAVE_NCCL
  out->backends.push_back(MakeNcclBackend());  // device memory (device >= 0)
#endif
  out->transports.push_back({TransportKind::kTcp, "TCP transport", RecognisesTcp, MakeTcp});
#if HVDC_HAVE_MPI
  out->transports.push_back({TransportKind::kMpi, "MPI", RecognisesMpi, MakeMpi});
#else
  out->transports.push_back({TransportKind::kMpi, "MPI", RecognisesMpi, nullptr});
#endif
  out->transports.push_back({TransportKind::kLocal, "single-rank transport",
                             [](const Config&, const InitOptions&) { return true; }, MakeSingle});
  out->cuda_built = HVDC_HAVE_NCCL != 0;
}

}  // namespace hvdc
