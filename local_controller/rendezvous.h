// Rendezvous: the blocking meeting point of the member threads of one in-memory group (a process
// set's data plane, or the world's own collectives). Internal to local_controller/.
//
// A collective is matched across ranks by a sequence number each rank counts for itself. Each rank
// publishes a pointer to its call's arguments (on its own stack) and waits for the others; once all
// have arrived, every rank reads the others' arguments and buffers directly, so data moves with one
// copy and no staging. Every call follows the same shape on every rank:
//
//   Arrive -> (read peers, write own output) -> Sync [-> ... -> Sync] -> Release
//
// and no rank returns before the last Sync, so no rank frees a buffer a peer may still read.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace hvdc {
namespace local {

using Clock = std::chrono::steady_clock;

// One collective in flight. Written only under Rendezvous::mu_; once Arrive has succeeded, `args`
// and `kinds` no longer change, so the members read them without the lock.
struct RendezvousSlot {
  explicit RendezvousSlot(int size) : args(size, nullptr), kinds(size, 0), present(size, false) {}
  std::vector<const void*> args;  // each rank's arguments, valid until that rank's last Sync
  std::vector<int> kinds;         // which call each rank made (a mismatch is an error)
  std::vector<bool> present;
  int arrived = 0;
  bool abandoned = false;  // a rank gave up waiting; the call can no longer complete
  std::string abandon_message;
  int sync_count = 0;
  uint64_t sync_generation = 0;
  int released = 0;
  std::shared_ptr<void> product;  // an object the call creates once for all members
};

class Rendezvous {
 public:
  // world_ranks[i] names member i in messages.
  Rendezvous(std::vector<int> world_ranks, Clock::duration arrival_timeout);
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int size() const { return size_; }

  // Publishes this rank's arguments for collective `seq` and waits until every member has published
  // them. After arrival_timeout it gives up: UnknownError naming the ranks that did not arrive, and
  // every other rank waiting on (or later arriving at) the same call gets the same error.
  Status Arrive(int rank, uint64_t seq, int kind, const void* args, const char* what,
                std::shared_ptr<RendezvousSlot>* slot);
  // A barrier among the members inside one call. It has no deadline: every member has arrived, so
  // each is inside the call and waits on nothing outside it.
  void Sync(RendezvousSlot* slot);
  // This rank is done with the slot; the last member to release it removes it.
  void Release(uint64_t seq, RendezvousSlot* slot);
  // The call's shared object, created by the first member that asks.
  std::shared_ptr<void> Product(RendezvousSlot* slot,
                                const std::function<std::shared_ptr<void>()>& make);

  // Returns an error unless every member made the same kind of call (same verdict on every rank).
  Status CheckSameKind(const RendezvousSlot& slot, uint64_t seq,
                       const char* (*kind_name)(int)) const;
  size_t slots_in_use();  // for tests: calls some member has not released

  // The world rank of member `rank`, for messages.
  int world_rank(int rank) const { return world_ranks_[rank]; }

 private:
  const std::vector<int> world_ranks_;
  const int size_;
  const Clock::duration arrival_timeout_;
  std::mutex mu_;  // guards slots_ and the mutable fields of every slot in it
  std::condition_variable cv_;
  std::map<uint64_t, std::shared_ptr<RendezvousSlot>> slots_;
};

}  // namespace local
}  // namespace hvdc
