// The worlds the conformance suites run over: N ranks of one transport, each with its Transport.
// A suite body is written once against Transport/HostComm/ControlChannel and runs on every rank the
// process hosts -- all N as threads (the in-memory world, TCP on loopback) or this process's one
// rank (MPI under mpirun).
//
// A new data plane or control channel joins every suite with one factory (a WorldParam) and one
// INSTANTIATE_TEST_SUITE_P per suite in its own *_conformance_test.cc, e.g.
//
//   WorldParam{"shm_np4", [] { return ThreadWorld::Make(4, MakeShmTransports); }}
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/transport.h"

namespace hvdc {
namespace conformance {

class World {
 public:
  virtual ~World() = default;
  virtual int size() const = 0;
  // True when every rank is a thread of this process (suites may then share memory across ranks).
  virtual bool in_one_process() const = 0;
  // Runs body(rank's transport) on every rank this process hosts; returns once all have.
  // Collectives inside the body meet their peers' matching calls, so a body must make the same
  // calls on every rank (checks use EXPECT, never ASSERT, around collectives: a rank that left
  // early would hang its peers).
  virtual void Run(const std::function<void(Transport&)>& body) = 0;
};

// One rank per thread: transports[r] is rank r's. Finalizes every transport at destruction, from
// one thread per rank (a TCP mesh closes gracefully only when its peers close too).
class ThreadWorld : public World {
 public:
  using MakeTransports = std::function<std::vector<std::unique_ptr<Transport>>(int size)>;
  // nullptr (and a test failure) if make does not return `size` transports.
  static std::unique_ptr<World> Make(int size, const MakeTransports& make);
  explicit ThreadWorld(std::vector<std::unique_ptr<Transport>> transports);
  ~ThreadWorld() override;

  int size() const override { return static_cast<int>(transports_.size()); }
  bool in_one_process() const override { return true; }
  void Run(const std::function<void(Transport&)>& body) override;

 private:
  std::vector<std::unique_ptr<Transport>> transports_;
};

// A world for the suites to instantiate with: a name for the test names ("local_np3") and how to
// make a fresh world (one per test).
struct WorldParam {
  std::string name;
  std::function<std::unique_ptr<World>()> make;
};

inline std::ostream& operator<<(std::ostream& os, const WorldParam& p) { return os << p.name; }

struct WorldName {
  std::string operator()(const ::testing::TestParamInfo<WorldParam>& info) const {
    return info.param.name;
  }
};

}  // namespace conformance
}  // namespace hvdc
