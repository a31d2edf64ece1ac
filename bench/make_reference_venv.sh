#!/usr/bin/env bash
# Makes the Python environment of the benchmarks' comparison references that the project itself
# does not need: torch.distributed's gloo backend (bench/torch_gloo.py, run by
# `bench/run.sh --transport tcp` for b1, b3, b4) and matplotlib (bench/plot.py, the B0 plot).
# B5 and B7 use the project's own .venv (scripts/install_python.sh: TensorFlow, mpi4py).
#
#   bench/make_reference_venv.sh [DIR]    default: $HVDC_BENCH_VENV, else .venv-bench at the repo root
#
# bench/run.sh looks for this venv at the same place (or --torch-python PATH / TORCH_PYTHON).
# Idempotent: an existing venv whose torch has gloo is left alone; a partial one is completed.
#
# Torch comes from PyPI as the benchmarks measured it (bench/results/notes-2026-11-27.md): the
# Linux wheel is a CUDA build whose dependencies are ~5 GB of CUDA libraries that a CPU-only
# comparison never loads, so it is installed without them, with its pure-Python dependencies and
# the four NVIDIA libraries libtorch.so links against and needs just to load (~2 GB in all).
# TORCH_VERSION (default 2.15.0) picks another release; its NVIDIA library names may differ.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-${HVDC_BENCH_VENV:-$ROOT/.venv-bench}}
TORCH_VERSION=${TORCH_VERSION:-2.15.0}
PY=$DIR/bin/python

case ${1:-} in
  -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
esac

has_gloo() { "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; }
has_matplotlib() { "$PY" -c 'import matplotlib' 2>/dev/null; }

if [[ -x $PY ]] && has_gloo && has_matplotlib; then
  echo "make_reference_venv: $DIR is ready (torch $("$PY" -c 'import torch; print(torch.__version__)')" \
    "with gloo, matplotlib); nothing to do"
  exit 0
fi

if [[ ! -x $PY ]]; then
  echo "make_reference_venv: creating $DIR"
  python3 -m venv "$DIR" || {
    echo "make_reference_venv: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
  "$PY" -m pip install --quiet --upgrade pip
fi

if ! has_gloo; then
  echo "make_reference_venv: installing torch $TORCH_VERSION (CPU use only; ~2 GB download)"
  "$PY" -m pip install --no-deps "torch==$TORCH_VERSION"
  "$PY" -m pip install filelock typing-extensions sympy networkx jinja2 fsspec numpy
  "$PY" -m pip install --no-deps nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13 \
    nvidia-nccl-cu13
  has_gloo || {
    echo "make_reference_venv: torch installed but torch.distributed has no gloo:" >&2
    "$PY" -c 'import torch.distributed' >&2 || true
    exit 1
  }
fi

if ! has_matplotlib; then
  echo "make_reference_venv: installing matplotlib (for bench/plot.py)"
  "$PY" -m pip install --quiet matplotlib
fi

echo "make_reference_venv: ready: $PY (bench/run.sh finds it there; elsewhere pass" \
  "--torch-python $PY and PLOT_PYTHON=$PY)"
