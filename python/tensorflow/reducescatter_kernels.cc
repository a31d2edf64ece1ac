// HorovodReducescatter and HorovodGroupedReducescatter: each rank's output slice is allocated
// by the runtime once the split of the first dimension is known.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/tensorflow/kernel_common.h"

namespace hvdc_tf {
namespace {

struct ScatterAttrs {
  int reduce_op = HVDC_SUM;
  float prescale = 1.0f;
  float postscale = 1.0f;
};

Status AddReducescatter(OpKernelContext* ctx, CollectiveCall* call, int i, std::string name,
                        int process_set_id, const ScatterAttrs& attrs) {
  const Tensor& input = ctx->input(i);
  if (input.dims() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rank of tensor must be at least 1 for reducescatter."));
  }
  hvdc_request& request = call->AddRequest(HVDC_OP_REDUCESCATTER, std::move(name), process_set_id);
  TF_RETURN_IF_ERROR(FillTensorView(input, &request.input));
  request.reduce_op = attrs.reduce_op;
  request.prescale_factor = attrs.prescale;
  request.postscale_factor = attrs.postscale;
  call->AllocateOutputLater(request, i);
  return Status();
}

class ReducescatterKernel : public CollectiveKernel {
 public:
  explicit ReducescatterKernel(OpKernelConstruction* ctx)
      : CollectiveKernel(ctx, /*has_ignore_name_scope=*/true) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reduce_op", &scatter_.reduce_op));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("prescale_factor", &scatter_.prescale));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("postscale_factor", &scatter_.postscale));
  }

 protected:
  ScatterAttrs scatter_;
};

class HorovodReducescatterOp : public ReducescatterKernel {
 public:
  using ReducescatterKernel::ReducescatterKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    OP_REQUIRES_OK_ASYNC(
        ctx, AddReducescatter(ctx, call.get(), 0, attrs_.name, attrs_.process_set_id, scatter_),
        done);
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }
};

class HorovodGroupedReducescatterOp : public ReducescatterKernel {
 public:
  explicit HorovodGroupedReducescatterOp(OpKernelConstruction* ctx) : ReducescatterKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tensors", &num_tensors_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    for (int i = 0; i < num_tensors_; ++i) {
      std::string name =
          attrs_.name + "_" + std::to_string(i + 1) + "of" + std::to_string(num_tensors_);
      OP_REQUIRES_OK_ASYNC(
          ctx,
          AddReducescatter(ctx, call.get(), i, std::move(name), attrs_.process_set_id, scatter_),
          done);
    }
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }

 private:
  int num_tensors_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("HorovodReducescatter").Device(tensorflow::DEVICE_CPU),
                        HorovodReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedReducescatter").Device(tensorflow::DEVICE_CPU),
                        HorovodGroupedReducescatterOp);

}  // namespace
}  // namespace hvdc_tf
