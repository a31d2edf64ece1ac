// Each collective queues its work on the set's private stream and returns; NcclSetState::Finish
// completes the batch when the GPU has run it. Reductions with pre/postscale fuse the scaling into
// the pack/unpack kernel (fused batches) or run the scale kernel in place (tensors reduced from
// their own memory).
#include "ops/nccl/nccl_backend.h"

#include <fmt/format.h>

#include <vector>

#include "ops/collective_layout.h"
#include "ops/cuda/batched_copy.h"
#include "ops/nccl/cuda_status.h"
#include "ops/nccl/nccl_state.h"

namespace hvdc {
namespace {

// Fusion-buffer slots start on this boundary (16-byte vectors in the pack kernel, and NCCL's own
// preference for aligned buffers).
constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool ReductionType(DataType t, ncclDataType_t* out) {
  switch (t) {
    case DataType::kFloat16:
      *out = ncclFloat16;
      return true;
    case DataType::kBfloat16:
      *out = ncclBfloat16;
      return true;
    case DataType::kFloat32:
      *out = ncclFloat32;
      return true;
    case DataType::kFloat64:
      *out = ncclFloat64;
      return true;
    case DataType::kInt32:
      *out = ncclInt32;
      return true;
    case DataType::kInt64:
      *out = ncclInt64;
      return true;
    case DataType::kUint8:
      *out = ncclUint8;
      return true;
    case DataType::kInt8:
      *out = ncclInt8;
      return true;
    default:
      return false;
  }
}

bool ReductionOp(ReduceOp op, ncclRedOp_t* out) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:  // the planner folds the division into the postscale factor
      *out = ncclSum;
      return true;
    case ReduceOp::kMin:
      *out = ncclMin;
      return true;
    case ReduceOp::kMax:
      *out = ncclMax;
      return true;
    case ReduceOp::kProduct:
      *out = ncclProd;
      return true;
    default:
      return false;
  }
}

// ncclGroupStart/End as a scope; End's result is returned by Close().
class NcclGroup {
 public:
  explicit NcclGroup(ncclComm_t comm) : comm_(comm) { open_ = ncclGroupStart() == ncclSuccess; }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  Status Close() {
    if (!open_) return Status::UnknownError("ncclGroupStart failed");
    open_ = false;
    HVDC_NCCL_RETURN(ncclGroupEnd(), comm_);
    return Status::OK();
  }

 private:
  ncclComm_t comm_;
  bool open_ = false;
};

class NcclBackend : public Backend {
 public:
  const char* name() const override { return "nccl"; }

  bool Accepts(const Batch& batch) const override {
    return batch.device >= 0 && IsDataCollective(batch.op);
  }

  Status Execute(Batch& batch, ExecutionContext& ctx) override {
    NcclSetState* st = nullptr;
    HVDC_RETURN_IF_ERROR(GetState(batch, ctx, &st));
    HVDC_RETURN_IF_ERROR(st->broken());
    HVDC_CUDA_RETURN(cudaSetDevice(st->device()));
    const bool reduction = batch.op == OpType::kAllreduce || batch.op == OpType::kReducescatter;
    if (reduction) {
      ncclDataType_t t;
      ncclRedOp_t op;
      if (!ReductionType(batch.dtype, &t)) {
        return Status::InvalidArgument(fmt::format("NCCL {}: data type {} is not supported",
                                                   OpTypeName(batch.op),
                                                   DataTypeName(batch.dtype)));
      }
      if (!ReductionOp(batch.reduce_op, &op)) {
        return Status::InvalidArgument(fmt::format("NCCL {}: reduce op {} is not supported",
                                                   OpTypeName(batch.op),
                                                   ReduceOpName(batch.reduce_op)));
      }
    }
    for (auto& item : batch.items) {
      if (!item.entry && batch.op != OpType::kAllreduce) {
        return Status::InvalidArgument(
            fmt::format("NCCL {}: tensor '{}' has no local entry (joined ranks take part in "
                        "allreduce only)",
                        OpTypeName(batch.op), item.response->name));
      }
    }
    // A failure here leaves the other members' collective waiting: the stall limits end that.
    HVDC_RETURN_IF_ERROR(st->WaitForInputs(batch));
    Status queued;
    switch (batch.op) {
      case OpType::kAllreduce:
        queued = batch.fused ? FusedAllreduce(batch, *st) : DirectAllreduce(batch, *st);
        break;
      case OpType::kAllgather:
        queued = Allgather(batch, *st);
        break;
      case OpType::kBroadcast:
        queued = Broadcast(batch, *st);
        break;
      case OpType::kAlltoall:
        queued = Alltoall(batch, *st);
        break;
      case OpType::kReducescatter:
        queued = Reducescatter(batch, *st);
        break;
      default:
        queued = Status::UnknownError("NCCL: unsupported operation");
    }
    // Whatever was queued before an error still has to run before the outputs are handed back:
    // the batch completes in stream order either way, with the first error.
    return st->Finish(batch, queued);
  }

