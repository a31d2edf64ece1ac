#include "core/process_set_admin.h"

#include <algorithm>

#include "core/hash.h"
#include "core/request_validator.h"

namespace hvdc {

std::shared_ptr<AdminOp> MakeAddOp(std::vector<int> ranks, int world_size) {
  std::sort(ranks.begin(), ranks.end());
  auto op = std::make_shared<AdminOp>();
  op->add = true;
  op->valid = ValidSetRanks(ranks, world_size);
  // The tags (*3 + 1, *3 + 2) keep an add and a remove from ever hashing alike.
  op->hash = HashInts(op->valid ? ranks : std::vector<int>{-1}) * 3 + 1;
  op->ranks = std::move(ranks);
  return op;
}

std::shared_ptr<AdminOp> MakeRemoveOp(int id) {
  auto op = std::make_shared<AdminOp>();
  op->add = false;
  op->id = id;
  op->hash = HashInts({id}) * 3 + 2;
  return op;
}

}  // namespace hvdc
