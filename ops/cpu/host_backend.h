// The host-memory backend: runs every collective on CPU tensors over the process set's HostComm
// (MPI, or the in-memory world). Packing into the fusion buffer applies the prescale, unpacking the
// postscale; a large tensor is reduced from its own memory in cache-sized chunks. On a data plane
// that reduces a list of pieces where they are (the shared-memory plane), an allreduce batch is
// one such call instead: no fusion buffer, the scaling applied in the plane's copies in and out.
#pragma once

#include <memory>

#include "core/backend.h"

namespace hvdc {

std::unique_ptr<Backend> MakeHostBackend();

}  // namespace hvdc
