#!/usr/bin/env bash
# Runs the benchmark suite (bench/README.md): builds hvdc_bench if needed, runs B0, B1 (+B1p), B2,
# B3, B4, B4i and B6 at np=2 pinned (the headline), optionally np=3 and 4 oversubscribed, then B7
# (the path through TensorFlow) when a python with horovod_compat's TF ops is there; prints each
# benchmark's table and leaves one JSON file per benchmark and np in the results folder.
#
#   bench/run.sh                 quick counts (a few minutes on the 2-core machine; B7 ~2.5 min
#                                more, skipped with a note when .venv / B7_PYTHON is missing)
#   bench/run.sh --full          the counts BENCHMARKS.md asks for (B4: 10,000 iterations, ...)
#   bench/run.sh --np-extra      also np=3 and np=4, oversubscribed
#   bench/run.sh --only b1,b4    a subset of b0 b1 b2 b3 b4 b4i b6 (hvdc_bench) and b5 b5o b7 b8 b9
#                                (through TensorFlow: bench/run_tf.sh, with .venv or PY/B7_PYTHON)
#   bench/run.sh --only b7       B7 alone, the path through TensorFlow (runs hvdc_bench b1/b3/b4
#                                itself, then the TF ops); --quick: fewer iterations, no profile
#   bench/run.sh --only b8       B8, the runtime's cost to the model on every launch path:
#                                ResNet-50 64x64 at np=2 through horovodrun (mpirun, --gloo
#                                pinned and unpinned), plain mpirun (as is, --bind-to none, bound
#                                with yield), TF_CONFIG, against the same compute without the
#                                runtime, alternating rounds, with each rank's CPU split by thread
#                                (bench/b8_overhead.py; estimated ~45 s per path and round: 3
#                                rounds of 9 paths, ~20 min). --rounds N: N rounds; --quick: a
#                                smoke run (one round, MobileNetV3Small 32x32; bound by the
#                                start-up of 9 paths: 15 min on the 2-core VM at load 15, a few
#                                on a quiet one)
#   bench/run.sh --only b9       B9, what elasticity costs (bench/b9_elastic.py): real horovodrun
#                                elastic jobs on this machine's aliases -- a worker SIGKILLed to
#                                the survivors' next step, a discovered worker's join split into
#                                discovery, start-up, the others' next commit and the join's own
#                                cost, and the step time elastic vs static; never in the default
#                                list. --quick: a smoke run (few steps, small tensors)
#   bench/run.sh --only b5,b5o   B5 (Keras model.fit: ours vs MultiWorkerMirroredStrategy;
#                                MODEL=resnet50 for ResNet-50) and the ResNet-50 overhead check;
#                                never in the default list (minutes each)
#   bench/run.sh --build-dir DIR use (or make) that build; default build-bench at the repo root
#   bench/run.sh --bin PATH      run that hvdc_bench binary, build nothing
#   bench/run.sh --out-dir DIR   where the JSON goes; default bench/results
#   bench/run.sh --transport tcp the runtime over its TCP transport (ports agreed over MPI), the
#                                raw reference over Open MPI's TCP BTL, both on loopback
#                                (--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo);
#                                JSON as <b>-tcp-np<N>.json.  --tcp-iface IF: both on IF instead.
#                                With b1, b3 or b4 it also runs torch.distributed's gloo backend
#                                on the same work (bench/torch_gloo.py, <b>-torchgloo-np2.json)
#                                where a python with torch is found: --torch-python PATH, else
#                                $TORCH_PYTHON, else the reference venv (bench/make_reference_venv.sh:
#                                $HVDC_BENCH_VENV, else .venv-bench at the repo root); each right
#                                after ours and raw MPI's run of the same benchmark, pinned as
#                                ours; --torch-bind none: unpinned instead (JSON as
#                                <b>-torchgloo-unpinned-np2.json); --no-torch: not at all
#   bench/run.sh -- --op average extra flags for every benchmark
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-bench
OUT=$ROOT/bench/results
FULL=0
NP_EXTRA=0
ONLY=b0,b1,b2,b3,b4,b4i,b6,b7,b8
ONLY_GIVEN=0
TIMEOUT=900
EXTRA=()
B7_ARGS=()
B8_ARGS=()
B9_ARGS=()
BIN=
TRANSPORT=mpi
TCP_IFACE=lo
REF_VENV=${HVDC_BENCH_VENV:-$ROOT/.venv-bench}
TORCH_PY=${TORCH_PYTHON:-$REF_VENV/bin/python}
RUN_TORCH=1
TORCH_BIND=core

