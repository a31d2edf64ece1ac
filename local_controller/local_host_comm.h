// LocalHostComm: the HostComm data plane among the member threads of one in-memory process set.
// Internal to local_controller/; obtained through MakeLocalTransport.
//
// Each call meets the other members' matching call on the set's Rendezvous (matched by a per-comm
// sequence number), then every rank reads its peers' buffers directly: one copy per byte, no
// staging. Every rank returns the same verdict: a rank whose arguments fail HostComm's check still
// arrives, carrying the error, which every member then returns (its origin the rank that passed
// them); arguments that disagree across ranks are found once all have arrived. A size-1 set
// copies (if needed) and returns without taking a lock.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/host_comm.h"
#include "local_controller/rendezvous.h"

namespace hvdc {
namespace local {

class LocalHostComm : public HostComm {
 public:
  LocalHostComm(std::shared_ptr<Rendezvous> rendezvous, int rank);

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Rendezvous& rendezvous() { return *rendezvous_; }  // for tests

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
  // A rank with bad arguments still meets its peers, so that every member returns its error.
  Status Refuse(Collective c, Status error) override;

  std::shared_ptr<Rendezvous> rendezvous_;
  const int rank_;
  const int size_;
  uint64_t next_seq_ = 0;  // used only by this rank's executor thread
};

}  // namespace local
}  // namespace hvdc
