// One-member process sets (a one-rank job, or a set of one rank in a larger one) have nothing to
// negotiate and nobody to exchange data with: their collectives run at once, on the caller's
// thread, through the same planner and backend as every other batch -- over SelfComm instead of
// the transport. This saves the hand-offs to the control and executor threads and back, which are
// most of a small operation's cost (issue 15: a one-rank eager allreduce took 10x tf.identity).
#include <fmt/format.h>

#include "core/fusion_planner.h"
#include "core/logging.h"
#include "core/message_table.h"
#include "core/runtime.h"
#include "core/self_comm.h"

namespace hvdc {

bool Runtime::RunsInline(const ProcessSet& st,
                         const std::vector<std::shared_ptr<TensorEntry>>& entries) const {
  if (st.ranks.size() != 1 || !st.member()) return false;
  // The timeline records negotiation and the executor's activities: keep its picture whole.
  if (timeline_ && timeline_->active()) return false;
  for (const auto& e : entries) {
    // Barrier and join stay with the control thread: join changes the negotiator's state.
    if (!IsDataCollective(e->request.op) || e->request.device >= 0 || e->ready_event != nullptr) {
      return false;
    }
  }
  return true;
}

Status Runtime::RunInline(ProcessSet& st, std::vector<std::shared_ptr<TensorEntry>> entries) {
  HVDC_RETURN_IF_ERROR(st.queue.Claim(entries));
  std::vector<BatchItem> ready;
  ready.reserve(entries.size());
  for (auto& e : entries) {
    ready.push_back(BatchItem{std::make_shared<const Response>(
                                  MergeRequests(e->request.name, {e->request}, {true}, &st.ranks)),
                              std::move(e)});
  }
  std::vector<Batch> batches = PlanBatches(std::move(ready), config_, 1);

  // Per calling thread: the scratch memory a backend may ask for (reducescatter's prescale).
  thread_local FusionBuffer buffer;
  SelfComm self;
  ExecutionContext ctx;
  ctx.config = &config_;
  ctx.comm = &self;
  ctx.buffer = &buffer;
  const int me = topology().rank;
  for (Batch& b : batches) {
    b.fused = false;  // each tensor from its own memory: no staging copy
    Status status;
    if (b.error_code != StatusCode::kOk) {
      status = Status::FromCode(b.error_code, b.error_message).WithOrigin(me);
    } else {
      Backend* backend = nullptr;
      for (Backend* candidate : backends_) {
        if (candidate->Accepts(b)) {
          backend = candidate;
          break;
        }
      }
      if (backend == nullptr) {
        status =
            Status::UnknownError(fmt::format("no backend can run {} of {} in host memory",
                                             OpTypeName(b.op), b.items.front().response->name));
      } else {
        try {
          status = backend->Execute(b, ctx);
        } catch (const std::exception& ex) {
          status = Status::UnknownError(fmt::format("{} failed: {}", OpTypeName(b.op), ex.what()));
        }
      }
      if (!status.ok()) {
        LogError("process set {}: {} failed: {}", st.id, OpTypeName(b.op), status.message());
      }
    }
    for (auto& item : b.items) {
      st.queue.Release(item.entry->request.name);
      item.entry->completion->MemberDone(status);
      item.entry.reset();
    }
  }
  return Status::OK();
}

}  // namespace hvdc