while [[ $# -gt 0 ]]; do
  case $1 in
    --full) FULL=1 ;;
    --np-extra) NP_EXTRA=1 ;;
    --only) ONLY=$2; ONLY_GIVEN=1; shift ;;
    --quick) B7_ARGS+=(--quick); B8_ARGS+=(--quick); B9_ARGS+=(--quick) ;;
    --rounds) B8_ARGS+=(--rounds "$2"); shift ;;
    --build-dir) BUILD=$(realpath -m "$2"); shift ;;
    --bin) BIN=$(realpath -m "$2"); shift ;;
    --out-dir) OUT=$(realpath -m "$2"); shift ;;
    --timeout) TIMEOUT=$2; shift ;;
    --transport) TRANSPORT=$2; shift ;;
    --tcp-iface) TCP_IFACE=$2; shift ;;
    --torch-python) TORCH_PY=$2; shift ;;
    --no-torch) RUN_TORCH=0 ;;
    --torch-bind) TORCH_BIND=$2; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# B5 and B7 have their own driver (bench/run_tf.sh: TensorFlow, mpi4py; B7 its own hvdc_bench
# runs); the rest are hvdc_bench's.
take() {  # removes $1 from ONLY; true if it was there
  [[ ,$ONLY, == *,$1,* ]] || return 1
  ONLY=$(echo ",$ONLY," | sed "s/,$1,/,/g; s/^,//; s/,\$//")
}
RUN_B5=0 RUN_B5O=0 RUN_B7=0 RUN_B8=0 RUN_B9=0
take b9 && RUN_B9=1  # only when asked for: never in the default list
take b5 && RUN_B5=1
take b5o && RUN_B5O=1
if take b8; then
  RUN_B8=1
  B8_PY=${B8_PYTHON:-${B7_PYTHON:-$ROOT/.venv/bin/python}}
  if [[ $ONLY_GIVEN == 0 && $TRANSPORT != mpi ]]; then
    RUN_B8=0  # B8 runs every launch path itself, once
  elif [[ $ONLY_GIVEN == 0 ]] && ! "$B8_PY" -c 'import tensorflow' >/dev/null 2>&1; then
    echo "run.sh: skipping b8: no python with TensorFlow at $B8_PY (scripts/install_python.sh" \
      "makes .venv; B8_PYTHON picks another)"
    RUN_B8=0
  fi
fi
if take b7; then
  RUN_B7=1
  # In the default list B7 needs the TF venv; asked for by name, run_tf.sh reports its absence.
  B7_PY=${B7_PYTHON:-$ROOT/.venv/bin/python}
  if [[ $ONLY_GIVEN == 0 && $TRANSPORT != mpi ]]; then
    RUN_B7=0  # B7 runs over MPI only
  elif [[ $ONLY_GIVEN == 0 ]] && ! "$B7_PY" -c 'import tensorflow' >/dev/null 2>&1; then
    echo "run.sh: skipping b7: no python with TensorFlow at $B7_PY (scripts/install_python.sh" \
      "makes .venv; B7_PYTHON picks another)"
    RUN_B7=0
  fi
fi

case $TRANSPORT in
  mpi) TAG= ; TRANSPORT_MCA=() ;;
  # Both sides over the same TCP interface (lo by default): Open MPI with ob1 (not UCX) and only
  # the TCP and self BTLs on it (its TCP BTL skips 127.0.0.0/8 unless told), the runtime
  # listening on that interface's address.
  tcp) TAG=-tcp
       TRANSPORT_MCA=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$TCP_IFACE")
       EXTRA=(--transport tcp --tcp-iface "$TCP_IFACE" "${EXTRA[@]}") ;;
  *) echo "run.sh: --transport $TRANSPORT: expected mpi or tcp" >&2; exit 2 ;;
esac

# ---- build (2 cores: -j2 at most); B5 alone needs no hvdc_bench
if [[ -z $BIN && ( -n $ONLY || $RUN_B7 == 1 ) ]]; then
  if [[ ! -f $BUILD/build.ninja ]]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
  ninja -C "$BUILD" -j2 hvdc_bench
  BIN=$BUILD/bench/hvdc_bench
fi
[[ -z $ONLY && $RUN_B7 == 0 ]] || [[ -x $BIN ]] || { echo "run.sh: $BIN was not built" >&2; exit 1; }
mkdir -p "$OUT"

