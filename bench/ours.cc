#include "bench/ours.h"

#include <sched.h>

#include <cstring>

namespace bench {

WaitMode ParseWaitMode(const std::string& s) { return s == "yield" ? WaitMode::kYield : WaitMode::kBlock; }
const char* WaitModeName(WaitMode m) { return m == WaitMode::kYield ? "yield" : "block"; }

void Completion::Reset(int expected) {
  std::lock_guard<std::mutex> lock(mu_);
  remaining_.store(expected);
  errors_.store(0);
  done_ = expected == 0;
  finished_.store(done_);
  first_error_.clear();
}

void Completion::Callback(void* user, int code, const char* message) {
  auto* self = static_cast<Completion*>(user);
  if (code != HVDC_OK) {
    std::lock_guard<std::mutex> lock(self->mu_);
    if (self->errors_.fetch_add(1) == 0) {
      self->first_error_ = "code " + std::to_string(code) + ": " + (message ? message : "");
    }
  }
  if (self->remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->done_ = true;
      self->finished_.store(true, std::memory_order_release);
    }
    // Signalled after unlocking (a Completion outlives every step that uses it): signalled under
    // the lock, the woken caller -- on a rank pinned to one core, at once -- would only block
    // again on the lock this thread still holds, two context switches of the harness's own.
    self->cv_.notify_one();
  }
}

void Completion::Wait(WaitMode mode) {
  if (mode == WaitMode::kYield) {
    while (!finished_.load(std::memory_order_acquire)) sched_yield();
    // The last callback set finished_ inside its critical section: taking the lock once waits
    // until it has left it, so a Reset() right after cannot race with it.
    std::lock_guard<std::mutex> lock(mu_);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
}

std::string Completion::first_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_error_;
}

AllreduceBatch::AllreduceBatch(const std::string& prefix, const std::vector<float*>& ptrs,
                               const std::vector<int64_t>& elements, int reduce_op) {
  names_.reserve(ptrs.size());
  for (size_t i = 0; i < ptrs.size(); ++i) names_.push_back(prefix + "." + std::to_string(i));
  requests_.resize(ptrs.size());
  for (size_t i = 0; i < ptrs.size(); ++i) {
    hvdc_request& r = requests_[i];
    std::memset(&r, 0, sizeof r);
    r.op = HVDC_OP_ALLREDUCE;
    r.name = names_[i].c_str();
    r.process_set_id = 0;
    r.input.dtype = HVDC_FLOAT32;
    r.input.ndim = 1;
    r.input.dims[0] = elements[i];
    r.input.device = -1;
    r.input.data = ptrs[i];
    r.output = r.input;  // in place
    r.reduce_op = reduce_op;
    r.prescale_factor = 1.0;
    r.postscale_factor = 1.0;
  }
}

void AllreduceBatch::Enqueue(const Context& ctx, size_t i, Completion* done) {
  int rc = hvdc_enqueue(&requests_[i], 1, &Completion::Callback, done);
  if (rc != HVDC_OK) {
    Fail(ctx, "hvdc_enqueue(%s) returned %d: %s", requests_[i].name, rc, hvdc_last_error());
  }
}

void AllreduceBatch::EnqueueAll(const Context& ctx, Completion* done) {
  for (size_t i = 0; i < requests_.size(); ++i) Enqueue(ctx, i, done);
}

int ParseReduceOp(const std::string& s) {
  if (s == "sum") return HVDC_SUM;
  if (s == "average" || s == "avg") return HVDC_AVERAGE;
  std::fprintf(stderr, "unknown --op '%s' (sum|average)\n", s.c_str());
  std::exit(2);
}

const char* ReduceOpName(int op) { return op == HVDC_AVERAGE ? "average" : "sum"; }

void OursStep(const Context& ctx, AllreduceBatch* batch, Completion* done, WaitMode mode,
              double* enqueue_s) {
  done->Reset(static_cast<int>(batch->count()));
  double t0 = enqueue_s ? MPI_Wtime() : 0;
  batch->EnqueueAll(ctx, done);
  if (enqueue_s) *enqueue_s += MPI_Wtime() - t0;
  done->Wait(mode);
  if (done->errors()) {
    Fail(ctx, "%d of %zu callbacks failed; first: %s", done->errors(), batch->count(),
         done->first_error().c_str());
  }
}

void VerifyOurs(const Context& ctx, const Buffers& buffers, AllreduceBatch* batch, int reduce_op,
                WaitMode mode) {
  for (size_t i = 0; i < buffers.count(); ++i) {
    FillPattern(buffers.data(i), buffers.elements(i), ctx.rank, int64_t(i));
  }
  Completion done;
  OursStep(ctx, batch, &done, mode);
  int64_t wrong = 0;
  std::string err;
  for (size_t i = 0; i < buffers.count(); ++i) {
    std::string e;
    int64_t w = CheckPattern(buffers.data(i), buffers.elements(i), ctx.size, int64_t(i), reduce_op, &e);
    if (w && err.empty()) err = e;
    wrong += w;
  }
  if (!AllOk(ctx, wrong == 0)) {
    if (wrong) {
      Fail(ctx, "runtime allreduce (%s) gave %lld wrong elements; first: %s",
           ReduceOpName(reduce_op), (long long)wrong, err.c_str());
    }
    Fail(ctx, "runtime allreduce gave a wrong answer on another rank");
  }
  // Timed steps then run on zeros: values stay finite however many steps are run.
  for (size_t i = 0; i < buffers.count(); ++i) {
    std::memset(buffers.data(i), 0, size_t(buffers.elements(i)) * 4);
  }
}

}  // namespace bench
