#!/usr/bin/env bash
# Runs the horovod_compat TensorFlow test-suite: one process without a launcher, then under
# `mpirun -np 2` and `mpirun -np 3` (oversubscribed). Exits non-zero if any run fails.
#
#   tests/python/run_mpi_tests.sh [extra pytest arguments, e.g. -k allreduce]
#   PYTHON=...              interpreter (default: .venv/bin/python)
#   HVDC_TEST_NPS="1 2 3"   which world sizes to run
#   HVDC_TEST_TIMEOUT=1800  mpirun --timeout per world size (seconds)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
NPS="${HVDC_TEST_NPS:-1 2 3}"
TIMEOUT="${HVDC_TEST_TIMEOUT:-1800}"
LOGDIR="$(mktemp -d "${TMPDIR:-/tmp}/hvdc-pytest.XXXXXX")"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A low fusion threshold makes the runtime split and pack batches even for small test tensors.
export HOROVOD_FUSION_THRESHOLD="${HOROVOD_FUSION_THRESHOLD:-4096}"
export HOROVOD_DYNAMIC_PROCESS_SETS=1
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export PYTHONDONTWRITEBYTECODE=1

PYTEST=("$PY" -m pytest "$ROOT/tests/python" -p no:cacheprovider --timeout 300 -q -rfE "$@")

# Rank 0 prints to the terminal; the other ranks log to files shown on failure.
cat > "$LOGDIR/rank.sh" <<SH
#!/usr/bin/env bash
cd "$ROOT"
rank="\${OMPI_COMM_WORLD_RANK:-0}"
if [[ "\$rank" == 0 ]]; then
  exec "\$@"
fi
exec "\$@" > "$LOGDIR/np\${OMPI_COMM_WORLD_SIZE}-rank\$rank.log" 2>&1
SH
chmod +x "$LOGDIR/rank.sh"

status=0
for np in $NPS; do
  echo "=== horovod_compat TensorFlow tests, np=$np ==="
  if [[ "$np" == 1 ]]; then
    (cd "$ROOT" && timeout "$TIMEOUT" "${PYTEST[@]}")
    rc=$?
  else
    extra=()
    if (( np > 2 )); then
      extra=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
    fi
    timeout $((TIMEOUT + 60)) mpirun --timeout "$TIMEOUT" -np "$np" "${extra[@]}" \
      -x HOROVOD_FUSION_THRESHOLD -x HOROVOD_DYNAMIC_PROCESS_SETS -x TF_CPP_MIN_LOG_LEVEL \
      -x PYTHONDONTWRITEBYTECODE "$LOGDIR/rank.sh" "${PYTEST[@]}"
    rc=$?
    if [[ $rc != 0 ]]; then
      for log in "$LOGDIR"/np"$np"-rank*.log; do
        [[ -f "$log" ]] || continue
        echo "--- tail of $log ---"
        tail -n 40 "$log"
      done
    fi
  fi
  echo "=== np=$np: exit code $rc ==="
  [[ $rc == 0 ]] || status=1
done
exit $status
