// B0: the raw-MPI reference. MPI_Allreduce swept 4 B..--max-bytes (256 MiB) x4, with the runtime's
// single-tensor allreduce and a memcpy of the same bytes beside it at every size; then, for each
// tensor set, the best-chunked raw time (chunks of 256 KiB..32 MiB or whole) and the memcpy floor.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "bench/benchmarks.h"
#include "bench/common.h"
#include "bench/ours.h"
#include "bench/raw_ref.h"

namespace bench {
namespace {

Json Sweep(Context& ctx) {
  const Options& o = *ctx.opts;
  int64_t max_bytes = o.Int("max-bytes", 256 * MiB);
  int64_t budget = o.Int("budget-bytes", 256 * MiB);  // per size: iterations ~ budget / bytes
  int min_steps = static_cast<int>(o.Int("steps", 20));
  int max_iters = static_cast<int>(o.Int("max-iters", 1000));
  bool with_ours = !o.Has("no-ours");
  WaitMode wait = ParseWaitMode(o.Str("wait", "block"));
  double bus = ctx.BusFactor();

  Log(ctx, "B0 sweep: MPI_Allreduce fp32 sum in place, max over ranks; busbw = algbw x %.2f\n", bus);
  Log(ctx, "  %-10s %6s %11s %11s %9s %11s %9s %10s %9s\n", "bytes", "iters", "raw p50 us",
      "raw p90 us", "raw busbw", "ours p50 us", "ours/raw", "memcpy us", "ours/mcpy");
  Json rows = Json::Array();
  for (int64_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
    int64_t n = bytes / 4;
    int iters = static_cast<int>(std::clamp<int64_t>(budget / bytes, min_steps, max_iters));
    int warmup = std::max(5, iters / 10);
    float* raw = AllocFloats(n);
    TensorSet set = UniformSet("b0", 1, n);
    Buffers ours_buf(set);
    AllreduceBatch batch("B0." + std::to_string(bytes), {ours_buf.data(0)}, {n}, HVDC_SUM);
    VerifyRawChunked(ctx, raw, n, 0);
    if (with_ours) VerifyOurs(ctx, ours_buf, &batch, HVDC_SUM, wait);

    Completion done;
    std::vector<Variant> variants = {
        {"raw", [&] { MPI_Allreduce(MPI_IN_PLACE, raw, int(n), MPI_FLOAT, MPI_SUM, ctx.comm); },
         nullptr, nullptr},
        {"memcpy", [&] { std::memcpy(raw, ours_buf.data(0), size_t(bytes)); }, nullptr, nullptr},
    };
    if (with_ours) {
      variants.push_back({"ours", [&] { OursStep(ctx, &batch, &done, wait); }, nullptr, nullptr});
    }
    auto times = TimeInterleaved(ctx, variants, warmup, iters);
    Stats r = ComputeStats(times[0]);
    Stats m = ComputeStats(times[1]);
    Json row = Json::Object();
    row.Set("bytes", bytes)
        .Set("iters", iters)
        .Set("raw_time_s", Json::FromStats(r))
        .Set("raw_algbw_GBps", double(bytes) / r.p50 * 1e-9)
        .Set("raw_busbw_GBps", double(bytes) / r.p50 * bus * 1e-9)
        .Set("memcpy_time_s", Json::FromStats(m))
        .Set("memcpy_GBps", double(bytes) / m.p50 * 1e-9);
    if (with_ours) {
      Stats u = ComputeStats(times[2]);
      row.Set("ours_time_s", Json::FromStats(u))
          .Set("ours_algbw_GBps", double(bytes) / u.p50 * 1e-9)
          .Set("ours_busbw_GBps", double(bytes) / u.p50 * bus * 1e-9)
          .Set("ours_over_raw", u.p50 / r.p50);
      Log(ctx, "  %-10s %6d %11.2f %11.2f %9.3f %11.2f %8.2fx %10.2f %8.2fx\n",
          FormatBytes(double(bytes)).c_str(), iters, r.p50 * 1e6, r.p90 * 1e6,
          double(bytes) / r.p50 * bus * 1e-9, u.p50 * 1e6, u.p50 / r.p50, m.p50 * 1e6,
          u.p50 / m.p50);
    } else {
      Log(ctx, "  %-10s %6d %11.2f %11.2f %9.3f %11s %9s %10.2f %9s\n",
          FormatBytes(double(bytes)).c_str(), iters, r.p50 * 1e6, r.p90 * 1e6,
          double(bytes) / r.p50 * bus * 1e-9, "-", "-", m.p50 * 1e6, "-");
    }
    rows.Push(row);
    FreeFloats(raw, n);
  }
  return rows;
}

Json SetReference(Context& ctx, const std::string& name) {
  const Options& o = *ctx.opts;
  int reps = static_cast<int>(o.Int("chunk-reps", 10));
  TensorSet set = LoadTensorSet(ctx, name);
  int64_t n = set.total_elements();
  double bytes = double(set.total_bytes());
  float* buf = AllocFloats(n);
  float* copy = AllocFloats(n);
  VerifyRawChunked(ctx, buf, n, 4 * MiB);
  ChunkSweepResult sweep = ChunkSweep(ctx, buf, n, DefaultChunkBytes(), 1, reps);
  Stats mc = MemcpyTime(ctx, copy, buf, set.total_bytes(), 1, reps);
  Log(ctx, "  %-16s %10s  ", set.name.c_str(), FormatBytes(bytes).c_str());
  for (const auto& e : sweep.entries) Log(ctx, " %7.1f", e.stats.p50 * 1e3);
  Log(ctx, "   best %-8s %7.1f ms (%.2f GB/s busbw)  memcpy %.1f ms (%.2f GB/s/rank)\n",
      ChunkLabel(sweep.best_chunk_bytes).c_str(), sweep.best.p50 * 1e3,
      bytes / sweep.best.p50 * ctx.BusFactor() * 1e-9, mc.p50 * 1e3, bytes / mc.p50 * 1e-9);
  Json j = sweep.ToJson(set.total_bytes(), ctx.BusFactor());
  j.Set("tensor_set", set.name)
      .Set("tensors", set.elements.size())
      .Set("bytes", bytes)
      .Set("memcpy_time_s", Json::FromStats(mc))
      .Set("memcpy_GBps_per_rank", bytes / mc.p50 * 1e-9)
      .Set("best_chunked_over_memcpy", sweep.best.p50 / mc.p50);
  FreeFloats(buf, n);
  FreeFloats(copy, n);
  return j;
}

}  // namespace

int RunB0(Context& ctx) {
  const Options& o = *ctx.opts;
  Json result = ResultHeader(ctx);
  result.Set("sweep", Sweep(ctx));
  Json sets = Json::Array();
  auto names = o.List("sets", "resnet50_keras,bert_base");
  if (!names.empty()) {
    Log(ctx, "B0 best-chunked raw MPI per tensor set (median ms per chunk size, %d reps each):\n",
        static_cast<int>(o.Int("chunk-reps", 10)));
    Log(ctx, "  %-16s %10s  ", "set", "bytes");
    for (int64_t c : DefaultChunkBytes()) Log(ctx, " %7s", ChunkLabel(c).c_str());
    Log(ctx, "\n");
  }
  for (const auto& name : names) sets.Push(SetReference(ctx, name));
  result.Set("tensor_sets", sets);
  WriteResult(ctx, result);
  return 0;
}

}  // namespace bench
