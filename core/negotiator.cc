#include "core/negotiator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_set>

#include "core/logging.h"
#include "core/timeline.h"
#include "core/wire_format.h"

namespace hvdc {
namespace {

constexpr uint64_t kFlagNothingUncached = 1;
constexpr uint64_t kFlagNoShutdown = 2;
constexpr uint64_t kFlagJoined = 4;        // AND: every rank has joined
constexpr uint64_t kFlagNobodyJoined = 8;  // AND: no rank has joined
constexpr uint64_t kFlagNotRemoving = 16;  // AND: no rank closes the set for its removal

const char* kJoinName = "join.noname";

}  // namespace

Negotiator::Negotiator(int set_id, const Config& config, ControlChannel* channel,
                       Timeline* timeline, std::vector<int> world_ranks)
    : set_id_(set_id),
      config_(config),
      channel_(channel),
      timeline_(timeline),
      world_ranks_(std::move(world_ranks)),
      cache_(config.cache_capacity) {
  if (channel_->rank() == 0) table_ = std::make_unique<MessageTable>(world_ranks_);
}

void Negotiator::Submit(std::shared_ptr<TensorEntry> entry) { unsent_.push_back(std::move(entry)); }

void Negotiator::RequestShutdown(const std::string& reason) {
  if (shutdown_requested_) return;
  shutdown_requested_ = true;
  shutdown_reason_ = reason;
}

bool Negotiator::HoldsBit(const TensorEntry& e, std::string_view name) const {
  // Unchanged since the lookup: no need to compare the name again.
  if (e.cache_version == cache_.version()) return true;
  return cache_.Has(e.cache_bit) && cache_.Get(e.cache_bit).name == name;
}

void Negotiator::BuildBits(Clock::time_point now) {
  const size_t w = cache_.words();
  bits_.assign(2 * w + 3, 0);
  for (size_t i = 0; i < w; ++i) bits_[w + i] = ~0ULL;
  auto invalidate = [&](uint32_t bit) { bits_[w + bit / 64] &= ~(1ULL << (bit % 64)); };

  for (auto& e : unsent_) {
    if (e->request.op == OpType::kJoin) {
      join_ = e;
      join_sent_ = false;
      continue;
    }
    uint32_t bit = 0;
    ResponseCache::Lookup found = cache_.Find(e->request, e->hashed_name().hash, rank(), &bit);
    e->is_cached = found == ResponseCache::Lookup::kHit;
    e->cache_bit = bit;
    e->cache_version = cache_.version();
    if (found == ResponseCache::Lookup::kMismatch) invalidate(bit);
    pending_.Put(e);
  }
  unsent_.clear();

  // A group is negotiated as a unit: if any member must go in full, all of them go in full
  // (cached members would otherwise complete alone and the rest wait for them forever). While a
  // rank has joined, cached collectives other than allreduce and barrier go in full too, so the
  // coordinator can fail them ("not supported while a rank has joined").
  std::unordered_set<std::string> full_groups;
  for (auto& e : pending_.entries()) {
    const bool cached = e->is_cached && HoldsBit(*e, e->request.name);
    if (!cached && e->request.group_size > 1) full_groups.insert(e->request.group);
  }
  const bool anyone_joined = join_ != nullptr || peers_joined_;
  for (auto& e : pending_.entries()) {
    if (!e->is_cached) continue;
    const bool group_in_full = e->request.group_size > 1 && full_groups.count(e->request.group);
    const bool refused_while_joined =
        anyone_joined && e->request.op != OpType::kAllreduce && e->request.op != OpType::kBarrier;
    if (group_in_full || refused_while_joined) {
      if (HoldsBit(*e, e->request.name)) invalidate(e->cache_bit);
      e->is_cached = false;
    }
  }

  bool needs_full = join_ && !join_sent_;
  const auto stall_age = std::chrono::duration<double>(config_.stall_check_time_s / 2);
  for (auto& e : pending_.entries()) {
    if (e->is_cached) {
      if (!HoldsBit(*e, e->request.name)) {
        e->is_cached = false;  // evicted since it was submitted
      } else if (!config_.stall_check_disable && now - e->enqueued_at > stall_age) {
        // Renegotiate in full so the coordinator can see (and report) which ranks are missing.
        invalidate(e->cache_bit);
        e->is_cached = false;
      }
    }
    if (e->is_cached) {
      bits_[e->cache_bit / 64] |= 1ULL << (e->cache_bit % 64);
    } else if (!e->sent_full) {
      needs_full = true;
    }
  }
  if (join_) {
    // A joined rank is ready for every cached allreduce (it contributes zeros).
    for (uint32_t bit = 0; bit < static_cast<uint32_t>(cache_.capacity()); ++bit) {
      const OpType op = cache_.Has(bit) ? cache_.Get(bit).op : OpType::kJoin;
      if (op == OpType::kAllreduce || op == OpType::kBarrier) {
        bits_[bit / 64] |= 1ULL << (bit % 64);
      }
    }
  }
  uint64_t flags = 0;
  if (!needs_full) flags |= kFlagNothingUncached;
  if (!shutdown_requested_) flags |= kFlagNoShutdown;
  if (join_) flags |= kFlagJoined;
  if (!join_) flags |= kFlagNobodyJoined;
  if (!removal_requested_) flags |= kFlagNotRemoving;
  removal_sent_ = removal_requested_;
  bits_[2 * w] = flags;
  sent_hash_ = cache_.hash();
  bits_[2 * w + 1] = sent_hash_;
  bits_[2 * w + 2] = ~sent_hash_;
}

void Negotiator::StartRound(Clock::time_point now, const std::vector<uint64_t>& extra) {
  round_started_ = now;
  if (timeline_ && timeline_->active() && set_id_ == 0) timeline_->MarkCycleStart();
  BuildBits(now);
  extra_offset_ = bits_.size();
  bits_.insert(bits_.end(), extra.begin(), extra.end());
  extra_and_.clear();
  round_exchanged_ = false;
  round_removed_ = false;
  op_ = channel_->StartBitAnd(&bits_);
  phase_ = Phase::kBits;
}

Status Negotiator::OnBits(Clock::time_point now, bool* finished, RoundResult* out) {
  const size_t w = cache_.words();
  if (bits_[2 * w + 1] != sent_hash_ || bits_[2 * w + 2] != ~sent_hash_) {
    return Status::UnknownError(fmt::format(
        "the response cache of process set {} diverged across ranks (internal error)", set_id_));
  }
  extra_and_.assign(bits_.begin() + static_cast<std::ptrdiff_t>(extra_offset_), bits_.end());
  const uint64_t flags = bits_[2 * w];
  round_removed_ = (flags & kFlagNotRemoving) == 0;
  bool exchange = !(flags & kFlagNothingUncached) || !(flags & kFlagNoShutdown);
  const bool all_joined = (flags & kFlagJoined) != 0;
  peers_joined_ = (flags & kFlagNobodyJoined) == 0;
  if (all_joined) {
    // The join completes in this round; this rank's cached tensors must reach the coordinator's
    // table first, or nobody would ever submit them again.
    for (auto& e : pending_.entries()) e->is_cached = false;
    exchange = true;
  }

  for (uint32_t word = 0; word < w; ++word) {
    uint64_t invalid = ~bits_[w + word];
    while (invalid) {
      uint32_t bit = word * 64 + static_cast<uint32_t>(__builtin_ctzll(invalid));
      invalid &= invalid - 1;
      if (!cache_.Has(bit)) continue;
      exchange = true;
      TensorEntry* e = pending_.Find(HashedName{cache_.Get(bit).name, cache_.NameHash(bit)});
      if (e != nullptr) e->is_cached = false;
      cache_.Erase(bit);
    }
  }
  cached_ready_.clear();
  if (!all_joined) {
    for (uint32_t word = 0; word < w; ++word) {
      uint64_t ready = bits_[word] & bits_[w + word];
      while (ready) {
        uint32_t bit = word * 64 + static_cast<uint32_t>(__builtin_ctzll(ready));
        ready &= ready - 1;
        if (cache_.Has(bit)) cached_ready_.push_back(bit);
      }
    }
  }

  if (!exchange) {
    // Only cached tensors: their batch items share the cache's responses.
    out->ready.reserve(out->ready.size() + cached_ready_.size());
    for (uint32_t bit : cached_ready_) {
      cache_.Touch(bit);
      AddReady(cache_.Shared(bit), cache_.NameHash(bit), out);
    }
    *finished = true;
    return Status::OK();
  }

  round_exchanged_ = true;
  to_send_ = RequestList();
  to_send_.rank = rank();
  to_send_.shutdown = shutdown_requested_;
  shutdown_sent_ = shutdown_requested_;
  for (auto& e : pending_.entries()) {
    if (!e->is_cached && !e->sent_full) {
      to_send_.requests.push_back(e->request);
      e->sent_full = true;
    }
  }
  if (join_ && !join_sent_) {
    Request q;
    q.op = OpType::kJoin;
    q.name = kJoinName;
    to_send_.requests.push_back(q);
    join_sent_ = true;
  }
  gathered_.clear();
  op_ = channel_->StartGather(SerializeRequestList(to_send_), &gathered_);
  phase_ = Phase::kGather;
  *finished = false;
  return Status::OK();
}

Status Negotiator::OnGather(Clock::time_point now) {
  blob_.clear();
  if (rank() == 0) {
    ResponseList list;
    for (uint32_t bit : cached_ready_) list.responses.push_back(cache_.Get(bit));
    std::vector<Response> fresh;
    std::vector<int> leaving;  // world ranks that asked for the shutdown
    const bool tl = timeline_ && timeline_->active();
    for (int r = 0; r < size(); ++r) {
      RequestList rl;
      Status s = ParseRequestList(gathered_[r], &rl);
      if (!s.ok()) {
        return Status::UnknownError(fmt::format("from rank {}: {}", world_ranks_[r], s.message()));
      }
      if (rl.shutdown) {
        list.shutdown = true;
        if (r != 0) leaving.push_back(world_ranks_[r]);
      }
      for (const Request& q : rl.requests) {
        if (q.op == OpType::kJoin) {
          table_->Join(r, &fresh);
          continue;
        }
        if (tl) {
          timeline_->NegotiateStart(q.name, q.op);
          timeline_->NegotiateRankReady(q.name, world_ranks_[r]);
        }
        table_->Add(r, q, now, &fresh);
      }
    }
    if (table_->all_joined()) {
      Response join;
      join.op = OpType::kJoin;
      join.name = kJoinName;
      join.last_joined_rank = world_ranks_[table_->last_joined()];
      fresh.push_back(join);
      table_->ResetJoin();
    }
    for (auto& p : fresh) list.responses.push_back(std::move(p));
    if (shutdown_requested_) {
      list.shutdown = true;
      list.shutdown_reason = shutdown_reason_;
      if (shutdown_reason_.empty()) leaving.insert(leaving.begin(), world_ranks_[0]);
    }
    if (list.shutdown && list.shutdown_reason.empty() && config_.elastic && !leaving.empty()) {
      // Members called shutdown() while the others still run: in an elastic job they left the
      // job, and the others re-initialise, as after a lost peer.
      list.shutdown_reason = fmt::format(
          "{} {} shut down (left the job) while this rank was still running: every pending and "
          "later operation fails, and this rank shuts down",
          leaving.size() == 1 ? "rank" : "ranks", fmt::join(leaving, ", "));
      list.shutdown_code = StatusCode::kPeerLost;
    }
    blob_ = SerializeResponseList(list);
  }
  op_ = channel_->StartBroadcast(&blob_);
  phase_ = Phase::kBroadcast;
  return Status::OK();
}

Status Negotiator::OnResponses(ResponseList&& list, RoundResult* out) {
  const size_t n_cached = cached_ready_.size();
  if (list.responses.size() < n_cached) {
    return Status::UnknownError("coordinator answered fewer responses than the cache agreed on");
  }
  const bool tl = timeline_ && timeline_->active() && rank() == 0;
  out->ready.reserve(out->ready.size() + list.responses.size());
  for (size_t i = 0; i < list.responses.size(); ++i) {
    if (i < n_cached) {
      // The coordinator's copy of this rank's cached response (the caches agree, the round's
      // hash says so): the batch item shares the cache's own, as in an all-cached round.
      const uint32_t bit = cached_ready_[i];
      cache_.Touch(bit);
      AddReady(cache_.Shared(bit), cache_.NameHash(bit), out);
      continue;
    }
    auto resp = std::make_shared<const Response>(std::move(list.responses[i]));
    cache_.Put(resp);
    if (tl && resp->op != OpType::kJoin) timeline_->NegotiateEnd(resp->name);
    const uint64_t name_hash = NameIndex::Hash(resp->name);
    AddReady(std::move(resp), name_hash, out);
  }
  if (list.shutdown) {
    out->shutdown = true;
    out->shutdown_reason = list.shutdown_reason;
    out->shutdown_code = list.shutdown_code;
  }
  return Status::OK();
}

void Negotiator::AddReady(SharedResponse resp, uint64_t name_hash, RoundResult* out) {
  std::shared_ptr<TensorEntry> entry;
  if (resp->op == OpType::kJoin) {
    entry = std::move(join_);
    join_sent_ = false;
  } else {
    entry = pending_.Take(HashedName{resp->name, name_hash});
  }
  out->ready.push_back(BatchItem{std::move(resp), std::move(entry)});
}

void Negotiator::Fail(const Status& status, RoundResult* out) {
  out->shutdown = true;
  out->shutdown_reason = status.message();
  out->shutdown_code = status.code();
}

bool Negotiator::Poll(Clock::time_point now, RoundResult* out) {
  while (phase_ != Phase::kIdle) {
    Status s;
    if (!op_->Test(&s)) return false;
    if (s.ok()) {
      switch (phase_) {
        case Phase::kBits: {
          bool finished = false;
          s = OnBits(now, &finished, out);
          if (s.ok() && !finished) continue;
          break;
        }
        case Phase::kGather:
          s = OnGather(now);
          if (s.ok()) continue;
          break;
        case Phase::kBroadcast: {
          ResponseList list;
          s = ParseResponseList(blob_, &list);
          if (s.ok()) s = OnResponses(std::move(list), out);
          break;
        }
        case Phase::kIdle:
          break;
      }
    }
    if (!s.ok()) {
      // A lost peer keeps its code: Python raises HorovodInternalError for it.
      Fail(
          Status::FromCode(
              s.code() == StatusCode::kPeerLost ? StatusCode::kPeerLost : StatusCode::kUnknownError,
              fmt::format("negotiation on process set {} failed: {}", set_id_, s.message())),
          out);
      extra_and_.clear();  // this rank may have seen only part of the round: agree on nothing
    }
    out->exchanged_requests = round_exchanged_;
    out->removed = round_removed_;
    out->extra = std::move(extra_and_);
    extra_and_.clear();
    op_.reset();
    phase_ = Phase::kIdle;
    if (rank() == 0) CheckStalls(now);
    return true;
  }
  return false;
}

bool Negotiator::WaitingFor(std::vector<int>* world_ranks) const {
  std::vector<int> missing;
  if (!op_ || !op_->Missing(&missing)) return false;
  world_ranks->clear();
  for (int r : missing) world_ranks->push_back(world_ranks_[r]);
  return true;
}

void Negotiator::CheckStalls(Clock::time_point now) {
  if (config_.stall_check_disable || !table_ || table_->empty()) return;
  const auto age = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config_.stall_check_time_s));
  auto to_world = [&](const std::vector<int>& ranks) {
    std::vector<int> w;
    for (int r : ranks) w.push_back(world_ranks_[r]);
    return w;
  };
  std::string fatal;  // every tensor stalled past the shutdown time, so all are named
  for (const auto& s : table_->StalledSince(age, now)) {
    auto it = warned_.find(s.name);
    if (it == warned_.end() || now - it->second >= age) {
      LogWarning(
          "Stall: tensor '{}' (process set {}) was submitted by ranks {} but not by ranks {} for "
          "{:.1f} s. One or more ranks may be stuck, or running a different sequence of "
          "collectives.",
          s.name, set_id_, to_world(s.ready_ranks), to_world(s.missing_ranks), s.waited_s);
      warned_[s.name] = now;
    }
    if (config_.stall_shutdown_time_s > 0 && s.waited_s >= config_.stall_shutdown_time_s) {
      fatal +=
          fmt::format("{}tensor '{}' was submitted by ranks {} but not by ranks {} for {:.1f} s",
                      fatal.empty() ? "" : "; ", s.name, to_world(s.ready_ranks),
                      to_world(s.missing_ranks), s.waited_s);
    }
  }
  if (!fatal.empty()) {
    RequestShutdown(fmt::format(
        "Stalled on process set {}: {} (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={}); shutting down",
        set_id_, fatal, config_.stall_shutdown_time_s));
  }
  for (auto it = warned_.begin(); it != warned_.end();) {
    it = (now - it->second > 10 * age) ? warned_.erase(it) : std::next(it);
  }
}

std::vector<std::shared_ptr<TensorEntry>> Negotiator::TakeAllPending() {
  std::vector<std::shared_ptr<TensorEntry>> all = std::move(unsent_);
  unsent_.clear();
  for (auto& e : pending_.TakeAll()) all.push_back(std::move(e));
  if (join_) all.push_back(std::move(join_));
  return all;
}

}  // namespace hvdc
