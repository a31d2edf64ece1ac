// Negotiation, ordering, fusion, the response cache, join and errors, for world sizes 1..8, with
// ranks as threads (see thread_rank_harness.h). Inputs are f(rank, index); expected values are
// computed from the same formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>

#include "tests/cpp/util/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

float Input(int rank, int64_t i, int tensor) {
  return static_cast<float>((rank + 1) * 3 + i % 17 + tensor);
}

class ThreadRankTest : public ::testing::TestWithParam<int> {};

// Many tensors, issued in a different order on every rank, repeated so the cache path is taken;
// a cache smaller than the tensor count forces evictions.
TEST_P(ThreadRankTest, AllreduceManyTensorsAnyOrderRepeated) {
  const int n = GetParam();
  ThreadWorld world(n, SmallConfig());
  ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
  const std::vector<int64_t> sizes = {0, 1, 7, 100, 511, 600, 1500, 3};
  const int kTensors = 24;
  world.OnAllRanks([&](int r) {
    std::mt19937 rng(1234 + r);
    for (int iter = 0; iter < 4; ++iter) {
      std::vector<std::vector<float>> in(kTensors), out(kTensors);
      std::vector<int> order(kTensors);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<std::future<Status>> done(kTensors);
      for (int t : order) {
        const int64_t count = sizes[t % sizes.size()];
        in[t].resize(count);
        out[t].assign(count, -1.f);
        for (int64_t i = 0; i < count; ++i) in[t][i] = Input(r, i, t);
        std::vector<EnqueueItem> items;
        items.push_back(AllreduceItem("t" + std::to_string(t), in[t].data(), out[t].data(), count));
        done[t] = Submit(world.rt(r), 0, std::move(items));
      }
      for (int t = 0; t < kTensors; ++t) {
        Status s = done[t].get();
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (int64_t i = 0; i < static_cast<int64_t>(out[t].size()); ++i) {
          float expect = 0;
          for (int q = 0; q < n; ++q) expect += Input(q, i, t);
          ASSERT_EQ(out[t][i], expect) << "tensor " << t << " index " << i << " iter " << iter;
        }
      }
    }
  });
}

TEST_P(ThreadRankTest, AverageWithScaleFactorsInPlace) {
  const int n = GetParam();
  ThreadWorld world(n, SmallConfig());
  world.OnAllRanks([&](int r) {
    for (int64_t count : {int64_t{5}, int64_t{2000}}) {
      std::vector<float> buf(count);
      for (int64_t i = 0; i < count; ++i) buf[i] = Input(r, i, 0);
      std::vector<EnqueueItem> items;
      items.push_back(AllreduceItem("avg" + std::to_string(count), buf.data(), buf.data(), count,
                                    ReduceOp::kAverage, 2.0, 0.5));
      Status s = Submit(world.rt(r), 0, std::move(items)).get();
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int64_t i = 0; i < count; ++i) {
        double sum = 0;
        for (int q = 0; q < n; ++q) sum += Input(q, i, 0);
        EXPECT_FLOAT_EQ(buf[i], static_cast<float>(sum * 2.0 * 0.5 / n));
      }
    }
  });
}

TEST_P(ThreadRankTest, GroupedAllreduceCompletesOnce) {
  const int n = GetParam();
  ThreadWorld world(n, SmallConfig());
  world.OnAllRanks([&](int r) {
    const int kMembers = 5;
    std::vector<std::vector<float>> in(kMembers), out(kMembers);
    std::vector<EnqueueItem> items;
    for (int m = 0; m < kMembers; ++m) {
      in[m].assign(10 + m * 300, static_cast<float>(r + m));
      out[m].assign(in[m].size(), 0.f);
      items.push_back(AllreduceItem("g_" + std::to_string(m), in[m].data(), out[m].data(),
                                    static_cast<int64_t>(in[m].size())));
    }
    std::atomic<int> calls{0};
    std::promise<Status> p;
    Status s = world.rt(r).Enqueue(0, std::move(items), [&](const Status& st) {
      calls++;
      p.set_value(st);
    });
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(p.get_future().get().ok());
    EXPECT_EQ(calls.load(), 1);
    for (int m = 0; m < kMembers; ++m) {
      float expect = 0;
      for (int q = 0; q < n; ++q) expect += static_cast<float>(q + m);
      EXPECT_EQ(out[m].front(), expect);
      EXPECT_EQ(out[m].back(), expect);
    }
  });
}

