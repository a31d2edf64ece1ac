#!/usr/bin/env bash
# B7 (bench/README.md): the allreduce path through TensorFlow against the core's own figures, in
# one run: hvdc_bench b1, b3, b4 (np=2 pinned; b4 also np=1) before and again after the TF part,
# which is bench/b7_tf_path.py at np=1 (plain python, no launcher: the eager case) and at np=2
# pinned (eager, small_mixed in a tf.function, the ResNet-50 set in tf.functions and through
# DistributedGradientTape, mpi4py beside them); then, when perf is installed, a perf profile of
# rank 0's steady-state loop: eager 4 B at np=2 and np=1, small_mixed in a tf.function at np=2.
# Prints the table with the ratios and writes <out-dir>/b7-np2.json. Usually run through
# `bench/run.sh --only b7`.
#
#   bench/run_b7.sh --bin build-bench/bench/hvdc_bench     (run.sh passes --bin and --out-dir)
#     --python PY      the interpreter whose horovod_compat is measured (default: .venv/bin/python
#                      of this checkout; env B7_PYTHON) -- point it at another worktree's venv for
#                      an A/B; the benchmark scripts stay this checkout's
#     --quick          fewer iterations and no profile (about a minute)
#     --full           more iterations (B4 10,000, eager 10,000, 30 steps)
#     --no-profile     skip the perf profile;  --no-core: skip hvdc_bench (its rows say n/a)
#     --out-dir DIR    default bench/results;  --timeout S per launch (default 300)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${B7_PYTHON:-$ROOT/.venv/bin/python}
BIN=$ROOT/build-bench/bench/hvdc_bench
OUT=$ROOT/bench/results
MODE=default
PROFILE=1
CORE=1
TIMEOUT=300
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) PY=$2; shift ;;
    --bin) BIN=$(realpath -m "$2"); shift ;;
    --out-dir) OUT=$(realpath -m "$2"); shift ;;
    --timeout) TIMEOUT=$2; shift ;;
    --quick) MODE=quick; PROFILE=0 ;;
    --full) MODE=full ;;
    --no-profile) PROFILE=0 ;;
    --no-core) CORE=0 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "run_b7.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ ! -x $PY ]]; then
  echo "run_b7.sh: no python at $PY (scripts/install_python.sh makes .venv)" >&2
  exit 1
fi
if [[ $CORE == 1 && ! -x $BIN ]]; then
  echo "run_b7.sh: no hvdc_bench at $BIN (bench/run.sh builds it; or --no-core)" >&2; exit 1
fi
command -v perf >/dev/null || PROFILE=0

case $MODE in
  quick) B1="--steps 10 --warmup 3 --chunk-reps 3"; B3="--steps 10 --warmup 3"; B4="--iters 1000"
         TF=(--eager-iters 1000 --steps 10 --warmup 3 --resnet-steps 8 --resnet-warmup 2) ;;
  full) B1="--steps 20 --warmup 5 --chunk-reps 5"; B3="--steps 30 --warmup 5"; B4="--iters 10000"
        TF=(--eager-iters 10000 --steps 30 --warmup 5 --resnet-steps 20 --resnet-warmup 5) ;;
  *) B1="--steps 15 --warmup 5 --chunk-reps 3"; B3="--steps 20 --warmup 5"; B4="--iters 3000"
     TF=(--eager-iters 3000 --steps 20 --warmup 5 --resnet-steps 20 --resnet-warmup 3) ;;
