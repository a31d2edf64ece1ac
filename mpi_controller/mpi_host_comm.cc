#include "mpi_controller/mpi_host_comm.h"

#include <algorithm>
#include <climits>
#include <iterator>
#include <string>
#include <vector>

#include "core/backoff.h"
#include "ops/cpu/kernels.h"

namespace hvdc {
namespace {

Status MpiError(const char* call, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  std::string what;
  if (MPI_Error_string(rc, text, &len) == MPI_SUCCESS && len > 0) {
    what.assign(text, static_cast<size_t>(len));
  } else {
    what = "MPI error code " + std::to_string(rc);
  }
  return Status::UnknownError(std::string(call) + " failed: " + what);
}

// Calls name args; a failure returns an UnknownError naming the call and MPI's error string.
#define HVDC_MPI_CALL(name, args)       \
  do {                                  \
    const int _hvdc_rc = name args;     \
    if (_hvdc_rc != MPI_SUCCESS) {      \
      return MpiError(#name, _hvdc_rc); \
    }                                   \
  } while (0)

// Our own MPI ops, over the cpu kernels:
// - float16/bfloat16 (every op): MPI has no such types, so each is a 2-byte contiguous type of
//   its own;
// - 8- and 16-bit integer Sum: Open MPI 4.1's AVX op component saturates these sums instead of
//   wrapping (open-mpi/ompi#8045, "wontfix"); frameworks wrap.
// Created once per process on first use and kept until MPI_Finalize, which frees them.
int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return 1;
    case ReduceOp::kMax:
      return 2;
    case ReduceOp::kProduct:
      return 3;
    default:
      return 0;  // Sum, Average
  }
}

bool NeedsUserOp(DataType t, ReduceOp op) {
  const bool small_int = t == DataType::kUint8 || t == DataType::kInt8 || t == DataType::kUint16 ||
                         t == DataType::kInt16;
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || (small_int && OpIndex(op) == 0);
}

template <DataType kDtype, ReduceOp kOp>
void UserOp(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  cpu::ReduceInto(inout, in, *len, kDtype, kOp);
}

struct UserOps {
  Status status;
  MPI_Datatype fp16 = MPI_DATATYPE_NULL;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Op ops[kNumDataTypes][4];  // [dtype][OpIndex]; MPI_OP_NULL where MPI's own op is used

  template <DataType kDtype>
  Status CreateOps(bool sum_only) {
    MPI_Op* row = ops[static_cast<int>(kDtype)];
    HVDC_MPI_CALL(MPI_Op_create, (&UserOp<kDtype, ReduceOp::kSum>, 1, &row[0]));
    if (sum_only) return Status::OK();
    HVDC_MPI_CALL(MPI_Op_create, (&UserOp<kDtype, ReduceOp::kMin>, 1, &row[1]));
    HVDC_MPI_CALL(MPI_Op_create, (&UserOp<kDtype, ReduceOp::kMax>, 1, &row[2]));
    HVDC_MPI_CALL(MPI_Op_create, (&UserOp<kDtype, ReduceOp::kProduct>, 1, &row[3]));
    return Status::OK();
  }

  Status Create() {
    for (auto& row : ops) std::fill(std::begin(row), std::end(row), MPI_OP_NULL);
    HVDC_MPI_CALL(MPI_Type_contiguous, (1, MPI_UINT16_T, &fp16));
    HVDC_MPI_CALL(MPI_Type_commit, (&fp16));
    HVDC_MPI_CALL(MPI_Type_contiguous, (1, MPI_UINT16_T, &bf16));
    HVDC_MPI_CALL(MPI_Type_commit, (&bf16));
    HVDC_RETURN_IF_ERROR(CreateOps<DataType::kFloat16>(/*sum_only=*/false));
    HVDC_RETURN_IF_ERROR(CreateOps<DataType::kBfloat16>(/*sum_only=*/false));
    HVDC_RETURN_IF_ERROR(CreateOps<DataType::kUint8>(/*sum_only=*/true));
    HVDC_RETURN_IF_ERROR(CreateOps<DataType::kInt8>(/*sum_only=*/true));
    HVDC_RETURN_IF_ERROR(CreateOps<DataType::kUint16>(/*sum_only=*/true));
    return CreateOps<DataType::kInt16>(/*sum_only=*/true);
  }
};

const UserOps& GetUserOps() {
  static const UserOps user_ops = [] {
    UserOps u;
    u.status = u.Create();
    return u;
  }();
  return user_ops;
}

MPI_Datatype BuiltinType(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8:
      return MPI_UINT8_T;
    case DataType::kInt8:
      return MPI_INT8_T;
    case DataType::kUint16:
      return MPI_UINT16_T;
    case DataType::kInt16:
      return MPI_INT16_T;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kBool:
      return MPI_C_BOOL;
    default:
      return MPI_DATATYPE_NULL;  // float16, bfloat16: ours
  }
}

