#include "core/runtime.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <numeric>
#include <thread>

#include "core/c_api.h"
#include "core/fusion_planner.h"
#include "core/logging.h"

namespace hvdc {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr const char* kShutDownMessage =
    "Horovod has been shut down. This happens when one of the ranks called shutdown() or exited "
    "(for instance after an exception; look for it in that rank's log), or when a collective is "
    "used after shutdown.";

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

uint64_t HashRanks(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ULL;
  for (int r : ranks) h = (h ^ static_cast<uint64_t>(r + 1)) * 1099511628211ULL;
  return h ^ ranks.size();
}

}  // namespace

Runtime::Runtime(Config config, std::unique_ptr<Transport> transport,
                 std::vector<Backend*> backends)
    : config_(std::move(config)),
      transport_(std::move(transport)),
      backends_(std::move(backends)),
      timeline_(std::make_shared<Timeline>()),
      sequenced_(!transport_->threads_supported()),
      timer_(io_) {
  // Idle ranks still join a round now and then, so a tensor some ranks wait for is reported
  // with the ranks that never submitted it, and a shutdown reaches everyone.
  double hb = config_.stall_check_disable ? 1.0 : config_.stall_check_time_s / 4;
  heartbeat_ = Seconds(std::clamp(hb, 0.05, 1.0));
}

Status Runtime::Create(Config config, std::unique_ptr<Transport> transport,
                       std::vector<Backend*> backends,
                       const std::vector<std::vector<int>>& extra_sets,
                       std::unique_ptr<Runtime>* out) {
  std::unique_ptr<Runtime> rt(
      new Runtime(std::move(config), std::move(transport), std::move(backends)));
  const Topology& topo = rt->topology();
  SetLogOptions(rt->config_.log_level, rt->config_.log_hide_time, topo.rank);
  LogDebug("effective configuration:\n{}", rt->config_.Describe());
  std::vector<int> all(topo.size);
  std::iota(all.begin(), all.end(), 0);
  HVDC_RETURN_IF_ERROR(rt->CreateSet(0, all));
  {
    // Every rank plans batches itself, so the settings that shape them must agree.
    const Config& c = rt->config_;
    const uint64_t h =
        HashRanks({static_cast<int>(c.fusion_threshold_bytes),
                   static_cast<int>(c.fusion_threshold_bytes >> 31),
                   static_cast<int>(c.zero_copy_bytes), static_cast<int>(c.chunk_bytes),
                   static_cast<int>(c.cache_capacity), c.disable_group_fusion ? 1 : 0});
    bool equal = false;
    HVDC_RETURN_IF_ERROR(rt->transport_->CheckAgreement(h, &equal));
    if (!equal) {
      return Status::InvalidArgument(fmt::format(
          "HOROVOD_FUSION_THRESHOLD, HOROVOD_CACHE_CAPACITY, HOROVOD_DISABLE_GROUP_FUSION, "
          "HVDC_CHUNK_BYTES and HVDC_ZERO_COPY_BYTES must be equal on every rank (they decide how "
          "tensors are batched); rank {} has {}, {}, {}, {}, {}",
          topo.rank, c.fusion_threshold_bytes, c.cache_capacity, c.disable_group_fusion,
          c.chunk_bytes, c.zero_copy_bytes));
    }
  }
  for (size_t i = 0; i < extra_sets.size(); ++i) {
    std::vector<int> ranks = extra_sets[i];
    std::sort(ranks.begin(), ranks.end());
    bool valid = !ranks.empty() && std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() &&
                 ranks.front() >= 0 && ranks.back() < topo.size;
    if (!valid) {
      return Status::InvalidArgument(fmt::format(
          "process set {} at init has invalid ranks {} (world size {})", i + 1, ranks, topo.size));
    }
    for (const auto& [id, st] : rt->sets_) {
      if (st->ranks == ranks) {
        return Status::InvalidArgument(
            fmt::format("process set {} at init duplicates process set {}", ranks, id));
      }
    }
    HVDC_RETURN_IF_ERROR(rt->CreateSet(static_cast<int>(i) + 1, ranks));
  }
  if (!rt->config_.timeline_path.empty() && rt->config_.timeline_path != "DYNAMIC") {
    HVDC_RETURN_IF_ERROR(rt->timeline_->Start(rt->config_.timeline_path,
                                              rt->config_.timeline_mark_cycles, topo.rank));
  }
  Runtime* r = rt.get();
  r->control_thread_ = std::thread([r] {
    const auto& aff = r->config_.thread_affinity;
    const int local = r->topology().local_rank;
    if (!aff.empty()) {
      if (static_cast<int>(aff.size()) <= local) {
        LogError("HOROVOD_THREAD_AFFINITY lists {} cores for {} local ranks; not pinning",
                 aff.size(), r->topology().local_size);
      } else {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(aff[local], &set);
        if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
          LogError("could not pin the control thread to core {}", aff[local]);
        }
      }
    }
    auto guard = boost::asio::make_work_guard(r->io_);
    r->io_.run();
  });
  pthread_setname_np(r->control_thread_.native_handle(), "hvdc-control");
  r->Wake();
  *out = std::move(rt);
  return Status::OK();
}

