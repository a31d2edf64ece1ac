// B4i: the CPU the runtime burns while nothing is asked of it -- right after init, and again
// right after a burst of small allreduces (a runtime that keeps polling after work shows up
// there). Measured as the CPU time of every thread except the main one and the threads MPI had
// before hvdc_init, over --seconds of the main thread sleeping, as % of one core.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "bench/benchmarks.h"
#include "bench/common.h"
#include "bench/mpi_count.h"
#include "bench/ours.h"

namespace bench {
namespace {

void SleepSeconds(double s) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(s);
  ts.tv_nsec = static_cast<long>((s - double(ts.tv_sec)) * 1e9);
  while (nanosleep(&ts, &ts) != 0) {
  }
}

Json IdlePhase(Context& ctx, const char* label, double seconds, Json* targets) {
  RuntimeCpu cpu(ctx);
  std::map<int, double> before;
  for (const auto& t : ListThreads(ctx)) before[t.tid] = t.cpu_s;
  MPI_Barrier(ctx.comm);
  RuntimeCpu::Sample s0 = cpu.Take();
  MpiCounts m0 = SnapshotMpiCounts();
  double t0 = MPI_Wtime();
  SleepSeconds(seconds);
  double wall = MPI_Wtime() - t0;
  RuntimeCpu::Sample s1 = cpu.Take();
  MpiCounts m = SnapshotMpiCounts() - m0;
  auto threads = ListThreads(ctx);
  MPI_Barrier(ctx.comm);

  double runtime_pct = 100 * (s1.runtime() - s0.runtime()) / wall;
  double nonmain_pct = 100 * (s1.process_minus_main - s0.process_minus_main) / wall;
  double runtime_max = MaxOverRanks(ctx, runtime_pct);
  double nonmain_max = MaxOverRanks(ctx, nonmain_pct);
  double polls_per_s = MaxOverRanks(ctx, double(m.polls()) / wall);
  double colls_per_s = MaxOverRanks(ctx, double(m.collectives()) / wall);
  Log(ctx, "  %-28s %8.3f%% %12.3f%% %12.1f %14.1f\n", label, runtime_max, nonmain_max, colls_per_s,
      polls_per_s);

  // Which threads used the time, on every rank (rank 0's list in the JSON; others print if busy).
  Json tj = Json::Array();
  for (const auto& t : threads) {
    double used = t.cpu_s - (before.count(t.tid) ? before[t.tid] : 0.0);
    tj.Push(Json::Object()
                .Set("tid", t.tid)
                .Set("name", t.name)
                .Set("pre_existing", t.pre_existing)
                .Set("cpu_pct", 100 * used / wall));
    if (100 * used / wall > 1.0) {
      std::printf("    rank %d thread %d '%s'%s: %.1f%% of a core\n", ctx.rank, t.tid, t.name.c_str(),
                  t.pre_existing ? " (MPI's, before init)" : "", 100 * used / wall);
    }
  }
  std::fflush(stdout);
  targets->Push(AtMost(std::string("B4i runtime threads' CPU, ") + label, runtime_max, 1.0, "%").ToJson());
  return Json::Object()
      .Set("phase", label)
      .Set("seconds", wall)
      .Set("runtime_threads_cpu_pct_of_core_max_over_ranks", runtime_max)
      .Set("all_but_main_thread_cpu_pct_of_core_max_over_ranks", nonmain_max)
      .Set("runtime_mpi_collectives_per_s_max_over_ranks", colls_per_s)
      .Set("runtime_mpi_polls_per_s_max_over_ranks", polls_per_s)
      .Set("mpi_calls_rank0", MpiCountsJson(m))
      .Set("threads_rank0", tj);
}

}  // namespace

int RunB4i(Context& ctx) {
  const Options& o = *ctx.opts;
  double seconds = o.Double("seconds", 10);
  double after_seconds = o.Double("after-work-seconds", seconds);
  Json result = ResultHeader(ctx);
  Json phases = Json::Array();
  Json targets = Json::Array();
  Log(ctx, "B4i idle CPU over %.0f s (max over ranks; %% of one core)\n", seconds);
  Log(ctx, "  %-28s %9s %13s %12s %14s\n", "phase", "runtime", "all-but-main", "colls/s", "MPI polls/s");
  phases.Push(IdlePhase(ctx, "after init", seconds, &targets));

  if (after_seconds > 0) {
    // A burst of work, then idle again.
    TensorSet set = UniformSet("b4i", 1, 1);
    Buffers buf(set);
    AllreduceBatch batch("B4i.burst", {buf.data(0)}, {1}, HVDC_SUM);
    VerifyOurs(ctx, buf, &batch, HVDC_SUM, WaitMode::kBlock);
    Completion done;
    for (int i = 0; i < 200; ++i) OursStep(ctx, &batch, &done, WaitMode::kBlock);
    phases.Push(IdlePhase(ctx, "after 200 allreduces", after_seconds, &targets));
  }
  result.Set("phases", phases).Set("targets", targets);
  WriteResult(ctx, result);
  return 0;
}

}  // namespace bench
