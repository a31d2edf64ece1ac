// The benchmark entry points (one per BENCHMARKS.md id); each returns the process exit code.
#ifndef HVDC_BENCH_BENCHMARKS_H_
#define HVDC_BENCH_BENCHMARKS_H_

#include "bench/common.h"

namespace bench {

int RunB0(Context& ctx);   // b0_raw_mpi.cc
int RunB1(Context& ctx);   // b1_b2_throughput.cc (B1 and B1p)
int RunB2(Context& ctx);   // b1_b2_throughput.cc
int RunB3(Context& ctx);   // b3_small.cc
int RunB4(Context& ctx);   // b4_latency.cc
int RunB4i(Context& ctx);  // b4i_idle.cc
int RunB6(Context& ctx);   // b6_memory.cc

}  // namespace bench

#endif  // HVDC_BENCH_BENCHMARKS_H_
