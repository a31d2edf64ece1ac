// Negotiator: the negotiation algorithm for one process set, written once over a ControlChannel.
//
// A round: every member ANDs a bit vector (ready bits of cached tensors, valid bits, status flags,
// the cache hash). When no rank has anything uncached and nobody asks to shut down, the AND alone
// decides which cached tensors are ready -- identically on every rank, with no gather. Otherwise
// the members gather their full requests at the coordinator (set rank 0), which answers with the
// ordered list of responses. Every rank then processes the same responses in the same order, so
// the replicated cache stays identical (verified by the hash in the next round).
//
// Runs on the control thread only; nothing here blocks.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/batch.h"
#include "core/config.h"
#include "core/control_channel.h"
#include "core/entry_set.h"
#include "core/message_table.h"
#include "core/response_cache.h"
#include "core/tensor_entry.h"

namespace hvdc {

class Timeline;

struct RoundResult {
  // The agreed responses in execution order, each with this rank's entry (null when this rank
  // joined and contributes zeros, or for a response it had no part in).
  std::vector<BatchItem> ready;
  bool exchanged_requests = false;  // the round carried new requests (progress even if none ready)
  bool shutdown = false;            // the set (and the runtime) shuts down after `ready` runs
  std::string shutdown_reason;
  // kPeerLost when this rank's round failed because a peer was lost; else kUnknownError.
  StatusCode shutdown_code = StatusCode::kUnknownError;
  bool removed = false;  // the set was removed: every member closes it after `ready` runs
  // The caller's extra words of this round (StartRound), ANDed over the members; empty when the
  // round failed before the AND completed.
  std::vector<uint64_t> extra;
};

class Negotiator {
 public:
  using Clock = std::chrono::steady_clock;
  Negotiator(int set_id, const Config& config, ControlChannel* channel, Timeline* timeline,
             std::vector<int> world_ranks);

  int set_id() const { return set_id_; }
  int rank() const { return channel_->rank(); }
  int size() const { return channel_->size(); }

  void Submit(std::shared_ptr<TensorEntry> entry);
  void RequestShutdown(const std::string& reason);
  bool shutdown_requested() const { return shutdown_requested_; }
  // The set is being removed (agreed in the global set's rounds): the next round closes it on every
  // member, after the responses it completes.
  void RequestRemoval() { removal_requested_ = true; }

  bool in_round() const { return phase_ != Phase::kIdle; }
  bool has_unsent() const {
    return !unsent_.empty() || (shutdown_requested_ && !shutdown_sent_) ||
           (removal_requested_ && !removal_sent_);
  }
  // A joined rank stays "pending" so it keeps taking part in rounds (it is ready for everything).
  bool has_pending() const { return !pending_.empty() || join_ != nullptr; }
  Clock::time_point round_started() const { return round_started_; }
  // During a round: true with the world ranks whose part of the round's current step has not
  // reached this rank (none: it is this rank that lags); false when the channel cannot tell.
  bool WaitingFor(std::vector<int>* world_ranks) const;

  // `extra` rides in the round's bit vector and comes back ANDed over the members in the result
  // (the runtime's own agreements: process-set changes, execution order). Every member must pass
  // the same number of words.
  void StartRound(Clock::time_point now, const std::vector<uint64_t>& extra = {});
  // Progresses the round; true when it finished (then *out holds the result).
  bool Poll(Clock::time_point now, RoundResult* out);
  // Fails and forgets every local entry not yet handed out (at shutdown or set removal).
  std::vector<std::shared_ptr<TensorEntry>> TakeAllPending();

  // Coordinator only: stalled tensors for the stall inspector.
  const MessageTable* table() const { return table_.get(); }

 private:
  enum class Phase { kIdle, kBits, kGather, kBroadcast };
  void BuildBits(Clock::time_point now);
  Status OnBits(Clock::time_point now, bool* finished, RoundResult* out);
  Status OnGather(Clock::time_point now);
  // The cache still gives e's bit to `name` (e was a hit, or its bit's slot is checked again).
  bool HoldsBit(const TensorEntry& e, std::string_view name) const;
  Status OnResponses(ResponseList&& list, RoundResult* out);  // moves the responses out
  // Appends `resp` to out->ready with this rank's entry for it (taken from pending_ or join_).
  // `name_hash`: NameIndex::Hash(resp->name).
  void AddReady(SharedResponse resp, uint64_t name_hash, RoundResult* out);
  void CheckStalls(Clock::time_point now);
  void Fail(const Status& status, RoundResult* out);

  const int set_id_;
  const Config& config_;
  ControlChannel* channel_;
  Timeline* timeline_;
  std::vector<int> world_ranks_;  // set rank -> world rank (for messages)
  ResponseCache cache_;
  std::unique_ptr<MessageTable> table_;  // coordinator only

  std::vector<std::shared_ptr<TensorEntry>> unsent_;  // submitted since the last round started
  // By name (nobody renames an entry while it is pending).
  EntrySet pending_;
  std::shared_ptr<TensorEntry> join_;  // this rank's pending join, if any
  bool join_sent_ = false;
  bool peers_joined_ = false;  // the last round saw a joined rank
  bool shutdown_requested_ = false;
  bool shutdown_sent_ = false;
  std::string shutdown_reason_;
  bool removal_requested_ = false;
  bool removal_sent_ = false;

  // The round in flight.
  Phase phase_ = Phase::kIdle;
  Clock::time_point round_started_;
  std::unique_ptr<PendingOp> op_;
  std::vector<uint64_t> bits_;
  uint64_t sent_hash_ = 0;
  std::vector<uint32_t> cached_ready_;
  std::string blob_;
  std::vector<std::string> gathered_;
  RequestList to_send_;
  size_t extra_offset_ = 0;          // where the caller's words start in bits_
  std::vector<uint64_t> extra_and_;  // the caller's words once ANDed
  bool round_exchanged_ = false;
  bool round_removed_ = false;

  // Stall inspector state (coordinator).
  std::map<std::string, Clock::time_point> warned_;
  Clock::time_point last_stall_check_;
};

}  // namespace hvdc
