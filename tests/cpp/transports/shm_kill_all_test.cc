// `kill -9` of every rank of a job on the shared-memory plane leaves nothing in /dev/shm
// (docs/shm.md, "Lifetime"). Three ranks as real processes (forked before this process starts any
// thread) make their transport as a TCP job does -- Config from the environment (HVDC_TCP_PEERS
// over loopback), MakeTcpTransport, wrapped by shm::MakeShmTransport as builtins/builtins.cc does
// -- create the world's process set, check it got a ShmHostComm, report its segment's name, and
// then run checked allreduces of several rounds each until they are killed. The test SIGKILLs the
// whole group at once while they are in that loop, reaps them, and looks in /dev/shm for the name
// and for anything else of that job id.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_transport.h"
#include "tcp_controller/tcp_transport.h"
#include "tests/cpp/util/tcp_test_util.h"

namespace hvdc {
namespace {

constexpr int kSize = 3;
constexpr int64_t kSegment = 64 * 1024;  // HVDC_SHM_BYTES: about 10 KiB per rank and round
constexpr int64_t kCount = 16 * 1024;    // floats per allreduce: several rounds each
constexpr int kWarmCalls = 5;            // allreduces before a rank reports
constexpr auto kLimit = std::chrono::seconds(20);  // the test's bound on every wait
constexpr unsigned kChildAlarm = 30;               // a rank never outlives a failed test by long

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------------------------
// One rank (a forked child). Writes "NAME <segment name>" to `report` once the plane is up and
// kWarmCalls allreduces were right, then keeps going; "FAILED <why>" and exits otherwise.

[[noreturn]] void Fail(FILE* report, const std::string& why) {
  std::fprintf(report, "FAILED %s\n", why.c_str());
  std::fflush(report);
  _exit(3);
}

[[noreturn]] void Rank(int rank, const std::string& peers, const std::string& report_path) {
  alarm(kChildAlarm);
  FILE* report = std::fopen(report_path.c_str(), "w");
  if (!report) _exit(2);
  setenv("HVDC_TCP_PEERS", peers.c_str(), 1);
  setenv("HOROVOD_RANK", std::to_string(rank).c_str(), 1);
  setenv("HOROVOD_SIZE", std::to_string(kSize).c_str(), 1);
  setenv("HVDC_SHM", "1", 1);
  setenv("HVDC_SHM_BYTES", std::to_string(kSegment).c_str(), 1);
  Config config;
  std::vector<std::string> warnings;
  Status s = Config::FromProcessEnv(&config, &warnings);
  if (!s.ok()) Fail(report, "config: " + s.ToString());
  std::unique_ptr<Transport> transport;
  s = MakeTcpTransport(config, &transport);
  if (!s.ok()) Fail(report, "TCP transport: " + s.ToString());
  transport = shm::MakeShmTransport(std::move(transport), shm::ShmOptions::FromConfig(config));
  std::vector<int> world(kSize);
  for (int r = 0; r < kSize; ++r) world[r] = r;
  ProcessSetChannels set;
  s = transport->CreateProcessSet(world, &set);
  if (!s.ok()) Fail(report, "process set: " + s.ToString());
  auto* plane = dynamic_cast<shm::ShmHostComm*>(set.data.get());
  if (!plane) Fail(report, "the world's data plane is not a ShmHostComm");
  if (plane->slot_bytes() * 3 > kCount * 4) Fail(report, "an allreduce would take < 3 rounds");
  std::vector<float> v(kCount);
  for (int call = 0;; ++call) {
    for (int64_t i = 0; i < kCount; ++i) v[i] = static_cast<float>((i % 97) * (rank + 1) + call);
    s = plane->Allreduce(v.data(), v.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
    if (!s.ok()) Fail(report, "allreduce: " + s.ToString());
    for (int64_t i = 0; i < kCount; ++i) {
      const float expected = static_cast<float>((i % 97) * kSize * (kSize + 1) / 2 + kSize * call);
      if (v[i] != expected) Fail(report, "wrong sum at " + std::to_string(i));
    }
    if (call == kWarmCalls) {
      std::fprintf(report, "NAME %s\n", plane->segment_name().c_str());
      std::fflush(report);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Driver.

// The job id part of a segment name ("/hvdc-<euid>-<job id>-<index>"), with its dashes.
std::string JobIdPart(const std::string& name) {
  const size_t a = name.find('-', 1), b = a == std::string::npos ? a : name.find('-', a + 1),
               c = b == std::string::npos ? b : name.find('-', b + 1);
  if (c == std::string::npos) return "";
  return name.substr(b, c - b + 1);
}

std::vector<std::string> DevShmEntriesContaining(const std::string& part) {
  std::vector<std::string> found;
  DIR* dir = opendir("/dev/shm");
  if (!dir) return found;
  while (dirent* e = readdir(dir)) {
    const std::string entry = e->d_name;
    if (entry.find(part) != std::string::npos) found.push_back("/" + entry);
  }
  closedir(dir);
  return found;
}

TEST(ShmKillAll, KillingEveryRankLeavesNothingInDevShm) {
  const std::vector<std::string> peer_list = tcp_test::FreeLoopbackPeers(kSize);
  std::string peers;
  for (const std::string& p : peer_list) peers += (peers.empty() ? "" : ",") + p;
  char dir_template[] = "/tmp/hvdc_shm_kill_all_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  std::vector<std::string> reports(kSize);
  std::vector<pid_t> pids(kSize, -1);
  pid_t group = 0;  // every rank in one process group: one kill reaches them all at once
  for (int r = 0; r < kSize; ++r) {
    reports[r] = dir + "/rank" + std::to_string(r);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setpgid(0, group);
      Rank(r, peers, reports[r]);
    }
    setpgid(pid, group);  // also here: the child may not have run yet
    if (group == 0) group = pid;
    pids[r] = pid;
  }
  auto kill_and_reap = [&] {
    kill(-group, SIGKILL);
    for (pid_t& pid : pids) {
      if (pid > 0) {
        kill(pid, SIGKILL);  // should the group have missed it
        waitpid(pid, nullptr, 0);
        pid = -1;
      }
    }
  };
  auto remove_reports = [&] {
    for (const std::string& report : reports) std::remove(report.c_str());
    rmdir(dir.c_str());
  };
  auto dump = [&] {
    std::string all;
    for (int r = 0; r < kSize; ++r) {
      all += "--- rank " + std::to_string(r) + ":\n" + ReadFile(reports[r]);
    }
    return all;
  };

  // Every rank has its plane and is in its loop of allreduces.
  std::vector<std::string> names(kSize);
  bool ready = false, failed = false;
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  while (!ready && !failed && std::chrono::steady_clock::now() < deadline) {
    ready = true;
    for (int r = 0; r < kSize; ++r) {
      const std::string text = ReadFile(reports[r]);
      failed |= text.find("FAILED") != std::string::npos;
      const size_t at = text.find("NAME ");
      const size_t end = at == std::string::npos ? at : text.find('\n', at);
      if (end == std::string::npos) {
        ready = false;
      } else {
        names[r] = text.substr(at + 5, end - at - 5);
      }
    }
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!ready || failed) {
    kill_and_reap();
    const std::string reported = dump();
    remove_reports();
    FAIL() << (failed ? "a rank failed" : "the ranks did not all report within the test's bound")
           << ":\n"
           << reported;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // well into the loop
  kill_and_reap();
  const std::string reported = dump();
  remove_reports();

  for (int r = 1; r < kSize; ++r) EXPECT_EQ(names[r], names[0]) << reported;
  const std::string job = JobIdPart(names[0]);
  ASSERT_FALSE(job.empty()) << "not a segment name: " << names[0];
  struct stat st;
  EXPECT_NE(stat(("/dev/shm" + names[0]).c_str(), &st), 0) << names[0] << " left in /dev/shm";
  const std::vector<std::string> left = DevShmEntriesContaining(job);
  for (const std::string& name : left) {
    ADD_FAILURE() << name << " (job id " << job << ") left in /dev/shm";
    shm_unlink(name.c_str());  // the test leaves nothing behind either
  }
}

}  // namespace
}  // namespace hvdc
