// The negotiation messages: a rank's requests (what it wants to run) and the coordinator's
// responses (what every rank runs, in order). wire_format.h turns them into bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace hvdc {

struct Request {
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::string name;
  Shape shape;
  int32_t device = -1;    // -1 = host memory
  int32_t root_rank = 0;  // broadcast: rank within the process set
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int32_t> splits;  // alltoall: rows for each set rank (resolved, never empty)
  int32_t group_size = 0;       // > 1: member of a group negotiated as a unit
  std::string group;            // the group's key (first member's name)
};

struct RequestList {
  int32_t rank = 0;  // sender's rank within the process set
  std::vector<Request> requests;
  bool shutdown = false;
};

struct Response {
  OpType op = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  int32_t device = -1;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  Shape shape;                      // allreduce, broadcast, reducescatter: the tensor's shape;
                                    // allgather, alltoall: rank 0's shape (trailing dims shared)
  std::vector<int64_t> first_dims;  // allgather: dim 0 of every rank
  std::vector<int32_t> splits;      // alltoall: size x size, row r = rank r's send splits
  int32_t last_joined_rank = -1;    // join
  int32_t group_size = 0;
  std::string group;
  StatusCode error_code = StatusCode::kOk;  // != kOk: this tensor failed negotiation
  std::string error_message;
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;
  std::string shutdown_reason;  // why, when the runtime shuts down because of an error
  // What the members' operations fail with (kPeerLost: a member of an elastic job left).
  StatusCode shutdown_code = StatusCode::kUnknownError;
};

}  // namespace hvdc
