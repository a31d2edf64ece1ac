// Stall detection under mpirun, through the C API only. main() exports
// HOROVOD_STALL_CHECK_TIME_SECONDS=1 and HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3. The last rank never
// submits "stalled"; the other ranks' callbacks must fail (well within 20 s) with a message naming
// the tensor and the missing rank, and afterwards the runtime is down on every rank, the idle last
// rank included (hvdc_is_initialized() may still say 1 until the user calls hvdc_shutdown()).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/c_api.h"
#include "tests/cpp/util/c_api_harness.h"

namespace hvdc_test {
namespace {

// Redirects file descriptor 2 into a temporary file until Stop(), which returns what was written.
class StderrCapture {
 public:
  StderrCapture() {
    char path[] = "/tmp/hvdc_stall_stderr_XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return;
    path_ = path;
    std::fflush(stderr);
    saved_ = dup(2);
    dup2(fd, 2);
    close(fd);
  }
  ~StderrCapture() { Stop(); }

  std::string Stop() {
    if (saved_ < 0) return text_;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    text_ = ss.str();
    std::remove(path_.c_str());
    return text_;
  }

 private:
  std::string path_;
  int saved_ = -1;
  std::string text_;
};

TEST(Stall, MissingRankFailsPendingCallbacksAndShutsDown) {
  const int rank = hvdc_rank();
  const int size = hvdc_size();
  const int last = size - 1;
  ASSERT_GE(size, 2);

  // The runtime works before the stall.
  {
    Buffer buf(HVDC_FLOAT32, 5,
               [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i); });
    const std::string name = TestName("before");
    ASSERT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), buf, buf, {5}, HVDC_SUM))));
    EXPECT_TRUE(BufferMatches(
        buf, [&](int64_t i) { return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, WorldRanks(), i); }));
  }

  // The last rank never submits "stalled" and has nothing else pending: it only waits long enough
  // for the stall shutdown (3 s) to have happened, then checks below that its runtime is down too.
  const std::string stalled = TestName("stalled");
  if (rank == last) {
    std::this_thread::sleep_for(std::chrono::seconds(8));
  } else {
    Buffer buf(HVDC_FLOAT32, 8);
    StderrCapture capture;
    const auto start = std::chrono::steady_clock::now();
    Pending pending = Enqueue(AllreduceRequest(stalled.c_str(), buf, buf, {8}, HVDC_SUM));
    Result r;
    const bool got = pending.WaitFor(std::chrono::seconds(60), &r);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string log = capture.Stop();
    if (!log.empty()) std::fprintf(stderr, "[rank %d] captured stderr:\n%s", rank, log.c_str());

    ASSERT_FALSE(pending.enqueue_failed()) << r;
    ASSERT_TRUE(got) << "no callback 60 s after the stall began";
    EXPECT_NE(r.code, HVDC_OK) << r;
    EXPECT_LT(elapsed, 20.0) << "stall shutdown is set to 3 s";
    EXPECT_TRUE(Contains(r.message, stalled)) << r;
    EXPECT_TRUE(Contains(r.message, std::to_string(last))) << "the missing rank: " << r;
    if (rank == 0) {
      // The coordinator's warning names the waiting tensor and the missing rank.
      EXPECT_TRUE(Contains(log, stalled)) << "the stall warning on rank 0's stderr";
    }
  }

  // The runtime has shut down: a new request fails (at enqueue, or through its callback).
  const std::string later = TestName("later");
  Buffer buf2(HVDC_FLOAT32, 4);
  Pending after = Enqueue(AllreduceRequest(later.c_str(), buf2, buf2, {4}, HVDC_SUM));
  Result ra;
  ASSERT_TRUE(after.WaitFor(std::chrono::seconds(30), &ra)) << "a request after the stall shutdown";
  EXPECT_NE(ra.code, HVDC_OK) << ra;
}

}  // namespace
}  // namespace hvdc_test

int main(int argc, char** argv) {
  setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "1", 1);
  setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "3", 1);
  return hvdc_test::RunCApiTestMain(argc, argv);
}