 private:
  Status GetState(const Batch& batch, ExecutionContext& ctx, NcclSetState** out) {
    auto it = ctx.states.find(this);
    if (it == ctx.states.end()) {
      std::unique_ptr<NcclSetState> st;
      NcclSetState::StallLimits limits;
      if (ctx.config != nullptr && !ctx.config->stall_check_disable) {
        limits.warn_after_s = ctx.config->stall_check_time_s;
        limits.abort_after_s = ctx.config->stall_shutdown_time_s;
      }
      const Status made = NcclSetState::Create(ctx.comm, batch.device, ctx.complete, limits, &st);
      if (!made.ok()) {
        return Status::UnknownError(fmt::format("creating the NCCL communicator on device {}: {}",
                                                batch.device, made.message()));
      }
      it = ctx.states.emplace(this, std::move(st)).first;
    }
    auto* st = static_cast<NcclSetState*>(it->second.get());
    if (st->device() != batch.device) {
      return Status::InvalidArgument(fmt::format(
          "NCCL {} of '{}': the process set's communicator is on device {}, the tensor on device "
          "{} (one device per process and set)",
          OpTypeName(batch.op), batch.items.front().response->name, st->device(), batch.device));
    }
    *out = st;
    return Status::OK();
  }

  // Small tensors: pack (with prescale) into the device fusion buffer, one allreduce, unpack (with
  // postscale). Joined ranks contribute zeros.
  static Status FusedAllreduce(Batch& b, NcclSetState& st) {
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    std::vector<int64_t> offsets;
    offsets.reserve(b.items.size());
    int64_t total = 0;
    for (auto& item : b.items) {
      offsets.push_back(total);
      total += AlignUp(NumElements(item.response->shape) * esize);
    }
    if (total == 0) return Status::OK();
    uint8_t* buf = nullptr;
    HVDC_RETURN_IF_ERROR(st.Scratch(total, &buf));
    std::vector<cuda::CopySegment> in;
    std::vector<cuda::CopySegment> out;
    for (size_t i = 0; i < b.items.size(); ++i) {
      const auto& item = b.items[i];
      const int64_t bytes = NumElements(item.response->shape) * esize;
      if (bytes == 0) continue;
      if (!item.entry) {
        HVDC_CUDA_RETURN(
            cudaMemsetAsync(buf + offsets[i], 0, static_cast<size_t>(bytes), st.stream()));
        continue;
      }
      in.push_back({item.entry->input, buf + offsets[i], bytes});
      out.push_back({buf + offsets[i], item.entry->output, bytes});
    }
    HVDC_CUDA_RETURN(cuda::BatchedCopy(in.data(), static_cast<int>(in.size()), b.dtype, b.prescale,
                                       st.stream()));
    ncclDataType_t t;
    ncclRedOp_t op;
    ReductionType(b.dtype, &t);
    ReductionOp(b.reduce_op, &op);
    HVDC_NCCL_RETURN(
        ncclAllReduce(buf, buf, static_cast<size_t>(total / esize), t, op, st.comm(), st.stream()),
        st.comm());
    HVDC_CUDA_RETURN(cuda::BatchedCopy(out.data(), static_cast<int>(out.size()), b.dtype,
                                       b.postscale, st.stream()));
    return Status::OK();
  }

