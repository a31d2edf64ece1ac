// A peer loss and a stall shutdown in every phase a Runtime can be in when they happen (ranks as
// threads over the in-memory world): Running idle, Running with operations pending, Draining (its
// shutdown cannot complete), Drained (a peer's shutdown stopped it, its own not yet called) and
// Down. Every enqueued callback runs exactly once, later operations fail with the reason, and
// Shutdown() returns without waiting out its limit. The transport's loss report is played by the
// test (LossyTransport). In this process the exit timer is off (HOROVOD_PEER_LOSS_EXIT_SECONDS=0);
// the ExitTimer tests run the same scenarios in a child process with it on, and check that it ends
// the child with status 1 after every callback ran once.
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
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cpp/util/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Delegates to the in-memory transport; the test reports a lost peer through Lose(), as a real
// transport's reader thread would.
class LossyTransport : public Transport {
 public:
  explicit LossyTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  const Topology& topology() const override { return inner_->topology(); }
  const char* name() const override { return inner_->name(); }
  bool threads_supported() const override { return inner_->threads_supported(); }
  Status CreateProcessSet(const std::vector<int>& world_ranks, ProcessSetChannels* out) override {
    return inner_->CreateProcessSet(world_ranks, out);
  }
  Status CheckAgreement(uint64_t value, bool* all_equal) override {
    return inner_->CheckAgreement(value, all_equal);
  }
  // Held across the call, so that once a null handler is set no call runs (transport.h).
  void SetPeerLostHandler(PeerLostHandler handler) override {
    std::lock_guard<std::mutex> lock(mu_);
    handler_ = std::move(handler);
  }
  void Finalize() override {
    finalized_.store(true);
    inner_->Finalize();
  }

  // False when no handler is set (the runtime is down).
  bool Lose(const std::string& who) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!handler_) return false;
    handler_(Status::PeerLost(who + " closed the connection without shutting down"));
    return true;
  }
  bool finalized() const { return finalized_.load(); }

 private:
  std::unique_ptr<Transport> inner_;
  std::mutex mu_;
  PeerLostHandler handler_;
  std::atomic<bool> finalized_{false};
};

// N runtimes over one in-memory world, each transport lossy (and gated where asked).
class World {
 public:
  World(int n, Config config, std::vector<std::map<std::vector<int>, Hold>> gates = {})
      : backend_(MakeHostBackend()), rts_(n), lossy_(n) {
    auto world = LocalWorld::Create(n);
    gates.resize(n);
    std::vector<Status> status(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        auto gated = std::make_unique<internal::HarnessTransport>(MakeLocalTransport(world, r),
                                                                  true, gates[r]);
        auto lossy = std::make_unique<LossyTransport>(std::move(gated));
        lossy_[r] = lossy.get();
        status[r] = Runtime::Create(config, std::move(lossy), {backend_.get()}, {}, &rts_[r]);
      });
    }
    for (auto& t : threads) t.join();
    for (auto& s : status) EXPECT_TRUE(s.ok()) << s.ToString();
  }
  // Shuts down what is left, bounded; leaks everything if a rank does not return. A rank still
  // running hears of a loss first: its peers may be gone, and an orderly shutdown would wait for
  // them until its limit.
  ~World() {
    for (auto* l : lossy_) l->Lose("rank -1 (the test's end)");
    std::vector<std::future<int>> done;
    for (auto& rt : rts_) {
      Runtime* p = rt.get();
      if (p) done.push_back(Detached<int>([p] { return p->Shutdown().ok() ? 0 : 1; }));
    }
    for (auto& f : done) {
      if (f.wait_for(seconds(90)) != std::future_status::ready) {
        ADD_FAILURE() << "a runtime did not shut down (leaked)";
        for (auto& rt : rts_) (void)rt.release();
        (void)backend_.release();
        return;
      }
    }
  }

  Runtime& rt(int r) { return *rts_[r]; }
  LossyTransport& lossy(int r) { return *lossy_[r]; }
  int size() const { return static_cast<int>(rts_.size()); }

  // Shutdown() of rank r on a helper thread.
  std::future<int> ShutdownAsync(int r) {
    Runtime* p = rts_[r].get();
    return Detached<int>([p] { return p->Shutdown().ok() ? 0 : 1; });
  }

 private:
  std::unique_ptr<Backend> backend_;
  std::vector<std::unique_ptr<Runtime>> rts_;
  std::vector<LossyTransport*> lossy_;
};

