// The core in an elastic job (issue 27, HOROVOD_ELASTIC=1) over the TCP transport: one long-lived
// "survivor" process goes through kRounds worlds of two ranks, re-initialising in the same process
// each time (init -> the other rank leaves -> shutdown -> init), as hvd.elastic.run does. This
// binary plays the elastic driver: an HTTP rendezvous service in-process, and a fresh "peer"
// process per round; each round has its own HVDC_TCP_RENDEZVOUS_SCOPE, and the survivor sets its
// rank (alternating 0 and 1) and the scope in its environment before every init. The rendezvous
// service is the launcher's (horovod_compat.runner.rendezvous, with a job secret), started from
// the source tree ctest names in HVDC_SOURCE_ROOT.
//
// The peer leaves in one of two ways, alternating: it SIGKILLs itself (a lost peer) or calls
// shutdown() and exits 0 (a clean exit in the middle of the job). Either way the survivor's pending
// operation and the next one fail with HVDC_PEER_LOST naming the peer's rank; the peer-loss exit
// timer stays off (HOROVOD_PEER_LOSS_EXIT_SECONDS is tiny here: an armed timer would end the
// survivor); and the survivor's open file descriptors and threads do not grow over the rounds.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

namespace {

constexpr int kRounds = 50;
constexpr int kWarmSteps = 3;
// Rounds 0..kBaselineRound-1 went through every (rank, way of leaving) pair once: whatever the
// process creates once (logging, static pools) exists by then.
constexpr int kBaselineRound = 4;
constexpr auto kLimit = std::chrono::seconds(240);  // the test's own bound on the whole job
constexpr const char* kRoleVar = "HVDC_ELASTIC_TEST_ROLE";
constexpr const char* kModeVar = "HVDC_ELASTIC_TEST_MODE";

int SurvivorRank(int round) { return round % 2; }
// The peer SIGKILLs itself in rounds 0, 1, 4, 5, ... and shuts down cleanly in the others: every
// combination of the survivor's rank and the way the peer leaves.
bool PeerKilled(int round) { return (round / 2) % 2 == 0; }
std::string Scope(int round) { return "elastic-" + std::to_string(round); }

int Step(int round, int rank, int step, std::string* message) {
  return hvdc::checked_step::Step("r" + std::to_string(round) + ".", 64, 5, rank, 2, step, message);
}

int CountEntries(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - (std::string(dir) == "/proc/self/fd" ? 1 : 0);  // the DIR's own descriptor
}

// ---------------------------------------------------------------------------------------------
// The peer of one round: warm-up steps, then leaves.
int Peer() {
  if (hvdc_init(nullptr) != HVDC_OK) {
    std::printf("PEER INIT FAILED %s\n", hvdc_last_error());
    return 3;
  }
  const int rank = hvdc_rank();
  const int round = std::atoi(std::getenv("HVDC_TCP_RENDEZVOUS_SCOPE") + 8);  // "elastic-<k>"
  for (int step = 0; step < kWarmSteps; ++step) {
    std::string message;
    if (Step(round, rank, step, &message) != HVDC_OK) {
      std::printf("PEER STEP FAILED %s\n", message.c_str());
      return 4;
    }
  }
  std::fflush(stdout);
  if (std::string(std::getenv(kModeVar)) == "kill") raise(SIGKILL);
  if (hvdc_shutdown() != HVDC_OK) {
    std::printf("PEER SHUTDOWN FAILED %s\n", hvdc_last_error());
    return 5;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The survivor: every round, init as the driver says, steps until one fails, checks the failure,
// shuts down. Prints "ROUND <k> fds=<n> threads=<n>" after each round's shutdown and "PASSED" or
// "FAILED <why>" at the end.
int Survivor() {
  int base_fds = -1, base_threads = -1;
  for (int round = 0; round < kRounds; ++round) {
    const int rank = SurvivorRank(round);
    const int peer = 1 - rank;
    setenv("HOROVOD_RANK", std::to_string(rank).c_str(), 1);
    setenv("HVDC_TCP_RENDEZVOUS_SCOPE", Scope(round).c_str(), 1);
    if (hvdc_init(nullptr) != HVDC_OK) {
      std::printf("FAILED round %d: init: %s\n", round, hvdc_last_error());
      return 1;
    }
    if (hvdc_rank() != rank || hvdc_size() != 2) {
      std::printf("FAILED round %d: rank %d of %d\n", round, hvdc_rank(), hvdc_size());
      return 1;
    }
    // Steps until one fails: the peer's last warm-up step may already fail here when it killed
    // itself (its end may overtake the step's last bytes), every later one must.
    int step = 0, code = HVDC_OK;
    std::string message;
    for (; step <= kWarmSteps && code == HVDC_OK; ++step) code = Step(round, rank, step, &message);
    if (code == HVDC_OK || (step - 1 < kWarmSteps - 1)) {
      std::printf("FAILED round %d: step %d: code %d %s\n", round, step - 1, code, message.c_str());
      return 1;
    }
    const std::string named = PeerKilled(round)
                                  ? "rank " + std::to_string(peer) + " ("
                                  : "rank " + std::to_string(peer) + " shut down (left the job)";
    if (code != HVDC_PEER_LOST || message.find(named) == std::string::npos) {
      std::printf("FAILED round %d: step %d failed with code %d, not %d naming '%s': %s\n", round,
                  step - 1, code, HVDC_PEER_LOST, named.c_str(), message.c_str());
      return 1;
    }
    std::string later;
    const int later_code = Step(round, rank, step, &later);
    if (later_code != HVDC_PEER_LOST || later.find(named) == std::string::npos) {
      std::printf("FAILED round %d: the later step failed with code %d: %s\n", round, later_code,
                  later.c_str());
      return 1;
    }
    if (hvdc_shutdown() != HVDC_OK) {
      std::printf("FAILED round %d: shutdown: %s\n", round, hvdc_last_error());
      return 1;
    }
    const int fds = CountEntries("/proc/self/fd");
    const int threads = CountEntries("/proc/self/task");
    std::printf("ROUND %d fds=%d threads=%d\n", round, fds, threads);
    std::fflush(stdout);
    if (round == kBaselineRound - 1) {
      base_fds = fds;
      base_threads = threads;
    }
  }
  const int fds = CountEntries("/proc/self/fd");
  const int threads = CountEntries("/proc/self/task");
  if (fds != base_fds || threads != base_threads) {
    std::printf("FAILED after %d rounds: %d fds and %d threads, %d and %d after round %d\n",
                kRounds, fds, threads, base_fds, base_threads, kBaselineRound - 1);
    return 1;
  }
  std::printf("PASSED\n");
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Driver.

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

pid_t Start(const std::string& log, const std::vector<std::pair<std::string, std::string>>& env) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
  execl("/proc/self/exe", "tcp_elastic_test", static_cast<char*>(nullptr));
  _exit(127);
}

// Waits for `pid` until `deadline`; false (and the process killed) when it did not end by then.
bool WaitUntil(pid_t pid, std::chrono::steady_clock::time_point deadline, int* status) {
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return false;
}

TEST(TcpElastic, SurvivorReinitialisesAfterEveryWayOfLeavingWithoutLeaks) {
  const char* root = std::getenv("HVDC_SOURCE_ROOT");
  if (root == nullptr)
    GTEST_SKIP() << "HVDC_SOURCE_ROOT (the source tree, set by ctest) is not set";
  const std::string secret = "elastic-test-secret";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t service = fork();
  ASSERT_GE(service, 0);
  if (service == 0) {
    dup2(out[1], 1);
    close(out[0]);
    setenv("PYTHONPATH", root, 1);
    setenv("HOROVOD_SECRET_KEY", secret.c_str(), 1);
    execlp("python3", "python3", "-m", "horovod_compat.runner.rendezvous", "--host", "127.0.0.1",
           static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  // "HOROVOD_GLOO_RENDEZVOUS_ADDR=... HOROVOD_GLOO_RENDEZVOUS_PORT=<port>" once it listens.
  FILE* service_out = fdopen(out[0], "r");
  char line[256] = {};
  const bool got = std::fgets(line, sizeof(line), service_out) != nullptr;
  const char* port_at = got ? std::strstr(line, "HOROVOD_GLOO_RENDEZVOUS_PORT=") : nullptr;
  auto stop_service = [&] {
    kill(service, SIGTERM);
    waitpid(service, nullptr, 0);
    std::fclose(service_out);
  };
  if (port_at == nullptr) {
    stop_service();
    FAIL() << "the rendezvous service printed '" << line << "'";
  }
  const std::string port =
      std::to_string(std::atoi(port_at + std::strlen("HOROVOD_GLOO_RENDEZVOUS_PORT=")));
  char dir_template[] = "/tmp/hvdc_elastic_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string survivor_log = dir + "/survivor.log", peer_log = dir + "/peers.log";
  const std::vector<std::pair<std::string, std::string>> common = {
      {"HOROVOD_ELASTIC", "1"},
      {"HOROVOD_CONTROLLER", "gloo"},
      {"HOROVOD_SIZE", "2"},
      {"HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"},
      {"HOROVOD_GLOO_RENDEZVOUS_PORT", port},
      {"HOROVOD_SECRET_KEY", secret},
      // Armed, this timer would end the survivor during the rounds that follow a loss.
      {"HOROVOD_PEER_LOSS_EXIT_SECONDS", "0.05"}};
  auto with = [&common](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.begin(), common.begin(), common.end());
    return more;
  };
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  const pid_t survivor = Start(survivor_log, with({{kRoleVar, "survivor"}}));
  ASSERT_GT(survivor, 0);
  std::string failure;
  for (int round = 0; round < kRounds && failure.empty(); ++round) {
    const pid_t peer =
        Start(peer_log, with({{kRoleVar, "peer"},
                              {kModeVar, PeerKilled(round) ? "kill" : "shutdown"},
                              {"HOROVOD_RANK", std::to_string(1 - SurvivorRank(round))},
                              {"HVDC_TCP_RENDEZVOUS_SCOPE", Scope(round)}}));
    ASSERT_GT(peer, 0);
    int status = 0;
    if (!WaitUntil(peer, deadline, &status)) {
      failure = "the peer of round " + std::to_string(round) + " did not end in time";
    } else if (PeerKilled(round) ? !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                                 : !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      failure = "the peer of round " + std::to_string(round) + " ended with status " +
                std::to_string(status);
    }
  }
  int status = 0;
  const bool ended =
      WaitUntil(survivor, failure.empty() ? deadline : std::chrono::steady_clock::now(), &status);
  stop_service();
  const std::string log = ReadFile(survivor_log);
  std::printf("--- survivor:\n%s--- peers:\n%s", log.c_str(), ReadFile(peer_log).c_str());
  EXPECT_TRUE(failure.empty()) << failure;
  EXPECT_TRUE(ended) << "the survivor did not finish in time";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "survivor status " << status;
  EXPECT_NE(log.find("PASSED"), std::string::npos);
  std::remove(survivor_log.c_str());
  std::remove(peer_log.c_str());
  rmdir(dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv(kRoleVar)) {
    return std::string(role) == "survivor" ? Survivor() : Peer();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