  // Large tensors: reduced from their own memory (input -> output, or in place), every allreduce
  // of the batch in one NCCL group; scaling runs in place on the output before and after.
  static Status DirectAllreduce(Batch& b, NcclSetState& st) {
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    ncclDataType_t t;
    ncclRedOp_t op;
    ReductionType(b.dtype, &t);
    ReductionOp(b.reduce_op, &op);
    // Joined ranks reduce zeros from scratch memory, one slot per tensor.
    int64_t zero_bytes = 0;
    for (auto& item : b.items) {
      if (!item.entry) zero_bytes += AlignUp(NumElements(item.response->shape) * esize);
    }
    uint8_t* zeros = nullptr;
    if (zero_bytes > 0) {
      HVDC_RETURN_IF_ERROR(st.Scratch(zero_bytes, &zeros));
      HVDC_CUDA_RETURN(cudaMemsetAsync(zeros, 0, static_cast<size_t>(zero_bytes), st.stream()));
    }
    struct Call {
      const void* send;
      void* recv;
      int64_t count;
    };
    std::vector<Call> calls;
    std::vector<cuda::CopySegment> pre;
    std::vector<cuda::CopySegment> post;
    int64_t zero_at = 0;
    for (auto& item : b.items) {
      const int64_t count = NumElements(item.response->shape);
      if (count == 0) continue;
      if (!item.entry) {
        calls.push_back({zeros + zero_at, zeros + zero_at, count});
        zero_at += AlignUp(count * esize);
        continue;
      }
      const void* send = item.entry->input;
      if (b.prescale != 1.0) {
        pre.push_back({send, item.entry->output, count * esize});
        send = item.entry->output;
      }
      calls.push_back({send, item.entry->output, count});
      if (b.postscale != 1.0)
        post.push_back({item.entry->output, item.entry->output, count * esize});
    }
    HVDC_CUDA_RETURN(cuda::BatchedCopy(pre.data(), static_cast<int>(pre.size()), b.dtype,
                                       b.prescale, st.stream()));
    {
      NcclGroup group(st.comm());
      for (const Call& c : calls) {
        HVDC_NCCL_RETURN(ncclAllReduce(c.send, c.recv, static_cast<size_t>(c.count), t, op,
                                       st.comm(), st.stream()),
                         st.comm());
      }
      HVDC_RETURN_IF_ERROR(group.Close());
    }
    HVDC_CUDA_RETURN(cuda::BatchedCopy(post.data(), static_cast<int>(post.size()), b.dtype,
                                       b.postscale, st.stream()));
    return Status::OK();
  }

  // Uneven first dimensions: one broadcast per rank into its slice of the output, in one group
  // (NCCL has no allgatherv); even ones use ncclAllGather.
  static Status Allgather(Batch& b, NcclSetState& st) {
    for (auto& item : b.items) {
      const Response& r = *item.response;
      const AllgatherLayout l = LayOutAllgather(r, b.dtype);
      auto* out = static_cast<uint8_t*>(AllocateOutput(*item.entry, l.out_shape));
      Status failed;
      if (out == nullptr && l.out_bytes > 0) {
        // Still take part (into scratch memory) so the peers' collective is matched.
        failed = OutputAllocationFailed(r, l.out_shape);
        HVDC_RETURN_IF_ERROR(st.Scratch(l.out_bytes, &out));
      }
      if (l.out_bytes > 0) {
        if (l.even) {
          HVDC_NCCL_RETURN(ncclAllGather(item.entry->input, out,
                                         static_cast<size_t>(r.first_dims.front() * l.row_bytes),
                                         ncclUint8, st.comm(), st.stream()),
                           st.comm());
        } else {
          NcclGroup group(st.comm());
          int64_t at = 0;
          for (size_t p = 0; p < r.first_dims.size(); ++p) {
            const int64_t bytes = r.first_dims[p] * l.row_bytes;
            if (bytes > 0) {
              HVDC_NCCL_RETURN(
                  ncclBroadcast(item.entry->input, out + at, static_cast<size_t>(bytes), ncclUint8,
                                static_cast<int>(p), st.comm(), st.stream()),
                  st.comm());
            }
            at += bytes;
          }
          HVDC_RETURN_IF_ERROR(group.Close());
        }
      }
      HVDC_RETURN_IF_ERROR(failed);
    }
    return Status::OK();
  }

  static Status Broadcast(Batch& b, NcclSetState& st) {
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    NcclGroup group(st.comm());
    for (auto& item : b.items) {
      const int64_t bytes = NumElements(item.response->shape) * esize;
      if (bytes == 0) continue;
      HVDC_NCCL_RETURN(
          ncclBroadcast(item.entry->input, item.entry->output, static_cast<size_t>(bytes),
                        ncclUint8, item.response->root_rank, st.comm(), st.stream()),
          st.comm());
    }
    return group.Close();
  }

