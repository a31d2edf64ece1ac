// MpiHostComm: the HostComm data plane over one MPI communicator (one per process set).
//
//   MPI_Comm dup;
//   MPI_Comm_dup(world, &dup);
//   std::unique_ptr<HostComm> comm = MakeMpiHostComm(dup);  // owns dup from here on
//
// The communicator gets MPI_ERRORS_RETURN, so a failed MPI call becomes an UnknownError naming the
// call and MPI's error string instead of aborting the job. Arguments are checked locally only
// (HostComm's checks, then what an MPI call cannot take: InvalidArgument before any MPI call);
// matching them across ranks is the negotiation's job. float16 and bfloat16 reduce through our own
// commutative MPI ops over the cpu kernels; bool reduces as MPI_C_BOOL with MPI_LOR (Sum, Max) or
// MPI_LAND (Min, Product). Element counts beyond INT_MAX are sent in several calls for Allreduce
// and Broadcast; the per-rank counts and displacements of Allgatherv, Alltoallv and ReduceScatter
// must fit in an int. Waiting for peers, a call does not hold the core: it polls with backoff
// (core/backoff.h) until every rank is there, then runs (docs/waiting.md).
#pragma once

// Only the C API: Open MPI's deprecated C++ bindings do not compile warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <memory>

#include "core/host_comm.h"

namespace hvdc {

// Takes ownership of comm: the returned object frees it (unless MPI is already finalized). comm
// must not be MPI_COMM_WORLD or MPI_COMM_SELF (pass a duplicate). Returns nullptr if comm is
// MPI_COMM_NULL or cannot be queried (comm is freed then). MPI must be initialized, at a thread
// level that allows the calling threads.
std::unique_ptr<HostComm> MakeMpiHostComm(MPI_Comm comm);

// The same, with each MPI call limited to max_elements_per_call elements (bytes for Broadcast;
// clamped to 1..INT_MAX): tests use a small limit to exercise the chunked path.
std::unique_ptr<HostComm> MakeMpiHostComm(MPI_Comm comm, int64_t max_elements_per_call);

}  // namespace hvdc
