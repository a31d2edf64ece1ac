#include "ops/nccl/nccl_state.h"

#include <fmt/format.h>

#include <cstring>

#include "core/logging.h"
#include "ops/nccl/cuda_status.h"

namespace hvdc {
namespace {

// How long shutdown lets queued GPU work finish before it aborts the communicator.
constexpr std::chrono::seconds kShutdownGrace{10};

// "allreduce of 'a' (+3 more)": which work a stall or error message is about.
std::string Describe(const Batch& batch) {
  if (batch.items.empty()) return OpTypeName(batch.op);
  std::string s =
      fmt::format("{} of '{}'", OpTypeName(batch.op), batch.items.front().response->name);
  if (batch.items.size() > 1) s += fmt::format(" (+{} more)", batch.items.size() - 1);
  return s;
}

}  // namespace

Status NcclSetState::Create(HostComm* comm, int device, CompleteFn complete, StallLimits limits,
                            std::unique_ptr<NcclSetState>* out) {
  std::unique_ptr<NcclSetState> st(new NcclSetState());
  st->device_ = device;
  st->complete_ = std::move(complete);
  st->limits_ = limits;
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

Status NcclSetState::WaitForInputs(const Batch& batch) {
  for (const auto& item : batch.items) {
    if (!item.entry || item.entry->ready_event == nullptr) continue;
    auto* event = static_cast<cudaEvent_t>(const_cast<void*>(item.entry->ready_event));
    const cudaError_t err = cudaStreamWaitEvent(stream_, event, 0);
    if (err != cudaSuccess) {
      return CudaStatus(
          err,
          fmt::format("cudaStreamWaitEvent(ready_event of '{}')", item.response->name).c_str());
    }
  }
  return Status::OK();
}

Status NcclSetState::Finish(Batch& batch, const Status& queued) {
  const auto queued_at = Clock::now();
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
    Status s = Wait(event, Describe(batch), queued_at);
    PutEvent(event);
    return queued.ok() ? s : queued;
  }
  Pending p;
  p.event = event;
  p.queued = queued;
  p.what = Describe(batch);
  p.queued_at = queued_at;
  p.batch.op = batch.op;
  p.batch.dtype = batch.dtype;
  p.batch.device = batch.device;
  // Consumers with a stream of their own wait on the event there and are released now; the rest
  // wait for the completion thread.
  Batch early;
  for (auto& item : batch.items) {
    if (!item.entry) continue;
    auto* consumer = static_cast<cudaStream_t>(item.entry->done_stream);
    if (queued.ok() && consumer != nullptr &&
        cudaStreamWaitEvent(consumer, event, 0) == cudaSuccess) {
      early.items.emplace_back();
      early.items.back().entry = std::move(item.entry);
    } else {
      p.batch.items.emplace_back();
      p.batch.items.back().entry = std::move(item.entry);
    }
  }
  if (!early.items.empty()) complete_(early, Status::OK());
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
    Status s = Wait(p.event, p.what, p.queued_at);
    PutEvent(p.event);
    if (!p.queued.ok()) s = p.queued;
    if (!s.ok()) LogError("NCCL {} on device {} failed: {}", p.what, device_, s.message());
    complete_(p.batch, s);
    lock.lock();
  }
}

Status NcclSetState::Wait(cudaEvent_t event, const std::string& what, Clock::time_point since) {
  // Spin briefly (collectives on small batches finish within microseconds), then back off to
  // short sleeps so a long collective costs no CPU.
  const auto spin_until = Clock::now() + std::chrono::microseconds(50);
  auto nap = std::chrono::microseconds(5);
  bool warned = false;
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
      const auto now = Clock::now();
      const double waited = std::chrono::duration<double>(now - since).count();
      if (!warned && limits_.warn_after_s > 0 && waited > limits_.warn_after_s) {
        warned = true;
        LogWarning(
            "NCCL {} on device {} has not finished after {:.0f} s: a member of the process set "
            "may have failed before its collective, or be stuck (HOROVOD_STALL_SHUTDOWN_TIME_"
            "SECONDS aborts it)",
            what, device_, waited);
      }
      if (limits_.abort_after_s > 0 && waited > limits_.abort_after_s) {
        Status s = Status::Aborted(fmt::format(
            "NCCL {} on device {} did not finish within HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={} s; "
            "communicator aborted",
            what, device_, limits_.abort_after_s));
        Abort(s);
        return s;
      }
      bool late;
      {
        std::lock_guard<std::mutex> lock(mu_);
        late = stopping_ && now > deadline_;
      }
      if (late) {
        Status s = Status::Aborted(fmt::format(
            "NCCL {} on device {} did not finish within {} s of shutdown; communicator aborted",
            what, device_, kShutdownGrace.count()));
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
