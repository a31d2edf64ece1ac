#!/usr/bin/env bash
# Builds and runs the GPU parts (ops/cuda, ops/nccl, their tests, bench/gpu_bench) on the GPU
# machine, which has nvcc, CMake, ninja and NCCL (the nvidia-nccl-cu13 wheel) but no Boost, fmt,
# GoogleTest or MPI, and no network.
#
#   here (a networked Debian 12 machine), once:
#     scripts/gpu_setup.sh vendor    # apt-get download the four .debs into build-gpu-deps/debs
#   then bring the checkout there with build-gpu-deps/ carried along (it is git-ignored, ~10 MB:
#   the device tool's `carry: ["build-gpu-deps"]`), and on the GPU machine:
#     scripts/gpu_setup.sh build     # unpack the .debs into build-gpu/_deps, configure and
#                                    # build build-gpu/ (no MPI, NCCL from the wheel)
#     scripts/gpu_setup.sh test      # the GPU suites (ctest -L gpu) and the no-MPI C++ suites
#     scripts/gpu_setup.sh bench     # bench/gpu_bench; JSON to $OUT (or build-gpu/) when set
#     scripts/gpu_setup.sh all       # build + test + bench
#     scripts/gpu_setup.sh sanitize  # (build if needed +) the GPU suites under compute-sanitizer
#
# Environment: NCCL_ROOT (a folder with include/nccl.h and lib/libnccl.so*; default: the wheel's),
# CUDA_ARCHS (default 90), JOBS (default: nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/build-gpu-deps
build=$root/build-gpu
debs=(libboost1.74-dev libfmt-dev libfmt9 libgtest-dev)

die() {
  echo "gpu_setup: $*" >&2
  exit 1
}

vendor() {
  mkdir -p "$deps/debs"
  (cd "$deps/debs" && apt-get download "${debs[@]}")
  ls -la "$deps/debs"
}

# dpkg -x when dpkg is there; else a .deb is an `ar` archive holding data.tar.*: unpack it with
# Python's standard library.
unpack_deb() {
  local deb=$1 dest=$2
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$dest"
    return
  fi
  python3 - "$deb" "$dest" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", f"{deb}: not an ar archive"
pos = 8
while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            tar.extractall(dest)
        break
    pos += 60 + size + (size & 1)
else:
    sys.exit(f"{deb}: no data.tar member")
PY
}

find_nccl() {
  if [ -n "${NCCL_ROOT:-}" ]; then
    echo "$NCCL_ROOT"
    return
  fi
  python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null ||
    { [ -f /usr/local/cuda/include/nccl.h ] && echo /usr/local/cuda; } ||
    die "NCCL not found: set NCCL_ROOT (the nvidia-nccl-cu13 wheel's folder)"
}

configure_and_build() {
  [ -d "$deps/debs" ] || die "$deps/debs is missing: run 'scripts/gpu_setup.sh vendor' on a" \
    "networked machine and carry build-gpu-deps/ along"
  # Unpacked beside the build, not in build-gpu-deps/ (only the .debs travel: carry <= 64 MiB).
  local prefix=$build/_deps
  if [ ! -f "$prefix/.unpacked" ]; then
    rm -rf "$prefix"
    mkdir -p "$prefix"
    for deb in "$deps"/debs/*.deb; do unpack_deb "$deb" "$prefix"; done
    touch "$prefix/.unpacked"
  fi
  local nccl nvcc arch=x86_64-linux-gnu
  nccl=$(find_nccl)
  # The wheel ships lib/libnccl.so.2 only; the CMake search takes that name too.
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$nvcc" ] || die "nvcc not found"
  echo "gpu_setup: nvcc $nvcc, NCCL $nccl, vendored prefix $prefix"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHVDC_WITH_MPI=OFF -DHVDC_WITH_NCCL=ON -DHVDC_WITH_TENSORFLOW=OFF -DHVDC_BUILD_TESTS=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" \
    -DNCCL_ROOT="$nccl" \
    -DBoost_DIR="$prefix/usr/lib/$arch/cmake/Boost-1.74.0" \
    -Dfmt_DIR="$prefix/usr/lib/$arch/cmake/fmt" \
    -DGTest_DIR="$prefix/usr/lib/$arch/cmake/GTest" \
    -DCMAKE_BUILD_RPATH="$prefix/usr/lib/$arch;$nccl/lib"
  cmake --build "$build" -j "${JOBS:-$(nproc)}"
}

run_tests() {
  [ -d "$build" ] || die "no $build: run 'scripts/gpu_setup.sh build' first"
  nvidia-smi -L || true
  # The GPU suites first. They must not skip for want of a device here (one test skips on
  # purpose when a GPU is present: it covers the no-GPU error path).
  if ! ctest --test-dir "$build" -L gpu --output-on-failure --timeout 600 -V |
    tee "$build/gpu_tests.log"; then
    die "GPU tests failed (see $build/gpu_tests.log)"
  fi
  if grep -q "no usable CUDA device\|no CUDA device" "$build/gpu_tests.log"; then
    die "GPU tests skipped: no GPU visible to CUDA (see $build/gpu_tests.log)"
  fi
  ctest --test-dir "$build" -LE gpu --output-on-failure --timeout 300 -j "${JOBS:-$(nproc)}"
}

# The kernels and the stream/event ordering under compute-sanitizer: memcheck, racecheck,
# synccheck and initcheck on the pack/unpack suite; memcheck on the stream suite and on the
# collectives (a subset: the every-dtype sweep is too slow under the tool). Builds first if needed.
run_sanitizer() {
  [ -x "$build/tests/cpp/cuda_pack_test" ] || configure_and_build
  local cs tests=$build/tests/cpp log=$build/sanitizer.log failed=0
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$cs" ] || die "compute-sanitizer not found"
  : >"$log"
  sanitize() {
    echo "== compute-sanitizer $*" | tee -a "$log"
    "$cs" --error-exitcode 99 "$@" >>"$log" 2>&1 || { echo "   FAILED ($?)"; return 1; }
    tail -3 "$log"
  }
  for tool in memcheck racecheck synccheck initcheck; do
    sanitize --tool "$tool" "$tests/cuda_pack_test" || failed=1
  done
  sanitize --tool memcheck "$tests/nccl_stream_test" || failed=1
  sanitize --tool memcheck "$tests/nccl_backend_test" \
    --gtest_filter='NcclDevice.AllreduceInPlace:NcclDevice.Allgather:NcclDevice.Broadcast:NcclDevice.AlltoallWithSplits:NcclDevice.ReducescatterScaled' ||
    failed=1
  if grep -q "no usable CUDA device\|no CUDA device" "$log"; then
    die "sanitizer runs skipped: no GPU visible to CUDA (see $log)"
  fi
  [ "$failed" = 0 ] || die "compute-sanitizer reported errors (see $log)"
  echo "gpu_setup: compute-sanitizer clean"
}

run_bench() {
  [ -x "$build/bench/gpu_bench" ] || die "no $build/bench/gpu_bench: run 'build' first"
  local out=${OUT:-$build}
  "$build/bench/gpu_bench" --json "$out/gpu_bench.json" \
    --tensors "$root/bench/tensor_sets/resnet50_keras.txt" | tee "$out/gpu_bench.txt"
}

case "${1:-}" in
  vendor) vendor ;;
  build) configure_and_build ;;
  test) run_tests ;;
  bench) run_bench ;;
  sanitize) run_sanitizer ;;
  all)
    configure_and_build
    run_tests
    run_bench
    ;;
  *) die "usage: scripts/gpu_setup.sh vendor|build|test|bench|sanitize|all" ;;
esac
