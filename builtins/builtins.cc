// What this build contains (the hook core/builtin.h declares): the host backend over MPI or the
// in-memory world, and the NCCL backend when it was built.
#include "core/build_config.h"
#include "core/builtin.h"
#include "local_controller/local_world.h"
#include "ops/cpu/host_backend.h"
#if HVDC_HAVE_MPI
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
    return MakeMpiTransport(config, mpi, transport);
  };
#endif
  out->single_transport = [] { return MakeLocalTransport(LocalWorld::Create(1), 0); };
  out->mpi_built = HVDC_HAVE_MPI != 0;
  out->cuda_built = HVDC_HAVE_NCCL != 0;
  out->nccl_version = HVDC_NCCL_VERSION_CODE;
}

}  // namespace hvdc