MPI_Op BuiltinOp(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) {
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? MPI_LAND : MPI_LOR;
  }
  switch (op) {
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kProduct:
      return MPI_PROD;
    default:
      return MPI_SUM;
  }
}

// The MPI datatype and op for (dtype, op); op is Sum, Average (as Sum), Min, Max or Product
// (HostComm has checked both).
Status ResolveReduction(DataType dtype, ReduceOp op, MPI_Datatype* type, MPI_Op* mpi_op) {
  if (!NeedsUserOp(dtype, op)) {
    *type = BuiltinType(dtype);
    *mpi_op = BuiltinOp(dtype, op);
    return Status::OK();
  }
  const UserOps& user = GetUserOps();
  HVDC_RETURN_IF_ERROR(user.status);
  *type = dtype == DataType::kFloat16    ? user.fp16
          : dtype == DataType::kBfloat16 ? user.bf16
                                         : BuiltinType(dtype);
  *mpi_op = user.ops[static_cast<int>(dtype)][OpIndex(op)];
  return Status::OK();
}

// MPI takes int counts and displacements (consecutive blocks in rank order): converts one list
// (one non-negative entry per rank: HostComm has checked it), or fails naming what does not fit.
Status ToIntCounts(const char* what, const std::vector<int64_t>& counts,
                   std::vector<int>* out_counts, std::vector<int>* out_displs) {
  out_counts->resize(counts.size());
  out_displs->resize(counts.size());
  int64_t offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > INT_MAX || offset > INT_MAX) {
      return Status::InvalidArgument(
          std::string(what) + ": a count or offset above INT_MAX (rank " + std::to_string(r) +
          ", count " + std::to_string(counts[r]) + ", offset " + std::to_string(offset) +
          ") cannot be passed to MPI");
    }
    (*out_counts)[r] = static_cast<int>(counts[r]);
    (*out_displs)[r] = static_cast<int>(offset);
    offset += counts[r];
  }
  return Status::OK();
}

// Completes *request, with backoff (core/backoff.h) between tests: spin briefly, then yield, then
// sleep -- and keep calling MPI_Test, which is what progresses the request.
Status WaitWithBackoff(MPI_Request* request) {
  Backoff backoff;
  for (;;) {
    int flag = 0;
    HVDC_MPI_CALL(MPI_Test, (request, &flag, MPI_STATUS_IGNORE));
    if (flag) return Status::OK();
    backoff.Pause();
  }
}

// An Allreduce of at most this many bytes is one MPI_Iallreduce completed under the backoff: within
// Open MPI's eager limit over shared memory (btl_vader_eager_limit, 4 KiB), a message needs no
// further progress from its sender once posted. A larger one would, in every test the sleeping
// peer skips, so it goes through AllArrived() and the blocking call.
constexpr uint64_t kNonblockingMaxBytes = 4096;

class MpiHostComm : public HostComm {
 public:
  MpiHostComm(MPI_Comm comm, int rank, int size, int64_t max_per_call)
      : comm_(comm), rank_(rank), size_(size), max_per_call_(max_per_call) {}

  ~MpiHostComm() override { FreeComm(comm_); }

  MpiHostComm(const MpiHostComm&) = delete;
  MpiHostComm& operator=(const MpiHostComm&) = delete;

