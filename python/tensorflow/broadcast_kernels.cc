// HorovodBroadcast and the in-place variants for TF1 reference variables
// (HorovodBroadcastInplace) and resource variables (HorovodBroadcastInplaceResource).
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/tensorflow/kernel_common.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace hvdc_tf {
namespace {

void CopyTensorBytes(const Tensor& from, Tensor* to) {
  auto src = from.tensor_data();
  if (!src.empty())
    std::memcpy(const_cast<char*>(to->tensor_data().data()), src.data(), src.size());
}

class HorovodBroadcastOp : public CollectiveKernel {
 public:
  explicit HorovodBroadcastOp(OpKernelConstruction* ctx)
      : CollectiveKernel(ctx, /*has_ignore_name_scope=*/true) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("root_rank", &root_rank_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& input = ctx->input(0);
    Tensor* output = nullptr;
    int forwarded = -1;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->forward_input_or_allocate_output({0}, 0, input.shape(), &output, &forwarded),
        done);
    // The runtime broadcasts in place in `output`; the root's value must already be there.
    if (forwarded != 0 && hvdc_rank() == root_rank_) CopyTensorBytes(input, output);
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    hvdc_request& request = call->AddRequest(HVDC_OP_BROADCAST, attrs_.name, attrs_.process_set_id);
    OP_REQUIRES_OK_ASYNC(ctx, FillTensorView(*output, &request.input), done);
    request.output = request.input;
    request.root_rank = root_rank_;
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }

 private:
  int root_rank_ = 0;
};

// Shared by both in-place kernels.
class InplaceBroadcastKernel : public CollectiveKernel {
 public:
  explicit InplaceBroadcastKernel(OpKernelConstruction* ctx)
      : CollectiveKernel(ctx, /*has_ignore_name_scope=*/false) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("root_rank", &root_rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_variables", &num_variables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("variable_names", &variable_names_));
    OP_REQUIRES(ctx, static_cast<int>(variable_names_.size()) == num_variables_,
                absl::InvalidArgumentError(
                    absl::StrCat("variable_names has ", variable_names_.size(),
                                 " entries, expected num_variables = ", num_variables_)));
  }

 protected:
  // Enqueues an in-place broadcast of `tensor`, keyed <node name>_<normalized variable name>.
  Status AddVariable(CollectiveCall* call, const Tensor& tensor, const std::string& var_name) {
    hvdc_request& request = call->AddRequest(
        HVDC_OP_BROADCAST, attrs_.name + "_" + NormalizeName(var_name), attrs_.process_set_id);
    TF_RETURN_IF_ERROR(FillTensorView(tensor, &request.input));
    request.output = request.input;
    request.root_rank = root_rank_;
    call->KeepAlive(std::make_shared<Tensor>(tensor));
    return Status();
  }

  int root_rank_ = 0;
  int num_variables_ = 0;
  std::vector<std::string> variable_names_;
};

class HorovodBroadcastInplaceOp : public InplaceBroadcastKernel {
 public:
  using InplaceBroadcastKernel::InplaceBroadcastKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    for (int i = 0; i < num_variables_; ++i) {
      ctx->forward_ref_input_to_ref_output(i, i);
      Tensor tensor = ctx->mutable_input(i, /*lock_held=*/false);
      OP_REQUIRES_OK_ASYNC(ctx, AddVariable(call.get(), tensor, variable_names_[i]), done);
    }
    CollectiveCall::Start(std::move(call), /*grouped=*/false);
  }
};

class HorovodBroadcastInplaceResourceOp : public InplaceBroadcastKernel {
 public:
  using InplaceBroadcastKernel::InplaceBroadcastKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    for (int i = 0; i < num_variables_; ++i) {
      const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(ctx, i);
      tensorflow::core::RefCountPtr<tensorflow::Var> var;
      OP_REQUIRES_OK_ASYNC(ctx, tensorflow::LookupResource(ctx, handle, &var), done);
      Tensor tensor;
      {
        tensorflow::mutex_lock lock(*var->mu());
        OP_REQUIRES_ASYNC(ctx, var->is_initialized,
                          absl::FailedPreconditionError(absl::StrCat(
                              "Resource variable ", handle.name(), " is not initialized.")),
                          done);
        Tensor* value = var->tensor();
        // Earlier reads may alias the buffer: write into a private copy, as TF's own updates do.
        if (!value->RefCountIsOne()) {
          Tensor copy;
          OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(value->dtype(), value->shape(), &copy),
                               done);
          CopyTensorBytes(*value, &copy);
          *value = copy;
        }
        tensor = *value;
      }
      const std::string& name = variable_names_[i].empty() ? handle.name() : variable_names_[i];
      OP_REQUIRES_OK_ASYNC(ctx, AddVariable(call.get(), tensor, name), done);
      tensorflow::Var* raw = var.release();
      call->KeepAlive(
          std::shared_ptr<void>(raw, [](void* p) { static_cast<tensorflow::Var*>(p)->Unref(); }));
    }
    CollectiveCall::Start(std::move(call), /*grouped=*/false);
  }
};

REGISTER_KERNEL_BUILDER(Name("HorovodBroadcast").Device(tensorflow::DEVICE_CPU),
                        HorovodBroadcastOp);
REGISTER_KERNEL_BUILDER(Name("HorovodBroadcastInplace").Device(tensorflow::DEVICE_CPU),
                        HorovodBroadcastInplaceOp);
REGISTER_KERNEL_BUILDER(Name("HorovodBroadcastInplaceResource").Device(tensorflow::DEVICE_CPU),
                        HorovodBroadcastInplaceResourceOp);

}  // namespace
}  // namespace hvdc_tf
