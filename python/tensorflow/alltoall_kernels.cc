// HorovodAlltoall: splits are validated here (bad splits are InvalidArgument, as in Horovod), the
// output is allocated by the runtime once the received counts are known.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/tensorflow/kernel_common.h"

namespace hvdc_tf {
namespace {

class HorovodAlltoallOp : public CollectiveKernel {
 public:
  explicit HorovodAlltoallOp(OpKernelConstruction* ctx)
      : CollectiveKernel(ctx, /*has_ignore_name_scope=*/true) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& input = ctx->input(0);
    const Tensor& splits = ctx->input(1);
    OP_REQUIRES_ASYNC(
        ctx, input.dims() >= 1,
        absl::InvalidArgumentError(absl::StrCat("Rank of tensor must be at least 1 for alltoall.")),
        done);
    OP_REQUIRES_ASYNC(ctx, splits.dims() == 1,
                      absl::InvalidArgumentError(absl::StrCat(
                          "splits must be a 1-D tensor, got shape ", splits.shape().DebugString())),
                      done);
    auto call = std::make_unique<CollectiveCall>(ctx, done);
    hvdc_request& request = call->AddRequest(HVDC_OP_ALLTOALL, attrs_.name, attrs_.process_set_id);
    OP_REQUIRES_OK_ASYNC(ctx, FillTensorView(input, &request.input), done);

    // Membership and set size are checked here so that the errors carry Horovod's class even
    // before negotiation; the runtime repeats the checks.
    const int included = hvdc_process_set_included(attrs_.process_set_id);
    const int set_size = hvdc_process_set_size(attrs_.process_set_id);
    if (included == 1 && set_size > 0) {
      const int64_t rows = input.dim_size(0);
      const int64_t num_splits = splits.NumElements();
      if (num_splits > 0) {
        OP_REQUIRES_ASYNC(
            ctx, num_splits == set_size,
            absl::InvalidArgumentError(absl::StrCat(
                "splits has ", num_splits, " entries; the process set has ", set_size, " ranks")),
            done);
        auto values = splits.flat<int32_t>();
        int64_t total = 0;
        for (int64_t i = 0; i < num_splits; ++i) {
          OP_REQUIRES_ASYNC(ctx, values(i) >= 0,
                            absl::InvalidArgumentError(absl::StrCat("splits must not be negative")),
                            done);
          total += values(i);
        }
        OP_REQUIRES_ASYNC(ctx, total <= rows,
                          absl::InvalidArgumentError(absl::StrCat(
                              "Sum of splits (", total,
                              ") exceeds the first dimension of the tensor (", rows, ")")),
                          done);
        std::vector<int32_t>& stored = call->Int32Storage();
        stored.assign(values.data(), values.data() + num_splits);
        request.splits = stored.data();
        request.num_splits = static_cast<int32_t>(num_splits);
      } else {
        OP_REQUIRES_ASYNC(
            ctx, rows % set_size == 0,
            absl::InvalidArgumentError(absl::StrCat("The first dimension of the tensor (", rows,
                                                    ") is not divisible by the process set size (",
                                                    set_size, "); pass splits explicitly")),
            done);
      }
      Tensor* received = nullptr;
      OP_REQUIRES_OK_ASYNC(
          ctx, ctx->allocate_output(1, tensorflow::TensorShape({set_size}), &received), done);
      request.received_splits = received->flat<int32_t>().data();
    }
    // Otherwise (not a member, unknown set, not initialized) the runtime reports the error.
    call->AllocateOutputLater(request, 0);
    CollectiveCall::Start(std::move(call), /*grouped=*/true);
  }
};

REGISTER_KERNEL_BUILDER(Name("HorovodAlltoall").Device(tensorflow::DEVICE_CPU), HorovodAlltoallOp);

}  // namespace
}  // namespace hvdc_tf
