// A dead peer ends a TCP job (issue 12): three ranks as real processes of this binary over
// HVDC_TCP_PEERS run checked allreduces; then rank 2 goes idle (it never calls horovod_compat
// again) while ranks 0 and 1 keep submitting, and the test SIGKILLs rank 1. The survivors must fail
// their pending operation with an error naming rank 1 and its host (once per request), and exit
// non-zero on their own (HOROVOD_PEER_LOSS_EXIT_SECONDS) -- rank 0 blocked in a collective, rank 2
// idle. The same with rank 1 stopped (SIGSTOP) instead: the heartbeats catch it, and rank 1,
// continued (SIGCONT) once the others are gone, fails and exits too. The only time bound is the
// test's own: every wait gives up after kLimit.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/checked_step.h"
#include "tests/cpp/util/tcp_test_util.h"

namespace {

constexpr int kSize = 3;
constexpr int kKilled = 1;
constexpr int kIdle = 2;
constexpr int kWarmSteps = 10;
constexpr auto kLimit = std::chrono::seconds(60);  // the test's own bound on every wait
constexpr const char* kRoleVar = "HVDC_PEER_LOSS_TEST_WORKER";

// ---------------------------------------------------------------------------------------------
// Worker: one rank. Prints "READY" after the warm-up steps, "FAILED <message>" when an operation
// fails, "DOUBLE" if a callback ran twice; never exits on its own after READY (only the runtime
// may end it).

// One allreduce of step-dependent values, checked (checked_step.h).
int Step(int rank, int step, std::string* message) {
  return hvdc::checked_step::Step("step.", 1000, 7, rank, kSize, step, message);
}

int Worker() {
  if (hvdc_init(nullptr) != HVDC_OK) {
    std::printf("INIT FAILED %s\n", hvdc_last_error());
    return 3;
  }
  const int rank = hvdc_rank();
  int step = 0;
  for (; step < kWarmSteps; ++step) {
    std::string message;
    if (Step(rank, step, &message) != HVDC_OK) {
      std::printf("WARMUP FAILED %s\n", message.c_str());
      return 4;
    }
  }
  std::printf("READY\n");
  std::fflush(stdout);
  if (rank != kIdle) {
    for (;; ++step) {
      std::string message;
      const int rc = Step(rank, step, &message);
      if (rc == hvdc::checked_step::kWrongValue) {
        std::printf("VALUE %s\n", message.c_str());
      } else if (rc != HVDC_OK) {
        std::printf("FAILED code=%d %s\n", rc, message.c_str());
        std::fflush(stdout);
        // A later operation fails too.
        std::string later;
        const int later_rc = Step(rank, step + 1, &later);
        if (later_rc != HVDC_OK) std::printf("LATER FAILED code=%d %s\n", later_rc, later.c_str());
        std::fflush(stdout);
        break;
      }
    }
  }
  for (;;) pause();  // idle: only the runtime ends this process
}

// ---------------------------------------------------------------------------------------------
// Driver.

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Starts the job, sends `sig` to rank 1 once every rank warmed up, and checks the survivors.
void RunAndHit(int sig, const std::string& why) {
  const std::vector<std::string> peers = hvdc::tcp_test::FreeLoopbackPeers(kSize);
  std::string list;
  for (const auto& p : peers) list += (list.empty() ? "" : ",") + p;
  char dir_template[] = "/tmp/hvdc_peer_loss_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  std::vector<pid_t> pids(kSize, -1);
  std::vector<std::string> logs(kSize);
  for (int r = 0; r < kSize; ++r) {
    logs[r] = dir + "/rank" + std::to_string(r) + ".log";
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int fd = open(logs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv(kRoleVar, "1", 1);
      setenv("HVDC_TCP_PEERS", list.c_str(), 1);
      setenv("HOROVOD_RANK", std::to_string(r).c_str(), 1);
      setenv("HOROVOD_SIZE", std::to_string(kSize).c_str(), 1);
      unsetenv("HOROVOD_PEER_LOSS_EXIT_SECONDS");  // the defaults apply
      unsetenv("HOROVOD_PEER_TIMEOUT_SECONDS");
      execl("/proc/self/exe", "tcp_peer_loss_test", static_cast<char*>(nullptr));
      _exit(127);
    }
    pids[r] = pid;
  }
  auto kill_all = [&] {
    for (pid_t& pid : pids) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        pid = -1;
      }
    }
  };
  auto dump = [&] {
    std::string all;
    for (int r = 0; r < kSize; ++r)
      all += "--- rank " + std::to_string(r) + ":\n" + ReadFile(logs[r]);
    return all;
  };

  // Every rank warmed up.
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  bool ready = false;
  while (!ready && std::chrono::steady_clock::now() < deadline) {
    ready = true;
    for (int r = 0; r < kSize; ++r) ready &= ReadFile(logs[r]).find("READY") != std::string::npos;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!ready) {
    kill_all();
    FAIL() << "the ranks did not all warm up within the test's bound:\n" << dump();
  }

  kill(pids[kKilled], sig);
  if (sig == SIGKILL) {
    waitpid(pids[kKilled], nullptr, 0);
    pids[kKilled] = -1;
  }

  // The survivors end on their own, before the test's bound.
  std::vector<int> status(kSize, -1);
  for (int r = 0; r < kSize; ++r) {
    if (r == kKilled) continue;
    while (std::chrono::steady_clock::now() < deadline + kLimit) {
      if (waitpid(pids[r], &status[r], WNOHANG) == pids[r]) {
        pids[r] = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  const bool ended = pids[0] < 0 && pids[kIdle] < 0;
  // A stopped rank 1, continued once the others are gone, must not carry on: it fails and exits.
  int resumed_status = -1;
  bool resumed_ended = false;
  if (sig == SIGSTOP && ended) {
    kill(pids[kKilled], SIGCONT);
    const auto resumed_deadline = std::chrono::steady_clock::now() + kLimit;
    while (!resumed_ended && std::chrono::steady_clock::now() < resumed_deadline) {
      resumed_ended = waitpid(pids[kKilled], &resumed_status, WNOHANG) == pids[kKilled];
      if (resumed_ended) pids[kKilled] = -1;
      if (!resumed_ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  const std::string all = dump();
  std::printf("%s", all.c_str());  // what each rank reported, for the ctest log
  kill_all();                      // a stopped rank 1 too (SIGKILL ends a stopped process)
  ASSERT_TRUE(ended) << "a survivor did not exit after rank 1 was killed:\n" << all;
  if (sig == SIGSTOP) {
    ASSERT_TRUE(resumed_ended) << "rank 1, continued after the others exited, went on:\n" << all;
    EXPECT_TRUE(WIFEXITED(resumed_status) && WEXITSTATUS(resumed_status) != 0)
        << "rank 1 after SIGCONT: status " << resumed_status << "\n"
        << all;
    EXPECT_NE(ReadFile(logs[kKilled]).find("FAILED code=" + std::to_string(HVDC_PEER_LOST)),
              std::string::npos)
        << all;
  }

  const std::string named = "rank 1 (" + peers[kKilled] + ")";
  for (int r = 0; r < kSize; ++r) {
    if (r == kKilled) continue;
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) != 0)
        << "rank " << r << " status " << status[r] << "\n"
        << all;
    const std::string log = ReadFile(logs[r]);
    EXPECT_NE(log.find(named), std::string::npos)
        << "rank " << r << " never names " << named << ":\n"
        << all;
    EXPECT_NE(log.find(why), std::string::npos) << "rank " << r << " never says " << why << "\n"
                                                << all;
    EXPECT_EQ(log.find("DOUBLE"), std::string::npos) << all;
    EXPECT_EQ(log.find("VALUE"), std::string::npos) << all;
  }
  // Rank 0 was in a collective: it failed with the dead rank's name, and so did the next one.
  const std::string log0 = ReadFile(logs[0]);
  // Both with the lost-peer code (Python raises HorovodInternalError for it).
  const std::string code = "code=" + std::to_string(HVDC_PEER_LOST) + " ";
  const size_t failed = log0.find("FAILED " + code);
  ASSERT_NE(failed, std::string::npos) << all;
  EXPECT_NE(log0.find(named, failed), std::string::npos) << all;
  EXPECT_NE(log0.find("LATER FAILED " + code), std::string::npos) << all;
  for (int r = 0; r < kSize; ++r) std::remove(logs[r].c_str());
  rmdir(dir.c_str());
}

TEST(TcpPeerLoss, KilledRankEndsTheSurvivors) {
  RunAndHit(SIGKILL, "closed the connection without shutting down");
}

// A stopped rank (SIGSTOP) keeps its connections open: the heartbeats (default
// HOROVOD_PEER_TIMEOUT_SECONDS) catch it.
TEST(TcpPeerLoss, StoppedRankEndsTheSurvivors) { RunAndHit(SIGSTOP, "sent nothing for"); }

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv(kRoleVar)) return Worker();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
