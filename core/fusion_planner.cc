#include "core/fusion_planner.h"

#include <map>
#include <tuple>

namespace hvdc {
namespace {

Batch SingleBatch(BatchItem item, int set_size) {
  Batch b;
  const Response& r = *item.response;
  b.op = r.op;
  b.dtype = r.dtype;
  b.device = r.device;
  b.reduce_op = r.reduce_op;
  b.prescale = r.prescale;
  b.postscale = r.postscale;
  if (r.reduce_op == ReduceOp::kAverage) {
    b.reduce_op = ReduceOp::kSum;
    b.postscale /= set_size;
  }
  b.error_code = r.error_code;
  b.error_message = r.error_message;
  b.items.push_back(std::move(item));
  return b;
}

}  // namespace

std::vector<Batch> PlanBatches(std::vector<BatchItem> ready, const Config& config, int set_size) {
  std::vector<Batch> batches;
  // Open fused batches by key; a batch closes when the next tensor would pass the threshold.
  using Key = std::tuple<int, int, int, double, double, std::string>;
  std::map<Key, size_t> open;
  std::vector<int64_t> open_bytes;
  for (BatchItem& item : ready) {
    const Response& r = *item.response;
    const int64_t bytes = NumElements(r.shape) * static_cast<int64_t>(DataTypeSize(r.dtype));
    const bool fusible = r.error_code == StatusCode::kOk && r.op == OpType::kAllreduce &&
                         config.fusion_threshold_bytes > 0 && bytes < config.zero_copy_bytes &&
                         bytes <= config.fusion_threshold_bytes;
    if (!fusible) {
      batches.push_back(SingleBatch(std::move(item), set_size));
      open_bytes.push_back(0);
      continue;
    }
    Key key{static_cast<int>(r.dtype),
            r.device,
            static_cast<int>(r.reduce_op),
            r.prescale,
            r.postscale,
            config.disable_group_fusion && r.group_size > 1 ? r.group : std::string()};
    auto it = open.find(key);
    const int64_t aligned = (bytes + 63) / 64 * 64;
    if (it != open.end() && open_bytes[it->second] + aligned <= config.fusion_threshold_bytes) {
      batches[it->second].items.push_back(std::move(item));
      open_bytes[it->second] += aligned;
      continue;
    }
    batches.push_back(SingleBatch(std::move(item), set_size));
    batches.back().fused = true;
    open_bytes.push_back(aligned);
    open[key] = batches.size() - 1;
  }
  return batches;
}

}  // namespace hvdc
