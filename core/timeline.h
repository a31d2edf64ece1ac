// Timeline: HOROVOD_TIMELINE's Chrome-trace / Perfetto JSON, written by the coordinator only.
//
// Each tensor is one row (a trace "process" named after the tensor, created the first time the
// tensor appears). Per tensor: NEGOTIATE_<OP> with an instant mark per rank that submits, then
// <OP> (ALLREDUCE, ...) with nested activities (WAIT_FOR_DATA, MEMCPY_IN_FUSION_BUFFER,
// MPI_ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER, ...). Timestamps are microseconds since Start().
//
// Callers only take a timestamp and push a small record under a short lock; the Timeline's own
// thread formats and writes. When inactive every call is one relaxed atomic load.
//
// NegotiateStart on a tensor whose negotiation is already open does nothing, so the coordinator
// may call it for every rank's request (followed by NegotiateRankReady for that rank).
// Calls are forgiving: an end without a matching begin is dropped, OpStart closes a negotiation
// left open, ActivityStart closes the previous activity, OpEnd closes an open activity, and
// Stop() closes whatever is still open, so every begin in the file has its end. After Stop() the
// file is a complete JSON array; while running it is an unterminated one (which Chrome and
// Perfetto accept).
//
// Thread-safe: every method may be called from any thread. Start/Stop serialize with each other.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace hvdc {

// Horovod's activity names (any other string works too).
namespace timeline_activity {
inline constexpr const char kQueue[] = "QUEUE";
inline constexpr const char kWaitForData[] = "WAIT_FOR_DATA";
inline constexpr const char kWaitForOtherTensorData[] = "WAIT_FOR_OTHER_TENSOR_DATA";
inline constexpr const char kInitFusionBuffer[] = "INIT_FUSION_BUFFER";
inline constexpr const char kMemcpyInFusionBuffer[] = "MEMCPY_IN_FUSION_BUFFER";
inline constexpr const char kMemcpyOutFusionBuffer[] = "MEMCPY_OUT_FUSION_BUFFER";
inline constexpr const char kMpiAllreduce[] = "MPI_ALLREDUCE";
inline constexpr const char kMpiAllgather[] = "MPI_ALLGATHER";
inline constexpr const char kMpiBroadcast[] = "MPI_BCAST";
inline constexpr const char kMpiAlltoall[] = "MPI_ALLTOALL";
inline constexpr const char kMpiReducescatter[] = "MPI_REDUCESCATTER";
inline constexpr const char kNcclAllreduce[] = "NCCL_ALLREDUCE";
}  // namespace timeline_activity

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();  // Stop()
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Opens (truncates) `path` and starts the writer thread. Only rank 0 writes: for any other rank
  // this returns OK and the timeline stays inactive. Errors: InvalidArgument when the file cannot
  // be created (or the path is empty), PreconditionError when already started.
  Status Start(const std::string& path, bool mark_cycles, int rank);
  // Writes what is queued, closes open rows, terminates the JSON array, closes the file and joins
  // the writer thread. Events arriving during or after Stop() are dropped. Idempotent.
  void Stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }

  void NegotiateStart(const std::string& tensor, OpType op);     // begin "NEGOTIATE_<OP>"
  void NegotiateRankReady(const std::string& tensor, int rank);  // instant mark named "<rank>"
  void NegotiateEnd(const std::string& tensor);
  void OpStart(const std::string& tensor, OpType op);  // begin "<OP>"
  // `activity` is copied; see timeline_activity for Horovod's names.
  void ActivityStart(const std::string& tensor, const char* activity);
  void ActivityEnd(const std::string& tensor);
  void OpEnd(const std::string& tensor);
  void MarkCycleStart();  // a global "CYCLE_START" instant, only when started with mark_cycles

 private:
  enum class EventKind : uint8_t {
    kNegotiateStart,
    kRankReady,
    kNegotiateEnd,
    kOpStart,
    kActivityStart,
    kActivityEnd,
    kOpEnd,
    kCycle,
  };
  struct Event {
    EventKind kind;
    int32_t arg;  // OpType for starts, the rank for kRankReady
    int64_t ts_us;
    std::string tensor;
    std::string activity;
  };
  enum class Level : uint8_t { kNegotiate, kOp, kActivity };
  struct Row {
    int pid;
    std::vector<Level> open;  // the begin events not yet ended, innermost last
  };

  void Push(EventKind kind, const std::string& tensor, int32_t arg, const char* activity);
  void WriterLoop();
  void WriteEvent(const Event& e);
  Row& RowFor(const std::string& tensor);
  void Begin(Row& row, Level level, const std::string& name, int64_t ts);
  void End(Row& row, int64_t ts);
  void Separator();  // before each record: ",\n" except for the first
  void Flush();      // hands pending_ to the file

  std::atomic<bool> active_{false};
  std::atomic<bool> mark_cycles_{false};

  std::mutex lifecycle_mu_;  // serializes Start/Stop; taken before mu_
  std::thread writer_;       // guarded by lifecycle_mu_

  std::mutex mu_;  // guards the fields below, up to the writer-only ones
  std::condition_variable cv_;
  std::vector<Event> queue_;
  bool accepting_ = false;  // false outside Start..Stop, so late events are dropped
  bool stopping_ = false;
  std::chrono::steady_clock::time_point start_time_;

  // Writer-only: reset in Start() before the thread starts, then touched only by the thread.
  std::FILE* file_ = nullptr;
  std::string path_;
  bool first_record_ = true;
  bool write_failed_ = false;
  int next_pid_ = 1;
  std::unordered_map<std::string, Row> rows_;
  std::string pending_;  // records formatted but not yet handed to the file
};

}  // namespace hvdc
