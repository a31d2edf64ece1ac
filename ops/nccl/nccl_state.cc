#include "ops/nccl/nccl_state.h"

#include <fmt/format.h>

#include <cstring>

#include "core/logging.h"
#include "ops/nccl/cuda_status.h"

namespace hvdc {
namespace {

// How long shutdown lets queued GPU work finish before it aborts the communicator.
constexpr std::chrono::seconds kShutdownGrace{10};

}  // namespace

Status NcclSetState::Create(HostComm* comm, int device, CompleteFn complete,
                            std::unique_ptr<NcclSetState>* out) {
  std::unique_ptr<NcclSetState> st(new NcclSetState());
  st->device_ = device;
  st->complete_ = std::move(complete);
  // Rank 0's id travels with a flag, so a failure there fails every rank instead of hanging one.
  struct {
    int32_t ok;
    ncclUniqueId id;
  } hello;
  std::memset(&hello, 0, sizeof(hello));
  Status made;
  if (comm->rank() == 0) {
    made = NcclStatus(ncclGetUniqueId(&hello.id), "ncclGetUniqueId", nullptr);
    hello.ok = made.ok() ? 1 : 0;
  }
  HVDC_RETURN_IF_ERROR(comm->Broadcast(&hello, sizeof(hello), 0));
  HVDC_RETURN_IF_ERROR(made);
  if (hello.ok != 1) {
    return Status::UnknownError("NCCL communicator: rank 0 could not create the NCCL unique id");
  }
  // Local setup, then agreement that every member is ready: ncclCommInitRank blocks until all
  // members join, so a rank that cannot must not leave the others waiting there.
  Status ready = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  int low = 0;
  int high = 0;
  if (ready.ok()) {
    ready = CudaStatus(cudaDeviceGetStreamPriorityRange(&low, &high),
                       "cudaDeviceGetStreamPriorityRange");
  }
  if (ready.ok()) {
    ready = CudaStatus(cudaStreamCreateWithPriority(&st->stream_, cudaStreamNonBlocking, high),
                       "cudaStreamCreateWithPriority");
  }
  const int32_t mine = ready.ok() ? 1 : 0;
  int32_t all = 0;
  HVDC_RETURN_IF_ERROR(comm->Allreduce(&mine, &all, 1, DataType::kInt32, ReduceOp::kMin));
  HVDC_RETURN_IF_ERROR(ready);
  if (all != 1) {
    return Status::UnknownError(
        "NCCL communicator: another member of the process set could not set up its device");
  }
  ncclComm_t nccl = nullptr;
  HVDC_NCCL_RETURN(ncclCommInitRank(&nccl, comm->size(), hello.id, comm->rank()), nullptr);
  st->comm_ = nccl;
  if (st->complete_) st->thread_ = std::thread([s = st.get()] { s->CompletionLoop(); });
  *out = std::move(st);
  return Status::OK();
}

NcclSetState::~NcclSetState() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    deadline_ = std::chrono::steady_clock::now() + kShutdownGrace;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Nothing is in flight any more (or it was aborted): ncclCommAbort frees the communicator
  // without the collective handshake of ncclCommDestroy, which could wait for a dead peer.
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) ncclCommAbort(comm_);
    aborted_ = true;
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Status NcclSetState::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

Status NcclSetState::Scratch(int64_t bytes, uint8_t** out) {
  if (bytes > scratch_bytes_) {
    // Round up so that a slowly growing workload does not reallocate every step.
    const int64_t want = std::max<int64_t>(bytes, scratch_bytes_ + scratch_bytes_ / 4);
    if (scratch_ != nullptr) HVDC_CUDA_RETURN(cudaFreeAsync(scratch_, stream_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    void* p = nullptr;
    HVDC_CUDA_RETURN(cudaMallocAsync(&p, static_cast<size_t>(want), stream_));
    scratch_ = static_cast<uint8_t*>(p);
    scratch_bytes_ = want;
  }
  *out = scratch_;
  return Status::OK();
}

Status NcclSetState::GetEvent(cudaEvent_t* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_events_.empty()) {
      *out = free_events_.back();
      free_events_.pop_back();
      return Status::OK();
    }
  }
  HVDC_CUDA_RETURN(cudaEventCreateWithFlags(out, cudaEventDisableTiming));
  return Status::OK();
}

void NcclSetState::PutEvent(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  free_events_.push_back(event);
}

Status NcclSetState::Finish(Batch& batch, const Status& queued) {
  cudaEvent_t event = nullptr;
  HVDC_RETURN_IF_ERROR(GetEvent(&event));
  const cudaError_t rec = cudaEventRecord(event, stream_);
  if (rec != cudaSuccess) {
    cudaEventDestroy(event);
    // Without an event nothing tells when the queued work ends: wait for the whole stream.
    cudaStreamSynchronize(stream_);
    return queued.ok() ? CudaStatus(rec, "cudaEventRecord") : queued;
  }
  if (!complete_) {
    Status s = Wait(event);
    PutEvent(event);
    return queued.ok() ? s : queued;
  }
  Pending p;
  p.event = event;
  p.queued = queued;
  p.batch.op = batch.op;
  p.batch.dtype = batch.dtype;
  p.batch.device = batch.device;
  p.batch.items.resize(batch.items.size());
  for (size_t i = 0; i < batch.items.size(); ++i) {
    p.batch.items[i].entry = std::move(batch.items[i].entry);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(p));
  }
  cv_.notify_one();
  return Status::OK();
}

void NcclSetState::CompletionLoop() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, and everything queued has completed
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    lock.unlock();
    Status s = Wait(p.event);
    PutEvent(p.event);
    if (!p.queued.ok()) s = p.queued;
    if (!s.ok())
      LogError("NCCL {} on device {} failed: {}", OpTypeName(p.batch.op), device_, s.message());
    complete_(p.batch, s);
    lock.lock();
  }
}

Status NcclSetState::Wait(cudaEvent_t event) {
  using Clock = std::chrono::steady_clock;
  // Spin briefly (collectives on small batches finish within microseconds), then back off to
  // short sleeps so a long collective costs no CPU.
  const auto spin_until = Clock::now() + std::chrono::microseconds(50);
  auto nap = std::chrono::microseconds(5);
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return broken();
    if (q != cudaErrorNotReady) {
      Status s = CudaStatus(q, "cudaEventQuery");
      Abort(s);
      return s;
    }
    if (polls % 64 == 0) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        Status s =
            NcclStatus(r != ncclSuccess ? r : async, "NCCL collective (asynchronous error)", comm_);
        Abort(s);
        return s;
      }
      bool late;
      {
        std::lock_guard<std::mutex> lock(mu_);
        late = stopping_ && Clock::now() > deadline_;
      }
      if (late) {
        Status s = Status::Aborted(fmt::format(
            "NCCL work on device {} did not finish within {} s of shutdown; communicator aborted",
            device_, kShutdownGrace.count()));
        Abort(s);
        return s;
      }
    }
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }
}

void NcclSetState::Abort(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.ok()) broken_ = why;
  if (!aborted_ && comm_ != nullptr) {
    LogError("aborting the NCCL communicator on device {}: {}", device_, why.message());
    ncclCommAbort(comm_);
    aborted_ = true;
  }
}

}  // namespace hvdc
