// Lifecycle (core/lifecycle.h) on its own: every transition of the diagram is taken, every other
// one is refused with both states named and changes nothing; the reason recorded on leaving
// Running is what later operations fail with; waiting for the control thread to settle is bounded.
#include "core/lifecycle.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace hvdc {
namespace {

const std::vector<Phase> kAll = {Phase::kStarting, Phase::kDraining,  Phase::kRunning,
                                 Phase::kDrained,  Phase::kAbandoned, Phase::kDown};

// The diagram of lifecycle.h, written out independently of TransitionAllowed.
const std::set<std::pair<Phase, Phase>> kArrows = {
    {Phase::kStarting, Phase::kRunning}, {Phase::kStarting, Phase::kDown},
    {Phase::kRunning, Phase::kDraining}, {Phase::kRunning, Phase::kAbandoned},
    {Phase::kDraining, Phase::kDrained}, {Phase::kDraining, Phase::kAbandoned},
    {Phase::kDrained, Phase::kDown},     {Phase::kAbandoned, Phase::kDown},
};

// A path from Starting to `phase` along the arrows.
std::vector<Phase> PathTo(Phase phase) {
  switch (phase) {
    case Phase::kStarting:
      return {};
    case Phase::kRunning:
      return {Phase::kRunning};
    case Phase::kDraining:
      return {Phase::kRunning, Phase::kDraining};
    case Phase::kDrained:
      return {Phase::kRunning, Phase::kDraining, Phase::kDrained};
    case Phase::kAbandoned:
      return {Phase::kRunning, Phase::kAbandoned};
    case Phase::kDown:
      return {Phase::kDown};
  }
  return {};
}

// A lifecycle brought to `phase` (asserting every step).
void Reach(Lifecycle* life, Phase phase) {
  for (Phase p : PathTo(phase)) {
    Status s = life->Enter(p);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ASSERT_EQ(life->phase(), phase);
}

TEST(Lifecycle, StartsInStarting) {
  Lifecycle life;
  EXPECT_EQ(life.phase(), Phase::kStarting);
  EXPECT_FALSE(life.running());
  EXPECT_FALSE(life.settled());
}

TEST(Lifecycle, TheTableIsTheDiagram) {
  for (Phase from : kAll) {
    for (Phase to : kAll) {
      EXPECT_EQ(TransitionAllowed(from, to), kArrows.count({from, to}) == 1)
          << PhaseName(from) << " -> " << PhaseName(to);
    }
  }
}

TEST(Lifecycle, EveryArrowIsTaken) {
  for (const auto& [from, to] : kArrows) {
    Lifecycle life;
    Reach(&life, from);
    Status s = life.Enter(to);
    EXPECT_TRUE(s.ok()) << PhaseName(from) << " -> " << PhaseName(to) << ": " << s.ToString();
    EXPECT_EQ(life.phase(), to);
  }
}

TEST(Lifecycle, EveryOtherTransitionIsRefusedNamingBothStates) {
  int refused = 0;
  for (Phase from : kAll) {
    for (Phase to : kAll) {
      if (kArrows.count({from, to})) continue;
      Lifecycle life;
      Reach(&life, from);
      Status s = life.Enter(to);
      EXPECT_EQ(s.code(), StatusCode::kPreconditionError)
          << PhaseName(from) << " -> " << PhaseName(to);
      EXPECT_EQ(s.message(), std::string("runtime lifecycle: no transition from ") +
                                 PhaseName(from) + " to " + PhaseName(to));
      EXPECT_EQ(life.phase(), from) << "a refused transition changed the state";
      // Leave() goes through the same table.
      Status left = life.Leave(to, "why", StatusCode::kPeerLost);
      EXPECT_FALSE(left.ok()) << PhaseName(from) << " -> " << PhaseName(to);
      EXPECT_EQ(life.phase(), from);
      ++refused;
    }
  }
  EXPECT_EQ(refused, 6 * 6 - static_cast<int>(kArrows.size()));
}

TEST(Lifecycle, OnlyRunningAcceptsWork) {
  for (Phase p : kAll) {
    Lifecycle life;
    Reach(&life, p);
    EXPECT_EQ(life.running(), p == Phase::kRunning) << PhaseName(p);
    const bool settled = p == Phase::kDrained || p == Phase::kAbandoned || p == Phase::kDown;
    EXPECT_EQ(life.settled(), settled) << PhaseName(p);
  }
}

TEST(Lifecycle, LeavingRunningRecordsTheReason) {
  Lifecycle life;
  Reach(&life, Phase::kRunning);
  const auto before = Lifecycle::Clock::now();
  ASSERT_TRUE(life.Leave(Phase::kAbandoned, "rank 2 (h:1) was lost", StatusCode::kPeerLost).ok());
  EXPECT_EQ(life.why().code(), StatusCode::kPeerLost);
  EXPECT_EQ(life.why().message(), "rank 2 (h:1) was lost");
  EXPECT_GE(life.left_running_at(), before);
}

TEST(Lifecycle, AnOrderlyShutdownGivesTheGenericMessage) {
  Lifecycle life;
  Reach(&life, Phase::kRunning);
  ASSERT_TRUE(life.Leave(Phase::kDraining, "", StatusCode::kUnknownError).ok());
  EXPECT_EQ(life.why().code(), StatusCode::kUnknownError);
  EXPECT_NE(life.why().message().find("Horovod has been shut down"), std::string::npos);
  // Plain Enter out of Running says the same.
  Lifecycle other;
  Reach(&other, Phase::kDraining);
  EXPECT_EQ(other.why().message(), life.why().message());
}

TEST(Lifecycle, AnAbandonedDrainKeepsTheDrainsReason) {
  Lifecycle life;
  Reach(&life, Phase::kRunning);
  ASSERT_TRUE(life.Leave(Phase::kDraining, "rank 1 stalled", StatusCode::kUnknownError).ok());
  const auto left = life.left_running_at();
  ASSERT_TRUE(life.Leave(Phase::kAbandoned, "a peer was lost", StatusCode::kPeerLost).ok());
  EXPECT_EQ(life.why().code(), StatusCode::kUnknownError);
  EXPECT_EQ(life.why().message(), "rank 1 stalled");
  EXPECT_EQ(life.left_running_at(), left);
}

TEST(Lifecycle, ARefusedLeaveRecordsNothing) {
  Lifecycle life;
  Reach(&life, Phase::kDrained);
  const Status why = life.why();
  EXPECT_FALSE(life.Leave(Phase::kAbandoned, "late", StatusCode::kPeerLost).ok());
  EXPECT_EQ(life.why().message(), why.message());
  EXPECT_EQ(life.phase(), Phase::kDrained);
}

TEST(Lifecycle, WaitSettledReturnsWhenTheControlThreadStops) {
  for (Phase end : {Phase::kDrained, Phase::kAbandoned}) {
    Lifecycle life;
    Reach(&life, Phase::kDraining);
    EXPECT_FALSE(life.WaitSettled(std::chrono::milliseconds(1)));
    std::thread control([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_TRUE(life.Enter(end).ok());
    });
    EXPECT_TRUE(life.WaitSettled(std::chrono::seconds(30))) << PhaseName(end);
    control.join();
  }
}

}  // namespace
}  // namespace hvdc
