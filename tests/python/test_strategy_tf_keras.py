"""HorovodStrategy on tf_keras (TF_USE_LEGACY_KERAS=1).

The checks run in tests/python/strategy_tf_keras_job.py (this pytest process already has
Keras 3): under ``horovodrun -np 2`` and as one plain process. Both tests run only from a test
process started without mpirun (a nested launcher would inherit the job's environment).
"""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "tests", "python", "strategy_tf_keras_job.py")
CHECKS = {"environment", "initial_weights_from_rank0", "fit_matches_reference",
          "evaluate_matches_reference", "predict_whole_result_in_input_order"}

pytestmark = [
    pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ,
                       reason="tf_keras jobs run from the test process started without mpirun"),
    pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                       reason="tf_keras is not installed"),
]


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_", "HOROVOD_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def _assert_passed(result, size):
    assert result.returncode == 0, result.stdout[-6000:]
    for rank in range(size):
        found = set(re.findall(rf"CHECK (\S+) ok rank={rank} size={size}(?!\d)", result.stdout))
        assert found == CHECKS, (rank, CHECKS - found, result.stdout[-6000:])
        assert f"ALL CHECKS PASSED rank={rank}" in result.stdout, result.stdout[-6000:]


def test_strategy_tf_keras_np2_under_horovodrun():
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
           "--mpi-args=--timeout 200", sys.executable, JOB]
    result = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=240)
    _assert_passed(result, 2)


def test_strategy_tf_keras_single_process():
    result = subprocess.run([sys.executable, JOB], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=200)
    _assert_passed(result, 1)
