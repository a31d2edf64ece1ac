#include "tests/cpp/conformance/world.h"

#include <gtest/gtest.h>

#include <thread>

namespace hvdc {
namespace conformance {

std::unique_ptr<World> ThreadWorld::Make(int size, const MakeTransports& make) {
  std::vector<std::unique_ptr<Transport>> transports = make(size);
  bool complete = static_cast<int>(transports.size()) == size;
  for (const auto& t : transports) complete = complete && t != nullptr;
  EXPECT_TRUE(complete) << "could not make a world of " << size << " ranks";
  if (!complete) return nullptr;
  return std::make_unique<ThreadWorld>(std::move(transports));
}

ThreadWorld::ThreadWorld(std::vector<std::unique_ptr<Transport>> transports)
    : transports_(std::move(transports)) {}

ThreadWorld::~ThreadWorld() {
  Run([](Transport& t) { t.Finalize(); });
}

void ThreadWorld::Run(const std::function<void(Transport&)>& body) {
  std::vector<std::thread> threads;
  for (auto& t : transports_) threads.emplace_back([&body, &t] { body(*t); });
  for (auto& t : threads) t.join();
}

}  // namespace conformance
}  // namespace hvdc
