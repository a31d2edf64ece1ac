// Driving the runtime through its C API: in-place fp32 allreduce of a tensor set, waiting for the
// callbacks, and checking the reduced values.
#ifndef HVDC_BENCH_OURS_H_
#define HVDC_BENCH_OURS_H_

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "bench/common.h"
#include "core/c_api.h"

namespace bench {

// Counts callbacks down to zero; the caller blocks on a condition variable (default) or spins with
// sched_yield (WaitMode::kYield) so it gives its core to the runtime's threads while it waits.
enum class WaitMode { kBlock, kYield };
WaitMode ParseWaitMode(const std::string& s);
const char* WaitModeName(WaitMode m);

class Completion {
 public:
  void Reset(int expected);
  static void Callback(void* user, int code, const char* message);  // an hvdc_done_fn
  void Wait(WaitMode mode);
  int errors() const { return errors_.load(); }
  std::string first_error() const;

 private:
  std::atomic<int> remaining_{0};
  std::atomic<int> errors_{0};
  std::atomic<bool> finished_{false};  // set, under mu_, by the last callback
  mutable std::mutex mu_;  // guards done_, first_error_
  std::condition_variable cv_;
  bool done_ = false;
  std::string first_error_;
};

// Allreduce requests for a set of fp32 buffers, in place, with stable names (so the runtime's
// response cache sees the same tensors every step).
class AllreduceBatch {
 public:
  AllreduceBatch(const std::string& prefix, const std::vector<float*>& ptrs,
                 const std::vector<int64_t>& elements, int reduce_op);
  size_t count() const { return requests_.size(); }
  // Enqueues tensor i (one hvdc_enqueue call per tensor, as a framework does). Fails the job on
  // an enqueue error.
  void Enqueue(const Context& ctx, size_t i, Completion* done);
  void EnqueueAll(const Context& ctx, Completion* done);

 private:
  std::vector<std::string> names_;
  std::vector<hvdc_request> requests_;
};

int ParseReduceOp(const std::string& s);  // "sum" | "average"
const char* ReduceOpName(int op);

// Fills every tensor with the closed-form pattern, reduces them all through the runtime, checks
// every element; fails the job (non-zero exit) on a wrong value or a callback error.
void VerifyOurs(const Context& ctx, const Buffers& buffers, AllreduceBatch* batch, int reduce_op,
                WaitMode mode);

// One step: enqueue every tensor (in order), wait for every callback; fails the job on an error.
// If `enqueue_s` is given, adds the time the hvdc_enqueue calls alone took.
void OursStep(const Context& ctx, AllreduceBatch* batch, Completion* done, WaitMode mode,
              double* enqueue_s = nullptr);

}  // namespace bench

#endif  // HVDC_BENCH_OURS_H_
