// ResponseCache capacity growth: a cyclic working set larger than the cache must end up cached
// (LRU alone would miss on every pass), and copies fed the same puts grow identically.
#include <gtest/gtest.h>

#include <string>

#include "core/response_cache.h"

namespace hvdc {
namespace {

Response Named(const std::string& name) {
  Response r;
  r.op = OpType::kAllreduce;
  r.name = name;
  r.shape = {4};
  return r;
}

Request RequestFor(const Response& r) {
  Request q;
  q.op = r.op;
  q.name = r.name;
  q.shape = r.shape;
  return q;
}

// One pass over n tensors as a step submits them: a hit is touched, a miss is negotiated and put.
int Pass(ResponseCache& cache, int n) {
  int hits = 0;
  for (int i = 0; i < n; ++i) {
    Response r = Named("t" + std::to_string(i));
    uint32_t bit = 0;
    if (cache.Find(RequestFor(r), 0, &bit) == ResponseCache::Lookup::kHit) {
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
  for (int i = 0; i < 100; ++i) cache.Put(Named("once" + std::to_string(i)));
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
  ResponseCache cache(4);
  const int n = static_cast<int>(ResponseCache::kMaxCapacity) + 100;
  for (int pass = 0; pass < 16; ++pass) Pass(cache, n);
  EXPECT_EQ(cache.capacity(), ResponseCache::kMaxCapacity);
}

TEST(ResponseCacheGrowth, CapacityZeroCachesNothing) {
  ResponseCache cache(0);
  for (int pass = 0; pass < 3; ++pass) EXPECT_EQ(Pass(cache, 10), 0);
  EXPECT_EQ(cache.capacity(), 0);
}

}  // namespace
}  // namespace hvdc
