#include "python/tensorflow/kernel_common.h"

#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/threadpool.h"

namespace hvdc_tf {

const char kNotInitializedMessage[] = "Horovod has not been initialized; use hvd.init().";
const char kPeerLostPayload[] = "horovod_compat.PeerLost";

namespace {
// Handed to the runtime for tensors with no elements (TF gives them no buffer).
alignas(64) char empty_tensor_storage[64];

// The call whose Start is running on this thread (CollectiveCall::Finish).
thread_local const void* starting_on_this_thread = nullptr;

// The `done`s handed to one TF worker pool, coalesced: the runtime's executor completes a fused
// batch of ops in a row, and one pool task then runs every `done` queued by then instead of each
// op waking a pool thread of its own. A `done` may run more of the graph inline (some runners
// do), even a kernel that waits for another collective: so a task runs only what is queued when
// it starts, and what is queued meanwhile goes to the next task -- never behind a `done` that
// waits for it.
class PoolDoneQueue {
 public:
  explicit PoolDoneQueue(tensorflow::thread::ThreadPool* pool) : pool_(pool) {}

  void Push(std::function<void()> done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(done));
      if (scheduled_) return;
      scheduled_ = true;
    }
    pool_->Schedule([this] { RunQueued(); });
  }

 private:
  void RunQueued() {
    std::vector<std::function<void()>> batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(queue_);
      scheduled_ = false;
    }
    for (auto& done : batch) done();
  }

  tensorflow::thread::ThreadPool* const pool_;
  std::mutex mu_;
  std::vector<std::function<void()>> queue_;  // guarded by mu_
  bool scheduled_ = false;                    // a task will take queue_
};

// One queue per pool, for the life of the process (a device's pool outlives its kernels' calls).
PoolDoneQueue& DoneQueueFor(tensorflow::thread::ThreadPool* pool) {
  thread_local std::pair<tensorflow::thread::ThreadPool*, PoolDoneQueue*> last{nullptr, nullptr};
  if (last.first == pool) return *last.second;
  static std::mutex mu;
  static auto* queues =
      new std::unordered_map<tensorflow::thread::ThreadPool*, std::unique_ptr<PoolDoneQueue>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& q = (*queues)[pool];
  if (!q) q = std::make_unique<PoolDoneQueue>(pool);
  last = {pool, q.get()};
  return *q;
}
}  // namespace

Status ToHvdcDtype(tensorflow::DataType dtype, int32_t* out) {
  switch (dtype) {
    case tensorflow::DT_UINT8:
      *out = HVDC_UINT8;
      return Status();
    case tensorflow::DT_INT8:
      *out = HVDC_INT8;
      return Status();
    case tensorflow::DT_UINT16:
      *out = HVDC_UINT16;
      return Status();
    case tensorflow::DT_INT16:
      *out = HVDC_INT16;
      return Status();
    case tensorflow::DT_INT32:
      *out = HVDC_INT32;
      return Status();
    case tensorflow::DT_INT64:
      *out = HVDC_INT64;
      return Status();
    case tensorflow::DT_HALF:
      *out = HVDC_FLOAT16;
      return Status();
    case tensorflow::DT_FLOAT:
      *out = HVDC_FLOAT32;
      return Status();
    case tensorflow::DT_DOUBLE:
      *out = HVDC_FLOAT64;
      return Status();
    case tensorflow::DT_BOOL:
      *out = HVDC_BOOL;
      return Status();
    case tensorflow::DT_BFLOAT16:
      *out = HVDC_BFLOAT16;
      return Status();
    default:
      return absl::InvalidArgumentError(absl::StrCat("Horovod does not support tensors of type ",
                                                     tensorflow::DataTypeString(dtype)));
  }
}

Status ToTfStatus(int code, const std::string& message) {
  switch (code) {
    case HVDC_OK:
      return Status();
    case HVDC_PRECONDITION_ERROR:
      return absl::FailedPreconditionError(message);
    case HVDC_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(message);
    case HVDC_ABORTED:
      return absl::AbortedError(message);
    case HVDC_PEER_LOST: {
      // TF's UnknownError (what Horovod raises), marked so that Python raises HorovodInternalError.
      Status status = absl::UnknownError(message);
      status.SetPayload(kPeerLostPayload, absl::Cord("1"));
      return status;
    }
    case HVDC_UNKNOWN_ERROR:
    default:
      return absl::UnknownError(message);
  }
}

Status FillTensorView(const Tensor& tensor, hvdc_tensor* view) {
  int32_t dtype = 0;
  TF_RETURN_IF_ERROR(ToHvdcDtype(tensor.dtype(), &dtype));
  if (tensor.dims() > HVDC_MAX_DIMS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Horovod supports tensors of at most ", HVDC_MAX_DIMS, " dimensions, got ", tensor.dims()));
  }
  view->dtype = dtype;
  view->ndim = tensor.dims();
  for (int i = 0; i < tensor.dims(); ++i) view->dims[i] = tensor.dim_size(i);
  view->device = -1;
  void* data = const_cast<char*>(tensor.tensor_data().data());
  view->data = data != nullptr ? data : empty_tensor_storage;
  return Status();
}

std::string CollectiveName(const std::string& node_name, bool ignore_name_scope) {
  if (!ignore_name_scope) return node_name;
  size_t slash = node_name.rfind('/');
  return slash == std::string::npos ? node_name : node_name.substr(slash + 1);
}

std::string NormalizeName(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) c = '_';
  }
  return out;
}

Status CheckInitialized() {
  if (hvdc_is_initialized() != 1) return absl::FailedPreconditionError(kNotInitializedMessage);
  return Status();
}

