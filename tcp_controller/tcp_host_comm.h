// TcpHostComm: the HostComm data plane over the members of one process set on the TCP mesh, on a
// channel of its own. Blocking calls made from the set's executor thread.
//
//   Allreduce      small (<= kSmallBytes, or fewer elements than ranks): recursive doubling (extra
//                  ranks of a non-power-of-two set fold into the first ones); large: ring
//                  reduce-scatter then ring allgather, each block cut into segments of
//                  `segment_bytes` so that sending, receiving (the mesh's I/O thread) and reducing
//                  overlap. Every rank ends with bit-identical values.
//   ReduceScatter  the ring's reduce-scatter over blocks of recv_counts
//   Allgatherv     every rank sends its block to every other (rank-shifted order)
//   Broadcast      small: the root sends to everyone; large: a pipelined chain from the root
//   Alltoallv      pairwise, rank-shifted order
//   Barrier        dissemination (log2 rounds of empty messages)
// Reductions use the cpu kernels (every dtype, float16/bfloat16 included). Ranks must agree on the
// arguments (the runtime negotiates them); a disagreement on a message's size is a
// PreconditionError naming the peer. A failed connection is the mesh's error naming the peer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/host_comm.h"
#include "tcp_controller/tcp_group.h"

namespace hvdc {
namespace tcp {

class TcpHostComm : public HostComm {
 public:
  static constexpr int64_t kSmallBytes = 64 * 1024;

  TcpHostComm(Group group, int64_t segment_bytes)
      : group_(std::move(group)),
        segment_bytes_(segment_bytes > 0 ? std::min<int64_t>(segment_bytes, Mesh::kMaxFrameBytes)
                                         : int64_t{1} << 20) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }

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

  Status RecursiveDoubling(uint8_t* buf, int64_t count, DataType dtype, ReduceOp op);
  // Ring reduce-scatter over `offsets` (n + 1 element offsets): afterwards block r of buf holds
  // the reduction on rank r.
  Status RingReduceScatter(uint8_t* buf, const std::vector<int64_t>& offsets, DataType dtype,
                           ReduceOp op);
  // Ring allgather of the blocks of buf (rank r contributes block r).
  Status RingAllgather(uint8_t* buf, const std::vector<int64_t>& offsets, size_t esize);
  // Receives one message of exactly elems elements from r and reduces it into dst.
  Status RecvReduce(int r, uint8_t* dst, int64_t elems, DataType dtype, ReduceOp op);

  Group group_;
  const int64_t segment_bytes_;
};

}  // namespace tcp
}  // namespace hvdc
