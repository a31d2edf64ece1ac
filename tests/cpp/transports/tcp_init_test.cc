// Transport selection through the C API: the TCP ("gloo") transport is chosen by HVDC_TCP_PEERS,
// HOROVOD_GLOO_RENDEZVOUS_ADDR or HOROVOD_CONTROLLER/HOROVOD_CPU_OPERATIONS=gloo; a missing or bad
// identity fails init with the variable named; gloo_built/gloo_enabled report it. (The multi-rank
// runs are the *_tcp_np* ctests: the C-API runtime suites started as processes by tcp_launch.py.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/c_api.h"
#include "tests/cpp/util/c_api_harness.h"
#include "tests/cpp/util/tcp_test_util.h"

namespace {

// Sets variables for one test and removes them afterwards.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, std::string>> vars) {
    for (const auto& v : vars) {
      setenv(v.first, v.second.c_str(), 1);
      names_.push_back(v.first);
    }
  }
  ~ScopedEnv() {
    for (const char* n : names_) unsetenv(n);
  }

 private:
  std::vector<const char*> names_;
};

std::string InitError() {
  EXPECT_NE(hvdc_init(nullptr), HVDC_OK);
  EXPECT_EQ(hvdc_is_initialized(), 0);
  return hvdc_last_error();
}

TEST(TcpInit, GlooIsBuilt) { EXPECT_EQ(hvdc_gloo_built(), 1); }

TEST(TcpInit, OneRankWorldOverTcp) {
  const auto peers = hvdc::tcp_test::FreeLoopbackPeers(1);
  ScopedEnv env({{"HVDC_TCP_PEERS", peers[0]}, {"HOROVOD_RANK", "0"}});
  ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  EXPECT_EQ(hvdc_gloo_enabled(), 1);
  EXPECT_EQ(hvdc_mpi_enabled(), 0);
  EXPECT_EQ(hvdc_mpi_threads_supported(), -1);
  EXPECT_EQ(hvdc_size(), 1);
  EXPECT_EQ(hvdc_rank(), 0);
  ASSERT_EQ(hvdc_shutdown(), HVDC_OK) << hvdc_last_error();
  EXPECT_EQ(hvdc_gloo_enabled(), 0);
}

TEST(TcpInit, NoLauncherStaysLocal) {
  ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  EXPECT_EQ(hvdc_gloo_enabled(), 0);
  ASSERT_EQ(hvdc_shutdown(), HVDC_OK);
}

TEST(TcpInit, ControllerGlooWithoutIdentity) {
  ScopedEnv env({{"HOROVOD_CONTROLLER", "gloo"}});
  const std::string e = InitError();
  EXPECT_NE(e.find("HVDC_TCP_PEERS"), std::string::npos) << e;
  EXPECT_NE(e.find("HOROVOD_GLOO_RENDEZVOUS_ADDR"), std::string::npos) << e;
}

TEST(TcpInit, CpuOperationsGlooSelectsTcp) {
  ScopedEnv env({{"HOROVOD_CPU_OPERATIONS", "gloo"}});
  const std::string e = InitError();
  EXPECT_NE(e.find("HVDC_TCP_PEERS"), std::string::npos) << e;
}

TEST(TcpInit, PeersWithoutRank) {
  ScopedEnv env({{"HVDC_TCP_PEERS", "127.0.0.1:1,127.0.0.1:2"}});
  const std::string e = InitError();
  EXPECT_NE(e.find("HOROVOD_RANK is not"), std::string::npos) << e;
}

TEST(TcpInit, BadRankValue) {
  ScopedEnv env({{"HVDC_TCP_PEERS", "127.0.0.1:1,127.0.0.1:2"}, {"HOROVOD_RANK", "one"}});
  const std::string e = InitError();
  EXPECT_NE(e.find("HOROVOD_RANK"), std::string::npos) << e;
}

TEST(TcpInit, MissingPeerTimesOutNamingIt) {
  const auto peers = hvdc::tcp_test::FreeLoopbackPeers(2);  // rank 1 never starts
  ScopedEnv env({{"HVDC_TCP_PEERS", peers[0] + "," + peers[1]},
                 {"HOROVOD_RANK", "0"},
                 {"HOROVOD_GLOO_TIMEOUT_SECONDS", "1"}});
  const std::string e = InitError();
  EXPECT_NE(e.find("rank 1 at " + peers[1]), std::string::npos) << e;
}

TEST(TcpInit, ControllerGlooWinsOverMpirunEnvironment) {
  // Under mpirun the runtime stays MPI unless HOROVOD_CONTROLLER=gloo; with it, TCP is chosen (and
  // needs its own identity variables).
  ScopedEnv env({{"OMPI_COMM_WORLD_SIZE", "2"}, {"HOROVOD_CONTROLLER", "gloo"}});
  const std::string e = InitError();
  EXPECT_NE(e.find("HVDC_TCP_PEERS"), std::string::npos) << e;
}

// Two processes (this one and a forked child, which starts before any thread exists here): one
// allreduce works, then the child dies without shutting down; this rank's next allreduce fails
// with an error instead of hanging.
TEST(TcpInit, PeerDyingMidJobFailsThePendingOperation) {
  const auto peers = hvdc::tcp_test::FreeLoopbackPeers(2);
  ScopedEnv env({{"HVDC_TCP_PEERS", peers[0] + "," + peers[1]},
                 {"HOROVOD_SIZE", "2"},
                 {"HOROVOD_GLOO_TIMEOUT_SECONDS", "60"}});
  auto allreduce = [](const char* name, float value, float* out) {
    hvdc_test::Buffer in(HVDC_FLOAT32, 1), res(HVDC_FLOAT32, 1);
    in.Set(0, value);
    hvdc_request r = hvdc_test::AllreduceRequest(name, in, res, {1}, HVDC_SUM);
    hvdc_test::Result result;
    const bool done = hvdc_test::Enqueue(r).WaitFor(std::chrono::seconds(120), &result);
    if (done && result.ok()) *out = static_cast<float>(res.Get(0));
    return std::make_pair(done, result);
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("HOROVOD_RANK", "1", 1);
    if (hvdc_init(nullptr) != HVDC_OK) _exit(3);
    float sum = 0;
    auto r = allreduce("first", 2.0f, &sum);
    _exit(r.first && r.second.ok() && sum == 3.0f ? 0 : 4);  // gone, without hvdc_shutdown
  }
  setenv("HOROVOD_RANK", "0", 1);
  ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  float sum = 0;
  auto first = allreduce("first", 1.0f, &sum);
  ASSERT_TRUE(first.first);
  EXPECT_TRUE(first.second.ok()) << first.second;
  EXPECT_EQ(sum, 3.0f);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  auto second = allreduce("second", 1.0f, &sum);
  ASSERT_TRUE(second.first) << "the allreduce with a dead peer hung";
  EXPECT_FALSE(second.second.ok());
  EXPECT_NE(second.second.message.find("rank 1"), std::string::npos) << second.second;
  hvdc_shutdown();
  unsetenv("HOROVOD_RANK");
}

}  // namespace
