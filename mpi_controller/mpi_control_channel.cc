#include "mpi_controller/mpi_control_channel.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <utility>

namespace hvdc {
namespace mpi {
namespace {

// Drives a chain of nonblocking MPI calls, one request at a time: Step() posts the next call (or
// finishes) each time the current request completes.
//
// A collective cannot be cancelled, and MPI keeps writing into its buffers until it completes. So
// if an op is destroyed with a request still active (only when the runtime gives up on a dead
// peer), its buffers are deliberately leaked rather than freed under MPI's feet.
class ChainOp : public PendingOp {
 public:
  ~ChainOp() override {
    if (!done_) (void)buffers_.release();
  }

  bool Test(Status* status) override {
    while (!done_) {
      int flag = 0;
      const int rc = MPI_Test(&request_, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        Finish(MpiStatus(rc, fmt::format("MPI_Test of {}", call_).c_str()));
        break;
      }
      if (!flag) return false;
      Step();
    }
    *status = status_;
    return true;
  }

 protected:
  struct Buffers {
    std::string send;
    int64_t size = 0;            // this rank's blob size (Gather) or rank 0's (Broadcast)
    std::vector<int64_t> sizes;  // Gather at rank 0: every rank's blob size
    std::vector<int> counts;     // Gather at rank 0
    std::vector<int> displs;     // Gather at rank 0
    std::string recv;            // Gather at rank 0: every blob, back to back
  };

  ChainOp() = default;

  // Records the request of a call just posted (rc is its return code).
  void Posted(int rc, MPI_Request request, const char* call) {
    call_ = call;
    if (rc != MPI_SUCCESS) {
      Finish(MpiStatus(rc, call));
    } else {
      request_ = request;
    }
  }
  void Finish(Status status) {
    status_ = std::move(status);
    done_ = true;
  }
  // The current request has completed: post the next call, or Finish().
  virtual void Step() = 0;

  std::unique_ptr<Buffers> buffers_;  // Gather and Broadcast only (BitAnd needs none)

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
  const char* call_ = "";
  bool done_ = false;
  Status status_;
};

class BitAndOp : public ChainOp {
 public:
  BitAndOp(MPI_Comm comm, std::vector<uint64_t>* bits) {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, bits->data(), static_cast<int>(bits->size()),
                                  MPI_UINT64_T, MPI_BAND, comm, &request);
    Posted(rc, request, "MPI_Iallreduce");
  }

 private:
  void Step() override { Finish(Status::OK()); }
};

class GatherOp : public ChainOp {
 public:
  GatherOp(MPI_Comm comm, int rank, int size, std::string send, std::vector<std::string>* gathered)
      : comm_(comm), rank_(rank), size_(size), gathered_(gathered) {
    buffers_ = std::make_unique<Buffers>();
    Buffers& b = *buffers_;
    b.send = std::move(send);
    // A blob too large for one int count is announced as -1 and not sent, so every rank still
    // completes both calls and the error surfaces at both ends.
    b.size =
        b.send.size() > static_cast<size_t>(INT_MAX) ? -1 : static_cast<int64_t>(b.send.size());
    if (rank_ == 0) b.sizes.resize(size_);
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Igather(&b.size, 1, MPI_INT64_T, rank_ == 0 ? b.sizes.data() : nullptr, 1,
                               MPI_INT64_T, 0, comm_, &request);
    Posted(rc, request, "MPI_Igather");
  }

