// The wire format round-trips, and the parser rejects truncated and corrupted input without
// crashing (a bounded fuzz loop: every truncation, plus random byte flips and random blobs).
#include "core/wire_format.h"

#include <gtest/gtest.h>

#include <random>

namespace hvdc {
namespace {

RequestList SampleRequests() {
  RequestList list;
  list.rank = 3;
  list.shutdown = true;
  Request a;
  a.op = OpType::kAlltoall;
  a.dtype = DataType::kBfloat16;
  a.name = "layer/kernel:0";
  a.shape = {4, 5, 6};
  a.device = 2;
  a.root_rank = 1;
  a.reduce_op = ReduceOp::kMax;
  a.prescale = 0.5;
  a.postscale = 3.25;
  a.splits = {1, 2, 1};
  a.group_size = 2;
  a.group = "grp";
  list.requests.push_back(a);
  Request b;
  b.name = "";
  list.requests.push_back(b);
  return list;
}

ResponseList SampleResponses() {
  ResponseList list;
  list.shutdown = true;
  list.shutdown_reason = "stalled";
  Response r;
  r.op = OpType::kAllgather;
  r.name = "g";
  r.dtype = DataType::kInt64;
  r.shape = {7, 2};
  r.first_dims = {1, 0, 6};
  r.splits = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  r.last_joined_rank = 2;
  r.error_code = StatusCode::kPreconditionError;
  r.error_message = "Mismatched shapes";
  list.responses.push_back(r);
  list.responses.push_back(Response());
  return list;
}

TEST(WireFormat, RequestListRoundTrips) {
  RequestList in = SampleRequests(), out;
  ASSERT_TRUE(ParseRequestList(SerializeRequestList(in), &out).ok());
  EXPECT_EQ(out.rank, 3);
  EXPECT_TRUE(out.shutdown);
  ASSERT_EQ(out.requests.size(), 2u);
  const Request& a = out.requests[0];
  EXPECT_EQ(a.op, OpType::kAlltoall);
  EXPECT_EQ(a.dtype, DataType::kBfloat16);
  EXPECT_EQ(a.name, "layer/kernel:0");
  EXPECT_EQ(a.shape, (Shape{4, 5, 6}));
  EXPECT_EQ(a.device, 2);
  EXPECT_EQ(a.root_rank, 1);
  EXPECT_EQ(a.reduce_op, ReduceOp::kMax);
  EXPECT_EQ(a.prescale, 0.5);
  EXPECT_EQ(a.postscale, 3.25);
  EXPECT_EQ(a.splits, (std::vector<int32_t>{1, 2, 1}));
  EXPECT_EQ(a.group_size, 2);
  EXPECT_EQ(a.group, "grp");
}

TEST(WireFormat, ResponseListRoundTrips) {
  ResponseList in = SampleResponses(), out;
  ASSERT_TRUE(ParseResponseList(SerializeResponseList(in), &out).ok());
  EXPECT_TRUE(out.shutdown);
  EXPECT_EQ(out.shutdown_reason, "stalled");
  ASSERT_EQ(out.responses.size(), 2u);
  const Response& r = out.responses[0];
  EXPECT_EQ(r.op, OpType::kAllgather);
  EXPECT_EQ(r.first_dims, (std::vector<int64_t>{1, 0, 6}));
  EXPECT_EQ(r.splits.size(), 9u);
  EXPECT_EQ(r.last_joined_rank, 2);
  EXPECT_EQ(r.error_code, StatusCode::kPreconditionError);
  EXPECT_EQ(r.error_message, "Mismatched shapes");
}

TEST(WireFormat, EveryTruncationIsRejected) {
  const std::string req = SerializeRequestList(SampleRequests());
  const std::string resp = SerializeResponseList(SampleResponses());
  for (size_t n = 0; n < req.size(); ++n) {
    RequestList out;
    EXPECT_FALSE(ParseRequestList(req.substr(0, n), &out).ok()) << n;
  }
  for (size_t n = 0; n < resp.size(); ++n) {
    ResponseList out;
    EXPECT_FALSE(ParseResponseList(resp.substr(0, n), &out).ok()) << n;
  }
}

TEST(WireFormat, WrongKindVersionAndTrailingBytesAreRejected) {
  RequestList rq;
  ResponseList rs;
  EXPECT_FALSE(ParseRequestList(SerializeResponseList(SampleResponses()), &rq).ok());
  EXPECT_FALSE(ParseResponseList(SerializeRequestList(SampleRequests()), &rs).ok());
  std::string bytes = SerializeRequestList(SampleRequests());
  std::string bad_version = bytes;
  bad_version[4] = 9;
  Status s = ParseRequestList(bad_version, &rq);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("version"), std::string::npos);
  EXPECT_FALSE(ParseRequestList(bytes + "x", &rq).ok());
}

TEST(WireFormat, RandomCorruptionNeverCrashes) {
  std::mt19937 rng(42);
  const std::string base[2] = {SerializeRequestList(SampleRequests()),
                               SerializeResponseList(SampleResponses())};
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bytes = base[iter % 2];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    RequestList rq;
    ResponseList rs;
    // Whatever it says, it must not crash or allocate absurdly; a flip inside a float or a name
    // can still be a valid message.
    accepted += ParseRequestList(bytes, &rq).ok();
    accepted += ParseResponseList(bytes, &rs).ok();
  }
  for (int iter = 0; iter < 5000; ++iter) {
    std::string bytes(rng() % 64, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    RequestList rq;
    EXPECT_FALSE(ParseRequestList(bytes, &rq).ok());  // the magic alone makes this near-certain
  }
  EXPECT_LT(accepted, 20000);
}

}  // namespace
}  // namespace hvdc
