// hvdc_bench: the benchmarks of BENCHMARKS.md as subcommands of one MPI program.
//
//   mpirun --bind-to core -np 2 hvdc_bench <b0|b1|b2|b3|b4|b4i|b6> [--flags]
//
// Every subcommand initialises MPI itself (MPI_THREAD_MULTIPLE), then the runtime (which borrows
// that MPI), measures the runtime and its raw-MPI reference in the same run, prints a table on
// rank 0 and writes a JSON file (--out, default bench/results/<name>-np<N>.json).
//
// --transport tcp: the runtime runs over its TCP transport instead (HOROVOD_CONTROLLER=gloo,
// HVDC_TCP_PEERS agreed over MPI before hvdc_init; --tcp-address ADDR / --tcp-iface IF choose the
// address, default 127.0.0.1); mpirun stays the launcher and carries the raw reference. Results go
// to bench/results/<name>-tcp-np<N>.json. bench/run.sh --transport tcp also restricts that MPI to
// TCP (--mca pml ob1 --mca btl tcp,self).
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/benchmarks.h"
#include "bench/common.h"
#include "bench/mpi_count.h"
#include "bench/tcp_world.h"

namespace {

struct Command {
  const char* name;
  int (*run)(bench::Context&);
  const char* help;
};

const Command kCommands[] = {
    {"b0", bench::RunB0,
     "raw MPI_Allreduce sweep (+ ours per size), best-chunked raw per tensor set,"
     " memcpy floor  [--max-bytes 256M --sets resnet50_keras,bert_base"
     " --no-ours --chunk-reps 10]"},
    {"b1", bench::RunB1,
     "resnet50_keras.txt all at once + paced (B1p)  [--set --steps 20 --warmup 5"
     " --op sum|average --wait block|yield --no-paced --pace busy,sleep --chunk-reps 10]"},
    {"b2", bench::RunB2, "bert_base.txt all at once  [same flags as b1; --paced adds B2p]"},
    {"b3", bench::RunB3,
     "small_mixed.txt and 2000 x 1 KiB: us per tensor, collectives issued"
     "  [--steps 20 --warmup 5 --count 2000 --bytes 1K]"},
    {"b4", bench::RunB4,
     "single 4 B and 1 KiB allreduce latency  [--iters 10000 --sizes 4,1K"
     " --wait block,yield]"},
    {"b4i", bench::RunB4i, "CPU of the runtime's threads while idle  [--seconds 10]"},
    {"b6", bench::RunB6,
     "peak RSS minus the rank's own tensors  [--sets resnet50_keras,bert_base"
     " --steps 10]"},
};

void Usage() {
  std::fprintf(stderr, "usage: mpirun [...] hvdc_bench <command> [--out FILE] [flags]\n");
  for (const auto& c : kCommands) std::fprintf(stderr, "  %-4s %s\n", c.name, c.help);
  std::fprintf(
      stderr,
      "common flags: --out FILE  --tensor-dir DIR  --fusion-threshold BYTES (sets "
      "HOROVOD_FUSION_THRESHOLD)  --cycle-time-ms MS (sets HOROVOD_CYCLE_TIME)\n"
      "  --transport mpi|tcp (tcp: the runtime over its TCP transport, ports agreed over MPI;"
      " --tcp-address ADDR, --tcp-iface IF; default 127.0.0.1)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    Usage();
    return 2;
  }
  const Command* cmd = nullptr;
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) cmd = &c;
  }
  if (!cmd) {
    Usage();
    return 2;
  }
  bench::Options opts(argc - 2, argv + 2);

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  bench::Context ctx;
  ctx.name = cmd->name;
  ctx.opts = &opts;
  MPI_Comm_dup(MPI_COMM_WORLD, &ctx.comm);
  bench::SetUncountedComm(ctx.comm);
  MPI_Comm_rank(ctx.comm, &ctx.rank);
  MPI_Comm_size(ctx.comm, &ctx.size);
  ctx.cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ctx.cpus_allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : ctx.cores;
  ctx.oversubscribed = ctx.size > ctx.cores;
  if (provided < MPI_THREAD_MULTIPLE) {
    bench::Log(ctx, "warning: MPI provides thread level %d, not MPI_THREAD_MULTIPLE\n", provided);
  }

  // Knobs the runtime reads from its environment at init.
  if (opts.Has("fusion-threshold")) {
    setenv("HOROVOD_FUSION_THRESHOLD", std::to_string(opts.Int("fusion-threshold", 0)).c_str(), 1);
  }
  if (opts.Has("cycle-time-ms"))
    setenv("HOROVOD_CYCLE_TIME", opts.Str("cycle-time-ms", "").c_str(), 1);

  const std::string transport = opts.Str("transport", "mpi");
  int reserved_port_fd = -1;
  if (transport == "tcp") {
    reserved_port_fd = bench::SetUpTcpWorld(ctx);
  } else if (transport != "mpi") {
    bench::Fail(ctx, "--transport %s: expected mpi or tcp", transport.c_str());
  }

  ctx.pre_runtime_tids = bench::ThreadIds();
  ctx.rss_after_mpi_init_kib = bench::ReadStatusKiB("VmRSS:");
  MPI_Barrier(ctx.comm);
  double t0 = MPI_Wtime();
  int rc = hvdc_init(nullptr);
  ctx.init_seconds = MPI_Wtime() - t0;
  bench::ReleaseTcpPort(reserved_port_fd);  // the runtime listens on it now
  if (rc != HVDC_OK) bench::Fail(ctx, "hvdc_init returned %d: %s", rc, hvdc_last_error());
  if ((transport == "tcp") != (hvdc_gloo_enabled() == 1)) {
    bench::Fail(ctx, "asked for --transport %s, but the runtime runs over %s", transport.c_str(),
                hvdc_gloo_enabled() == 1 ? "TCP" : (hvdc_mpi_enabled() == 1 ? "MPI" : "neither"));
  }
  ctx.rss_after_hvdc_init_kib = bench::ReadStatusKiB("VmRSS:");
  if (hvdc_size() != ctx.size || hvdc_rank() != ctx.rank) {
    bench::Fail(ctx, "runtime sees rank %d of %d, MPI says %d of %d", hvdc_rank(), hvdc_size(),
                ctx.rank, ctx.size);
  }
  bench::Log(ctx, "== %s  np=%d%s  runtime %s  (hvdc_init %.1f ms)\n", ctx.name.c_str(), ctx.size,
             ctx.oversubscribed ? " (oversubscribed)" : (ctx.cpus_allowed == 1 ? " (pinned)" : ""),
             hvdc_version() ? hvdc_version() : "?", ctx.init_seconds * 1e3);
  bench::Log(ctx, "   runtime over %s; raw reference MPI: %s\n",
             transport == "tcp" ? ("TCP, HVDC_TCP_PEERS=" + ctx.tcp_peers).c_str() : "MPI",
             bench::RawMpiTransport().c_str());

  int result = cmd->run(ctx);

  MPI_Barrier(ctx.comm);
  rc = hvdc_shutdown();
  if (rc != HVDC_OK) {
    std::fprintf(stderr, "[rank %d] hvdc_shutdown returned %d: %s\n", ctx.rank, rc,
                 hvdc_last_error());
    result = result ? result : 1;
  }
  MPI_Comm_free(&ctx.comm);
  MPI_Finalize();
  return result;
}
