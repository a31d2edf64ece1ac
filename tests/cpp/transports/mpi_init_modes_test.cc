// init() with a borrowed communicator and with a subset of the world's ranks, when the application
// has initialised MPI itself (as an mpi4py program would). Runs under mpirun -np 2 and -np 3.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "core/c_api.h"

namespace {

int WorldRank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int WorldSize() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

struct Done {
  std::promise<std::pair<int, std::string>> promise;
  static void Fn(void* user, int code, const char* msg) {
    static_cast<Done*>(user)->promise.set_value({code, msg ? msg : ""});
  }
};

// Sum-allreduces one int32 and returns the result (or -1 on error).
int32_t SumInt(const char* name, int32_t value) {
  hvdc_request r;
  std::memset(&r, 0, sizeof(r));
  r.op = HVDC_OP_ALLREDUCE;
  r.name = name;
  r.reduce_op = HVDC_SUM;
  r.input.dtype = HVDC_INT32;
  r.input.ndim = 1;
  r.input.dims[0] = 1;
  r.input.device = -1;
  r.input.data = &value;
  r.output = r.input;
  Done done;
  auto f = done.promise.get_future();
  if (hvdc_enqueue(&r, 1, &Done::Fn, &done) != HVDC_OK) return -1;
  if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) return -1;
  return f.get().first == HVDC_OK ? value : -1;
}

TEST(InitModes, BorrowedCommunicatorDefinesRanks) {
  // Reverse the ranks: the runtime must number ranks as the borrowed communicator does.
  MPI_Comm reversed;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, 0, WorldSize() - 1 - WorldRank(), &reversed),
            MPI_SUCCESS);
  hvdc_init_options opts;
  std::memset(&opts, 0, sizeof(opts));
  opts.mpi_comm = &reversed;
  ASSERT_EQ(hvdc_init(&opts), HVDC_OK) << hvdc_last_error();
  EXPECT_EQ(hvdc_size(), WorldSize());
  EXPECT_EQ(hvdc_rank(), WorldSize() - 1 - WorldRank());
  EXPECT_EQ(hvdc_mpi_enabled(), 1);
  const int n = WorldSize();
  EXPECT_EQ(SumInt("borrowed", hvdc_rank() + 1), n * (n + 1) / 2);
  ASSERT_EQ(hvdc_shutdown(), HVDC_OK);
  EXPECT_EQ(hvdc_is_initialized(), 0);
  MPI_Comm_free(&reversed);
}

TEST(InitModes, InitAgainAfterShutdown) {
  ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  EXPECT_EQ(hvdc_rank(), WorldRank());
  const int n = WorldSize();
  EXPECT_EQ(SumInt("again", 1), n);
  ASSERT_EQ(hvdc_shutdown(), HVDC_OK);
}

TEST(InitModes, RankSubset) {
  const int32_t subset[2] = {0, 1};
  hvdc_init_options opts;
  std::memset(&opts, 0, sizeof(opts));
  opts.ranks = subset;
  opts.num_ranks = 2;
  const int rc = hvdc_init(&opts);
  if (WorldRank() >= 2) {
    EXPECT_NE(rc, HVDC_OK) << "a rank outside the subset must be refused";
    EXPECT_STRNE(hvdc_last_error(), "");
    EXPECT_EQ(hvdc_is_initialized(), 0);
  } else {
    ASSERT_EQ(rc, HVDC_OK) << hvdc_last_error();
    EXPECT_EQ(hvdc_size(), 2);
    EXPECT_EQ(hvdc_rank(), WorldRank());
    EXPECT_EQ(SumInt("subset", 10 + hvdc_rank()), 21);
    ASSERT_EQ(hvdc_shutdown(), HVDC_OK);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
