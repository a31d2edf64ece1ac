#!/usr/bin/env bash
# B5, ResNet-50 overhead check (BENCHMARKS.md): examples/resnet50_synthetic.py at np=2 through the
# runtime (mpirun, one core per rank) against the same script with --no-horovod, two independent
# processes pinned to the same cores at the same time: the same compute, no communication.
# ROUNDS alternating rounds (ours, baseline); prints per-rank img/sec of each and the ratio.
# Env: PY (.venv python), IMAGE (64), BATCH (16), ITERS (5), PER_ITER (5), ROUNDS (2), TIMEOUT_S (600).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
IMAGE="${IMAGE:-64}"; BATCH="${BATCH:-16}"; ITERS="${ITERS:-5}"; PER_ITER="${PER_ITER:-5}"
ROUNDS="${ROUNDS:-2}"; TIMEOUT_S="${TIMEOUT_S:-600}"
export TF_CPP_MIN_LOG_LEVEL=3 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1
ARGS=(examples/resnet50_synthetic.py --image-size "$IMAGE" --batch-size "$BATCH"
      --num-warmup-batches 3 --num-batches-per-iter "$PER_ITER" --num-iters "$ITERS")
TMP="$(mktemp -d /tmp/b5r.XXXXXX)"
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
