#include "core/status.h"

namespace hvdc {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kUnknownError:
      return "UNKNOWN_ERROR";
    case StatusCode::kPreconditionError:
      return "PRECONDITION_ERROR";
    case StatusCode::kAborted:
      return "ABORTED";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kInProgress:
      return "IN_PROGRESS";
    case StatusCode::kPeerLost:
      return "PEER_LOST";
  }
  return "UNKNOWN_CODE";
}

Status Status::FromCode(StatusCode code, std::string msg) {
  if (code == StatusCode::kOk) return OK();
  return {code, std::move(msg)};
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string origin = origin_rank_ >= 0 ? " (from rank " + std::to_string(origin_rank_) + ")" : "";
  return std::string(StatusCodeName(code_)) + origin + ": " + message_;
}

}  // namespace hvdc
