#!/usr/bin/env bash
# Configures and builds the C++ tree:
#   scripts/build.sh [build-dir] [extra cmake args...] [-- target...]
# With targets after `--`, only those are built (default: all). Compiles through ccache when it
# is installed (see HVDC_CCACHE in CMakeLists.txt).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build}
shift || true
cmake_args=()
targets=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then
    shift
    targets=("$@")
    break
  fi
  cmake_args+=("$1")
  shift
done
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}" >/dev/null
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"
else
  cmake --build "$dir" -j "$(nproc)"
fi
