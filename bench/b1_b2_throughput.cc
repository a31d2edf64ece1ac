// B1 / B2: a whole gradient set enqueued at once, in backward order, against the best-chunked and
// the per-tensor raw-MPI references and the memcpy floor. B1p (and B2p with --paced): the same
// tensors enqueued one by one across a synthetic backprop window as long as the measured step.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "bench/benchmarks.h"
#include "bench/common.h"
#include "bench/mpi_count.h"
#include "bench/ours.h"
#include "bench/raw_ref.h"

namespace bench {
namespace {

// CPU time of the runtime's threads and MPI calls, accumulated over measured steps only.
struct OursAccounting {
  explicit OursAccounting(const Context& ctx) : cpu(ctx) {}
  RuntimeCpu cpu;
  int warmup = 0;
  int calls = 0;
  double cpu_s = 0;
  MpiCounts mpi;
  RuntimeCpu::Sample cpu0;
  MpiCounts mpi0;

  void Before() {
    cpu0 = cpu.Take();
    mpi0 = SnapshotMpiCounts();
  }
  void After() {
    if (calls++ < warmup) return;
    RuntimeCpu::Sample s = cpu.Take();
    cpu_s += s.runtime() - cpu0.runtime();
    MpiCounts d = SnapshotMpiCounts() - mpi0;
    for (int i = 0; i < kMpiFnCount; ++i) {
      mpi.calls[i] += d.calls[i];
      mpi.bytes[i] += d.bytes[i];
    }
  }
  int measured() const { return std::max(calls - warmup, 1); }
};

void PrintRow(const Context& ctx, const char* label, const Stats& s, double bytes, double ref) {
  double algbw = bytes / s.p50 * 1e-9;
  Log(ctx, "  %-34s %9.2f %9.2f %9.2f %9.2f   %6.2fx\n", label, s.p50 * 1e3, s.p90 * 1e3, algbw,
      algbw * ctx.BusFactor(), s.p50 / ref);
}

Json VariantJson(const Context& ctx, const Stats& s, double bytes) {
  double algbw = bytes / s.p50;
  return Json::Object()
      .Set("time_s", Json::FromStats(s))
      .Set("algbw_GBps", algbw * 1e-9)
      .Set("busbw_GBps", algbw * ctx.BusFactor() * 1e-9);
}

int RunThroughput(Context& ctx, const char* id, const std::string& default_set, bool default_paced) {
  const Options& o = *ctx.opts;
  TensorSet set = LoadTensorSet(ctx, o.Str("set", default_set));
  int warmup = static_cast<int>(o.Int("warmup", 5));
  int steps = static_cast<int>(o.Int("steps", 20));
  int chunk_reps = static_cast<int>(o.Int("chunk-reps", 10));
  int reduce_op = ParseReduceOp(o.Str("op", "sum"));
  WaitMode wait = ParseWaitMode(o.Str("wait", "block"));
  bool paced = default_paced ? !o.Has("no-paced") : o.Has("paced");
  const double bytes = double(set.total_bytes());
  const int64_t elements = set.total_elements();

  Log(ctx, "%s %s: %zu tensors, %s per rank, op=%s, wait=%s, %d warm-up + %d measured steps\n", id,
      set.name.c_str(), set.elements.size(), FormatBytes(bytes).c_str(), ReduceOpName(reduce_op),
      WaitModeName(wait), warmup, steps);

  Buffers tensors(set);
  float* flat = AllocFloats(elements);  // the raw references' contiguous buffer
  std::vector<float*> ptrs;
  for (size_t i = 0; i < tensors.count(); ++i) ptrs.push_back(tensors.data(i));
  AllreduceBatch batch(std::string(id) + "." + set.name, ptrs, set.elements, reduce_op);

  // Right answers first: a wrong answer is a failure, not a fast result.
  VerifyRawChunked(ctx, flat, elements, 4 * MiB);
  VerifyOurs(ctx, tensors, &batch, reduce_op, wait);
  std::memset(flat, 0, size_t(bytes));
  Log(ctx, "  verified: runtime and raw MPI reduce to the closed-form values\n");

  // The memory floor: every rank gathers the set into one buffer at once.
  Variant gather{"memcpy", [&] {
                   char* dst = reinterpret_cast<char*>(flat);
                   for (size_t i = 0; i < tensors.count(); ++i) {
                     size_t n = size_t(tensors.elements(i)) * 4;
                     std::memcpy(dst, tensors.data(i), n);
                     dst += n;
                   }
                 }, nullptr, nullptr};
  Stats memcpy_t = ComputeStats(TimeInterleaved(ctx, {gather}, 2, std::max(steps / 2, 5))[0]);
  std::memset(flat, 0, size_t(bytes));

  ChunkSweepResult sweep = ChunkSweep(ctx, flat, elements, DefaultChunkBytes(), 1, chunk_reps);
  int64_t best_chunk = sweep.best_chunk_bytes;

  // Side by side: ours, raw best-chunked, raw per-tensor, interleaved step by step.
  Completion done;
  OursAccounting acct(ctx);
  acct.warmup = warmup;
  std::vector<Variant> variants = {
      {"ours", [&] { OursStep(ctx, &batch, &done, wait); }, [&] { acct.Before(); },
       [&] { acct.After(); }},
      {"raw best-chunked", [&] { RawChunkedAllreduce(ctx, flat, elements, best_chunk); }, nullptr,
       nullptr},
      {"raw per-tensor", [&] { RawPerTensorAllreduce(ctx, tensors); }, nullptr, nullptr},
  };
  auto times = TimeInterleaved(ctx, variants, warmup, steps);
  Stats ours = ComputeStats(times[0]);
  Stats chunked = ComputeStats(times[1]);
  Stats per_tensor = ComputeStats(times[2]);
  double cpu_per_step = MaxOverRanks(ctx, acct.cpu_s / acct.measured());

  Log(ctx, "  %-34s %9s %9s %9s %9s   %7s\n", "", "median ms", "p90 ms", "algbw", "busbw",
      "/chunked");
  PrintRow(ctx, "ours (hvdc_enqueue, all at once)", ours, bytes, chunked.p50);
  std::string chunk_label = "raw best-chunked (" + ChunkLabel(best_chunk) + ")";
  PrintRow(ctx, chunk_label.c_str(), chunked, bytes, chunked.p50);
  PrintRow(ctx, "raw per-tensor", per_tensor, bytes, chunked.p50);
  PrintRow(ctx, "memcpy floor (gather, all ranks)", memcpy_t, bytes, chunked.p50);
  Log(ctx, "  raw chunk sweep (median ms):");
  for (const auto& e : sweep.entries) Log(ctx, " %s %.1f", ChunkLabel(e.chunk_bytes).c_str(), e.stats.p50 * 1e3);
  Log(ctx, "\n");

  double ratio_chunked = ours.p50 / chunked.p50;
  double ratio_per_tensor = ours.p50 / per_tensor.p50;
  Target t1 = AtMost("ours / raw best-chunked (median)", ratio_chunked, 1.10, "x");
  Target t2 = AtMost("ours / raw per-tensor (median)", ratio_per_tensor, 1.0, "x");
  Log(ctx, "  ours / best-chunked   median %.3fx  p90 %.3fx   target %s\n", ratio_chunked,
      ours.p90 / chunked.p90, t1.text.c_str());
  Log(ctx, "  ours / per-tensor     median %.3fx  p90 %.3fx   target %s\n", ratio_per_tensor,
      ours.p90 / per_tensor.p90, t2.text.c_str());
  Log(ctx, "  ours / memcpy floor   %.2fx    runtime threads' CPU %.1f ms/step (%.0f%% of the mean step)\n",
      ours.p50 / memcpy_t.p50, cpu_per_step * 1e3, 100 * cpu_per_step / ours.mean);
  MpiCounts per_step_mpi = acct.mpi;
  Log(ctx, "  runtime MPI collectives per step (rank 0): %s; %.4g polls\n",
      MpiCountsSummary(per_step_mpi, acct.measured()).c_str(),
      double(per_step_mpi.polls()) / acct.measured());

  Json result = ResultHeader(ctx);
  result.Set("tensor_set", set.name)
      .Set("tensors", set.elements.size())
      .Set("bytes", bytes)
      .Set("reduce_op", ReduceOpName(reduce_op))
      .Set("wait", WaitModeName(wait))
      .Set("warmup", warmup)
      .Set("steps", steps)
      .Set("verified", true)
      .Set("ours", VariantJson(ctx, ours, bytes)
                       .Set("runtime_threads_cpu_s_per_step", cpu_per_step)
                       .Set("mpi_calls_per_step_rank0", MpiCountsJson(per_step_mpi, acct.measured())))
      .Set("raw_best_chunked", VariantJson(ctx, chunked, bytes).Set("chunk_bytes", best_chunk))
      .Set("raw_per_tensor", VariantJson(ctx, per_tensor, bytes))
      .Set("memcpy_floor", VariantJson(ctx, memcpy_t, bytes))
      .Set("chunk_sweep", sweep.ToJson(set.total_bytes(), ctx.BusFactor()))
      .Set("ratio_vs_best_chunked", Json::Object().Set("median", ratio_chunked)
                                        .Set("p90", ours.p90 / chunked.p90))
      .Set("ratio_vs_per_tensor", Json::Object().Set("median", ratio_per_tensor)
                                      .Set("p90", ours.p90 / per_tensor.p90))
      .Set("ratio_vs_memcpy_floor", ours.p50 / memcpy_t.p50);
  Json targets = Json::Array();
  targets.Push(t1.ToJson()).Push(t2.ToJson());

  if (paced) {
    // B1p: layer i's gradient becomes ready at (i+1)/N of a window as long as the B1 step.
    // "busy" (BENCHMARKS.md): the main thread busy-waits in between, as CPU backprop keeps the
    // rank's core busy, so the runtime competes with it for that core. "sleep": the main thread
    // sleeps in between, as if the compute ran elsewhere (an accelerator).
    double window = ours.p50;
    size_t n = batch.count();
    Json pj = Json::Object();
    for (const auto& mode : o.List("pace", "busy,sleep")) {
      bool busy = mode != "sleep";
      Completion pdone;
      OursAccounting pacct(ctx);
      pacct.warmup = warmup;
      Variant pacedv{"ours paced", [&] {
                       pdone.Reset(static_cast<int>(n));
                       double t0 = MPI_Wtime();
                       for (size_t i = 0; i < n; ++i) {
                         double t = t0 + window * double(i + 1) / double(n);
                         if (busy) {
                           SpinUntil(t);
                         } else {
                           SleepUntil(t);
                         }
                         batch.Enqueue(ctx, i, &pdone);
                       }
                       pdone.Wait(wait);
                       if (pdone.errors()) Fail(ctx, "paced step: %s", pdone.first_error().c_str());
                     },
                     [&] { pacct.Before(); }, [&] { pacct.After(); }};
      Stats step = ComputeStats(TimeInterleaved(ctx, {pacedv}, warmup, steps)[0]);
      double exposed50 = std::max(0.0, step.p50 - window);
      double exposed90 = std::max(0.0, step.p90 - window);
      double pct = 100 * exposed50 / window;
      Log(ctx, "  %sp paced (%s) over a %.1f ms window: step median %.1f ms, p90 %.1f ms; exposed"
               " %.1f ms = %.0f%% of %s (p90 %.0f%%)\n",
          id, busy ? "busy-wait" : "sleep", window * 1e3, step.p50 * 1e3, step.p90 * 1e3,
          exposed50 * 1e3, pct, id, 100 * exposed90 / window);
      pj.Set(busy ? "busy" : "sleep",
             Json::Object()
                 .Set("window_s", window)
                 .Set("step_time_s", Json::FromStats(step))
                 .Set("exposed_s_median", exposed50)
                 .Set("exposed_s_p90", exposed90)
                 .Set("exposed_pct_of_unpaced_median", pct)
                 .Set("exposed_pct_of_unpaced_p90", 100 * exposed90 / window)
                 .Set("runtime_threads_cpu_s_per_step",
                      MaxOverRanks(ctx, pacct.cpu_s / pacct.measured())));
      if (busy) {
        Target t3 = AtMost(std::string(id) + "p (busy-wait) exposed communication, % of the " + id +
                               " time", pct, 30.0, "%");
        Log(ctx, "    target %s\n", t3.text.c_str());
        targets.Push(t3.ToJson());
      }
    }
    result.Set("paced", pj);
  }

  int64_t hwm = ReadStatusKiB("VmHWM:");
  double hwm_max = MaxOverRanks(ctx, double(hwm) * 1024);
  Log(ctx, "  peak RSS (max over ranks) %s, with the raw reference's %s buffer and the set's %s\n",
      FormatBytes(hwm_max).c_str(), FormatBytes(bytes).c_str(), FormatBytes(bytes).c_str());
  result.Set("peak_rss_bytes_max_over_ranks", hwm_max).Set("targets", targets);
  WriteResult(ctx, result);
  FreeFloats(flat, elements);
  return 0;
}

}  // namespace

int RunB1(Context& ctx) { return RunThroughput(ctx, "B1", "resnet50_keras", true); }
int RunB2(Context& ctx) { return RunThroughput(ctx, "B2", "bert_base", false); }

}  // namespace bench
