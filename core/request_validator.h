// Request validation: what a request must satisfy, against the process set it is enqueued on,
// before it is queued. One place, so every front end (the C API, the thread-rank tests) gets the
// same errors. The C API checks only that its C structs translate (pointers, enum values).
#pragma once

#include <vector>

#include "core/message.h"
#include "core/status.h"

namespace hvdc {

struct SetView {
  int id = 0;
  const std::vector<int>* ranks = nullptr;  // world ranks of the set, sorted
};

// Checks *q against the set and completes it in place: a broadcast's root becomes a rank within
// the set, alltoall without splits gets equal splits, join and barrier get their reserved names.
Status ValidateRequest(const SetView& set, Request* q);

// Valid process-set membership: non-empty, distinct, every rank in [0, world_size). `ranks` sorted.
bool ValidSetRanks(const std::vector<int>& ranks, int world_size);

}  // namespace hvdc
