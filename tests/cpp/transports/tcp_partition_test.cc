// The TCP transport across hosts that lose each other (issue 12), on the pretend cluster of
// network namespaces (../shared/tools/netns-cluster, `up 3`): six ranks of this binary, two per
// host hvhost1..3, meet over HVDC_TCP_PEERS at the hosts' own addresses.
//
//  - A cut: once every rank has warmed up, host 3's link goes down. Nothing resets a connection
//    (no process died), so only the heartbeats can notice. Every rank, on both sides of the cut,
//    must fail its pending collective with the lost-peer code naming a rank across the cut, fail
//    the next one too, and exit non-zero on its own (defaults: HOROVOD_PEER_TIMEOUT_SECONDS=4,
//    HOROVOD_PEER_LOSS_EXIT_SECONDS=3). The times from the cut are printed, not asserted.
//  - A slow network (every host's link limited to 100 Mbit/s): one 64 MiB allreduce takes several
//    heartbeat timeouts, yet no peer may be called silent; the sum is checked.
//
// Skips, saying why, unless HVDC_NETNS_CLUSTER names the cluster's script and hvhost1..3 are up
// (scripts/test.sh brings them up when it runs as root). The only time bound is the test's own.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

namespace {

constexpr int kHosts = 3;
constexpr int kPerHost = 2;
constexpr int kSize = kHosts * kPerHost;
constexpr int kCutHost = 3;  // ranks 4 and 5
constexpr int kWarmSteps = 10;
constexpr auto kLimit = std::chrono::seconds(90);  // the test's own bound on every wait
constexpr const char* kRoleVar = "HVDC_PARTITION_TEST_WORKER";

int HostOf(int rank) { return rank / kPerHost + 1; }

// The slow-link allreduce: 64 MiB at 100 Mbit/s in CI (about 9 s, over twice the heartbeat
// timeout); HVDC_PARTITION_BIG_MIB and HVDC_PARTITION_SLOW_MBIT change both for a manual run.
int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && std::atoi(v) > 0 ? std::atoi(v) : fallback;
}
size_t BigFloats() { return size_t(EnvInt("HVDC_PARTITION_BIG_MIB", 64)) << 18; }
int SlowMbit() { return EnvInt("HVDC_PARTITION_SLOW_MBIT", 100); }

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// Workers (one rank each). "steps": checked allreduces until one fails, printing READY after the
// warm-up and "FAILED code=<c> at=<wall s> <message>" then "LATER FAILED ...", then idle (only the
// runtime may end the process). "big": one large allreduce (BigFloats()), checked, then a clean
// shutdown.

int StepsWorker(int rank) {
  int step = 0;
  std::string message;
  for (; step < kWarmSteps; ++step) {
    if (hvdc::checked_step::Step("part.", 1000, 7, rank, kSize, step, &message) != HVDC_OK) {
      std::printf("WARMUP FAILED %s\n", message.c_str());
      return 4;
    }
  }
  std::printf("READY\n");
  std::fflush(stdout);
  for (;; ++step) {
    const int rc = hvdc::checked_step::Step("part.", 1000, 7, rank, kSize, step, &message);
    if (rc == hvdc::checked_step::kWrongValue) {
      std::printf("VALUE %s\n", message.c_str());
    } else if (rc != HVDC_OK) {
      std::printf("FAILED code=%d at=%.3f %s\n", rc, WallSeconds(), message.c_str());
      std::fflush(stdout);
      std::string later;
      const int later_rc =
          hvdc::checked_step::Step("part.", 1000, 7, rank, kSize, step + 1, &later);
      if (later_rc != HVDC_OK) std::printf("LATER FAILED code=%d %s\n", later_rc, later.c_str());
      std::fflush(stdout);
      break;
    }
  }
  for (;;) pause();
}

