// Every ControlChannel operation on one channel against its closed-form result, for the members
// of a process set (world ranks in set order).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/control_channel.h"

namespace hvdc {
namespace conformance {

// Inputs: one cleared bit per (world rank, iteration, word); a blob per (world rank, iteration),
// empty for some.
uint64_t BitWord(int world_rank, int iter, size_t w);
std::string Blob(int world_rank, int iter);

// `iters` rounds of BitAnd (0-7 words), Gather at rank 0 and Broadcast from rank 0, with blobs of
// many sizes (empty included).
void ExerciseChannel(ControlChannel& channel, const std::vector<int>& members, int iters);

}  // namespace conformance
}  // namespace hvdc
