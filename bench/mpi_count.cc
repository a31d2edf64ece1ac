#include "bench/mpi_count.h"

#include <atomic>
#include <cstdio>

namespace bench {
namespace {

std::atomic<uint64_t> g_calls[kMpiFnCount];
std::atomic<uint64_t> g_bytes[kMpiFnCount];
std::atomic<MPI_Comm> g_uncounted{MPI_COMM_NULL};

const char* const kNames[kMpiFnCount] = {
    "Allreduce", "Iallreduce", "Reduce_scatter", "Ireduce_scatter", "Allgather", "Iallgather",
    "Allgatherv", "Iallgatherv", "Bcast", "Ibcast", "Gather", "Gatherv", "Igather", "Igatherv",
    "Reduce", "Ireduce", "Barrier", "Ibarrier", "Alltoall", "Alltoallv", "Ialltoallv",
    "Send", "Isend", "Recv", "Irecv", "Sendrecv",
    "Test", "Testall", "Testany", "Testsome", "Wait", "Waitall", "Iprobe", "Probe"};

inline bool Counted(MPI_Comm comm) { return comm != g_uncounted.load(std::memory_order_relaxed); }

inline void Count(MpiFn fn, MPI_Comm comm, int count, MPI_Datatype type) {
  if (!Counted(comm)) return;
  g_calls[fn].fetch_add(1, std::memory_order_relaxed);
  if (count > 0 && type != MPI_DATATYPE_NULL) {
    int size = 0;
    PMPI_Type_size(type, &size);
    g_bytes[fn].fetch_add(uint64_t(count) * uint64_t(size), std::memory_order_relaxed);
  }
}

inline void CountPoll(MpiFn fn) { g_calls[fn].fetch_add(1, std::memory_order_relaxed); }

bool IsCollective(int fn) { return fn <= kIalltoallv; }
bool IsPoll(int fn) { return fn >= kTest && fn <= kTestsome; }

}  // namespace

MpiCounts MpiCounts::operator-(const MpiCounts& o) const {
  MpiCounts d;
  for (int i = 0; i < kMpiFnCount; ++i) {
    d.calls[i] = calls[i] - o.calls[i];
    d.bytes[i] = bytes[i] - o.bytes[i];
  }
  return d;
}

uint64_t MpiCounts::collectives() const {
  uint64_t n = 0;
  for (int i = 0; i < kMpiFnCount; ++i) {
    if (IsCollective(i)) n += calls[i];
  }
  return n;
}

uint64_t MpiCounts::polls() const {
  uint64_t n = calls[kIprobe];
  for (int i = 0; i < kMpiFnCount; ++i) {
    if (IsPoll(i)) n += calls[i];
  }
  return n;
}

void SetUncountedComm(MPI_Comm comm) { g_uncounted.store(comm); }

MpiCounts SnapshotMpiCounts() {
  MpiCounts c;
  for (int i = 0; i < kMpiFnCount; ++i) {
    c.calls[i] = g_calls[i].load(std::memory_order_relaxed);
    c.bytes[i] = g_bytes[i].load(std::memory_order_relaxed);
  }
  return c;
}

bool MpiCountingActive() {
  MpiCounts c = SnapshotMpiCounts();
  for (int i = 0; i < kMpiFnCount; ++i) {
    if (c.calls[i]) return true;
  }
  return false;
}

const char* MpiFnName(int fn) { return fn >= 0 && fn < kMpiFnCount ? kNames[fn] : "?"; }

Json MpiCountsJson(const MpiCounts& c, double per) {
  Json j = Json::Object();
  for (int i = 0; i < kMpiFnCount; ++i) {
    if (!c.calls[i]) continue;
    Json e = Json::Object();
    e.Set("calls", double(c.calls[i]) / per).Set("bytes", double(c.bytes[i]) / per);
    j.Set(std::string("MPI_") + kNames[i], e);
  }
  return j;
}

std::string MpiCountsSummary(const MpiCounts& c, double per) {
  std::string s;
  for (int i = 0; i < kMpiFnCount; ++i) {
    if (!c.calls[i] || !IsCollective(i)) continue;
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s%.4g %s (%s)", s.empty() ? "" : ", ",
                  double(c.calls[i]) / per, kNames[i], FormatBytes(double(c.bytes[i]) / per).c_str());
    s += buf;
  }
  return s.empty() ? "none seen" : s;
}

}  // namespace bench

#ifndef HVDC_BENCH_NO_PMPI
// ---------------------------------------------------------------- the interposed entry points
// Exported from the executable (default visibility) so that libhvdc_core.so binds to them.

#define HVDC_BENCH_PMPI extern "C" __attribute__((visibility("default")))
using bench::Count;
using bench::CountPoll;

