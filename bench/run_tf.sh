#!/usr/bin/env bash
# The benchmarks through TensorFlow (bench/README.md); bench/run.sh runs them for --only b5, b5o
# and b7. Each uses the TensorFlow venv of this checkout (.venv; PY / B7_PYTHON pick another).
#
#   bench/run_tf.sh b5 | b5o | b7 [b7 options]
#
# b5:
# B5 (BENCHMARKS.md): wide-MLP Keras model.fit at np=2 through horovod_compat's DistributedOptimizer
# (hvd), through horovod_compat's HorovodStrategy (strategy) and through
# tf.distribute.MultiWorkerMirroredStrategy (mwms: 2 local workers, RING over gRPC), back to back in
# one run. Prints a table (step median/p90 of each; ratios strategy/MWMS (goal <= 0.55),
# strategy/hvd (goal <= 1.05), hvd/MWMS (target <= 0.8)) and writes bench/results/b5-np2.json.
# A mode that fails is reported (log tail, "failed" in the JSON) and the script exits non-zero
# after running the others.
# MODEL=resnet50 runs the same three modes on a synthetic keras.applications.ResNet50 instead
# (IMAGE x IMAGE inputs, default 64; per-rank batch 16, 3 warm-up + 10 steps, TIMEOUT_S 600;
# writes bench/results/b5-resnet50-np2.json).
# Env: PY (python of the venv), WARMUP (5), STEPS (20), BATCH (per-rank, 32), TIMEOUT_S per mode (240),
#      ORDER ("hvd strategy mwms"), STRATEGY_INPUT ("function" | "global"), MODEL (mlp | resnet50),
#      IMAGE (64), OUT (bench/results/b5-np2.json), EXTRA (more b5_keras.py flags for every mode).
#
# b5o (the ResNet-50 overhead check):
# B5, ResNet-50 overhead check (BENCHMARKS.md): examples/resnet50_synthetic.py at np=2 through the
# runtime (mpirun, one core per rank) against the same script with --no-horovod, two independent
# processes pinned to the same cores at the same time: the same compute, no communication.
# ROUNDS alternating rounds (ours, baseline); prints per-rank img/sec of each and the ratio.
# Env: PY (.venv python), IMAGE (64), BATCH (16), ITERS (5), PER_ITER (5), ROUNDS (2), TIMEOUT_S (600).
#
# b7:
# B7 (bench/README.md): the allreduce path through TensorFlow against the core's own figures, in
# one run: hvdc_bench b1, b3, b4 (np=2 pinned; b4 also np=1) before and again after the TF part,
# which is bench/b7_tf_path.py at np=1 (plain python, no launcher: the eager case) and at np=2
# pinned (eager, small_mixed in a tf.function, the ResNet-50 set in tf.functions and through
# DistributedGradientTape, mpi4py beside them); then, when perf is installed, a perf profile of
# rank 0's steady-state loop: eager 4 B at np=2 and np=1, small_mixed in a tf.function at np=2.
# Prints the table with the ratios and writes <out-dir>/b7-np2.json. Usually run through
# `bench/run.sh --only b7`.
#
#   bench/run_tf.sh b7 --bin build-bench/bench/hvdc_bench  (run.sh passes --bin and --out-dir)
#     --python PY      the interpreter whose horovod_compat is measured (default: .venv/bin/python
#                      of this checkout; env B7_PYTHON) -- point it at another checkout's venv for
#                      an A/B; the benchmark scripts stay this checkout's
#     --quick          fewer iterations and no profile (about a minute)
#     --full           more iterations (B4 10,000, eager 10,000, 30 steps)
#     --no-profile     skip the perf profile;  --no-core: skip hvdc_bench (its rows say n/a)
#     --out-dir DIR    default bench/results;  --timeout S per launch (default 300)
# shellcheck disable=SC2317  # the modes' functions are called by name ("run_$m", "$what")
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELP_B7='30,46p'

