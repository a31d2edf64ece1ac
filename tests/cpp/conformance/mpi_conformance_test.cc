// The conformance suites over the MPI transport (mpi_controller/), run by ctest under mpirun at
// np=2 and np=3: one rank per process, the world whatever mpirun gives. main() initializes MPI
// itself, so every transport here uses an MPI it does not own; each test makes its own.
//
// The same suites also run over the shared-memory plane under MPI ("shm": ranks as processes, each
// set's data through a 64 KiB segment, MPI keeping control), and over the hierarchical plane
// ("hierarchical": two ranks per pretended host; hierarchical at np >= 4, the fallbacks below).
//
// Every rank runs every test. Rank 0 prints GoogleTest's output, the others only their failures,
// and every rank exits non-zero if any rank failed.
// Only the C API: Open MPI's deprecated C++ bindings do not compile warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>

#include "core/config.h"
#include "mpi_controller/mpi_transport.h"
#include "shm_controller/shm_transport.h"
#include "tests/cpp/conformance/suite_util.h"
#include "tests/cpp/util/rank_failure_printer.h"

namespace hvdc {
namespace conformance {
namespace {

class MpiWorld : public World {
 public:
  explicit MpiWorld(std::unique_ptr<Transport> transport) : transport_(std::move(transport)) {}
  ~MpiWorld() override { transport_->Finalize(); }
  int size() const override { return transport_->topology().size; }
  bool in_one_process() const override { return false; }
  void Run(const std::function<void(Transport&)>& body) override { body(*transport_); }

 private:
  std::unique_ptr<Transport> transport_;
};

enum class Plane { kMpi, kShm, kHierarchical };

std::unique_ptr<World> MakeMpiWorld(Plane plane) {
  std::unique_ptr<Transport> t;
  Status s = MakeMpiTransport(Config(), MpiTransportOptions{}, &t);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!t) return nullptr;
  if (plane != Plane::kMpi) {
    shm::ShmOptions options;
    options.bytes = 64 * 1024;
    options.host = "mpi-conformance";  // one host: mpirun here starts every rank locally
    if (plane == Plane::kHierarchical) {
      // Pretend hosts of two ranks each: at np=4 and above the world set is hierarchical (its
      // sub-groups MPI communicators); at np=2 one host, at np=3 uneven hosts (the fallbacks).
      options.host = "mpi-host-" + std::to_string(t->topology().rank / 2);
      options.hierarchical_allreduce = options.hierarchical_allgather = true;
    }
    t = shm::MakeShmTransport(std::move(t), options);
  }
  return std::make_unique<MpiWorld>(std::move(t));
}

const WorldParam kMpi = {"world", [] { return MakeMpiWorld(Plane::kMpi); }};
const WorldParam kMpiShm = {"shm", [] { return MakeMpiWorld(Plane::kShm); }};
const WorldParam kMpiHierarchical = {"hierarchical",
                                     [] { return MakeMpiWorld(Plane::kHierarchical); }};

INSTANTIATE_TEST_SUITE_P(Mpi, HostCommConformance,
                         ::testing::Values(kMpi, kMpiShm, kMpiHierarchical), WorldName());
INSTANTIATE_TEST_SUITE_P(Mpi, ControlChannelConformance, ::testing::Values(kMpi), WorldName());
INSTANTIATE_TEST_SUITE_P(Mpi, ProcessSetConformance,
                         ::testing::Values(kMpi, kMpiShm, kMpiHierarchical), WorldName());

}  // namespace
}  // namespace conformance
}  // namespace hvdc

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ::testing::InitGoogleTest(&argc, argv);
  hvdc_test::PrintOnlyFailuresUnlessRankZero(rank);
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int ranks_failed = 0;
  MPI_Allreduce(&failed, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && ranks_failed > 0) {
    std::fprintf(stderr, "%d of %d ranks had failures\n", ranks_failed, size);
  }
  MPI_Finalize();
  return ranks_failed > 0 ? 1 : 0;
}
