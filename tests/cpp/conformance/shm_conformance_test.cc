// The conformance suites over the shared-memory data plane (shm_controller/): ranks as threads of
// this process, each process set's data through its own segment, control through the in-memory
// world the plane is wrapped around. Worlds of 2, 3 and 4 on one host, and of 3 hosts x 2 ranks
// with hierarchical allreduce and allgather on; segments of 64 KiB, so the larger sizes of the
// suites take many rounds.
#include <memory>
#include <string>
#include <vector>

#include "local_controller/local_world.h"
#include "shm_controller/shm_transport.h"
#include "tests/cpp/conformance/suite_util.h"

namespace hvdc {
namespace conformance {
namespace {

std::vector<std::unique_ptr<Transport>> ShmTransports(int size) {
  std::shared_ptr<LocalWorld> world = LocalWorld::Create(size);
  shm::ShmOptions options;
  options.bytes = 64 * 1024;
  options.host = "conformance";
  std::vector<std::unique_ptr<Transport>> out;
  for (int r = 0; r < size; ++r) {
    out.push_back(shm::MakeShmTransport(MakeLocalTransport(world, r), options));
  }
  return out;
}

// Six ranks on three hosts (contiguous, or interleaved), hierarchical allreduce and allgather on:
// a set of all six gets the hierarchical plane, subsets whatever fits them.
ThreadWorld::MakeTransports HierarchicalTransports(std::vector<std::string> hosts) {
  return [hosts](int size) {
    std::shared_ptr<LocalWorld> world = LocalWorld::Create(size);
    std::vector<std::unique_ptr<Transport>> out;
    for (int r = 0; r < size; ++r) {
      shm::ShmOptions options;
      options.bytes = 64 * 1024;
      options.host = hosts[static_cast<size_t>(r)];
      options.hierarchical_allreduce = options.hierarchical_allgather = true;
      out.push_back(shm::MakeShmTransport(MakeLocalTransport(world, r), options));
    }
    return out;
  };
}

std::vector<WorldParam> ShmWorlds() {
  std::vector<WorldParam> worlds;
  for (int n : {2, 3, 4}) {
    worlds.push_back(
        {"np" + std::to_string(n), [n] { return ThreadWorld::Make(n, ShmTransports); }});
  }
  worlds.push_back(
      {"hierarchical_3x2", [] {
         return ThreadWorld::Make(6, HierarchicalTransports({"a", "a", "b", "b", "c", "c"}));
       }});
  worlds.push_back(
      {"hierarchical_interleaved", [] {
         return ThreadWorld::Make(6, HierarchicalTransports({"a", "b", "c", "a", "b", "c"}));
       }});
  return worlds;
}

INSTANTIATE_TEST_SUITE_P(Shm, HostCommConformance, ::testing::ValuesIn(ShmWorlds()), WorldName());
INSTANTIATE_TEST_SUITE_P(Shm, ControlChannelConformance, ::testing::ValuesIn(ShmWorlds()),
                         WorldName());
INSTANTIATE_TEST_SUITE_P(Shm, ProcessSetConformance, ::testing::ValuesIn(ShmWorlds()), WorldName());

}  // namespace
}  // namespace conformance
}  // namespace hvdc