Runtime::~Runtime() { Shutdown(); }

Status Runtime::CreateSet(int id, std::vector<int> ranks) {
  auto st = std::make_shared<SetState>();
  st->id = id;
  st->seq = next_seq_++;  // even if creation fails below: every rank counts the same
  st->ranks = ranks;
  HVDC_RETURN_IF_ERROR(transport_->CreateProcessSet(ranks, &st->channels));
  auto it = std::find(ranks.begin(), ranks.end(), topology().rank);
  if (it != ranks.end()) {
    if (!st->channels.control || !st->channels.data) {
      return Status::UnknownError(fmt::format("process set {}: no channels for a member", id));
    }
    st->set_rank = static_cast<int>(it - ranks.begin());
    st->controller = std::make_unique<Controller>(id, config_, st->channels.control.get(),
                                                  timeline_.get(), ranks);
    st->executor = std::make_unique<Executor>(
        id, config_, st->channels.data.get(), timeline_, backends_, &st->queue, [this] { Wake(); },
        transport_->threads_supported());
    st->last_round_end = Clock::now();
  }
  std::lock_guard<std::mutex> lock(sets_mu_);
  sets_[id] = std::move(st);
  return Status::OK();
}

std::shared_ptr<Runtime::SetState> Runtime::FindSet(int id) const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Runtime::SetState>> Runtime::AllSets() const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  std::vector<std::shared_ptr<SetState>> all;
  for (auto& [id, st] : sets_) all.push_back(st);
  for (auto& st : closing_) all.push_back(st);
  return all;
}

Status Runtime::ShutdownStatus() const {
  return Status::UnknownError(down_reason_.empty() ? kShutDownMessage : down_reason_);
}

