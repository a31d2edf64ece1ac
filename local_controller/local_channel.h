// LocalControlChannel: the ControlChannel over threads of one process (the thread-rank test harness
// and the no-launcher runtime). Internal to local_controller/; obtained through MakeLocalTransport.
//
// Operations are matched across ranks by a per-channel sequence number. Starting an operation
// deposits this rank's contribution on the group's ControlBoard; Test() collects the result once
// the contributions it needs are there. The board's slot for an operation is freed when every rank
// has finished it (collected its result, or had none to collect).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/control_channel.h"
#include "core/status.h"

namespace hvdc {
namespace local {

enum class ControlKind : int { kBitAnd = 1, kGather = 2, kBroadcast = 3 };

// The state shared by the members of one control group.
class ControlBoard {
 public:
  explicit ControlBoard(int size) : size_(size) {}
  ControlBoard(const ControlBoard&) = delete;
  ControlBoard& operator=(const ControlBoard&) = delete;

  int size() const { return size_; }

  // Records `rank`'s contribution to operation `seq`: its bits (BitAnd), its blob (Gather), or, at
  // rank 0 only, the blob to broadcast (Broadcast; other ranks pass nullptr).
  void Deposit(uint64_t seq, int rank, ControlKind kind, const std::vector<uint64_t>* bits,
               std::string* blob);
  // Tries to finish `rank`'s part of `seq`; true once it has (then *status says how). On success
  // the result is written to *bits (BitAnd), *gathered (Gather at rank 0) or *blob (Broadcast at
  // ranks other than 0). A rank finishes once.
  bool TryFinish(uint64_t seq, int rank, std::vector<uint64_t>* bits,
                 std::vector<std::string>* gathered, std::string* blob, Status* status);
  // Finishes `rank`'s part without a result (an abandoned PendingOp), so the slot is still freed.
  void Abandon(uint64_t seq);
  // The ranks whose contribution to `seq` that `rank` needs has not been deposited yet.
  std::vector<int> Missing(uint64_t seq, int rank);

  size_t slots_in_use();  // for tests: operations some rank has not finished

 private:
  struct Slot {
    ControlKind kind = ControlKind::kBitAnd;
    int deposited = 0;
    std::vector<bool> by;  // by[r]: rank r has deposited
    int finished = 0;
    std::vector<uint64_t> bits;      // BitAnd: AND of the deposits so far
    std::vector<std::string> blobs;  // Gather: each rank's blob, collected by rank 0
    bool root_deposited = false;     // Broadcast: rank 0's blob is in `root_blob`
    std::string root_blob;
    std::string error;  // set when ranks disagree (kind or length)
  };
  void FinishLocked(uint64_t seq, Slot* slot);

  const int size_;
  std::mutex mu_;  // guards slots_
  std::map<uint64_t, Slot> slots_;
};

class LocalControlChannel : public ControlChannel {
 public:
  LocalControlChannel(std::shared_ptr<ControlBoard> board, int rank);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<PendingOp> StartBitAnd(std::vector<uint64_t>* bits) override;
  std::unique_ptr<PendingOp> StartGather(std::string send,
                                         std::vector<std::string>* gathered) override;
  std::unique_ptr<PendingOp> StartBroadcast(std::string* blob) override;

  ControlBoard& board() { return *board_; }  // for tests

 private:
  std::shared_ptr<ControlBoard> board_;
  const int rank_;
  const int size_;
  uint64_t next_seq_ = 0;  // used only by this rank's control thread
};

}  // namespace local
}  // namespace hvdc
