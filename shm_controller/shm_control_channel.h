// ShmControlChannel: the ControlChannel among the ranks of one host, through a small shared-memory
// segment of its own, so that a process set whose ranks all share a host negotiates without MPI
// messages or sockets (docs/shm.md). Made by the shared-memory transport (shm_transport.h).
//
// The segment has the data plane's layout (shm_layout.h): a counter line and two halves per rank.
// Every operation is a series of rounds, each a full exchange: in round k every rank writes its
// part
// -- a description (the operation, its payload's full length) and the next chunk of its payload --
// into half k % 2 of its own slot, publishes k + 1 on its counter, and once every peer's counter
// has reached k + 1 reads what it keeps. A half is rewritten two rounds later, when every peer has
// published the round in between and so has read it. The first round tells every rank the length
// of every payload, so all agree on how many rounds the longest takes.
//   BitAnd     every rank sends its words; every rank ANDs all of them
//   Gather     every rank sends its blob; rank 0 keeps them all
//   Broadcast  rank 0 sends its blob; every rank keeps it
//
// Test() never blocks or sleeps: it reads the peers' counters (the control thread's own loop
// decides how often). While a round waits it checks, every kLivenessEveryNs, that the missing
// peers' processes live: one that has exited, or has been stopped for longer than the peer timeout,
// fails the operation naming it, and the channel with it. Under a transport that reports lost
// peers itself (TCP: at once for a killed process, after the peer timeout for a stopped one) the
// verdict waits `defer_s` longer, so that the transport's report -- naming the peer's address, as
// every other path of the job does -- comes first; under MPI, which cannot tell, it is the only
// report.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/control_channel.h"
#include "shm_controller/peer_process.h"
#include "shm_controller/shm_layout.h"
#include "shm_controller/shm_segment.h"

namespace hvdc {
namespace shm {

class ShmControlChannel : public ControlChannel {
 public:
  static constexpr int64_t kLivenessEveryNs = 50 * 1000 * 1000;
  static constexpr double kDeferToTransportS = 2.0;

  // The segment is attached by every member; world_ranks[r] names channel rank r in messages.
  ShmControlChannel(std::unique_ptr<Segment> segment, int rank, std::vector<int> world_ranks,
                    double peer_timeout_s, double defer_s = 0);
  ~ShmControlChannel() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<PendingOp> StartBitAnd(std::vector<uint64_t>* bits) override;
  std::unique_ptr<PendingOp> StartGather(std::string send,
                                         std::vector<std::string>* gathered) override;
  std::unique_ptr<PendingOp> StartBroadcast(std::string* blob) override;

  // The segment's total size for `nranks` ranks with `chunk` payload bytes per rank and round.
  static int64_t SegmentBytes(int nranks, int64_t chunk);

 private:
  friend class ExchangeOp;
  uint8_t* Half(int q, uint64_t round) const;
  RankLine* Line(int q) const { return &lines_[q]; }
  // A missing peer that has exited or stayed stopped too long: the error, and the channel is
  // broken from then on. Rate-limited to once per kLivenessEveryNs.
  Status CheckMissing(uint32_t target);

  std::unique_ptr<Segment> segment_;
  RankLine* lines_;
  const int rank_;
  const int size_;
  const std::vector<int> world_ranks_;
  const double peer_timeout_s_;
  const double defer_s_;
  const int64_t desc_bytes_;
  const int64_t chunk_bytes_;
  uint64_t round_ = 0;  // rounds this rank has begun (its counter's value)
  Status broken_;       // set once a peer is lost: every later operation fails with it
  int64_t next_check_ns_ = 0;
  std::vector<StopClock> stopped_;
  std::vector<int64_t> exited_since_ns_;  // per peer: when first seen exited, or 0
};

}  // namespace shm
}  // namespace hvdc