Status Runtime::Enqueue(int32_t process_set_id, std::vector<EnqueueItem> items,
                        Completion::Callback done) {
  if (down_.load()) return ShutdownStatus();
  if (items.empty()) return Status::InvalidArgument("nothing to enqueue");
  std::shared_ptr<SetState> st = FindSet(process_set_id);
  const std::string& first = items.front().request.name;
  if (!st) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}': process set {} is not known (not registered on this rank, or removed)", first,
        process_set_id));
  }
  if (st->set_rank < 0) {
    return Status::InvalidArgument(
        fmt::format("tensor '{}': rank {} is not a member of process set {} (ranks {})", first,
                    topology().rank, process_set_id, st->ranks));
  }
  const int n = static_cast<int>(st->ranks.size());
  auto completion = std::make_shared<Completion>(static_cast<int>(items.size()), std::move(done));
  std::vector<std::shared_ptr<TensorEntry>> entries;
  const auto now = Clock::now();
  const std::string group = items.size() > 1 ? items.front().request.name : std::string();
  for (auto& item : items) {
    Request& q = item.request;
    const std::string& name = q.name;
    if (name.empty() && q.op != OpType::kJoin && q.op != OpType::kBarrier) {
      return Status::InvalidArgument("a collective needs a non-empty tensor name");
    }
    switch (q.op) {
      case OpType::kJoin:
        if (process_set_id != 0)
          return Status::InvalidArgument("join() works on the global set only");
        q.name = "join.noname";
        break;
      case OpType::kBarrier:
        if (q.name.empty()) q.name = "barrier";
        break;
      case OpType::kBroadcast: {
        auto it = std::find(st->ranks.begin(), st->ranks.end(), q.root_rank);
        if (it == st->ranks.end()) {
          return Status::InvalidArgument(
              fmt::format("broadcast of '{}': root rank {} is not in process set {} (ranks {})",
                          name, q.root_rank, process_set_id, st->ranks));
        }
        q.root_rank = static_cast<int32_t>(it - st->ranks.begin());
        break;
      }
      case OpType::kAlltoall: {
        if (q.shape.empty()) {
          return Status::InvalidArgument(
              fmt::format("alltoall of '{}': the tensor must have at "
                          "least one dimension",
                          name));
        }
        const int64_t dim0 = q.shape[0];
        if (q.splits.empty()) {
          if (dim0 % n != 0) {
            return Status::InvalidArgument(fmt::format(
                "alltoall of '{}': dimension 0 ({}) is not divisible by the number of ranks ({}); "
                "pass splits",
                name, dim0, n));
          }
          q.splits.assign(n, static_cast<int32_t>(dim0 / n));
        } else {
          if (static_cast<int>(q.splits.size()) != n) {
            return Status::InvalidArgument(
                fmt::format("alltoall of '{}': {} splits given for a process set of {} ranks", name,
                            q.splits.size(), n));
          }
          int64_t sum = 0;
          for (int32_t s : q.splits) {
            if (s < 0) {
              return Status::InvalidArgument(
                  fmt::format("alltoall of '{}': negative split {}", name, s));
            }
            sum += s;
          }
          if (sum > dim0) {
            return Status::InvalidArgument(fmt::format(
                "alltoall of '{}': splits sum to {}, more than dimension 0 ({})", name, sum, dim0));
          }
        }
        break;
      }
      case OpType::kReducescatter:
      case OpType::kAllgather:
        if (q.shape.empty()) {
          return Status::InvalidArgument(fmt::format(
              "{} of '{}': the tensor must have at least one dimension", OpTypeName(q.op), name));
        }
        break;
      case OpType::kAllreduce:
        break;
    }
    for (int64_t d : q.shape) {
      if (d < 0) {
        return Status::InvalidArgument(
            fmt::format("tensor '{}' has a negative dimension: {}", name, ShapeString(q.shape)));
      }
    }
    if (items.size() > 1) {
      q.group_size = static_cast<int32_t>(items.size());
      q.group = group;
    }
    auto e = std::make_shared<TensorEntry>();
    e->request = std::move(q);
    e->process_set_id = process_set_id;
    e->input = item.input;
    e->output = item.output;
    e->allocate = std::move(item.allocate);
    e->received_splits = item.received_splits;
    e->join_last_rank = item.join_last_rank;
    e->ready_event = item.ready_event;
    e->done_stream = item.done_stream;
    e->completion = completion;
    e->enqueued_at = now;
    entries.push_back(std::move(e));
  }
  HVDC_RETURN_IF_ERROR(st->queue.Push(std::move(entries)));
  Wake();
  return Status::OK();
}

void Runtime::Wake() {
  if (!wake_posted_.exchange(true)) {
    boost::asio::post(io_, [this] { OnWake(); });
  }
}

bool Runtime::Sequenced(const SetState& st) const {
  return sequenced_ && st.seq > 0 && st.set_rank >= 0 && st.ranks.size() > 1;
}

bool Runtime::AnyHeld() const {
  for (auto& st : AllSets()) {
    if (!st->held.empty()) return true;
  }
  return false;
}

