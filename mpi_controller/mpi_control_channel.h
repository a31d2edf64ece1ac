// MpiControlChannel: the ControlChannel over one MPI communicator, with nonblocking collectives
// (Open MPI here has no asynchronous progress: the control thread drives them with Test()).
//   BitAnd     MPI_Iallreduce(MPI_IN_PLACE, MPI_UINT64_T, MPI_BAND)
//   Gather     MPI_Igather of every blob's size (int64), then MPI_Igatherv of the bytes at rank 0
//   Broadcast  MPI_Ibcast of rank 0's size (int64), then of the bytes
// An MPI error becomes an UnknownError naming the call and MPI's message. On a communicator of one
// rank every operation completes at once. Gather's total and Broadcast's size must fit in an int
// (2 GiB); control messages are far smaller.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/control_channel.h"
#include "mpi_controller/mpi_context.h"

namespace hvdc {
namespace mpi {

class MpiControlChannel : public ControlChannel {
 public:
  // Takes ownership of comm (freed at destruction), which should have MPI_ERRORS_RETURN and must
  // be used by nothing else.
  explicit MpiControlChannel(MPI_Comm comm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<PendingOp> StartBitAnd(std::vector<uint64_t>* bits) override;
  std::unique_ptr<PendingOp> StartGather(std::string send,
                                         std::vector<std::string>* gathered) override;
  std::unique_ptr<PendingOp> StartBroadcast(std::string* blob) override;

 private:
  UniqueComm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace mpi
}  // namespace hvdc
