// Batch: what the executor runs in one go -- responses of one kind fused together by the planner.
#pragma once

#include <memory>
#include <vector>

#include "core/message.h"
#include "core/tensor_entry.h"

namespace hvdc {

// A cached tensor's item shares the response cache's copy of its response: a steady-state step
// copies no names or shapes. Nobody changes a response once it is shared.
using SharedResponse = std::shared_ptr<const Response>;

struct BatchItem {
  SharedResponse response;
  std::shared_ptr<TensorEntry> entry;  // null: this rank joined and contributes zeros
};

struct Batch {
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  int32_t device = -1;
  ReduceOp reduce_op = ReduceOp::kSum;  // Average already folded into postscale
  double prescale = 1.0;
  double postscale = 1.0;
  bool fused = false;  // pack into the fusion buffer (else each item from its own memory)
  std::vector<BatchItem> items;
  StatusCode error_code = StatusCode::kOk;  // a negotiation error: fail the items, run nothing
  std::string error_message;
};

}  // namespace hvdc
