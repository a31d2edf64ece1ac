// Runtime start-up and wiring, enqueue and the timeline switch (see runtime.h for the other parts).
#include "core/runtime.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <numeric>

#include "core/clock.h"
#include "core/hash.h"
#include "core/logging.h"
#include "core/request_validator.h"

namespace hvdc {
namespace {

// Every rank plans batches itself, so the settings that shape them must agree.
Status CheckBatchingAgreement(const Config& c, int rank, Transport* transport) {
  const uint64_t h = HashInts({static_cast<int>(c.fusion_threshold_bytes),
                               static_cast<int>(c.fusion_threshold_bytes >> 31),
                               static_cast<int>(c.zero_copy_bytes), static_cast<int>(c.chunk_bytes),
                               static_cast<int>(c.cache_capacity), c.disable_group_fusion ? 1 : 0});
  bool equal = false;
  HVDC_RETURN_IF_ERROR(transport->CheckAgreement(h, &equal));
  if (equal) return Status::OK();
  return Status::InvalidArgument(fmt::format(
      "HOROVOD_FUSION_THRESHOLD, HOROVOD_CACHE_CAPACITY, HOROVOD_DISABLE_GROUP_FUSION, "
      "HVDC_CHUNK_BYTES and HVDC_ZERO_COPY_BYTES must be equal on every rank (they decide how "
      "tensors are batched); rank {} has {}, {}, {}, {}, {}",
      rank, c.fusion_threshold_bytes, c.cache_capacity, c.disable_group_fusion, c.chunk_bytes,
      c.zero_copy_bytes));
}

void PinControlThread(const Config& config, const Topology& topo) {
  const auto& aff = config.thread_affinity;
  if (aff.empty()) return;
  if (static_cast<int>(aff.size()) <= topo.local_rank) {
    LogError("HOROVOD_THREAD_AFFINITY lists {} cores for {} local ranks; not pinning", aff.size(),
             topo.local_size);
    return;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(aff[topo.local_rank], &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    LogError("could not pin the control thread to core {}", aff[topo.local_rank]);
  }
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
  HVDC_RETURN_IF_ERROR(CheckBatchingAgreement(rt->config_, topo.rank, rt->transport_.get()));
  for (size_t i = 0; i < extra_sets.size(); ++i) {
    std::vector<int> ranks = extra_sets[i];
    std::sort(ranks.begin(), ranks.end());
    if (!ValidSetRanks(ranks, topo.size)) {
      return Status::InvalidArgument(fmt::format(
          "process set {} at init has invalid ranks {} (world size {})", i + 1, ranks, topo.size));
    }
    const int existing = rt->sets_.IdOf(ranks);
    if (existing >= 0) {
      return Status::InvalidArgument(
          fmt::format("process set {} at init duplicates process set {}", ranks, existing));
    }
    HVDC_RETURN_IF_ERROR(rt->CreateSet(static_cast<int>(i) + 1, ranks));
  }
  if (!rt->config_.timeline_path.empty() && rt->config_.timeline_path != "DYNAMIC") {
    HVDC_RETURN_IF_ERROR(rt->timeline_->Start(rt->config_.timeline_path,
                                              rt->config_.timeline_mark_cycles, topo.rank));
  }
  Runtime* r = rt.get();
  r->Advance(r->life_.Enter(Phase::kRunning), "Create");
  r->control_thread_ = std::thread([r] {
    PinControlThread(r->config_, r->topology());
    auto guard = boost::asio::make_work_guard(r->io_);
    r->io_.run();
  });
  pthread_setname_np(r->control_thread_.native_handle(), "hvdc-control");
  r->transport_->SetPeerLostHandler([r](const Status& lost) { r->PeerLost(lost); });
  r->Wake();
  *out = std::move(rt);
  return Status::OK();
}

Runtime::~Runtime() {
  Status s = Shutdown();
  if (!s.ok()) LogWarning("shutdown at destruction: {}", s.ToString());
}

Status Runtime::CreateSet(int id, std::vector<int> ranks) {
  ProcessSet::Parts parts;
  parts.config = &config_;
  parts.transport = transport_.get();
  parts.timeline = timeline_;
  parts.backends = backends_;
  parts.wake = [this] { Wake(); };
  SetPtr st;
  // next_seq_ advances even if creation fails: every rank counts the same.
  HVDC_RETURN_IF_ERROR(ProcessSet::Create(id, next_seq_++, std::move(ranks), parts, &st));
  sets_.Insert(std::move(st));
  return Status::OK();
}

Status Runtime::Enqueue(int32_t process_set_id, EnqueueItem* items, size_t count,
                        Completion::Callback done, bool may_complete_inline) {
  if (!life_.running()) return ShutdownStatus();
  if (count == 0) return Status::InvalidArgument("nothing to enqueue");
  SetPtr st = sets_.Find(process_set_id);
  const std::string& first = items[0].request.name;
  if (!st) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}': process set {} is not known (not registered on this rank, or removed)", first,
        process_set_id));
  }
  if (!st->member()) {
    return Status::InvalidArgument(
        fmt::format("tensor '{}': rank {} is not a member of process set {} (ranks {})", first,
                    topology().rank, process_set_id, st->ranks));
  }
  const SetView view{process_set_id, &st->ranks};
  // A lone tensor's completion shares its entry's allocation; a group's members share one.
  auto group_completion =
      count > 1 ? std::make_shared<Completion>(static_cast<int>(count), std::move(done)) : nullptr;
  // Reused by this thread's calls (one allocation less per tensor). A callback run inline below
  // may enqueue again on this thread: RunInline takes the vector, and PushFrom empties it.
  thread_local std::vector<std::shared_ptr<TensorEntry>> entries;
  entries.clear();
  struct ClearOnReturn {  // an entry refused below goes now, with its callback, as it always did
    std::vector<std::shared_ptr<TensorEntry>>& v;
    ~ClearOnReturn() { v.clear(); }
  } clear_on_return{entries};
  entries.reserve(count);
  const auto now = Clock::now();
  const std::string group = count > 1 ? items[0].request.name : std::string();
  for (size_t i = 0; i < count; ++i) {
    EnqueueItem& item = items[i];
    Request& q = item.request;
    HVDC_RETURN_IF_ERROR(ValidateRequest(view, &q));
    if (count > 1) {
      q.group_size = static_cast<int32_t>(count);
      q.group = group;
    }
    auto e = group_completion ? NewEntry(group_completion) : NewEntry(std::move(done));
    static_cast<EnqueueItem&>(*e) = std::move(item);  // the request as the C API translated it
    e->process_set_id = process_set_id;
    e->enqueued_at = now;
    entries.push_back(std::move(e));
  }
  if (may_complete_inline && RunsInline(*st, entries)) return RunInline(*st, std::move(entries));
  HVDC_RETURN_IF_ERROR(st->queue.PushFrom(&entries));
  Wake();
  return Status::OK();
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

}  // namespace hvdc
