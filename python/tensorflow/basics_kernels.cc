// HorovodJoin and the runtime-valued topology ops (size, rank, local size/rank, membership).
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/tensorflow/kernel_common.h"

namespace hvdc_tf {
namespace {

class HorovodJoinOp : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &output), done);
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    hvdc_request& request = call->AddRequest(HVDC_OP_JOIN, "join.noname", 0);
    request.join_last_rank = output->flat<int32_t>().data();
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }
};

// Writes `value` as an int32 scalar; -1 from the C API means "not initialized".
void OutputTopologyValue(OpKernelContext* ctx, int value) {
  OP_REQUIRES(ctx, value != -1 || hvdc_is_initialized() == 1,
              absl::FailedPreconditionError(kNotInitializedMessage));
  OP_REQUIRES(
      ctx, value >= 0,
      absl::InvalidArgumentError(absl::StrCat("Horovod topology query failed with code ", value)));
  Tensor* output = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &output));
  output->scalar<int32_t>()() = value;
}

class HorovodSizeOp : public tensorflow::OpKernel {
 public:
  explicit HorovodSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("process_set_id", &process_set_id_));
  }
  void Compute(OpKernelContext* ctx) override {
    int value = hvdc_process_set_size(process_set_id_);
    OP_REQUIRES(
        ctx, value != HVDC_PROCESS_SET_ERROR_UNKNOWN_SET,
        absl::InvalidArgumentError(absl::StrCat("Unknown process set id ", process_set_id_)));
    OutputTopologyValue(ctx, value);
  }

 private:
  int process_set_id_ = 0;
};

class HorovodProcessSetIncludedOp : public tensorflow::OpKernel {
 public:
  explicit HorovodProcessSetIncludedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("process_set_id", &process_set_id_));
  }
  // Returns the C API's answer as is: 1, 0, or a negative process-set error code.
  void Compute(OpKernelContext* ctx) override {
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &output));
    output->scalar<int32_t>()() = hvdc_process_set_included(process_set_id_);
  }

 private:
  int process_set_id_ = 0;
};

template <int (*Query)()>
class TopologyOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override { OutputTopologyValue(ctx, Query()); }
};

REGISTER_KERNEL_BUILDER(Name("HorovodJoin").Device(tensorflow::DEVICE_CPU), HorovodJoinOp);
REGISTER_KERNEL_BUILDER(Name("HorovodSize").Device(tensorflow::DEVICE_CPU), HorovodSizeOp);
REGISTER_KERNEL_BUILDER(Name("HorovodProcessSetIncluded").Device(tensorflow::DEVICE_CPU),
                        HorovodProcessSetIncludedOp);
REGISTER_KERNEL_BUILDER(Name("HorovodLocalSize").Device(tensorflow::DEVICE_CPU),
                        TopologyOp<hvdc_local_size>);
REGISTER_KERNEL_BUILDER(Name("HorovodRank").Device(tensorflow::DEVICE_CPU), TopologyOp<hvdc_rank>);
REGISTER_KERNEL_BUILDER(Name("HorovodLocalRank").Device(tensorflow::DEVICE_CPU),
                        TopologyOp<hvdc_local_rank>);

}  // namespace
}  // namespace hvdc_tf
