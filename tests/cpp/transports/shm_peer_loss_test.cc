// A peer of the shared-memory plane that is killed, or stopped, while its partner waits in a
// collective: the wait ends with PeerLost naming the rank (killed: at the next check; stopped:
// after peer_timeout_s), never a hang, and every later call fails alike. Ranks as processes
// (fork), since a thread cannot be killed or stopped on its own.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_segment.h"

namespace hvdc {
namespace {

constexpr int64_t kSegment = 64 * 1024;
constexpr double kPeerTimeout = 1.0;

// Rank 0 here, rank 1 in a child that takes part in one allreduce and then waits to be killed
// (or for its alarm: never outliving a failed test by long).
struct Pair {
  std::unique_ptr<shm::ShmHostComm> comm;
  pid_t child = -1;
};

Pair Start() {
  Pair pair;
  std::random_device rd;
  const uint64_t job = (static_cast<uint64_t>(rd()) << 32) | rd();
  const std::string name = shm::SegmentName(job, 0);
  const shm::SegmentSpec spec{job, 2, kSegment};
  std::unique_ptr<shm::Segment> segment;
  Status made = shm::Segment::Create(name, spec, &segment);
  EXPECT_TRUE(made.ok()) << made.ToString();
  if (!made.ok()) return pair;
  pair.child = fork();
  if (pair.child == 0) {
    alarm(30);
    std::unique_ptr<shm::Segment> mine;
    if (!shm::Segment::Attach(name, spec, &mine).ok()) _exit(2);
    shm::ShmHostComm comm(std::move(mine), 1, {0, 1}, kPeerTimeout);
    int32_t v = 2, sum = 0;
    if (!comm.Allreduce(&v, &sum, 1, DataType::kInt32, ReduceOp::kSum).ok() || sum != 3) _exit(3);
    for (;;) pause();
  }
  pair.comm = std::make_unique<shm::ShmHostComm>(std::move(segment), 0, std::vector<int>{0, 1},
                                                 kPeerTimeout);
  int32_t v = 1, sum = 0;
  EXPECT_TRUE(pair.comm->Allreduce(&v, &sum, 1, DataType::kInt32, ReduceOp::kSum).ok());
  EXPECT_EQ(sum, 3);
  shm::Segment::Unlink(name);  // both attached
  return pair;
}

void ExpectLost(HostComm& comm, const std::string& what) {
  std::vector<float> v(10000, 1.0f);
  Status s = comm.Allreduce(v.data(), v.data(), 10000, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kPeerLost) << s.ToString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
  // The plane stays closed.
  Status later = comm.Barrier();
  EXPECT_EQ(later.code(), StatusCode::kPeerLost) << later.ToString();
}

TEST(ShmPeerLoss, KilledPeerFailsTheCallNamingItsRank) {
  Pair pair = Start();
  ASSERT_NE(pair.comm, nullptr);
  ASSERT_GT(pair.child, 0);
  kill(pair.child, SIGKILL);
  int status = 0;
  waitpid(pair.child, &status, 0);
  ExpectLost(*pair.comm, "exited");
}

TEST(ShmPeerLoss, StoppedPeerFailsTheCallAfterThePeerTimeout) {
  Pair pair = Start();
  ASSERT_NE(pair.comm, nullptr);
  ASSERT_GT(pair.child, 0);
  kill(pair.child, SIGSTOP);
  ExpectLost(*pair.comm, "stopped");
  kill(pair.child, SIGKILL);
  int status = 0;
  waitpid(pair.child, &status, 0);
}

// A call without data (a round that only meets the peers) fails alike.
TEST(ShmPeerLoss, KilledPeerFailsABarrier) {
  Pair pair = Start();
  ASSERT_NE(pair.comm, nullptr);
  ASSERT_GT(pair.child, 0);
  kill(pair.child, SIGKILL);
  int status = 0;
  waitpid(pair.child, &status, 0);
  Status s = pair.comm->Barrier();
  EXPECT_EQ(s.code(), StatusCode::kPeerLost) << s.ToString();
}

}  // namespace
}  // namespace hvdc
