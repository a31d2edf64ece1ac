// The conformance suites over the in-memory world (local_controller/): ranks as threads of this
// process, worlds of 1, 2, 3, 4, 7 and 8.
#include <memory>
#include <string>
#include <vector>

#include "local_controller/local_world.h"
#include "tests/cpp/conformance/suite_util.h"

namespace hvdc {
namespace conformance {
namespace {

std::vector<std::unique_ptr<Transport>> LocalTransports(int size) {
  std::shared_ptr<LocalWorld> world = LocalWorld::Create(size);
  std::vector<std::unique_ptr<Transport>> out;
  for (int r = 0; r < size; ++r) out.push_back(MakeLocalTransport(world, r));
  return out;
}

std::vector<WorldParam> LocalWorlds() {
  std::vector<WorldParam> worlds;
  for (int n : {1, 2, 3, 4, 7, 8}) {
    worlds.push_back(
        {"np" + std::to_string(n), [n] { return ThreadWorld::Make(n, LocalTransports); }});
  }
  return worlds;
}

INSTANTIATE_TEST_SUITE_P(InMemory, HostCommConformance, ::testing::ValuesIn(LocalWorlds()),
                         WorldName());
INSTANTIATE_TEST_SUITE_P(InMemory, ControlChannelConformance, ::testing::ValuesIn(LocalWorlds()),
                         WorldName());
INSTANTIATE_TEST_SUITE_P(InMemory, ProcessSetConformance, ::testing::ValuesIn(LocalWorlds()),
                         WorldName());

}  // namespace
}  // namespace conformance
}  // namespace hvdc
