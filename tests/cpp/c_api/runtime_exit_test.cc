// Leaving the process without shutdown() (exit() or a return from main), in the states a runtime
// can be in then: two ranks as processes of this binary over the TCP transport (HVDC_TCP_PEERS),
// the exit hook of core/c_api.cc doing the shutdown. Each rank prints "CALLBACK <code>" every time
// a callback of its runs (so a second run shows as a second line); the driver checks the lines
// and the exit status, with a bound on every wait. The exit timer is off
// (HOROVOD_PEER_LOSS_EXIT_SECONDS=0): these exits are the program's own, and must be status 0.
//   idle       both ranks return from main while Running and idle.
//   pending    both have an operation pending (only they submitted it); rank 0 calls exit(0): its
//              hook's shutdown fails its own operation and reaches rank 1, whose operation fails
//              too; rank 1, now Drained, returns from main.
//   abandoned  rank 1 dies (_exit, no goodbye) with rank 0's operation pending: the loss fails it
//              (Abandoned) and rank 0 returns from main.
//   draining   rank 1 is stopped (SIGSTOP); rank 0 calls exit(0) with an operation pending: its
//              shutdown cannot complete (Draining) until the heartbeat declares rank 1 lost.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/checked_step.h"
#include "tests/cpp/util/tcp_test_util.h"

