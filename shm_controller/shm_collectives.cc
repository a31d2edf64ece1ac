// ShmHostComm's data-moving collectives, each a series of rounds (shm_host_comm.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/kernels.h"
#include "shm_controller/shm_host_comm.h"

namespace hvdc {
namespace shm {
namespace {

void Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

bool Overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a_bytes <= 0 || b_bytes <= 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + static_cast<uintptr_t>(b_bytes) && pb < pa + static_cast<uintptr_t>(a_bytes);
}

std::vector<int64_t> Prefix(const std::vector<int64_t>& v) {
  std::vector<int64_t> p(v.size() + 1, 0);
  for (size_t i = 0; i < v.size(); ++i) p[i + 1] = p[i] + v[i];
  return p;
}

// The part of a block of `total` bytes that round i carries, `per` bytes a round.
int64_t Piece(int64_t total, int64_t i, int64_t per) {
  return std::max<int64_t>(0, std::min(per, total - i * per));
}

int64_t Rounds(int64_t total, int64_t per) { return total <= 0 ? 1 : (total + per - 1) / per; }

// Calls part(piece, offset in the piece, offset from lo, count) for the parts of the pieces that
// cover elements [lo, hi) of their concatenation, in order; starts[j] is piece j's first element
// and starts.back() the total.
template <typename Part>
void ForEachPart(const std::vector<ReducePiece>& pieces, const std::vector<int64_t>& starts,
                 int64_t lo, int64_t hi, Part part) {
  if (hi <= lo) return;
  size_t j =
      static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin() - 1);
  for (; j < pieces.size() && starts[j] < hi; ++j) {
    const int64_t a = std::max(lo, starts[j]), b = std::min(hi, starts[j + 1]);
    if (b > a) part(pieces[j], a - starts[j], a - lo, b - a);
  }
}

}  // namespace

Status ShmHostComm::DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                ReduceOp op) {
  return DoAllreducePieces({ReducePiece{send, recv, count}}, dtype, op, 1.0, 1.0);
}

Status ShmHostComm::DoAllreducePieces(const std::vector<ReducePiece>& pieces, DataType dtype,
                                      ReduceOp op, double prescale, double postscale) {
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<int64_t> starts(pieces.size() + 1, 0);
  for (size_t j = 0; j < pieces.size(); ++j) starts[j + 1] = starts[j] + pieces[j].count;
  const int64_t count = starts.back();
  // Elements [lo, hi) of this rank's input, prescaled, into dst (zeros for a piece without input).
  auto copy_in = [&](uint8_t* dst, int64_t lo, int64_t hi) {
    ForEachPart(pieces, starts, lo, hi,
                [&](const ReducePiece& p, int64_t at, int64_t to, int64_t n) {
                  if (p.in == nullptr) {
                    std::memset(dst + to * es, 0, static_cast<size_t>(n * es));
                  } else {
                    cpu::ScaleCopy(dst + to * es, static_cast<const uint8_t*>(p.in) + at * es, n,
                                   dtype, prescale);
                  }
                });
  };
  // The result's elements [lo, hi), from src, postscaled into the pieces' outputs.
  auto copy_out = [&](const uint8_t* src, int64_t lo, int64_t hi) {
    ForEachPart(pieces, starts, lo, hi,
                [&](const ReducePiece& p, int64_t at, int64_t from, int64_t n) {
                  if (p.out == nullptr) return;
                  cpu::ScaleCopy(static_cast<uint8_t*>(p.out) + at * es, src + from * es, n, dtype,
                                 postscale);
                });
  };
  if (size_ == 1) {
    ForEachPart(
        pieces, starts, 0, count, [&](const ReducePiece& p, int64_t at, int64_t, int64_t n) {
          if (p.out == nullptr) return;
          uint8_t* out = static_cast<uint8_t*>(p.out) + at * es;
          if (p.in == nullptr) {
            std::memset(out, 0, static_cast<size_t>(n * es));
          } else {
            cpu::ScaleCopy(out, static_cast<const uint8_t*>(p.in) + at * es, n, dtype, prescale);
          }
          cpu::ScaleCopy(out, out, n, dtype, postscale);
        });
    return Status::OK();
  }
  const int64_t per = slot_bytes_ / es;
  const int64_t rounds = Rounds(count, per);
  for (int64_t i = 0; i < rounds; ++i) {
    HVDC_RETURN_IF_ERROR(BeginRound());
    const int64_t off = i * per, m = Piece(count, i, per);
    if (i == 0) {
      OpDesc* d = Desc(rank_);
      d->kind = static_cast<int32_t>(Collective::kAllreduce);
      d->dtype = static_cast<int32_t>(dtype);
      d->op = static_cast<int32_t>(op);
      d->count = count;
    }
    // The only copy in, straight from the pieces. In place is safe: an output's chunk is written
    // only after every rank has copied its own chunk in, and later rounds read later elements
    // only (the pieces overlap nowhere else).
    copy_in(Data(rank_), off, off + m);
    PublishPhase(1);
    HVDC_RETURN_IF_ERROR(WaitAll(1));
    if (i == 0) {
      Status s = CheckDescs(Collective::kAllreduce, 0);
      if (!s.ok()) {
        PublishPhase(2);
        EndRound();
        return s;
      }
    }
    // This rank's slice, reduced once over every rank's chunk: the same bits for everyone.
    const int64_t lo = m * rank_ / size_, hi = m * (rank_ + 1) / size_;
    if (hi > lo) {
      for (int q = 0; q < size_; ++q) {
        if (q != rank_)
          cpu::ReduceInto(Data(rank_) + lo * es, Data(q) + lo * es, hi - lo, dtype, op);
      }
    }
    PublishPhase(2);
    HVDC_RETURN_IF_ERROR(WaitAll(2));
    // The only copy out, straight into the outputs, postscaled on the way.
    for (int b = 0; b < size_; ++b) {
      const int64_t b_lo = m * b / size_, b_hi = m * (b + 1) / size_;
      copy_out(Data(b) + b_lo * es, off + b_lo, off + b_hi);
    }
    EndRound();
  }
  return Status::OK();
}

