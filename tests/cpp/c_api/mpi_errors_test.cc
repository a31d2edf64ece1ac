// Errors under mpirun, through the C API only: every error carries the right code and a message
// that names the tensor (and the conflicting values for cross-rank mismatches), and the runtime
// keeps working afterwards. Also the topology queries, and the callback ledger: every enqueued
// callback runs exactly once, including at shutdown (the last test, which leaves the runtime down).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/c_api_harness.h"

namespace hvdc_test {
namespace {

int EnvInt(const char* a, const char* b) {
  for (const char* var : {a, b}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return -1;
}

// A normal allreduce over the global set, checked: the runtime still works.
void ExpectRuntimeWorks(const std::string& tag) {
  const int rank = hvdc_rank();
  Buffer buf(HVDC_FLOAT32, 7,
             [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i); });
  const std::string name = TestName(tag);
  EXPECT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), buf, buf, {7}, HVDC_SUM))))
      << "the runtime must keep working after an error";
  EXPECT_TRUE(BufferMatches(
      buf, [&](int64_t i) { return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, WorldRanks(), i); },
      name));
}

bool IsLastRank() { return hvdc_rank() == hvdc_size() - 1; }

// ---------------------------------------------------------------------------------------------
// Topology

TEST(Topology, QueriesAgreeWithLauncher) {
  const int size = hvdc_size();
  const int rank = hvdc_rank();
  EXPECT_EQ(hvdc_is_initialized(), 1);
  EXPECT_EQ(size, EnvInt("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"));
  EXPECT_EQ(rank, EnvInt("OMPI_COMM_WORLD_RANK", "PMI_RANK"));
  const int local_size = EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS");
  const int local_rank = EnvInt("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID");
  if (local_size > 0) {
    EXPECT_EQ(hvdc_local_size(), local_size);
    EXPECT_EQ(hvdc_local_rank(), local_rank);
    EXPECT_EQ(hvdc_cross_size(), size / local_size) << "one host: every rank is local";
  }
  EXPECT_GE(hvdc_cross_rank(), 0);
  EXPECT_LT(hvdc_cross_rank(), hvdc_cross_size());
  EXPECT_EQ(hvdc_is_homogeneous(), 1);
  EXPECT_EQ(hvdc_mpi_enabled(), 1);
  EXPECT_EQ(hvdc_mpi_built(), 1);
  EXPECT_TRUE(hvdc_mpi_threads_supported() == 0 || hvdc_mpi_threads_supported() == 1)
      << hvdc_mpi_threads_supported();
  EXPECT_TRUE(hvdc_cuda_built() == 0 || hvdc_cuda_built() == 1);
  EXPECT_GE(hvdc_nccl_built(), 0);
  ASSERT_NE(hvdc_version(), nullptr);
  EXPECT_STRNE(hvdc_version(), "");

  EXPECT_EQ(hvdc_process_set_size(0), size);
  EXPECT_EQ(hvdc_process_set_rank(0), rank);
  EXPECT_EQ(hvdc_process_set_included(0), 1);
  EXPECT_EQ(SetRanks(0), WorldRanks());
  EXPECT_EQ(hvdc_number_of_process_sets(), 1);
  int32_t ids[4] = {-1, -1, -1, -1};
  EXPECT_EQ(hvdc_process_set_ids(ids, 4), 1);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(hvdc_process_set_size(999), HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);
  EXPECT_EQ(hvdc_process_set_rank(999), HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);
  EXPECT_EQ(hvdc_process_set_included(999), HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);

  // Every rank's view of itself, gathered: ranks 0..size-1 in order, local ranks consistent.
  Buffer me(HVDC_INT32, 2);
  me.Set(0, rank);
  me.Set(1, hvdc_local_rank());
  Output out(HVDC_INT32);
  const std::string name = TestName();
  hvdc_request req = NewRequest(HVDC_OP_ALLGATHER, name.c_str());
  req.input = TensorOf(me, {1, 2});
  out.AttachTo(&req);
  ASSERT_TRUE(IsOk(RunSync(req)));
  ASSERT_EQ(out.dims(), (std::vector<int64_t>{size, 2}));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(out.buffer().Get(2 * r), r);
    if (local_size > 0) {
      EXPECT_EQ(out.buffer().Get(2 * r + 1), r % local_size);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Cross-rank mismatches: the last rank disagrees; every rank gets PRECONDITION_ERROR for that
// tensor only.

TEST(Mismatch, Shape) {
  const int rank = hvdc_rank();
  const int64_t n = IsLastRank() ? 1001 : 1000;
  Buffer buf(HVDC_FLOAT32, n, [&](int64_t i) { return static_cast<double>(rank + i % 5); });
  const std::string name = TestName();
  EXPECT_TRUE(IsError(RunSync(AllreduceRequest(name.c_str(), buf, buf, {n}, HVDC_SUM)),
                      HVDC_PRECONDITION_ERROR, {name, "1000", "1001", "rank"}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, Rank) {
  const std::vector<int64_t> dims =
      IsLastRank() ? std::vector<int64_t>{6} : std::vector<int64_t>{2, 3};
  Buffer buf(HVDC_FLOAT32, 6, [](int64_t i) { return static_cast<double>(i); });
  const std::string name = TestName();
  EXPECT_TRUE(IsError(RunSync(AllreduceRequest(name.c_str(), buf, buf, dims, HVDC_SUM)),
                      HVDC_PRECONDITION_ERROR, {name}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, Dtype) {
  const int dtype = IsLastRank() ? HVDC_FLOAT64 : HVDC_FLOAT32;
  Buffer buf(dtype, 8, [](int64_t i) { return static_cast<double>(i); });
  const std::string name = TestName();
  EXPECT_TRUE(IsError(RunSync(AllreduceRequest(name.c_str(), buf, buf, {8}, HVDC_SUM)),
                      HVDC_PRECONDITION_ERROR, {name, "float32", "float64", "rank"}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, ReduceOp) {
  Buffer buf(HVDC_FLOAT32, 8, [](int64_t i) { return static_cast<double>(i); });
  const std::string name = TestName();
  const int op = IsLastRank() ? HVDC_MAX : HVDC_SUM;
  EXPECT_TRUE(IsError(RunSync(AllreduceRequest(name.c_str(), buf, buf, {8}, op)),
                      HVDC_PRECONDITION_ERROR, {name, "sum", "max", "rank"}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, BroadcastRoot) {
  const int rank = hvdc_rank();
  Buffer buf(HVDC_INT32, 8, [&](int64_t i) { return static_cast<double>(rank * 10 + i); });
  const std::string name = TestName();
  hvdc_request req = NewRequest(HVDC_OP_BROADCAST, name.c_str());
  req.input = TensorOf(buf, {8});
  req.output = req.input;
  req.root_rank = IsLastRank() ? 1 : 0;
  EXPECT_TRUE(IsError(RunSync(req), HVDC_PRECONDITION_ERROR, {name, "rank"}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, Prescale) {
  Buffer buf(HVDC_FLOAT32, 8, [](int64_t i) { return static_cast<double>(i); });
  const std::string name = TestName();
  hvdc_request req = AllreduceRequest(name.c_str(), buf, buf, {8}, HVDC_SUM);
  req.prescale_factor = IsLastRank() ? 0.25 : 0.5;
  EXPECT_TRUE(IsError(RunSync(req), HVDC_PRECONDITION_ERROR, {name, "0.5", "0.25", "rank"}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, Postscale) {
  Buffer buf(HVDC_FLOAT32, 8, [](int64_t i) { return static_cast<double>(i); });
  const std::string name = TestName();
  hvdc_request req = AllreduceRequest(name.c_str(), buf, buf, {8}, HVDC_SUM);
  req.postscale_factor = IsLastRank() ? 1.5 : 0.75;
  EXPECT_TRUE(IsError(RunSync(req), HVDC_PRECONDITION_ERROR, {name, "1.5", "0.75", "rank"}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, OpType) {
  Buffer buf(HVDC_FLOAT32, 8, [](int64_t i) { return static_cast<double>(i); });
  Output out(HVDC_FLOAT32);
  const std::string name = TestName();
  hvdc_request req;
  if (IsLastRank()) {
    req = NewRequest(HVDC_OP_ALLGATHER, name.c_str());
    req.input = TensorOf(buf, {8});
    out.AttachTo(&req);
  } else {
    req = AllreduceRequest(name.c_str(), buf, buf, {8}, HVDC_SUM);
  }
  EXPECT_TRUE(
      IsError(RunSync(req), HVDC_PRECONDITION_ERROR, {name, "allreduce", "allgather", "rank"}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, AllgatherTrailingDims) {
  const int64_t cols = IsLastRank() ? 4 : 3;
  Buffer buf(HVDC_INT64, 2 * cols, [](int64_t i) { return static_cast<double>(i); });
  Output out(HVDC_INT64);
  const std::string name = TestName();
  hvdc_request req = NewRequest(HVDC_OP_ALLGATHER, name.c_str());
  req.input = TensorOf(buf, {2, cols});
  out.AttachTo(&req);
  EXPECT_TRUE(IsError(RunSync(req), HVDC_PRECONDITION_ERROR, {name}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, AlltoallTrailingDims) {
  const int size = hvdc_size();
  const int64_t cols = IsLastRank() ? 4 : 3;
  Buffer buf(HVDC_FLOAT32, size * cols, [](int64_t i) { return static_cast<double>(i); });
  Output out(HVDC_FLOAT32);
  const std::string name = TestName();
  hvdc_request req = NewRequest(HVDC_OP_ALLTOALL, name.c_str());
  req.input = TensorOf(buf, {size, cols});
  out.AttachTo(&req);
  EXPECT_TRUE(IsError(RunSync(req), HVDC_PRECONDITION_ERROR, {name}));
  ExpectRuntimeWorks("after");
}

TEST(Mismatch, BroadcastShape) {
  const int64_t n = IsLastRank() ? 5 : 4;
  Buffer buf(HVDC_UINT8, n, [](int64_t i) { return static_cast<double>(i); });
  const std::string name = TestName();
  hvdc_request req = NewRequest(HVDC_OP_BROADCAST, name.c_str());
  req.input = TensorOf(buf, {n});
  req.output = req.input;
  EXPECT_TRUE(IsError(RunSync(req), HVDC_PRECONDITION_ERROR, {name}));
  ExpectRuntimeWorks("after");
}

// Several mismatched tensors in flight together with good ones: only the bad ones fail.
TEST(Mismatch, OnlyTheBadTensorFails) {
  const int rank = hvdc_rank();
  Batch batch;
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<bool> bad;
  for (int t = 0; t < 12; ++t) {
    const bool is_bad = t % 4 == 1;
    const int64_t n = (is_bad && IsLastRank()) ? 10 : 9;
    bufs.push_back(std::make_unique<Buffer>(HVDC_FLOAT32, n, [&](int64_t i) {
      return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i + t);
    }));
    bad.push_back(is_bad);
    const char* name = batch.Name(TestName("t" + std::to_string(t)));
    batch.Add(AllreduceRequest(name, *bufs.back(), *bufs.back(), {n}, HVDC_SUM));
  }
  const std::vector<Result> results = batch.WaitAll();
  for (int t = 0; t < 12; ++t) {
    const std::string name = TestName("t" + std::to_string(t));
    if (bad[t]) {
      EXPECT_TRUE(IsError(results[t], HVDC_PRECONDITION_ERROR, {name})) << name;
    } else {
      EXPECT_TRUE(IsOk(results[t])) << name;
      EXPECT_TRUE(BufferMatches(
          *bufs[t],
          [&](int64_t i) { return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, WorldRanks(), i + t); },
          name));
    }
  }
  ExpectRuntimeWorks("after");
}

// ---------------------------------------------------------------------------------------------
// Invalid arguments

// Rank 0 enqueues "dup" twice before any other rank has submitted it: the second hvdc_enqueue
// fails at once. The others submit it only after a global allreduce that rank 0 joins after its
// duplicate attempt, so the first "dup" is certainly still in flight then.
TEST(Invalid, DuplicateInFlightName) {
  const int rank = hvdc_rank();
  const std::string name = TestName("dup");
  Buffer first(HVDC_FLOAT32, 4,
               [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i); });
  Buffer second(HVDC_FLOAT32, 4);
  Pending pending;
  if (rank == 0) {
    pending = Enqueue(AllreduceRequest(name.c_str(), first, first, {4}, HVDC_SUM));
    EXPECT_FALSE(pending.enqueue_failed());
    Pending dup = Enqueue(AllreduceRequest(name.c_str(), second, second, {4}, HVDC_SUM));
    EXPECT_TRUE(dup.enqueue_failed()) << "a duplicate in-flight name must fail in hvdc_enqueue";
    Result r;
    if (dup.enqueue_failed() && dup.WaitFor(std::chrono::milliseconds(0), &r)) {
      EXPECT_TRUE(IsError(r, HVDC_INVALID_ARGUMENT, {name}));
    }
  }
  ExpectRuntimeWorks("between");
  if (rank != 0) pending = Enqueue(AllreduceRequest(name.c_str(), first, first, {4}, HVDC_SUM));
  EXPECT_TRUE(IsOk(pending.Wait()));
  EXPECT_TRUE(BufferMatches(
      first, [&](int64_t i) { return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, WorldRanks(), i); },
      name));
  ExpectRuntimeWorks("after");
}

TEST(Invalid, DuplicateNameWithinGroup) {
  Buffer a(HVDC_FLOAT32, 4), b(HVDC_FLOAT32, 4);
  const std::string name = TestName();
  const std::vector<hvdc_request> group = {AllreduceRequest(name.c_str(), a, a, {4}, HVDC_SUM),
                                           AllreduceRequest(name.c_str(), b, b, {4}, HVDC_SUM)};
  EXPECT_TRUE(IsError(RunGroup(group), HVDC_INVALID_ARGUMENT, {name}));
  ExpectRuntimeWorks("after");
}

TEST(Invalid, UnknownProcessSet) {
  Buffer buf(HVDC_FLOAT32, 4);
  const std::string name = TestName();
  EXPECT_TRUE(IsError(RunSync(AllreduceRequest(name.c_str(), buf, buf, {4}, HVDC_SUM, 12345)),
                      HVDC_INVALID_ARGUMENT, {name}));
  EXPECT_TRUE(IsError(RunSync(AllreduceRequest(name.c_str(), buf, buf, {4}, HVDC_SUM, -1)),
                      HVDC_INVALID_ARGUMENT, {name}));
  ExpectRuntimeWorks("after");
}

Result Alltoall(const std::string& name, Buffer& buf, const std::vector<int64_t>& dims,
                const std::vector<int32_t>* splits) {
  Output out(buf.dtype());
  std::vector<int32_t> received(hvdc_size() + 4, 0);
  hvdc_request req = NewRequest(HVDC_OP_ALLTOALL, name.c_str());
  req.input = TensorOf(buf, dims);
  if (splits) {
    req.splits = splits->data();
    req.num_splits = static_cast<int32_t>(splits->size());
  }
  req.received_splits = received.data();
  out.AttachTo(&req);
  return RunSync(req);
}

TEST(Invalid, AlltoallSplits) {
  const int size = hvdc_size();
  Buffer buf(HVDC_FLOAT32, 2 * size * 3, [](int64_t i) { return static_cast<double>(i); });
  const std::vector<int64_t> dims = {2 * size, 3};

  const std::vector<int32_t> too_long(size + 1, 1);
  const std::string n1 = TestName("too_long");
  EXPECT_TRUE(IsError(Alltoall(n1, buf, dims, &too_long), HVDC_INVALID_ARGUMENT, {n1}));

  const std::vector<int32_t> too_short(size - 1, 1);
  const std::string n2 = TestName("too_short");
  EXPECT_TRUE(IsError(Alltoall(n2, buf, dims, &too_short), HVDC_INVALID_ARGUMENT, {n2}));

  std::vector<int32_t> too_many_rows(size, 2);
  too_many_rows[0] = 3;  // sums to 2 * size + 1 > dim 0
  const std::string n3 = TestName("sum_above_dim0");
  EXPECT_TRUE(IsError(Alltoall(n3, buf, dims, &too_many_rows), HVDC_INVALID_ARGUMENT, {n3}));

  std::vector<int32_t> negative(size, 2);
  negative[size - 1] = -1;
  const std::string n4 = TestName("negative");
  EXPECT_TRUE(IsError(Alltoall(n4, buf, dims, &negative), HVDC_INVALID_ARGUMENT, {n4}));

  Buffer odd(HVDC_FLOAT32, (size + 1) * 3);
  const std::string n5 = TestName("null_splits_indivisible");
  EXPECT_TRUE(IsError(Alltoall(n5, odd, {size + 1, 3}, nullptr), HVDC_INVALID_ARGUMENT, {n5}));

  ExpectRuntimeWorks("after");
}

// Set {0}: the other ranks are not members. Then the set is removed and its id is unknown.
TEST(Invalid, NotAMemberOfTheProcessSet) {
  const int rank = hvdc_rank();
  const int32_t only_zero[] = {0};
  const int id = hvdc_add_process_set(only_zero, 1);
  ASSERT_GT(id, 0) << hvdc_last_error();
  EXPECT_EQ(hvdc_process_set_included(id), rank == 0 ? 1 : 0);
  Buffer buf(HVDC_FLOAT32, 4,
             [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i); });
  const std::string name = TestName();
  const Result r = RunSync(AllreduceRequest(name.c_str(), buf, buf, {4}, HVDC_SUM, id));
  if (rank == 0) {
    EXPECT_TRUE(IsOk(r));
    EXPECT_TRUE(BufferMatches(
        buf, [&](int64_t i) { return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, {0}, i); }));
    // A root outside the set.
    const std::string bname = TestName("foreign_root");
    hvdc_request req = NewRequest(HVDC_OP_BROADCAST, bname.c_str(), id);
    req.input = TensorOf(buf, {4});
    req.output = req.input;
    req.root_rank = 1;
    const Result rb = RunSync(req);
    EXPECT_TRUE(rb.code == HVDC_INVALID_ARGUMENT || rb.code == HVDC_PRECONDITION_ERROR) << rb;
    EXPECT_TRUE(Contains(rb.message, bname)) << rb;
  } else {
    EXPECT_TRUE(IsError(r, HVDC_INVALID_ARGUMENT, {name}));
  }
  EXPECT_EQ(hvdc_remove_process_set(id), 0) << hvdc_last_error();
  const std::string removed = TestName("removed");
  EXPECT_TRUE(IsError(RunSync(AllreduceRequest(removed.c_str(), buf, buf, {4}, HVDC_SUM, id)),
                      HVDC_INVALID_ARGUMENT, {removed}));
  ExpectRuntimeWorks("after");
}

TEST(Invalid, ProcessSetManagement) {
  const int size = hvdc_size();
  std::vector<int32_t> all(size);
  for (int r = 0; r < size; ++r) all[r] = r;
  EXPECT_EQ(hvdc_add_process_set(all.data(), size), HVDC_PROCESS_SET_ERROR_EXISTING_SET)
      << "the global set again";
  const int32_t dup[] = {0, 0};
  EXPECT_LT(hvdc_add_process_set(dup, 2), 0) << "a rank listed twice";
  const int32_t out_of_range[] = {0, size};
  EXPECT_LT(hvdc_add_process_set(out_of_range, 2), 0) << "a rank beyond the world";
  EXPECT_LT(hvdc_add_process_set(nullptr, 0), 0) << "an empty set";
  EXPECT_LT(hvdc_remove_process_set(0), 0) << "the global set";
  EXPECT_EQ(hvdc_remove_process_set(777), HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);
  EXPECT_EQ(hvdc_number_of_process_sets(), 1);
  ExpectRuntimeWorks("after");
}

// Requests that are wrong on their own, the same on every rank.
TEST(Invalid, MalformedRequests) {
  const int size = hvdc_size();
  Buffer buf(HVDC_FLOAT32, 6);
  Buffer other(HVDC_FLOAT32, 5);
  const std::string name = TestName();
  struct Case {
    const char* what;
    std::function<void(hvdc_request*)> spoil;
  };
  const std::vector<Case> cases = {
      {"bad dtype", [](hvdc_request* r) { r->input.dtype = r->output.dtype = 99; }},
      {"bad op", [](hvdc_request* r) { r->op = 99; }},
      {"bad reduce op", [](hvdc_request* r) { r->reduce_op = 99; }},
      {"ndim above the maximum", [](hvdc_request* r) { r->input.ndim = r->output.ndim = 33; }},
      {"negative ndim", [](hvdc_request* r) { r->input.ndim = r->output.ndim = -1; }},
      {"negative dim",
       [](hvdc_request* r) {
         r->input.dims[0] = r->output.dims[0] = -6;
         r->input.dims[1] = r->output.dims[1] = -1;
       }},
      {"output shape differs", [&](hvdc_request* r) { r->output = TensorOf(other, {5}); }},
      {"output dtype differs", [](hvdc_request* r) { r->output.dtype = HVDC_INT32; }},
      {"NULL input data", [](hvdc_request* r) { r->input.data = nullptr; }},
      {"NULL output data", [](hvdc_request* r) { r->output.data = nullptr; }},
      {"broadcast root beyond the world",
       [&](hvdc_request* r) {
         r->op = HVDC_OP_BROADCAST;
         r->root_rank = size;
       }},
      {"broadcast negative root",
       [](hvdc_request* r) {
         r->op = HVDC_OP_BROADCAST;
         r->root_rank = -1;
       }},
      {"allgather without allocator", [](hvdc_request* r) { r->op = HVDC_OP_ALLGATHER; }},
  };
  for (const Case& c : cases) {
    hvdc_request req = AllreduceRequest(name.c_str(), buf, buf, {2, 3}, HVDC_SUM);
    c.spoil(&req);
    const Result r = RunSync(req);
    // A bad root may also be found by the coordinator (a precondition error).
    const bool root_case = req.op == HVDC_OP_BROADCAST;
    EXPECT_TRUE(r.code == HVDC_INVALID_ARGUMENT || (root_case && r.code == HVDC_PRECONDITION_ERROR))
        << c.what << ": " << r;
  }
  // A NULL name, a NULL request array, an empty group.
  hvdc_request unnamed = AllreduceRequest(nullptr, buf, buf, {6}, HVDC_SUM);
  EXPECT_TRUE(IsError(RunSync(unnamed), HVDC_INVALID_ARGUMENT)) << "NULL name";
  EXPECT_TRUE(IsError(Enqueue(nullptr, 1).Wait(), HVDC_INVALID_ARGUMENT)) << "NULL requests";
  hvdc_request one = AllreduceRequest(name.c_str(), buf, buf, {6}, HVDC_SUM);
  EXPECT_TRUE(IsError(Enqueue(&one, 0).Wait(), HVDC_INVALID_ARGUMENT)) << "count 0";
  EXPECT_TRUE(IsError(Enqueue(&one, -1).Wait(), HVDC_INVALID_ARGUMENT)) << "count -1";
  ExpectRuntimeWorks("after");
}

// The allocator returns NULL on every rank: the op fails, the runtime goes on.
TEST(Invalid, AllocationFailure) {
  const int rank = hvdc_rank();
  Buffer buf(HVDC_FLOAT32, 6, [&](int64_t i) { return MoveValue(HVDC_FLOAT32, rank, i); });
  Output out(HVDC_FLOAT32);
  out.FailAllocation();
  const std::string name = TestName();
  hvdc_request req = NewRequest(HVDC_OP_ALLGATHER, name.c_str());
  req.input = TensorOf(buf, {3, 2});
  out.AttachTo(&req);
  const Result r = RunSync(req);
  EXPECT_NE(r.code, HVDC_OK) << r;
  EXPECT_TRUE(Contains(r.message, name)) << r;
  ExpectRuntimeWorks("after");
}

// ---------------------------------------------------------------------------------------------
// Shutdown: the last suite. A tensor only rank 0 submitted is still pending when every rank shuts
// down; its callback must have run (with an error) by the time hvdc_shutdown() returns.

TEST(ZzShutdown, PendingCallbackFailsAndRuntimeIsDown) {
  const int rank = hvdc_rank();
  ExpectRuntimeWorks("before");
  Buffer buf(HVDC_FLOAT32, 4);
  const std::string name = TestName("orphan");
  Pending orphan;
  if (rank == 0) {
    orphan = Enqueue(AllreduceRequest(name.c_str(), buf, buf, {4}, HVDC_SUM));
    EXPECT_FALSE(orphan.enqueue_failed());
  }
  EXPECT_EQ(hvdc_shutdown(), HVDC_OK) << hvdc_last_error();
  if (rank == 0 && !orphan.enqueue_failed()) {
    Result r;
    EXPECT_TRUE(orphan.WaitFor(std::chrono::milliseconds(0), &r))
        << "the pending callback must have run when hvdc_shutdown() returns";
    if (!orphan.WaitFor(std::chrono::seconds(30), &r)) {
      ADD_FAILURE() << "no callback for the pending tensor even 30 s after shutdown";
    } else {
      EXPECT_EQ(r.code, HVDC_UNKNOWN_ERROR) << r;
    }
  }
  EXPECT_EQ(hvdc_is_initialized(), 0);
  EXPECT_EQ(hvdc_rank(), -1);
  EXPECT_EQ(hvdc_size(), -1);
  EXPECT_EQ(hvdc_local_rank(), -1);
  EXPECT_EQ(hvdc_local_size(), -1);
  EXPECT_EQ(hvdc_cross_rank(), -1);
  EXPECT_EQ(hvdc_cross_size(), -1);
  const std::string later = TestName("later");
  Pending p = Enqueue(AllreduceRequest(later.c_str(), buf, buf, {4}, HVDC_SUM));
  EXPECT_TRUE(p.enqueue_failed()) << "hvdc_enqueue after shutdown must fail";
  Result r;
  if (p.WaitFor(std::chrono::seconds(30), &r)) {
    EXPECT_NE(r.code, HVDC_OK) << r;
  }

  const LedgerReport report = CheckLedger();
  for (const std::string& problem : report.problems) ADD_FAILURE() << problem;
  EXPECT_GT(report.enqueued, 0);
  EXPECT_GT(report.rejected, 0);
}

}  // namespace
}  // namespace hvdc_test

int main(int argc, char** argv) {
  setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1", 1);
  return hvdc_test::RunCApiTestMain(argc, argv);
}
