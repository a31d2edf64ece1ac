// The shared-memory plane under another transport: that transport keeps process-set creation,
// failure detection and everything across hosts; a process set whose ranks all share a host gets
// a ShmHostComm as its data plane instead of the transport's own, and a ShmControlChannel for its
// negotiation (unless HVDC_SHM_CONTROL=0).
//
// Whether the plane can be used is settled per process set, collectively, over the transport's
// own HostComm: same host identity on every member, a segment created and attached by all. Any
// refusal (turned off, ranks on several hosts, /dev/shm too small or unusable, a segment of that
// name already there) keeps the transport's data plane and is logged, never an error.
//
// A set whose ranks span hosts keeps the transport's data plane, unless hierarchical allreduce or
// allgather is on: then it gets a HierarchicalHostComm (hierarchical_host_comm.h) over host and
// cross groups the transport makes, the host group through shared memory where it can be.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/host_comm.h"
#include "core/status.h"
#include "core/transport.h"

namespace hvdc {
namespace shm {

struct ShmOptions {
  bool enabled = true;  // HVDC_SHM
  bool control = true;  // HVDC_SHM_CONTROL: negotiate through shared memory too
  int64_t bytes = 0;    // HVDC_SHM_BYTES: one segment (per process set); 0: DefaultSegmentBytes
  std::string host;     // this rank's host identity (HOROVOD_HOSTNAME or hostname)
  double peer_timeout_s = 4.0;  // HOROVOD_PEER_TIMEOUT_SECONDS: a stopped peer is lost after
  // Set by the wrapper: the inner transport reports lost peers itself (TCP), naming them by
  // address; the control channel then leaves it a head start (ShmControlChannel).
  bool transport_reports_loss = false;
  // HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER: a set spanning hosts with the same number of
  // members on each runs these through HierarchicalHostComm (hierarchical_host_comm.h).
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;
  static ShmOptions FromConfig(const Config& config);
};

// The data segment of a set of `nranks` on one host, when HVDC_SHM_BYTES does not say: 1 MiB per
// member (slots of about 512 KiB, which a round's three passes keep in a core's L2) while the
// host has a core for each member; 16 MiB when it has fewer (ranks then take turns on the cores,
// and every round waits for each of them: fewer, larger rounds). Measured at np=2 and 4 on the
// 2-core VM: docs/shm.md.
int64_t DefaultSegmentBytes(int nranks);

// Collective over the members of `boot` (every member calls it, in the same order for every set):
// on success *out is the plane, or null when it cannot be used here (the reason logged). An error
// only when `boot` itself fails. world_ranks[r] is set rank r's world rank (for messages).
Status CreateShmHostComm(HostComm& boot, const std::vector<int>& world_ranks,
                         const ShmOptions& options, std::unique_ptr<HostComm>* out);

// Collective over the members of `boot`, all on one host: the shared-memory control channel, or
// null when its segment cannot be made (logged).
Status CreateShmControlChannel(HostComm& boot, const std::vector<int>& world_ranks,
                               const ShmOptions& options, std::unique_ptr<ControlChannel>* out);

// Wraps `inner`: every process set it creates gets the shared-memory plane where it can be used,
// and, when hierarchical allreduce or allgather is on, a set spanning hosts gets the hierarchical
// plane. The first set it creates also gathers every world rank's host identity (over that set
// when it is the world, as the runtime's first set is; else over a world set made for it).
std::unique_ptr<Transport> MakeShmTransport(std::unique_ptr<Transport> inner,
                                            const ShmOptions& options);

}  // namespace shm
}  // namespace hvdc
