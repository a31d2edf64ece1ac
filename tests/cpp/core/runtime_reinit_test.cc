// A Runtime's life ends at Down and a new one starts in the same process (what elastic training's
// shutdown() + init() does): three cycles of start, checked collectives, shutdown -- over the
// in-memory world (ranks as threads) and over the TCP transport on loopback (ranks as threads, the
// same fixed ports every cycle). After each shutdown the runtime is Down, refuses work with the
// shut-down error, and every thread it started is gone; the next runtime computes correct results.
#include <dirent.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime.h"
#include "local_controller/local_world.h"
#include "ops/cpu/host_backend.h"
#include "tcp_controller/tcp_transport.h"
#include "tests/cpp/util/tcp_test_util.h"
#include "tests/cpp/util/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

constexpr int kCycles = 3;

// Threads of this process (the kernel's count).
int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

// The count to come back to. A sanitizer starts a thread of its own with the process's second
// one: start (and join) a thread first, so that it is counted here.
int Baseline() {
  std::thread([] {}).join();
  return ThreadCount();
}

// Waits (bounded) for the thread count to come back to `baseline`: the threads a shut-down
// runtime joined are gone at once, but the harness's own helper threads end just after they
// report.
bool BackTo(int baseline) {
  for (int i = 0; i < 1000; ++i) {
    if (ThreadCount() <= baseline) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ThreadCount() <= baseline;
}

// Rank r's element i in cycle c: distinct per rank, index and cycle, exact in float.
float Value(int c, int r, int64_t i) { return static_cast<float>(100 * c + 10 * r + i % 7); }

// Allreduces (sum) and broadcasts a few tensors -- small, fused, and above the fusion threshold --
// on every rank of `rts` and checks each element against its closed form.
void CheckCollectives(const std::vector<Runtime*>& rts, int cycle) {
  const int n = static_cast<int>(rts.size());
  tcp_test::RunRanks(n, [&](int r) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{3000}}) {
      std::vector<float> in(count), out(count, -1.f), bc(count);
      for (int64_t i = 0; i < count; ++i) {
        in[i] = Value(cycle, r, i);
        bc[i] = r == 1 % n ? Value(cycle, r, i) : 0.f;
      }
      const std::string name = "c" + std::to_string(cycle) + "." + std::to_string(count);
      auto sum = Submit(*rts[r], 0, One(AllreduceItem(name, in.data(), out.data(), count)));
      auto cast = Submit(*rts[r], 0, One(BroadcastItem(name + ".bc", bc.data(), count, 1 % n)));
      ASSERT_TRUE(ReadyWithin(sum)) << "rank " << r << " allreduce of " << count;
      ASSERT_TRUE(ReadyWithin(cast)) << "rank " << r << " broadcast of " << count;
      Status s = sum.get();
      ASSERT_TRUE(s.ok()) << s.ToString();
      s = cast.get();
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int64_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int k = 0; k < n; ++k) expected += Value(cycle, k, i);
        ASSERT_EQ(out[i], expected) << "rank " << r << " element " << i;
        ASSERT_EQ(bc[i], Value(cycle, 1 % n, i)) << "rank " << r << " element " << i;
      }
    }
  });
}

// After Shutdown(): Down, and enqueue refuses with the shut-down error (no callback runs).
void CheckDown(Runtime& rt) {
  EXPECT_EQ(rt.phase(), Phase::kDown);
  float x = 1;
  bool called = false;
  Status s = rt.Enqueue(0, One(AllreduceItem("after", &x, &x, 1)),
                        [&called](const Status&) { called = true; });
  EXPECT_EQ(s.code(), StatusCode::kUnknownError) << s.ToString();
  EXPECT_NE(s.message().find("shut down"), std::string::npos) << s.message();
  EXPECT_FALSE(called);
  EXPECT_TRUE(rt.Shutdown().ok());  // again: harmless
}

