// Host buffers for the C-API suites: a typed Buffer read and written as doubles (every dtype,
// float16/bfloat16 by their bit patterns), its comparison with expected values, hvdc_tensor views
// of it, and an Output the runtime allocates through hvdc_alloc_fn for the ops whose shape is known
// only after negotiation (allgather, alltoall, reducescatter).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/c_api_values.h"

namespace hvdc_test {

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

}  // namespace hvdc_test
