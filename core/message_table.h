// MessageTable: the coordinator's view of negotiation for one process set. It collects full
// requests per tensor name, decides when a tensor is ready (every rank that has not joined has
// submitted it), checks that the ranks agree, and turns each ready tensor into a Response -- an
// ERROR response naming the tensor, the conflicting values and the ranks when they do not.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/message.h"

namespace hvdc {

class MessageTable {
 public:
  using Clock = std::chrono::steady_clock;
  // world_ranks: set rank -> world rank, for the messages users read.
  explicit MessageTable(std::vector<int> world_ranks)
      : size_(static_cast<int>(world_ranks.size())),
        world_ranks_(std::move(world_ranks)),
        joined_(size_, false) {}

  // Adds rank's request; ready responses are appended to *ready in a deterministic order.
  void Add(int rank, const Request& request, Clock::time_point now, std::vector<Response>* ready);
  // Marks `rank` joined: it now counts as having submitted every tensor.
  void Join(int rank, std::vector<Response>* ready);
  bool all_joined() const;
  bool any_joined() const;
  int last_joined() const { return last_joined_; }
  void ResetJoin();

  struct Stalled {
    std::string name;
    double waited_s;
    std::vector<int> missing_ranks;
    std::vector<int> ready_ranks;
  };
  // Tensors some ranks submitted longer than `age` ago and others have not.
  std::vector<Stalled> StalledSince(Clock::duration age, Clock::time_point now) const;
  bool empty() const { return pending_.empty(); }

 private:
  struct Pending {
    std::vector<Request> by_rank;  // by_rank[r].name empty = not yet submitted
    std::vector<bool> submitted;
    int count = 0;
    Clock::time_point first_seen;
    uint64_t order = 0;
  };
  bool IsReady(const Pending& p) const;
  Response Build(const std::string& name, const Pending& p) const;
  void TakeReady(const std::string& name, std::vector<Response>* ready);
  void EmitReadyGroups(std::vector<Response>* ready);

  int size_;
  std::vector<int> world_ranks_;
  std::vector<bool> joined_;
  int last_joined_ = -1;
  uint64_t next_order_ = 0;
  std::map<std::string, Pending> pending_;
  // Groups: members held back until every member of the group is ready.
  std::map<std::string, std::vector<Response>> groups_;
};

// Cross-rank agreement checks, exposed for tests. Returns an error response for `name` when the
// requests disagree; otherwise the merged response.
// Ranks in messages are world_ranks[r] when given.
Response MergeRequests(const std::string& name, const std::vector<Request>& by_rank,
                       const std::vector<bool>& present,
                       const std::vector<int>* world_ranks = nullptr);

}  // namespace hvdc
