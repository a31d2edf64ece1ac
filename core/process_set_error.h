// Why a process-set call (add, remove, the queries) failed. Runtime's process-set methods return a
// Status carrying one of these as its detail; only the C API (c_api.cc) turns them into Horovod's
// HOROVOD_PROCESS_SET_ERROR_* codes.
#pragma once

#include <string>

#include "core/status.h"

namespace hvdc {

enum class ProcessSetError : int {
  kNone = 0,
  kInit,         // not initialized, invalid ranks, or the ranks disagreed
  kDynamicOff,   // add/remove without HOROVOD_DYNAMIC_PROCESS_SETS
  kUnknownSet,   // no such set (never created, or removed)
  kForeignSet,   // this rank is not a member
  kShutDown,     // the runtime has shut down (or did meanwhile)
  kExistingSet,  // add: a set with these ranks exists
};

// The Status for `why`: its code is the nearest StatusCode, its detail `why`.
Status ProcessSetFailure(ProcessSetError why, std::string message);
// kNone for OK and for statuses that did not come from ProcessSetFailure.
ProcessSetError ProcessSetErrorOf(const Status& status);

}  // namespace hvdc