HVDC_BENCH_PMPI int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op,
                                  MPI_Comm c) {
  Count(bench::kAllreduce, c, n, t);
  return PMPI_Allreduce(s, r, n, t, op, c);
}
HVDC_BENCH_PMPI int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op,
                                   MPI_Comm c, MPI_Request* q) {
  Count(bench::kIallreduce, c, n, t);
  return PMPI_Iallreduce(s, r, n, t, op, c, q);
}
HVDC_BENCH_PMPI int MPI_Reduce_scatter_block(const void* s, void* r, int n, MPI_Datatype t,
                                             MPI_Op op, MPI_Comm c) {
  Count(bench::kReduceScatter, c, n, t);
  return PMPI_Reduce_scatter_block(s, r, n, t, op, c);
}
HVDC_BENCH_PMPI int MPI_Reduce_scatter(const void* s, void* r, const int counts[], MPI_Datatype t,
                                       MPI_Op op, MPI_Comm c) {
  Count(bench::kReduceScatter, c, 0, t);
  return PMPI_Reduce_scatter(s, r, counts, t, op, c);
}
HVDC_BENCH_PMPI int MPI_Ireduce_scatter_block(const void* s, void* r, int n, MPI_Datatype t,
                                              MPI_Op op, MPI_Comm c, MPI_Request* q) {
  Count(bench::kIreduceScatter, c, n, t);
  return PMPI_Ireduce_scatter_block(s, r, n, t, op, c, q);
}
HVDC_BENCH_PMPI int MPI_Ireduce_scatter(const void* s, void* r, const int counts[], MPI_Datatype t,
                                        MPI_Op op, MPI_Comm c, MPI_Request* q) {
  Count(bench::kIreduceScatter, c, 0, t);
  return PMPI_Ireduce_scatter(s, r, counts, t, op, c, q);
}
HVDC_BENCH_PMPI int MPI_Allgather(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                                  MPI_Datatype rt, MPI_Comm c) {
  Count(bench::kAllgather, c, sn, st);
  return PMPI_Allgather(s, sn, st, r, rn, rt, c);
}
HVDC_BENCH_PMPI int MPI_Iallgather(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                                   MPI_Datatype rt, MPI_Comm c, MPI_Request* q) {
  Count(bench::kIallgather, c, sn, st);
  return PMPI_Iallgather(s, sn, st, r, rn, rt, c, q);
}
HVDC_BENCH_PMPI int MPI_Allgatherv(const void* s, int sn, MPI_Datatype st, void* r,
                                   const int rn[], const int d[], MPI_Datatype rt, MPI_Comm c) {
  Count(bench::kAllgatherv, c, sn, st);
  return PMPI_Allgatherv(s, sn, st, r, rn, d, rt, c);
}
HVDC_BENCH_PMPI int MPI_Iallgatherv(const void* s, int sn, MPI_Datatype st, void* r,
                                    const int rn[], const int d[], MPI_Datatype rt, MPI_Comm c,
                                    MPI_Request* q) {
  Count(bench::kIallgatherv, c, sn, st);
  return PMPI_Iallgatherv(s, sn, st, r, rn, d, rt, c, q);
}
HVDC_BENCH_PMPI int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  Count(bench::kBcast, c, n, t);
  return PMPI_Bcast(b, n, t, root, c);
}
HVDC_BENCH_PMPI int MPI_Ibcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c,
                               MPI_Request* q) {
  Count(bench::kIbcast, c, n, t);
  return PMPI_Ibcast(b, n, t, root, c, q);
}
HVDC_BENCH_PMPI int MPI_Gather(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                               MPI_Datatype rt, int root, MPI_Comm c) {
  Count(bench::kGather, c, sn, st);
  return PMPI_Gather(s, sn, st, r, rn, rt, root, c);
}
HVDC_BENCH_PMPI int MPI_Gatherv(const void* s, int sn, MPI_Datatype st, void* r, const int rn[],
                                const int d[], MPI_Datatype rt, int root, MPI_Comm c) {
  Count(bench::kGatherv, c, sn, st);
  return PMPI_Gatherv(s, sn, st, r, rn, d, rt, root, c);
}
HVDC_BENCH_PMPI int MPI_Igather(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                                MPI_Datatype rt, int root, MPI_Comm c, MPI_Request* q) {
  Count(bench::kIgather, c, sn, st);
  return PMPI_Igather(s, sn, st, r, rn, rt, root, c, q);
}
HVDC_BENCH_PMPI int MPI_Igatherv(const void* s, int sn, MPI_Datatype st, void* r, const int rn[],
                                 const int d[], MPI_Datatype rt, int root, MPI_Comm c,
                                 MPI_Request* q) {
  Count(bench::kIgatherv, c, sn, st);
  return PMPI_Igatherv(s, sn, st, r, rn, d, rt, root, c, q);
}
HVDC_BENCH_PMPI int MPI_Reduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root,
                               MPI_Comm c) {
  Count(bench::kReduce, c, n, t);
  return PMPI_Reduce(s, r, n, t, op, root, c);
}
HVDC_BENCH_PMPI int MPI_Ireduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root,
                                MPI_Comm c, MPI_Request* q) {
  Count(bench::kIreduce, c, n, t);
  return PMPI_Ireduce(s, r, n, t, op, root, c, q);
}
HVDC_BENCH_PMPI int MPI_Barrier(MPI_Comm c) {
  Count(bench::kBarrier, c, 0, MPI_DATATYPE_NULL);
  return PMPI_Barrier(c);
}
HVDC_BENCH_PMPI int MPI_Ibarrier(MPI_Comm c, MPI_Request* q) {
  Count(bench::kIbarrier, c, 0, MPI_DATATYPE_NULL);
  return PMPI_Ibarrier(c, q);
}
HVDC_BENCH_PMPI int MPI_Alltoall(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                                 MPI_Datatype rt, MPI_Comm c) {
  Count(bench::kAlltoall, c, sn, st);
  return PMPI_Alltoall(s, sn, st, r, rn, rt, c);
}
HVDC_BENCH_PMPI int MPI_Alltoallv(const void* s, const int sn[], const int sd[], MPI_Datatype st,
                                  void* r, const int rn[], const int rd[], MPI_Datatype rt,
                                  MPI_Comm c) {
  Count(bench::kAlltoallv, c, 0, st);
  return PMPI_Alltoallv(s, sn, sd, st, r, rn, rd, rt, c);
}
HVDC_BENCH_PMPI int MPI_Ialltoallv(const void* s, const int sn[], const int sd[], MPI_Datatype st,
                                   void* r, const int rn[], const int rd[], MPI_Datatype rt,
                                   MPI_Comm c, MPI_Request* q) {
  Count(bench::kIalltoallv, c, 0, st);
  return PMPI_Ialltoallv(s, sn, sd, st, r, rn, rd, rt, c, q);
}
HVDC_BENCH_PMPI int MPI_Send(const void* b, int n, MPI_Datatype t, int dst, int tag, MPI_Comm c) {
  Count(bench::kSend, c, n, t);
  return PMPI_Send(b, n, t, dst, tag, c);
}
HVDC_BENCH_PMPI int MPI_Isend(const void* b, int n, MPI_Datatype t, int dst, int tag, MPI_Comm c,
                              MPI_Request* q) {
  Count(bench::kIsend, c, n, t);
  return PMPI_Isend(b, n, t, dst, tag, c, q);
}
HVDC_BENCH_PMPI int MPI_Recv(void* b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c,
                             MPI_Status* st) {
  Count(bench::kRecv, c, n, t);
  return PMPI_Recv(b, n, t, src, tag, c, st);
}
HVDC_BENCH_PMPI int MPI_Irecv(void* b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c,
                              MPI_Request* q) {
  Count(bench::kIrecv, c, n, t);
  return PMPI_Irecv(b, n, t, src, tag, c, q);
}
HVDC_BENCH_PMPI int MPI_Sendrecv(const void* sb, int sn, MPI_Datatype st, int dst, int stag,
                                 void* rb, int rn, MPI_Datatype rt, int src, int rtag, MPI_Comm c,
                                 MPI_Status* status) {
  Count(bench::kSendrecv, c, sn, st);
  return PMPI_Sendrecv(sb, sn, st, dst, stag, rb, rn, rt, src, rtag, c, status);
}
HVDC_BENCH_PMPI int MPI_Test(MPI_Request* q, int* flag, MPI_Status* st) {
  CountPoll(bench::kTest);
  return PMPI_Test(q, flag, st);
}
HVDC_BENCH_PMPI int MPI_Testall(int n, MPI_Request qs[], int* flag, MPI_Status sts[]) {
  CountPoll(bench::kTestall);
  return PMPI_Testall(n, qs, flag, sts);
}
HVDC_BENCH_PMPI int MPI_Testany(int n, MPI_Request qs[], int* idx, int* flag, MPI_Status* st) {
  CountPoll(bench::kTestany);
  return PMPI_Testany(n, qs, idx, flag, st);
}
HVDC_BENCH_PMPI int MPI_Testsome(int n, MPI_Request qs[], int* outn, int idx[], MPI_Status sts[]) {
  CountPoll(bench::kTestsome);
  return PMPI_Testsome(n, qs, outn, idx, sts);
}
HVDC_BENCH_PMPI int MPI_Wait(MPI_Request* q, MPI_Status* st) {
  CountPoll(bench::kWait);
  return PMPI_Wait(q, st);
}
HVDC_BENCH_PMPI int MPI_Waitall(int n, MPI_Request qs[], MPI_Status sts[]) {
  CountPoll(bench::kWaitall);
  return PMPI_Waitall(n, qs, sts);
}
HVDC_BENCH_PMPI int MPI_Iprobe(int src, int tag, MPI_Comm c, int* flag, MPI_Status* st) {
  if (bench::Counted(c)) CountPoll(bench::kIprobe);
  return PMPI_Iprobe(src, tag, c, flag, st);
}
HVDC_BENCH_PMPI int MPI_Probe(int src, int tag, MPI_Comm c, MPI_Status* st) {
  if (bench::Counted(c)) CountPoll(bench::kProbe);
  return PMPI_Probe(src, tag, c, st);
}
#endif  // HVDC_BENCH_NO_PMPI
