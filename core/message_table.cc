#include "core/message_table.h"

#include <fmt/format.h>

#include <algorithm>

namespace hvdc {
namespace {

Response ErrorResponse(const Request& q, StatusCode code, std::string msg) {
  Response p;
  p.op = q.op;
  p.name = q.name;
  p.dtype = q.dtype;
  p.device = q.device;
  p.group = q.group;
  p.group_size = q.group_size;
  p.error_code = code;
  p.error_message = std::move(msg);
  return p;
}

std::string TrailingString(const Shape& s) {
  return ShapeString(s.empty() ? s : Shape(s.begin() + 1, s.end()));
}

}  // namespace

Response MergeRequests(const std::string& name, const std::vector<Request>& by_rank,
                       const std::vector<bool>& present, const std::vector<int>* world_ranks) {
  auto world = [&](int r) { return world_ranks ? (*world_ranks)[r] : r; };
  int ref = -1;
  for (size_t r = 0; r < present.size(); ++r) {
    if (present[r]) {
      ref = static_cast<int>(r);
      break;
    }
  }
  const Request& q0 = by_rank[ref];
  auto mismatch = [&](const char* what, int r, const std::string& a, const std::string& b) {
    return ErrorResponse(
        q0, StatusCode::kPreconditionError,
        fmt::format("Mismatched {} for tensor '{}': rank {} has {}, rank {} has {}", what, name,
                    world(ref), a, world(r), b));
  };
  bool any_absent = false;
  for (size_t i = 0; i < present.size(); ++i) {
    int r = static_cast<int>(i);
    if (!present[i]) {
      any_absent = true;
      continue;
    }
    const Request& q = by_rank[i];
    if (q.op != q0.op) return mismatch("operations", r, OpTypeName(q0.op), OpTypeName(q.op));
    if (q.dtype != q0.dtype) {
      return mismatch("data types", r, DataTypeName(q0.dtype), DataTypeName(q.dtype));
    }
    if ((q.device < 0) != (q0.device < 0)) {
      return mismatch("devices", r, q0.device < 0 ? "CPU" : "GPU", q.device < 0 ? "CPU" : "GPU");
    }
    if (q.group_size != q0.group_size || q.group != q0.group) {
      return mismatch("groups", r, fmt::format("'{}' of {}", q0.group, q0.group_size),
                      fmt::format("'{}' of {}", q.group, q.group_size));
    }
    switch (q0.op) {
      case OpType::kAllreduce:
      case OpType::kReducescatter:
        if (q.reduce_op != q0.reduce_op) {
          return mismatch("reduce operations", r, ReduceOpName(q0.reduce_op),
                          ReduceOpName(q.reduce_op));
        }
        if (q.prescale != q0.prescale) {
          return mismatch("prescale factors", r, fmt::format("{}", q0.prescale),
                          fmt::format("{}", q.prescale));
        }
        if (q.postscale != q0.postscale) {
          return mismatch("postscale factors", r, fmt::format("{}", q0.postscale),
                          fmt::format("{}", q.postscale));
        }
        if (q.shape != q0.shape) {
          return mismatch("shapes", r, ShapeString(q0.shape), ShapeString(q.shape));
        }
        break;
      case OpType::kBroadcast:
        if (q.root_rank != q0.root_rank) {
          return mismatch("root ranks", r, std::to_string(q0.root_rank),
                          std::to_string(q.root_rank));
        }
        if (q.shape != q0.shape) {
          return mismatch("shapes", r, ShapeString(q0.shape), ShapeString(q.shape));
        }
        break;
      case OpType::kAllgather:
      case OpType::kAlltoall:
        if (q.shape.size() != q0.shape.size()) {
          return mismatch("ranks (number of dimensions)", r, std::to_string(q0.shape.size()),
                          std::to_string(q.shape.size()));
        }
        if (!std::equal(q.shape.begin() + (q.shape.empty() ? 0 : 1), q.shape.end(),
                        q0.shape.begin() + (q0.shape.empty() ? 0 : 1))) {
          return mismatch("trailing dimensions", r, TrailingString(q0.shape),
                          TrailingString(q.shape));
        }
        break;
      default:
        break;
    }
  }
  if (q0.reduce_op == ReduceOp::kAdasum &&
      (q0.op == OpType::kAllreduce || q0.op == OpType::kReducescatter)) {
    return ErrorResponse(q0, StatusCode::kAborted,
                         fmt::format("Adasum is not implemented yet (tensor '{}')", name));
  }
  if (q0.op == OpType::kReducescatter && q0.reduce_op != ReduceOp::kSum &&
      q0.reduce_op != ReduceOp::kAverage) {
    return ErrorResponse(q0, StatusCode::kAborted,
                         fmt::format("Reducescatter supports only Sum and Average, not {} "
                                     "(tensor '{}')",
                                     ReduceOpName(q0.reduce_op), name));
  }
  if (any_absent && q0.op != OpType::kAllreduce && q0.op != OpType::kBarrier) {
    return ErrorResponse(q0, StatusCode::kPreconditionError,
                         fmt::format("{} of tensor '{}' is not supported while a rank has joined",
                                     OpTypeName(q0.op), name));
  }

  Response p;
  p.op = q0.op;
  p.name = name;
  p.dtype = q0.dtype;
  p.device = q0.device;
  p.reduce_op = q0.reduce_op;
  p.prescale = q0.prescale;
  p.postscale = q0.postscale;
  p.root_rank = q0.root_rank;
  p.shape = q0.shape;
  p.group = q0.group;
  p.group_size = q0.group_size;
  int n = static_cast<int>(present.size());
  if (q0.op == OpType::kAllgather) {
    for (int r = 0; r < n; ++r)
      p.first_dims.push_back(by_rank[r].shape.empty() ? 1 : by_rank[r].shape[0]);
  } else if (q0.op == OpType::kAlltoall) {
    p.splits.reserve(static_cast<size_t>(n) * n);
    for (int r = 0; r < n; ++r) {
      if (static_cast<int>(by_rank[r].splits.size()) != n) {
        return ErrorResponse(q0, StatusCode::kInvalidArgument,
                             fmt::format("alltoall of tensor '{}': rank {} sent {} splits for {} "
                                         "ranks",
                                         name, world(r), by_rank[r].splits.size(), n));
      }
      p.splits.insert(p.splits.end(), by_rank[r].splits.begin(), by_rank[r].splits.end());
    }
  }
  return p;
}

bool MessageTable::IsReady(const Pending& p) const {
  for (int r = 0; r < size_; ++r) {
    if (!p.submitted[r] && !joined_[r]) return false;
  }
  return true;
}

Response MessageTable::Build(const std::string& name, const Pending& p) const {
  return MergeRequests(name, p.by_rank, p.submitted, &world_ranks_);
}

void MessageTable::TakeReady(const std::string& name, std::vector<Response>* ready) {
  auto it = pending_.find(name);
  Response resp = Build(name, it->second);
  pending_.erase(it);
  if (resp.group_size > 1) {
    std::string key = resp.group;
    auto& members = groups_[key];
    members.push_back(std::move(resp));
    if (static_cast<int>(members.size()) == members.front().group_size) {
      for (auto& m : members) ready->push_back(std::move(m));
      groups_.erase(key);
    }
    return;
  }
  ready->push_back(std::move(resp));
}

void MessageTable::Add(int rank, const Request& q, Clock::time_point now,
                       std::vector<Response>* ready) {
  auto [it, inserted] = pending_.try_emplace(q.name);
  Pending& p = it->second;
  if (inserted) {
    p.by_rank.resize(size_);
    p.submitted.assign(size_, false);
    p.first_seen = now;
    p.order = next_order_++;
  }
  if (p.submitted[rank]) return;  // a re-sent request (after a cache invalidation)
  p.by_rank[rank] = q;
  p.submitted[rank] = true;
  ++p.count;
  if (IsReady(p)) TakeReady(q.name, ready);
}

void MessageTable::Join(int rank, std::vector<Response>* ready) {
  if (joined_[rank]) return;
  joined_[rank] = true;
  last_joined_ = rank;
  // Tensors that only waited for this rank are ready now (in the order they were first seen).
  std::vector<std::pair<uint64_t, std::string>> now_ready;
  for (auto& [name, p] : pending_) {
    if (IsReady(p)) now_ready.emplace_back(p.order, name);
  }
  std::sort(now_ready.begin(), now_ready.end());
  for (auto& [order, name] : now_ready) TakeReady(name, ready);
}

bool MessageTable::all_joined() const {
  return std::all_of(joined_.begin(), joined_.end(), [](bool j) { return j; });
}

bool MessageTable::any_joined() const {
  return std::any_of(joined_.begin(), joined_.end(), [](bool j) { return j; });
}

void MessageTable::ResetJoin() {
  joined_.assign(size_, false);
  last_joined_ = -1;
}

std::vector<MessageTable::Stalled> MessageTable::StalledSince(Clock::duration age,
                                                              Clock::time_point now) const {
  std::vector<Stalled> out;
  for (const auto& [name, p] : pending_) {
    if (now - p.first_seen < age) continue;
    Stalled s;
    s.name = name;
    s.waited_s = std::chrono::duration<double>(now - p.first_seen).count();
    for (int r = 0; r < size_; ++r) {
      (p.submitted[r] || joined_[r] ? s.ready_ranks : s.missing_ranks).push_back(r);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace hvdc
