#include "core/process_set_error.h"

#include <utility>

namespace hvdc {

Status ProcessSetFailure(ProcessSetError why, std::string message) {
  StatusCode code = StatusCode::kInvalidArgument;
  if (why == ProcessSetError::kShutDown) code = StatusCode::kUnknownError;
  if (why == ProcessSetError::kInit || why == ProcessSetError::kDynamicOff) {
    code = StatusCode::kPreconditionError;
  }
  return Status::FromCode(code, std::move(message)).WithDetail(static_cast<int>(why));
}

ProcessSetError ProcessSetErrorOf(const Status& status) {
  if (status.ok()) return ProcessSetError::kNone;
  const int d = status.detail();
  if (d <= 0 || d > static_cast<int>(ProcessSetError::kExistingSet)) return ProcessSetError::kNone;
  return static_cast<ProcessSetError>(d);
}

}  // namespace hvdc