TEST_P(ThreadRankTest, ShapeMismatchIsAnErrorAndTheRuntimeGoesOn) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  ThreadWorld world(n, SmallConfig());
  world.OnAllRanks([&](int r) {
    const int64_t count = r == 1 ? 4 : 3;
    std::vector<float> buf(count, 1.f);
    std::vector<EnqueueItem> items;
    items.push_back(AllreduceItem("bad", buf.data(), buf.data(), count));
    Status s = Submit(world.rt(r), 0, std::move(items)).get();
    EXPECT_EQ(s.code(), StatusCode::kPreconditionError);
    EXPECT_NE(s.message().find("'bad'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("[4]"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
    // Same name, now consistent: works.
    std::vector<float> ok(3, 1.f);
    std::vector<EnqueueItem> again;
    again.push_back(AllreduceItem("bad", ok.data(), ok.data(), 3));
    s = Submit(world.rt(r), 0, std::move(again)).get();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(ok[0], static_cast<float>(n));
  });
}

TEST_P(ThreadRankTest, ShapeChangeOfACachedTensorRenegotiates) {
  const int n = GetParam();
  ThreadWorld world(n, SmallConfig());
  world.OnAllRanks([&](int r) {
    for (int64_t count : {int64_t{3}, int64_t{3}, int64_t{9}, int64_t{9}, int64_t{3}}) {
      std::vector<float> buf(count, static_cast<float>(r));
      std::vector<EnqueueItem> items;
      items.push_back(AllreduceItem("x", buf.data(), buf.data(), count));
      Status s = Submit(world.rt(r), 0, std::move(items)).get();
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(buf.back(), static_cast<float>(n * (n - 1) / 2));
    }
  });
}

TEST_P(ThreadRankTest, DuplicateInFlightNameIsRejected) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "with one rank the first tensor may complete before the second try";
  ThreadWorld world(n, SmallConfig());
  std::promise<void> tried;
  std::shared_future<void> tried_future = tried.get_future().share();
  world.OnAllRanks([&](int r) {
    std::vector<float> a(4, 1.f), b(4, 1.f);
    std::vector<EnqueueItem> first, second;
    first.push_back(AllreduceItem("dup", a.data(), a.data(), 4));
    second.push_back(AllreduceItem("dup", b.data(), b.data(), 4));
    // Rank 0's "dup" cannot complete before the others submit theirs, after its second try.
    if (r != 0) tried_future.wait();
    auto f = Submit(world.rt(r), 0, std::move(first));
    if (r == 0) {
      Status s = world.rt(r).Enqueue(0, std::move(second), [](const Status&) { FAIL(); });
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("'dup'"), std::string::npos) << s.message();
      tried.set_value();
    }
    EXPECT_TRUE(f.get().ok());
    EXPECT_EQ(a[0], static_cast<float>(n));
  });
}

TEST_P(ThreadRankTest, JoinedRankContributesZeros) {
  const int n = GetParam();
  ThreadWorld world(n, SmallConfig());
  world.OnAllRanks([&](int r) {
    // Rank 0 joins at once; the others run three allreduces, then join.
    const int live_steps = r == 0 ? 0 : 3;
    for (int step = 0; step < live_steps; ++step) {
      std::vector<float> buf(50, static_cast<float>(r));
      std::vector<EnqueueItem> items;
      items.push_back(AllreduceItem("step" + std::to_string(step), buf.data(), buf.data(), 50));
      Status s = Submit(world.rt(r), 0, std::move(items)).get();
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(buf[7], static_cast<float>(n * (n - 1) / 2));  // rank 0 adds 0 either way
    }
    int32_t last = -7;
    EnqueueItem join;
    join.request.op = OpType::kJoin;
    join.join_last_rank = &last;
    std::vector<EnqueueItem> items;
    items.push_back(std::move(join));
    Status s = Submit(world.rt(r), 0, std::move(items)).get();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_GE(last, 0);
    EXPECT_LT(last, n);
    if (n > 1) {
      EXPECT_NE(last, 0);  // rank 0 joined first
    }
  });
}