bool Runtime::ShouldStart(SetState& st, Clock::time_point now, Clock::time_point* wake_at) {
  Controller& c = *st.controller;
  if (c.has_unsent()) {
    if (!c.shutdown_requested() && st.executor->busy()) {
      // Let tensors accumulate while a batch runs (the executor wakes us when it is idle).
      const auto deadline = st.first_unsent + Seconds(config_.cycle_time_ms / 1000.0);
      if (now < deadline) {
        *wake_at = std::min(*wake_at, deadline);
        return false;
      }
    }
    return true;
  }
  // The global set's rounds also agree on process-set changes and release held batches.
  const bool global_work = st.id == 0 && (!admin_.empty() || (sequenced_ && AnyHeld()));
  if (c.has_pending() || global_work) {
    if (now >= st.next_retry) return true;
    *wake_at = std::min(*wake_at, st.next_retry);
    return false;
  }
  Clock::duration period = heartbeat_;
  if (st.id == 0 && sequenced_) {
    // Batches of a set held on its members wait for a global round, which idle ranks (members or
    // not) join only on their heartbeat: keep it short while such sets exist.
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [id, s] : sets_) {
      if (id != 0 && s->ranks.size() > 1) {
        period = std::min<Clock::duration>(period, milliseconds(10));
        break;
      }
    }
  }
  const auto hb = st.last_round_end + period;
  if (now >= hb) return true;
  *wake_at = std::min(*wake_at, hb);
  return false;
}

// The global set's round carries, after the controller's own words:
//   [0] bit 0: this rank has a process-set change pending (AND: every rank has one)
//   [1], [2]: the hash of that change and its complement (equal after the AND iff all agree)
//   [3 + seq - 1] for every set created so far (seq >= 1): how many rounds' batches of that set
//     this rank holds, as a thermometer code (n low bits set), all ones when this rank holds none
//     by design (not a member, not sequenced, gone): the AND gives the minimum over the members.
std::vector<uint64_t> Runtime::ExtraWords(const SetState& st) {
  if (st.id != 0) return {};
  std::vector<uint64_t> w(3 + static_cast<size_t>(std::max(next_seq_ - 1, 0)), ~0ULL);
  w[0] = admin_.empty() ? 0 : 1;
  w[1] = admin_.empty() ? 0 : admin_.front()->hash;
  w[2] = ~w[1];
  for (auto& s : AllSets()) {
    if (!Sequenced(*s)) continue;
    const size_t n = s->held.size();
    w[2 + static_cast<size_t>(s->seq)] = n >= 64 ? ~0ULL : (1ULL << n) - 1;
  }
  return w;
}

