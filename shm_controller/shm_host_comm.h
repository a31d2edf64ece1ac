// ShmHostComm: the HostComm data plane among the ranks of one host, through one shared-memory
// segment per process set (docs/shm.md). Made by CreateShmHostComm (shm_transport.h).
//
// Every call is a series of rounds. In round k each rank writes its part into half k % 2 of its
// own slot, publishes, waits for its peers, and reads theirs; large calls take as many rounds as
// they need. A rank's counter advances by two per round (written, then reduced), so a rank may
// rewrite a half only once every peer has started the next round -- the only wait besides the
// ones a collective needs. The first round of a call carries each rank's description of the call,
// so ranks that disagree (or one whose arguments failed HostComm's check) all return an error.
//
// Allreduce: each rank copies its chunk in (the only copy in), reduces its 1/n slice of the chunk
// over every rank's input (so each element is reduced once, by one rank, and every rank gets the
// same bits), then every rank copies all slices out. AllreducePieces is the same over a list of
// pieces taken as one vector: a chunk is copied in straight from the pieces it covers (applying
// the prescale in that copy) and out straight into their outputs (applying the postscale), so a
// fused batch needs no fusion buffer; Allreduce is its one-piece case. ReduceScatter: each rank
// reduces its own block straight into its output, over the ranks in rank order.
//
// Waits spin, yield, then sleep on a futex (shm_wait.h); while asleep they check that no rank has
// aborted the plane and that the peer's process is alive and not stopped for longer than
// peer_timeout_s. A lost peer aborts the plane: that call and every later one fail naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/host_comm.h"
#include "shm_controller/peer_process.h"
#include "shm_controller/shm_layout.h"
#include "shm_controller/shm_segment.h"

namespace hvdc {
namespace shm {

class ShmHostComm : public HostComm {
 public:
  // The segment is attached and initialised; world_ranks[r] names set rank r in messages.
  ShmHostComm(std::unique_ptr<Segment> segment, int rank, std::vector<int> world_ranks,
              double peer_timeout_s);
  ~ShmHostComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int64_t slot_bytes() const { return slot_bytes_; }  // data bytes a rank moves per round
  const std::string& segment_name() const { return segment_->name(); }  // for tests
  bool allreduces_pieces() const override { return true; }

 private:
  Status DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                     ReduceOp op) override;
  Status DoAllreducePieces(const std::vector<ReducePiece>& pieces, DataType dtype, ReduceOp op,
                           double prescale, double postscale) override;
  Status DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                      const std::vector<int64_t>& recv_bytes) override;
  Status DoBroadcast(void* buf, int64_t bytes, int root) override;
  Status DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                     const std::vector<int64_t>& recv_bytes) override;
  Status DoReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                         DataType dtype, ReduceOp op) override;
  Status DoBarrier() override;
  // Takes part in one round carrying the refusal, so every member returns an error.
  Status Refuse(Collective c, Status error) override;

  // Round machinery (shm_host_comm.cc).
  uint8_t* Half(int q) const;  // rank q's half of the current round
  OpDesc* Desc(int q) const { return reinterpret_cast<OpDesc*>(Half(q)); }
  int64_t* DescVector(int q, int which) const;  // which: 0 or 1, n entries each
  uint8_t* Data(int q) const { return Half(q) + desc_bytes_; }
  // Waits until this rank may write its current half (every peer has begun the previous round).
  Status BeginRound();
  // Publishes phase 1 (written) or 2 (done with the round's own writes) of the current round.
  void PublishPhase(int phase);
  Status WaitAll(int phase);
  void EndRound() { ++round_; }
  // After the first WaitAll of a call: an error, the same on every rank, when the descriptions
  // disagree or a rank refused. `vectors` says how many DescVectors must match rank 0's.
  Status CheckDescs(Collective c, int vectors) const;
  Status CheckPeer(int q);
  Status Abort(int lost, Status why);
  Status AbortedStatus() const;
  uint32_t Target(int phase) const { return static_cast<uint32_t>(2 * round_ + phase); }

  std::unique_ptr<Segment> segment_;
  SegmentHeader* header_;
  RankLine* lines_;
  const int rank_;
  const int size_;
  const std::vector<int> world_ranks_;
  const double peer_timeout_s_;
  const int64_t desc_bytes_;
  const int64_t slot_bytes_;
  uint64_t round_ = 0;              // used only by this rank's executor thread
  std::vector<StopClock> stopped_;  // per peer: how long it has been seen stopped
};

}  // namespace shm
}  // namespace hvdc
