// HorovodAllgather and HorovodGroupedAllgather: the output is allocated by the runtime's
// allocator callback once every rank's first dimension is known.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/tensorflow/kernel_common.h"

namespace hvdc_tf {
namespace {

Status AddAllgather(OpKernelContext* ctx, CollectiveCall* call, int i, std::string name,
                    int process_set_id) {
  const Tensor& input = ctx->input(i);
  if (input.dims() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rank of tensor must be at least 1 for allgather."));
  }
  hvdc_request& request = call->AddRequest(HVDC_OP_ALLGATHER, std::move(name), process_set_id);
  TF_RETURN_IF_ERROR(FillTensorView(input, &request.input));
  call->AllocateOutputLater(request, i);
  return Status();
}

class HorovodAllgatherOp : public CollectiveKernel {
 public:
  explicit HorovodAllgatherOp(OpKernelConstruction* ctx)
      : CollectiveKernel(ctx, /*has_ignore_name_scope=*/true) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    OP_REQUIRES_OK_ASYNC(ctx, AddAllgather(ctx, call.get(), 0, attrs_.name, attrs_.process_set_id),
                         done);
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }
};

class HorovodGroupedAllgatherOp : public CollectiveKernel {
 public:
  explicit HorovodGroupedAllgatherOp(OpKernelConstruction* ctx)
      : CollectiveKernel(ctx, /*has_ignore_name_scope=*/true) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tensors", &num_tensors_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    for (int i = 0; i < num_tensors_; ++i) {
      std::string name =
          attrs_.name + "_" + std::to_string(i + 1) + "of" + std::to_string(num_tensors_);
      OP_REQUIRES_OK_ASYNC(
          ctx, AddAllgather(ctx, call.get(), i, std::move(name), attrs_.process_set_id), done);
    }
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }

 private:
  int num_tensors_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("HorovodAllgather").Device(tensorflow::DEVICE_CPU),
                        HorovodAllgatherOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedAllgather").Device(tensorflow::DEVICE_CPU),
                        HorovodGroupedAllgatherOp);

}  // namespace
}  // namespace hvdc_tf
