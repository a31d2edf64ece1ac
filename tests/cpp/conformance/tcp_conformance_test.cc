// The conformance suites over the TCP transport (tcp_controller/) on loopback: ranks as threads of
// this process, each with its own mesh (met through an in-memory store), worlds of 1, 2, 3 and 4
// (recursive doubling with and without folded ranks). Segments are 4 KiB, so the larger sizes of
// the suites cross many of them.
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "tcp_controller/tcp_transport.h"
#include "tests/cpp/conformance/suite_util.h"
#include "tests/cpp/util/tcp_test_util.h"

namespace hvdc {
namespace conformance {
namespace {

std::vector<std::unique_ptr<Transport>> TcpTransports(int size) {
  std::vector<std::shared_ptr<tcp::Mesh>> meshes = tcp_test::MakeMeshes(size);
  Config config;
  config.chunk_bytes = 4096;
  std::vector<std::unique_ptr<Transport>> out(size);
  for (int r = 0; r < size; ++r) {
    if (!meshes[r]) continue;
    Status s = MakeTcpTransportOverMesh(meshes[r], config, &out[r]);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return out;
}

std::vector<WorldParam> TcpWorlds() {
  std::vector<WorldParam> worlds;
  for (int n : {1, 2, 3, 4}) {
    worlds.push_back(
        {"np" + std::to_string(n), [n] { return ThreadWorld::Make(n, TcpTransports); }});
  }
  return worlds;
}

INSTANTIATE_TEST_SUITE_P(TcpLoopback, HostCommConformance, ::testing::ValuesIn(TcpWorlds()),
                         WorldName());
INSTANTIATE_TEST_SUITE_P(TcpLoopback, ControlChannelConformance, ::testing::ValuesIn(TcpWorlds()),
                         WorldName());
INSTANTIATE_TEST_SUITE_P(TcpLoopback, ProcessSetConformance, ::testing::ValuesIn(TcpWorlds()),
                         WorldName());

}  // namespace
}  // namespace conformance
}  // namespace hvdc