void Runtime::OnWake() {
  wake_posted_.store(false);
  const auto spin_until = Clock::now() + microseconds(30);
  bool spun_round = false;  // spin only for rounds this call started, never on timer polls
  for (bool first = true;; first = false) {
    std::vector<std::shared_ptr<SetState>> sets;
    for (auto& st : AllSets()) {
      if (st->set_rank >= 0 && !st->closed) sets.push_back(st);
    }
    if (first) LetProducersFinish(sets);
    const auto now = Clock::now();
    auto wake_at = now + std::chrono::hours(1);
    bool any_in_round = false;
    bool started = false;  // a round started in this pass: worth a short spin
    for (auto& sp : sets) {
      SetState& st = *sp;
      Controller& c = *st.controller;
      auto incoming = st.queue.Drain();
      if (!incoming.empty() && !c.has_unsent()) st.first_unsent = now;
      for (auto& e : incoming) c.Submit(std::move(e));
      for (int k = 0; k < 8 && !st.closed; ++k) {
        if (!c.in_round()) {
          if (!ShouldStart(st, now, &wake_at)) break;
          c.StartRound(now, ExtraWords(st));
          started = true;
          st.poll_delay = Clock::duration::zero();
          st.next_poll = now;
        }
        RoundResult result;
        if (!c.Poll(now, &result)) break;
        HandleResult(st, result, now);
      }
      if (!st.closed && c.in_round()) {
        any_in_round = true;
        CheckRoundDeadline(st, now);
      }
    }
    FinishRemovals();
    if (finished_ || (shutting_down_ &&
                      std::all_of(sets.begin(), sets.end(), [](auto& s) { return s->closed; }))) {
      std::lock_guard<std::mutex> lock(state_mu_);
      finished_ = true;
      state_cv_.notify_all();
      io_.stop();
      return;
    }
    // Spin briefly for the round to finish (latency) -- but not while a batch executes: on a rank
    // pinned to one core the spinning would take the executor's CPU.
    spun_round |= started;
    if (any_in_round && spun_round && Clock::now() < spin_until &&
        std::none_of(sets.begin(), sets.end(), [](auto& s) { return s->executor->busy(); })) {
      continue;
    }
    for (auto& sp : sets) {
      SetState& st = *sp;
      if (st.closed || !st.controller->in_round()) continue;
      if (now >= st.next_poll) {
        const bool busy =
            st.controller->has_pending() || st.controller->has_unsent() || shutting_down_;
        const Clock::duration cap = busy ? milliseconds(1) : milliseconds(10);
        st.poll_delay = std::clamp<Clock::duration>(st.poll_delay * 2, microseconds(10), cap);
        st.next_poll = now + st.poll_delay;
      }
      wake_at = std::min(wake_at, st.next_poll);
    }
    timer_.expires_at(wake_at);
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) OnWake();
    });
    return;
  }
}

// A framework often submits a burst of tensors (a whole gradient list) from one thread. Woken by
// its first tensor, this thread would preempt it -- on a rank pinned to one core, at once -- and
// negotiate the burst in many small rounds. So before starting a round, give the CPU back while
// the queues are still growing (bounded: a steady trickle is negotiated after 50 us). With no
// producer running the first yield returns at once and costs about a microsecond.
void Runtime::LetProducersFinish(const std::vector<std::shared_ptr<SetState>>& sets) {
  auto pending = [&sets] {
    size_t n = 0;
    for (auto& st : sets) {
      if (!st->controller->in_round()) n += st->queue.pending();
    }
    return n;
  };
  size_t last = pending();
  if (last == 0) return;
  const auto deadline = Clock::now() + microseconds(50);
  for (int i = 0; i < 64 && Clock::now() < deadline; ++i) {
    std::this_thread::yield();
    const size_t now = pending();
    if (now == last) return;
    last = now;
  }
}

void Runtime::HandleResult(SetState& st, RoundResult& result, Clock::time_point now) {
  st.last_round_end = now;
  bool progress = !result.ready.empty() || result.exchanged_requests;
  if (!result.ready.empty()) {
    std::vector<Batch> batches =
        PlanBatches(std::move(result.ready), config_, st.controller->size());
    if (!Sequenced(st)) {
      st.executor->Submit(std::move(batches));
    } else if (global_closed_) {
      // No global round will release them any more -- on any rank (see CloseSet).
      const Status why = ShutdownStatus();
      for (auto& b : batches) {
        b.error_code = why.code();
        b.error_message = why.message();
      }
      st.executor->Submit(std::move(batches));
    } else {
      st.held.push_back(std::move(batches));
    }
  }
  if (st.id == 0) {
    // The same decisions on every rank, at the same round: first this round's own batches (run
    // above), then the released batches of the other sets in creation order, then the change.
    progress |= ReleaseHeld(result.extra);
    progress |= ApplyAdmin(result.extra, result.shutdown);
  }
  st.retry_backoff = progress ? Clock::duration::zero()
                              : std::clamp<Clock::duration>(st.retry_backoff * 2, microseconds(50),
                                                            milliseconds(1));
  st.next_retry = now + st.retry_backoff;
  if (result.shutdown) {
    BeginShutdown(result.shutdown_reason);
    CloseSet(st, ShutdownStatus());
    return;
  }
  if (result.removed) {
    CloseSet(st, Status::InvalidArgument(fmt::format("process set {} was removed", st.id)));
  }
}

