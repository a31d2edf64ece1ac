// A soak of the runtime through its C API only: 10,000 mixed collectives (allreduce most often,
// allgather with uneven first dims, broadcast from a rotating root, alltoall with explicit splits,
// reducescatter with a remainder), a deterministic mix and size per step, in batches of 8 in flight
// at once so fusion and the response cache work (names repeat, so most lookups hit; now and then
// an allreduce changes its shape under a cached name, a mismatch). Every output is compared
// exactly with values computed here (integers in float32 and int32, so every sum is exact), every
// callback must run exactly once and not on the enqueuing thread, and resident memory may grow by
// at most 4 MiB between the end of a warm-up (~500 ops) and the end (printed; only printed under
// ASan, whose allocator keeps freed memory in quarantine).
//
// Runs under mpirun and over the TCP transport (tcp_launch.py), np=3 (any np >= 1 works). The
// runtime has no log hook (core/logging.h writes its lines straight to stderr), so the check that
// it printed no WARNING/ERROR/FATAL line is done by ctest: both registrations in
// tests/cpp/CMakeLists.txt set FAIL_REGULAR_EXPRESSION on the `[hvdc] ... WARNING:` format. Run by
// hand, look for such lines yourself.
//
// The test's own buffers are allocated and touched before the warm-up and reused, so the measured
// growth is the runtime's (and the allocator's), not the test's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/c_api_harness.h"