namespace {

constexpr int kSize = 2;
constexpr const char* kScenarioVar = "HVDC_EXIT_TEST_SCENARIO";
constexpr auto kLimit = std::chrono::seconds(60);  // the bound on every wait

// ---------------------------------------------------------------------------------------------
// Worker (one rank).

std::atomic<bool> g_go{false};  // SIGUSR1: the driver says "exit now"

void OnDone(void*, int code, const char*) {
  std::printf("CALLBACK %d\n", code);
  std::fflush(stdout);
}

struct Scalar {
  double in = 1, out = 0;
};

void Silent(void*, int, const char*) {}

// Enqueues an allreduce of one float64 (whose callback prints when `loud`); the buffers are
// leaked on purpose (the callback may come during exit).
int EnqueueOne(const char* name, bool loud) {
  auto* s = new Scalar();
  hvdc_request r;
  std::memset(&r, 0, sizeof r);
  r.op = HVDC_OP_ALLREDUCE;
  r.name = name;
  r.reduce_op = HVDC_SUM;
  r.input.dtype = HVDC_FLOAT64;
  r.input.ndim = 1;
  r.input.dims[0] = 1;
  r.input.device = -1;
  r.input.data = &s->in;
  r.output = r.input;
  r.output.data = &s->out;
  return hvdc_enqueue(&r, 1, loud ? &OnDone : &Silent, nullptr);
}

// Enqueues probe i (silent; names are distinct, so none is refused as a duplicate); true when the
// runtime refused it -- it is no longer Running.
bool Refused(int i) {
  const int rc = EnqueueOne(("probe." + std::to_string(i)).c_str(), false);
  if (rc == HVDC_OK) return false;
  std::printf("REFUSED %d %s\n", rc, hvdc_last_error());
  std::fflush(stdout);
  return true;
}

int Worker(const std::string& scenario) {
  signal(SIGUSR1, [](int) { g_go.store(true); });
  if (hvdc_init(nullptr) != HVDC_OK) {
    std::printf("INIT FAILED %s\n", hvdc_last_error());
    return 3;
  }
  const int rank = hvdc_rank();
  // A tensor only this rank submits, before a step both take: once the step is done, both ranks'
  // operations are pending on both sides.
  if (scenario != "idle") {
    if (EnqueueOne(rank == 0 ? "only rank 0" : "only rank 1", true) != HVDC_OK) {
      std::printf("ENQUEUE FAILED %s\n", hvdc_last_error());
      return 4;
    }
  }
  std::string message;
  if (hvdc::checked_step::Step("step.", 100, 5, rank, kSize, 0, &message) != HVDC_OK) {
    std::printf("STEP FAILED %s\n", message.c_str());
    return 5;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  if (scenario == "idle") return 0;  // Running and idle
  if (scenario == "pending") {
    if (rank == 0) std::exit(0);  // Running, an operation pending
    // Rank 1 waits for rank 0's shutdown to reach it (a probe is refused), then leaves Drained.
    for (int i = 0; i < 6000; ++i) {
      if (Refused(i)) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 6;
  }
  if (scenario == "abandoned") {
    if (rank == 1) _exit(7);  // dies: no exit hook, no goodbye
    // Rank 0 returns once its operation has failed.
    for (int i = 0; i < 6000; ++i) {
      if (Refused(i)) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 8;
  }
  if (scenario == "draining") {
    // Rank 1 is stopped by the driver; rank 0 exits when told.
    for (int i = 0; i < 6000 && !g_go.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (rank == 0) std::exit(0);
    for (;;) pause();
  }
  return 9;
}

// ---------------------------------------------------------------------------------------------
// Driver.

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class Job {
 public:
  explicit Job(const std::string& scenario) {
    const std::vector<std::string> peers = hvdc::tcp_test::FreeLoopbackPeers(kSize);
    std::string list;
    for (const auto& p : peers) list += (list.empty() ? "" : ",") + p;
    for (int r = 0; r < kSize; ++r) {
      char path[] = "/tmp/hvdc_exit_test_XXXXXX";
      const int fd = mkstemp(path);
      logs_.push_back(path);
      const pid_t pid = fork();
      if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        setenv(kScenarioVar, scenario.c_str(), 1);
        setenv("HVDC_TCP_PEERS", list.c_str(), 1);
        setenv("HOROVOD_RANK", std::to_string(r).c_str(), 1);
        setenv("HOROVOD_SIZE", std::to_string(kSize).c_str(), 1);
        setenv("HOROVOD_PEER_LOSS_EXIT_SECONDS", "0", 1);
        setenv("HOROVOD_PEER_TIMEOUT_SECONDS", "2", 1);
        execl("/proc/self/exe", "runtime_exit_test", static_cast<char*>(nullptr));
        _exit(127);
      }
      close(fd);
      pids_.push_back(pid);
      status_.push_back(-1);
    }
  }
  ~Job() {
    for (int r = 0; r < kSize; ++r) {
      if (pids_[r] > 0) {
        kill(pids_[r], SIGKILL);
        waitpid(pids_[r], nullptr, 0);
      }
      std::remove(logs_[r].c_str());
    }
  }

  bool WaitReady() {
    const auto deadline = std::chrono::steady_clock::now() + kLimit;
    for (int r = 0; r < kSize; ++r) {
      while (Log(r).find("READY") == std::string::npos) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return true;
  }
  // Waits (bounded) for rank r to end; false if it did not.
  bool WaitEnded(int r) {
    const auto deadline = std::chrono::steady_clock::now() + kLimit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pids_[r], &status_[r], WNOHANG) == pids_[r]) {
        pids_[r] = -1;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  bool ExitedWith(int r, int code) const {
    return WIFEXITED(status_[r]) && WEXITSTATUS(status_[r]) == code;
  }
  void Signal(int r, int sig) { kill(pids_[r], sig); }
  std::string Log(int r) const { return ReadFile(logs_[r]); }
  std::string All() const {
    std::string all;
    for (int r = 0; r < kSize; ++r) all += "--- rank " + std::to_string(r) + ":\n" + Log(r);
    return all;
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<int> status_;
  std::vector<std::string> logs_;
};

TEST(ProcessExit, ReturnFromMainWhileIdle) {
  Job job("idle");
  ASSERT_TRUE(job.WaitReady()) << job.All();
  for (int r = 0; r < kSize; ++r) {
    ASSERT_TRUE(job.WaitEnded(r)) << "rank " << r << " did not exit\n" << job.All();
    EXPECT_TRUE(job.ExitedWith(r, 0)) << "rank " << r << "\n" << job.All();
  }
  EXPECT_EQ(Count(job.All(), "CALLBACK"), 0) << job.All();
}

TEST(ProcessExit, ExitWithOperationsPendingAndReturnWhileDrained) {
  Job job("pending");
  ASSERT_TRUE(job.WaitReady()) << job.All();
  for (int r = 0; r < kSize; ++r) {
    ASSERT_TRUE(job.WaitEnded(r)) << "rank " << r << " did not exit\n" << job.All();
    EXPECT_TRUE(job.ExitedWith(r, 0)) << "rank " << r << "\n" << job.All();
    // Its own pending operation failed once, with the shut-down error.
    EXPECT_EQ(Count(job.Log(r), "CALLBACK"), 1) << job.All();
    EXPECT_EQ(Count(job.Log(r), "CALLBACK " + std::to_string(HVDC_UNKNOWN_ERROR) + "\n"), 1)
        << job.All();
  }
}

TEST(ProcessExit, ReturnWhileAbandonedAfterAPeerDied) {
  Job job("abandoned");
  ASSERT_TRUE(job.WaitReady()) << job.All();
  ASSERT_TRUE(job.WaitEnded(1)) << job.All();
  EXPECT_TRUE(job.ExitedWith(1, 7)) << job.All();
  ASSERT_TRUE(job.WaitEnded(0)) << "rank 0 did not exit\n" << job.All();
  EXPECT_TRUE(job.ExitedWith(0, 0)) << job.All();
  EXPECT_EQ(Count(job.Log(0), "CALLBACK"), 1) << job.All();
  EXPECT_EQ(Count(job.Log(0), "CALLBACK " + std::to_string(HVDC_PEER_LOST) + "\n"), 1) << job.All();
}

TEST(ProcessExit, ExitWhileDrainingWithAStoppedPeer) {
  Job job("draining");
  ASSERT_TRUE(job.WaitReady()) << job.All();
  job.Signal(1, SIGSTOP);
  job.Signal(0, SIGUSR1);
  ASSERT_TRUE(job.WaitEnded(0)) << "rank 0 did not exit\n" << job.All();
  EXPECT_TRUE(job.ExitedWith(0, 0)) << job.All();
  // Failed once: by the loss (Abandoned), or -- when the mesh fails the drain's round first -- by
  // the set's closing with the shut-down error (Drained; the loss report then comes too late).
  EXPECT_EQ(Count(job.Log(0), "CALLBACK"), 1) << job.All();
  const int peer_lost = Count(job.Log(0), "CALLBACK " + std::to_string(HVDC_PEER_LOST) + "\n");
  const int shut_down = Count(job.Log(0), "CALLBACK " + std::to_string(HVDC_UNKNOWN_ERROR) + "\n");
  EXPECT_EQ(peer_lost + shut_down, 1) << job.All();
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* scenario = std::getenv(kScenarioVar)) return Worker(scenario);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