// Counts a callback's calls and keeps the first status.
struct Tracked {
  float in = 1, out = 0;
  std::atomic<int> calls{0};
  std::promise<Status> first;
  std::future<Status> result = first.get_future();
};

std::shared_ptr<Tracked> Track(Runtime& rt, const std::string& name) {
  auto t = std::make_shared<Tracked>();
  Status s = rt.Enqueue(0, One(AllreduceItem(name, &t->in, &t->out, 1)), [t](const Status& st) {
    if (t->calls.fetch_add(1) == 0) t->first.set_value(st);
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) t->first.set_value(s);
  return t;
}

// The callback ran once (within a bound) with `code` and a message containing `part`; a further
// call would be counted, so the count is checked again at the end of each test.
void ExpectFailedOnce(const std::shared_ptr<Tracked>& t, StatusCode code, const std::string& part) {
  ASSERT_EQ(t->result.wait_for(seconds(30)), std::future_status::ready) << "no callback";
  const Status s = t->result.get();
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  EXPECT_EQ(t->calls.load(), 1);
}

// Waits (bounded) until rank r is in `phase`.
bool Reaches(Runtime& rt, Phase phase) {
  for (int i = 0; i < 6000 && rt.phase() != phase; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  return rt.phase() == phase;
}

// A later operation is refused at once with `code` and `part`.
void ExpectRefused(Runtime& rt, StatusCode code, const std::string& part) {
  float x = 1;
  bool called = false;
  Status s = rt.Enqueue(0, One(AllreduceItem("later", &x, &x, 1)),
                        [&called](const Status&) { called = true; });
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  EXPECT_FALSE(called);
}

Config NoExit() {
  Config c = SmallConfig();
  c.peer_loss_exit_s = 0;  // the exit timer would end the test binary
  return c;
}

// Every rank hears of a loss (the survivors of rank 2, and rank 2 of rank 0), so that every
// runtime is Abandoned and shuts down at once.
void EveryoneLoses(World& w) {
  for (int r = 0; r < w.size(); ++r) w.lossy(r).Lose(r == 2 ? "rank 0 (a:1)" : "rank 2 (c:1)");
}

TEST(RuntimeLifecycle, PeerLossWhileIdle) {
  World w(3, NoExit());
  EveryoneLoses(w);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(Reaches(w.rt(r), Phase::kAbandoned)) << "rank " << r;
    ExpectRefused(w.rt(r), StatusCode::kPeerLost, r == 2 ? "rank 0 (a:1)" : "rank 2 (c:1)");
  }
  auto down = w.ShutdownAsync(0);
  ASSERT_EQ(down.wait_for(seconds(30)), std::future_status::ready);
  EXPECT_EQ(w.rt(0).phase(), Phase::kDown);
  // Abandoned: the transport is left alone (a thread may still be inside it).
  EXPECT_FALSE(w.lossy(0).finalized());
}

TEST(RuntimeLifecycle, PeerLossWithOperationsPending) {
  World w(3, NoExit());
  // Ranks 0 and 1 submit a tensor rank 2 never does: pending until the loss.
  auto a = Track(w.rt(0), "pending");
  auto b = Track(w.rt(1), "pending");
  EveryoneLoses(w);
  ExpectFailedOnce(a, StatusCode::kPeerLost, "rank 2 (c:1)");
  ExpectFailedOnce(b, StatusCode::kPeerLost, "rank 2 (c:1)");
  ExpectRefused(w.rt(0), StatusCode::kPeerLost, "rank 2 (c:1)");
  // A second loss report changes nothing (the control thread has stopped).
  w.lossy(0).Lose("rank 1 (b:1)");
  ExpectRefused(w.rt(0), StatusCode::kPeerLost, "rank 2 (c:1)");
  auto down = w.ShutdownAsync(0);
  ASSERT_EQ(down.wait_for(seconds(30)), std::future_status::ready);
  EXPECT_EQ(a->calls.load(), 1);
  EXPECT_EQ(b->calls.load(), 1);
}

// Rank 0's global rounds never complete (gated), so its shutdown stays Draining; a loss then ends
// it at once, failing what was pending.
TEST(RuntimeLifecycle, PeerLossWhileDraining) {
  auto hold = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::map<std::vector<int>, Hold>> gates(3);
  gates[0][{0, 1, 2}] = hold;
  World w(3, NoExit(), gates);
  auto pending = Track(w.rt(0), "pending");
  hold->store(true);
  auto down = w.ShutdownAsync(0);
  ASSERT_TRUE(Reaches(w.rt(0), Phase::kDraining));
  ExpectRefused(w.rt(0), StatusCode::kUnknownError, "shut down");
  EXPECT_EQ(down.wait_for(milliseconds(200)), std::future_status::timeout)
      << "the drain should not complete while rank 0's rounds are held";
  w.lossy(0).Lose("rank 2 (c:1)");
  ASSERT_EQ(down.wait_for(seconds(30)), std::future_status::ready) << "shutdown waited its limit";
  EXPECT_EQ(w.rt(0).phase(), Phase::kDown);
  ExpectFailedOnce(pending, StatusCode::kPeerLost, "rank 2 (c:1)");
  // Later operations keep the drain's reason.
  ExpectRefused(w.rt(0), StatusCode::kUnknownError, "shut down");
  hold->store(false);
  for (int r = 1; r < 3; ++r) w.lossy(r).Lose("rank 0 (a:1)");
  EXPECT_EQ(pending->calls.load(), 1);
}

// Rank 1 shuts down; the others drain and their control threads stop (Drained) before they call
// Shutdown() themselves. A loss reported then changes nothing: no operation is left to fail, and
// their own shutdown releases the transport as an orderly one does.
TEST(RuntimeLifecycle, PeerLossAfterDrained) {
  World w(3, NoExit());
  auto mine = Track(w.rt(0), "only rank 0");
  auto down1 = w.ShutdownAsync(1);
  ASSERT_EQ(down1.wait_for(seconds(30)), std::future_status::ready);
  ASSERT_TRUE(Reaches(w.rt(0), Phase::kDrained));
  ASSERT_TRUE(Reaches(w.rt(2), Phase::kDrained));
  ExpectFailedOnce(mine, StatusCode::kUnknownError, "shut down");
  EXPECT_TRUE(w.lossy(0).Lose("rank 1 (b:1)"));  // the handler is still set: Shutdown() clears it
  EXPECT_EQ(w.rt(0).phase(), Phase::kDrained);
  ExpectRefused(w.rt(0), StatusCode::kUnknownError, "shut down");
  auto down0 = w.ShutdownAsync(0);
  ASSERT_EQ(down0.wait_for(seconds(30)), std::future_status::ready);
  EXPECT_EQ(w.rt(0).phase(), Phase::kDown);
  EXPECT_TRUE(w.lossy(0).finalized()) << "an orderly end releases the transport";
  EXPECT_EQ(mine->calls.load(), 1);
}

TEST(RuntimeLifecycle, PeerLossAfterDown) {
  World w(2, NoExit());
  auto a = w.ShutdownAsync(0);
  auto b = w.ShutdownAsync(1);
  ASSERT_EQ(a.wait_for(seconds(30)), std::future_status::ready);
  ASSERT_EQ(b.wait_for(seconds(30)), std::future_status::ready);
  // Shutdown() removed the handler: the report reaches nobody.
  EXPECT_FALSE(w.lossy(0).Lose("rank 1 (b:1)"));
  EXPECT_EQ(w.rt(0).phase(), Phase::kDown);
  EXPECT_TRUE(w.lossy(0).finalized());
}

// ---------------------------------------------------------------------------------------------
// An elastic job (HOROVOD_ELASTIC=1).

Config Elastic(double exit_s) {
  Config c = SmallConfig();
  c.elastic = true;
  c.peer_loss_exit_s = exit_s;
  return c;
}

// A lost peer fails what is pending with PEER_LOST, as in a static job, but arms no exit timer: a
// timer of 10 ms would end this test binary while the next world (the re-initialisation) forms
// and runs an allreduce.
TEST(RuntimeLifecycle, ElasticPeerLossArmsNoExitTimer) {
  {
    World w(3, Elastic(0.01));
    auto a = Track(w.rt(0), "pending");
    EveryoneLoses(w);
    ExpectFailedOnce(a, StatusCode::kPeerLost, "rank 2 (c:1)");
    ExpectRefused(w.rt(0), StatusCode::kPeerLost, "rank 2 (c:1)");
  }
  World again(2, Elastic(0.01));
  std::vector<std::future<Status>> done;
  std::vector<float> bufs(2, 1.f);
  for (int r = 0; r < 2; ++r) {
    done.push_back(Submit(again.rt(r), 0, One(AllreduceItem("next", &bufs[r], &bufs[r], 1))));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(done[r].wait_for(seconds(30)), std::future_status::ready);
    EXPECT_TRUE(done[r].get().ok());
    EXPECT_EQ(bufs[r], 2.f);
  }
}

// A member that calls shutdown() while the others still run: in an elastic job their pending and
// later operations fail with PEER_LOST naming it (the coordinator, rank 0, or another rank); in a
// static job with the shut-down status (RuntimeLifecycle.PeerLossAfterDrained).
TEST(RuntimeLifecycle, ElasticPeerShutdownFailsTheOthersNamingIt) {
  for (int leaver : {1, 0}) {
    World w(3, Elastic(0));
    std::vector<std::shared_ptr<Tracked>> pending;
    for (int r = 0; r < 3; ++r) {
      if (r != leaver) pending.push_back(Track(w.rt(r), "pending"));
    }
    auto down = w.ShutdownAsync(leaver);
    ASSERT_EQ(down.wait_for(seconds(30)), std::future_status::ready);
    const std::string named = "rank " + std::to_string(leaver) + " shut down (left the job)";
    for (auto& t : pending) ExpectFailedOnce(t, StatusCode::kPeerLost, named);
    for (int r = 0; r < 3; ++r) {
      if (r == leaver) continue;
      ASSERT_TRUE(Reaches(w.rt(r), Phase::kDrained)) << "rank " << r;
      ExpectRefused(w.rt(r), StatusCode::kPeerLost, named);
    }
    // The leaver itself was told it shut down, not that someone left.
    ExpectRefused(w.rt(leaver), StatusCode::kUnknownError, "shut down");
  }
}

Config StallConfig() {
  Config c = NoExit();
  c.stall_check_time_s = 0.2;
  c.stall_shutdown_time_s = 0.4;
  return c;
}

// Rank 2 stops taking part in negotiation (its control thread never sees a round complete): the
// others, idle or with an operation pending, give up after the stall shutdown time.
TEST(RuntimeLifecycle, StallShutdownWhileIdleAndWithOperationsPending) {
  for (bool with_pending : {false, true}) {
    SCOPED_TRACE(with_pending ? "pending" : "idle");
    auto hold = std::make_shared<std::atomic<bool>>(false);
    std::vector<std::map<std::vector<int>, Hold>> gates(3);
    gates[2][{0, 1, 2}] = hold;
    World w(3, StallConfig(), gates);
    hold->store(true);
    std::shared_ptr<Tracked> pending;
    if (with_pending) pending = Track(w.rt(0), "pending");
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(Reaches(w.rt(r), Phase::kAbandoned)) << "rank " << r;
    }
    if (pending) {
      ExpectFailedOnce(pending, StatusCode::kUnknownError, "did not take part");
    }
    ExpectRefused(w.rt(0), StatusCode::kUnknownError, "ranks [2] did not take part");
    auto down = w.ShutdownAsync(0);
    ASSERT_EQ(down.wait_for(seconds(30)), std::future_status::ready);
    hold->store(false);
    if (pending) {
      EXPECT_EQ(pending->calls.load(), 1);
    }
  }
}