Status ShmHostComm::DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                                 const std::vector<int64_t>& recv_bytes) {
  if (size_ == 1) {
    if (send_bytes > 0 && send != recv) std::memmove(recv, send, static_cast<size_t>(send_bytes));
    return Status::OK();
  }
  const std::vector<int64_t> prefix = Prefix(recv_bytes);
  auto* out = static_cast<uint8_t*>(recv);
  const auto* in = static_cast<const uint8_t*>(send);
  const bool in_place = in == out + prefix[rank_];
  std::vector<uint8_t> aside;  // our recv must not overwrite send bytes later rounds still need
  if (!in_place && Overlap(in, send_bytes, out, prefix[size_])) {
    aside.assign(in, in + send_bytes);
    in = aside.data();
  }
  const int64_t rounds =
      Rounds(*std::max_element(recv_bytes.begin(), recv_bytes.end()), slot_bytes_);
  for (int64_t i = 0; i < rounds; ++i) {
    HVDC_RETURN_IF_ERROR(BeginRound());
    if (i == 0) {
      Desc(rank_)->kind = static_cast<int32_t>(Collective::kAllgatherv);
      std::copy(recv_bytes.begin(), recv_bytes.end(), DescVector(rank_, 0));
    }
    Copy(Data(rank_), in + i * slot_bytes_, Piece(send_bytes, i, slot_bytes_));
    PublishPhase(2);
    HVDC_RETURN_IF_ERROR(WaitAll(1));
    if (i == 0) {
      Status s = CheckDescs(Collective::kAllgatherv, 1);
      if (!s.ok()) {
        EndRound();
        return s;
      }
    }
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ && in_place) continue;
      Copy(out + prefix[q] + i * slot_bytes_, Data(q), Piece(recv_bytes[q], i, slot_bytes_));
    }
    EndRound();
  }
  return Status::OK();
}

Status ShmHostComm::DoBroadcast(void* buf, int64_t bytes, int root) {
  if (size_ == 1) return Status::OK();
  auto* p = static_cast<uint8_t*>(buf);
  const int64_t rounds = Rounds(bytes, slot_bytes_);
  for (int64_t i = 0; i < rounds; ++i) {
    HVDC_RETURN_IF_ERROR(BeginRound());
    if (i == 0) {
      Desc(rank_)->kind = static_cast<int32_t>(Collective::kBroadcast);
      Desc(rank_)->count = bytes;
      Desc(rank_)->root = root;
    }
    const int64_t piece = Piece(bytes, i, slot_bytes_);
    if (rank_ == root) Copy(Data(rank_), p + i * slot_bytes_, piece);
    PublishPhase(2);
    HVDC_RETURN_IF_ERROR(WaitAll(1));
    if (i == 0) {
      Status s = CheckDescs(Collective::kBroadcast, 0);
      if (!s.ok()) {
        EndRound();
        return s;
      }
    }
    if (rank_ != root) Copy(p + i * slot_bytes_, Data(root), piece);
    EndRound();
  }
  return Status::OK();
}

