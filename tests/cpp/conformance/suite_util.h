// What the conformance suites share: the parameterised fixtures, a process set's channels, and
// a PendingOp driven to completion.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/transport.h"
#include "tests/cpp/conformance/world.h"

namespace hvdc {
namespace conformance {

// Each suite makes a fresh world per test from its parameter.
class WorldTest : public ::testing::TestWithParam<WorldParam> {
 protected:
  void SetUp() override {
    world_ = GetParam().make();
    ASSERT_NE(world_, nullptr);
  }
  void TearDown() override { world_.reset(); }
  World& world() { return *world_; }
  int n() const { return world_->size(); }

 private:
  std::unique_ptr<World> world_;
};

class HostCommConformance : public WorldTest {};
class ControlChannelConformance : public WorldTest {};
class ProcessSetConformance : public WorldTest {};

inline std::vector<int> Range(int begin, int end) {
  std::vector<int> v;
  for (int i = begin; i < end; ++i) v.push_back(i);
  return v;
}

// The channels of the set `members` (collective over the world); null channels outside it.
inline ProcessSetChannels MakeSet(Transport& t, const std::vector<int>& members) {
  ProcessSetChannels set;
  Status s = t.CreateProcessSet(members, &set);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return set;
}

// Drives op to completion, as the control thread would (without its deadline: ctest's timeout
// ends a hang).
inline Status Wait(std::unique_ptr<PendingOp> op) {
  Status status;
  while (!op->Test(&status)) std::this_thread::yield();
  return status;
}

}  // namespace conformance
}  // namespace hvdc
