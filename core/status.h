// Status: the error type used everywhere inside the core. Codes map one to one onto the C API codes
// (c_api.h) and, in Python, onto the exception classes Horovod raises for each.
#pragma once

#include <string>
#include <utility>

namespace hvdc {

enum class StatusCode : int {
  kOk = 0,
  kUnknownError = 1,       // TF UnknownError; also "the runtime has shut down"
  kPreconditionError = 2,  // cross-rank mismatch, not initialized
  kAborted = 3,            // unsupported operation detected by the coordinator
  kInvalidArgument = 4,    // bad arguments detected at enqueue
  kInProgress = 5,
  kPeerLost = 6,  // a peer rank died, hung or was cut off; Python raises HorovodInternalError
};

// [[nodiscard]]: an ignored Status is a lost error; write `(void)` with a reason where dropping one
// is right.
class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status UnknownError(std::string msg) {
    return {StatusCode::kUnknownError, std::move(msg)};
  }
  static Status PreconditionError(std::string msg) {
    return {StatusCode::kPreconditionError, std::move(msg)};
  }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status InProgress() { return {StatusCode::kInProgress, ""}; }
  static Status PeerLost(std::string msg) { return {StatusCode::kPeerLost, std::move(msg)}; }
  // The status with this code and message (kOk gives OK and drops the message).
  static Status FromCode(StatusCode code, std::string msg);

  // The world rank where the error arose: the coordinator for an error negotiated in a round; -1
  // when it arose on this rank or is not known.
  // ToString shows it; messages handed to callers are left as written.
  int origin_rank() const { return origin_rank_; }
  Status WithOrigin(int rank) const {
    Status s = *this;
    s.origin_rank_ = rank;
    return s;
  }
  // An operation-specific reason beside the code (0 = none), e.g. ProcessSetError.
  int detail() const { return detail_; }
  Status WithDetail(int detail) const {
    Status s = *this;
    s.detail_ = detail;
    return s;
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int origin_rank_ = -1;
  int detail_ = 0;
};

const char* StatusCodeName(StatusCode code);

}  // namespace hvdc

#define HVDC_RETURN_IF_ERROR(expr)     \
  do {                                 \
    ::hvdc::Status _hvdc_s = (expr);   \
    if (!_hvdc_s.ok()) return _hvdc_s; \
  } while (0)