Status ReadCommonAttrs(OpKernelConstruction* ctx, bool has_ignore_name_scope, CommonAttrs* out) {
  if (has_ignore_name_scope) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("ignore_name_scope", &out->ignore_name_scope));
  }
  TF_RETURN_IF_ERROR(ctx->GetAttr("process_set_id", &out->process_set_id));
  out->name = CollectiveName(ctx->def().name(), out->ignore_name_scope);
  return Status();
}

CollectiveKernel::CollectiveKernel(OpKernelConstruction* ctx, bool has_ignore_name_scope)
    : AsyncOpKernel(ctx) {
  OP_REQUIRES_OK(ctx, ReadCommonAttrs(ctx, has_ignore_name_scope, &attrs_));
}

CollectiveCall::CollectiveCall(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done)
    : ctx_(ctx), done_(std::move(done)) {}

hvdc_request& CollectiveCall::AddRequest(int32_t op, std::string name, int32_t process_set_id) {
  const std::string& stored = names_.push_back(std::move(name));
  hvdc_request& request = requests_.push_back(hvdc_request{});
  request.op = op;
  request.name = stored.c_str();
  request.process_set_id = process_set_id;
  // Done and the allocator are fine on the kernel's own thread (see Finish): a one-member set
  // then runs the op at once, with no thread hand-off.
  request.flags = HVDC_REQUEST_MAY_COMPLETE_INLINE;
  return request;
}

void CollectiveCall::AllocateOutputLater(hvdc_request& request, int output_index) {
  request.allocate = &CollectiveCall::AllocateTrampoline;
  request.allocate_user = &allocators_.push_back(OutputAllocator{this, output_index});
}

void* CollectiveCall::AllocateTrampoline(void* user, int32_t ndim, const int64_t* dims) {
  auto* allocator = static_cast<OutputAllocator*>(user);
  tensorflow::TensorShape shape;
  for (int32_t i = 0; i < ndim; ++i) {
    Status status = shape.AddDimWithStatus(dims[i]);
    if (!status.ok()) {
      allocator->call->RecordError(status);
      return nullptr;
    }
  }
  Tensor* output = nullptr;
  Status status = allocator->call->ctx_->allocate_output(allocator->output_index, shape, &output);
  if (!status.ok()) {
    allocator->call->RecordError(status);
    return nullptr;
  }
  void* data = const_cast<char*>(output->tensor_data().data());
  return data != nullptr ? data : empty_tensor_storage;
}

void CollectiveCall::RecordError(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status_.ok()) status_ = status;
}

void CollectiveCall::DoneTrampoline(void* user, int code, const char* message) {
  auto* call = static_cast<CollectiveCall*>(user);
  if (code != HVDC_OK) call->RecordError(ToTfStatus(code, message != nullptr ? message : ""));
  if (call->remaining_.fetch_sub(1) == 1) call->Finish();
}

void CollectiveCall::Finish() {
  // The runtime's thread must not run TensorFlow's follow-up work (the executor may run ready
  // kernels inline from `done`): hand completion to TF's own worker threads -- unless this is the
  // kernel's own thread, inside Start (an op that completed inline, or failed to enqueue).
  auto complete = [this]() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!status_.ok()) ctx_->SetStatus(status_);
    }
    AsyncOpKernel::DoneCallback done = std::move(done_);
    delete this;
    done();
  };
  const tensorflow::DeviceBase::CpuWorkerThreads* workers =
      ctx_->device()->tensorflow_cpu_worker_threads();
  if (starting_on_this_thread != this && workers != nullptr && workers->workers != nullptr) {
    DoneQueueFor(workers->workers).Push(std::move(complete));
  } else {
    complete();
  }
}

void CollectiveCall::Start(std::unique_ptr<CollectiveCall> owned, bool grouped) {
  CollectiveCall* call = owned.release();
  // Compared by address only: `call` may be gone by the time hvdc_enqueue returns.
  // Restored, not cleared: `done` may run another kernel's Start inline on this thread.
  struct Restore {
    const void* previous;
    ~Restore() { starting_on_this_thread = previous; }
  } restore{starting_on_this_thread};
  starting_on_this_thread = call;
  const int n = static_cast<int>(call->requests_.size());
  // A copy the runtime reads while `call` may already be gone (completed inline); one request,
  // the usual case, on the stack.
  hvdc_request one = n == 1 ? call->requests_.front() : hvdc_request{};
  std::vector<hvdc_request> many;
  if (n > 1) {
    many.reserve(static_cast<size_t>(n));
    call->requests_.ForEach([&](const hvdc_request& r) { many.push_back(r); });
  }
  hvdc_request* requests = n > 1 ? many.data() : &one;
  if (grouped || n <= 1) {
    call->remaining_ = 1;
    int code = hvdc_enqueue(requests, n, &CollectiveCall::DoneTrampoline, call);
    if (code != HVDC_OK) {
      call->RecordError(ToTfStatus(code, hvdc_last_error()));
      call->remaining_ = 0;
      // Synchronous failure: complete on the calling thread.
      call->ctx_->SetStatus(call->status_);
      AsyncOpKernel::DoneCallback done = std::move(call->done_);
      delete call;
      done();
    }
    return;
  }
  // Separate enqueues; one extra count keeps the call alive until every enqueue has returned.
  call->remaining_ = n + 1;
  for (int i = 0; i < n; ++i) {
    int code = hvdc_enqueue(&requests[i], 1, &CollectiveCall::DoneTrampoline, call);
    if (code != HVDC_OK) {
      call->RecordError(ToTfStatus(code, hvdc_last_error()));
      call->remaining_.fetch_sub(n - i);  // the failed request and those never enqueued
      break;
    }
  }
  if (call->remaining_.fetch_sub(1) == 1) call->Finish();
}

}  // namespace hvdc_tf
