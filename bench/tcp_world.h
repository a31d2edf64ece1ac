// `hvdc_bench <b> --transport tcp`: inside an mpirun job, initialise the runtime over its TCP
// transport instead of MPI. mpirun is then only the launcher and the raw-MPI reference (which
// bench/run.sh --transport tcp restricts to Open MPI's TCP BTL, so both go over loopback TCP).
#ifndef HVDC_BENCH_TCP_WORLD_H_
#define HVDC_BENCH_TCP_WORLD_H_

#include <string>

#include "bench/common.h"

namespace bench {

// Before hvdc_init, collective over ctx.comm. Every rank reserves a free port on its address
// (--tcp-address ADDR, else the IPv4 address of --tcp-iface IF, else 127.0.0.1): a socket bound
// with SO_REUSEADDR and not listening, which the runtime's listener (also SO_REUSEADDR) can bind
// beside, so no other process can take the port in between. The ranks exchange "addr:port" with
// MPI_Allgather and export HOROVOD_CONTROLLER=gloo, HVDC_TCP_PEERS, HOROVOD_RANK, HOROVOD_SIZE (and
// HOROVOD_GLOO_IFACE for --tcp-iface). Fills ctx.transport and ctx.tcp_peers; fails the job on an
// error. Returns the reserving socket: close it with ReleaseTcpPort after hvdc_init.
int SetUpTcpWorld(Context& ctx);
void ReleaseTcpPort(int fd);

// How the raw reference's MPI was restricted (the OMPI_MCA_* variables mpirun --mca sets), e.g.
// "pml=ob1 btl=tcp,self btl_tcp_if_include=lo"; "Open MPI defaults" when none.
std::string RawMpiTransport();

}  // namespace bench

#endif  // HVDC_BENCH_TCP_WORLD_H_
