#include "ops/cpu/host_backend.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>
#include <vector>

#include "core/timeline.h"
#include "ops/collective_layout.h"
#include "ops/cpu/kernels.h"

namespace hvdc {
namespace {

// Times a nested timeline activity for every tensor of a batch (only when the timeline is on).
class Activity {
 public:
  Activity(ExecutionContext& ctx, const Batch& batch, const char* name) : batch_(batch) {
    if (ctx.timeline && ctx.timeline->active()) {
      tl_ = ctx.timeline;
      for (auto& item : batch.items) tl_->ActivityStart(item.response->name, name);
    }
  }
  ~Activity() {
    if (tl_) {
      for (auto& item : batch_.items) tl_->ActivityEnd(item.response->name);
    }
  }

 private:
  const Batch& batch_;
  Timeline* tl_ = nullptr;
};

class HostBackend : public Backend {
 public:
  const char* name() const override { return "host"; }
  bool Accepts(const Batch& batch) const override { return batch.device < 0; }

  Status Execute(Batch& batch, ExecutionContext& ctx) override {
    switch (batch.op) {
      case OpType::kAllreduce:
        return batch.fused ? FusedAllreduce(batch, ctx) : DirectAllreduce(batch, ctx);
      case OpType::kAllgather:
        return Allgather(batch, ctx);
      case OpType::kBroadcast:
        return Broadcast(batch, ctx);
      case OpType::kAlltoall:
        return Alltoall(batch, ctx);
      case OpType::kReducescatter:
        return Reducescatter(batch, ctx);
      case OpType::kBarrier:
        return ctx.comm->Barrier();
      case OpType::kJoin:
        for (auto& item : batch.items) {
          if (item.entry && item.entry->join_last_rank) {
            *item.entry->join_last_rank = item.response->last_joined_rank;
          }
        }
        return Status::OK();
    }
    return Status::UnknownError("unknown operation");
  }

 private:
  // Reduces `count` elements in place (or send -> recv) in chunks that stay in cache, applying the
  // scale factors chunk by chunk.
  static Status ChunkedAllreduce(ExecutionContext& ctx, const Batch& b, const uint8_t* send,
                                 uint8_t* recv, int64_t count) {
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    const int64_t chunk = std::max<int64_t>(1, ctx.config->chunk_bytes / esize);
    for (int64_t start = 0; start < count; start += chunk) {
      const int64_t n = std::min(chunk, count - start);
      const uint8_t* in = send + start * esize;
      uint8_t* out = recv + start * esize;
      if (b.prescale != 1.0) {
        cpu::ScaleCopy(out, in, n, b.dtype, b.prescale);
        in = out;
      }
      HVDC_RETURN_IF_ERROR(ctx.comm->Allreduce(in, out, n, b.dtype, b.reduce_op));
      if (b.postscale != 1.0) cpu::ScaleCopy(out, out, n, b.dtype, b.postscale);
    }
    return Status::OK();
  }

  // This rank's part of an item: its tensor, or (joined) zeros in and nothing out.
  static ReducePiece PieceOf(const BatchItem& item) {
    const int64_t count = NumElements(item.response->shape);
    if (!item.entry) return ReducePiece{nullptr, nullptr, count};
    return ReducePiece{item.entry->input, item.entry->output, count};
  }

  // On a data plane that reduces pieces where they are (HostComm::allreduces_pieces): one call
  // that scales on its way in and out, with no fusion buffer and no separate scaling pass. Inputs
  // that overlap another piece's output (aliased tensors) are first staged in the fusion buffer,
  // so every rank still makes the same call.
  static Status AllreducePieces(ExecutionContext& ctx, const Batch& b,
                                std::vector<ReducePiece> pieces) {
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    if (PiecesOverlap(pieces, esize)) {
      auto staged = [](const ReducePiece& p) { return p.in != nullptr && p.in != p.out; };
      int64_t total = 0;
      for (const ReducePiece& p : pieces) {
        if (staged(p)) total += (p.count * esize + 63) / 64 * 64;
      }
      uint8_t* at = ctx.buffer->Reserve(total);
      for (ReducePiece& p : pieces) {
        if (!staged(p)) continue;
        if (p.count > 0) std::memcpy(at, p.in, static_cast<size_t>(p.count * esize));
        p.in = at;
        at += (p.count * esize + 63) / 64 * 64;
      }
    }
    return ctx.comm->AllreducePieces(pieces, b.dtype, b.reduce_op, b.prescale, b.postscale);
  }

