// The raw-MPI references every efficiency ratio is taken against (BENCHMARKS.md "The references").
#ifndef HVDC_BENCH_RAW_REF_H_
#define HVDC_BENCH_RAW_REF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common.h"

namespace bench {

// The chunk sizes BENCHMARKS.md names; 0 means "whole" (one call for all the bytes).
std::vector<int64_t> DefaultChunkBytes();
std::string ChunkLabel(int64_t chunk_bytes);

// MPI_Allreduce (in place, fp32 sum) of `elements` floats at `buf` in calls of `chunk_bytes`.
void RawChunkedAllreduce(const Context& ctx, float* buf, int64_t elements, int64_t chunk_bytes);
// One MPI_Allreduce per tensor, in place.
void RawPerTensorAllreduce(const Context& ctx, const Buffers& buffers);

struct ChunkSweepResult {
  struct Entry {
    int64_t chunk_bytes;
    Stats stats;  // seconds, max over ranks
  };
  std::vector<Entry> entries;
  int64_t best_chunk_bytes = 0;
  Stats best;
  Json ToJson(int64_t total_bytes, double bus_factor) const;
};
// Times every chunk size (warmup + reps each, interleaved) on a contiguous buffer and keeps the one
// with the lowest median.
ChunkSweepResult ChunkSweep(const Context& ctx, float* buf, int64_t elements,
                            const std::vector<int64_t>& chunks, int warmup, int reps);

// Copy bandwidth with every rank copying at once: `bytes` from src to dst, timed like a step.
// Returns the median seconds (max over ranks).
Stats MemcpyTime(const Context& ctx, void* dst, const void* src, int64_t bytes, int warmup, int reps);

// Fills a contiguous reference buffer with the closed-form pattern, reduces it with the given chunk
// size and checks it; fails the job on a wrong answer.
void VerifyRawChunked(const Context& ctx, float* buf, int64_t elements, int64_t chunk_bytes);

}  // namespace bench

#endif  // HVDC_BENCH_RAW_REF_H_
