// Helpers for the GoogleTest suites that drive the runtime through its C API (core/c_api.h) only:
// typed host buffers filled as f(index) for every dtype (float16/bfloat16 by their bit patterns),
// synchronous and asynchronous wrappers around hvdc_enqueue, an output allocator for the ops whose
// shape is known only after negotiation, and a main() for the suites run under mpirun.
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
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "core/c_api.h"

namespace hvdc_test {

// ---------------------------------------------------------------------------------------------
// dtypes

inline const std::vector<int>& AllDtypes() {
  static const std::vector<int> kAll = {HVDC_UINT8,   HVDC_INT8,    HVDC_UINT16,  HVDC_INT16,
                                        HVDC_INT32,   HVDC_INT64,   HVDC_FLOAT16, HVDC_BFLOAT16,
                                        HVDC_FLOAT32, HVDC_FLOAT64, HVDC_BOOL};
  return kAll;
}

inline size_t DtypeSize(int dtype) {
  switch (dtype) {
    case HVDC_UINT8:
    case HVDC_INT8:
    case HVDC_BOOL:
      return 1;
    case HVDC_UINT16:
    case HVDC_INT16:
    case HVDC_FLOAT16:
    case HVDC_BFLOAT16:
      return 2;
    case HVDC_INT32:
    case HVDC_FLOAT32:
      return 4;
    case HVDC_INT64:
    case HVDC_FLOAT64:
      return 8;
  }
  return 0;
}

inline const char* DtypeName(int dtype) {
  switch (dtype) {
    case HVDC_UINT8:
      return "uint8";
    case HVDC_INT8:
      return "int8";
    case HVDC_UINT16:
      return "uint16";
    case HVDC_INT16:
      return "int16";
    case HVDC_INT32:
      return "int32";
    case HVDC_INT64:
      return "int64";
    case HVDC_FLOAT16:
      return "float16";
    case HVDC_BFLOAT16:
      return "bfloat16";
    case HVDC_FLOAT32:
      return "float32";
    case HVDC_FLOAT64:
      return "float64";
    case HVDC_BOOL:
      return "bool";
  }
  return "invalid";
}

inline const char* ReduceOpName(int op) {
  switch (op) {
    case HVDC_AVERAGE:
      return "Average";
    case HVDC_SUM:
      return "Sum";
    case HVDC_ADASUM:
      return "Adasum";
    case HVDC_MIN:
      return "Min";
    case HVDC_MAX:
      return "Max";
    case HVDC_PRODUCT:
      return "Product";
  }
  return "invalid";
}

inline bool IsFloat(int dtype) {
  return dtype == HVDC_FLOAT16 || dtype == HVDC_BFLOAT16 || dtype == HVDC_FLOAT32 ||
         dtype == HVDC_FLOAT64;
}

// Whether the dtype holds negative values.
inline bool IsSigned(int dtype) {
  return IsFloat(dtype) || dtype == HVDC_INT8 || dtype == HVDC_INT16 || dtype == HVDC_INT32 ||
         dtype == HVDC_INT64;
}

// IEEE binary16 <-> binary32, round to nearest even (subnormals included).
inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t out = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (out & 1u))) ++out;
    return static_cast<uint16_t>(sign | out);
  }
  uint32_t out = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) ++out;
  return static_cast<uint16_t>(out);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// bfloat16 = the top half of a binary32, round to nearest even.
inline uint16_t FloatToBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if (std::isnan(f)) return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float Bfloat16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Absolute tolerance for comparing a result of `dtype` with the exact value `expected`: zero for
// integer types (and for exactly representable results), a few ulps for floating point types, to
// allow for a different association order or a folded 1/size factor.
inline double Tolerance(int dtype, double expected) {
  const double mag = std::fabs(expected);
  switch (dtype) {
    case HVDC_FLOAT16:
      return 4e-3 * mag + 1e-3;
    case HVDC_BFLOAT16:
      return 2e-2 * mag + 1e-2;
    case HVDC_FLOAT32:
      return 1e-5 * mag + 1e-6;
    case HVDC_FLOAT64:
      return 1e-12 * mag + 1e-12;
  }
  return 0.0;
}

// ---------------------------------------------------------------------------------------------
// Inputs for reductions

// Rank r's element i for a reduction with `op`, chosen so that no result overflows its dtype
// (int8 and float16 included) and every result of an exact op is exactly representable.
inline double ReduceInput(int dtype, int op, int rank, int64_t i) {
  const int64_t r = rank;
  switch (op) {
    case HVDC_SUM:
      return static_cast<double>((i * 7 + r * 3) % 9 - (IsSigned(dtype) ? 4 : 0));
    case HVDC_AVERAGE: {
      // m(i) plus +k on rank 0 and -k on rank 1: the sum over any size >= 2 is size * m(i), so the
      // average is exact even for integers.
      const int64_t m = IsSigned(dtype) ? (i * 7) % 9 - 4 : 3 + (i * 7) % 9;
      const int64_t k = i % 3;
      return static_cast<double>(m + (r == 0 ? k : r == 1 ? -k : 0));
    }
    case HVDC_MIN:
    case HVDC_MAX:
      if (dtype == HVDC_BOOL) return (i + r) % 3 == 0 ? 1.0 : 0.0;
      return static_cast<double>((i * 5 + r * 7) % 13 - (IsSigned(dtype) ? 6 : 0));
    case HVDC_PRODUCT: {
      const double magnitude = static_cast<double>(1 + (i + r) % 2);
      return (IsSigned(dtype) && (i + 2 * r) % 5 == 0) ? -magnitude : magnitude;
    }
  }
  return 0.0;
}