  static Status DirectAllreduce(Batch& b, ExecutionContext& ctx) {
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    Activity act(ctx, b, "MPI_ALLREDUCE");
    for (auto& item : b.items) {
      const int64_t count = NumElements(item.response->shape);
      if (ctx.comm->allreduces_pieces()) {
        // One piece per chunk, the scaling riding on the plane's copies in and out.
        const ReducePiece whole = PieceOf(item);
        const int64_t chunk = std::max<int64_t>(1, ctx.config->chunk_bytes / esize);
        for (int64_t start = 0; start < count || start == 0; start += chunk) {
          ReducePiece part = whole;
          part.count = std::min(chunk, count - start);
          if (part.in) part.in = static_cast<const uint8_t*>(whole.in) + start * esize;
          if (part.out) part.out = static_cast<uint8_t*>(whole.out) + start * esize;
          HVDC_RETURN_IF_ERROR(AllreducePieces(ctx, b, {part}));
          if (count == 0) break;
        }
      } else if (item.entry) {
        HVDC_RETURN_IF_ERROR(ChunkedAllreduce(ctx, b,
                                              static_cast<const uint8_t*>(item.entry->input),
                                              static_cast<uint8_t*>(item.entry->output), count));
      } else {
        // Joined: contribute zeros (in the same chunks as the live ranks) and discard the result.
        uint8_t* zeros = ctx.buffer->Reserve(count * esize);
        std::memset(zeros, 0, static_cast<size_t>(count * esize));
        HVDC_RETURN_IF_ERROR(ChunkedAllreduce(ctx, b, zeros, zeros, count));
      }
    }
    return Status::OK();
  }

  static Status FusedAllreduce(Batch& b, ExecutionContext& ctx) {
    if (ctx.comm->allreduces_pieces()) {
      // The data plane's copy in is the fusion copy, its copy out the unpacking.
      std::vector<ReducePiece> pieces;
      pieces.reserve(b.items.size());
      for (auto& item : b.items) pieces.push_back(PieceOf(item));
      Activity act(ctx, b, "MPI_ALLREDUCE");
      return AllreducePieces(ctx, b, std::move(pieces));
    }
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (auto& item : b.items) {
      offsets.push_back(total);
      total += (NumElements(item.response->shape) * esize + 63) / 64 * 64;
    }
    uint8_t* buf = ctx.buffer->Reserve(total);
    {
      Activity act(ctx, b, "MEMCPY_IN_FUSION_BUFFER");
      for (size_t i = 0; i < b.items.size(); ++i) {
        auto& item = b.items[i];
        const int64_t n = NumElements(item.response->shape);
        const int64_t padded = (n * esize + 63) / 64 * 64;
        if (n == 0) continue;
        if (item.entry) {
          cpu::ScaleCopy(buf + offsets[i], item.entry->input, n, b.dtype, b.prescale);
          std::memset(buf + offsets[i] + n * esize, 0, static_cast<size_t>(padded - n * esize));
        } else {
          std::memset(buf + offsets[i], 0, static_cast<size_t>(padded));
        }
      }
    }
    Batch unscaled = Batch();
    unscaled.dtype = b.dtype;
    unscaled.reduce_op = b.reduce_op;
    {
      Activity act(ctx, b, "MPI_ALLREDUCE");
      HVDC_RETURN_IF_ERROR(ChunkedAllreduce(ctx, unscaled, buf, buf, total / esize));
    }
    Activity act(ctx, b, "MEMCPY_OUT_FUSION_BUFFER");
    for (size_t i = 0; i < b.items.size(); ++i) {
      auto& item = b.items[i];
      if (!item.entry || NumElements(item.response->shape) == 0) continue;
      cpu::ScaleCopy(item.entry->output, buf + offsets[i], NumElements(item.response->shape),
                     b.dtype, b.postscale);
    }
    return Status::OK();
  }