 private:
  void Step() override {
    Buffers& b = *buffers_;
    if (phase_ == 1) {
      if (rank_ == 0) {
        gathered_->resize(size_);
        for (int r = 0; r < size_; ++r) {
          (*gathered_)[r].assign(b.recv, static_cast<size_t>(b.displs[r]),
                                 static_cast<size_t>(b.counts[r]));
        }
      }
      Finish(oversized_.ok() ? Status::OK() : oversized_);
      return;
    }
    phase_ = 1;
    if (b.size < 0) {
      oversized_ = Status::InvalidArgument(
          fmt::format("Gather: this rank's message of {} bytes exceeds 2 GiB", b.send.size()));
    }
    if (rank_ == 0) {
      b.counts.resize(size_);
      b.displs.resize(size_);
      int64_t total = 0;
      for (int r = 0; r < size_; ++r) {
        if (b.sizes[r] < 0 && oversized_.ok()) {
          oversized_ =
              Status::InvalidArgument(fmt::format("Gather: rank {}'s message exceeds 2 GiB", r));
        }
        b.counts[r] = static_cast<int>(std::max<int64_t>(b.sizes[r], 0));
        b.displs[r] = static_cast<int>(std::min<int64_t>(total, INT_MAX));
        total += b.counts[r];
      }
      if (total > INT_MAX) {
        // Counts and displacements of MPI_Igatherv are ints; the peers' sends stay unmatched, and
        // the negotiation's deadline turns that into an error there too.
        Finish(Status::InvalidArgument(
            fmt::format("Gather: {} bytes in total exceed the 2 GiB a gather can carry", total)));
        return;
      }
      b.recv.resize(static_cast<size_t>(total));
    }
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc =
        MPI_Igatherv(b.send.data(), static_cast<int>(std::max<int64_t>(b.size, 0)), MPI_BYTE,
                     rank_ == 0 ? &b.recv[0] : nullptr, rank_ == 0 ? b.counts.data() : nullptr,
                     rank_ == 0 ? b.displs.data() : nullptr, MPI_BYTE, 0, comm_, &request);
    Posted(rc, request, "MPI_Igatherv");
  }

  MPI_Comm comm_;
  const int rank_;
  const int size_;
  std::vector<std::string>* gathered_;
  int phase_ = 0;
  Status oversized_;
};

class BroadcastOp : public ChainOp {
 public:
  BroadcastOp(MPI_Comm comm, int rank, std::string* blob) : comm_(comm), rank_(rank), blob_(blob) {
    buffers_ = std::make_unique<Buffers>();
    buffers_->size = rank_ == 0 ? static_cast<int64_t>(blob_->size()) : 0;
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ibcast(&buffers_->size, 1, MPI_INT64_T, 0, comm_, &request);
    Posted(rc, request, "MPI_Ibcast");
  }

 private:
  void Step() override {
    if (phase_ == 1) {
      Finish(Status::OK());
      return;
    }
    phase_ = 1;
    const int64_t size = buffers_->size;  // every rank now knows it, so all decide alike
    if (size > INT_MAX) {
      Finish(Status::InvalidArgument(
          fmt::format("Broadcast: a message of {} bytes exceeds 2 GiB", size)));
      return;
    }
    if (rank_ != 0) blob_->resize(static_cast<size_t>(size));
    if (size == 0) {
      Finish(Status::OK());
      return;
    }
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ibcast(&(*blob_)[0], static_cast<int>(size), MPI_BYTE, 0, comm_, &request);
    Posted(rc, request, "MPI_Ibcast");
  }

  MPI_Comm comm_;
  const int rank_;
  std::string* blob_;
  int phase_ = 0;
};

}  // namespace

MpiControlChannel::MpiControlChannel(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_.get(), &rank_);
  MPI_Comm_size(comm_.get(), &size_);
}

std::unique_ptr<PendingOp> MpiControlChannel::StartBitAnd(std::vector<uint64_t>* bits) {
  if (size_ == 1) return std::make_unique<DoneOp>();
  if (bits->size() > static_cast<size_t>(INT_MAX)) {
    return std::make_unique<DoneOp>(Status::InvalidArgument("BitAnd: bit vector too long"));
  }
  return std::make_unique<BitAndOp>(comm_.get(), bits);
}

std::unique_ptr<PendingOp> MpiControlChannel::StartGather(std::string send,
                                                          std::vector<std::string>* gathered) {
  gathered->clear();
  if (size_ == 1) {
    gathered->push_back(std::move(send));
    return std::make_unique<DoneOp>();
  }
  return std::make_unique<GatherOp>(comm_.get(), rank_, size_, std::move(send), gathered);
}

std::unique_ptr<PendingOp> MpiControlChannel::StartBroadcast(std::string* blob) {
  if (size_ == 1) return std::make_unique<DoneOp>();
  return std::make_unique<BroadcastOp>(comm_.get(), rank_, blob);
}

}  // namespace mpi
}  // namespace hvdc
