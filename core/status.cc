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

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

}  // namespace hvdc
