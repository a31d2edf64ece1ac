// Process sets at run time: add_process_set / remove_process_set (proposed by every rank, agreed
// in a round of the global set, applied at its end; see process_set_admin.h) and the queries.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <boost/asio/post.hpp>

#include "core/execution_order.h"
#include "core/logging.h"
#include "core/process_set_error.h"
#include "core/runtime.h"

namespace hvdc {

using std::chrono::milliseconds;

namespace {

Status ShutDown() {
  return ProcessSetFailure(ProcessSetError::kShutDown, "the runtime has shut down");
}

Status UnknownSet(int id) {
  return ProcessSetFailure(
      ProcessSetError::kUnknownSet,
      fmt::format("process set {} is not known (never added, or removed)", id));
}

}  // namespace

Status Runtime::RunAdmin(std::shared_ptr<AdminOp> op) {
  std::future<Status> result = op->result.get_future();
  boost::asio::post(io_, [this, op] {
    if (!life_.running()) {
      op->result.set_value(ShutDown());
      return;
    }
    admin_.push_back(op);
    Wake();
  });
  // A stopped io_context never runs the task (nor anything posted after it): give up then.
  while (result.wait_for(milliseconds(20)) != std::future_status::ready) {
    if (life_.settled()) {
      return result.wait_for(milliseconds(0)) == std::future_status::ready ? result.get()
                                                                           : ShutDown();
    }
  }
  return result.get();
}

Status Runtime::AddProcessSet(std::vector<int> ranks, int* id) {
  if (!config_.dynamic_process_sets) {
    return ProcessSetFailure(ProcessSetError::kDynamicOff,
                             "add_process_set needs HOROVOD_DYNAMIC_PROCESS_SETS=1");
  }
  if (!life_.running()) return ShutDown();
  std::shared_ptr<AdminOp> op = MakeAddOp(std::move(ranks), topology().size);
  HVDC_RETURN_IF_ERROR(RunAdmin(op));
  *id = op->id;
  return Status::OK();
}

Status Runtime::RemoveProcessSet(int id) {
  if (!config_.dynamic_process_sets) {
    return ProcessSetFailure(ProcessSetError::kDynamicOff,
                             "remove_process_set needs HOROVOD_DYNAMIC_PROCESS_SETS=1");
  }
  if (!life_.running()) return ShutDown();
  if (id == 0 || !sets_.Find(id)) return UnknownSet(id);
  return RunAdmin(MakeRemoveOp(id));
}

Status Runtime::ProcessSetRank(int id, int* rank) const {
  auto st = sets_.Find(id);
  if (!st) return UnknownSet(id);
  if (!st->member()) {
    return ProcessSetFailure(ProcessSetError::kForeignSet,
                             fmt::format("this rank is not a member of process set {}", id));
  }
  *rank = st->set_rank;
  return Status::OK();
}

Status Runtime::ProcessSetSize(int id, int* size) const {
  auto st = sets_.Find(id);
  if (!st) return UnknownSet(id);
  *size = static_cast<int>(st->ranks.size());
  return Status::OK();
}

Status Runtime::ProcessSetIncluded(int id, bool* included) const {
  auto st = sets_.Find(id);
  if (!st) return UnknownSet(id);
  *included = st->member();
  return Status::OK();
}

std::vector<int> Runtime::ProcessSetIds() const { return sets_.Ids(); }

Status Runtime::ProcessSetRanks(int id, std::vector<int>* ranks) const {
  auto st = sets_.Find(id);
  if (!st) return UnknownSet(id);
  *ranks = st->ranks;
  return Status::OK();
}

bool Runtime::ApplyAdmin(const std::vector<uint64_t>& words, bool shutdown) {
  if (!ChangeProposedByAll(words) || admin_.empty()) return false;
  std::shared_ptr<AdminOp> op = admin_.front();
  admin_.pop_front();
  if (shutdown) {
    op->result.set_value(ShutDown());
  } else if (!ChangeAgreed(words, op->hash)) {
    std::string why =
        op->add
            ? fmt::format("add_process_set({}): ranks passed different lists", op->ranks)
            : fmt::format("remove_process_set({}): ranks passed different process sets", op->id);
    LogError("{}", why);
    op->result.set_value(ProcessSetFailure(ProcessSetError::kInit, std::move(why)));
  } else if (op->add) {
    ApplyAdd(*op);
  } else {
    ApplyRemove(op);
  }
  Wake();  // a new set to drive, or a removal to carry out
  return true;
}

void Runtime::ApplyAdd(AdminOp& op) {
  if (!op.valid) {
    std::string why = fmt::format("add_process_set({}): invalid ranks (world size {})", op.ranks,
                                  topology().size);
    LogError("{}", why);
    op.result.set_value(ProcessSetFailure(ProcessSetError::kInit, std::move(why)));
    return;
  }
  if (int existing = sets_.IdOf(op.ranks); existing >= 0) {
    op.result.set_value(ProcessSetFailure(
        ProcessSetError::kExistingSet,
        fmt::format("add_process_set({}): process set {} has these ranks", op.ranks, existing)));
    return;
  }
  const int id = sets_.FreeId();
  // A world collective, but every rank reaches it at the end of the same global round.
  Status s = CreateSet(id, op.ranks);
  if (!s.ok()) {
    std::string why = fmt::format("add_process_set({}): {}", op.ranks, s.message());
    LogError("{}", why);
    op.result.set_value(ProcessSetFailure(ProcessSetError::kInit, std::move(why)));
    return;
  }
  op.id = id;
  op.result.set_value(Status::OK());
}

void Runtime::ApplyRemove(const std::shared_ptr<AdminOp>& op) {
  SetPtr st = sets_.Remove(op->id);
  if (!st) {
    op->result.set_value(UnknownSet(op->id));
    return;
  }
  if (!st->member()) {
    op->result.set_value(Status::OK());
    return;
  }
  // The members close the set in one of its own rounds (possibly before this one, on a member
  // that saw that round first); FinishRemovals then tells the caller.
  st->removed = [op](Status s) { op->result.set_value(std::move(s)); };
  if (!st->closed) st->negotiator->RequestRemoval();
}

void Runtime::FinishRemovals() {
  auto done = sets_.TakeFinished([](const ProcessSet& st) {
    return st.closed && st.held.empty() && !st.executor->BusyOrWakeWhenIdle();
  });
  for (auto& st : done) {
    st->executor->Stop();
    st->channels = ProcessSetChannels();  // frees the communicators on the control thread
    if (st->removed) st->removed(Status::OK());
  }
}

void Runtime::FailAdmin() {
  for (auto& op : admin_) op->result.set_value(ShutDown());
  admin_.clear();
}

}  // namespace hvdc
