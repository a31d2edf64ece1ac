// HostComm: the data-plane primitives a CPU backend needs, over host memory, for one process set.
// Implemented by each transport: mpi_controller/ (MPI communicators), tcp_controller/ (ring and
// tree algorithms over TCP) and local_controller/ (threads in one process, for tests and the
// single-rank runtime), by SelfComm (one-member sets), and by shm_controller/ (the ranks of one
// host, through shared memory, under another transport).
// All calls are blocking and collective over the set, and are made from one executor thread per
// process set.
//
// Every call goes through the public methods below, which check this rank's own arguments -- the
// same rules and messages over every transport (InvalidArgument) -- and only then run the
// implementation's Do* hook, so an implementation sees valid arguments only. Whether the ranks'
// arguments agree with each other is the negotiation's business; an implementation may check that
// too (PreconditionError).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace hvdc {

// One piece of an AllreducePieces call: `count` elements read from `in` and written to `out`.
// in == nullptr: this rank contributes zeros (a joined rank); out == nullptr: the result is
// discarded; in == out: in place.
struct ReducePiece {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t count = 0;
};

// Whether the pieces' memory overlaps anywhere except a piece's own in == out (each piece is
// `element_size` bytes an element): AllreducePieces refuses such pieces.
bool PiecesOverlap(const std::vector<ReducePiece>& pieces, int64_t element_size);

class HostComm {
 public:
  enum class Collective {
    kAllreduce,
    kAllgatherv,
    kBroadcast,
    kAlltoallv,
    kReduceScatter,
    kBarrier
  };
  static const char* CollectiveName(Collective c);  // "Allreduce", ...

  virtual ~HostComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = op over ranks of send[i]; send == recv means in place. op is Sum, Min, Max or
  // Product (Average is accepted as Sum: the caller folds the division into a postscale). Any
  // count (>= 0) is accepted.
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op);
  // Concatenates every rank's send bytes in rank order; recv_bytes[r] is rank r's length (so
  // recv_bytes[rank()] == send_bytes).
  Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes);
  // Replaces buf on every rank with root's bytes (root is a rank within this set).
  Status Broadcast(void* buf, int64_t bytes, int root);
  // send_bytes[r]: bytes of send (consecutive blocks, rank order) for rank r; recv_bytes[r]:
  // bytes received from rank r, placed consecutively in rank order (so a rank sends itself what
  // it receives from itself).
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>& recv_bytes);
  // Reduces send (sum over ranks of recv_counts elements) and leaves block r on rank r.
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op);
  Status Barrier() { return DoBarrier(); }

  // Whether AllreducePieces is implemented by this data plane (else it returns an error and the
  // caller packs the pieces into one buffer for Allreduce).
  virtual bool allreduces_pieces() const { return false; }
  // An allreduce of the pieces' concatenation as one vector of `dtype`: every rank's input is
  // multiplied by prescale before the reduction and the result by postscale (1: no scaling; each
  // as cpu::ScaleCopy does it). Pieces may be of any count (>= 0); no output may overlap other
  // memory of the call except its own input when in == out (PiecesOverlap), inputs may share
  // memory. Every rank passes the same total count.
  Status AllreducePieces(const std::vector<ReducePiece>& pieces, DataType dtype, ReduceOp op,
                         double prescale, double postscale);

 protected:
  // The collectives, called with arguments that passed the checks above.
  virtual Status DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                             ReduceOp op) = 0;
  virtual Status DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                              const std::vector<int64_t>& recv_bytes) = 0;
  virtual Status DoBroadcast(void* buf, int64_t bytes, int root) = 0;
  virtual Status DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                             const std::vector<int64_t>& recv_bytes) = 0;
  virtual Status DoReduceScatter(const void* send, void* recv,
                                 const std::vector<int64_t>& recv_counts, DataType dtype,
                                 ReduceOp op) = 0;
  virtual Status DoBarrier() = 0;
  // Only called when allreduces_pieces() is true.
  virtual Status DoAllreducePieces(const std::vector<ReducePiece>& pieces, DataType dtype,
                                   ReduceOp op, double prescale, double postscale);

  // Runs instead of the Do* hook when this rank's arguments failed the check, with that error,
  // which it returns. By default nothing reaches the peers (their matching calls are left to fail
  // or wait as they would for any other local error). A data plane that promises the same
  // verdict on every member overrides it to take part in the call and share the error.
  virtual Status Refuse(Collective c, Status error);
};

}  // namespace hvdc
