#include "local_controller/local_world.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <utility>

#include "local_controller/local_channel.h"
#include "local_controller/local_host_comm.h"
#include "local_controller/rendezvous.h"

namespace hvdc {
namespace {

enum class WorldKind : int { kCreateProcessSet = 1, kCheckAgreement = 2 };

const char* WorldKindName(int kind) {
  switch (static_cast<WorldKind>(kind)) {
    case WorldKind::kCreateProcessSet:
      return "CreateProcessSet";
    case WorldKind::kCheckAgreement:
      return "CheckAgreement";
  }
  return "?";
}

// One rank's arguments to a world collective (lives on its stack).
struct WorldCall {
  const std::vector<int>* ranks = nullptr;
  uint64_t value = 0;
};

// The channels' shared state for one process set.
struct SetState {
  SetState(const std::vector<int>& world_ranks, std::chrono::milliseconds timeout)
      : control(std::make_shared<local::ControlBoard>(static_cast<int>(world_ranks.size()))),
        data(std::make_shared<local::Rendezvous>(world_ranks, timeout)) {}
  std::shared_ptr<local::ControlBoard> control;
  std::shared_ptr<local::Rendezvous> data;
};

std::string RanksString(const std::vector<int>& ranks) {
  return fmt::format("[{}]", fmt::join(ranks, ", "));
}

Status CheckRanks(const std::vector<int>& ranks, int world_size) {
  if (ranks.empty()) return Status::InvalidArgument("CreateProcessSet: the rank list is empty");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return Status::InvalidArgument(
          fmt::format("CreateProcessSet: ranks {} must be sorted, distinct and in [0, {})",
                      RanksString(ranks), world_size));
    }
  }
  return Status::OK();
}

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalWorld> world, int rank) : world_(std::move(world)) {
    topology_.rank = rank;
    topology_.size = world_->size();
    topology_.local_rank = rank;
    topology_.local_size = world_->size();
    topology_.cross_rank = 0;
    topology_.cross_size = 1;
    topology_.homogeneous = true;
  }

  const Topology& topology() const override { return topology_; }
  const char* name() const override { return "local"; }
  bool threads_supported() const override { return true; }

  Status CreateProcessSet(const std::vector<int>& world_ranks, ProcessSetChannels* out) override {
    out->control.reset();
    out->data.reset();
    WorldCall call;
    call.ranks = &world_ranks;
    std::shared_ptr<SetState> state;
    HVDC_RETURN_IF_ERROR(Collective(
        WorldKind::kCreateProcessSet, &call,
        [&](const Peers& peer) {
          for (int r = 1; r < topology_.size; ++r) {
            if (*peer(r).ranks != *peer(0).ranks) {
              return Status::PreconditionError(fmt::format(
                  "CreateProcessSet: ranks disagree on the members: rank 0 passed {}, rank {} "
                  "passed {}",
                  RanksString(*peer(0).ranks), r, RanksString(*peer(r).ranks)));
            }
          }
          return CheckRanks(world_ranks, topology_.size);
        },
        [&](local::RendezvousSlot* slot) {
          if (!std::binary_search(world_ranks.begin(), world_ranks.end(), topology_.rank)) return;
          auto timeout = world_->arrival_timeout();
          state = std::static_pointer_cast<SetState>(world_->rendezvous().Product(
              slot, [&] { return std::make_shared<SetState>(world_ranks, timeout); }));
        }));
    if (state) {
      const int index = static_cast<int>(
          std::lower_bound(world_ranks.begin(), world_ranks.end(), topology_.rank) -
          world_ranks.begin());
      out->control = std::make_unique<local::LocalControlChannel>(state->control, index);
      out->data = std::make_unique<local::LocalHostComm>(state->data, index);
    }
    return Status::OK();
  }

  Status CheckAgreement(uint64_t value, bool* all_equal) override {
    WorldCall call;
    call.value = value;
    return Collective(WorldKind::kCheckAgreement, &call, [&](const Peers& peer) {
      *all_equal = true;
      for (int r = 1; r < topology_.size; ++r) *all_equal &= peer(r).value == peer(0).value;
      return Status::OK();
    });
  }

  void Finalize() override {}

 private:
  using Peers = std::function<const WorldCall&(int)>;

  // Meets the other ranks' matching world call; `body` reads the peers' arguments and returns the
  // verdict (the same on every rank); `on_success` runs only if it is OK, before the peers leave.
  template <typename Body, typename OnSuccess>
  Status Collective(WorldKind kind, const WorldCall* call, Body body, OnSuccess on_success) {
    local::Rendezvous& rendezvous = world_->rendezvous();
    const uint64_t seq = next_seq_++;
    std::shared_ptr<local::RendezvousSlot> slot;
    HVDC_RETURN_IF_ERROR(rendezvous.Arrive(topology_.rank, seq, static_cast<int>(kind), call,
                                           WorldKindName(static_cast<int>(kind)), &slot));
    Status status = rendezvous.CheckSameKind(*slot, seq, WorldKindName);
    if (status.ok()) {
      Peers peer = [&](int r) -> const WorldCall& {
        return *static_cast<const WorldCall*>(slot->args[r]);
      };
      status = body(peer);
      if (status.ok()) on_success(slot.get());
    }
    rendezvous.Sync(slot.get());  // nobody reads a peer's arguments after this
    rendezvous.Release(seq, slot.get());
    return status;
  }
  template <typename Body>
  Status Collective(WorldKind kind, const WorldCall* call, Body body) {
    return Collective(kind, call, body, [](local::RendezvousSlot*) {});
  }

  std::shared_ptr<LocalWorld> world_;
  Topology topology_;
  uint64_t next_seq_ = 0;  // world collectives this rank has started
};

}  // namespace

constexpr std::chrono::milliseconds LocalWorld::kDefaultArrivalTimeout;

LocalWorld::LocalWorld(int size, std::chrono::milliseconds arrival_timeout)
    : size_(size), arrival_timeout_(arrival_timeout) {
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  rendezvous_ = std::make_unique<local::Rendezvous>(std::move(ranks), arrival_timeout);
}

LocalWorld::~LocalWorld() = default;

std::shared_ptr<LocalWorld> LocalWorld::Create(int size,
                                               std::chrono::milliseconds arrival_timeout) {
  if (size < 1) return nullptr;
  return std::shared_ptr<LocalWorld>(new LocalWorld(size, arrival_timeout));
}

std::unique_ptr<Transport> MakeLocalTransport(std::shared_ptr<LocalWorld> world, int rank) {
  if (!world || rank < 0 || rank >= world->size()) return nullptr;
  return std::make_unique<LocalTransport>(std::move(world), rank);
}

}  // namespace hvdc
