#!/usr/bin/env bash
# Where an allreduce's CPU goes, and which system calls it makes (issue 28: kernel time <= 5 % of
# an allreduce's CPU, no system call per steady-state allreduce). Runs hvdc_bench B1 (or B2, B4) at
# np=2 on one host, pinned, twice, with rank 0 under a profiler:
#   1. `perf record -g`: rank 0's samples by thread, each thread's user / kernel split, and the
#      executor thread's top symbols (the executor runs the allreduces, and nothing else);
#   2. `perf trace -s`: rank 0's system calls by thread, divided by the runtime steps the benchmark
#      ran (1 check + warm-up + measured); the main thread's are the references' and the harness's.
#
#   bench/shm_profile.sh [--bench b1|b2|b4] [--steps N] [--transport mpi|tcp] [--out FILE]
#                        [--bin PATH] [-- extra hvdc_bench flags]
# Needs perf (linux-perf) and a Release build of hvdc_bench (bench/run.sh builds build-bench/).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH=b1
STEPS=40
WARMUP=5
TRANSPORT=mpi
OUT=""
BIN="$ROOT/build-bench/bench/hvdc_bench"
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) BENCH=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --transport) TRANSPORT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "shm_profile.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v perf >/dev/null || { echo "shm_profile.sh: perf is not installed" >&2; exit 2; }
[ -x "$BIN" ] || { echo "shm_profile.sh: no $BIN (bench/run.sh --only b4 builds it)" >&2; exit 2; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/hvdc-profile.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
case "$BENCH" in
  b4) ARGS=(b4 --iters "$STEPS" --wait block --sizes 4); RUNTIME_STEPS=$((STEPS + STEPS / 100 + 1)) ;;
  b1|b2) ARGS=("$BENCH" --steps "$STEPS" --warmup "$WARMUP" --no-paced)
         RUNTIME_STEPS=$((1 + WARMUP + STEPS)) ;;
  *) echo "shm_profile.sh: --bench b1, b2 or b4" >&2; exit 2 ;;
esac
[ "$BENCH" = b4 ] && [ "$STEPS" -lt 100 ] && RUNTIME_STEPS=$((STEPS + 10 + 1))
ARGS+=(--transport "$TRANSPORT" --out "$WORK/result.json")
cat > "$WORK/rank.sh" <<SH
#!/usr/bin/env bash
cd "$WORK"
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 0 ]; then exec \$PROFILER "\$@"; else exec "\$@"; fi
SH
chmod +x "$WORK/rank.sh"
run() {  # PROFILER (for rank 0), then the benchmark's output on stdout
  PROFILER="$1" mpirun --bind-to core -np 2 -x PROFILER "$WORK/rank.sh" "$BIN" "${ARGS[@]}" \
    "${EXTRA[@]}"
}

report() {
  echo "== shm_profile: hvdc_bench ${ARGS[*]} ${EXTRA[*]}, np=2 pinned, $(date -u +%FT%TZ)"
  echo "== $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$ROOT" rev-parse --short HEAD)"
  echo
  echo "## 1. perf record -g of rank 0 (runtime steps: $RUNTIME_STEPS)"
  run "perf record -q -g -F 4999 -o $WORK/perf.data" | grep -E "ours|raw|memcpy|B4|B1|B2" || true
  echo
  echo "samples by thread, user vs kernel:"
  perf report -i "$WORK/perf.data" --stdio --no-children -g none --sort comm,dso -q 2>/dev/null |
    awk '{pct=$1; sub("%","",pct); comm=$2; dso=$3; k=(dso=="[kernel.kallsyms]")?"kernel":"user";
          t[comm]+=pct; s[comm" "k]+=pct}
         END {for (c in t) printf "  %-16s %6.2f%% of samples: user %6.2f%%, kernel %6.2f%% (%4.1f%% of the thread)\n",
                c, t[c], s[c" user"], s[c" kernel"], (t[c] > 0 ? 100*s[c" kernel"]/t[c] : 0)}' |
    sort -k2 -rn
  echo
  echo "the executor thread's top symbols:"
  perf report -i "$WORK/perf.data" --stdio --no-children -g none --comm hvdc-exec-0 \
    --sort dso,sym -q 2>/dev/null | head -15
  echo
  echo "## 2. perf trace -s of rank 0: system calls by thread, per runtime step"
  run "perf trace -s -o $WORK/trace.txt" > /dev/null
  awk -v steps="$RUNTIME_STEPS" '
    / \([0-9]+\), [0-9]+ events/ {thread=$1" "$2; sub(",$", "", thread); next}
    $1 ~ /^[a-z_0-9]+$/ && $2 ~ /^[0-9]+$/ && thread != "" && $2 / steps >= 0.01 {
      printf "  %-26s %-16s %9d calls %9.2f per step\n", thread, $1, $2, $2 / steps }' \
    "$WORK/trace.txt" | sort -k6 -rn | head -25
  echo "(hvdc-exec-0 runs the allreduces; hvdc-control negotiates; hvdc_bench threads are the"
  echo " harness's main thread -- the references, barriers and waits -- and MPI's own)"
}

if [ -n "$OUT" ]; then report | tee "$OUT"; else report; fi
