// Ranks as threads of this process, each process set's data (and, on one host, negotiation)
// through the shared-memory plane wrapped around the in-memory world: the world the shm_* suites
// beyond the conformance suites run over.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "local_controller/local_world.h"
#include "shm_controller/shm_transport.h"
#include "tests/cpp/conformance/world.h"

namespace hvdc {

// n ranks with `options`; hosts[r], when given, is rank r's host identity.
inline std::unique_ptr<conformance::World> MakeShmWorld(
    int n, const shm::ShmOptions& options, const std::vector<std::string>& hosts = {}) {
  return conformance::ThreadWorld::Make(n, [&](int size) {
    std::shared_ptr<LocalWorld> world = LocalWorld::Create(size);
    std::vector<std::unique_ptr<Transport>> out;
    for (int r = 0; r < size; ++r) {
      shm::ShmOptions o = options;
      if (!hosts.empty()) o.host = hosts[r];
      out.push_back(shm::MakeShmTransport(MakeLocalTransport(world, r), o));
    }
    return out;
  });
}

}  // namespace hvdc