namespace hvdc_test {
namespace {

constexpr int kSteps = 10000;
constexpr int kBatch = 8;
constexpr int kWarmupSteps = 504;  // 63 batches
constexpr int64_t kRssBoundBytes = 4 << 20;
// Elements (4 bytes each) of a "large" tensor start here: 16400 * 4 = 65600 bytes, above the
// HOROVOD_FUSION_THRESHOLD=65536 both registrations set.
constexpr int64_t kLargeBase = 16400;
constexpr int kReportLimit = 10;  // wrong results reported in full; the rest are counted

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif

enum Kind { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter, kNumKinds };
const char* const kKindName[kNumKinds] = {"allreduce", "allgather", "broadcast", "alltoall",
                                          "reducescatter"};

uint32_t Mix(uint32_t x) {  // murmur3's finalizer: a fixed, well-spread hash of the step
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

// What step `step` runs; equal on every rank.
struct Op {
  Kind kind;
  int dtype;      // HVDC_FLOAT32 or HVDC_INT32
  bool large;     // one tensor above the fusion threshold (1 step in 16)
  int variant;    // 0..3: picks the shape; part of the name, so shapes repeat under one name
  int root;       // broadcast: rotates with the step
  bool in_place;  // allreduce, broadcast
  bool twist;     // allreduce: one element more than the name's usual shape (a cache mismatch)
};

Op PlanOf(int step, int size) {
  const uint32_t h = Mix(static_cast<uint32_t>(step) * 2654435761u + 12345u);
  const uint32_t k = h % 20;
  Op op;
  op.kind = k < 11   ? kAllreduce
            : k < 14 ? kAllgather
            : k < 16 ? kBroadcast
            : k < 18 ? kAlltoall
                     : kReducescatter;
  op.dtype = (h >> 5) & 1 ? HVDC_INT32 : HVDC_FLOAT32;
  op.large = (h >> 6) % 16 == 0;
  op.variant = static_cast<int>((h >> 10) % 4);
  op.root = step % size;
  op.in_place = (h >> 12) & 1;
  op.twist = op.kind == kAllreduce && (h >> 13) % 64 == 0;
  return op;
}

std::string NameOf(const Op& op, int slot) {
  std::string name = std::string("soak.") + kKindName[op.kind] + "." + std::to_string(slot) + "." +
                     (op.dtype == HVDC_INT32 ? "i" : "f") + std::to_string(op.variant) +
                     (op.large ? "L" : "");
  if (op.kind == kBroadcast) name += ".root" + std::to_string(op.root);
  return name;
}

// Rank `rank`'s element i at `step`: an integer in [-125, 125].
int32_t Value(int step, int rank, int64_t i) {
  return static_cast<int32_t>((static_cast<int64_t>(step) * 13 + rank * 101 + i * 7) % 251) - 125;
}

int64_t Count(const Op& op) {  // allreduce, broadcast
  static const int64_t kSmall[4] = {1, 19, 300, 2053};
  const int64_t n = op.large ? kLargeBase + 1111 * op.variant : kSmall[op.variant];
  return n + (op.twist ? 1 : 0);
}

int64_t Trailing(const Op& op) {  // the row length of allgather, alltoall, reducescatter
  return op.kind == kAlltoall ? 2 : op.kind == kReducescatter ? 1 + op.variant % 2 : op.variant + 1;
}

int64_t AllgatherRows(const Op& op, int rank) {  // uneven; 0 for some ranks in variant 0
  if (op.large) return (kLargeBase + 600) / Trailing(op) + 100 * rank;
  return (rank + op.variant) % 3 + 5 * op.variant;
}

int32_t AlltoallSplit(const Op& op, int src, int dst) {
  if (op.large) return 3000 + 500 * ((src + dst + op.variant) % 3);
  return ((op.variant + src + 2 * dst) % 4) * (1 + 7 * op.variant);
}

int64_t ReducescatterRows(const Op& op, int size) {  // leaves a remainder of `variant` rows
  if (op.large) return kLargeBase + 2 + op.variant;
  return size * (1 + 9 * op.variant) + op.variant;
}

// Elements of one float32/int32 buffer: enough for any input or output above at np <= 3, and
// proportionally more above.
int64_t Capacity(int size) { return 20000 * std::max(size, 3) + 4096; }

void Put(int dtype, uint32_t* p, int32_t v) {
  if (dtype == HVDC_FLOAT32) {
    const float f = static_cast<float>(v);
    std::memcpy(p, &f, sizeof f);
  } else {
    std::memcpy(p, &v, sizeof v);
  }
}

double Get(int dtype, const uint32_t* p) {
  if (dtype == HVDC_FLOAT32) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  }
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::thread::id g_test_thread;

// The batch in flight: how many of its callbacks are still to come.
struct BatchWait {
  std::mutex mu;
  std::condition_variable cv;
  int remaining = 0;
};

// One per step, allocated up front; never reused, so a second callback is counted, not confused
// with a later step's.
struct Ticket {
  BatchWait* wait = nullptr;
  std::atomic<int> calls{0};
  std::atomic<bool> on_test_thread{false};
  int code = -1;
  std::string message;
};

void OnDone(void* user, int code, const char* message) {
  auto* t = static_cast<Ticket*>(user);
  if (std::this_thread::get_id() == g_test_thread) t->on_test_thread = true;
  if (t->calls.fetch_add(1) != 0) return;  // counted; the test fails on it
  std::lock_guard<std::mutex> lock(t->wait->mu);
  t->code = code;
  if (code != HVDC_OK) t->message = message ? message : "";
  if (--t->wait->remaining == 0) t->wait->cv.notify_all();
}

// The buffers of one of the kBatch requests in flight, sized once.
struct Slot {
  std::vector<uint32_t> in, out;
  std::vector<int32_t> splits, received;
  std::vector<int64_t> out_dims;
  int allocations = 0;
  std::string name;

  static void* Allocate(void* user, int32_t ndim, const int64_t* dims) {
    auto* s = static_cast<Slot*>(user);
    ++s->allocations;
    s->out_dims.assign(dims, dims + ndim);
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; ++d) n *= dims[d];
    return n <= static_cast<int64_t>(s->out.size()) ? s->out.data() : nullptr;
  }
};

int64_t ResidentBytes() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  const int got = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  return got == 2 ? static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE) : -1;
}

