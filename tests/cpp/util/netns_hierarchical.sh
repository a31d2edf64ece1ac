#!/usr/bin/env bash
# Hierarchical allreduce and allgather between real (pretend) hosts: the C-API collective suites
# given as arguments run under mpirun on the netns cluster (../shared/tools/netns-cluster, hosts
# hvhost1..3, each its own network namespace and hostname) with HOROVOD_HIERARCHICAL_ALLREDUCE=1
# and HOROVOD_HIERARCHICAL_ALLGATHER=1:
#   - 3 hosts x 2 ranks: every suite passes and every rank reports the hierarchical plane for the
#     global set (shared memory within each host, MPI across);
#   - 2 + 1 ranks (uneven): the first suite passes over the flat plane, and the warning says why.
# Exits 77 (ctest: skipped) unless HVDC_NETNS_CLUSTER names the cluster's script and its hosts are
# up (scripts/test.sh brings them up when it runs as root).
set -u
cluster=${HVDC_NETNS_CLUSTER:-}
if [ -z "$cluster" ] || [ ! -x "$cluster" ]; then
  echo "SKIP: HVDC_NETNS_CLUSTER does not name the netns-cluster script"
  exit 77
fi
for h in hvhost1 hvhost2 hvhost3; do
  if ! ip netns list 2>/dev/null | grep -qw "$h"; then
    echo "SKIP: netns host $h is not up (netns-cluster up 3)"
    exit 77
  fi
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags=$("$cluster" flags)  # holds a quoted rsh agent: used through eval
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0

run() {  # run HOSTS NP BINARY: mpirun onto the cluster, output in $log
  eval "timeout --kill-after=10 240 mpirun $flags -H $1 -np $2 --bind-to none" \
    "--mca mpi_yield_when_idle 1 -x HOROVOD_HIERARCHICAL_ALLREDUCE=1" \
    "-x HOROVOD_HIERARCHICAL_ALLGATHER=1 -x HOROVOD_LOG_LEVEL=debug -x ASAN_OPTIONS=detect_leaks=0" \
    "$3" >"$log" 2>&1
}

fail() {
  echo "FAILED: $1"
  grep -v "DEBUG" "$log" | tail -40
  failed=1
}

for suite in "$@"; do
  name=$(basename "$suite")
  run hvhost1:2,hvhost2:2,hvhost3:2 6 "$suite"
  rc=$?
  planes=$(grep -c "hierarchical data plane for a set of 6 ranks (3 hosts x 2" "$log")
  if [ "$rc" -ne 0 ]; then
    fail "$name on 3 hosts x 2 ranks: exit $rc"
  elif [ "$planes" -ne 6 ]; then
    fail "$name on 3 hosts x 2 ranks: $planes of 6 ranks report the hierarchical plane"
  else
    echo "ok: $name on 3 hosts x 2 ranks, hierarchical on all 6 ($(grep -a -o 'PASSED.*' "$log" | head -1))"
  fi
done

run hvhost1:2,hvhost2:1 3 "$1"
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "$(basename "$1") on 2 + 1 ranks: exit $rc"
elif ! grep -q "needs the same number of ranks on every host" "$log"; then
  fail "$(basename "$1") on 2 + 1 ranks: no warning about the uneven hosts"
elif grep -q "hierarchical data plane for a set of 3" "$log"; then
  fail "$(basename "$1") on 2 + 1 ranks: the hierarchical plane was used"
else
  echo "ok: $(basename "$1") on 2 + 1 ranks, flat plane with the warning"
fi
exit $failed
