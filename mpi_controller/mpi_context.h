// MpiContext: who owns MPI, and the communicators the runtime derives from its world.
//
// Three ways to get a world:
//   managed     we call MPI_Init_thread (MPI_THREAD_MULTIPLE, or MPI_THREAD_SERIALIZED when
//               HOROVOD_MPI_THREADS_DISABLE is set). If someone else (mpi4py, the user) already
//               initialized MPI, we use it as it is and never finalize it.
//   borrowed    the user's communicator (duplicated; MPI must already be initialized).
//   rank subset a list of MPI_COMM_WORLD ranks (MPI_Comm_create_group); the world's rank order is
//               the list's order, and a rank outside the list gets an InvalidArgument error.
// From the world: local (MPI_Comm_split_type SHARED) and cross (split by local rank) communicators.
// Every communicator we create has MPI_ERRORS_RETURN. Finalize() frees them; MPI itself, when we
// initialized it, is finalized once, at process exit (an atexit hook registered with
// MPI_Init_thread, so it runs after the C API's own exit hook has stopped the runtime): MPI
// cannot be initialized twice in a process, and init() after shutdown() must find it ready.
// Only a program that finalized MPI itself makes a later managed context fail, saying so.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // only the C API (the C++ bindings do not compile warning-free)
#endif
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/transport.h"

namespace hvdc {
namespace mpi {

// UnknownError("<call> failed: <MPI_Error_string>") for an MPI return code, OK for MPI_SUCCESS.
Status MpiStatus(int rc, const char* call);

// "MPI_THREAD_MULTIPLE", ...
const char* ThreadLevelName(int level);

// Frees the communicator it holds (unless MPI is already finalized). Never holds a predefined one.
class UniqueComm {
 public:
  UniqueComm() = default;
  explicit UniqueComm(MPI_Comm comm) : comm_(comm) {}
  ~UniqueComm() { reset(); }
  UniqueComm(UniqueComm&& other) noexcept : comm_(other.release()) {}
  UniqueComm& operator=(UniqueComm&& other) noexcept;
  UniqueComm(const UniqueComm&) = delete;
  UniqueComm& operator=(const UniqueComm&) = delete;

  MPI_Comm get() const { return comm_; }
  MPI_Comm* out() { return &comm_; }  // for MPI calls that create a communicator (holds none)
  MPI_Comm release();
  void reset();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Duplicates comm with MPI_ERRORS_RETURN set on the duplicate.
Status DupWithErrorsReturn(MPI_Comm comm, UniqueComm* out);

struct MpiContextOptions {
  // Request MPI_THREAD_SERIALIZED instead of MPI_THREAD_MULTIPLE (managed mode only).
  bool serialized_only = false;
  // Managed mode, when this process initializes MPI: set OMPI_MCA_mpi_yield_when_idle=1 first, so
  // that Open MPI's blocking calls yield the core while they wait (docs/waiting.md). The transport
  // asks for it unless the user set the variable (Config::mpi_yield_when_idle_set).
  bool yield_when_idle = false;
  // Rank-subset mode: the MPI_COMM_WORLD ranks of the world (distinct). Empty: all of them.
  std::vector<int> ranks;
  // Borrowed mode: the user's communicator (not freed by us). Excludes `ranks`.
  const MPI_Comm* borrowed_comm = nullptr;
};

class MpiContext {
 public:
  static Status Create(const MpiContextOptions& options, std::unique_ptr<MpiContext>* out);
  ~MpiContext();  // frees the communicators; never finalizes MPI (that is Finalize())
  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;

  MPI_Comm world() const { return world_.get(); }
  MPI_Comm local() const { return local_.get(); }
  MPI_Comm cross() const { return cross_.get(); }
  const Topology& topology() const { return topology_; }
  // What MPI_Query_thread reports.
  int thread_level() const { return thread_level_; }
  // Whether MPI was initialized by us (by this context or an earlier one of this process).
  bool owns_mpi() const { return owns_mpi_; }

  // Frees the communicators (MPI stays initialized until process exit). Idempotent.
  void Finalize();

 private:
  MpiContext() = default;
  Status InitWorld(const MpiContextOptions& options);
  Status InitTopology();

  UniqueComm world_;
  UniqueComm local_;
  UniqueComm cross_;
  Topology topology_;
  int thread_level_ = MPI_THREAD_SINGLE;
  bool owns_mpi_ = false;
  bool finalized_ = false;
};

}  // namespace mpi
}  // namespace hvdc
