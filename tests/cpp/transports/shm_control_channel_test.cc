// The shared-memory control channel beyond the conformance suites (which run every operation over
// it at np = 2, 3, 4, payloads to 3 MiB): which sets get it, ranks that disagree on the operation,
// and a peer process killed or stopped while its partner waits in a round -- the operation fails
// with PeerLost naming the rank (killed: within the liveness check's period; stopped: after the
// peer timeout; later still under a transport that reports losses itself), Missing() names it
// meanwhile, and the channel stays failed.
#include "shm_controller/shm_control_channel.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_segment.h"
#include "shm_controller/shm_transport.h"
#include "tests/cpp/conformance/suite_util.h"
#include "tests/cpp/util/shm_world.h"

namespace hvdc {
namespace {

using conformance::MakeSet;
using conformance::Range;
using conformance::World;

shm::ShmOptions Options() {
  shm::ShmOptions o;
  o.bytes = 64 * 1024;
  o.host = "one-host";
  return o;
}

// Runs op to completion, polling as the control thread does; false if it has not finished in 20 s.
bool Finish(PendingOp& op, Status* status) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!op.Test(status)) {
    if (std::chrono::steady_clock::now() > limit) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

TEST(ShmControlChannel, OneHostSetsNegotiateThroughSharedMemory) {
  struct Case {
    const char* why;
    shm::ShmOptions options;
    std::vector<std::string> hosts;
    bool expect_shm;
  };
  shm::ShmOptions off = Options(), no_control = Options();
  off.enabled = false;
  no_control.control = false;
  const std::vector<Case> cases = {{"one host", Options(), {}, true},
                                   {"HVDC_SHM=0", off, {}, false},
                                   {"HVDC_SHM_CONTROL=0", no_control, {}, false},
                                   {"several hosts", Options(), {"a", "a", "b"}, false}};
  const int n = 3;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.why);
    auto world = MakeShmWorld(n, c.options, c.hosts);
    ASSERT_NE(world, nullptr);
    world->Run([&](Transport& t) {
      ProcessSetChannels set = MakeSet(t, Range(0, n));
      ASSERT_NE(set.control, nullptr);
      EXPECT_EQ(dynamic_cast<shm::ShmControlChannel*>(set.control.get()) != nullptr, c.expect_shm);
      std::vector<uint64_t> bits = {~uint64_t{0} ^ (uint64_t{1} << set.control->rank())};
      Status s;
      auto op = set.control->StartBitAnd(&bits);
      ASSERT_TRUE(Finish(*op, &s));
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(bits[0], ~uint64_t{0} << n);
    });
  }
}

// Ranks in different operations, or ANDing different lengths: every rank fails, saying so.
TEST(ShmControlChannel, DisagreementFailsEveryRank) {
  const int n = 2;
  auto world = MakeShmWorld(n, Options());
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    ControlChannel& ch = *set.control;
    Status s;
    std::vector<uint64_t> bits(1, 1);
    std::vector<std::string> gathered;
    auto op = ch.rank() == 0 ? ch.StartBitAnd(&bits) : ch.StartGather("x", &gathered);
    ASSERT_TRUE(Finish(*op, &s));
    EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
    EXPECT_NE(s.message().find("BitAnd"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("Gather"), std::string::npos) << s.ToString();

    std::vector<uint64_t> longer(static_cast<size_t>(1 + ch.rank()), 1);
    op = ch.StartBitAnd(&longer);
    ASSERT_TRUE(Finish(*op, &s));
    EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
    EXPECT_NE(s.message().find("words"), std::string::npos) << s.ToString();

    // Agreement again afterwards: the channel is still in step.
    std::string blob = ch.rank() == 0 ? "from rank 0" : "";
    op = ch.StartBroadcast(&blob);
    ASSERT_TRUE(Finish(*op, &s));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(blob, "from rank 0");
  });
}

constexpr double kPeerTimeout = 1.0;

// Rank 0 here, rank 1 in a child process that takes part in one BitAnd and then waits to be
// killed (or for its alarm: never outliving a failed test by long).
struct Pair {
  std::unique_ptr<shm::ShmControlChannel> channel;
  pid_t child = -1;
};

