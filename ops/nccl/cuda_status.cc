#include "ops/nccl/cuda_status.h"

#include <fmt/format.h>

namespace hvdc {

Status CudaStatus(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return Status::OK();
  return Status::UnknownError(
      fmt::format("{} failed: {} ({})", call, cudaGetErrorString(err), cudaGetErrorName(err)));
}

Status NcclStatus(ncclResult_t res, const char* call, ncclComm_t comm) {
  if (res == ncclSuccess) return Status::OK();
  std::string msg = fmt::format("{} failed: {}", call, ncclGetErrorString(res));
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && detail[0] != '\0') msg += fmt::format(" ({})", detail);
  return Status::UnknownError(std::move(msg));
}

}  // namespace hvdc
