#!/usr/bin/env bash
# Runs the horovod_compat TensorFlow test-suite: one process without a launcher, then under
# `mpirun -np 2` and `mpirun -np 3` (oversubscribed), then the collectives suite at np=2 over the
# TCP transport (`horovodrun --gloo`), then the strategy tests against TensorFlow's own
# MultiWorkerMirroredStrategy (~1.5 min). Exits non-zero if any run fails.
#
#   tests/python/run_mpi_tests.sh [extra pytest arguments, e.g. -k allreduce]
#   PYTHON=...              interpreter (default: .venv/bin/python)
#   HVDC_TEST_NPS="1 2 3"   which world sizes to run
#   HVDC_TEST_TIMEOUT=1800  mpirun --timeout per world size (seconds)
#   HVDC_TEST_GLOO="test_collectives.py"  suites also run at np=2 over the TCP transport
#                           (horovodrun --gloo); empty = none
#   HVDC_TEST_MWMS=1        0 = skip the run of test_strategy.py (mpirun -np 2) and
#                           test_strategy_tf_keras.py against MultiWorkerMirroredStrategy
#                           (HVDC_TEST_STRATEGY=mwms; skip and xfail reasons say how MWMS differs)
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

# --durations: the slowest tests of each run are in the log (where CI's minutes go).
PYTEST=("$PY" -m pytest "$ROOT/tests/python" -p no:cacheprovider --timeout 300 -q -rfE
        --durations=8 --durations-min=5 "$@")

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

# The same for `horovodrun --gloo` (the launcher's ranks carry HOROVOD_RANK, not OMPI_*).
sed 's/OMPI_COMM_WORLD_RANK/HOROVOD_RANK/; s/OMPI_COMM_WORLD_SIZE/HOROVOD_SIZE/' "$LOGDIR/rank.sh" \
  > "$LOGDIR/gloo_rank.sh"
chmod +x "$LOGDIR/gloo_rank.sh"
GLOO_SUITES="${HVDC_TEST_GLOO-test_collectives.py}"
sed 's/np\${OMPI_COMM_WORLD_SIZE}/mwms-np\${OMPI_COMM_WORLD_SIZE}/' "$LOGDIR/rank.sh" \
  > "$LOGDIR/mwms_rank.sh"
chmod +x "$LOGDIR/mwms_rank.sh"

# Prints the last lines of each rank's log matching "$LOGDIR/$1"-rank*.log (after a failed run).
tail_rank_logs() {
  local log
  for log in "$LOGDIR/$1"-rank*.log; do
    [[ -f "$log" ]] || continue
    echo "--- tail of $log ---"
    tail -n 40 "$log"
  done
}

# A process of the single-rank run that dies of a signal (SIGSEGV inside TensorFlow or the
# runtime) leaves a core file in $ROOT (the kernel's core_pattern here is "core"): print every
# thread's native stack from it, so a rare crash can be read from CI's log, then remove it.
native_crash_report() {
  local core
  for core in "$ROOT"/core "$ROOT"/core.[0-9]*; do
    [[ -f "$core" ]] || continue
    echo "--- native stacks from $core ---"
    if command -v gdb >/dev/null; then
      timeout 300 gdb -q -batch -ex "bt 30" -ex "thread apply all bt 25" "$PY" "$core" 2>&1 |
        grep -v "^\[New LWP" | head -n 400
    else
      echo "(gdb is not installed: no stacks)"
    fi
    rm -f "$core"
  done
}

status=0
for np in $NPS; do
  echo "=== horovod_compat TensorFlow tests, np=$np ==="
  if [[ "$np" == 1 ]]; then
    (cd "$ROOT" && ulimit -c unlimited 2>/dev/null; timeout "$TIMEOUT" "${PYTEST[@]}")
    rc=$?
    (( rc > 128 )) && native_crash_report
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
      tail_rank_logs np"$np"
    fi
  fi
  echo "=== np=$np: exit code $rc ==="
  [[ $rc == 0 ]] || status=1
done

# Every collective and dtype over the TCP transport, launched as a user would: horovodrun --gloo.
if [[ -n "$GLOO_SUITES" ]]; then
  echo "=== horovod_compat TensorFlow tests over the TCP transport: horovodrun --gloo -np 2 ==="
  suites=()
  for s in $GLOO_SUITES; do suites+=("$ROOT/tests/python/$s"); done
  (cd "$ROOT" && timeout $((TIMEOUT + 60)) "$PY" -m horovod_compat.runner.launch --gloo -np 2 \
    --gloo-timeout-seconds 120 "$LOGDIR/gloo_rank.sh" "$PY" -m pytest "${suites[@]}" \
    -p no:cacheprovider --timeout 300 -q -rfE "$@")
  rc=$?
  if [[ $rc != 0 ]]; then
    tail_rank_logs np2
  fi
  echo "=== gloo np=2: exit code $rc ==="
  [[ $rc == 0 ]] || status=1
fi
# The strategy tests against MWMS: where HorovodStrategy is a drop-in and where they differ.
if [[ "${HVDC_TEST_MWMS:-1}" != 0 ]]; then
  echo "=== strategy tests against MultiWorkerMirroredStrategy: mpirun -np 2 + tf_keras ==="
  mwms_timeout=$(( TIMEOUT < 600 ? TIMEOUT : 600 ))
  HVDC_TEST_STRATEGY=mwms timeout $((mwms_timeout + 60)) mpirun --timeout "$mwms_timeout" -np 2 \
    --bind-to none -x HVDC_TEST_STRATEGY -x HOROVOD_FUSION_THRESHOLD \
    -x HOROVOD_DYNAMIC_PROCESS_SETS -x TF_CPP_MIN_LOG_LEVEL -x PYTHONDONTWRITEBYTECODE \
    "$LOGDIR/mwms_rank.sh" "$PY" -m pytest "$ROOT/tests/python/test_strategy.py" \
    -p no:cacheprovider --timeout 120 -q -rfEsx "$@"
  rc=$?
  if [[ $rc != 0 ]]; then
    tail_rank_logs mwms-np2
  fi
  (cd "$ROOT" && HVDC_TEST_STRATEGY=mwms timeout "$mwms_timeout" "$PY" -m pytest \
    "$ROOT/tests/python/test_strategy_tf_keras.py" -p no:cacheprovider --timeout 300 -q -rfE "$@")
  rc2=$?
  [[ $rc == 5 ]] && rc=0    # extra pytest arguments that select none of these tests
  [[ $rc2 == 5 ]] && rc2=0
  echo "=== MWMS: exit codes $rc (test_strategy.py, np=2), $rc2 (tf_keras) ==="
  [[ $rc == 0 && $rc2 == 0 ]] || status=1
fi
exit $status
