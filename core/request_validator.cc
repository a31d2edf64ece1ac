#include "core/request_validator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace hvdc {
namespace {

Status ValidateAlltoall(int n, Request* q) {
  const std::string& name = q->name;
  if (q->shape.empty()) {
    return Status::InvalidArgument(
        fmt::format("alltoall of '{}': the tensor must have at least one dimension", name));
  }
  const int64_t dim0 = q->shape[0];
  if (q->splits.empty()) {
    if (dim0 % n != 0) {
      return Status::InvalidArgument(fmt::format(
          "alltoall of '{}': dimension 0 ({}) is not divisible by the number of ranks ({}); "
          "pass splits",
          name, dim0, n));
    }
    q->splits.assign(n, static_cast<int32_t>(dim0 / n));
    return Status::OK();
  }
  if (static_cast<int>(q->splits.size()) != n) {
    return Status::InvalidArgument(
        fmt::format("alltoall of '{}': {} splits given for a process set of {} ranks", name,
                    q->splits.size(), n));
  }
  int64_t sum = 0;
  for (int32_t s : q->splits) {
    if (s < 0) {
      return Status::InvalidArgument(fmt::format("alltoall of '{}': negative split {}", name, s));
    }
    sum += s;
  }
  if (sum > dim0) {
    return Status::InvalidArgument(fmt::format(
        "alltoall of '{}': splits sum to {}, more than dimension 0 ({})", name, sum, dim0));
  }
  return Status::OK();
}

}  // namespace

Status ValidateRequest(const SetView& set, Request* q) {
  const std::vector<int>& ranks = *set.ranks;
  if (q->name.empty() && q->op != OpType::kJoin && q->op != OpType::kBarrier) {
    return Status::InvalidArgument("a collective needs a non-empty tensor name");
  }
  switch (q->op) {
    case OpType::kJoin:
      if (set.id != 0) return Status::InvalidArgument("join() works on the global set only");
      q->name = "join.noname";
      break;
    case OpType::kBarrier:
      if (q->name.empty()) q->name = "barrier";
      break;
    case OpType::kBroadcast: {
      auto it = std::find(ranks.begin(), ranks.end(), q->root_rank);
      if (it == ranks.end()) {
        return Status::InvalidArgument(
            fmt::format("broadcast of '{}': root rank {} is not in process set {} (ranks {})",
                        q->name, q->root_rank, set.id, ranks));
      }
      q->root_rank = static_cast<int32_t>(it - ranks.begin());
      break;
    }
    case OpType::kAlltoall:
      HVDC_RETURN_IF_ERROR(ValidateAlltoall(static_cast<int>(ranks.size()), q));
      break;
    case OpType::kReducescatter:
    case OpType::kAllgather:
      if (q->shape.empty()) {
        return Status::InvalidArgument(fmt::format(
            "{} of '{}': the tensor must have at least one dimension", OpTypeName(q->op), q->name));
      }
      break;
    case OpType::kAllreduce:
      break;
  }
  for (int64_t d : q->shape) {
    if (d < 0) {
      return Status::InvalidArgument(
          fmt::format("tensor '{}' has a negative dimension: {}", q->name, ShapeString(q->shape)));
    }
  }
  return Status::OK();
}

bool ValidSetRanks(const std::vector<int>& ranks, int world_size) {
  return !ranks.empty() && std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() &&
         ranks.front() >= 0 && ranks.back() < world_size;
}

}  // namespace hvdc