TEST_P(ThreadRankTest, OtherCollectives) {
  const int n = GetParam();
  ThreadWorld world(n, SmallConfig());
  world.OnAllRanks([&](int r) {
    // allgather: rank r contributes r+1 rows of 3.
    std::vector<int32_t> in((r + 1) * 3);
    for (size_t i = 0; i < in.size(); ++i) in[i] = r * 100 + static_cast<int32_t>(i);
    std::vector<int32_t> out;
    Shape out_shape;
    EnqueueItem g;
    g.request.op = OpType::kAllgather;
    g.request.dtype = DataType::kInt32;
    g.request.name = "gather";
    g.request.shape = {r + 1, 3};
    g.input = in.data();
    g.allocate = [&](const Shape& s) {
      out_shape = s;
      out.resize(NumElements(s));
      return static_cast<void*>(out.data());
    };
    std::vector<EnqueueItem> items;
    items.push_back(std::move(g));
    ASSERT_TRUE(Submit(world.rt(r), 0, std::move(items)).get().ok());
    ASSERT_EQ(out_shape, (Shape{n * (n + 1) / 2, 3}));
    size_t pos = 0;
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < (q + 1) * 3; ++i) ASSERT_EQ(out[pos++], q * 100 + i);
    }
    // broadcast from the last rank.
    std::vector<double> b(6, r);
    EnqueueItem bc;
    bc.request.op = OpType::kBroadcast;
    bc.request.dtype = DataType::kFloat64;
    bc.request.name = "bcast";
    bc.request.shape = {6};
    bc.request.root_rank = n - 1;
    bc.input = b.data();
    bc.output = b.data();
    items.clear();
    items.push_back(std::move(bc));
    ASSERT_TRUE(Submit(world.rt(r), 0, std::move(items)).get().ok());
    EXPECT_EQ(b[5], n - 1);
    // reducescatter of 2n+1 rows of 2: ranks r < (2n+1) % n get an extra row.
    const int rows = 2 * n + 1;
    std::vector<float> rs(rows * 2);
    for (size_t i = 0; i < rs.size(); ++i) rs[i] = static_cast<float>(i + r);
    std::vector<float> mine;
    EnqueueItem sc;
    sc.request.op = OpType::kReducescatter;
    sc.request.dtype = DataType::kFloat32;
    sc.request.name = "rs";
    sc.request.shape = {rows, 2};
    sc.request.reduce_op = ReduceOp::kSum;
    sc.input = rs.data();
    Shape mine_shape;
    sc.allocate = [&](const Shape& s) {
      mine_shape = s;
      mine.resize(NumElements(s));
      return static_cast<void*>(mine.data());
    };
    items.clear();
    items.push_back(std::move(sc));
    ASSERT_TRUE(Submit(world.rt(r), 0, std::move(items)).get().ok());
    const int my_rows = rows / n + (r < rows % n ? 1 : 0);
    ASSERT_EQ(mine_shape, (Shape{my_rows, 2}));
    int first_row = 0;
    for (int q = 0; q < r; ++q) first_row += rows / n + (q < rows % n ? 1 : 0);
    for (int i = 0; i < my_rows * 2; ++i) {
      float expect = 0;
      for (int q = 0; q < n; ++q) expect += static_cast<float>(first_row * 2 + i + q);
      ASSERT_EQ(mine[i], expect);
    }
    // alltoall: rank r sends q+1 rows to rank q.
    std::vector<int32_t> splits(n);
    int total = 0;
    for (int q = 0; q < n; ++q) total += (splits[q] = q + 1);
    std::vector<int64_t> a2a(total);
    for (int i = 0; i < total; ++i) a2a[i] = r * 1000 + i;
    std::vector<int64_t> recv;
    std::vector<int32_t> recv_splits(n, -1);
    EnqueueItem at;
    at.request.op = OpType::kAlltoall;
    at.request.dtype = DataType::kInt64;
    at.request.name = "a2a";
    at.request.shape = {total};
    at.request.splits = splits;
    at.input = a2a.data();
    at.received_splits = recv_splits.data();
    at.allocate = [&](const Shape& s) {
      recv.resize(NumElements(s));
      return static_cast<void*>(recv.data());
    };
    items.clear();
    items.push_back(std::move(at));
    ASSERT_TRUE(Submit(world.rt(r), 0, std::move(items)).get().ok());
    ASSERT_EQ(static_cast<int>(recv.size()), n * (r + 1));
    int offset_in_sender = 0;
    for (int q = 0; q < r; ++q) offset_in_sender += q + 1;
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(recv_splits[q], r + 1);
      for (int i = 0; i <= r; ++i)
        EXPECT_EQ(recv[q * (r + 1) + i], q * 1000 + offset_in_sender + i);
    }
  });
}

