#include "tests/cpp/conformance/host_comm_checks.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tests/cpp/conformance/values.h"

namespace hvdc {
namespace conformance {
namespace {

std::string Where(const char* what, int64_t n, bool in_place) {
  return std::string(what) + " n=" + std::to_string(n) + (in_place ? " in place" : "");
}

int64_t Sum(const std::vector<int64_t>& v, size_t end) {
  int64_t s = 0;
  for (size_t i = 0; i < end && i < v.size(); ++i) s += v[i];
  return s;
}

}  // namespace

void CheckAllreduce(HostComm& comm, const std::vector<int>& members, DataType dtype, ReduceOp op,
                    int64_t count, bool in_place) {
  const int me = members[comm.rank()];
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  std::vector<uint8_t> in = Inputs(dtype, op, me, count);
  std::vector<uint8_t> out(bytes + 1, 0xee);
  uint8_t* recv = in_place ? in.data() : out.data();
  const Status s = comm.Allreduce(in.data(), recv, count, dtype, op);
  const std::string where = Where("Allreduce", count, in_place);
  EXPECT_TRUE(s.ok()) << where << ": " << s.ToString();
  CheckReduced(dtype, op, members, recv, count, 0, where);
  EXPECT_EQ(recv[bytes], 0xee) << where << ": wrote past the end";
  if (!in_place) {
    EXPECT_EQ(in, Inputs(dtype, op, me, count)) << where << ": the input changed";
  }
}

void CheckAllgatherv(HostComm& comm, const std::vector<int>& members,
                     const std::vector<int64_t>& bytes, bool in_place) {
  const int r = comm.rank(), n = comm.size();
  const int64_t total = Sum(bytes, bytes.size()), mine = Sum(bytes, r);
  std::vector<uint8_t> send(static_cast<size_t>(bytes[r]));
  for (int64_t i = 0; i < bytes[r]; ++i) send[i] = Byte(members[r], 0, i);
  std::vector<uint8_t> recv(static_cast<size_t>(total) + 1, 0xee);
  const void* src = send.data();
  if (in_place) {
    if (!send.empty()) std::memcpy(recv.data() + mine, send.data(), send.size());
    src = recv.data() + mine;
  }
  const std::string where = Where("Allgatherv", total, in_place);
  const Status s = comm.Allgatherv(src, bytes[r], recv.data(), bytes);
  EXPECT_TRUE(s.ok()) << where << ": " << s.ToString();
  int64_t off = 0;
  for (int q = 0; q < n; ++q) {
    const int64_t bad = FirstBadByte(recv.data() + off, bytes[q], members[q], 0);
    if (bad >= 0) {
      ADD_FAILURE() << where << ": byte " << bad << " from rank " << q;
      break;
    }
    off += bytes[q];
  }
  EXPECT_EQ(recv.back(), 0xee) << where << ": wrote past the end";
}

void CheckBroadcast(HostComm& comm, const std::vector<int>& members, int root, int64_t bytes) {
  const int r = comm.rank();
  std::vector<uint8_t> buf(static_cast<size_t>(bytes) + 1, 0xee);
  for (int64_t i = 0; i < bytes; ++i) buf[i] = r == root ? Byte(members[root], 1, i) : 0x5a;
  const std::string where = "Broadcast from " + std::to_string(root) + Where("", bytes, false);
  const Status s = comm.Broadcast(buf.data(), bytes, root);
  EXPECT_TRUE(s.ok()) << where << ": " << s.ToString();
  const int64_t bad = FirstBadByte(buf.data(), bytes, members[root], 1);
  EXPECT_EQ(bad, -1) << where << ": first wrong byte";
  EXPECT_EQ(buf.back(), 0xee) << where << ": wrote past the end";
}

void CheckAlltoallv(HostComm& comm, const std::vector<int>& members,
                    const std::function<int64_t(int a, int b)>& split) {
  const int r = comm.rank(), n = comm.size();
  std::vector<int64_t> send_bytes(n), recv_bytes(n);
  std::vector<uint8_t> send;
  for (int q = 0; q < n; ++q) {
    send_bytes[q] = split(r, q);
    recv_bytes[q] = split(q, r);
    for (int64_t i = 0; i < send_bytes[q]; ++i) send.push_back(Byte(members[r], members[q], i));
  }
  const int64_t total = Sum(recv_bytes, n);
  std::vector<uint8_t> recv(static_cast<size_t>(total) + 1, 0xee);
  const std::string where = Where("Alltoallv", total, false);
  const Status s = comm.Alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  EXPECT_TRUE(s.ok()) << where << ": " << s.ToString();
  int64_t off = 0;
  for (int q = 0; q < n; ++q) {
    const int64_t bad = FirstBadByte(recv.data() + off, recv_bytes[q], members[q], members[r]);
    if (bad >= 0) {
      ADD_FAILURE() << where << ": byte " << bad << " from rank " << q;
      break;
    }
    off += recv_bytes[q];
  }
  EXPECT_EQ(recv.back(), 0xee) << where << ": wrote past the end";
}

void CheckReduceScatter(HostComm& comm, const std::vector<int>& members, DataType dtype,
                        ReduceOp op, const std::vector<int64_t>& counts, bool in_place) {
  const int r = comm.rank();
  const int64_t total = Sum(counts, counts.size()), mine = Sum(counts, r);
  const size_t es = DataTypeSize(dtype);
  std::vector<uint8_t> in = Inputs(dtype, op, members[r], total);
  std::vector<uint8_t> out(static_cast<size_t>(counts[r]) * es + 1, 0xee);
  uint8_t* recv = in_place ? in.data() : out.data();
  const std::string where =
      Where("ReduceScatter", total, in_place) + " own block " + std::to_string(counts[r]);
  const Status s = comm.ReduceScatter(in.data(), recv, counts, dtype, op);
  EXPECT_TRUE(s.ok()) << where << ": " << s.ToString();
  CheckReduced(dtype, op, members, recv, counts[r], mine, where);
  if (!in_place) {
    EXPECT_EQ(out.back(), 0xee) << where << ": wrote past the end";
  }
}

}  // namespace conformance
}  // namespace hvdc