# As root, Open MPI refuses to start without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Per-benchmark flags: quick by default, the spec's counts with --full.
flags() {
  local b=$1 np=$2
  if [[ $FULL == 1 ]]; then
    case $b in
      b0) echo "--chunk-reps 10" ;;
      b1|b2) echo "--steps 20 --warmup 5 --chunk-reps 10" ;;
      b4) echo "--iters 10000" ;;
      b4i) echo "--seconds 10 --after-work-seconds 10" ;;
      *) echo "" ;;
    esac
  else
    local maxb=64M
    [[ $np -gt 2 ]] && maxb=16M
    case $b in
      # B2 measures bert_base's best chunk itself; B0 keeps to the smaller set here.
      b0) echo "--max-bytes $maxb --chunk-reps 5 --max-iters 500 --sets resnet50_keras" ;;
      b1) echo "--steps 20 --warmup 5 --chunk-reps 5" ;;
      b2) echo "--steps 20 --warmup 5 --chunk-reps 3" ;;
      b3) echo "--steps 20 --warmup 5" ;;
      b4i) echo "--seconds 10 --after-work-seconds 3" ;;
      b6) echo "--steps 5" ;;
    esac
  fi
}

run_np() {
  local np=$1
  local launch=(mpirun --timeout "$TIMEOUT" -np "$np" "${TRANSPORT_MCA[@]}")
  if [[ $np -le $(nproc) ]]; then
    launch+=(--bind-to core)
  else
    # Open MPI 4.1 refuses to bind more ranks than cores; busy-polling oversubscribed ranks need
    # to yield.
    launch+=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
  fi
  local b
  for b in ${ONLY//,/ }; do
    echo
    echo "################ $b  np=$np  $( [[ $np -gt $(nproc) ]] && echo oversubscribed || echo pinned )  transport $TRANSPORT"
    # shellcheck disable=SC2046
    "${launch[@]}" "$BIN" "$b" --out "$OUT/$b$TAG-np$np.json" $(flags "$b" "$np") "${EXTRA[@]}" ||
      { echo "run.sh: $b at np=$np FAILED (exit $?)" >&2; FAILED+=("$b$TAG-np$np"); }
    if [[ $TRANSPORT == tcp && $RUN_TORCH == 1 && $np == 2 ]]; then
      run_torch "$b"
    fi
  done
}

# torch.distributed's gloo backend on B1/B3/B4's work over the same interface (TCP runs at np=2
# only, pinned as ours), right after hvdc_bench's run of the same benchmark: a benchmark-only
# comparison, skipped where torch is not importable.
TORCH_OK=
run_torch() {
  local b=$1 tflags=() bind=(--bind-to core) pinned=pinned
  if [[ $TORCH_BIND == none ]]; then
    bind=(--bind-to none) pinned=unpinned
    tflags+=(--tag=-unpinned)
  fi
  case $b in
    b1) tflags+=(--steps 20 --warmup 5 --chunk-reps "$([[ $FULL == 1 ]] && echo 10 || echo 5)") ;;
    # gloo's per-tensor B3 takes ~2 ms a tensor here: fewer steps keep the run in minutes.
    b3) tflags+=(--steps 10 --warmup 2) ;;
    b4) tflags+=(--iters 10000) ;;
    *) return 0 ;;
  esac
  if [[ -z $TORCH_OK ]]; then
    TORCH_OK=no
    [[ -x $TORCH_PY ]] &&
      "$TORCH_PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null &&
      TORCH_OK=yes
    if [[ $TORCH_OK != yes ]]; then
      echo
      echo "torch.distributed gloo: skipped (no torch): $TORCH_PY cannot import torch.distributed" \
           "with gloo (bench/make_reference_venv.sh makes $REF_VENV; --torch-python PATH or" \
           "TORCH_PYTHON picks another python)"
    fi
  fi
  [[ $TORCH_OK == yes ]] || return 0
  echo
  echo "################ $b  np=2 $pinned  torch.distributed gloo over $TCP_IFACE"
  mpirun --timeout "$TIMEOUT" -np 2 "${bind[@]}" "$TORCH_PY" "$ROOT/bench/torch_gloo.py" "$b" \
    --out-dir "$OUT" --iface "$TCP_IFACE" "${tflags[@]}" ||
    { echo "run.sh: torch gloo $b FAILED (exit $?)" >&2; FAILED+=("$b-torchgloo-np2"); }
}

FAILED=()
echo "hvdc_bench suite: $(date -u +%FT%TZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), transport $TRANSPORT${TRANSPORT_MCA[*]:+ (mpirun ${TRANSPORT_MCA[*]})}"
START=$SECONDS
if [[ -n $ONLY ]]; then
  run_np 2
  if [[ $NP_EXTRA == 1 ]]; then
    run_np 3
    run_np 4
  fi
