// One collective of a HostComm against its closed-form result, for the members of a process set
// (world ranks in set order; this rank is members[comm.rank()]). Each makes the collective call
// whatever happened before (so no rank leaves its peers waiting) and reports only the first
// mismatch.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/host_comm.h"
#include "core/types.h"

namespace hvdc {
namespace conformance {

void CheckAllreduce(HostComm& comm, const std::vector<int>& members, DataType dtype, ReduceOp op,
                    int64_t count, bool in_place);
// bytes[q]: what set rank q contributes. In place: this rank's block is already at its offset of
// recv, and send points there.
void CheckAllgatherv(HostComm& comm, const std::vector<int>& members,
                     const std::vector<int64_t>& bytes, bool in_place);
void CheckBroadcast(HostComm& comm, const std::vector<int>& members, int root, int64_t bytes);
// split(a, b): bytes set rank a sends set rank b.
void CheckAlltoallv(HostComm& comm, const std::vector<int>& members,
                    const std::function<int64_t(int a, int b)>& split);
// In place: send == recv, which holds the whole input and gets this rank's block at its start.
void CheckReduceScatter(HostComm& comm, const std::vector<int>& members, DataType dtype,
                        ReduceOp op, const std::vector<int64_t>& counts, bool in_place);

}  // namespace conformance
}  // namespace hvdc
