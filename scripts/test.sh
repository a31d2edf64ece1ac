#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the dependencies, builds, and runs
#   1. every C++ test (GoogleTest under ctest; MPI suites under mpirun -np 2 and -np 3),
#   2. the same under AddressSanitizer + UndefinedBehaviorSanitizer,
#   3. the thread-rank harness, the in-memory world and the TCP transport under ThreadSanitizer,
#   3b. a build without MPI, with the suites that go through the C API (where the transport is
#       chosen: the TCP runs of the C-API suites, as processes over loopback),
#   4. the Python/TensorFlow suites under mpirun, when scripts/install_python.sh exists.
# Every test has a timeout; the script exits non-zero on any failure.
#
#   scripts/test.sh --quick   a developer's loop: the plain build's C++ suites and the Python
#                             suites at np=2 only (no sanitizer or no-MPI build, no np=1/np=3,
#                             TCP-launcher or MultiWorkerMirroredStrategy runs)
#
# Compiles through ccache when it is installed (scripts/install_deps.sh installs it): a machine
# that has run this before, in any folder, recompiles only what changed.
set -euo pipefail
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

# The suites each extra build runs (ctest names start with the target's name). Only these
# targets are built there.
# TSan: every suite that runs ranks (or enqueuing threads) as threads of one process.
tsan_tests=(thread_rank_test thread_rank_stall_test negotiator_test join_test process_sets_test
            executor_test runtime_test process_set_order_test process_set_table_test
            tensor_queue_test local_world_test backend_async_test timeline_test logging_test
            lifecycle_test runtime_reinit_test runtime_lifecycle_test host_comm_check_test
            local_conformance_test tcp_conformance_test tcp_transport_test
            tcp_mesh_test tcp_init_test tcp_fuzz_test shm_conformance_test shm_plane_test
            shm_allreduce_pieces_test host_backend_test hierarchical_host_comm_test)
# Without MPI: the suites that go through the C API, where the build's transports are chosen.
# (The other suites compile to the same code with or without MPI; the plain build runs them.)
nompi_tests=(builtins_test init_test tcp_init_test tcp_peer_loss_test tcp_partition_test
             mpi_allreduce_test mpi_collectives_test mpi_reinit_test runtime_exit_test
             transport_soak_test tcp_elastic_test)
# ctest -R for the tests of these targets: the name, or the name and a suffix (_np2, _tcp_np3...).
tests_regex() { local IFS='|'; echo "^($*)(_.*)?\$"; }

step() { printf '\n=== %s (at %dm%02ds) ===\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

on_exit=()
trap 'for c in "${on_exit[@]}"; do eval "$c" || true; done' EXIT

step "dependencies"
bash scripts/install_deps.sh
if command -v ccache >/dev/null; then
  # What this run's compiles found in the cache, printed at the end.
  export CCACHE_STATSLOG
  CCACHE_STATSLOG=$(mktemp "${TMPDIR:-/tmp}/hvdc-ccache-stats.XXXXXX")
  on_exit+=('echo "compiler cache, this run:"
             ccache --show-log-stats | grep -E "Hits|Misses" || echo "  nothing compiled"'
            'rm -f "$CCACHE_STATSLOG"')
fi

step "netns cluster (the multi-host and network-fault tests)"
# Three pretend hosts (network namespaces, ../shared/tools/netns-cluster) for tcp_partition_test
# and the Python launcher's multi-host test. Needs root; removed at exit if this script made them.
netns=""
for c in "${HVDC_NETNS_CLUSTER:-}" "$root/../shared/tools/netns-cluster" \
         /work/shared/tools/netns-cluster; do
  if [ -n "$c" ] && [ -x "$c" ]; then netns=$(readlink -f "$c"); break; fi
done
if [ -z "$netns" ] || [ "$(id -u)" -ne 0 ]; then
  echo "NOTE: no netns-cluster script or not root: the multi-host tests will skip"
else
  had_hosts=$(ip netns list 2>/dev/null | grep -c hvhost || true)
  if "$netns" up 3; then
    export HVDC_NETNS_CLUSTER=$netns
    [ "$had_hosts" -eq 0 ] && on_exit+=('"$netns" down')
  else
    echo "NOTE: netns-cluster up 3 failed: the multi-host tests will skip"
  fi
fi

step "build (RelWithDebInfo)"
bash scripts/build.sh build
step "C++ tests"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 300

if [ "$quick" = 0 ] && [ "${HVDC_SKIP_SANITIZERS:-0}" != 1 ]; then
  step "build + C++ tests under ASan/UBSan"
  # The sanitizer builds leave the GPU backend out (HVDC_WITH_NCCL=OFF): nvcc code is not
  # instrumented, and its suites only skip on this machine; the plain build above covers them.
  # Neither builds the benchmarks or the Python modules, which they do not run.
  bash scripts/build.sh build-asan -DHVDC_SANITIZE=address -DHVDC_BUILD_BENCH=OFF \
    -DHVDC_WITH_NCCL=OFF -DHVDC_WITH_TENSORFLOW=OFF
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 600

  step "build + thread-rank tests under TSan"
  bash scripts/build.sh build-tsan -DHVDC_SANITIZE=thread -DHVDC_BUILD_BENCH=OFF \
    -DHVDC_WITH_NCCL=OFF -DHVDC_WITH_TENSORFLOW=OFF -- "${tsan_tests[@]}"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 900 \
    -R "$(tests_regex "${tsan_tests[@]}")"
fi

if [ "$quick" = 0 ]; then
  step "build without MPI (HVDC_WITH_MPI=OFF) + the C-API suites over TCP"
  bash scripts/build.sh build-nompi -DHVDC_WITH_MPI=OFF -DHVDC_BUILD_BENCH=OFF \
    -DHVDC_WITH_NCCL=OFF -DHVDC_WITH_TENSORFLOW=OFF -- "${nompi_tests[@]}"
  ctest --test-dir build-nompi --output-on-failure -j "$jobs" --timeout 300 \
    -R "$(tests_regex "${nompi_tests[@]}")"
fi

if [ -x scripts/install_python.sh ] && [ -x tests/python/run_mpi_tests.sh ]; then
  step "Python / TensorFlow"
  bash scripts/install_python.sh
  if [ "$quick" = 1 ]; then
    HVDC_TEST_NPS=2 HVDC_TEST_GLOO="" HVDC_TEST_MWMS=0 bash tests/python/run_mpi_tests.sh
  else
    bash tests/python/run_mpi_tests.sh
  fi
fi
step "all tests passed"
