// B6: the runtime's memory cost -- peak RSS of a rank while it reduces a gradient set through the
// runtime, minus the bytes of its own tensors (in place: input = output). No raw reference runs in
// this process, so nothing else holds a copy of the set.
#include <cstdio>
#include <cstdlib>

#include "bench/benchmarks.h"
#include "bench/common.h"
#include "bench/ours.h"

namespace bench {
namespace {

constexpr int64_t kDefaultFusionThreshold =
    128 * MiB;  // Horovod's default HOROVOD_FUSION_THRESHOLD

int64_t FusionThreshold() {
  const char* v = std::getenv("HOROVOD_FUSION_THRESHOLD");
  return v && *v ? std::atoll(v) : kDefaultFusionThreshold;
}

Json RunSet(Context& ctx, const std::string& name, bool hwm_reset_ok, Json* targets) {
  const Options& o = *ctx.opts;
  int warmup = static_cast<int>(o.Int("warmup", 3));
  int steps = static_cast<int>(o.Int("steps", 10));
  int reduce_op = ParseReduceOp(o.Str("op", "sum"));
  TensorSet set = LoadTensorSet(ctx, name);
  double tensor_bytes = double(set.total_bytes());
  int64_t rss_before = ReadStatusKiB("VmRSS:") * 1024;

  double hwm = 0;
  {
    Buffers tensors(set);
    std::vector<float*> ptrs;
    for (size_t i = 0; i < tensors.count(); ++i) ptrs.push_back(tensors.data(i));
    AllreduceBatch batch("B6." + set.name, ptrs, set.elements, reduce_op);
    VerifyOurs(ctx, tensors, &batch, reduce_op, WaitMode::kBlock);
    Completion done;
    for (int i = 0; i < warmup + steps; ++i) {
      MPI_Barrier(ctx.comm);
      OursStep(ctx, &batch, &done, WaitMode::kBlock);
    }
    hwm = double(ReadStatusKiB("VmHWM:")) * 1024;
  }
  int64_t threshold = FusionThreshold();
  double overhead = hwm - tensor_bytes;                     // BENCHMARKS.md's definition
  double runtime_overhead = overhead - double(rss_before);  // minus what the process held before
  double overhead_max = MaxOverRanks(ctx, overhead);
  double runtime_max = MaxOverRanks(ctx, runtime_overhead);
  double hwm_max = MaxOverRanks(ctx, hwm);
  double before_max = MaxOverRanks(ctx, double(rss_before));
  double used_bound = double(std::min<int64_t>(threshold, set.total_bytes()));
  Log(ctx, "  %-16s %10s %10s %10s %12s %14s\n", set.name.c_str(),
      FormatBytes(tensor_bytes).c_str(), FormatBytes(hwm_max).c_str(),
      FormatBytes(before_max).c_str(), FormatBytes(overhead_max).c_str(),
      FormatBytes(runtime_max).c_str());

  Target full = AtMost("B6 " + set.name +
                           ": peak RSS - tensors - RSS before the set (MiB), vs "
                           "min(fusion threshold, set) + 32 MiB",
                       runtime_max / MiB, (used_bound + 32.0 * MiB) / MiB, " MiB");
  Target tight = AtMost("B6 " + set.name + ": same, vs 32 MiB (if no fusion buffer were used)",
                        runtime_max / MiB, 32.0, " MiB");
  Target literal = AtMost("B6 " + set.name +
                              ": peak RSS - tensors (literal definition, includes "
                              "MPI and libraries), vs min(fusion threshold, set) + 32 MiB",
                          overhead_max / MiB, (used_bound + 32.0 * MiB) / MiB, " MiB");
  targets->Push(full.ToJson()).Push(tight.ToJson()).Push(literal.ToJson());
  Log(ctx, "    %s\n    %s\n    %s\n", full.text.c_str(), tight.text.c_str(), literal.text.c_str());
  return Json::Object()
      .Set("tensor_set", set.name)
      .Set("tensor_bytes", tensor_bytes)
      .Set("peak_rss_bytes_max_over_ranks", hwm_max)
      .Set("rss_before_set_bytes_max_over_ranks", before_max)
      .Set("peak_minus_tensors_bytes_max_over_ranks", overhead_max)
      .Set("peak_minus_tensors_minus_before_bytes_max_over_ranks", runtime_max)
      .Set("fusion_threshold_bytes", threshold)
      .Set("hwm_reset_before_set", hwm_reset_ok)
      .Set("steps", warmup + steps);
}

}  // namespace

int RunB6(Context& ctx) {
  const Options& o = *ctx.opts;
  Json result = ResultHeader(ctx);
  Json sets = Json::Array();
  Json targets = Json::Array();
  Log(ctx,
      "B6 memory (max over ranks). RSS after MPI_Init %s, after hvdc_init %s; fusion threshold"
      " %s\n",
      FormatBytes(MaxOverRanks(ctx, double(ctx.rss_after_mpi_init_kib) * 1024)).c_str(),
      FormatBytes(MaxOverRanks(ctx, double(ctx.rss_after_hvdc_init_kib) * 1024)).c_str(),
      FormatBytes(double(FusionThreshold())).c_str());
  Log(ctx, "  %-16s %10s %10s %10s %12s %14s\n", "set", "tensors", "peak RSS", "RSS before",
      "peak-tensors", "...-before");
  for (const auto& name : o.List("sets", "resnet50_keras,bert_base")) {
    // Each set's peak is its own: reset VmHWM (the previous set's buffers are freed by now).
    bool reset = ResetPeakRss();
    sets.Push(RunSet(ctx, name, reset, &targets));
  }
  result.Set("rss_after_mpi_init_bytes", double(ctx.rss_after_mpi_init_kib) * 1024)
      .Set("rss_after_hvdc_init_bytes", double(ctx.rss_after_hvdc_init_kib) * 1024)
      .Set("sets", sets)
      .Set("targets", targets);
  WriteResult(ctx, result);
  return 0;
}

}  // namespace bench
