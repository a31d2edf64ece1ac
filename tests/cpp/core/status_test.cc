// Status (origin rank, detail, FromCode) and the process-set reasons it carries.
#include "core/status.h"

#include <gtest/gtest.h>

#include "core/process_set_error.h"

namespace hvdc {
namespace {

TEST(StatusTest, FromCodeKeepsCodeAndMessage) {
  for (StatusCode code : {StatusCode::kUnknownError, StatusCode::kPreconditionError,
                          StatusCode::kAborted, StatusCode::kInvalidArgument}) {
    Status s = Status::FromCode(code, "why");
    EXPECT_EQ(s.code(), code);
    EXPECT_EQ(s.message(), "why");
    EXPECT_EQ(s.ToString(), std::string(StatusCodeName(code)) + ": why");
  }
  Status ok = Status::FromCode(StatusCode::kOk, "ignored");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.message(), "");
}

TEST(StatusTest, OriginRankIsShownButLeavesTheMessage) {
  Status s = Status::PreconditionError("shapes differ");
  EXPECT_EQ(s.origin_rank(), -1);
  Status from0 = s.WithOrigin(0);
  EXPECT_EQ(from0.origin_rank(), 0);
  EXPECT_EQ(from0.message(), "shapes differ");
  EXPECT_EQ(from0.code(), StatusCode::kPreconditionError);
  EXPECT_EQ(from0.ToString(), "PRECONDITION_ERROR (from rank 0): shapes differ");
  EXPECT_EQ(s.ToString(), "PRECONDITION_ERROR: shapes differ");  // the original is unchanged
}

TEST(StatusTest, ProcessSetReasonsRoundTrip) {
  for (ProcessSetError why :
       {ProcessSetError::kInit, ProcessSetError::kDynamicOff, ProcessSetError::kUnknownSet,
        ProcessSetError::kForeignSet, ProcessSetError::kShutDown, ProcessSetError::kExistingSet}) {
    Status s = ProcessSetFailure(why, "m");
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message(), "m");
    EXPECT_EQ(ProcessSetErrorOf(s), why);
    EXPECT_EQ(ProcessSetErrorOf(s.WithOrigin(2)), why);
  }
  EXPECT_EQ(ProcessSetFailure(ProcessSetError::kShutDown, "").code(), StatusCode::kUnknownError);
  EXPECT_EQ(ProcessSetFailure(ProcessSetError::kUnknownSet, "").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ProcessSetErrorOf(Status::OK()), ProcessSetError::kNone);
  EXPECT_EQ(ProcessSetErrorOf(Status::InvalidArgument("x")), ProcessSetError::kNone);
  EXPECT_EQ(ProcessSetErrorOf(Status::InvalidArgument("x").WithDetail(99)), ProcessSetError::kNone);
}

}  // namespace
}  // namespace hvdc