fi
if [[ $RUN_B7 == 1 ]]; then
  echo
  echo "################ b7  np=2 pinned (and np=1)  transport mpi"
  [[ $FULL == 1 ]] && B7_ARGS+=(--full)
  [[ $TRANSPORT == mpi ]] || echo "run.sh: b7 runs over MPI only (--transport $TRANSPORT ignored)"
  "$ROOT/bench/run_tf.sh" b7 --bin "$BIN" --out-dir "$OUT" \
    --timeout "$((TIMEOUT < 300 ? TIMEOUT : 300))" \
    "${B7_ARGS[@]}" || { echo "run.sh: b7 FAILED" >&2; FAILED+=(b7); }
fi
if [[ $RUN_B8 == 1 ]]; then
  echo
  echo "################ b8  np=2  every launch path vs the same compute without the runtime"
  [[ $TRANSPORT == mpi ]] || echo "run.sh: b8 runs every launch path itself (--transport $TRANSPORT ignored)"
  if [[ -x $B8_PY ]]; then
    "$B8_PY" "$ROOT/bench/b8_overhead.py" run --python "$B8_PY" --json "$OUT/b8-np2.json" \
      --timeout "$((TIMEOUT < 600 ? TIMEOUT : 600))" "${B8_ARGS[@]}" ||
      { echo "run.sh: b8 FAILED" >&2; FAILED+=(b8); }
  else
    echo "run.sh: b8: no python at $B8_PY (scripts/install_python.sh makes .venv;" \
      "B8_PYTHON picks another)" >&2
    FAILED+=(b8)
  fi
fi
if [[ $RUN_B9 == 1 ]]; then
  echo
  echo "################ b9  elastic: a lost worker, a joining worker, steps elastic vs static"
  [[ $TRANSPORT == mpi ]] || echo "run.sh: b9 runs its own elastic jobs (--transport $TRANSPORT ignored)"
  B9_PY=${B9_PYTHON:-${B7_PYTHON:-$ROOT/.venv/bin/python}}
  if [[ -x $B9_PY ]]; then
    "$B9_PY" "$ROOT/bench/b9_elastic.py" run --python "$B9_PY" --json "$OUT/b9-elastic.json" \
      --timeout "$((TIMEOUT < 600 ? TIMEOUT : 600))" "${B9_ARGS[@]}" ||
      { echo "run.sh: b9 FAILED" >&2; FAILED+=(b9); }
  else
    echo "run.sh: b9: no python at $B9_PY (scripts/install_python.sh makes .venv;" \
      "B9_PYTHON picks another)" >&2
    FAILED+=(b9)
  fi
fi
if [[ $RUN_B5 == 1 ]]; then
  echo
  echo "################ b5  np=2 (MODEL=${MODEL:-mlp})  transport mpi"
  b5_json=$OUT/b5-np2.json
  [[ ${MODEL:-mlp} == resnet50 ]] && b5_json=$OUT/b5-resnet50-np2.json
  OUT=$b5_json "$ROOT/bench/run_tf.sh" b5 || { echo "run.sh: b5 FAILED" >&2; FAILED+=(b5); }
fi
if [[ $RUN_B5O == 1 ]]; then
  echo
  echo "################ b5o  np=2 pinned  ResNet-50 overhead check"
  "$ROOT/bench/run_tf.sh" b5o || { echo "run.sh: b5o FAILED" >&2; FAILED+=(b5o); }
fi
echo
echo "suite finished in $((SECONDS - START)) s; JSON in $OUT"

# The plot is optional: only where matplotlib is importable (PLOT_PYTHON picks the interpreter;
# default the reference venv's when it is there). It draws the MPI runs' B0 (b0-np*.json):
# nothing to redraw after a TCP run.
PY=${PLOT_PYTHON:-python3}
[[ -z ${PLOT_PYTHON:-} && -x $REF_VENV/bin/python ]] && PY=$REF_VENV/bin/python
if [[ $TRANSPORT == tcp ]]; then
  :
elif "$PY" -c 'import matplotlib' 2>/dev/null; then
  "$PY" "$ROOT/bench/plot.py" "$OUT" || echo "run.sh: plot failed (not fatal)" >&2
else
  echo "(no matplotlib for $PY: skipping the plot; PLOT_PYTHON=/path/to/python picks another)"
fi

if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "FAILED: ${FAILED[*]}" >&2
  exit 1
fi
