// ResponseCache: capacity 0, 1 and N; least-recently-used eviction (Put and Touch order); Put,
// Get, Find and Erase; which responses are never cached; the contents hash every rank compares; and
// growth when a cyclic working set is larger than the cache.
#include "core/response_cache.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace hvdc {
namespace {

Response Resp(const std::string& name, Shape shape = {4}) {
  Response r;
  r.op = OpType::kAllreduce;
  r.name = name;
  r.shape = std::move(shape);
  return r;
}

// The request a rank sends for a cached response.
Request ReqFor(const Response& p) {
  Request q;
  q.op = p.op;
  q.dtype = p.dtype;
  q.name = p.name;
  q.shape = p.shape;
  q.device = p.device;
  q.root_rank = p.root_rank;
  q.reduce_op = p.reduce_op;
  q.prescale = p.prescale;
  q.postscale = p.postscale;
  q.group_size = p.group_size;
  q.group = p.group;
  return q;
}

ResponseCache::Lookup Find(const ResponseCache& c, const Request& q, uint32_t* bit = nullptr,
                           int set_rank = 0) {
  uint32_t b = 0;
  auto result = c.Find(q, set_rank, &b);
  if (bit) *bit = b;
  return result;
}

bool Cached(const ResponseCache& c, const std::string& name) {
  return Find(c, ReqFor(Resp(name))) == ResponseCache::Lookup::kHit;
}

TEST(ResponseCache, WordsCoverTheCapacity) {
  for (int64_t cap : {0, 1, 63, 64, 65, 128, 1000}) {
    ResponseCache c(cap);
    EXPECT_EQ(c.capacity(), cap);
    EXPECT_EQ(c.words(), static_cast<size_t>((cap + 63) / 64)) << cap;
  }
}

TEST(ResponseCache, CapacityZeroCachesNothing) {
  ResponseCache c(0);
  const uint64_t empty_hash = c.hash();
  c.Put(Resp("a"));
  EXPECT_FALSE(Cached(c, "a"));
  EXPECT_FALSE(c.Has(0));
  EXPECT_EQ(c.hash(), empty_hash);
}

TEST(ResponseCache, CapacityOneKeepsTheNewest) {
  ResponseCache c(1);
  c.Put(Resp("a"));
  uint32_t bit = 99;
  ASSERT_EQ(Find(c, ReqFor(Resp("a")), &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(bit, 0u);
  c.Put(Resp("b"));
  EXPECT_FALSE(Cached(c, "a"));
  ASSERT_EQ(Find(c, ReqFor(Resp("b")), &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(bit, 0u);
  EXPECT_EQ(c.Get(0).name, "b");
}

TEST(ResponseCache, CapacityNGivesDistinctBitsBelowN) {
  for (int64_t n : {2, 5, 64, 70}) {
    ResponseCache c(n);
    std::set<uint32_t> bits;
    for (int64_t i = 0; i < n; ++i) {
      const Response r = Resp("t" + std::to_string(i), {i + 1});
      c.Put(r);
      uint32_t bit = 0;
      ASSERT_EQ(Find(c, ReqFor(r), &bit), ResponseCache::Lookup::kHit);
      EXPECT_LT(bit, static_cast<uint32_t>(n));
      EXPECT_TRUE(c.Has(bit));
      EXPECT_EQ(c.Get(bit).shape, r.shape);
      bits.insert(bit);
    }
    EXPECT_EQ(bits.size(), static_cast<size_t>(n));
    EXPECT_FALSE(c.Has(static_cast<uint32_t>(n)));
  }
}

// Filling a cache of N and putting M more evicts the M least recently put, oldest first.
TEST(ResponseCache, EvictsInLeastRecentlyUsedOrder) {
  const int n = 4;
  for (int extra = 1; extra <= n + 1; ++extra) {
    ResponseCache c(n);
    for (int i = 0; i < n + extra; ++i) c.Put(Resp("t" + std::to_string(i)));
    for (int i = 0; i < n + extra; ++i) {
      EXPECT_EQ(Cached(c, "t" + std::to_string(i)), i >= extra) << "extra " << extra << " t" << i;
    }
  }
}

// Touch makes an entry the most recently used: the next eviction takes the next oldest.
TEST(ResponseCache, TouchProtectsFromEviction) {
  const int n = 4;
  ResponseCache c(n);
  std::vector<uint32_t> bit(n);
  for (int i = 0; i < n; ++i) {
    c.Put(Resp("t" + std::to_string(i)));
    Find(c, ReqFor(Resp("t" + std::to_string(i))), &bit[i]);
  }
  c.Touch(bit[0]);  // order, oldest first: t1 t2 t3 t0
  c.Touch(bit[2]);  // t1 t3 t0 t2
  c.Put(Resp("x"));
  EXPECT_FALSE(Cached(c, "t1"));
  c.Put(Resp("y"));
  EXPECT_FALSE(Cached(c, "t3"));
  for (const char* kept : {"t0", "t2", "x", "y"}) EXPECT_TRUE(Cached(c, kept)) << kept;
  c.Touch(n + 10);  // an unused bit: ignored
}

TEST(ResponseCache, PutOfACachedNameReplacesIt) {
  ResponseCache c(2);
  c.Put(Resp("a", {4}));
  c.Put(Resp("b", {4}));
  c.Put(Resp("a", {8}));  // replaces a, evicts nothing
  EXPECT_TRUE(Cached(c, "b"));
  EXPECT_EQ(Find(c, ReqFor(Resp("a", {8}))), ResponseCache::Lookup::kHit);
  EXPECT_EQ(Find(c, ReqFor(Resp("a", {4}))), ResponseCache::Lookup::kMismatch);
  // The replaced a is now the most recent: the next Put evicts b.
  c.Put(Resp("c"));
  EXPECT_FALSE(Cached(c, "b"));
  EXPECT_EQ(Find(c, ReqFor(Resp("a", {8}))), ResponseCache::Lookup::kHit);
}

TEST(ResponseCache, EraseFreesTheBitForTheNextPut) {
  ResponseCache c(3);
  for (const char* name : {"a", "b", "c"}) c.Put(Resp(name));
  uint32_t b_bit = 0;
  ASSERT_EQ(Find(c, ReqFor(Resp("b")), &b_bit), ResponseCache::Lookup::kHit);
  c.Erase(b_bit);
  EXPECT_FALSE(c.Has(b_bit));
  EXPECT_EQ(Find(c, ReqFor(Resp("b"))), ResponseCache::Lookup::kMiss);
  c.Erase(b_bit);    // twice: no effect
  c.Put(Resp("d"));  // a free slot: nothing is evicted
  uint32_t d_bit = 0;
  ASSERT_EQ(Find(c, ReqFor(Resp("d")), &d_bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(d_bit, b_bit);
  EXPECT_TRUE(Cached(c, "a"));
  EXPECT_TRUE(Cached(c, "c"));
}

// Free bits are reused lowest first, whatever order they were freed in (every rank must pick the
// same bit; the put keeps a lower bound on the first free slot instead of walking the used ones).
TEST(ResponseCache, PutTakesTheLowestFreeBit) {
  ResponseCache c(8);
  for (int i = 0; i < 8; ++i) c.Put(Resp("t" + std::to_string(i)));
  std::vector<uint32_t> bits(8);
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(Find(c, ReqFor(Resp("t" + std::to_string(i))), &bits[i]),
              ResponseCache::Lookup::kHit);
  }
  std::set<uint32_t> freed;
  for (int i : {5, 1, 6}) {
    c.Erase(bits[i]);
    freed.insert(bits[i]);
  }
  for (const char* name : {"x", "y", "z"}) {
    c.Put(Resp(name));
    uint32_t bit = 0;
    ASSERT_EQ(Find(c, ReqFor(Resp(name)), &bit), ResponseCache::Lookup::kHit);
    EXPECT_EQ(bit, *freed.begin()) << name;
    freed.erase(freed.begin());
  }
  for (int i : {0, 2, 3, 4, 7}) EXPECT_TRUE(Cached(c, "t" + std::to_string(i))) << i;
  // Full again: the next put evicts the least recently used (t0) and takes its bit.
  c.Put(Resp("w"));
  uint32_t w_bit = 0;
  ASSERT_EQ(Find(c, ReqFor(Resp("w")), &w_bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(w_bit, bits[0]);
  EXPECT_FALSE(Cached(c, "t0"));
}

// The negotiator trusts a lookup made at the current version(): it must change with every change
// of which name holds which bit, and only then.
TEST(ResponseCache, VersionChangesExactlyWhenABitChangesHands) {
  ResponseCache c(2);
  uint64_t v = c.version();
  c.Put(Resp("a"));
  EXPECT_NE(c.version(), v);
  v = c.version();
  uint32_t a_bit = 0;
  ASSERT_EQ(Find(c, ReqFor(Resp("a")), &a_bit), ResponseCache::Lookup::kHit);
  c.Touch(a_bit);
  EXPECT_EQ(c.version(), v) << "a lookup and a touch change nothing";
  c.Put(Resp("b"));
  EXPECT_NE(c.version(), v);
  v = c.version();
  c.Put(Resp("c"));  // full: evicts the least recently used
  EXPECT_NE(c.version(), v);
  v = c.version();
  c.Erase(a_bit + 100);  // not a used bit: nothing changes
  EXPECT_EQ(c.version(), v);
  uint32_t c_bit = 0;
  ASSERT_EQ(Find(c, ReqFor(Resp("c")), &c_bit), ResponseCache::Lookup::kHit);
  c.Erase(c_bit);
  EXPECT_NE(c.version(), v);
  EXPECT_NE(c.version(), 0u);
}

TEST(ResponseCache, ErrorsJoinAndAlltoallAreNeverCached) {
  ResponseCache c(8);
  Response err = Resp("err");
  err.error_code = StatusCode::kPreconditionError;
  Response join = Resp("join.noname");
  join.op = OpType::kJoin;
  Response a2a = Resp("a2a");
  a2a.op = OpType::kAlltoall;
  for (const Response& r : {err, join, a2a}) {
    c.Put(r);
    EXPECT_EQ(Find(c, ReqFor(r)), ResponseCache::Lookup::kMiss) << r.name;
  }
  EXPECT_EQ(c.hash(), ResponseCache(8).hash());
}

// A request for a cached name with other parameters is a mismatch; one that differs only in the
// GPU ordinal (one GPU per rank) is a hit.
TEST(ResponseCache, FindComparesTheParameters) {
  Response base = Resp("t", {2, 3});
  base.device = 0;
  ResponseCache c(4);
  c.Put(base);
  uint32_t bit = 0;
  ASSERT_EQ(Find(c, ReqFor(base), &bit), ResponseCache::Lookup::kHit);
  const uint32_t want_bit = bit;

  Request other_gpu = ReqFor(base);
  other_gpu.device = 3;
  EXPECT_EQ(Find(c, other_gpu), ResponseCache::Lookup::kHit);

  std::vector<Request> changed(9, ReqFor(base));
  changed[0].op = OpType::kBroadcast;
  changed[1].dtype = DataType::kFloat64;
  changed[2].device = -1;
  changed[3].reduce_op = ReduceOp::kMax;
  changed[4].prescale = 2.0;
  changed[5].postscale = 2.0;
  changed[6].shape = {3, 2};
  changed[7].group_size = 2;
  changed[8].group = "g";
  for (size_t i = 0; i < changed.size(); ++i) {
    bit = 99;
    EXPECT_EQ(Find(c, changed[i], &bit), ResponseCache::Lookup::kMismatch) << i;
    EXPECT_EQ(bit, want_bit) << "a mismatch names the entry to invalidate";
  }
}

TEST(ResponseCache, BroadcastComparesTheRoot) {
  Response b = Resp("b", {4});
  b.op = OpType::kBroadcast;
  b.root_rank = 1;
  ResponseCache c(2);
  c.Put(b);
  Request q = ReqFor(b);
  EXPECT_EQ(Find(c, q), ResponseCache::Lookup::kHit);
  q.root_rank = 0;
  EXPECT_EQ(Find(c, q), ResponseCache::Lookup::kMismatch);
}

// An allgather's first dimension may differ by rank: each rank's request is compared with its own
// first dimension; the trailing dimensions are shared.
TEST(ResponseCache, AllgatherComparesEachRanksFirstDimension) {
  Response g = Resp("g", {2, 5});
  g.op = OpType::kAllgather;
  g.first_dims = {2, 7, 1};
  ResponseCache c(2);
  c.Put(g);
  for (int r = 0; r < 3; ++r) {
    Request q = ReqFor(g);
    q.shape = {g.first_dims[r], 5};
    EXPECT_EQ(Find(c, q, nullptr, r), ResponseCache::Lookup::kHit) << r;
    q.shape = {g.first_dims[r] + 1, 5};
    EXPECT_EQ(Find(c, q, nullptr, r), ResponseCache::Lookup::kMismatch) << r;
    q.shape = {g.first_dims[r], 6};
    EXPECT_EQ(Find(c, q, nullptr, r), ResponseCache::Lookup::kMismatch) << r;
    q.shape = {g.first_dims[r]};
    EXPECT_EQ(Find(c, q, nullptr, r), ResponseCache::Lookup::kMismatch) << r;
  }
  Request q = ReqFor(g);
  EXPECT_EQ(Find(c, q, nullptr, 3), ResponseCache::Lookup::kMismatch) << "a rank beyond the set";
}

// The hash: equal for caches that went through the same Puts, changed by every Put and Erase,
// back to its old value when an entry is erased again.
TEST(ResponseCache, HashTracksTheContents) {
  ResponseCache a(4), b(4);
  EXPECT_EQ(a.hash(), b.hash());
  std::set<uint64_t> seen = {a.hash()};
  for (const char* name : {"w", "x", "y"}) {
    a.Put(Resp(name));
    b.Put(Resp(name));
    EXPECT_EQ(a.hash(), b.hash());
    EXPECT_TRUE(seen.insert(a.hash()).second) << "the hash changed with " << name;
  }
  const uint64_t before = a.hash();
  a.Put(Resp("z"));
  EXPECT_NE(a.hash(), b.hash());
  uint32_t bit = 0;
  ASSERT_EQ(Find(a, ReqFor(Resp("z")), &bit), ResponseCache::Lookup::kHit);
  a.Erase(bit);
  EXPECT_EQ(a.hash(), before);
  EXPECT_EQ(a.hash(), b.hash());
  // Same names at different bits are different contents.
  ResponseCache c(2), d(2);
  c.Put(Resp("p"));
  c.Put(Resp("q"));
  d.Put(Resp("q"));
  d.Put(Resp("p"));
  EXPECT_NE(c.hash(), d.hash());
}

// Capacity growth: a cyclic working set larger than the cache must end up cached (LRU alone would
// miss on every pass), and copies fed the same puts grow identically.

// One pass over n tensors as a step submits them: a hit is touched, a miss is negotiated and put.
int Pass(ResponseCache& cache, int n) {
  int hits = 0;
  for (int i = 0; i < n; ++i) {
    Response r = Resp("t" + std::to_string(i));
    uint32_t bit = 0;
    if (cache.Find(ReqFor(r), 0, &bit) == ResponseCache::Lookup::kHit) {
      cache.Touch(bit);
      ++hits;
    } else {
      cache.Put(r);
    }
  }
  return hits;
}

TEST(ResponseCacheGrowth, CyclicWorkingSetLargerThanTheCacheEndsUpCached) {
  for (int n : {5, 9, 17, 40, 100}) {
    ResponseCache cache(4);
    int last = -1;
    for (int pass = 0; pass < 12; ++pass) last = Pass(cache, n);
    EXPECT_EQ(last, n) << n << " tensors, capacity now " << cache.capacity();
    EXPECT_GE(cache.capacity(), n);
    EXPECT_LT(cache.capacity(), 2 * n + 4) << "grew more than the working set needs";
  }
}

TEST(ResponseCacheGrowth, AWorkingSetThatFitsNeverGrowsTheCache) {
  ResponseCache cache(8);
  for (int pass = 0; pass < 5; ++pass) Pass(cache, 8);
  EXPECT_EQ(cache.capacity(), 8);
  EXPECT_EQ(Pass(cache, 8), 8);
}

TEST(ResponseCacheGrowth, NewNamesThatNeverReturnDoNotGrowIt) {
  ResponseCache cache(4);
  for (int i = 0; i < 100; ++i) cache.Put(Resp("once" + std::to_string(i)));
  EXPECT_EQ(cache.capacity(), 4);
}

TEST(ResponseCacheGrowth, CopiesFedTheSamePutsAgree) {
  ResponseCache a(4), b(4);
  for (int pass = 0; pass < 6; ++pass) {
    Pass(a, 23);
    Pass(b, 23);
    EXPECT_EQ(a.capacity(), b.capacity());
    EXPECT_EQ(a.hash(), b.hash());
  }
}

TEST(ResponseCacheGrowth, StopsAtTheMaximum) {
  ResponseCache cache(ResponseCache::kMaxCapacity / 2);
  const int n = static_cast<int>(ResponseCache::kMaxCapacity) + 100;
  for (int pass = 0; pass < 4; ++pass) Pass(cache, n);
  EXPECT_EQ(cache.capacity(), ResponseCache::kMaxCapacity);
}

TEST(ResponseCacheGrowth, CapacityZeroNeverGrows) {
  ResponseCache cache(0);
  for (int pass = 0; pass < 3; ++pass) EXPECT_EQ(Pass(cache, 10), 0);
  EXPECT_EQ(cache.capacity(), 0);
}

}  // namespace
}  // namespace hvdc