  static Status Alltoall(Batch& b, NcclSetState& st) {
    int n = 0;
    int me = 0;
    HVDC_NCCL_RETURN(ncclCommCount(st.comm(), &n), st.comm());
    HVDC_NCCL_RETURN(ncclCommUserRank(st.comm(), &me), st.comm());
    for (auto& item : b.items) {
      const Response& r = *item.response;
      const AlltoallLayout l = LayOutAlltoall(r, b.dtype, n, me, item.entry->received_splits);
      auto* out = static_cast<uint8_t*>(AllocateOutput(*item.entry, l.out_shape));
      Status failed;
      if (out == nullptr && l.out_bytes > 0) {
        failed = OutputAllocationFailed(r, l.out_shape);
        HVDC_RETURN_IF_ERROR(st.Scratch(l.out_bytes, &out));
      }
      const auto* in = static_cast<const uint8_t*>(item.entry->input);
      int64_t send_at = 0;
      int64_t recv_at = 0;
      NcclGroup group(st.comm());
      for (int p = 0; p < n; ++p) {
        if (p == me) {
          if (l.send_bytes[p] > 0) {
            HVDC_CUDA_RETURN(cudaMemcpyAsync(out + recv_at, in + send_at,
                                             static_cast<size_t>(l.send_bytes[p]),
                                             cudaMemcpyDeviceToDevice, st.stream()));
          }
        } else {
          if (l.send_bytes[p] > 0) {
            HVDC_NCCL_RETURN(ncclSend(in + send_at, static_cast<size_t>(l.send_bytes[p]), ncclUint8,
                                      p, st.comm(), st.stream()),
                             st.comm());
          }
          if (l.recv_bytes[p] > 0) {
            HVDC_NCCL_RETURN(ncclRecv(out + recv_at, static_cast<size_t>(l.recv_bytes[p]),
                                      ncclUint8, p, st.comm(), st.stream()),
                             st.comm());
          }
        }
        send_at += l.send_bytes[p];
        recv_at += l.recv_bytes[p];
      }
      HVDC_RETURN_IF_ERROR(group.Close());
      HVDC_RETURN_IF_ERROR(failed);
    }
    return Status::OK();
  }

  // Rows split as every backend splits them (LayOutReducescatter). Even splits use
  // ncclReduceScatter; uneven ones one ncclReduce per rank in a group.
  static Status Reducescatter(Batch& b, NcclSetState& st) {
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    ncclDataType_t t;
    ncclRedOp_t op;
    ReductionType(b.dtype, &t);
    ReductionOp(b.reduce_op, &op);
    int n = 0;
    int me = 0;
    HVDC_NCCL_RETURN(ncclCommCount(st.comm(), &n), st.comm());
    HVDC_NCCL_RETURN(ncclCommUserRank(st.comm(), &me), st.comm());
    for (auto& item : b.items) {
      const Response& r = *item.response;
      const ReducescatterLayout l = LayOutReducescatter(r.shape, n, me);
      auto* out = static_cast<uint8_t*>(AllocateOutput(*item.entry, l.out_shape));
      // Scratch layout: [scaled input | output when allocation failed].
      const int64_t scaled_bytes = b.prescale != 1.0 ? AlignUp(l.total * esize) : 0;
      const bool need_out = out == nullptr && l.counts[me] > 0;
      Status failed = need_out ? OutputAllocationFailed(r, l.out_shape) : Status::OK();
      uint8_t* scratch = nullptr;
      if (scaled_bytes > 0 || need_out) {
        HVDC_RETURN_IF_ERROR(
            st.Scratch(scaled_bytes + (need_out ? l.counts[me] * esize : 0), &scratch));
      }
      if (need_out) out = scratch + scaled_bytes;
      const auto* send = static_cast<const uint8_t*>(item.entry->input);
      if (scaled_bytes > 0 && l.total > 0) {
        HVDC_CUDA_RETURN(cuda::Scale(scratch, send, l.total, b.dtype, b.prescale, st.stream()));
        send = scratch;
      }
      if (l.total > 0) {
        if (l.even) {
          HVDC_NCCL_RETURN(ncclReduceScatter(send, out, static_cast<size_t>(l.counts[0]), t, op,
                                             st.comm(), st.stream()),
                           st.comm());
        } else {
          NcclGroup group(st.comm());
          int64_t at = 0;
          for (int p = 0; p < n; ++p) {
            if (l.counts[p] > 0) {
              HVDC_NCCL_RETURN(
                  ncclReduce(send + at * esize, p == me ? out : nullptr,
                             static_cast<size_t>(l.counts[p]), t, op, p, st.comm(), st.stream()),
                  st.comm());
            }
            at += l.counts[p];
          }
          HVDC_RETURN_IF_ERROR(group.Close());
        }
      }
      if (b.postscale != 1.0 && l.counts[me] > 0) {
        HVDC_CUDA_RETURN(cuda::Scale(out, out, l.counts[me], b.dtype, b.postscale, st.stream()));
      }
      HVDC_RETURN_IF_ERROR(failed);
    }
    return Status::OK();
  }
};

}  // namespace

std::unique_ptr<Backend> MakeNcclBackend() { return std::make_unique<NcclBackend>(); }

}  // namespace hvdc
