#include "bench/raw_ref.h"

#include <algorithm>
#include <cstring>

namespace bench {

std::vector<int64_t> DefaultChunkBytes() {
  return {256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 0};
}

std::string ChunkLabel(int64_t chunk_bytes) {
  return chunk_bytes == 0 ? "whole" : FormatBytes(double(chunk_bytes));
}

void RawChunkedAllreduce(const Context& ctx, float* buf, int64_t elements, int64_t chunk_bytes) {
  int64_t chunk = chunk_bytes == 0 ? elements : std::max<int64_t>(1, chunk_bytes / 4);
  for (int64_t off = 0; off < elements; off += chunk) {
    int n = static_cast<int>(std::min(chunk, elements - off));
    MPI_Allreduce(MPI_IN_PLACE, buf + off, n, MPI_FLOAT, MPI_SUM, ctx.comm);
  }
}

void RawPerTensorAllreduce(const Context& ctx, const Buffers& buffers) {
  for (size_t i = 0; i < buffers.count(); ++i) {
    MPI_Allreduce(MPI_IN_PLACE, buffers.data(i), static_cast<int>(buffers.elements(i)), MPI_FLOAT,
                  MPI_SUM, ctx.comm);
  }
}

Json ChunkSweepResult::ToJson(int64_t total_bytes, double bus_factor) const {
  Json j = Json::Object();
  Json arr = Json::Array();
  for (const auto& e : entries) {
    double algbw = double(total_bytes) / e.stats.p50;
    arr.Push(Json::Object()
                 .Set("chunk_bytes", e.chunk_bytes)
                 .Set("chunk", ChunkLabel(e.chunk_bytes))
                 .Set("time_s", Json::FromStats(e.stats))
                 .Set("algbw_GBps", algbw * 1e-9)
                 .Set("busbw_GBps", algbw * bus_factor * 1e-9));
  }
  j.Set("chunks", arr)
      .Set("best_chunk_bytes", best_chunk_bytes)
      .Set("best_chunk", ChunkLabel(best_chunk_bytes))
      .Set("best_time_s", Json::FromStats(best));
  return j;
}

ChunkSweepResult ChunkSweep(const Context& ctx, float* buf, int64_t elements,
                            const std::vector<int64_t>& chunks, int warmup, int reps) {
  int64_t bytes = elements * 4;
  std::vector<int64_t> used;
  for (int64_t c : chunks) {
    if (c == 0 || c < bytes) used.push_back(c);  // a chunk >= the whole set is the same as whole
  }
  std::vector<Variant> variants;
  for (int64_t c : used) {
    variants.push_back({ChunkLabel(c), [&ctx, buf, elements, c] {
                          RawChunkedAllreduce(ctx, buf, elements, c);
                        }, nullptr, nullptr});
  }
  auto times = TimeInterleaved(ctx, variants, warmup, reps);
  ChunkSweepResult r;
  double best = 1e300;
  for (size_t k = 0; k < used.size(); ++k) {
    Stats s = ComputeStats(times[k]);
    r.entries.push_back({used[k], s});
    if (s.p50 < best) {
      best = s.p50;
      r.best_chunk_bytes = used[k];
      r.best = s;
    }
  }
  return r;
}

Stats MemcpyTime(const Context& ctx, void* dst, const void* src, int64_t bytes, int warmup, int reps) {
  std::vector<Variant> v = {{"memcpy", [=] { std::memcpy(dst, src, size_t(bytes)); }, nullptr, nullptr}};
  return ComputeStats(TimeInterleaved(ctx, v, warmup, reps)[0]);
}

void VerifyRawChunked(const Context& ctx, float* buf, int64_t elements, int64_t chunk_bytes) {
  FillPattern(buf, elements, ctx.rank, 0);
  RawChunkedAllreduce(ctx, buf, elements, chunk_bytes);
  std::string err;
  int64_t wrong = CheckPattern(buf, elements, ctx.size, 0, HVDC_SUM, &err);
  if (!AllOk(ctx, wrong == 0)) {
    if (wrong) Fail(ctx, "raw MPI reference gave a wrong answer: %s", err.c_str());
    Fail(ctx, "raw MPI reference gave a wrong answer on another rank");
  }
  std::memset(buf, 0, size_t(elements) * 4);  // timed steps run on zeros
}

}  // namespace bench