Status ShmHostComm::DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                void* recv, const std::vector<int64_t>& recv_bytes) {
  const std::vector<int64_t> sprefix = Prefix(send_bytes), rprefix = Prefix(recv_bytes);
  if (size_ == 1) {
    if (send_bytes[0] > 0 && send != recv) {
      std::memmove(recv, send, static_cast<size_t>(send_bytes[0]));
    }
    return Status::OK();
  }
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  std::vector<uint8_t> aside;
  if (Overlap(in, sprefix[size_], out, rprefix[size_])) {
    aside.assign(in, in + sprefix[size_]);
    in = aside.data();
  }
  // Each round a rank's slot holds one sub-slot per destination.
  const int64_t sub = slot_bytes_ / size_ / 64 * 64;
  int64_t rounds = 1;  // known once every rank's sizes have been seen
  for (int64_t i = 0; i < rounds; ++i) {
    HVDC_RETURN_IF_ERROR(BeginRound());
    if (i == 0) {
      Desc(rank_)->kind = static_cast<int32_t>(Collective::kAlltoallv);
      std::copy(send_bytes.begin(), send_bytes.end(), DescVector(rank_, 0));
      std::copy(recv_bytes.begin(), recv_bytes.end(), DescVector(rank_, 1));
    }
    for (int j = 0; j < size_; ++j) {
      Copy(Data(rank_) + j * sub, in + sprefix[j] + i * sub, Piece(send_bytes[j], i, sub));
    }
    PublishPhase(2);
    HVDC_RETURN_IF_ERROR(WaitAll(1));
    if (i == 0) {
      Status s = CheckDescs(Collective::kAlltoallv, 0);
      int64_t largest = 0;
      for (int a = 0; a < size_ && s.ok(); ++a) {
        for (int b = 0; b < size_ && s.ok(); ++b) {
          const int64_t sent = DescVector(a, 0)[b], expected = DescVector(b, 1)[a];
          largest = std::max(largest, sent);
          if (sent != expected) {
            s = Status::PreconditionError(
                fmt::format("Alltoallv: rank {} sends {} bytes to rank {}, which expects {}",
                            world_ranks_[a], sent, world_ranks_[b], expected));
          }
        }
      }
      if (!s.ok()) {
        EndRound();
        return s;
      }
      rounds = Rounds(largest, sub);
    }
    for (int q = 0; q < size_; ++q) {
      Copy(out + rprefix[q] + i * sub, Data(q) + rank_ * sub, Piece(recv_bytes[q], i, sub));
    }
    EndRound();
  }
  return Status::OK();
}

Status ShmHostComm::DoReduceScatter(const void* send, void* recv,
                                    const std::vector<int64_t>& recv_counts, DataType dtype,
                                    ReduceOp op) {
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  if (size_ == 1) {
    if (recv_counts[0] > 0 && send != recv) {
      std::memmove(recv, send, static_cast<size_t>(recv_counts[0] * es));
    }
    return Status::OK();
  }
  const std::vector<int64_t> prefix = Prefix(recv_counts);
  const int64_t total = prefix[size_], mine = recv_counts[rank_], begin = prefix[rank_];
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  std::vector<uint8_t> aside;  // recv overlapping send: later rounds still read send
  if (Overlap(in, total * es, out, mine * es)) {
    aside.resize(static_cast<size_t>(mine * es));
    out = aside.data();
  }
  const int64_t per = slot_bytes_ / es;
  const int64_t rounds = Rounds(total, per);
  for (int64_t i = 0; i < rounds; ++i) {
    HVDC_RETURN_IF_ERROR(BeginRound());
    const int64_t off = i * per, m = Piece(total, i, per);
    if (i == 0) {
      OpDesc* d = Desc(rank_);
      d->kind = static_cast<int32_t>(Collective::kReduceScatter);
      d->dtype = static_cast<int32_t>(dtype);
      d->op = static_cast<int32_t>(op);
      std::copy(recv_counts.begin(), recv_counts.end(), DescVector(rank_, 0));
    }
    Copy(Data(rank_), in + off * es, m * es);
    PublishPhase(1);
    HVDC_RETURN_IF_ERROR(WaitAll(1));
    if (i == 0) {
      Status s = CheckDescs(Collective::kReduceScatter, 1);
      if (!s.ok()) {
        PublishPhase(2);
        EndRound();
        return s;
      }
    }
    // The part of this rank's block in the chunk, reduced over the ranks in rank order.
    const int64_t a = std::max(off, begin), b = std::min(off + m, begin + mine);
    if (b > a) {
      uint8_t* dst = out + (a - begin) * es;
      Copy(dst, Data(0) + (a - off) * es, (b - a) * es);
      for (int q = 1; q < size_; ++q) {
        cpu::ReduceInto(dst, Data(q) + (a - off) * es, b - a, dtype, op);
      }
    }
    PublishPhase(2);
    EndRound();
  }
  if (out != recv) Copy(recv, out, mine * es);
  return Status::OK();
}

}  // namespace shm
}  // namespace hvdc
