// The layout of one shared-memory segment (one per process set on one host; docs/shm.md):
//
//   SegmentHeader | RankLine x n | for each rank q: half 0, half 1
//   half = OpDesc area (desc_bytes) + data (slot_bytes)
//
// Every rank writes only its own RankLine and its own halves; it reads its peers'. Words shared
// across processes are plain integers accessed with __atomic builtins (address-free, lock-free).
#pragma once

#include <cstddef>
#include <cstdint>

namespace hvdc {
namespace shm {

constexpr char kMagic[8] = {'H', 'V', 'D', 'C', 'S', 'H', 'M', '1'};
constexpr uint32_t kVersion = 1;
constexpr int64_t kLine = 128;  // two cache lines: no false sharing with the adjacent prefetcher

struct alignas(kLine) SegmentHeader {
  char magic[8];
  uint32_t version;
  uint32_t nranks;
  uint64_t job_id;  // random, chosen by the creator and passed to peers out of band
  uint64_t total_bytes;
  uint64_t desc_bytes;  // per half
  uint64_t slot_bytes;  // data bytes per half
  uint32_t creator_uid;
  int32_t aborted;  // 0, or 1 + the set rank whose loss ended the plane (__atomic)
};
static_assert(sizeof(SegmentHeader) == kLine, "header is one line");

// One rank's published state, alone in its line.
struct alignas(kLine) RankLine {
  uint32_t counter;   // phases completed (wrapping); the futex word peers sleep on
  uint32_t sleepers;  // peers asleep (or about to be) on counter: wake them only if non-zero
  int32_t pid;        // the process holding this rank, for liveness checks
};
static_assert(sizeof(RankLine) == kLine, "rank line is one line");

// The first call's description, checked by every rank against every other before any data moves.
// Followed in the same area by two int64 vectors of n entries (per-rank sizes of the call).
struct OpDesc {
  int32_t kind;     // HostComm::Collective
  int32_t refused;  // 1: this rank's arguments failed HostComm's check
  int32_t dtype;
  int32_t op;
  int64_t count;  // elements or bytes, by kind
  int64_t root;
};

inline int64_t DescBytes(int nranks) {
  const int64_t raw = static_cast<int64_t>(sizeof(OpDesc)) + 16 * static_cast<int64_t>(nranks);
  return (raw + kLine - 1) / kLine * kLine;
}

// Data bytes per half for a segment of `total` bytes, or 0 when it cannot hold a useful slot.
inline int64_t SlotBytes(int64_t total, int nranks) {
  const int64_t control = kLine + kLine * nranks;
  const int64_t per_half =
      (total - control) / (2 * static_cast<int64_t>(nranks)) - DescBytes(nranks);
  const int64_t slot = per_half / 64 * 64;
  return slot >= 64 * nranks && slot >= 1024 ? slot : 0;
}

}  // namespace shm
}  // namespace hvdc
