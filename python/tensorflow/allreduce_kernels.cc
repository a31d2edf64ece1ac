// HorovodAllreduce and HorovodGroupedAllreduce: reduce in place whenever TF lets the output
// reuse the input buffer (forward_input_or_allocate_output), never blocking a TF thread.
#include <string>

#include "python/tensorflow/kernel_common.h"

namespace hvdc_tf {
namespace {

class ReduceAttrs {
 public:
  explicit ReduceAttrs(OpKernelConstruction* ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("postscale_factor", &postscale_));
  }
  void Apply(hvdc_request* request) const {
    request->reduce_op = reduce_op_;
    request->prescale_factor = prescale_;
    request->postscale_factor = postscale_;
  }

 private:
  int reduce_op_ = HVDC_SUM;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
};

// Adds the allreduce of input i into output i (reusing the input buffer when possible).
Status AddAllreduce(OpKernelContext* ctx, CollectiveCall* call, int i, std::string name,
                    int process_set_id, const ReduceAttrs& reduce) {
  const Tensor& input = ctx->input(i);
  Tensor* output = nullptr;
  TF_RETURN_IF_ERROR(ctx->forward_input_or_allocate_output({i}, i, input.shape(), &output));
  hvdc_request& request = call->AddRequest(HVDC_OP_ALLREDUCE, std::move(name), process_set_id);
  TF_RETURN_IF_ERROR(FillTensorView(input, &request.input));
  TF_RETURN_IF_ERROR(FillTensorView(*output, &request.output));
  reduce.Apply(&request);
  return Status();
}

class HorovodAllreduceOp : public CollectiveKernel {
 public:
  explicit HorovodAllreduceOp(OpKernelConstruction* ctx)
      : CollectiveKernel(ctx, /*has_ignore_name_scope=*/true), reduce_(ctx) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    OP_REQUIRES_OK_ASYNC(
        ctx, AddAllreduce(ctx, call.get(), 0, attrs_.name, attrs_.process_set_id, reduce_), done);
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }

 private:
  ReduceAttrs reduce_;
};

class HorovodGroupedAllreduceOp : public CollectiveKernel {
 public:
  explicit HorovodGroupedAllreduceOp(OpKernelConstruction* ctx)
      : CollectiveKernel(ctx, /*has_ignore_name_scope=*/true), reduce_(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tensors", &num_tensors_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    for (int i = 0; i < num_tensors_; ++i) {
      std::string name =
          attrs_.name + "_" + std::to_string(i + 1) + "of" + std::to_string(num_tensors_);
      OP_REQUIRES_OK_ASYNC(
          ctx, AddAllreduce(ctx, call.get(), i, std::move(name), attrs_.process_set_id, reduce_),
          done);
    }
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }

 private:
  ReduceAttrs reduce_;
  int num_tensors_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("HorovodAllreduce").Device(tensorflow::DEVICE_CPU),
                        HorovodAllreduceOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedAllreduce").Device(tensorflow::DEVICE_CPU),
                        HorovodGroupedAllreduceOp);

}  // namespace
}  // namespace hvdc_tf
