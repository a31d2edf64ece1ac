// CUDA and NCCL results as Status: every failure names the call and the library's error string.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "core/status.h"

namespace hvdc {

Status CudaStatus(cudaError_t err, const char* call);
Status NcclStatus(ncclResult_t res, const char* call, ncclComm_t comm);

}  // namespace hvdc

#define HVDC_CUDA_RETURN(call)                          \
  do {                                                  \
    const cudaError_t hvdc_cuda_err_ = (call);          \
    if (hvdc_cuda_err_ != cudaSuccess) {                \
      return ::hvdc::CudaStatus(hvdc_cuda_err_, #call); \
    }                                                   \
  } while (0)

// `comm` (may be null) adds ncclGetLastError's detail to the message.
#define HVDC_NCCL_RETURN(call, comm)                            \
  do {                                                          \
    const ncclResult_t hvdc_nccl_res_ = (call);                 \
    if (hvdc_nccl_res_ != ncclSuccess) {                        \
      return ::hvdc::NcclStatus(hvdc_nccl_res_, #call, (comm)); \
    }                                                           \
  } while (0)