// Fills slot's input for `op` and returns the request.
hvdc_request Prepare(const Op& op, int step, int rank, int size, Slot* s) {
  hvdc_request req = NewRequest(HVDC_OP_ALLREDUCE, s->name.c_str());
  std::vector<int64_t> dims;
  int64_t n = 0;
  switch (op.kind) {
    case kAllreduce:
    case kBroadcast:
      n = Count(op);
      dims = {n};
      break;
    case kAllgather:
      dims = {AllgatherRows(op, rank), Trailing(op)};
      break;
    case kAlltoall: {
      int64_t rows = 0;
      for (int d = 0; d < size; ++d) rows += s->splits[d] = AlltoallSplit(op, rank, d);
      dims = {rows, Trailing(op)};
      break;
    }
    case kReducescatter:
      dims = {ReducescatterRows(op, size), Trailing(op)};
      break;
    default:
      break;
  }
  n = NumElements(dims);
  for (int64_t i = 0; i < n; ++i) Put(op.dtype, &s->in[i], Value(step, rank, i));
  req.input = MakeTensor(op.dtype, dims, s->in.data());
  s->allocations = 0;
  s->out_dims.clear();
  switch (op.kind) {
    case kAllreduce:
    case kBroadcast:
      req.op = op.kind == kAllreduce ? HVDC_OP_ALLREDUCE : HVDC_OP_BROADCAST;
      req.output = MakeTensor(op.dtype, dims, op.in_place ? s->in.data() : s->out.data());
      if (op.kind == kAllreduce) req.reduce_op = HVDC_SUM;
      if (op.kind == kBroadcast) req.root_rank = op.root;
      break;
    case kAllgather:
    case kAlltoall:
    case kReducescatter:
      req.op = op.kind == kAllgather  ? HVDC_OP_ALLGATHER
               : op.kind == kAlltoall ? HVDC_OP_ALLTOALL
                                      : HVDC_OP_REDUCESCATTER;
      if (op.kind == kReducescatter) req.reduce_op = HVDC_SUM;
      req.allocate = &Slot::Allocate;
      req.allocate_user = s;
      if (op.kind == kAlltoall) {
        std::fill(s->received.begin(), s->received.end(), -7);
        req.splits = s->splits.data();
        req.num_splits = size;
        req.received_splits = s->received.data();
      }
      break;
    default:
      break;
  }
  return req;
}

// Checks slot's output (and, when not in place, that the input is unchanged) after step `step`;
// returns "" or what is wrong.
std::string Check(const Op& op, int step, int rank, int size, const Slot& s) {
  std::vector<int64_t> want_dims;
  std::function<int64_t(int64_t)> want;  // expected output element
  int64_t in_n = 0;
  const int64_t t = Trailing(op);
  switch (op.kind) {
    case kAllreduce:
      in_n = Count(op);
      want = [&](int64_t i) {
        int64_t sum = 0;
        for (int r = 0; r < size; ++r) sum += Value(step, r, i);
        return sum;
      };
      break;
    case kBroadcast:
      in_n = Count(op);
      want = [&](int64_t i) { return static_cast<int64_t>(Value(step, op.root, i)); };
      break;
    case kAllgather: {
      in_n = AllgatherRows(op, rank) * t;
      int64_t rows = 0;
      for (int r = 0; r < size; ++r) rows += AllgatherRows(op, r);
      want_dims = {rows, t};
      want = [&](int64_t j) {
        int r = 0;
        while (j >= AllgatherRows(op, r) * t) j -= AllgatherRows(op, r++) * t;
        return static_cast<int64_t>(Value(step, r, j));
      };
      break;
    }
    case kAlltoall: {
      int64_t rows = 0;
      for (int src = 0; src < size; ++src) {
        rows += AlltoallSplit(op, src, rank);
        if (s.received[src] != AlltoallSplit(op, src, rank)) {
          return "received_splits[" + std::to_string(src) +
                 "] = " + std::to_string(s.received[src]) + ", expected " +
                 std::to_string(AlltoallSplit(op, src, rank));
        }
      }
      for (int d = 0; d < size; ++d) in_n += AlltoallSplit(op, rank, d) * t;
      want_dims = {rows, t};
      want = [&](int64_t j) {
        int src = 0;
        while (j >= AlltoallSplit(op, src, rank) * t) j -= AlltoallSplit(op, src++, rank) * t;
        int64_t offset = 0;  // src's elements before its block for this rank
        for (int d = 0; d < rank; ++d) offset += AlltoallSplit(op, src, d) * t;
        return static_cast<int64_t>(Value(step, src, offset + j));
      };
      break;
    }
    case kReducescatter: {
      const int64_t n = ReducescatterRows(op, size);
      in_n = n * t;
      const int64_t start = rank * (n / size) + std::min<int64_t>(rank, n % size);
      want_dims = {n / size + (rank < n % size ? 1 : 0), t};
      want = [&, start](int64_t j) {
        int64_t sum = 0;
        for (int r = 0; r < size; ++r) sum += Value(step, r, start * t + j);
        return sum;
      };
      break;
    }
    default:
      break;
  }
  int64_t out_n = in_n;
  const uint32_t* out = (op.in_place && (op.kind == kAllreduce || op.kind == kBroadcast))
                            ? s.in.data()
                            : s.out.data();
  if (!want_dims.empty()) {
    if (s.allocations != 1) return "allocate ran " + std::to_string(s.allocations) + " times";
    if (s.out_dims != want_dims) {
      return "output dims " + DimsString(s.out_dims) + ", expected " + DimsString(want_dims);
    }
    out_n = NumElements(want_dims);
  }
  for (int64_t i = 0; i < out_n; ++i) {
    const double got = Get(op.dtype, &out[i]);
    if (got != static_cast<double>(want(i))) {
      return "output[" + std::to_string(i) + "] = " + std::to_string(got) + ", expected " +
             std::to_string(want(i));
    }
  }
  if (out != s.in.data()) {
    for (int64_t i = 0; i < in_n; ++i) {
      if (Get(op.dtype, &s.in[i]) != Value(step, rank, i)) {
        return "input[" + std::to_string(i) + "] changed";
      }
    }
  }
  return "";
}

