#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the dependencies, builds, and runs
#   1. every C++ test (GoogleTest under ctest; MPI suites under mpirun -np 2 and -np 3),
#   2. the same under AddressSanitizer + UndefinedBehaviorSanitizer,
#   3. the thread-rank harness, the in-memory world and the TCP transport under ThreadSanitizer,
#   3b. a build without MPI, with the TCP suites (the C-API suites as processes over loopback),
#   4. the Python/TensorFlow suites under mpirun, when scripts/install_python.sh exists.
# Every test has a timeout; the script exits non-zero on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

step() { printf '\n=== %s ===\n' "$*"; }

step "dependencies"
bash scripts/install_deps.sh

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
    [ "$had_hosts" -eq 0 ] && trap '"$netns" down || true' EXIT
  else
    echo "NOTE: netns-cluster up 3 failed: the multi-host tests will skip"
  fi
fi

step "build (RelWithDebInfo)"
bash scripts/build.sh build
step "C++ tests"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 300

if [ "${HVDC_SKIP_SANITIZERS:-0}" != 1 ]; then
  step "build + C++ tests under ASan/UBSan"
  # The sanitizer builds leave the GPU backend out (HVDC_WITH_NCCL=OFF): nvcc code is not
  # instrumented, and its suites only skip on this machine; the plain build above covers them.
  bash scripts/build.sh build-asan -DHVDC_SANITIZE=address -DHVDC_BUILD_BENCH=OFF \
    -DHVDC_WITH_NCCL=OFF
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 600

  step "build + thread-rank tests under TSan"
  # Every suite that runs ranks (or enqueuing threads) as threads of one process.
  tsan_tests=(thread_rank_test thread_rank_stall_test controller_test join_test process_sets_test
              executor_test runtime_test process_set_order_test process_set_table_test
              tensor_queue_test local_world_test backend_async_test timeline_test logging_test
              tcp_mesh_test tcp_host_comm_test tcp_control_channel_test tcp_init_test tcp_fuzz_test)
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHVDC_SANITIZE=thread \
    -DHVDC_BUILD_BENCH=OFF -DHVDC_WITH_NCCL=OFF -DHVDC_WITH_TENSORFLOW=OFF >/dev/null
  cmake --build build-tsan -j "$jobs" --target "${tsan_tests[@]}"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 900 \
    -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$"
fi

step "build without MPI (HVDC_WITH_MPI=OFF) + the TCP suites"
cmake -S . -B build-nompi -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHVDC_WITH_MPI=OFF \
  -DHVDC_BUILD_BENCH=OFF -DHVDC_WITH_NCCL=OFF -DHVDC_WITH_TENSORFLOW=OFF >/dev/null
cmake --build build-nompi -j "$jobs"
ctest --test-dir build-nompi --output-on-failure -j "$jobs" --timeout 300

if [ -x scripts/install_python.sh ] && [ -x tests/python/run_mpi_tests.sh ]; then
  step "Python / TensorFlow"
  bash scripts/install_python.sh
  bash tests/python/run_mpi_tests.sh
fi
step "all tests passed"
