// B3: many small tensors at once (small_mixed.txt, and 2000 x 1 KiB): the cost of negotiation and
// fusion per tensor, and how many collectives the runtime issues for them, against one raw
// MPI_Allreduce per tensor.
#include <algorithm>
#include <cstdio>

#include "bench/benchmarks.h"
#include "bench/common.h"
#include "bench/mpi_count.h"
#include "bench/ours.h"
#include "bench/raw_ref.h"

namespace bench {
namespace {

Json RunSet(Context& ctx, const TensorSet& set, Json* targets) {
  const Options& o = *ctx.opts;
  int warmup = static_cast<int>(o.Int("warmup", 5));
  int steps = static_cast<int>(o.Int("steps", 20));
  int reduce_op = ParseReduceOp(o.Str("op", "sum"));
  WaitMode wait = ParseWaitMode(o.Str("wait", "block"));
  size_t n = set.elements.size();

  Buffers tensors(set);
  std::vector<float*> ptrs;
  for (size_t i = 0; i < n; ++i) ptrs.push_back(tensors.data(i));
  AllreduceBatch batch("B3." + set.name, ptrs, set.elements, reduce_op);
  VerifyOurs(ctx, tensors, &batch, reduce_op, wait);

  Completion done;
  RuntimeCpu cpu(ctx);
  RuntimeCpu::Sample cpu0;
  MpiCounts mpi0, mpi_total;
  double cpu_total = 0;
  double enqueue_total = 0;  // the hvdc_enqueue calls alone, measured steps only
  double enqueue_step = 0;
  int calls = 0;
  std::vector<Variant> variants = {
      {"ours", [&] { OursStep(ctx, &batch, &done, wait, &enqueue_step); },
       [&] {
         enqueue_step = 0;
         cpu0 = cpu.Take();
         mpi0 = SnapshotMpiCounts();
       },
       [&] {
         if (calls++ < warmup) return;
         cpu_total += cpu.Take().runtime() - cpu0.runtime();
         enqueue_total += enqueue_step;
         MpiCounts d = SnapshotMpiCounts() - mpi0;
         for (int i = 0; i < kMpiFnCount; ++i) {
           mpi_total.calls[i] += d.calls[i];
           mpi_total.bytes[i] += d.bytes[i];
         }
       }},
      {"raw per-tensor", [&] { RawPerTensorAllreduce(ctx, tensors); }, nullptr, nullptr},
  };
  auto times = TimeInterleaved(ctx, variants, warmup, steps);
  Stats ours = ComputeStats(times[0]);
  Stats raw = ComputeStats(times[1]);
  double measured = std::max(steps, 1);
  double cpu_per_step = MaxOverRanks(ctx, cpu_total / measured);
  double enqueue_us_per_tensor = MaxOverRanks(ctx, enqueue_total / measured / double(n) * 1e6);
  // Collectives the runtime issued per step: rank 0's count (every rank issues the same data
  // collectives; control rounds may differ slightly).
  double collectives = double(mpi_total.collectives()) / measured;
  bool counted = MaxOverRanks(ctx, double(mpi_total.collectives())) > 0;
  double us_per_tensor = ours.p50 / double(n) * 1e6;
  double speedup = raw.p50 / ours.p50;

  Log(ctx, "B3 %s: %zu tensors, %s per rank\n", set.name.c_str(), n,
      FormatBytes(double(set.total_bytes())).c_str());
  Log(ctx, "  %-26s %10s %10s %12s\n", "", "median ms", "p90 ms", "us/tensor");
  Log(ctx, "  %-26s %10.3f %10.3f %12.2f\n", "ours (all at once)", ours.p50 * 1e3, ours.p90 * 1e3,
      us_per_tensor);
  Log(ctx, "  %-26s %10.3f %10.3f %12.2f\n", "raw per-tensor", raw.p50 * 1e3, raw.p90 * 1e3,
      raw.p50 / double(n) * 1e6);
  Log(ctx, "  ours is %.2fx %s than per-tensor raw MPI; runtime threads' CPU %.2f ms/step;"
           " hvdc_enqueue alone %.2f us/tensor\n",
      speedup >= 1 ? speedup : 1 / speedup, speedup >= 1 ? "faster" : "SLOWER", cpu_per_step * 1e3,
      enqueue_us_per_tensor);
  if (counted) {
    Log(ctx, "  runtime MPI collectives per step (rank 0): %.4g: %s; %.4g polls\n", collectives,
        MpiCountsSummary(mpi_total, measured).c_str(), double(mpi_total.polls()) / measured);
  }

  Json j = Json::Object();
  j.Set("tensor_set", set.name)
      .Set("tensors", n)
      .Set("bytes", set.total_bytes())
      .Set("verified", true)
      .Set("ours_time_s", Json::FromStats(ours))
      .Set("raw_per_tensor_time_s", Json::FromStats(raw))
      .Set("ours_us_per_tensor", us_per_tensor)
      .Set("ours_us_per_tensor_p90", ours.p90 / double(n) * 1e6)
      .Set("raw_per_tensor_us_per_tensor", raw.p50 / double(n) * 1e6)
      .Set("speedup_vs_per_tensor_raw", speedup)
      .Set("runtime_threads_cpu_s_per_step", cpu_per_step)
      .Set("hvdc_enqueue_us_per_tensor_max_over_ranks", enqueue_us_per_tensor);
  if (counted) {
    j.Set("collectives_per_step_rank0", collectives)
        .Set("mpi_calls_per_step_rank0", MpiCountsJson(mpi_total, measured));
  }
  if (ctx.size == 2) {
    targets->Push(AtMost("B3 " + set.name + " us per tensor at np=2", us_per_tensor, 5.0, " us").ToJson());
  }
  if (ctx.size == 4) {
    targets->Push(AtMost("B3 " + set.name + " per-tensor raw / ours at np=4 must be >= 5 "
                         "(shown as 5 / speedup <= 1)", 5.0 / speedup, 1.0).ToJson());
  }
  return j;
}

}  // namespace

int RunB3(Context& ctx) {
  const Options& o = *ctx.opts;
  Json result = ResultHeader(ctx);
  Json sets = Json::Array();
  Json targets = Json::Array();
  sets.Push(RunSet(ctx, LoadTensorSet(ctx, o.Str("set", "small_mixed")), &targets));
  int count = static_cast<int>(o.Int("count", 2000));
  int64_t bytes = o.Int("bytes", 1 * KiB);
  sets.Push(RunSet(ctx, UniformSet(std::to_string(count) + "x" + std::to_string(bytes) + "B", count,
                                   std::max<int64_t>(bytes / 4, 1)),
                   &targets));
  result.Set("reduce_op", o.Str("op", "sum")).Set("sets", sets).Set("targets", targets);
  WriteResult(ctx, result);
  return 0;
}

}  // namespace bench
