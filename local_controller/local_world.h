// LocalWorld: an in-memory world of N ranks that are threads of one process. It serves the
// thread-rank test harness (N threads, one Transport each) and the runtime started without a
// launcher (a world of 1, where every operation completes at once without taking a lock).
//
//   auto world = LocalWorld::Create(4);
//   // on thread r:
//   std::unique_ptr<Transport> t = MakeLocalTransport(world, r);
//
// Topology: rank r of N on one host (local_rank r, local_size N, cross_rank 0, cross_size 1).
// CreateProcessSet and CheckAgreement are collective over the world: the k-th call on every rank
// meets the k-th call on the others. A blocking call that waits longer than the arrival timeout
// for its peers fails with an UnknownError naming the ranks that did not arrive.
#pragma once

#include <chrono>
#include <memory>

#include "core/transport.h"

namespace hvdc {

namespace local {
class Rendezvous;
}  // namespace local

class LocalWorld {
 public:
  static constexpr std::chrono::milliseconds kDefaultArrivalTimeout{120 * 1000};

  // Returns nullptr if size < 1.
  static std::shared_ptr<LocalWorld> Create(
      int size, std::chrono::milliseconds arrival_timeout = kDefaultArrivalTimeout);
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const { return size_; }
  std::chrono::milliseconds arrival_timeout() const { return arrival_timeout_; }
  // The world's own collectives (process-set creation, agreement checks).
  local::Rendezvous& rendezvous() { return *rendezvous_; }

 private:
  LocalWorld(int size, std::chrono::milliseconds arrival_timeout);
  const int size_;
  const std::chrono::milliseconds arrival_timeout_;
  std::unique_ptr<local::Rendezvous> rendezvous_;
};

// The Transport of world rank `rank` (one per rank, used by that rank's threads only). Returns
// nullptr if world is null or rank is out of range.
std::unique_ptr<Transport> MakeLocalTransport(std::shared_ptr<LocalWorld> world, int rank);

}  // namespace hvdc
