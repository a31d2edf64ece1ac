// SelfComm: the data plane of a one-member process set. Every collective over one rank is a copy
// from the send buffer to the receive buffer (or nothing, in place), so a backend can run such a
// set's batches on any thread without touching the transport.
#pragma once

#include "core/host_comm.h"

namespace hvdc {

class SelfComm : public HostComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

 private:
  Status DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                     ReduceOp op) override;
  Status DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                      const std::vector<int64_t>& recv_bytes) override;
  Status DoBroadcast(void* /*buf*/, int64_t /*bytes*/, int /*root*/) override {
    return Status::OK();
  }
  Status DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                     const std::vector<int64_t>& recv_bytes) override;
  Status DoReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                         DataType dtype, ReduceOp op) override;
  Status DoBarrier() override { return Status::OK(); }
};

}  // namespace hvdc
