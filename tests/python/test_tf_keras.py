"""The Keras frontends on tf_keras (TF_USE_LEGACY_KERAS=1).

TensorFlow picks Keras 3 or tf_keras for ``tf.keras`` when it is first imported, and this test
process already has Keras 3, so the checks run in tests/python/tf_keras_job.py, started with
TF_USE_LEGACY_KERAS=1: under ``horovodrun -np 2`` and as one plain process. Both tests run only
from a test process started without mpirun (a nested launcher would inherit the job's
environment, and a plain child would otherwise run once per rank).
"""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "tests", "python", "tf_keras_job.py")

needs_single_process = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="tf_keras jobs run from the test process started without mpirun")
needs_tf_keras = pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                                    reason="tf_keras is not installed")

# Checks that must be reported by every rank (the job prints more).
KEY_CHECKS = {
    "environment",
    "value_helpers",
    "fit_matches_reference[new,eager=False,hvdk]",
    "fit_matches_reference[legacy,eager=False,hk]",
    "backward_passes[new,average=False]",
    "backward_passes[legacy,average=True]",
    "options[new]",
    "options[legacy]",
    "broadcast_callback[new]",
    "broadcast_callback[legacy]",
    "warmup[new]",
    "metric_average",
    "sync_batch_norm",
    "schedule_momentum_correction",
    "load_model[new,h5]",
    "load_model[new,keras]",
    "load_model[legacy,h5]",
    "best_model_checkpoint",
    "partial_distributed_optimizer",
    "elastic_state[new]",
    "elastic_state[legacy]",
}


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_", "HOROVOD_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def _checks_by_rank(output, size):
    found = {}
    for name, rank, got_size in re.findall(r"CHECK (\S+) ok rank=(\d+) size=(\d+)", output):
        assert int(got_size) == size, output
        found.setdefault(int(rank), set()).add(name)
    return found


def _assert_job_passed(result, size):
    assert result.returncode == 0, result.stdout[-6000:]
    found = _checks_by_rank(result.stdout, size)
    assert sorted(found) == list(range(size)), result.stdout[-6000:]
    for rank in range(size):
        assert f"ALL CHECKS PASSED rank={rank}" in result.stdout, result.stdout[-6000:]
        assert found[rank] == found[0]
        missing = KEY_CHECKS - found[rank]
        assert not missing, (missing, result.stdout[-6000:])


@needs_single_process
@needs_tf_keras
def test_tf_keras_np2_under_horovodrun(tmp_path):
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
           "--mpi-args=--timeout 200", sys.executable, JOB, str(tmp_path)]
    result = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=240)
    _assert_job_passed(result, 2)
    # BestModelCheckpoint wrote on rank 0 only.
    assert (tmp_path / "best-0.h5").exists() and not (tmp_path / "best-1.h5").exists()


@needs_single_process
@needs_tf_keras
def test_tf_keras_single_process_without_launcher(tmp_path):
    result = subprocess.run([sys.executable, JOB, str(tmp_path)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=200)
    _assert_job_passed(result, 1)