// One cycle: `make(r, &transport)` builds rank r's transport; start, check, shut down, check.
void Cycle(int n, int cycle, const std::function<Status(int, std::unique_ptr<Transport>*)>& make) {
  auto backend = MakeHostBackend();
  std::vector<std::unique_ptr<Runtime>> rts(n);
  tcp_test::RunRanks(n, [&](int r) {
    std::unique_ptr<Transport> t;
    Status s = make(r, &t);
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = Runtime::Create(SmallConfig(), std::move(t), {backend.get()}, {}, &rts[r]);
    ASSERT_TRUE(s.ok()) << s.ToString();
  });
  std::vector<Runtime*> raw;
  for (auto& rt : rts) {
    ASSERT_NE(rt, nullptr);
    EXPECT_EQ(rt->phase(), Phase::kRunning);
    raw.push_back(rt.get());
  }
  CheckCollectives(raw, cycle);
  tcp_test::RunRanks(n, [&](int r) { EXPECT_TRUE(rts[r]->Shutdown().ok()); });
  for (auto& rt : rts) CheckDown(*rt);
}

TEST(RuntimeReinit, InMemoryWorldThreeCycles) {
  const int baseline = Baseline();
  for (int n : {1, 3}) {
    for (int cycle = 0; cycle < kCycles; ++cycle) {
      SCOPED_TRACE("size " + std::to_string(n) + " cycle " + std::to_string(cycle));
      auto world = LocalWorld::Create(n);
      Cycle(n, cycle, [&](int r, std::unique_ptr<Transport>* t) {
        *t = MakeLocalTransport(world, r);
        return Status::OK();
      });
      EXPECT_TRUE(BackTo(baseline)) << ThreadCount() << " threads, " << baseline << " before";
    }
  }
}

TEST(RuntimeReinit, TcpLoopbackThreeCyclesOnTheSamePorts) {
  const int n = 3;
  const std::vector<std::string> peers = tcp_test::FreeLoopbackPeers(n);
  std::string list;
  for (const auto& p : peers) list += (list.empty() ? "" : ",") + p;
  const int baseline = Baseline();
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    Cycle(n, cycle, [&](int r, std::unique_ptr<Transport>* t) {
      Config c = SmallConfig();
      c.tcp_peers = list;
      c.gloo.rank = r;
      c.gloo.size = n;
      c.secret_key = "reinit test";
      c.gloo_timeout_s = 60;
      return MakeTcpTransport(c, t);
    });
    EXPECT_TRUE(BackTo(baseline)) << ThreadCount() << " threads, " << baseline << " before";
  }
}

// A tensor only one rank submitted is pending at shutdown: its callback fails exactly once with
// the shut-down error, and the next runtime is unaffected (its own tensor of the same name
// completes).
TEST(RuntimeReinit, PendingAtShutdownFailsOnceAndTheNextRuntimeIsClean) {
  const int n = 2;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    ThreadWorld world(n, SmallConfig());
    ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
    float x = 1, y = 0;
    std::atomic<int> calls{0};
    auto promise = std::make_shared<std::promise<Status>>();
    auto done = promise->get_future();
    Status s = world.rt(0).Enqueue(0, One(AllreduceItem("lonely", &x, &y, 1)),
                                   [&calls, promise](const Status& st) {
                                     if (calls.fetch_add(1) == 0) promise->set_value(st);
                                   });
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(world.Shutdown());
    ASSERT_EQ(done.wait_for(kWait), std::future_status::ready);
    Status got = done.get();
    EXPECT_EQ(got.code(), StatusCode::kUnknownError) << got.ToString();
    EXPECT_EQ(calls.load(), 1);
    // The next world (next cycle) submits the name on every rank; it must simply work.
    ThreadWorld next(n, SmallConfig());
    ASSERT_TRUE(next.init_status().ok());
    std::vector<float> in(n), out(n);
    next.OnAllRanks([&](int r) {
      in[r] = static_cast<float>(r + 1);
      auto f = Submit(next.rt(r), 0, One(AllreduceItem("lonely", &in[r], &out[r], 1)));
      ASSERT_TRUE(ReadyWithin(f));
      EXPECT_TRUE(f.get().ok());
      EXPECT_EQ(out[r], static_cast<float>(n * (n + 1) / 2));
    });
    EXPECT_EQ(calls.load(), 1);
  }
}

}  // namespace
}  // namespace testing
}  // namespace hvdc
