// The MPI liveness side channel (HOROVOD_MPI_LIVENESS, issue 12): this binary is the driver (a
// plain process under ctest) and, with HVDC_LIVENESS_TEST_ROLE set, each rank of a job it starts
// with `mpirun --enable-recovery` (Open MPI keeps the survivors of a dead rank running).
//
// - A killed rank: 3 ranks run checked allreduces; rank 1 SIGKILLs itself mid-loop. Ranks 0 and 2,
//   blocked in MPI, must fail their pending allreduce naming rank 1 and its host, and exit
//   non-zero on their own. Each rank runs under `sh -c` that records its exit status in a file (the
//   killed rank kills that shell too, so mpirun sees a rank killed by a signal). The detection and
//   exit times are printed, never asserted (the only time bound is the test's own). The same with
//   rank 1 stopped (SIGSTOP) instead: the heartbeats catch it.
// - An orderly job raises no alarm, with the side channel on and off (HOROVOD_MPI_LIVENESS=0):
//   every rank exits 0 and the debug log says whether the channel was on.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/c_api.h"
#include "core/config.h"
#include "liveness/liveness.h"
#include "tests/cpp/util/checked_step.h"

namespace {

constexpr int kSize = 3;
constexpr int kKilled = 1;
constexpr int kKillStep = 30;
constexpr int kCleanSteps = 20;
constexpr auto kLimit = std::chrono::seconds(90);  // the test's own bound on the whole job
constexpr const char* kRoleVar = "HVDC_LIVENESS_TEST_ROLE";
constexpr const char* kDirVar = "HVDC_LIVENESS_TEST_DIR";

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------------
// Worker: one rank.

// One allreduce of step-dependent values, checked (checked_step.h).
int Step(int rank, int step, std::string* message) {
  return hvdc::checked_step::Step("live.", 4096, 5, rank, hvdc_size(), step, message);
}

int Worker(const std::string& role) {
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string log =
      std::string(std::getenv(kDirVar)) + "/rank" + (world_rank ? world_rank : "x") + ".log";
  if (!std::freopen(log.c_str(), "w", stdout)) return 2;
  dup2(fileno(stdout), 2);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (hvdc_init(nullptr) != HVDC_OK) {
    std::printf("INIT FAILED %s\n", hvdc_last_error());
    return 3;
  }
  const int rank = hvdc_rank();
  if (role == "clean") {
    for (int step = 0; step < kCleanSteps; ++step) {
      std::string message;
      if (Step(rank, step, &message) != HVDC_OK) {
        std::printf("FAILED %s\n", message.c_str());
        return 4;
      }
    }
    if (hvdc_shutdown() != HVDC_OK) {
      std::printf("SHUTDOWN FAILED %s\n", hvdc_last_error());
      return 5;
    }
    std::printf("CLEAN\n");
    return 0;
  }
  for (int step = 0;; ++step) {
    if (rank == kKilled && step == kKillStep && role == "stop") {
      std::printf("STOPPING at %lld pid %d\n", static_cast<long long>(NowMs()),
                  static_cast<int>(getpid()));
      std::fflush(stdout);
      raise(SIGSTOP);  // hung, connections open: only the heartbeats can tell
    }
    if (rank == kKilled && step == kKillStep && role == "kill") {
      std::printf("KILLING at %lld\n", static_cast<long long>(NowMs()));
      std::fflush(stdout);
      kill(getppid(), SIGKILL);  // the recording shell: mpirun sees a rank killed by a signal
      raise(SIGKILL);
    }
    std::string message;
    const int rc = Step(rank, step, &message);
    if (rc == hvdc::checked_step::kWrongValue) {
      std::printf("VALUE %s\n", message.c_str());
      return 6;
    }
    if (rc != HVDC_OK) {
      std::printf("FAILED at %lld step %d: %s\n", static_cast<long long>(NowMs()), step,
                  message.c_str());
      std::string later;
      if (Step(rank, step + 1, &later) != HVDC_OK) std::printf("LATER FAILED %s\n", later.c_str());
      std::fflush(stdout);
      for (;;) pause();  // only the runtime ends this process
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Driver.

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : "";
}

struct Job {
  std::string dir;
  int mpirun_status = -1;
  bool ended = false;
  std::string Log(int r) const { return ReadFile(dir + "/rank" + std::to_string(r) + ".log"); }
  // The rank's exit status as its shell recorded it; -1 when there is none.
  int Exit(int r) const {
    const std::string s = ReadFile(dir + "/exit." + std::to_string(r));
    return s.empty() ? -1 : std::atoi(s.c_str());
  }
  // When the exit status was recorded (ms since the epoch), or -1.
  int64_t ExitMs(int r) const {
    struct stat st;
    if (stat((dir + "/exit." + std::to_string(r)).c_str(), &st) != 0) return -1;
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  }
  // Removes the job's folder (logs and exit files).
  void Remove() const {
    std::error_code ignored;
    if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
  }
  std::string Dump() const {
    std::string all;
    for (int r = 0; r < kSize; ++r) {
      all +=
          "--- rank " + std::to_string(r) + " (exit " + std::to_string(Exit(r)) + "):\n" + Log(r);
    }
    return all;
  }
};

// Runs the job under mpirun (keeping survivors alive) with extra `-x VAR=value` settings.
Job RunJob(const std::string& role, const std::vector<std::string>& env) {
  Job job;
  char dir_template[] = "/tmp/hvdc_liveness_XXXXXX";
  if (!mkdtemp(dir_template)) return job;
  job.dir = dir_template;
  const char* mpirun = std::getenv("HVDC_MPIRUN");
  std::vector<std::string> args = {mpirun ? mpirun : "mpirun",
                                   "--timeout",
                                   "120",
                                   "--enable-recovery",
                                   "-np",
                                   std::to_string(kSize),
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "--bind-to",
                                   "none",
                                   "--mca",
                                   "mpi_yield_when_idle",
                                   "1",
                                   "-x",
                                   "ASAN_OPTIONS=detect_leaks=0",
                                   "-x",
                                   std::string(kRoleVar) + "=" + role,
                                   "-x",
                                   std::string(kDirVar) + "=" + job.dir};
  for (const auto& e : env) {
    args.push_back("-x");
    args.push_back(e);
  }
  // The shell records the rank's exit status (written to a temporary name, then renamed: the
  // file's time is when the rank ended).
  args.insert(args.end(), {"sh", "-c",
                           "\"$0\"; rc=$?; f=\"$" + std::string(kDirVar) +
                               "/exit.$OMPI_COMM_WORLD_RANK\"; echo $rc > \"$f.tmp\"; "
                               "mv \"$f.tmp\" \"$f\"; exit $rc",
                           SelfPath()});
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    unsetenv("HOROVOD_PEER_LOSS_EXIT_SECONDS");  // the defaults apply
    unsetenv("HOROVOD_PEER_TIMEOUT_SECONDS");
    unsetenv("HOROVOD_MPI_LIVENESS");
    setpgid(0, 0);  // so the bound below can end mpirun and everything it started
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  bool released = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &job.mpirun_status, WNOHANG) == pid) {
      job.ended = true;
      break;
    }
    // A stopped rank never ends: once both survivors have, kill it.
    if (role == "stop" && !released && job.Exit(0) >= 0 && job.Exit(2) >= 0) {
      const std::string log = job.Log(kKilled);
      const size_t at = log.find(" pid ");
      if (at != std::string::npos) kill(std::atoi(log.c_str() + at + 5), SIGKILL);
      released = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!job.ended) {
    kill(-pid, SIGKILL);
    waitpid(pid, &job.mpirun_status, 0);
  }
  return job;
}

// `role` "kill" or "stop"; `why` is what the survivors' error must say.
void HitRankOne(const std::string& role, const std::string& why) {
  const Job job = RunJob(role, {});
  ASSERT_FALSE(job.dir.empty());
  const std::string all = job.Dump();
  std::printf("%s", all.c_str());
  ASSERT_TRUE(job.ended) << "mpirun did not end within the test's bound:\n" << all;
  const std::string hit = job.Log(kKilled);
  const std::string mark = role == "kill" ? "KILLING at " : "STOPPING at ";
  const size_t at = hit.find(mark);
  ASSERT_NE(at, std::string::npos) << all;
  const int64_t kill_ms = std::atoll(hit.c_str() + at + mark.size());
  const std::string named = "rank 1 (127.0.0.1:";  // one host: the channel listens on loopback
  for (int r = 0; r < kSize; ++r) {
    if (r == kKilled) continue;
    const std::string log = job.Log(r);
    EXPECT_GT(job.Exit(r), 0) << "rank " << r << " did not exit non-zero:\n" << all;
    const size_t failed = log.find("FAILED at ");
    ASSERT_NE(failed, std::string::npos) << "rank " << r << " never failed:\n" << all;
    EXPECT_NE(log.find(named, failed), std::string::npos)
        << "rank " << r << " does not name " << named << ":\n"
        << all;
    EXPECT_NE(log.find("MPI liveness side channel"), std::string::npos) << all;
    EXPECT_NE(log.find(why, failed), std::string::npos) << all;
    EXPECT_NE(log.find("LATER FAILED "), std::string::npos) << all;
    EXPECT_EQ(log.find("DOUBLE"), std::string::npos) << all;
    EXPECT_EQ(log.find("VALUE"), std::string::npos) << all;
    const int64_t failed_ms = std::atoll(log.c_str() + failed + 10);
    std::printf("rank %d: failed %.2f s and exited %.2f s after rank 1 was %s\n", r,
                (failed_ms - kill_ms) / 1000.0, (job.ExitMs(r) - kill_ms) / 1000.0,
                role == "kill" ? "killed" : "stopped");
  }
  if (!::testing::Test::HasFailure()) job.Remove();  // kept for a look when something failed
}

TEST(MpiLiveness, KilledRankEndsTheSurvivors) {
  HitRankOne("kill", "closed the connection without shutting down");
}

// A stopped rank keeps its connections open: the heartbeats (default HOROVOD_PEER_TIMEOUT_SECONDS)
// catch it. The driver kills it once the survivors have ended.
TEST(MpiLiveness, StoppedRankEndsTheSurvivors) { HitRankOne("stop", "sent nothing for"); }

void ExpectClean(const Job& job, const std::string& says) {
  ASSERT_FALSE(job.dir.empty());
  const std::string all = job.Dump();
  ASSERT_TRUE(job.ended) << "mpirun did not end within the test's bound:\n" << all;
  EXPECT_TRUE(WIFEXITED(job.mpirun_status) && WEXITSTATUS(job.mpirun_status) == 0) << all;
  for (int r = 0; r < kSize; ++r) {
    EXPECT_EQ(job.Exit(r), 0) << "rank " << r << ":\n" << all;
    const std::string log = job.Log(r);
    EXPECT_NE(log.find("CLEAN"), std::string::npos) << all;
    EXPECT_NE(log.find(says), std::string::npos) << all;
    EXPECT_EQ(log.find("peer rank was lost"), std::string::npos) << all;
    EXPECT_EQ(log.find("without shutting down"), std::string::npos) << all;
  }
  if (!::testing::Test::HasFailure()) job.Remove();  // kept for a look when something failed
}

TEST(MpiLiveness, OrderlyJobRaisesNoAlarm) {
  ExpectClean(RunJob("clean", {"HOROVOD_LOG_LEVEL=debug"}), "MPI liveness side channel: on (rank ");
}

TEST(MpiLiveness, OffRunsWithoutIt) {
  ExpectClean(RunJob("clean", {"HOROVOD_LOG_LEVEL=debug", "HOROVOD_MPI_LIVENESS=0"}),
              "MPI liveness side channel: off");
}

// Where the channel listens (no MPI involved).
TEST(LivenessAddress, PicksAReachableAddress) {
  hvdc::Config config;
  std::string address;
  ASSERT_TRUE(hvdc::liveness::LivenessAddress(config, true, &address).ok());
  EXPECT_EQ(address, "127.0.0.1");  // every rank on this host
  config.gloo_iface = "lo";
  ASSERT_TRUE(hvdc::liveness::LivenessAddress(config, false, &address).ok());
  EXPECT_EQ(address, "127.0.0.1");  // the interface's address, whatever the ranks' hosts
  config.gloo_iface = "no-such-interface0, lo";  // the first listed interface that has one
  ASSERT_TRUE(hvdc::liveness::LivenessAddress(config, false, &address).ok());
  EXPECT_EQ(address, "127.0.0.1");
  config.gloo_iface = "no-such-interface0";
  const hvdc::Status bad = hvdc::liveness::LivenessAddress(config, false, &address);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("HOROVOD_GLOO_IFACE='no-such-interface0'"), std::string::npos)
      << bad.message();
  EXPECT_NE(bad.message().find("HOROVOD_MPI_LIVENESS=0"), std::string::npos) << bad.message();
  // Several hosts, no interface given: a non-loopback address, or an error saying what to set.
  config.gloo_iface.clear();
  const hvdc::Status s = hvdc::liveness::LivenessAddress(config, false, &address);
  if (s.ok()) {
    EXPECT_FALSE(address.empty());
    EXPECT_NE(address.rfind("127.", 0), 0u) << address;
  } else {
    EXPECT_NE(s.message().find("HOROVOD_GLOO_IFACE"), std::string::npos) << s.message();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv(kRoleVar)) return Worker(role);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
