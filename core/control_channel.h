// ControlChannel: the few collective primitives negotiation needs, over one process set. The
// negotiation algorithm (negotiator.h) is written once over this; mpi_controller/ implements it
// over MPI nonblocking collectives, tcp_controller/ over the TCP mesh, and local_controller/ over
// memory shared by threads-as-ranks.
//
// Every operation is nonblocking: Start* returns a PendingOp that the control thread progresses
// with Test() until it reports completion. Operations on one channel are started in the same order
// on every rank and at most one is outstanding at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace hvdc {

class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // Makes progress; returns true once finished (successfully or not; *status says which).
  virtual bool Test(Status* status) = 0;
  // For the stall inspector, while unfinished: false when the channel cannot tell; else true with
  // *ranks = the channel ranks whose part of this operation has not reached this rank yet.
  virtual bool Missing(std::vector<int>* ranks) const {
    (void)ranks;
    return false;
  }
};

class ControlChannel {
 public:
  virtual ~ControlChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Bitwise AND of *bits over all ranks, in place. All ranks pass the same length.
  virtual std::unique_ptr<PendingOp> StartBitAnd(std::vector<uint64_t>* bits) = 0;
  // Gathers each rank's blob at rank 0: afterwards (*gathered)[r] holds rank r's blob on rank 0
  // (other ranks' *gathered is left empty).
  virtual std::unique_ptr<PendingOp> StartGather(std::string send,
                                                 std::vector<std::string>* gathered) = 0;
  // Replaces *blob on every rank with rank 0's.
  virtual std::unique_ptr<PendingOp> StartBroadcast(std::string* blob) = 0;
};

// A PendingOp that is already complete (size-1 channels, errors at start).
class DoneOp : public PendingOp {
 public:
  explicit DoneOp(Status s = Status::OK()) : status_(std::move(s)) {}
  bool Test(Status* status) override {
    *status = status_;
    return true;
  }

 private:
  Status status_;
};

}  // namespace hvdc
