#!/usr/bin/env bash
# Creates .venv at the repository root (idempotent), installs the Python dependencies
# (TensorFlow from a local wheel cache when one is present, else PyPI) and builds/installs
# horovod_compat into it so the native parts are compiled against that TensorFlow.
#
# Usage: scripts/install_python.sh [--deps-only]
#   PYTHON=...        interpreter used to create the venv (default: python3 on PATH)
#   HVDC_WHEEL_DIRS   extra colon-separated folders searched for wheels
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
DEPS_ONLY=0
[[ "${1:-}" == "--deps-only" ]] && DEPS_ONLY=1

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install_python: creating $VENV with $("$PY" -c 'import sys; print(sys.executable)')"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

# Local wheel caches (the TensorFlow wheel is ~270 MB): use them when they exist.
FIND_LINKS=()
IFS=: read -r -a extra_dirs <<< "${HVDC_WHEEL_DIRS:-}"
for d in /tmp/tfwheel "$ROOT/.whl" "${extra_dirs[@]}"; do
  [[ -n "$d" && -d "$d" ]] && FIND_LINKS+=(--find-links "$d")
done

pip_install() { "$VPY" -m pip install --disable-pip-version-check -q "${FIND_LINKS[@]}" "$@"; }

# Skip the dependency step when everything is already there (keeps reruns fast and offline).
if ! "$VPY" - <<'PY' 2>/dev/null
import importlib.metadata as md, sys
need = {"tensorflow-cpu": "2.21.", "tf-keras": "2.21.", "numpy": "", "pytest": "",
        "pytest-timeout": "", "cloudpickle": "", "psutil": "", "mpi4py": "", "setuptools": "",
        "wheel": ""}
for pkg, prefix in need.items():
    if not md.version(pkg).startswith(prefix):
        sys.exit(1)
PY
then
  echo "install_python: installing dependencies"
  pip_install --upgrade pip setuptools wheel
  pip_install "tensorflow-cpu==2.21.*" "tf_keras==2.21.*" numpy pytest pytest-timeout \
    cloudpickle psutil mpi4py
fi

if [[ $DEPS_ONLY == 1 ]]; then
  exit 0
fi

echo "install_python: building horovod_compat (CMake via setup.py)"
cd "$ROOT"
pip_install --no-build-isolation --no-deps -e .
"$VPY" -c "import horovod_compat.tensorflow as hvd; hvd.init(); print('horovod_compat', hvd.__version__ if hasattr(hvd, '__version__') else '', 'rank', hvd.rank(), 'of', hvd.size())"