esac

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
TMP=$(mktemp -d /tmp/b7.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"
launch() {  # np, command...
  local np=$1; shift
  timeout --kill-after=10 "$((TIMEOUT + 10))" \
    mpirun --timeout "$TIMEOUT" -np "$np" --bind-to core "$@"
}
FAILED=()
step() {  # label, command...: runs it, logs into $TMP/<label>.log, remembers a failure
  local label=$1; shift
  local t0=$SECONDS
  if "$@" >"$TMP/$label.log" 2>&1; then
    echo "  $label: ok ($((SECONDS - t0)) s)"
  else
    echo "  $label: FAILED (exit $?); tail of its log:" >&2
    tail -20 "$TMP/$label.log" >&2
    FAILED+=("$label")
  fi
}

START_UTC=$(date -u +%FT%TZ)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "B7: $START_UTC, $(nproc) cores, load average $LOAD0," \
     "python $PY, hvdc_bench $([[ $CORE == 1 ]] && echo "$BIN" || echo skipped), mode $MODE"
START=$SECONDS
core_runs() {  # file suffix: hvdc_bench b1, b3, b4 at np=2 and b4 at np=1
  [[ $CORE == 1 ]] || return 0
  # shellcheck disable=SC2086
  step "core-b1$1" launch 2 "$BIN" b1 --no-paced $B1 --out "$TMP/core-b1-np2$1.json"
  # shellcheck disable=SC2086
  step "core-b3$1" launch 2 "$BIN" b3 $B3 --out "$TMP/core-b3-np2$1.json"
  # shellcheck disable=SC2086
  step "core-b4$1" launch 2 "$BIN" b4 --sizes 4 --wait block $B4 --out "$TMP/core-b4-np2$1.json"
  # shellcheck disable=SC2086
  step "core-b4-np1$1" launch 1 "$BIN" b4 --sizes 4 --wait block $B4 \
    --out "$TMP/core-b4-np1$1.json"
}

# The core's figures before and after the TF part (the report divides by their mean), so that a
# change of load during the run shows up as a spread instead of a skewed ratio.
core_runs ""
step tf-np1 timeout --kill-after=10 "$TIMEOUT" "$PY" "$ROOT/bench/b7_tf_path.py" "${TF[@]}" \
  --json "$TMP/tf-np1.json"
step tf-np2 launch 2 "$PY" "$ROOT/bench/b7_tf_path.py" "${TF[@]}" --json "$TMP/tf-np2.json"
core_runs -after

if [[ $PROFILE == 1 ]]; then
  # perf record -g attached to rank 0 for its steady-state loop only (b7_tf_path.py
  # --loop-seconds); rank 1 runs the same loop unprofiled.
  # label:part:variant:np; *-identity = the same loop without the runtime (the report
  # subtracts its CPU per call, category by category).
  for spec in eager:eager:hvd:2 eager-identity:eager:identity:2 small:small:hvd:2 \
              small-identity:small:identity:2 eager-np1:eager:hvd:1; do
    IFS=: read -r label part variant np <<< "$spec"
    loop=(--parts "$part" --loop-variant "$variant" --loop-seconds 4
          --perf-out "$TMP/perf-$label.data" --perf-freq 2000)
    if [[ $np == 1 ]]; then
      # Plain python, no launcher, but on one CPU so that perf samples that CPU: attached to
      # an unpinned pid (per-thread events), perf slowed this wake-up-heavy loop down ~2x.
      step "profile-$label" timeout --kill-after=10 "$TIMEOUT" taskset -c 0 "$PY" \
        "$ROOT/bench/b7_tf_path.py" "${loop[@]}"
    else
      step "profile-$label" launch 2 "$PY" "$ROOT/bench/b7_tf_path.py" "${loop[@]}"
    fi
    calls= secs= pid=
    read -r calls secs pid < <(sed -n \
      's/^b7 profile loop: .* x \([0-9]*\) in \([0-9.]*\) s, pid \([0-9]*\)/\1 \2 \3/p' \
      "$TMP/profile-$label.log") || true
    # eager: one call = one 4 B op; small: one call = one tf.function over 1000 tensors.
    if [[ -f $TMP/perf-$label.data && -n ${pid:-} ]]; then
      step "split-$label" "$PY" "$ROOT/bench/b7_profile.py" "$TMP/perf-$label.data" \
        "$TMP/profile-$label.json" --pid "$pid" --seconds "$secs" --freq 2000 --label "$label" \
        --calls "$calls"
    fi
  done
fi

echo
echo "B7 np=2 pinned (np=1 eager: plain python), finished in $((SECONDS - START)) s," \
     "load average now $(cut -d' ' -f1-3 /proc/loadavg)"
rc=0
INFO_FMT='{"start_utc": "%s", "loadavg_start": "%s", "loadavg_end": "%s", "mode": "%s",'
INFO_FMT+=' "seconds": %d, "python": "%s", "hvdc_bench": "%s", "failed": "%s"}'
# shellcheck disable=SC2059
B7_RUN_INFO=$(printf "$INFO_FMT" "$START_UTC" "$LOAD0" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "$MODE" "$((SECONDS - START))" "$PY" "$([[ $CORE == 1 ]] && echo "$BIN")" "${FAILED[*]}") \
  "$PY" "$ROOT/bench/b7_report.py" "$TMP" "$OUT/b7-np2.json" || rc=$?
if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "B7 FAILED: ${FAILED[*]}" >&2
  exit 1
fi
exit "$rc"
