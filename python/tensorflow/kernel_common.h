// Shared plumbing of the Horovod TensorFlow kernels: dtype and status translation, tensor views,
// collective naming (the node name is the key that matches an op across ranks, as in Horovod) and
// CollectiveCall, which owns everything one asynchronous kernel invocation hands to hvdc_enqueue
// until the runtime's completion callback has run.
#ifndef HVDC_PYTHON_TENSORFLOW_KERNEL_COMMON_H_
#define HVDC_PYTHON_TENSORFLOW_KERNEL_COMMON_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/c_api.h"
#include "python/tensorflow/stable_list.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hvdc_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using Status = absl::Status;
using tensorflow::Tensor;

// The message Horovod gives when an op runs before hvd.init().
extern const char kNotInitializedMessage[];
// The payload key marking a lost peer (HVDC_PEER_LOST) on an UnknownError; Python turns such
// errors into HorovodInternalError (horovod_compat/tensorflow/peer_lost.py). Keep in sync.
extern const char kPeerLostPayload[];

// TF dtype -> hvdc_dtype; InvalidArgument for types the runtime does not carry.
Status ToHvdcDtype(tensorflow::DataType dtype, int32_t* out);

// hvdc_status_code + message -> the TF error class Horovod raises for it (docs/tensorflow.md).
Status ToTfStatus(int code, const std::string& message);

// Describes `tensor` (host memory) for the runtime. Empty tensors get a non-null dummy pointer.
Status FillTensorView(const Tensor& tensor, hvdc_tensor* view);

// The key matching this op across ranks: the node name, or only its last component when
// ignore_name_scope is set.
std::string CollectiveName(const std::string& node_name, bool ignore_name_scope);

// Every character outside [A-Za-z0-9_] replaced by '_'.
std::string NormalizeName(const std::string& name);

// FailedPrecondition when the runtime is not initialized.
Status CheckInitialized();

// Reads the attributes every collective shares.
struct CommonAttrs {
  bool ignore_name_scope = false;
  int process_set_id = 0;
  std::string name;  // the collective key (node name with ignore_name_scope applied)
};
Status ReadCommonAttrs(OpKernelConstruction* ctx, bool has_ignore_name_scope, CommonAttrs* out);

// One kernel invocation's requests and the storage they point into. Build it, then call Start():
// ownership passes to the runtime and the object deletes itself after calling `done`.
class CollectiveCall {
 public:
  CollectiveCall(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done);
  CollectiveCall(const CollectiveCall&) = delete;
  CollectiveCall& operator=(const CollectiveCall&) = delete;

  // A zero-initialised request with op, name and process set filled in. References stay valid
  // until Start().
  hvdc_request& AddRequest(int32_t op, std::string name, int32_t process_set_id);

  // Makes `request` allocate TF output `output_index` once the runtime knows its shape.
  void AllocateOutputLater(hvdc_request& request, int output_index);

  // Storage that must outlive the operation (alltoall splits, variable tensors, ...).
  std::vector<int32_t>& Int32Storage() { return int32_storage_; }
  void KeepAlive(std::shared_ptr<void> thing) { keep_alive_.push_back(std::move(thing)); }

  // grouped: one hvdc_enqueue of all requests (negotiated and fused as a unit). Otherwise each
  // request is enqueued on its own and the kernel completes after the last one.
  static void Start(std::unique_ptr<CollectiveCall> call, bool grouped);

 private:
  struct OutputAllocator {
    CollectiveCall* call;
    int output_index;
  };
  static void* AllocateTrampoline(void* user, int32_t ndim, const int64_t* dims);
  static void DoneTrampoline(void* user, int code, const char* message);
  void RecordError(const Status& status);
  void Finish();

  OpKernelContext* ctx_;
  AsyncOpKernel::DoneCallback done_;
  StableList<std::string> names_;
  StableList<hvdc_request> requests_;
  StableList<OutputAllocator> allocators_;
  std::vector<int32_t> int32_storage_;
  std::vector<std::shared_ptr<void>> keep_alive_;
  std::atomic<int> remaining_{0};
  std::mutex mu_;
  Status status_;  // first error; guarded by mu_
};

// Base of the collective kernels: reads the shared attributes once.
class CollectiveKernel : public AsyncOpKernel {
 public:
  CollectiveKernel(OpKernelConstruction* ctx, bool has_ignore_name_scope);

 protected:
  CommonAttrs attrs_;
};

}  // namespace hvdc_tf

#endif  // HVDC_PYTHON_TENSORFLOW_KERNEL_COMMON_H_