Pair Start(double defer_s = 0) {
  Pair pair;
  std::random_device rd;
  const uint64_t job = (static_cast<uint64_t>(rd()) << 32) | rd();
  const std::string name = shm::SegmentName(job, 0);
  const shm::SegmentSpec spec{job, 2, shm::ShmControlChannel::SegmentBytes(2, 4096)};
  std::unique_ptr<shm::Segment> segment;
  Status made = shm::Segment::Create(name, spec, &segment);
  EXPECT_TRUE(made.ok()) << made.ToString();
  if (!made.ok()) return pair;
  pair.child = fork();
  if (pair.child == 0) {
    alarm(30);
    std::unique_ptr<shm::Segment> mine;
    if (!shm::Segment::Attach(name, spec, &mine).ok()) _exit(2);
    shm::ShmControlChannel ch(std::move(mine), 1, {0, 1}, kPeerTimeout);
    std::vector<uint64_t> bits = {6};
    Status s;
    auto op = ch.StartBitAnd(&bits);
    if (!Finish(*op, &s) || !s.ok() || bits[0] != 2) _exit(3);
    for (;;) pause();
  }
  pair.channel = std::make_unique<shm::ShmControlChannel>(
      std::move(segment), 0, std::vector<int>{0, 1}, kPeerTimeout, defer_s);
  std::vector<uint64_t> bits = {3};
  Status s;
  auto op = pair.channel->StartBitAnd(&bits);
  EXPECT_TRUE(Finish(*op, &s));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(bits[0], 2u);
  shm::Segment::Unlink(name);  // both attached
  return pair;
}

void ExpectLost(shm::ShmControlChannel& ch, const std::string& what) {
  std::string blob = "a response list";
  auto op = ch.StartBroadcast(&blob);
  std::vector<int> missing;
  ASSERT_TRUE(op->Missing(&missing));
  EXPECT_EQ(missing, std::vector<int>{1});
  Status s;
  ASSERT_TRUE(Finish(*op, &s)) << "no failure within 20 s";
  EXPECT_EQ(s.code(), StatusCode::kPeerLost) << s.ToString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
  // The channel stays failed.
  std::vector<std::string> gathered;
  op = ch.StartGather("later", &gathered);
  ASSERT_TRUE(op->Test(&s));
  EXPECT_EQ(s.code(), StatusCode::kPeerLost) << s.ToString();
}

TEST(ShmControlChannel, KilledPeerFailsTheRoundNamingItsRank) {
  Pair pair = Start();
  ASSERT_NE(pair.channel, nullptr);
  ASSERT_GT(pair.child, 0);
  kill(pair.child, SIGKILL);
  int status = 0;
  waitpid(pair.child, &status, 0);
  ExpectLost(*pair.channel, "exited");
}

TEST(ShmControlChannel, StoppedPeerFailsTheRoundAfterThePeerTimeout) {
  Pair pair = Start();
  ASSERT_NE(pair.channel, nullptr);
  ASSERT_GT(pair.child, 0);
  kill(pair.child, SIGSTOP);
  ExpectLost(*pair.channel, "stopped");
  kill(pair.child, SIGKILL);
  int status = 0;
  waitpid(pair.child, &status, 0);
}

// Under a transport that reports lost peers itself, the channel leaves it a head start: the round
// fails only once the peer has been seen exited for the deferral, and then as before.
TEST(ShmControlChannel, UnderALossReportingTransportTheVerdictWaits) {
  constexpr double kDefer = 1.0;
  Pair pair = Start(kDefer);
  ASSERT_NE(pair.channel, nullptr);
  ASSERT_GT(pair.child, 0);
  kill(pair.child, SIGKILL);
  int status = 0;
  waitpid(pair.child, &status, 0);
  const auto begun = std::chrono::steady_clock::now();
  ExpectLost(*pair.channel, "exited");
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
  EXPECT_GE(waited, kDefer);  // a lower bound the channel guarantees, not a speed
}

}  // namespace
}  // namespace hvdc