// The reduction of Input(dtype, op, r, i) over `ranks`, then scaled.
inline double ReduceExpected(int dtype, int op, const std::vector<int>& ranks, int64_t i,
                             double prescale = 1.0, double postscale = 1.0) {
  double acc = 0.0;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const double v = ReduceInput(dtype, op, ranks[k], i) * prescale;
    if (k == 0) {
      acc = v;
      continue;
    }
    switch (op) {
      case HVDC_SUM:
      case HVDC_AVERAGE:
        acc += v;
        break;
      case HVDC_MIN:
        acc = std::min(acc, v);
        break;
      case HVDC_MAX:
        acc = std::max(acc, v);
        break;
      case HVDC_PRODUCT:
        acc *= v;
        break;
    }
  }
  if (op == HVDC_AVERAGE) acc /= static_cast<double>(ranks.size());
  return acc * postscale;
}

// Rank r's element i for data-movement ops (allgather, broadcast, alltoall): distinct across ranks
// and indices within each dtype's exactly representable range.
inline double MoveValue(int dtype, int rank, int64_t i) {
  const int64_t x = static_cast<int64_t>(rank) * 31 + i * 7 + 1;
  switch (dtype) {
    case HVDC_BOOL:
      return static_cast<double>(x % 2);
    case HVDC_UINT8:
      return static_cast<double>(x % 251);
    case HVDC_INT8:
      return static_cast<double>(x % 251 - 125);
    case HVDC_UINT16:
      return static_cast<double>(x % 65521);
    case HVDC_INT16:
      return static_cast<double>(x % 65521 - 32760);
    case HVDC_INT32:
      return static_cast<double>(x % 2000003 - 1000000);
    case HVDC_INT64:  // beyond the int32 range
      return static_cast<double>((x % 2000003 - 1000000) * 4096);
    case HVDC_FLOAT16:
      return static_cast<double>(x % 2039 - 1019);
    case HVDC_BFLOAT16:
      return static_cast<double>(x % 255 - 127);
    case HVDC_FLOAT32:
      return static_cast<double>(x % 100003 - 50000) / 4.0;
    case HVDC_FLOAT64:
      return static_cast<double>(x % 1000003 - 500000) / 8.0;
  }
  return 0.0;
}

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
// Buffers

// A host buffer of `count` elements of one dtype, read and written as doubles (every value the
// tests use is exactly representable in its dtype). data() is never NULL, even for 0 elements.
class Buffer {
 public:
  Buffer() : Buffer(HVDC_FLOAT32, 0) {}
  Buffer(int dtype, int64_t count)
      : dtype_(dtype),
        count_(count),
        bytes_(std::max<size_t>(1, static_cast<size_t>(count) * DtypeSize(dtype))) {}
  Buffer(int dtype, int64_t count, const std::function<double(int64_t)>& f) : Buffer(dtype, count) {
    Fill(f);
  }