TEST(TransportSoak, TenThousandMixedCollectives) {
  const int rank = hvdc_rank();
  const int size = hvdc_size();
  ASSERT_GE(size, 1);
  g_test_thread = std::this_thread::get_id();

  std::vector<Slot> slots(kBatch);
  for (Slot& s : slots) {
    s.in.assign(Capacity(size), 0u);  // assign touches every page now, before the warm-up
    s.out.assign(Capacity(size), 0u);
    s.splits.assign(size, 0);
    s.received.assign(size, 0);
    s.out_dims.reserve(4);
    s.name.reserve(64);
  }
  std::unique_ptr<Ticket[]> tickets(new Ticket[kSteps]);
  BatchWait wait;
  int64_t ops[kNumKinds] = {}, large_ops = 0, twisted = 0, bad = 0;
  int64_t rss_warm = -1;
  const auto start = std::chrono::steady_clock::now();
  auto warm_time = start;

  for (int first = 0; first < kSteps; first += kBatch) {
    const int n = std::min(kBatch, kSteps - first);
    if (first == kWarmupSteps) {
      rss_warm = ResidentBytes();
      warm_time = std::chrono::steady_clock::now();
    }
    {
      std::lock_guard<std::mutex> lock(wait.mu);
      wait.remaining = n;
    }
    int enqueued = 0;
    for (int k = 0; k < n; ++k) {
      const int step = first + k;
      const Op op = PlanOf(step, size);
      Slot& s = slots[k];
      s.name = NameOf(op, k);
      const hvdc_request req = Prepare(op, step, rank, size, &s);
      tickets[step].wait = &wait;
      const int rc = hvdc_enqueue(&req, 1, &OnDone, &tickets[step]);
      if (rc != HVDC_OK) {
        ADD_FAILURE() << "step " << step << " (" << s.name << "): hvdc_enqueue returned " << rc
                      << ": " << hvdc_last_error();
        std::lock_guard<std::mutex> lock(wait.mu);
        --wait.remaining;
        continue;
      }
      ++enqueued;
      ++ops[op.kind];
      large_ops += op.large;
      twisted += op.twist;
    }
    {
      std::unique_lock<std::mutex> lock(wait.mu);
      if (!wait.cv.wait_for(lock, kHangLimit, [&] { return wait.remaining == 0; })) {
        std::fprintf(stderr,
                     "rank %d: batch at step %d still has %d callbacks to come after %lld s;"
                     " aborting\n",
                     rank, first, wait.remaining, static_cast<long long>(kHangLimit.count()));
        std::abort();  // the runtime may still write into the slots
      }
    }
    bool batch_failed = enqueued < n;
    for (int k = 0; k < n; ++k) {
      const int step = first + k;
      const Ticket& t = tickets[step];
      if (t.calls.load() == 0) continue;  // not enqueued (reported above)
      const Op op = PlanOf(step, size);
      std::string problem = t.code != HVDC_OK ? "code " + std::to_string(t.code) + ": " + t.message
                                              : Check(op, step, rank, size, slots[k]);
      if (problem.empty()) continue;
      // A wrong value leaves the ranks in step; after an error they may no longer agree on what
      // comes next, so the run stops at the end of this batch.
      batch_failed |= t.code != HVDC_OK;
      if (++bad <= kReportLimit) {
        ADD_FAILURE() << "rank " << rank << " step " << step << " " << NameOf(op, k) << ": "
                      << problem;
      }
    }
    if (batch_failed) break;
  }
  const auto end = std::chrono::steady_clock::now();
  const int64_t rss_end = ResidentBytes();

  int64_t total = 0, callbacks_wrong = 0, on_test_thread = 0;
  for (int k = 0; k < kNumKinds; ++k) total += ops[k];
  for (int step = 0; step < kSteps; ++step) {
    const int calls = tickets[step].calls.load();
    if (step < total && calls != 1) {
      if (++callbacks_wrong <= kReportLimit) {
        ADD_FAILURE() << "step " << step << ": callback ran " << calls << " times";
      }
    }
    on_test_thread += tickets[step].on_test_thread.load();
  }
  EXPECT_EQ(bad, 0) << "failed or wrong results (the first " << kReportLimit
                    << " are reported above)";
  EXPECT_EQ(callbacks_wrong, 0) << "callbacks that did not run exactly once";
  EXPECT_EQ(on_test_thread, 0) << "callbacks run on the enqueuing thread";
  EXPECT_EQ(total, kSteps);

  const double secs = std::chrono::duration<double>(end - start).count();
  const double after_warm = std::chrono::duration<double>(end - warm_time).count();
  std::printf(
      "[rank %d] %lld ops in %.2f s (%.0f ops/s after warm-up): allreduce %lld (%lld with a"
      " changed shape), allgather %lld, broadcast %lld, alltoall %lld, reducescatter %lld;"
      " %lld above the fusion threshold\n",
      rank, static_cast<long long>(total), secs,
      (total - kWarmupSteps) / std::max(after_warm, 1e-9), static_cast<long long>(ops[kAllreduce]),
      static_cast<long long>(twisted), static_cast<long long>(ops[kAllgather]),
      static_cast<long long>(ops[kBroadcast]), static_cast<long long>(ops[kAlltoall]),
      static_cast<long long>(ops[kReducescatter]), static_cast<long long>(large_ops));
  std::printf(
      "[rank %d] resident set: %.2f MiB after %d warm-up ops, %.2f MiB at the end: growth"
      " %+.1f KiB (bound %lld KiB%s)\n",
      rank, rss_warm / 1048576.0, kWarmupSteps, rss_end / 1048576.0, (rss_end - rss_warm) / 1024.0,
      static_cast<long long>(kRssBoundBytes / 1024), kAsan ? ", not checked under ASan" : "");
  std::fflush(stdout);
  ASSERT_GT(rss_warm, 0) << "could not read /proc/self/statm";
  if (!kAsan && total == kSteps) {
    EXPECT_LT(rss_end - rss_warm, kRssBoundBytes) << "resident set grew after the warm-up";
  }
}

}  // namespace
}  // namespace hvdc_test

int main(int argc, char** argv) { return hvdc_test::RunCApiTestMain(argc, argv); }
