// Process-set administration: add_process_set / remove_process_set as the runtime carries them.
// A change is proposed by every rank, agreed in a round of the global set (execution_order.h says
// how the words carry it) and applied by every rank at the end of the same round.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "core/status.h"

namespace hvdc {

struct AdminOp {
  bool add = true;
  std::vector<int> ranks;  // add: sorted
  bool valid = true;       // add: the ranks form a valid set
  int id = 0;              // remove: the set; add: the new set's id once created
  uint64_t hash = 0;       // what every rank must agree on
  std::promise<Status> result;
};

// `ranks` in any order; invalid sets still go through agreement (every rank learns the error).
std::shared_ptr<AdminOp> MakeAddOp(std::vector<int> ranks, int world_size);
std::shared_ptr<AdminOp> MakeRemoveOp(int id);

}  // namespace hvdc
