#include "shm_controller/hierarchical_host_comm.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/logging.h"

namespace hvdc {
namespace shm {
namespace {

// [lo, hi) of the j-th of n even shares of `total`.
int64_t ShareBegin(int64_t total, int j, int n) { return total * j / n; }
int64_t Share(int64_t total, int j, int n) {
  return ShareBegin(total, j + 1, n) - ShareBegin(total, j, n);
}

// The scratch buffer, sized for `bytes` and never null (an empty share still passes a pointer).
uint8_t* Scratch(std::vector<uint8_t>* v, int64_t bytes) {
  v->resize(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  return v->data();
}

void Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

std::vector<int> WorldRanksOf(const std::vector<int>& set_ranks,
                              const std::vector<int>& world_ranks) {
  std::vector<int> out;
  for (int r : set_ranks) out.push_back(world_ranks[static_cast<size_t>(r)]);
  return out;
}

}  // namespace

HierarchicalHostComm::HierarchicalHostComm(Parts parts, HostLayout layout, int rank, bool allreduce,
                                           bool allgather)
    : parts_(std::move(parts)),
      layout_(std::move(layout)),
      rank_(rank),
      size_(parts_.flat->size()),
      allreduce_(allreduce),
      allgather_(allgather) {
  layout_.Locate(rank_, &host_, &lrank_);
  lsize_ = layout_.local_size();
  for (int j = 0; j < lsize_; ++j) cross_hosts_.push_back(layout_.CrossHosts(j));
}

Status HierarchicalHostComm::DoAllreduce(const void* send, void* recv, int64_t count,
                                         DataType dtype, ReduceOp op) {
  if (!allreduce_ || count == 0) return parts_.flat->Allreduce(send, recv, count, dtype, op);
  if (op == ReduceOp::kAverage) op = ReduceOp::kSum;  // the caller's postscale divides
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<int64_t> counts(static_cast<size_t>(lsize_)), bytes(counts.size());
  for (int j = 0; j < lsize_; ++j) {
    counts[static_cast<size_t>(j)] = Share(count, j, lsize_);
    bytes[static_cast<size_t>(j)] = counts[static_cast<size_t>(j)] * es;
  }
  const int64_t mine = counts[static_cast<size_t>(lrank_)];
  uint8_t* block = Scratch(&block_, mine * es);
  // The host's sum of block lrank_ (reduced in local-rank order), then the same over the hosts.
  HVDC_RETURN_IF_ERROR(parts_.local->ReduceScatter(send, block, counts, dtype, op));
  HVDC_RETURN_IF_ERROR(parts_.cross->Allreduce(block, block, mine, dtype, op));
  // send is no longer read by anyone: recv may be send (in place).
  return parts_.local->Allgatherv(block, mine * es, recv, bytes);
}

Status HierarchicalHostComm::DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                                          const std::vector<int64_t>& recv_bytes) {
  if (!allgather_) return parts_.flat->Allgatherv(send, send_bytes, recv, recv_bytes);
  const int hosts = layout_.host_count();
  auto bytes_of = [&](int r) { return recv_bytes[static_cast<size_t>(r)]; };
  // Each host's block: its members' bytes in set-rank order.
  std::vector<int64_t> host_bytes(static_cast<size_t>(hosts), 0);
  for (int h = 0; h < hosts; ++h) {
    for (int r : layout_.hosts[static_cast<size_t>(h)])
      host_bytes[static_cast<size_t>(h)] += bytes_of(r);
  }
  auto slice = [&](int h, int j) { return Share(host_bytes[static_cast<size_t>(h)], j, lsize_); };
  auto slice_begin = [&](int h, int j) {
    return ShareBegin(host_bytes[static_cast<size_t>(h)], j, lsize_);
  };

  // 1. This host's block, on every local rank.
  std::vector<int64_t> local_bytes;
  for (int r : layout_.hosts[static_cast<size_t>(host_)]) local_bytes.push_back(bytes_of(r));
  uint8_t* block = Scratch(&block_, host_bytes[static_cast<size_t>(host_)]);
  HVDC_RETURN_IF_ERROR(parts_.local->Allgatherv(send, send_bytes, block, local_bytes));

  // 2. Slice lrank_ of every host's block, over the cross group (in its rank order).
  const std::vector<int>& order = cross_hosts_[static_cast<size_t>(lrank_)];
  std::vector<int64_t> cross_bytes;
  int64_t cross_total = 0;
  for (int h : order) {
    cross_bytes.push_back(slice(h, lrank_));
    cross_total += cross_bytes.back();
  }
  uint8_t* staged = Scratch(&staged_, cross_total);
  HVDC_RETURN_IF_ERROR(parts_.cross->Allgatherv(block + slice_begin(host_, lrank_),
                                                slice(host_, lrank_), staged, cross_bytes));

  // 3. Every local rank's cross result, on every local rank.
  std::vector<int64_t> staged_bytes(static_cast<size_t>(lsize_), 0);
  for (int j = 0; j < lsize_; ++j) {
    for (int h = 0; h < hosts; ++h) staged_bytes[static_cast<size_t>(j)] += slice(h, j);
  }
  int64_t total = 0;
  for (int64_t b : staged_bytes) total += b;
  uint8_t* gathered = Scratch(&gathered_, total);
  HVDC_RETURN_IF_ERROR(parts_.local->Allgatherv(staged, cross_total, gathered, staged_bytes));

  // Into set-rank order: each slice (j, h) holds bytes [slice_begin, +slice) of host h's block,
  // which lays out host h's members one after another.
  std::vector<int64_t> prefix(static_cast<size_t>(size_) + 1, 0);
  for (int r = 0; r < size_; ++r) prefix[static_cast<size_t>(r) + 1] = prefix[r] + bytes_of(r);
  auto* out = static_cast<uint8_t*>(recv);
  int64_t at = 0;  // offset of slice (j, h) in gathered_
  for (int j = 0; j < lsize_; ++j) {
    for (int h : cross_hosts_[static_cast<size_t>(j)]) {
      const int64_t lo = slice_begin(h, j), hi = lo + slice(h, j);
      int64_t member_lo = 0;
      for (int r : layout_.hosts[static_cast<size_t>(h)]) {
        const int64_t member_hi = member_lo + bytes_of(r);
        const int64_t a = std::max(lo, member_lo), b = std::min(hi, member_hi);
        if (b > a) {
          Copy(out + prefix[static_cast<size_t>(r)] + (a - member_lo), gathered + at + (a - lo),
               b - a);
        }
        member_lo = member_hi;
      }
      at += hi - lo;
    }
  }
  return Status::OK();
}

Status HierarchicalHostComm::DoBroadcast(void* buf, int64_t bytes, int root) {
  return parts_.flat->Broadcast(buf, bytes, root);
}

Status HierarchicalHostComm::DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                         void* recv, const std::vector<int64_t>& recv_bytes) {
  return parts_.flat->Alltoallv(send, send_bytes, recv, recv_bytes);
}

Status HierarchicalHostComm::DoReduceScatter(const void* send, void* recv,
                                             const std::vector<int64_t>& recv_counts,
                                             DataType dtype, ReduceOp op) {
  return parts_.flat->ReduceScatter(send, recv, recv_counts, dtype, op);
}

Status HierarchicalHostComm::DoBarrier() { return parts_.flat->Barrier(); }

Status CreateHierarchicalHostComm(Transport& inner, const std::vector<int>& world_ranks,
                                  const HostLayout& layout, const ShmOptions& options,
                                  std::unique_ptr<HostComm> flat, std::unique_ptr<HostComm>* out) {
  out->reset();
  const int me_world = inner.topology().rank;
  HierarchicalHostComm::Parts parts;
  // Every world rank makes every host group, then every cross group, in this order: the
  // transport's set creation is collective over the world.
  std::vector<int> host_world;  // this rank's host group, as world ranks
  for (const auto& host : layout.hosts) {
    ProcessSetChannels group;
    const std::vector<int> ranks = WorldRanksOf(host, world_ranks);
    HVDC_RETURN_IF_ERROR(inner.CreateProcessSet(ranks, &group));
    if (group.data) {
      host_world = ranks;
      parts.local = std::move(group.data);
    }
    parts.keep.push_back(std::move(group));
  }
  for (int j = 0; j < layout.local_size(); ++j) {
    ProcessSetChannels group;
    HVDC_RETURN_IF_ERROR(
        inner.CreateProcessSet(WorldRanksOf(layout.CrossGroup(j), world_ranks), &group));
    if (group.data) parts.cross = std::move(group.data);
    parts.keep.push_back(std::move(group));
  }
  if (!flat) return Status::OK();
  if (!parts.local || !parts.cross) {
    return Status::UnknownError("hierarchical data plane: no host or cross channels for a member");
  }
  // Collective over this host's members only: the host groups are disjoint.
  std::unique_ptr<HostComm> plane;
  HVDC_RETURN_IF_ERROR(CreateShmHostComm(*parts.local, host_world, options, &plane));
  const bool shm = plane != nullptr;
  if (plane) parts.local = std::move(plane);
  const int rank = static_cast<int>(std::find(world_ranks.begin(), world_ranks.end(), me_world) -
                                    world_ranks.begin());
  parts.flat = std::move(flat);
  LogDebug(
      "rank {}: hierarchical data plane for a set of {} ranks ({} hosts x {}; allreduce {}, "
      "allgather {}; within the host: {})",
      me_world, world_ranks.size(), layout.host_count(), layout.local_size(),
      options.hierarchical_allreduce ? "on" : "off", options.hierarchical_allgather ? "on" : "off",
      shm ? "shared memory" : "the transport");
  out->reset(new HierarchicalHostComm(std::move(parts), layout, rank,
                                      options.hierarchical_allreduce,
                                      options.hierarchical_allgather));
  return Status::OK();
}

}  // namespace shm
}  // namespace hvdc
