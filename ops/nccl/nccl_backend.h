// The NCCL backend: runs batches whose tensors are in CUDA device memory (device >= 0), one NCCL
// communicator per process set, finishing asynchronously through CUDA events (docs/gpu.md
// describes the design).
#pragma once

#include <memory>

#include "core/backend.h"

namespace hvdc {

std::unique_ptr<Backend> MakeNcclBackend();

}  // namespace hvdc