need_python() {
  [[ -x $PY ]] || {
    echo "run_tf.sh $1: no python at $PY (scripts/install_python.sh makes .venv; PY picks another)" >&2
    exit 1
  }
}

b5() {
  cd "$ROOT"
  PY="${PY:-$ROOT/.venv/bin/python}"
  need_python b5
  MODEL="${MODEL:-mlp}"
  read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
  if [[ $MODEL == resnet50 ]]; then
    WARMUP="${WARMUP:-3}"; STEPS="${STEPS:-10}"; BATCH="${BATCH:-16}"; TIMEOUT_S="${TIMEOUT_S:-600}"
    OUT="${OUT:-$ROOT/bench/results/b5-resnet50-np2.json}"
    EXTRA_ARGS+=(--model resnet50 --image-size "${IMAGE:-64}")
  elif [[ $MODEL == mlp ]]; then
    WARMUP="${WARMUP:-5}"; STEPS="${STEPS:-20}"; BATCH="${BATCH:-32}"; TIMEOUT_S="${TIMEOUT_S:-240}"
    OUT="${OUT:-$ROOT/bench/results/b5-np2.json}"
  else
    echo "run_tf.sh b5: MODEL must be mlp or resnet50" >&2; exit 2
  fi
  ORDER="${ORDER:-hvd strategy mwms}"
  STRATEGY_INPUT="${STRATEGY_INPUT:-function}"
  mkdir -p "$(dirname "$OUT")"
  TMP="$(mktemp -d -t b5.XXXXXX)"
  trap 'rm -rf "$TMP"' EXIT
  COMMON=(--batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS" "${EXTRA_ARGS[@]}")
  LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
  START="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

  under_mpirun() {  # mode, extra flags...
    local mode="$1"; shift
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2 \
      timeout --kill-after=10 "$TIMEOUT_S" mpirun --timeout "$((TIMEOUT_S - 5))" --bind-to none -np 2 \
      "$PY" bench/b5_keras.py --mode "$mode" "${COMMON[@]}" "$@" --json "$TMP/$mode.json"
  }
  run_hvd() { under_mpirun hvd; }
  run_strategy() { under_mpirun strategy --strategy-input "$STRATEGY_INPUT"; }
  run_mwms() {
    TF_CPP_MIN_LOG_LEVEL=2 timeout --kill-after=10 "$TIMEOUT_S" \
      "$PY" bench/b5_keras.py --mode mwms "${COMMON[@]}" --worker-timeout "$((TIMEOUT_S - 10))" \
      --json "$TMP/mwms.json"
  }
  FAILED=()
  for m in $ORDER; do
    rc=0
    "run_$m" >"$TMP/$m.log" 2>&1 || rc=$?
    if [[ $rc != 0 ]]; then
      echo "b5: $m run failed (rc=$rc); tail of log:" >&2
      tail -30 "$TMP/$m.log" >&2
      tail -30 "$TMP/$m.log" >"$TMP/$m.tail"
      echo "$rc" >"$TMP/$m.rc"
      rm -f "$TMP/$m.json"
      FAILED+=("$m")
    fi
    grep '^b5 ' "$TMP/$m.log" || true
  done

  rc=0
  "$PY" - "$TMP" "$OUT" "$START" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$ORDER" <<'PYEOF' || rc=$?
import json, sys, platform, os
tmp, out, start, load0, load1, order = sys.argv[1:7]
modes = order.split()
runs, failed = {}, {}
for m in modes:
    p = os.path.join(tmp, m + ".json")
    if os.path.exists(p):
        runs[m] = json.load(open(p))
    else:
        rcf, tail = os.path.join(tmp, m + ".rc"), os.path.join(tmp, m + ".tail")
        failed[m] = {"failed": True,
                     "rc": int(open(rcf).read()) if os.path.exists(rcf) else None,
                     "log_tail": open(tail).read() if os.path.exists(tail) else ""}

def ratio(a, b, which="rank0"):
    if a not in runs or b not in runs:
        return None
    return {k: runs[a][which][k] / runs[b][which][k] for k in ("median_ms", "p90_ms")}

# (numerator, denominator, goal on the median ratio)
GOALS = [("strategy", "mwms", 0.55), ("strategy", "hvd", 1.05), ("hvd", "mwms", 0.8)]
ratios, ratios_max, verdicts = {}, {}, {}
for a, b, goal in GOALS:
    r = ratio(a, b)
    if r is None:
        continue
    key = f"{a}_over_{b}"
    ratios[key] = r
    ratios_max[key] = ratio(a, b, "max_over_ranks")
    verdicts[key] = {"goal_median_ratio_le": goal, "met": r["median_ms"] <= goal}
ref = runs.get("hvd") or next(iter(runs.values()), None)
rel = {}
if ref is not None:
    for m, r in runs.items():
        rel[m] = max(abs(a - b) / max(abs(b), 1e-30)
                     for a, b in zip(r["weight_checksum"], ref["weight_checksum"]))
ok = all(r["weights_identical_across_ranks"] for r in runs.values())
res = {"benchmark": "B5", "np": 2, "start_utc": start, "host_cpus": os.cpu_count(),
       "loadavg_before": load0, "loadavg_after": load1, "python": platform.python_version(),
       "order": modes}
res.update(runs)
res.update(failed)
res.update({"ratios": ratios, "ratios_max_over_ranks": ratios_max, "goals": verdicts,
            "weights_identical_across_ranks": ok,
            "final_weight_checksum_rel_diff_vs_" + ("hvd" if "hvd" in runs else "first"): rel,
            "failed_modes": sorted(failed)})
if "hvd_over_mwms" in ratios:  # the keys of the two-mode version of this file
    res["ratio_ours_over_mwms"] = ratios["hvd_over_mwms"]
    res["target_ratio"] = 0.8
    res["meets_target"] = verdicts["hvd_over_mwms"]["met"]
json.dump(res, open(out, "w"), indent=1)
print()
if ref is not None:
    what = ("wide MLP" if ref["model"] == "mlp" else
            f"ResNet-50 {ref['image_size']}x{ref['image_size']}")
    print(f"B5 np=2: {what} {ref['params']/1e6:.1f} M params ({ref['grad_bytes']/2**20:.1f} MiB "
          f"grads), global batch {ref['global_batch']}, {ref['warmup']} warm-up + {ref['steps']} "
          f"measured steps, loadavg {load0} -> {load1}")
names = {"hvd": "horovod_compat DistributedOptimizer", "strategy": "horovod_compat HorovodStrategy",
         "mwms": "TF MultiWorkerMirrored (ring)"}
print(f"{'runtime (rank-0 step times)':<38}{'median ms':>11}{'p90 ms':>10}{'mean ms':>10}")
for m in modes:
    if m in runs:
        s = runs[m]["rank0"]
        print(f"{names[m]:<38}{s['median_ms']:>11.1f}{s['p90_ms']:>10.1f}{s['mean_ms']:>10.1f}")
    else:
        print(f"{names[m]:<38}{'FAILED (rc=' + str(failed[m]['rc']) + ')':>31}")
for a, b, goal in GOALS:
    key = f"{a}_over_{b}"
    if key in ratios:
        r = ratios[key]
        print(f"{'ratio ' + a + '/' + b:<38}{r['median_ms']:>11.3f}{r['p90_ms']:>10.3f}"
              f"   goal <= {goal:.2f}: {'MET' if verdicts[key]['met'] else 'NOT MET'}")
print(f"weights identical across ranks: {ok}; final-weight checksum rel diff vs "
      f"{'hvd' if 'hvd' in runs else 'first run'}: "
      + ", ".join(f"{m} {v:.2e}" for m, v in rel.items()))
print(f"wrote {out}")
sys.exit(0 if ok else 3)
PYEOF
  if [[ ${#FAILED[@]} -gt 0 ]]; then
    echo "b5: failed modes: ${FAILED[*]}" >&2
    exit 1
  fi
  exit "$rc"
}

b5o() {
  cd "$ROOT"
  PY="${PY:-$ROOT/.venv/bin/python}"
  need_python b5o
  IMAGE="${IMAGE:-64}"; BATCH="${BATCH:-16}"; ITERS="${ITERS:-5}"; PER_ITER="${PER_ITER:-5}"
  ROUNDS="${ROUNDS:-2}"; TIMEOUT_S="${TIMEOUT_S:-600}"
  export TF_CPP_MIN_LOG_LEVEL=3 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1
  ARGS=(examples/resnet50_synthetic.py --image-size "$IMAGE" --batch-size "$BATCH"
        --num-warmup-batches 3 --num-batches-per-iter "$PER_ITER" --num-iters "$ITERS")
  TMP="$(mktemp -d -t b5r.XXXXXX)"
  trap 'rm -rf "$TMP"' EXIT
  per_rank() { grep -o 'Img/sec per rank: [0-9.]*' "$1" | awk '{print $4}'; }

  echo "B5 ResNet-50 overhead: ${IMAGE}x${IMAGE}, batch $BATCH per rank, 1 TF thread per rank;" \
       "load $(cut -d' ' -f1-3 /proc/loadavg)"
  for round in $(seq "$ROUNDS"); do
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$TIMEOUT_S" \
      mpirun --timeout "$((TIMEOUT_S - 10))" --bind-to core -np 2 \
      -x TF_CPP_MIN_LOG_LEVEL -x TF_NUM_INTRAOP_THREADS -x TF_NUM_INTEROP_THREADS \
      "$PY" "${ARGS[@]}" >"$TMP/ours.log" 2>&1 || { tail -20 "$TMP/ours.log"; exit 1; }
    for core in 0 1; do
      timeout "$TIMEOUT_S" taskset -c "$core" "$PY" "${ARGS[@]}" --no-horovod \
        >"$TMP/base$core.log" 2>&1 &
    done
    wait
    ours=$(per_rank "$TMP/ours.log"); b0=$(per_rank "$TMP/base0.log"); b1=$(per_rank "$TMP/base1.log")
    python3 -c "
ours, base = $ours, ($b0 + $b1) / 2
print(f'round $round: ours {ours:.2f} img/sec per rank (rank 0); without the runtime {base:.2f}'
      f' (mean of the two processes); ours/without = {ours / base:.3f}')"
  done
}

b7() {

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
      -h|--help) sed -n "$HELP_B7" "$0"; exit 0 ;;
      *) echo "run_tf.sh b7: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
  done
  if [[ ! -x $PY ]]; then
    echo "run_tf.sh b7: no python at $PY (scripts/install_python.sh makes .venv)" >&2
    exit 1
  fi
  if [[ $CORE == 1 && ! -x $BIN ]]; then
    echo "run_tf.sh b7: no hvdc_bench at $BIN (bench/run.sh builds it; or --no-core)" >&2; exit 1
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
  TMP=$(mktemp -d -t b7.XXXXXX)
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
      calls='' secs='' pid=''
      read -r calls secs pid < <(sed -n \
        's/^b7 profile loop: .* x \([0-9]*\) in \([0-9.]*\) s, pid \([0-9]*\)/\1 \2 \3/p' \
        "$TMP/profile-$label.log") || true
      # eager: one call = one 4 B op; small: one call = one tf.function over 1000 tensors.
      if [[ -f $TMP/perf-$label.data && -n ${pid:-} ]]; then
        step "split-$label" "$PY" "$ROOT/bench/b7_report.py" profile "$TMP/perf-$label.data" \
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
}

case ${1:-} in
  b5|b5o|b7) what=$1; shift; "$what" "$@" ;;
  -h|--help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d'; exit 0 ;;
  *) echo "run_tf.sh: expected b5, b5o or b7 (see --help)" >&2; exit 2 ;;
esac