// A drain that cannot complete because rank 2 stopped negotiating ends by the stall shutdown, long
// before Shutdown()'s own limit (60 s).
TEST(RuntimeLifecycle, StallShutdownWhileDraining) {
  auto hold = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::map<std::vector<int>, Hold>> gates(3);
  gates[2][{0, 1, 2}] = hold;
  Config c = NoExit();
  c.stall_check_time_s = 0.5;
  c.stall_shutdown_time_s = 1.0;
  World w(3, c, gates);
  auto pending = Track(w.rt(0), "pending");
  hold->store(true);
  auto down = w.ShutdownAsync(0);
  ASSERT_TRUE(Reaches(w.rt(0), Phase::kDraining) || w.rt(0).phase() == Phase::kAbandoned ||
              w.rt(0).phase() == Phase::kDown);
  ASSERT_EQ(down.wait_for(seconds(40)), std::future_status::ready) << "shutdown waited its limit";
  EXPECT_EQ(w.rt(0).phase(), Phase::kDown);
  ASSERT_EQ(pending->result.wait_for(seconds(30)), std::future_status::ready);
  const Status s = pending->result.get();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(pending->calls.load(), 1);
  hold->store(false);
}

// ---------------------------------------------------------------------------------------------
// The exit timer, in a child process (this binary again, with kChildVar naming the scenario). The
// child prints "CALLS <n> CODE <code>" once its pending callback ran, then waits; only the timer
// may end it (status 1). It gives up after kChildLimit and returns 99.

