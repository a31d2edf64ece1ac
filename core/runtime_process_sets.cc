// Process sets at run time: add_process_set / remove_process_set (proposed by every rank, agreed
// in a round of the global set, applied at its end; see process_set_admin.h) and the queries.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <boost/asio/post.hpp>

#include "core/c_api.h"
#include "core/execution_order.h"
#include "core/logging.h"
#include "core/runtime.h"

namespace hvdc {

using std::chrono::milliseconds;

int Runtime::RunAdmin(std::shared_ptr<AdminOp> op) {
  std::future<int> result = op->result.get_future();
  boost::asio::post(io_, [this, op] {
    if (shutting_down_ || global_closed_) {
      op->result.set_value(HVDC_PROCESS_SET_ERROR_SHUTDOWN);
      return;
    }
    admin_.push_back(op);
    Wake();
  });
  // A stopped io_context never runs the task (nor anything posted after it): give up then.
  while (result.wait_for(milliseconds(20)) != std::future_status::ready) {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (finished_) {
      return result.wait_for(milliseconds(0)) == std::future_status::ready
                 ? result.get()
                 : HVDC_PROCESS_SET_ERROR_SHUTDOWN;
    }
  }
  return result.get();
}

int Runtime::AddProcessSet(std::vector<int> ranks) {
  if (!config_.dynamic_process_sets) return HVDC_PROCESS_SET_ERROR_DYNAMIC;
  if (down_.load()) return HVDC_PROCESS_SET_ERROR_SHUTDOWN;
  return RunAdmin(MakeAddOp(std::move(ranks), topology().size));
}

int Runtime::RemoveProcessSet(int id) {
  if (!config_.dynamic_process_sets) return HVDC_PROCESS_SET_ERROR_DYNAMIC;
  if (down_.load()) return HVDC_PROCESS_SET_ERROR_SHUTDOWN;
  if (id == 0 || !sets_.Find(id)) return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
  return RunAdmin(MakeRemoveOp(id));
}

int Runtime::ProcessSetRank(int id) const {
  auto st = sets_.Find(id);
  if (!st) return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
  return st->member() ? st->set_rank : HVDC_PROCESS_SET_ERROR_FOREIGN_SET;
}

int Runtime::ProcessSetSize(int id) const {
  auto st = sets_.Find(id);
  return st ? static_cast<int>(st->ranks.size()) : HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
}

int Runtime::ProcessSetIncluded(int id) const {
  auto st = sets_.Find(id);
  if (!st) return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
  return st->member() ? 1 : 0;
}

std::vector<int> Runtime::ProcessSetIds() const { return sets_.Ids(); }

int Runtime::ProcessSetRanks(int id, std::vector<int>* ranks) const {
  auto st = sets_.Find(id);
  if (!st) return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
  *ranks = st->ranks;
  return 0;
}

bool Runtime::ApplyAdmin(const std::vector<uint64_t>& words, bool shutdown) {
  if (!ChangeProposedByAll(words) || admin_.empty()) return false;
  std::shared_ptr<AdminOp> op = admin_.front();
  admin_.pop_front();
  if (shutdown) {
    op->result.set_value(HVDC_PROCESS_SET_ERROR_SHUTDOWN);
  } else if (!ChangeAgreed(words, op->hash)) {
    if (op->add) {
      LogError("add_process_set({}): ranks passed different lists", op->ranks);
    } else {
      LogError("remove_process_set({}): ranks passed different process sets", op->id);
    }
    op->result.set_value(HVDC_PROCESS_SET_ERROR_INIT);
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
    LogError("add_process_set({}): invalid ranks (world size {})", op.ranks, topology().size);
    op.result.set_value(HVDC_PROCESS_SET_ERROR_INIT);
    return;
  }
  if (sets_.IdOf(op.ranks) >= 0) {
    op.result.set_value(HVDC_PROCESS_SET_ERROR_EXISTING_SET);
    return;
  }
  const int id = sets_.FreeId();
  // A world collective, but every rank reaches it at the end of the same global round.
  Status s = CreateSet(id, op.ranks);
  if (!s.ok()) {
    LogError("add_process_set({}): {}", op.ranks, s.message());
    op.result.set_value(HVDC_PROCESS_SET_ERROR_INIT);
    return;
  }
  op.result.set_value(id);
}

void Runtime::ApplyRemove(const std::shared_ptr<AdminOp>& op) {
  SetPtr st = sets_.Remove(op->id);
  if (!st) {
    op->result.set_value(HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);
    return;
  }
  if (!st->member()) {
    op->result.set_value(0);
    return;
  }
  // The members close the set in one of its own rounds (possibly before this one, on a member
  // that saw that round first); FinishRemovals then tells the caller.
  st->removed = [op](int rc) { op->result.set_value(rc); };
  if (!st->closed) st->controller->RequestRemoval();
}

void Runtime::FinishRemovals() {
  auto done = sets_.TakeFinished(
      [](const ProcessSet& st) { return st.closed && st.held.empty() && !st.executor->busy(); });
  for (auto& st : done) {
    st->executor->Stop();
    st->channels = ProcessSetChannels();  // frees the communicators on the control thread
    if (st->removed) st->removed(0);
  }
}

void Runtime::FailAdmin() {
  for (auto& op : admin_) op->result.set_value(HVDC_PROCESS_SET_ERROR_SHUTDOWN);
  admin_.clear();
}

}  // namespace hvdc