  static Status Allgather(Batch& b, ExecutionContext& ctx) {
    Activity act(ctx, b, "MPI_ALLGATHER");
    for (auto& item : b.items) {
      const Response& r = *item.response;
      const AllgatherLayout l = LayOutAllgather(r, b.dtype);
      std::vector<int64_t> recv_bytes;
      for (int64_t d : r.first_dims) recv_bytes.push_back(d * l.row_bytes);
      void* out = AllocateOutput(*item.entry, l.out_shape);
      Status failed;
      if (out == nullptr && l.out_bytes > 0) {
        // Still take part (into scratch memory) so the peers' collective is matched.
        failed = OutputAllocationFailed(r, l.out_shape);
        out = ctx.buffer->Reserve(l.out_bytes);
      }
      const int me = ctx.comm->rank();
      HVDC_RETURN_IF_ERROR(
          ctx.comm->Allgatherv(item.entry->input, recv_bytes[me], out, recv_bytes));
      HVDC_RETURN_IF_ERROR(failed);
    }
    return Status::OK();
  }

  static Status Broadcast(Batch& b, ExecutionContext& ctx) {
    Activity act(ctx, b, "MPI_BCAST");
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    for (auto& item : b.items) {
      const int64_t bytes = NumElements(item.response->shape) * esize;
      TensorEntry& e = *item.entry;
      if (ctx.comm->rank() == item.response->root_rank && e.input != e.output && bytes > 0) {
        std::memcpy(e.output, e.input, static_cast<size_t>(bytes));
      }
      HVDC_RETURN_IF_ERROR(ctx.comm->Broadcast(e.output, bytes, item.response->root_rank));
    }
    return Status::OK();
  }

  static Status Alltoall(Batch& b, ExecutionContext& ctx) {
    Activity act(ctx, b, "MPI_ALLTOALL");
    for (auto& item : b.items) {
      const Response& r = *item.response;
      const AlltoallLayout l = LayOutAlltoall(r, b.dtype, ctx.comm->size(), ctx.comm->rank(),
                                              item.entry->received_splits);
      void* out = AllocateOutput(*item.entry, l.out_shape);
      Status failed;
      if (out == nullptr && l.out_bytes > 0) {
        failed = OutputAllocationFailed(r, l.out_shape);
        out = ctx.buffer->Reserve(l.out_bytes);
      }
      HVDC_RETURN_IF_ERROR(ctx.comm->Alltoallv(item.entry->input, l.send_bytes, out, l.recv_bytes));
      HVDC_RETURN_IF_ERROR(failed);
    }
    return Status::OK();
  }

  static Status Reducescatter(Batch& b, ExecutionContext& ctx) {
    Activity act(ctx, b, "MPI_REDUCESCATTER");
    const int64_t esize = static_cast<int64_t>(DataTypeSize(b.dtype));
    const int me = ctx.comm->rank();
    for (auto& item : b.items) {
      const Response& r = *item.response;
      const ReducescatterLayout l = LayOutReducescatter(r.shape, ctx.comm->size(), me);
      const int64_t kept = l.counts[me];
      void* out = AllocateOutput(*item.entry, l.out_shape);
      const void* send = item.entry->input;
      Status failed;
      // Scratch layout: [scaled input | output when allocation failed].
      const int64_t scaled_bytes = b.prescale != 1.0 ? l.total * esize : 0;
      uint8_t* scratch = nullptr;
      if (out == nullptr && kept > 0) {
        failed = OutputAllocationFailed(r, l.out_shape);
        scratch = ctx.buffer->Reserve(scaled_bytes + kept * esize);
        out = scratch + scaled_bytes;
      }
      if (b.prescale != 1.0 && l.total > 0) {
        uint8_t* scaled = scratch ? scratch : ctx.buffer->Reserve(l.total * esize);
        cpu::ScaleCopy(scaled, send, l.total, b.dtype, b.prescale);
        send = scaled;
      }
      HVDC_RETURN_IF_ERROR(ctx.comm->ReduceScatter(send, out, l.counts, b.dtype, b.reduce_op));
      HVDC_RETURN_IF_ERROR(failed);
      if (b.postscale != 1.0 && kept > 0) cpu::ScaleCopy(out, out, kept, b.dtype, b.postscale);
    }
    return Status::OK();
  }
};

}  // namespace

std::unique_ptr<Backend> MakeHostBackend() { return std::make_unique<HostBackend>(); }

}  // namespace hvdc
