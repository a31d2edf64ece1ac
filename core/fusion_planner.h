// FusionPlanner: turns a round's ordered responses into the batches the executor runs. Small
// allreduces with the same dtype, device, reduce op and scale factors are packed together up to the
// fusion threshold; a tensor of at least HVDC_ZERO_COPY_BYTES is reduced from its own memory (no
// staging copy). Every rank plans the same responses identically, so batches match across ranks.
#pragma once

#include <memory>
#include <vector>

#include "core/batch.h"
#include "core/config.h"

namespace hvdc {

std::vector<Batch> PlanBatches(std::vector<BatchItem> ready, const Config& config, int set_size);

}  // namespace hvdc