// Sequenced execution: with MPI_THREAD_SERIALIZED every batch runs inline on the control thread
// and blocks it until the set's other members run the same batch. Running each set's batches as
// its rounds complete would let ranks pick different orders across overlapping sets (rank 0 runs
// set C's batch while rank 1 runs set A's, ...): a cycle no rank can leave. So a set's batches are
// held until a round of the global set releases them: only as many rounds' batches as every member
// holds (the AND of the thermometer words), in creation order of the sets. Every rank thus runs
// the batches of all its sets in one global order -- (global round, set, position) -- and a member
// runs a batch only when every other member has it too.
bool Runtime::ReleaseHeld(const std::vector<uint64_t>& extra) {
  if (extra.size() < 3) return false;
  auto sets = AllSets();
  std::sort(sets.begin(), sets.end(), [](auto& a, auto& b) { return a->seq < b->seq; });
  bool released = false;
  for (auto& sp : sets) {
    SetState& st = *sp;
    const size_t word = 2 + static_cast<size_t>(st.seq);
    if (!Sequenced(st) || st.held.empty() || word >= extra.size()) continue;
    const int n = __builtin_popcountll(extra[word]);
    for (int i = 0; i < n && !st.held.empty(); ++i) {
      std::vector<Batch> batches = std::move(st.held.front());
      st.held.pop_front();
      st.executor->Submit(std::move(batches));
      released = true;
    }
  }
  return released;
}

bool Runtime::ApplyAdmin(const std::vector<uint64_t>& extra, bool shutdown) {
  if (extra.size() < 3 || (extra[0] & 1) == 0 || admin_.empty()) return false;
  std::shared_ptr<AdminOp> op = admin_.front();
  admin_.pop_front();
  if (shutdown) {
    op->result.set_value(HVDC_PROCESS_SET_ERROR_SHUTDOWN);
  } else if (extra[1] != op->hash || extra[2] != ~op->hash) {
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
  int id = 1;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [sid, st] : sets_) {
      if (st->ranks == op.ranks) {
        op.result.set_value(HVDC_PROCESS_SET_ERROR_EXISTING_SET);
        return;
      }
    }
    while (sets_.count(id)) ++id;
  }
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
  std::shared_ptr<SetState> st;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    auto it = sets_.find(op->id);
    if (it != sets_.end() && op->id != 0) {
      st = it->second;
      sets_.erase(it);
      if (st->set_rank >= 0) closing_.push_back(st);
    }
  }
  if (!st) {
    op->result.set_value(HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);
    return;
  }
  if (st->set_rank < 0) {
    op->result.set_value(0);
    return;
  }
  // The members close the set in one of its own rounds (possibly before this one, on a member
  // that saw that round first); FinishRemovals then tells the caller.
  st->removed = [op](int rc) { op->result.set_value(rc); };
  if (!st->closed) st->controller->RequestRemoval();
}

void Runtime::FinishRemovals() {
  std::vector<std::shared_ptr<SetState>> done;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto it = closing_.begin(); it != closing_.end();) {
      SetState& st = **it;
      if (st.closed && st.held.empty() && !st.executor->busy()) {
        done.push_back(std::move(*it));
        it = closing_.erase(it);
      } else {
        ++it;
      }
    }
  }
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

void Runtime::BeginShutdown(const std::string& reason) {
  if (shutting_down_) return;
  shutting_down_ = true;
  shutdown_started_ = Clock::now();
  shutdown_reason_ = reason;
  down_reason_ = reason.empty() ? kShutDownMessage : reason;
  down_.store(true);
  if (!reason.empty()) LogError("{}", reason);
  for (auto& st : AllSets()) {
    st->queue.Close(ShutdownStatus());
    if (st->set_rank >= 0 && !st->closed) st->controller->RequestShutdown(reason);
  }
}

