// Backoff: the stages of a wait by the time since it began (spin, then yield, then sleep doubling
// up to a cap), Reset() starting over, and Pause() looping until a condition set by another thread
// holds. The stages are checked through Next() with chosen elapsed times, never by timing.
#include "core/backoff.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace hvdc {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Stage = Backoff::Stage;

BackoffPolicy Policy() {
  return BackoffPolicy{microseconds(20), microseconds(100), microseconds(10), microseconds(75)};
}

TEST(Backoff, SpinsThenYieldsByElapsedTime) {
  Backoff b(Policy());
  Backoff::Clock::duration sleep = microseconds(-1);
  EXPECT_EQ(b.Next(microseconds(0), &sleep), Stage::kSpin);
  EXPECT_EQ(b.Next(microseconds(19), &sleep), Stage::kSpin);
  EXPECT_EQ(b.Next(microseconds(20), &sleep), Stage::kYield);
  EXPECT_EQ(b.Next(microseconds(99), &sleep), Stage::kYield);
  EXPECT_EQ(sleep, microseconds(-1)) << "only a sleep answer sets *sleep";
  EXPECT_EQ(b.Next(microseconds(100), &sleep), Stage::kSleep);
  EXPECT_EQ(sleep, microseconds(10));
}

TEST(Backoff, SleepsDoubleUpToTheCap) {
  Backoff b(Policy());
  std::vector<int64_t> sleeps;
  for (int i = 0; i < 6; ++i) {
    Backoff::Clock::duration sleep{};
    ASSERT_EQ(b.Next(milliseconds(5), &sleep), Stage::kSleep);
    sleeps.push_back(std::chrono::duration_cast<microseconds>(sleep).count());
  }
  // 10, 20, 40, then the cap of 75 from there on.
  EXPECT_EQ(sleeps, (std::vector<int64_t>{10, 20, 40, 75, 75, 75}));
}

TEST(Backoff, EarlierStagesDoNotAdvanceTheSleeps) {
  Backoff b(Policy());
  Backoff::Clock::duration sleep{};
  for (int i = 0; i < 100; ++i) b.Next(microseconds(i), &sleep);  // spin and yield answers
  ASSERT_EQ(b.Next(microseconds(100), &sleep), Stage::kSleep);
  EXPECT_EQ(sleep, microseconds(10));
}

TEST(Backoff, ResetStartsTheSleepsOver) {
  Backoff b(Policy());
  Backoff::Clock::duration sleep{};
  for (int i = 0; i < 5; ++i) b.Next(milliseconds(1), &sleep);
  EXPECT_EQ(sleep, microseconds(75));
  b.Reset();
  ASSERT_EQ(b.Next(milliseconds(1), &sleep), Stage::kSleep);
  EXPECT_EQ(sleep, microseconds(10));
}

TEST(Backoff, DefaultPolicyIsBoundedAndOrdered) {
  const BackoffPolicy p = DefaultBackoffPolicy();
  EXPECT_GT(p.spin.count(), 0);
  EXPECT_LE(p.spin, p.yield);
  EXPECT_GT(p.sleep_min.count(), 0) << "a zero first sleep would never grow";
  EXPECT_LE(p.sleep_min, p.sleep_max);
  EXPECT_LE(p.sleep_max, milliseconds(1)) << "a sleeping wait must still wake fast";
  // Long into a wait, every poll is preceded by a sleep of the cap: never an unbounded burn.
  Backoff b(p);
  Backoff::Clock::duration sleep{};
  for (int i = 0; i < 20; ++i) ASSERT_EQ(b.Next(std::chrono::seconds(10), &sleep), Stage::kSleep);
  EXPECT_EQ(sleep, p.sleep_max);
}

TEST(Backoff, PauseLoopEndsWhenAnotherThreadIsDone) {
  // Short stages, so the loop goes through all three while the other thread sleeps.
  Backoff b(BackoffPolicy{microseconds(5), microseconds(10), microseconds(10), microseconds(100)});
  std::atomic<bool> done{false};
  std::thread other([&] {
    std::this_thread::sleep_for(milliseconds(5));
    done.store(true);
  });
  int polls = 0;
  while (!done.load()) {
    ++polls;
    b.Pause();
  }
  other.join();
  EXPECT_GT(polls, 0);
}

}  // namespace
}  // namespace hvdc