  static void FreeComm(MPI_Comm comm) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL && comm != MPI_COMM_WORLD && comm != MPI_COMM_SELF) {
      MPI_Comm_free(&comm);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

 private:
  Status DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                     ReduceOp op) override {
    MPI_Datatype type;
    MPI_Op mpi_op;
    HVDC_RETURN_IF_ERROR(ResolveReduction(dtype, op, &type, &mpi_op));
    const bool in_place = send == recv;
    const size_t elem = DataTypeSize(dtype);
    if (size_ > 1 && count > 0 && count <= max_per_call_ &&
        static_cast<uint64_t>(count) * elem <= kNonblockingMaxBytes) {
      // Small: one nonblocking call under the backoff, without the barrier. Each rank's data goes
      // out eagerly when it posts, so whichever rank comes last finds the others' data there and
      // completes at once instead of polling until they next look.
      MPI_Request request = MPI_REQUEST_NULL;
      HVDC_MPI_CALL(MPI_Iallreduce, (in_place ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                                     type, mpi_op, comm_, &request));
      return WaitWithBackoff(&request);
    }
    if (count > 0) HVDC_RETURN_IF_ERROR(AllArrived());
    for (int64_t done = 0; done < count;) {
      const int n = static_cast<int>(std::min(count - done, max_per_call_));
      const size_t offset = static_cast<size_t>(done) * elem;
      const void* in = in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + offset;
      HVDC_MPI_CALL(MPI_Allreduce, (in, static_cast<char*>(recv) + offset, n, type, mpi_op, comm_));
      done += n;
    }
    return Status::OK();
  }

  Status DoAllgatherv(const void* send, int64_t /*send_bytes*/, void* recv,
                      const std::vector<int64_t>& recv_bytes) override {
    std::vector<int> counts, displs;
    HVDC_RETURN_IF_ERROR(ToIntCounts("Allgatherv recv_bytes", recv_bytes, &counts, &displs));
    // Our own block already in place: MPI forbids overlapping send and receive buffers otherwise.
    const bool in_place = send == static_cast<const char*>(recv) + displs[rank_];
    HVDC_RETURN_IF_ERROR(AllArrived());
    HVDC_MPI_CALL(MPI_Allgatherv, (in_place ? MPI_IN_PLACE : send, counts[rank_], MPI_BYTE, recv,
                                   counts.data(), displs.data(), MPI_BYTE, comm_));
    return Status::OK();
  }

  Status DoBroadcast(void* buf, int64_t bytes, int root) override {
    if (bytes > 0) HVDC_RETURN_IF_ERROR(AllArrived());
    for (int64_t done = 0; done < bytes;) {
      const int n = static_cast<int>(std::min(bytes - done, max_per_call_));
      HVDC_MPI_CALL(MPI_Bcast, (static_cast<char*>(buf) + done, n, MPI_BYTE, root, comm_));
      done += n;
    }
    return Status::OK();
  }

  Status DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                     const std::vector<int64_t>& recv_bytes) override {
    std::vector<int> scounts, sdispls, rcounts, rdispls;
    HVDC_RETURN_IF_ERROR(ToIntCounts("Alltoallv send_bytes", send_bytes, &scounts, &sdispls));
    HVDC_RETURN_IF_ERROR(ToIntCounts("Alltoallv recv_bytes", recv_bytes, &rcounts, &rdispls));
    HVDC_RETURN_IF_ERROR(AllArrived());
    HVDC_MPI_CALL(MPI_Alltoallv, (send, scounts.data(), sdispls.data(), MPI_BYTE, recv,
                                  rcounts.data(), rdispls.data(), MPI_BYTE, comm_));
    return Status::OK();
  }

  // send == recv means in place: recv holds the whole input and gets this rank's block at its
  // start.
  Status DoReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                         DataType dtype, ReduceOp op) override {
    std::vector<int> counts, displs;
    HVDC_RETURN_IF_ERROR(ToIntCounts("ReduceScatter recv_counts", recv_counts, &counts, &displs));
    const int64_t total = static_cast<int64_t>(displs.back()) + counts.back();
    if (total > INT_MAX) {
      return Status::InvalidArgument("ReduceScatter: " + std::to_string(total) +
                                     " elements in all exceed INT_MAX");
    }
    MPI_Datatype type;
    MPI_Op mpi_op;
    HVDC_RETURN_IF_ERROR(ResolveReduction(dtype, op, &type, &mpi_op));
    if (total == 0) return Status::OK();  // the same on every rank: nothing to exchange
    HVDC_RETURN_IF_ERROR(AllArrived());
    HVDC_MPI_CALL(MPI_Reduce_scatter,
                  (send == recv ? MPI_IN_PLACE : send, recv, counts.data(), type, mpi_op, comm_));
    return Status::OK();
  }

  Status DoBarrier() override { return AllArrived(); }

  // Returns once every rank of the communicator has reached this call, having waited without
  // holding the core (WaitWithBackoff). Every collective above passes here first: a blocking MPI
  // call polls for as long as its peers are still computing, on the core the model's threads
  // need; once all are here, the blocking call runs at full speed. (A nonblocking collective
  // completed by tests with sleeps between them would not: Open MPI moves a large message on only
  // inside MPI calls.)
  Status AllArrived() {
    if (size_ == 1) return Status::OK();
    MPI_Request request = MPI_REQUEST_NULL;
    HVDC_MPI_CALL(MPI_Ibarrier, (comm_, &request));
    return WaitWithBackoff(&request);
  }

  const MPI_Comm comm_;
  const int rank_;
  const int size_;
  const int64_t max_per_call_;
};

}  // namespace

std::unique_ptr<HostComm> MakeMpiHostComm(MPI_Comm comm, int64_t max_elements_per_call) {
  if (comm == MPI_COMM_NULL) return nullptr;
  int rank = 0;
  int size = 0;
  if (MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
      MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS) {
    MpiHostComm::FreeComm(comm);
    return nullptr;
  }
  const int64_t limit = std::clamp<int64_t>(max_elements_per_call, 1, INT_MAX);
  return std::make_unique<MpiHostComm>(comm, rank, size, limit);
}

std::unique_ptr<HostComm> MakeMpiHostComm(MPI_Comm comm) { return MakeMpiHostComm(comm, INT_MAX); }

}  // namespace hvdc
