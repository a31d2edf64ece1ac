// HierarchicalHostComm: the data plane of a process set whose members span several hosts with
// the same number of members on each, when hierarchical allreduce or allgather is asked for
// (HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER; docs/shm.md). It composes three communicators,
// all made by the wrapped transport:
//   flat  -- the set's own HostComm: every collective not accelerated here;
//   local -- the set's members on this host (shared memory where it can be used, else the
//            transport's own sub-communicator);
//   cross -- the members with this rank's local index on every host.
//
// Allreduce: reduce-scatter within the host (block j, an even share of the elements, to local
// rank j), allreduce of each block over its cross group (every local rank drives the network at
// once), allgather within the host. Every element is reduced in one place only (the host sums in
// local-rank order, then one cross allreduce), so every rank gets the same bits.
//
// Allgatherv: allgather within the host (the host's block, its members in set-rank order), then
// local rank j allgathers the j-th 1/L slice of its host's block over its cross group, then an
// allgather within the host of those results; each host's bytes cross the network once per other
// host, not once per rank. The result is laid out in set-rank order whatever the host order.
#pragma once

#include <memory>
#include <vector>

#include "core/host_comm.h"
#include "core/status.h"
#include "core/transport.h"
#include "shm_controller/host_layout.h"
#include "shm_controller/shm_transport.h"

namespace hvdc {
namespace shm {

class HierarchicalHostComm : public HostComm {
 public:
  struct Parts {
    std::vector<ProcessSetChannels> keep;  // the sub-sets' other channels, kept for their lifetime
    std::unique_ptr<HostComm> flat;
    std::unique_ptr<HostComm> local;
    std::unique_ptr<HostComm> cross;
  };
  // layout: the set's (homogeneous, several hosts of several ranks); rank: this set rank.
  HierarchicalHostComm(Parts parts, HostLayout layout, int rank, bool allreduce, bool allgather);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool hierarchical_allreduce() const { return allreduce_; }
  bool hierarchical_allgather() const { return allgather_; }
  HostComm& local() { return *parts_.local; }  // for tests

 private:
  Status DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                     ReduceOp op) override;
  Status DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                      const std::vector<int64_t>& recv_bytes) override;
  Status DoBroadcast(void* buf, int64_t bytes, int root) override;
  Status DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                     const std::vector<int64_t>& recv_bytes) override;
  Status DoReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                         DataType dtype, ReduceOp op) override;
  Status DoBarrier() override;

  Parts parts_;
  const HostLayout layout_;
  const int rank_;
  const int size_;
  const bool allreduce_;
  const bool allgather_;
  int host_ = 0;                               // this rank's host in layout_
  int lrank_ = 0;                              // its index on that host (its local rank)
  int lsize_ = 0;                              // ranks per host
  std::vector<std::vector<int>> cross_hosts_;  // [j]: layout_.CrossHosts(j)
  // Scratch reused by the calls (the executor thread only).
  std::vector<uint8_t> block_, gathered_, staged_;
};

// Collective over the whole world of `inner` (every world rank calls it for the set, members or
// not, in the same order): makes the set's host and cross groups with inner.CreateProcessSet, the
// host group's shared-memory plane when options allow, and on members *out = the composed comm
// around `flat` (this rank's flat comm for the set; null outside it, and then *out is null too).
Status CreateHierarchicalHostComm(Transport& inner, const std::vector<int>& world_ranks,
                                  const HostLayout& layout, const ShmOptions& options,
                                  std::unique_ptr<HostComm> flat, std::unique_ptr<HostComm>* out);

}  // namespace shm
}  // namespace hvdc
