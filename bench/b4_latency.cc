// B4: the latency floor -- one 4 B (and one 1 KiB) allreduce, enqueue to completion callback,
// against a raw MPI_Allreduce of the same bytes, p50/p99 over --iters (10,000) each.
//
// The caller waits for the callback either blocked on a condition variable ("block", what a
// framework kernel does) or spinning with sched_yield ("yield"), so that the wake-up cost of the
// waiting thread can be told apart from the runtime's own latency. Each wait mode is timed in its
// own pass, interleaved step by step with the raw reference: interleaving the two modes with each
// other left each step in the scheduler state of the other mode's caller (on a rank pinned to one
// core, block then measured 16 us instead of its 11 us alone, yield 14 instead of 16.5).
#include <algorithm>
#include <cstdio>

#include "bench/benchmarks.h"
#include "bench/common.h"
#include "bench/mpi_count.h"
#include "bench/ours.h"

namespace bench {

int RunB4(Context& ctx) {
  const Options& o = *ctx.opts;
  int iters = static_cast<int>(o.Int("iters", 10000));
  int warmup = static_cast<int>(o.Int("warmup", std::max(10, iters / 100)));
  int reduce_op = ParseReduceOp(o.Str("op", "sum"));
  std::vector<WaitMode> modes;
  for (const auto& m : o.List("wait", "block,yield")) modes.push_back(ParseWaitMode(m));

  Json result = ResultHeader(ctx);
  Json sizes = Json::Array();
  Json targets = Json::Array();
  Log(ctx, "B4 latency, %d iterations each (+%d warm-up), max over ranks per iteration\n", iters,
      warmup);
  Log(ctx, "  %-8s %-28s %9s %9s %9s %9s\n", "size", "variant", "p50 us", "p99 us", "mean us",
      "max us");
  for (const auto& size_str : o.List("sizes", "4,1K")) {
    int64_t bytes = ParseBytes(size_str);
    int64_t n = std::max<int64_t>(bytes / 4, 1);
    TensorSet set = UniformSet("b4", 1, n);
    Buffers ours_buf(set);
    float* raw = AllocFloats(n);
    AllreduceBatch batch("B4." + std::to_string(bytes), {ours_buf.data(0)}, {n}, reduce_op);
    VerifyOurs(ctx, ours_buf, &batch, reduce_op, modes.empty() ? WaitMode::kBlock : modes[0]);

    Completion done;
    auto raw_step = [&ctx, raw, n] {
      MPI_Allreduce(MPI_IN_PLACE, raw, static_cast<int>(n), MPI_FLOAT, MPI_SUM, ctx.comm);
    };
    MpiCounts mpi0 = SnapshotMpiCounts();
    std::vector<std::pair<std::string, Stats>> rows;
    for (WaitMode m : modes) {
      const std::string name = std::string("ours (") + WaitModeName(m) + ")";
      std::vector<Variant> variants = {
          {name, [&ctx, &batch, &done, m] { OursStep(ctx, &batch, &done, m); }, nullptr, nullptr},
          {"raw MPI_Allreduce", raw_step, nullptr, nullptr}};
      auto times = TimeInterleaved(ctx, variants, warmup, iters);
      rows.emplace_back(name, ComputeStats(times[0]));
      // The first pass's reference keeps the plain name (bench/summarize.py, b7_report.py).
      rows.emplace_back(rows.size() == 1 ? std::string("raw MPI_Allreduce")
                                         : "raw MPI_Allreduce (" + std::string(WaitModeName(m)) +
                                               " pass)",
                        ComputeStats(times[1]));
    }
    MpiCounts mpi = SnapshotMpiCounts() - mpi0;
    double ops = double(modes.size()) * (warmup + iters);

    Json entry = Json::Object();
    entry.Set("bytes", bytes);
    Json vj = Json::Object();
    for (size_t k = 0; k < rows.size(); ++k) {
      const Stats& st = rows[k].second;
      Log(ctx, "  %-8s %-28s %9.1f %9.1f %9.1f %9.1f\n", FormatBytes(double(bytes)).c_str(),
          rows[k].first.c_str(), st.p50 * 1e6, st.p99 * 1e6, st.mean * 1e6, st.max * 1e6);
      vj.Set(rows[k].first, Json::FromStats(st, 1e6));
      if (k % 2 == 0) {
        targets.Push(AtMost("B4 " + FormatBytes(double(bytes)) + " p50, " + rows[k].first,
                            st.p50 * 1e6, 50.0, " us").ToJson());
      }
    }
    entry.Set("latency_us", vj);
    if (ops > 0) {
      Log(ctx, "  %-8s runtime MPI calls per op (rank 0): %s; %.3g polls\n", "",
          MpiCountsSummary(mpi, ops).c_str(), double(mpi.polls()) / ops);
      entry.Set("mpi_calls_per_op_rank0", MpiCountsJson(mpi, ops));
    }
    sizes.Push(entry);
    FreeFloats(raw, n);
  }
  result.Set("iters", iters).Set("warmup", warmup).Set("sizes", sizes).Set("targets", targets);
  WriteResult(ctx, result);
  return 0;
}

}  // namespace bench