void Runtime::CloseSet(SetState& st, const Status& why) {
  st.closed = true;
  st.queue.Close(why);
  auto pending = st.controller->TakeAllPending();
  for (auto& e : st.queue.Drain()) pending.push_back(std::move(e));
  if (!pending.empty()) {
    // Fail them on the executor, after every batch already agreed (callbacks never run here).
    Batch failed;
    failed.error_code = why.code();
    failed.error_message = why.message();
    for (auto& e : pending) {
      Response r;
      r.name = e->request.name;
      failed.items.push_back(BatchItem{std::move(r), std::move(e)});
    }
    std::vector<Batch> batches;
    batches.push_back(std::move(failed));
    st.executor->Submit(std::move(batches));
  }
  // Held batches of a closed set still run when a global round releases them (the other members
  // may close it later, and run them). Once the global set closes -- in the same round on every
  // rank -- nothing is released any more, anywhere: fail what is held.
  if (st.id == 0) {
    global_closed_ = true;
    FailAdmin();
    const Status down = ShutdownStatus();
    for (auto& sp : AllSets()) {
      for (auto& batches : sp->held) {
        for (auto& b : batches) {
          b.error_code = down.code();
          b.error_message = down.message();
        }
        sp->executor->Submit(std::move(batches));
      }
      sp->held.clear();
    }
  }
}

void Runtime::CheckRoundDeadline(SetState& st, Clock::time_point now) {
  const auto waited = now - st.controller->round_started();
  const double waited_s = std::chrono::duration<double>(waited).count();
  if (!config_.stall_check_disable && waited > Seconds(config_.stall_check_time_s) &&
      now - st.round_warned > Seconds(config_.stall_check_time_s)) {
    LogWarning(
        "process set {}: a negotiation round has waited {:.1f} s for the other ranks {} to take "
        "part; one of them may be stuck outside horovod_compat, or dead",
        st.id, waited_s, st.ranks);
    st.round_warned = now;
  }
  if (config_.stall_shutdown_time_s > 0 &&
      waited > Seconds(config_.stall_shutdown_time_s) + heartbeat_ + std::chrono::seconds(1)) {
    Abandon(fmt::format(
        "process set {}: ranks {} did not take part in negotiation for {:.1f} s "
        "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={}); a rank is stuck or dead. Shutting down.",
        st.id, st.ranks, waited_s, config_.stall_shutdown_time_s));
    return;
  }
  if (shutting_down_ && now - shutdown_started_ > std::chrono::seconds(60)) {
    Abandon(
        fmt::format("shutdown: process set {} (ranks {}) did not complete its last "
                    "negotiation round within 60 s; a rank is stuck or dead",
                    st.id, st.ranks));
  }
}

void Runtime::Abandon(const std::string& reason) {
  LogError("{}", reason);
  if (!shutting_down_) {
    down_reason_ = reason;
    down_.store(true);
    shutdown_started_ = Clock::now();
  }
  shutting_down_ = true;
  global_closed_ = true;
  const Status why = Status::UnknownError(reason);
  FailAdmin();
  for (auto& sp : AllSets()) {
    SetState& st = *sp;
    st.queue.Close(why);
    if (st.set_rank < 0 || st.closed) continue;
    st.closed = true;
    auto pending = st.controller->TakeAllPending();
    for (auto& e : st.queue.Drain()) pending.push_back(std::move(e));
    // Peers are gone: the executor may never return, so fail these here.
    for (auto& e : pending) {
      st.queue.Release(e->request.name);
      e->completion->MemberDone(why);
    }
    for (auto& batches : st.held) {
      for (auto& b : batches) Executor::Complete(b, why, &st.queue);
    }
    st.held.clear();
  }
  std::lock_guard<std::mutex> state_lock(state_mu_);
  abandoned_ = true;
}

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
  std::sort(ranks.begin(), ranks.end());
  auto op = std::make_shared<AdminOp>();
  op->add = true;
  op->valid = !ranks.empty() && std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() &&
              ranks.front() >= 0 && ranks.back() < topology().size;
  op->hash = HashRanks(op->valid ? ranks : std::vector<int>{-1}) * 3 + 1;
  op->ranks = std::move(ranks);
  return RunAdmin(std::move(op));
}