constexpr const char* kChildVar = "HVDC_LIFECYCLE_TEST_CHILD";
constexpr auto kChildLimit = seconds(60);

Config ExitSoon() {
  Config c = SmallConfig();
  c.peer_loss_exit_s = 1.0;  // time for the child to print what its callback got
  return c;
}

int Child(const std::string& scenario) {
  auto hold = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::map<std::vector<int>, Hold>> gates(3);
  Config c = ExitSoon();
  const bool stall = scenario.rfind("stall", 0) == 0;
  if (stall) {
    gates[2][{0, 1, 2}] = hold;  // rank 2 stops negotiating
    c.stall_check_time_s = 0.2;
    c.stall_shutdown_time_s = 0.4;
  } else if (scenario == "loss_draining") {
    gates[0][{0, 1, 2}] = hold;  // rank 0's drain never completes
  }
  // Never destroyed: the timer ends the process with these threads running.
  auto* w = new World(3, c, gates);
  auto pending = Track(w->rt(0), "pending");
  std::future<int> down;
  if (scenario == "loss_draining" || scenario == "stall_draining") {
    hold->store(true);
    down = w->ShutdownAsync(0);
    if (!Reaches(w->rt(0), Phase::kDraining)) return 98;
  }
  if (stall) hold->store(true);
  if (!stall) w->lossy(0).Lose("rank 2 (c:1)");
  if (pending->result.wait_for(kChildLimit) != std::future_status::ready) return 97;
  const Status s = pending->result.get();
  std::printf("CALLS %d CODE %d\n", pending->calls.load(), static_cast<int>(s.code()));
  std::fflush(stdout);
  std::this_thread::sleep_for(kChildLimit);
  std::printf("CALLS %d (the timer did not end the process)\n", pending->calls.load());
  return 99;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs the scenario in a child; returns its wait status and output.
int RunChild(const std::string& scenario, std::string* log) {
  char path[] = "/tmp/hvdc_lifecycle_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    setenv(kChildVar, scenario.c_str(), 1);
    execl("/proc/self/exe", "runtime_lifecycle_test", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fd);
  int status = -1;
  const auto deadline = std::chrono::steady_clock::now() + kChildLimit + seconds(30);
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() < deadline) {
    ended = waitpid(pid, &status, WNOHANG) == pid;
    if (!ended) std::this_thread::sleep_for(milliseconds(20));
  }
  if (!ended) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  *log = ReadFile(path);
  std::remove(path);
  return status;
}

void ExpectTimerEnds(const std::string& scenario, StatusCode code) {
  std::string log;
  const int status = RunChild(scenario, &log);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << "\n" << log;
  EXPECT_NE(log.find("CALLS 1 CODE " + std::to_string(static_cast<int>(code)) + "\n"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("exiting with status 1"), std::string::npos) << log;
  EXPECT_EQ(log.find("the timer did not end the process"), std::string::npos) << log;
}

TEST(ExitTimer, PeerLossWithOperationsPending) {
  ExpectTimerEnds("loss_pending", StatusCode::kPeerLost);
}

TEST(ExitTimer, PeerLossWhileDraining) { ExpectTimerEnds("loss_draining", StatusCode::kPeerLost); }

TEST(ExitTimer, StallShutdownWithOperationsPending) {
  ExpectTimerEnds("stall_pending", StatusCode::kUnknownError);
}

TEST(ExitTimer, StallShutdownWhileDraining) {
  ExpectTimerEnds("stall_draining", StatusCode::kUnknownError);
}

}  // namespace
}  // namespace testing
}  // namespace hvdc

int main(int argc, char** argv) {
  if (const char* scenario = std::getenv(hvdc::testing::kChildVar)) {
    return hvdc::testing::Child(scenario);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
