// Counting the runtime's MPI calls through the profiling interface.
//
// hvdc_bench defines MPI_Allreduce, MPI_Iallreduce, ... itself and forwards to PMPI_*. Because the
// executable comes first in the dynamic linker's search order, libhvdc_core.so's MPI calls land
// here too, so the benchmarks can report how many collectives the runtime issued per step (B3) and
// whether it polls MPI while idle (B4i). Calls on the benchmark's own communicator (the raw-MPI
// reference) are not counted.
#ifndef HVDC_BENCH_MPI_COUNT_H_
#define HVDC_BENCH_MPI_COUNT_H_

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only; Open MPI's C++ bindings do not build warning-free
#endif
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common.h"

namespace bench {

enum MpiFn {
  kAllreduce, kIallreduce, kReduceScatter, kIreduceScatter, kAllgather, kIallgather,
  kAllgatherv, kIallgatherv, kBcast, kIbcast, kGather, kGatherv, kIgather, kIgatherv,
  kReduce, kIreduce, kBarrier, kIbarrier, kAlltoall, kAlltoallv, kIalltoallv,
  kSend, kIsend, kRecv, kIrecv, kSendrecv,
  kTest, kTestall, kTestany, kTestsome, kWait, kWaitall, kIprobe, kProbe,
  kMpiFnCount
};

// One snapshot of all counters.
struct MpiCounts {
  uint64_t calls[kMpiFnCount] = {};
  uint64_t bytes[kMpiFnCount] = {};  // payload bytes per rank as passed (count x type size)
  MpiCounts operator-(const MpiCounts& o) const;
  uint64_t collectives() const;  // collective starts (blocking + nonblocking), no tests/waits
  uint64_t polls() const;        // MPI_Test*/Iprobe calls
};

void SetUncountedComm(MPI_Comm comm);  // the benchmark's own communicator
MpiCounts SnapshotMpiCounts();
bool MpiCountingActive();  // true once the runtime has made at least one counted call
const char* MpiFnName(int fn);
// {"MPI_Iallreduce": {"calls": .., "bytes": ..}, ...} for the non-zero entries, divided by `per`.
Json MpiCountsJson(const MpiCounts& c, double per = 1.0);
// "12 Iallreduce (34 KiB), 3 Allreduce (97 MiB)" -- non-zero collectives, divided by `per`.
std::string MpiCountsSummary(const MpiCounts& c, double per = 1.0);

}  // namespace bench

#endif  // HVDC_BENCH_MPI_COUNT_H_