int Runtime::RemoveProcessSet(int id) {
  if (!config_.dynamic_process_sets) return HVDC_PROCESS_SET_ERROR_DYNAMIC;
  if (down_.load()) return HVDC_PROCESS_SET_ERROR_SHUTDOWN;
  if (id == 0 || !FindSet(id)) return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
  auto op = std::make_shared<AdminOp>();
  op->add = false;
  op->id = id;
  op->hash = HashRanks({id}) * 3 + 2;
  return RunAdmin(std::move(op));
}

int Runtime::ProcessSetRank(int id) const {
  auto st = FindSet(id);
  if (!st) return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
  return st->set_rank >= 0 ? st->set_rank : HVDC_PROCESS_SET_ERROR_FOREIGN_SET;
}

int Runtime::ProcessSetSize(int id) const {
  auto st = FindSet(id);
  return st ? static_cast<int>(st->ranks.size()) : HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
}

int Runtime::ProcessSetIncluded(int id) const {
  auto st = FindSet(id);
  if (!st) return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
  return st->set_rank >= 0 ? 1 : 0;
}

std::vector<int> Runtime::ProcessSetIds() const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  std::vector<int> ids;
  for (auto& [id, st] : sets_) ids.push_back(id);
  return ids;
}

int Runtime::ProcessSetRanks(int id, std::vector<int>* ranks) const {
  auto st = FindSet(id);
  if (!st) return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
  *ranks = st->ranks;
  return 0;
}

Status Runtime::StartTimeline(const std::string& path, bool mark_cycles) {
  if (config_.timeline_path.empty()) {
    return Status::InvalidArgument(
        "Set HOROVOD_TIMELINE=DYNAMIC (or a file path) before init() to use start_timeline()");
  }
  timeline_->Stop();
  return timeline_->Start(path, mark_cycles, topology().rank);
}

Status Runtime::StopTimeline() {
  timeline_->Stop();
  return Status::OK();
}

Status Runtime::Shutdown() {
  if (shutdown_called_.exchange(true)) return Status::OK();
  if (!control_thread_.joinable()) {  // Create() failed before starting it
    for (auto& st : AllSets()) {
      if (st->executor) st->executor->Stop();
    }
    {
      std::lock_guard<std::mutex> lock(sets_mu_);
      sets_.clear();
      closing_.clear();
    }
    transport_->Finalize();
    return Status::OK();
  }
  boost::asio::post(io_, [this] {
    BeginShutdown("");
    Wake();
  });
  {
    std::unique_lock<std::mutex> lock(state_mu_);
    const double limit = std::max(60.0, config_.stall_shutdown_time_s + 10);
    if (!state_cv_.wait_for(lock, Seconds(limit), [&] { return finished_; })) {
      lock.unlock();
      boost::asio::post(io_, [this, limit] {
        Abandon(
            fmt::format("shutdown did not complete within {:.0f} s: a peer rank is stuck or "
                        "dead",
                        limit));
        std::lock_guard<std::mutex> l(state_mu_);
        finished_ = true;
        io_.stop();
      });
    }
  }
  if (control_thread_.joinable()) control_thread_.join();
  bool abandoned;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    abandoned = abandoned_;
  }
  std::vector<std::shared_ptr<SetState>> sets = AllSets();
  for (auto& st : sets) {
    if (!st->executor) continue;
    if (abandoned && st->executor->busy()) {
      // Stuck in communication with a dead peer: fail what it holds now, and leave the thread
      // behind with its data channel (it touches nothing else of ours when it returns).
      st->executor->Abandon(ShutdownStatus());
      (void)st->channels.control.release();
      (void)st->channels.data.release();
      continue;
    }
    st->executor->Stop();
  }
  timeline_->Stop();
  if (!abandoned) {
    {
      std::lock_guard<std::mutex> lock(sets_mu_);
      sets_.clear();
      closing_.clear();
    }
    sets.clear();
    transport_->Finalize();
  }
  return Status::OK();
}

}  // namespace hvdc
