// TcpHostComm's collectives that move bytes without reducing them (see tcp_host_comm.h).
#include "tcp_controller/tcp_host_comm.h"

#include <cstring>

namespace hvdc {
namespace tcp {
namespace {

std::vector<int64_t> Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> off(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) off[i + 1] = off[i] + sizes[i];
  return off;
}

bool Overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a_bytes <= 0 || b_bytes <= 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + static_cast<uintptr_t>(b_bytes) && pb < pa + static_cast<uintptr_t>(a_bytes);
}

}  // namespace

Status TcpHostComm::DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                                 const std::vector<int64_t>& recv_bytes) {
  const int n = size(), r = rank();
  const std::vector<int64_t> off = Offsets(recv_bytes);
  auto* out = static_cast<uint8_t*>(recv);
  if (send_bytes > 0 && send != out + off[r]) std::memmove(out + off[r], send, send_bytes);
  for (int k = 1; k < n; ++k) {
    HVDC_RETURN_IF_ERROR(group_.Send((r + k) % n, out + off[r], static_cast<size_t>(send_bytes)));
  }
  for (int k = 1; k < n; ++k) {
    const int from = (r + n - k) % n;
    HVDC_RETURN_IF_ERROR(group_.Recv(from, out + off[from], static_cast<size_t>(recv_bytes[from])));
  }
  return Status::OK();
}

Status TcpHostComm::DoBroadcast(void* buf, int64_t bytes, int root) {
  const int n = size(), r = rank();
  if (n == 1 || bytes == 0) return Status::OK();
  auto* p = static_cast<uint8_t*>(buf);
  if (bytes <= kSmallBytes || n == 2) {
    if (r != root) return group_.Recv(root, p, static_cast<size_t>(bytes));
    for (int k = 1; k < n; ++k) {
      HVDC_RETURN_IF_ERROR(group_.Send((root + k) % n, p, static_cast<size_t>(bytes)));
    }
    return Status::OK();
  }
  // A chain from the root, segment by segment: each rank forwards a segment as soon as it has it.
  const int v = (r - root + n) % n;
  const int prev = (r + n - 1) % n, next = (r + 1) % n;
  for (int64_t lo = 0; lo < bytes; lo += segment_bytes_) {
    const size_t len = static_cast<size_t>(std::min(segment_bytes_, bytes - lo));
    if (v > 0) HVDC_RETURN_IF_ERROR(group_.Recv(prev, p + lo, len));
    if (v < n - 1) HVDC_RETURN_IF_ERROR(group_.Send(next, p + lo, len));
  }
  return Status::OK();
}

Status TcpHostComm::DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                void* recv, const std::vector<int64_t>& recv_bytes) {
  const int n = size(), r = rank();
  const std::vector<int64_t> soff = Offsets(send_bytes), roff = Offsets(recv_bytes);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  std::vector<uint8_t> aside;
  if (Overlap(in, soff[n], out, roff[n])) {
    aside.assign(in, in + soff[n]);
    in = aside.data();
  }
  if (send_bytes[r] > 0) std::memcpy(out + roff[r], in + soff[r], send_bytes[r]);
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    HVDC_RETURN_IF_ERROR(group_.Send(to, in + soff[to], static_cast<size_t>(send_bytes[to])));
  }
  for (int k = 1; k < n; ++k) {
    const int from = (r + n - k) % n;
    HVDC_RETURN_IF_ERROR(
        group_.Recv(from, out + roff[from], static_cast<size_t>(recv_bytes[from])));
  }
  return Status::OK();
}

Status TcpHostComm::DoBarrier() {
  const int n = size(), r = rank();
  for (int k = 1; k < n; k <<= 1) {
    HVDC_RETURN_IF_ERROR(group_.Send((r + k) % n, nullptr, 0));
    HVDC_RETURN_IF_ERROR(group_.Recv((r + n - k) % n, nullptr, 0));
  }
  return Status::OK();
}

}  // namespace tcp
}  // namespace hvdc
