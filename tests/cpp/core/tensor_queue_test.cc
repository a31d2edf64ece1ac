// TensorQueue: the hand-off from enqueuing threads to the control thread. Push is all-or-nothing
// and refuses a name already in flight (until Release), Drain hands over everything pushed in
// order, Close refuses every later Push with the given status. Claim marks names in flight without
// queueing them (a one-member set's inline run) under the same rules. One test pushes from several
// threads at once (it runs under TSan with the thread-rank suites).
#include "core/tensor_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/cpp/util/test_entries.h"

namespace hvdc {
namespace {

std::vector<std::shared_ptr<TensorEntry>> Entries(const std::vector<std::string>& names) {
  std::vector<std::shared_ptr<TensorEntry>> v;
  for (const auto& n : names) v.push_back(Entry(n));
  return v;
}

std::vector<std::string> Names(const std::vector<std::shared_ptr<TensorEntry>>& entries) {
  std::vector<std::string> v;
  for (const auto& e : entries) v.push_back(e->request.name);
  return v;
}

TEST(TensorQueue, EmptyQueueDrainsNothing) {
  TensorQueue q;
  EXPECT_EQ(q.pending(), 0u);
  EXPECT_TRUE(q.Drain().empty());
  EXPECT_TRUE(q.Push({}).ok()) << "an empty push adds nothing";
  EXPECT_EQ(q.pending(), 0u);
}

TEST(TensorQueue, DrainReturnsEverythingPushedInOrder) {
  TensorQueue q;
  std::vector<std::string> want;
  for (int push = 0; push < 4; ++push) {
    std::vector<std::string> names;
    for (int i = 0; i <= push; ++i)
      names.push_back("p" + std::to_string(push) + "_" + std::to_string(i));
    ASSERT_TRUE(q.Push(Entries(names)).ok());
    want.insert(want.end(), names.begin(), names.end());
    EXPECT_EQ(q.pending(), want.size());
  }
  EXPECT_EQ(Names(q.Drain()), want);
  EXPECT_EQ(q.pending(), 0u);
  EXPECT_TRUE(q.Drain().empty()) << "drained entries are handed over once";
}

TEST(TensorQueue, ClaimMarksNamesInFlightWithoutQueueing) {
  TensorQueue q;
  ASSERT_TRUE(q.Claim(Entries({"a", "b"})).ok());
  EXPECT_EQ(q.pending(), 0u) << "claimed entries are not queued";
  EXPECT_TRUE(q.Drain().empty());
  EXPECT_EQ(q.Push(Entries({"a"})).code(), StatusCode::kInvalidArgument) << "a is in flight";
  EXPECT_EQ(q.Claim(Entries({"c", "b"})).code(), StatusCode::kInvalidArgument) << "b is in flight";
  EXPECT_TRUE(q.Push(Entries({"c"})).ok()) << "the refused claim took no name";
  EXPECT_EQ(q.Claim(Entries({"d", "d"})).code(), StatusCode::kInvalidArgument)
      << "a duplicate within one claim";
  q.Release("a");
  EXPECT_TRUE(q.Claim(Entries({"a"})).ok()) << "released names may be claimed again";
  q.Close(Status::UnknownError("closing"));
  const Status closed = q.Claim(Entries({"e"}));
  EXPECT_EQ(closed.code(), StatusCode::kUnknownError);
  EXPECT_EQ(closed.message(), "closing");
}

TEST(TensorQueue, ANameInFlightIsRefusedUntilReleased) {
  TensorQueue q;
  ASSERT_TRUE(q.Push(Entries({"x"})).ok());
  Status s = q.Push(Entries({"x"}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  EXPECT_EQ(q.pending(), 1u);
  q.Drain();
  EXPECT_EQ(q.Push(Entries({"x"})).code(), StatusCode::kInvalidArgument)
      << "drained is not completed: the name stays in flight";
  q.Release("x");
  EXPECT_TRUE(q.Push(Entries({"x"})).ok());
  q.Release("never_pushed");  // harmless
  EXPECT_EQ(q.pending(), 1u);
}

// The queue holds what it needs to know a name is in flight: long names (not stored inline in
// the string) stay refused after every other reference to their entries is gone.
TEST(TensorQueue, ANameStaysInFlightAfterItsEntryIsDropped) {
  TensorQueue q;
  const std::string a(100, 'a'), b(100, 'b');
  ASSERT_TRUE(q.Push(Entries({a, b})).ok());
  q.Drain();  // the entries' last outside references go here
  EXPECT_EQ(q.Push(Entries({a})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.Push(Entries({b})).code(), StatusCode::kInvalidArgument);
  q.Release(a);
  EXPECT_TRUE(q.Push(Entries({a})).ok());
  EXPECT_EQ(q.Push(Entries({b})).code(), StatusCode::kInvalidArgument);
}

// A completed batch releases all its names at once; a joined rank's empty items are skipped.
TEST(TensorQueue, ABatchReleasesEveryNameOfItsItems) {
  TensorQueue q;
  auto entries = Entries({"p", "q", "r"});
  ASSERT_TRUE(q.Push(entries).ok());
  std::vector<BatchItem> items;
  for (auto& e : q.Drain()) items.push_back(BatchItem{std::make_shared<Response>(), e});
  items.push_back(BatchItem{std::make_shared<Response>(), nullptr});
  ASSERT_EQ(items.size(), 4u);
  items.erase(items.begin() + 1);  // "q" is not in this batch: it stays in flight
  q.Release(items);
  EXPECT_TRUE(q.Push(Entries({"p", "r"})).ok());
  EXPECT_EQ(q.Push(Entries({"q"})).code(), StatusCode::kInvalidArgument);
}

// A group is all-or-nothing: a duplicate within it, or one member already in flight, adds none.
TEST(TensorQueue, AGroupWithADuplicateAddsNothing) {
  TensorQueue q;
  EXPECT_EQ(q.Push(Entries({"a", "b", "a"})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.pending(), 0u);
  EXPECT_TRUE(q.Push(Entries({"a", "b"})).ok()) << "a refused group leaves nothing in flight";
  EXPECT_EQ(q.Push(Entries({"c", "d", "b"})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.pending(), 2u);
  EXPECT_TRUE(q.Push(Entries({"c", "d"})).ok()) << "c and d were not left in flight";
  EXPECT_EQ(Names(q.Drain()), (std::vector<std::string>{"a", "b", "c", "d"}));
}

// Large groups are checked with a set instead of pairwise: the same answers.
TEST(TensorQueue, ALargeGroupWithADuplicateAddsNothing) {
  TensorQueue q;
  std::vector<std::string> names;
  for (int i = 0; i < 100; ++i) names.push_back("g" + std::to_string(i));
  std::vector<std::string> with_dup = names;
  with_dup.push_back("g37");
  EXPECT_EQ(q.Push(Entries(with_dup)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.Claim(Entries(with_dup)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.pending(), 0u);
  ASSERT_TRUE(q.Push(Entries(names)).ok()) << "a refused group leaves nothing in flight";
  EXPECT_EQ(q.Push(Entries({"x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10",
                            "x11", "x12", "x13", "x14", "x15", "x16", "g99"}))
                .code(),
            StatusCode::kInvalidArgument)
      << "a member already in flight";
  EXPECT_EQ(Names(q.Drain()), names);
}

TEST(TensorQueue, CloseRefusesLaterPushesWithItsStatus) {
  TensorQueue q;
  ASSERT_TRUE(q.Push(Entries({"before"})).ok());
  q.Close(Status::Aborted("shutting down"));
  Status s = q.Push(Entries({"after"}));
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_EQ(s.message(), "shutting down");
  q.Release("before");
  EXPECT_EQ(q.Push(Entries({"before"})).code(), StatusCode::kAborted) << "closed for good";
  EXPECT_EQ(Names(q.Drain()), std::vector<std::string>{"before"})
      << "what was pushed before Close is still handed over";
}

// Pushes from several threads while one thread drains and releases: every entry arrives exactly
// once, and a name is never in flight twice.
TEST(TensorQueue, ConcurrentPushesArriveExactlyOnce) {
  TensorQueue q;
  const int threads = 4, per_thread = 200;
  std::atomic<int> pushers_done{0};
  std::vector<std::thread> pushers;
  for (int t = 0; t < threads; ++t) {
    pushers.emplace_back([&q, &pushers_done, t] {
      for (int i = 0; i < per_thread; ++i) {
        EXPECT_TRUE(q.Push(Entries({"t" + std::to_string(t) + "_" + std::to_string(i)})).ok());
      }
      pushers_done++;
    });
  }
  std::multiset<std::string> seen;
  std::thread drainer([&] {
    for (;;) {
      const bool last = pushers_done.load() == threads;  // read before the drain
      for (const auto& e : q.Drain()) {
        seen.insert(e->request.name);
        q.Release(e->request.name);
      }
      if (last) break;
      std::this_thread::yield();
    }
  });
  for (auto& p : pushers) p.join();
  drainer.join();
  EXPECT_EQ(q.pending(), 0u);
  ASSERT_EQ(seen.size(), static_cast<size_t>(threads * per_thread));
  for (int t = 0; t < threads; ++t) {
    for (int i = 0; i < per_thread; ++i) {
      EXPECT_EQ(seen.count("t" + std::to_string(t) + "_" + std::to_string(i)), 1u);
    }
  }
}

}  // namespace
}  // namespace hvdc