TEST_P(ThreadRankTest, OverlappingProcessSetsRunConcurrently) {
  const int n = GetParam();
  if (n < 3) GTEST_SKIP() << "overlapping sets need three ranks";
  ThreadWorld world(n, SmallConfig(), {{0, 1}, {1, 2}});
  ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
  world.OnAllRanks([&](int r) {
    std::vector<std::future<Status>> done;
    std::vector<std::vector<float>> bufs;
    bufs.reserve(3);
    for (int set = 0; set < 3; ++set) {
      const bool member = set == 0 || (set == 1 && r <= 1) || (set == 2 && (r == 1 || r == 2));
      if (!member) continue;
      bufs.emplace_back(100, static_cast<float>(r + 1));
      std::vector<EnqueueItem> items;
      items.push_back(AllreduceItem("ps", bufs.back().data(), bufs.back().data(), 100));
      done.push_back(Submit(world.rt(r), set, std::move(items)));
    }
    for (auto& f : done) ASSERT_TRUE(f.get().ok());
    EXPECT_EQ(bufs[0][0], static_cast<float>(n * (n + 1) / 2));
    if (r <= 2 && bufs.size() > 1) {
      const float set1 = 1 + 2, set2 = 2 + 3;
      if (r == 0) {
        EXPECT_EQ(bufs[1][0], set1);
      } else if (r == 1) {
        EXPECT_EQ(bufs[1][0], set1);
        EXPECT_EQ(bufs[2][0], set2);
      } else {
        EXPECT_EQ(bufs[1][0], set2);
      }
    }
    // A rank outside a set is refused at enqueue.
    if (r == 0) {
      std::vector<float> x(1);
      std::vector<EnqueueItem> items;
      items.push_back(AllreduceItem("outside", x.data(), x.data(), 1));
      EXPECT_EQ(world.rt(r).Enqueue(2, std::move(items), [](const Status&) {}).code(),
                StatusCode::kInvalidArgument);
    }
  });
}

TEST_P(ThreadRankTest, PendingCallbacksFailExactlyOnceAtShutdown) {
  const int n = GetParam();
  ThreadWorld world(n, SmallConfig());
  std::atomic<int> calls{0};
  std::atomic<int> errors{0};
  std::vector<float> buf(8, 1.f);
  {
    std::vector<EnqueueItem> items;
    items.push_back(AllreduceItem("only_rank0", buf.data(), buf.data(), 8));
    Status s = world.rt(0).Enqueue(0, std::move(items), [&](const Status& st) {
      calls++;
      if (st.code() == StatusCode::kUnknownError) errors++;
    });
    ASSERT_TRUE(s.ok());
  }
  world.Shutdown();
  EXPECT_EQ(calls.load(), n == 1 ? 1 : 1);
  EXPECT_EQ(errors.load(), n == 1 ? 0 : 1);  // on one rank it simply completes
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadRankTest, ::testing::Values(1, 2, 3, 4, 7, 8),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

}  // namespace
}  // namespace testing
}  // namespace hvdc
