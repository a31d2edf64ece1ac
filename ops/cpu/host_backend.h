// The host-memory backend: runs every collective on CPU tensors over the process set's HostComm
// (MPI, or the in-memory world). Packing into the fusion buffer applies the prescale, unpacking the
// postscale; a large tensor is reduced from its own memory in cache-sized chunks.
#pragma once

#include <memory>

#include "core/backend.h"

namespace hvdc {

std::unique_ptr<Backend> MakeHostBackend();

}  // namespace hvdc