int BigWorker(int rank) {
  const size_t big = BigFloats();
  std::vector<float> in(big), out(big, 0.f);
  // Integers below 2^24 summed over six ranks: exact in float32.
  for (size_t i = 0; i < big; ++i) in[i] = static_cast<float>((rank + 1) * (i % 1013));
  hvdc_request req = {};
  req.op = HVDC_OP_ALLREDUCE;
  req.name = "big";
  req.input.dtype = HVDC_FLOAT32;
  req.input.ndim = 1;
  req.input.dims[0] = static_cast<int64_t>(big);
  req.input.device = -1;
  req.input.data = in.data();
  req.output = req.input;
  req.output.data = out.data();
  req.reduce_op = HVDC_SUM;
  const auto start = std::chrono::steady_clock::now();
  auto* pending = new hvdc::checked_step::Pending;
  if (hvdc_enqueue(&req, 1, &hvdc::checked_step::Done, pending) != HVDC_OK) {
    std::printf("ENQUEUE FAILED %s\n", hvdc_last_error());
    return 5;
  }
  {
    std::unique_lock<std::mutex> lock(pending->mu);
    pending->cv.wait(lock, [&] { return pending->calls > 0; });
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (pending->code != HVDC_OK) {
    std::printf("FAILED code=%d %s\n", pending->code, pending->message.c_str());
    return 6;
  }
  const int sum_of_factors = kSize * (kSize + 1) / 2;
  for (size_t i = 0; i < big; ++i) {
    if (out[i] != static_cast<float>(sum_of_factors * (i % 1013))) {
      std::printf("VALUE at %zu: %g\n", i, static_cast<double>(out[i]));
      return 7;
    }
  }
  std::printf("BIG OK %.2f s\n", seconds);
  delete pending;
  hvdc_shutdown();
  return 0;
}

int Worker() {
  if (hvdc_init(nullptr) != HVDC_OK) {
    std::printf("INIT FAILED %s\n", hvdc_last_error());
    return 3;
  }
  const int rank = hvdc_rank();
  return std::string(std::getenv(kRoleVar)) == "big" ? BigWorker(rank) : StepsWorker(rank);
}

// ---------------------------------------------------------------------------------------------
// Driver.

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Cluster() {
  const char* c = std::getenv("HVDC_NETNS_CLUSTER");
  return c ? c : "";
}

int RunCluster(const std::string& args) {
  return std::system((Cluster() + " " + args + " >/dev/null 2>&1").c_str());
}

// Why the test cannot run here, or "" when it can.
std::string Unavailable() {
  if (Cluster().empty() || access(Cluster().c_str(), X_OK) != 0) {
    return "HVDC_NETNS_CLUSTER does not name the netns-cluster script";
  }
  FILE* p = popen("ip netns list 2>/dev/null", "r");
  std::string hosts;
  char buf[256];
  while (p && fgets(buf, sizeof buf, p)) hosts += buf;
  if (p) pclose(p);
  for (int h = 1; h <= kHosts; ++h) {
    if (hosts.find("hvhost" + std::to_string(h)) == std::string::npos) {
      return "hvhost" + std::to_string(h) + " is not up (netns-cluster up 3)";
    }
  }
  return "";
}

// Six ranks started on their hosts through the cluster's remote shell, each in its own process
// group (so that whatever the remote shell leaves running is killed with it).
class Job {
 public:
  explicit Job(const std::string& role) {
    char dir_template[] = "/tmp/hvdc_partition_XXXXXX";
    dir_ = mkdtemp(dir_template) ? dir_template : "";
    const int base = 20000 + static_cast<int>(getpid() % 20000);
    std::string peers;
    for (int r = 0; r < kSize; ++r) {
      peers += (r ? "," : "") + Address(r, base);
    }
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    for (int r = 0; r < kSize && n > 0 && !dir_.empty(); ++r) {
      logs_.push_back(dir_ + "/rank" + std::to_string(r) + ".log");
      const pid_t pid = fork();
      if (pid == 0) {
        setpgid(0, 0);
        const int fd = open(logs_[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv(kRoleVar, role.c_str(), 1);
        setenv("HVDC_TCP_PEERS", peers.c_str(), 1);
        setenv("HOROVOD_RANK", std::to_string(r).c_str(), 1);
        setenv("HOROVOD_SIZE", std::to_string(kSize).c_str(), 1);
        unsetenv("HOROVOD_PEER_TIMEOUT_SECONDS");  // the defaults apply
        unsetenv("HOROVOD_PEER_LOSS_EXIT_SECONDS");
        const std::string host = "hvhost" + std::to_string(HostOf(r));
        execl(Cluster().c_str(), Cluster().c_str(), "rsh", host.c_str(), self,
              static_cast<char*>(nullptr));
        _exit(127);
      }
      pids_.push_back(pid);
      addresses_.push_back(Address(r, base));
    }
  }
  ~Job() {
    for (pid_t pid : pids_) {
      if (pid > 0) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    for (const auto& log : logs_) std::remove(log.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  bool started() const { return static_cast<int>(pids_.size()) == kSize; }
  std::string Log(int r) const { return ReadFile(logs_[r]); }
  const std::string& address(int r) const { return addresses_[r]; }
  std::string Dump() const {
    std::string all;
    for (int r = 0; r < kSize; ++r) all += "--- rank " + std::to_string(r) + ":\n" + Log(r);
    return all;
  }
  // Waits until every log holds `word`.
  bool AllSay(const std::string& word, std::chrono::steady_clock::time_point deadline) const {
    for (;;) {
      bool all = true;
      for (int r = 0; r < kSize; ++r) all &= Log(r).find(word) != std::string::npos;
      if (all) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Reaps every rank before the deadline; the exit wall times go to `exited_at`.
  bool WaitAll(std::chrono::steady_clock::time_point deadline, std::vector<int>* status,
               std::vector<double>* exited_at) {
    status->assign(kSize, -1);
    exited_at->assign(kSize, 0.0);
    int left = kSize;
    while (left > 0 && std::chrono::steady_clock::now() < deadline) {
      for (int r = 0; r < kSize; ++r) {
        if (pids_[r] > 0 && waitpid(pids_[r], &(*status)[r], WNOHANG) == pids_[r]) {
          kill(-pids_[r], SIGKILL);  // anything the remote shell left behind
          pids_[r] = -1;
          (*exited_at)[r] = WallSeconds();
          --left;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return left == 0;
  }

 private:
  static std::string Address(int r, int base) {
    return "10.250.0." + std::to_string(HostOf(r)) + ":" + std::to_string(base + r);
  }
  std::string dir_;
  std::vector<pid_t> pids_;
  std::vector<std::string> logs_;
  std::vector<std::string> addresses_;
};

// Brings a cut host back and lifts a rate limit whatever the test's outcome.
struct Restore {
  ~Restore() {
    RunCluster("heal " + std::to_string(kCutHost));
    for (int h = 1; h <= kHosts; ++h) {
      (void)std::system(
          ("ip netns exec hvhost" + std::to_string(h) + " tc qdisc del dev eth0 root 2>/dev/null")
              .c_str());
    }
  }
};

TEST(TcpPartition, CutHostFailsBothSidesNamingTheLostPeers) {
  const std::string why = Unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  Restore restore;
  Job job("steps");
  ASSERT_TRUE(job.started());
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  ASSERT_TRUE(job.AllSay("READY", deadline)) << "not every rank warmed up:\n" << job.Dump();

  ASSERT_EQ(RunCluster("cut " + std::to_string(kCutHost)), 0);
  const double cut_at = WallSeconds();
  std::vector<int> status;
  std::vector<double> exited_at;
  const bool ended = job.WaitAll(std::chrono::steady_clock::now() + kLimit, &status, &exited_at);
  const std::string all = job.Dump();
  std::printf("%s", all.c_str());
  ASSERT_TRUE(ended) << "a rank did not exit after host " << kCutHost << " was cut off:\n" << all;

  const std::string code = "code=" + std::to_string(HVDC_PEER_LOST) + " ";
  for (int r = 0; r < kSize; ++r) {
    const std::string log = job.Log(r);
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) != 0)
        << "rank " << r << " status " << status[r] << "\n"
        << all;
    const size_t failed = log.find("FAILED " + code);
    ASSERT_NE(failed, std::string::npos) << "rank " << r << " never failed with " << code << all;
    EXPECT_NE(log.find("LATER FAILED " + code), std::string::npos) << "rank " << r << all;
    EXPECT_EQ(log.find("DOUBLE"), std::string::npos) << all;
    EXPECT_EQ(log.find("VALUE"), std::string::npos) << all;
    // The error names a rank on the other side of the cut (and only such ranks are called lost).
    bool names_other_side = false;
    for (int q = 0; q < kSize; ++q) {
      const std::string named = "rank " + std::to_string(q) + " (" + job.address(q) + ")";
      const bool across = (HostOf(q) == kCutHost) != (HostOf(r) == kCutHost);
      const bool lost_named = log.find(named + " sent nothing for") != std::string::npos;
      if (across && log.find(named, failed) != std::string::npos) names_other_side = true;
      EXPECT_FALSE(!across && lost_named)
          << "rank " << r << " calls " << named << " silent, on its own side of the cut:\n"
          << all;
    }
    EXPECT_TRUE(names_other_side) << "rank " << r << " names no rank across the cut:\n" << all;
    const size_t at = log.find("at=", failed);
    const double failed_at = at == std::string::npos ? 0.0 : std::atof(log.c_str() + at + 3);
    std::printf("rank %d (host %d): failed %.2f s and exited %.2f s after the cut\n", r, HostOf(r),
                failed_at - cut_at, exited_at[r] - cut_at);
  }
}

TEST(TcpPartition, SlowLinksRaiseNoFalseAlarmInALongAllreduce) {
  const std::string why = Unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  Restore restore;
  ASSERT_EQ(RunCluster("slow " + std::to_string(SlowMbit())), 0);
  Job job("big");
  ASSERT_TRUE(job.started());
  std::vector<int> status;
  std::vector<double> exited_at;
  const bool ended =
      job.WaitAll(std::chrono::steady_clock::now() + kLimit * 2, &status, &exited_at);
  const std::string all = job.Dump();
  ASSERT_TRUE(ended) << "the 64 MiB allreduce did not end:\n" << all;
  for (int r = 0; r < kSize; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
        << "rank " << r << " status " << status[r] << "\n"
        << all;
    EXPECT_NE(job.Log(r).find("BIG OK"), std::string::npos) << all;
  }
  EXPECT_EQ(all.find("sent nothing for"), std::string::npos) << all;
  EXPECT_EQ(all.find("FAILED"), std::string::npos) << all;
  const size_t ok = job.Log(0).find("BIG OK");
  if (ok != std::string::npos) {
    std::printf("%zu MiB allreduce, 6 ranks on 3 hosts at %d Mbit/s: %s", BigFloats() >> 18,
                SlowMbit(), job.Log(0).substr(ok + 7).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv(kRoleVar)) return Worker();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
