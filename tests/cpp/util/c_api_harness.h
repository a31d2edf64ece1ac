// The harness of the suites that drive the runtime through its C API (core/c_api.h) only, under
// mpirun or as processes over the TCP transport (tcp_launch.py): synchronous and asynchronous
// wrappers around hvdc_enqueue, requests, result matchers, the ranks of a process set, and a main()
// that initialises the runtime around the tests. Values and buffers are in c_api_values.h and
// c_api_buffers.h (included).
//
// Every completion ever created lives in a process-wide ledger that is never freed, so a callback
// that arrives twice (or late) is counted instead of touching freed memory; CheckLedger() says
// whether every successfully enqueued request saw its callback exactly once.
#pragma once

#include <gtest/gtest.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/c_api_buffers.h"
#include "tests/cpp/util/c_api_values.h"
#include "tests/cpp/util/rank_failure_printer.h"

namespace hvdc_test {

// ---------------------------------------------------------------------------------------------
// Ranks and process sets

inline std::vector<int> Range(int n) {
  std::vector<int> v(n > 0 ? n : 0);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

inline std::vector<int> WorldRanks() { return Range(hvdc_size()); }

// The global ranks of a process set (empty if the id is unknown).
inline std::vector<int> SetRanks(int id) {
  std::vector<int32_t> out(256, -1);
  const int n = hvdc_process_set_ranks(id, out.data(), static_cast<int32_t>(out.size()));
  if (n < 0) return {};
  return std::vector<int>(out.begin(), out.begin() + std::min<int>(n, 256));
}

inline bool Member(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

// Position of `rank` in `ranks` (its rank within the set), or -1.
inline int IndexOf(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

// ---------------------------------------------------------------------------------------------
// Enqueue and wait

struct Result {
  int code = -1;
  std::string message;
  bool from_enqueue = false;  // hvdc_enqueue itself failed (no callback)
  bool ok() const { return code == HVDC_OK; }
};

inline std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "{code " << r.code << (r.from_enqueue ? " from hvdc_enqueue" : " from callback")
            << ", message \"" << r.message << "\"}";
}

namespace detail {

struct Completion {
  std::string label;
  std::thread::id caller;
  std::atomic<int> enqueue_rc{-1};  // what hvdc_enqueue returned
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int code = -1;
  std::string message;
  std::atomic<int> calls{0};
  std::atomic<bool> on_caller_thread{false};
  bool may_complete_inline = false;  // the requests carried HVDC_REQUEST_MAY_COMPLETE_INLINE
  bool expect_inline = false;        // ... and the runtime should have used it
  std::atomic<bool> done_before_return{false};  // the callback ran inside hvdc_enqueue
};

struct Ledger {
  std::mutex mu;
  std::deque<Completion> entries;  // stable addresses; never shrinks
};

inline Ledger& GetLedger() {
  static Ledger* ledger = new Ledger();  // deliberately never freed (late callbacks stay safe)
  return *ledger;
}

inline Completion* NewCompletion(const char* label) {
  Ledger& l = GetLedger();
  std::lock_guard<std::mutex> lock(l.mu);
  l.entries.emplace_back();
  Completion* c = &l.entries.back();
  c->label = label ? label : "(null name)";
  c->caller = std::this_thread::get_id();
  return c;
}

inline void OnDone(void* user, int code, const char* message) {
  auto* c = static_cast<Completion*>(user);
  if (std::this_thread::get_id() == c->caller) c->on_caller_thread = true;
  if (c->calls.fetch_add(1) != 0) {
    std::fprintf(stderr, "hvdc_test: callback of '%s' called again (code %d, %s)\n",
                 c->label.c_str(), code, message ? message : "");
    return;
  }
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->code = code;
    c->message = message ? message : "";
    c->done = true;
  }
  c->cv.notify_all();
}

}  // namespace detail

// How long a test waits for any callback before declaring the runtime hung. The process is
// aborted then: the runtime may still write into the request's buffers, so the test cannot go on.
constexpr std::chrono::seconds kHangLimit{240};

// One hvdc_enqueue call (a request or a group), completed or still in flight.
class Pending {
 public:
  Pending() = default;
  explicit Pending(detail::Completion* c) : c_(c) {}
  static Pending Failed(int code, std::string message) {
    Pending p;
    p.sync_.code = code;
    p.sync_.message = std::move(message);
    p.sync_.from_enqueue = true;
    return p;
  }

  bool enqueue_failed() const { return c_ == nullptr; }

  // Waits up to `limit`; false if the callback has not come by then.
  bool WaitFor(std::chrono::milliseconds limit, Result* out) const {
    if (!c_) {
      *out = sync_;
      return true;
    }
    std::unique_lock<std::mutex> lock(c_->mu);
    if (!c_->cv.wait_for(lock, limit, [&] { return c_->done; })) return false;
    out->code = c_->code;
    out->message = c_->message;
    out->from_enqueue = false;
    return true;
  }

  Result Wait() const {
    Result r;
    if (!WaitFor(std::chrono::duration_cast<std::chrono::milliseconds>(kHangLimit), &r)) {
      std::fprintf(stderr, "hvdc_test: rank %d: no callback for '%s' after %lld s; aborting\n",
                   hvdc_rank(), c_->label.c_str(), static_cast<long long>(kHangLimit.count()));
      std::fflush(stderr);
      std::abort();
    }
    return r;
  }

 private:
  detail::Completion* c_ = nullptr;
  Result sync_;
};

// HVDC_TEST_INLINE=1: every request is enqueued with HVDC_REQUEST_MAY_COMPLETE_INLINE, and the
// ledger checks that a one-member set's collectives did complete inside hvdc_enqueue (and that
// nothing else ran its callback on the enqueuing thread).
inline bool InlineMode() {
  static const bool on = [] {
    const char* v = std::getenv("HVDC_TEST_INLINE");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

namespace detail {

// What runtime_inline.cc runs on the calling thread: CPU collectives other than join and barrier
// on a set of one member.
inline bool RunsInline(const hvdc_request* requests, int32_t count) {
  if (count <= 0 || requests == nullptr) return false;
  if (hvdc_process_set_size(requests[0].process_set_id) != 1) return false;
  for (int32_t i = 0; i < count; ++i) {
    const hvdc_request& r = requests[i];
    if (r.op == HVDC_OP_JOIN || r.op == HVDC_OP_BARRIER || r.input.device >= 0) return false;
  }
  return true;
}

}  // namespace detail

// Enqueues requests[0..count) as one hvdc_enqueue call (a group when count > 1).
inline Pending Enqueue(const hvdc_request* requests, int32_t count) {
  detail::Completion* c =
      detail::NewCompletion(count > 0 && requests ? requests[0].name : "(empty group)");
  std::vector<hvdc_request> flagged;
  if (InlineMode() && count > 0 && requests != nullptr) {
    flagged.assign(requests, requests + count);
    for (auto& r : flagged) r.flags |= HVDC_REQUEST_MAY_COMPLETE_INLINE;
    requests = flagged.data();
    c->may_complete_inline = true;
    c->expect_inline = detail::RunsInline(requests, count);
  }
  const int rc = hvdc_enqueue(requests, count, &detail::OnDone, c);
  c->done_before_return = c->calls.load() > 0;
  c->enqueue_rc = rc;
  if (rc != HVDC_OK) {
    const char* err = hvdc_last_error();
    return Pending::Failed(rc, err ? err : "");
  }
  return Pending(c);
}

inline Pending Enqueue(const hvdc_request& request) { return Enqueue(&request, 1); }

inline Result RunSync(const hvdc_request& request) { return Enqueue(&request, 1).Wait(); }

inline Result RunGroup(const std::vector<hvdc_request>& requests) {
  return Enqueue(requests.data(), static_cast<int32_t>(requests.size())).Wait();
}

// Many requests in flight at once. Keeps the tensor names alive until WaitAll().
class Batch {
 public:
  // A stable copy of `name` for a request of this batch.
  const char* Name(const std::string& name) {
    names_.push_back(name);
    return names_.back().c_str();
  }
  void Add(const hvdc_request& request) { pending_.push_back(Enqueue(&request, 1)); }
  void AddGroup(const std::vector<hvdc_request>& requests) {
    pending_.push_back(Enqueue(requests.data(), static_cast<int32_t>(requests.size())));
  }
  // Results in the order the requests were added.
  std::vector<Result> WaitAll() {
    std::vector<Result> out;
    for (const Pending& p : pending_) out.push_back(p.Wait());
    pending_.clear();
    return out;
  }

 private:
  std::deque<std::string> names_;
  std::vector<Pending> pending_;
};

// Whether every request whose hvdc_enqueue succeeded saw exactly one callback, no failed enqueue
// saw any, and no callback ran on the enqueuing thread. Call when nothing is in flight.
struct LedgerReport {
  int64_t enqueued = 0;
  int64_t rejected = 0;
  std::vector<std::string> problems;
  bool clean() const { return problems.empty(); }
};

inline LedgerReport CheckLedger() {
  LedgerReport report;
  detail::Ledger& l = detail::GetLedger();
  std::lock_guard<std::mutex> lock(l.mu);
  for (detail::Completion& c : l.entries) {
    const int rc = c.enqueue_rc.load();
    const int calls = c.calls.load();
    if (rc == HVDC_OK) {
      ++report.enqueued;
      if (calls != 1) {
        report.problems.push_back("'" + c.label + "': enqueued, callback ran " +
                                  std::to_string(calls) + " times");
      }
    } else {
      ++report.rejected;
      if (calls != 0) {
        report.problems.push_back("'" + c.label + "': hvdc_enqueue failed (" + std::to_string(rc) +
                                  ") but the callback ran " + std::to_string(calls) + " times");
      }
    }
    if (c.on_caller_thread && !c.may_complete_inline) {
      report.problems.push_back("'" + c.label + "': callback ran on the enqueuing thread");
    }
    if (rc == HVDC_OK && c.expect_inline && !(c.on_caller_thread && c.done_before_return)) {
      report.problems.push_back("'" + c.label +
                                "': a one-member set's collective did not complete inline");
    }
  }
  return report;
}

// ---------------------------------------------------------------------------------------------
// Requests and results

inline hvdc_request NewRequest(int op, const char* name, int process_set_id = 0) {
  hvdc_request r;
  std::memset(&r, 0, sizeof r);
  r.op = op;
  r.name = name;
  r.process_set_id = process_set_id;
  return r;
}

// `output` may be `input` (in place).
inline hvdc_request AllreduceRequest(const char* name, Buffer& input, Buffer& output,
                                     const std::vector<int64_t>& dims, int reduce_op,
                                     int process_set_id = 0) {
  hvdc_request r = NewRequest(HVDC_OP_ALLREDUCE, name, process_set_id);
  r.input = TensorOf(input, dims);
  r.output = TensorOf(output, dims);
  r.reduce_op = reduce_op;
  return r;
}

// The full name of the running test plus a suffix: equal on every rank, distinct across tests.
inline std::string TestName(const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  return suffix.empty() ? name : name + "." + suffix;
}

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

inline bool ContainsNoCase(const std::string& haystack, const std::string& needle) {
  if (needle.empty()) return true;
  for (size_t i = 0; i + needle.size() <= haystack.size(); ++i) {
    if (strncasecmp(haystack.c_str() + i, needle.c_str(), needle.size()) == 0) return true;
  }
  return false;
}

inline ::testing::AssertionResult IsOk(const Result& r) {
  if (r.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected success, got " << r;
}

// The result carries `code` and a message containing every string in `parts` (case-insensitive).
inline ::testing::AssertionResult IsError(const Result& r, int code,
                                          const std::vector<std::string>& parts = {}) {
  if (r.code != code) {
    return ::testing::AssertionFailure() << "expected code " << code << ", got " << r;
  }
  for (const std::string& p : parts) {
    if (!ContainsNoCase(r.message, p)) {
      return ::testing::AssertionFailure() << "message lacks \"" << p << "\": " << r;
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// main() for the suites run as several processes

// Initialises the runtime (with `options`, may be NULL), runs every test, shuts down, and checks
// the callback ledger. Returns non-zero if anything failed on this rank (mpirun or tcp_launch.py
// then returns non-zero). Variables the caller exported with setenv() before this call win over the
// defaults below.
inline int RunCApiTestMain(int argc, char** argv, const hvdc_init_options* options = nullptr) {
  ::testing::InitGoogleTest(&argc, argv);
  // A hang (a rank never submitting a tensor) becomes errors on every pending callback after a
  // minute instead of a silent wait until the ctest timeout.
  setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "30", 0);
  setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "60", 0);
  if (hvdc_init(options) != HVDC_OK) {
    std::fprintf(stderr, "hvdc_init failed: %s\n", hvdc_last_error());
    return 1;
  }
  const int rank = hvdc_rank();
  PrintOnlyFailuresUnlessRankZero(rank);
  int result = RUN_ALL_TESTS();
  hvdc_shutdown();
  LedgerReport report = CheckLedger();
  for (const std::string& p : report.problems) {
    std::fprintf(stderr, "[rank %d] callback ledger: %s\n", rank, p.c_str());
  }
  if (!report.clean()) result = 1;
  if (result != 0) std::fprintf(stderr, "[rank %d] FAILED\n", rank);
  return result;
}

}  // namespace hvdc_test