  int dtype() const { return dtype_; }
  int64_t count() const { return count_; }
  size_t bytes() const { return static_cast<size_t>(count_) * DtypeSize(dtype_); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  void Fill(const std::function<double(int64_t)>& f) {
    for (int64_t i = 0; i < count_; ++i) Set(i, f(i));
  }
  // Overwrites every byte (a sentinel for outputs that must be written).
  void Poison(unsigned char byte = 0xA5) { std::fill(bytes_.begin(), bytes_.end(), byte); }

  void Set(int64_t i, double v) {
    unsigned char* p = bytes_.data() + static_cast<size_t>(i) * DtypeSize(dtype_);
    switch (dtype_) {
      case HVDC_UINT8:
        Store(p, static_cast<uint8_t>(v));
        break;
      case HVDC_INT8:
        Store(p, static_cast<int8_t>(v));
        break;
      case HVDC_UINT16:
        Store(p, static_cast<uint16_t>(v));
        break;
      case HVDC_INT16:
        Store(p, static_cast<int16_t>(v));
        break;
      case HVDC_INT32:
        Store(p, static_cast<int32_t>(v));
        break;
      case HVDC_INT64:
        Store(p, static_cast<int64_t>(v));
        break;
      case HVDC_FLOAT16:
        Store(p, FloatToHalf(static_cast<float>(v)));
        break;
      case HVDC_BFLOAT16:
        Store(p, FloatToBfloat16(static_cast<float>(v)));
        break;
      case HVDC_FLOAT32:
        Store(p, static_cast<float>(v));
        break;
      case HVDC_FLOAT64:
        Store(p, v);
        break;
      case HVDC_BOOL:
        Store(p, static_cast<uint8_t>(v != 0.0 ? 1 : 0));
        break;
    }
  }

  double Get(int64_t i) const {
    const unsigned char* p = bytes_.data() + static_cast<size_t>(i) * DtypeSize(dtype_);
    switch (dtype_) {
      case HVDC_UINT8:
        return Load<uint8_t>(p);
      case HVDC_INT8:
        return Load<int8_t>(p);
      case HVDC_UINT16:
        return Load<uint16_t>(p);
      case HVDC_INT16:
        return Load<int16_t>(p);
      case HVDC_INT32:
        return Load<int32_t>(p);
      case HVDC_INT64:
        return static_cast<double>(Load<int64_t>(p));
      case HVDC_FLOAT16:
        return HalfToFloat(Load<uint16_t>(p));
      case HVDC_BFLOAT16:
        return Bfloat16ToFloat(Load<uint16_t>(p));
      case HVDC_FLOAT32:
        return Load<float>(p);
      case HVDC_FLOAT64:
        return Load<double>(p);
      case HVDC_BOOL:
        return Load<uint8_t>(p) != 0 ? 1.0 : 0.0;
    }
    return NAN;
  }

 private:
  template <typename T>
  static void Store(unsigned char* p, T v) {
    std::memcpy(p, &v, sizeof v);
  }
  template <typename T>
  static T Load(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }

  int dtype_;
  int64_t count_;
  std::vector<unsigned char> bytes_;
};

inline int64_t NumElements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

inline std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

inline hvdc_tensor MakeTensor(int dtype, const std::vector<int64_t>& dims, void* data) {
  hvdc_tensor t;
  std::memset(&t, 0, sizeof t);
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) t.dims[i] = dims[i];
  t.device = -1;
  t.data = data;
  return t;
}

// A view of `buf` with shape `dims` (whose element count must be buf.count()).
inline hvdc_tensor TensorOf(Buffer& buf, const std::vector<int64_t>& dims) {
  EXPECT_EQ(NumElements(dims), buf.count()) << "test bug: dims " << DimsString(dims);
  return MakeTensor(buf.dtype(), dims, buf.data());
}

// Compares every element of `got` with expected(i) (tolerance per dtype); reports the first few
// mismatches and how many there were.
inline ::testing::AssertionResult BufferMatches(const Buffer& got,
                                                const std::function<double(int64_t)>& expected,
                                                const std::string& what = "") {
  int64_t bad = 0;
  std::string detail;
  for (int64_t i = 0; i < got.count(); ++i) {
    const double e = expected(i);
    const double g = got.Get(i);
    if (!(std::fabs(g - e) <= Tolerance(got.dtype(), e))) {
      if (bad < 5) {
        detail += "\n  [" + std::to_string(i) + "] got " + std::to_string(g) + ", expected " +
                  std::to_string(e);
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << (what.empty() ? "" : ": ") << bad << " of " << got.count() << " "
         << DtypeName(got.dtype()) << " elements differ" << detail;
}

// ---------------------------------------------------------------------------------------------
// Output allocation (allgather, alltoall, reducescatter)

// Storage handed to the runtime through hvdc_alloc_fn; records the shape it was asked for.
class Output {
 public:
  explicit Output(int dtype) : dtype_(dtype), buffer_(dtype, 0) {}
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  void AttachTo(hvdc_request* req) {
    req->allocate = &Output::Allocate;
    req->allocate_user = this;
  }
  // Make the next allocation fail (the allocator returns NULL).
  void FailAllocation() { fail_ = true; }

  int calls() const { return calls_.load(); }
  const std::vector<int64_t>& dims() const { return dims_; }
  const Buffer& buffer() const { return buffer_; }

  static void* Allocate(void* user, int32_t ndim, const int64_t* dims) {
    auto* self = static_cast<Output*>(user);
    self->calls_.fetch_add(1);
    if (self->fail_) return nullptr;
    self->dims_.assign(dims, dims + ndim);
    self->buffer_ = Buffer(self->dtype_, NumElements(self->dims_));
    self->buffer_.Poison();
    return self->buffer_.data();
  }

 private:
  int dtype_;
  bool fail_ = false;
  std::atomic<int> calls_{0};
  std::vector<int64_t> dims_;
  Buffer buffer_;
};

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
// Requests

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
// main() for the suites run under mpirun

// On ranks other than 0, replaces GoogleTest's printer with one that prints only failures,
// prefixed with the rank, so the output of np ranks stays readable.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

// Initialises the runtime (with `options`, may be NULL), runs every test, shuts down, and checks
// the callback ledger. Returns non-zero if anything failed on this rank (mpirun then returns
// non-zero). Variables the caller exported with setenv() before this call win over the defaults
// below.
inline int RunMpiTestMain(int argc, char** argv, const hvdc_init_options* options = nullptr) {
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
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
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
