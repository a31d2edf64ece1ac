"""The scripts in examples/, each run end to end at np=2 in its --short mode through horovodrun.

Run only from a size-1 test process (the np=1 pass of run_mpi_tests.sh), so the nested mpirun
does not inherit an MPI job's environment. Each job checks the lines rank 0 prints.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")

needs_single_process = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="end-to-end example jobs run from the test process started without mpirun")

pytestmark = needs_single_process


def _clean_env():
    """This environment minus any MPI job's or Horovod's settings (as in test_runner.py)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_", "HOROVOD_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def _run_example(tmp_path, script, *args, timeout=300):
    """Runs examples/<script> at np=2 with the given flags in tmp_path; returns its output."""
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
           "--mpi-args=--timeout 240", sys.executable, os.path.join(EXAMPLES, script), *args]
    result = subprocess.run(cmd, cwd=str(tmp_path), env=_clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-8000:]
    return result.stdout


def _number(pattern, output):
    """The float captured by pattern's first group (exactly one match expected)."""
    found = re.findall(pattern, output)
    assert len(found) == 1, f"expected one match of {pattern!r}:\n{output[-8000:]}"
    return float(found[0])


def _losses(output):
    return [float(x) for x in re.findall(r"Step #\d+\tLoss: ([\d.]+)", output)]


def test_keras_fashion_mnist(tmp_path):
    out = _run_example(tmp_path, "keras_fashion_mnist.py", "--short",
                       "--checkpoint", str(tmp_path / "fashion.weights.h5"))
    assert _number(r"Test accuracy: ([\d.]+)", out) > 0.6, out[-8000:]
    assert (tmp_path / "fashion.weights.h5").exists()      # written by rank 0's ModelCheckpoint


def test_keras_elastic_in_a_fixed_job(tmp_path):
    # hvd.elastic.run outside an elastic launch: one sync, one call (the elastic job itself is
    # tests/python/test_elastic_job.py and the launcher's tests).
    out = _run_example(tmp_path, "keras_elastic.py", "--short")
    assert _number(r"Test accuracy: ([\d.]+)", out) > 0.6, out[-8000:]


def test_tf2_gradient_tape(tmp_path):
    out = _run_example(tmp_path, "tf2_gradient_tape.py", "--short")
    losses = _losses(out)
    assert len(losses) >= 3 and losses[-1] < losses[0], out[-8000:]
    # Broadcast + averaged gradients keep the ranks' weights identical.
    assert _number(r"Max weight difference from rank 0: (\S+)", out) < 1e-5, out[-8000:]
    assert _number(r"Test accuracy: ([\d.]+)", out) > 0.65, out[-8000:]


def test_tf1_monitored_session(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    out = _run_example(tmp_path, "tf1_monitored_session.py", "--short",
                       "--checkpoint-dir", str(checkpoints))
    # --short: 400 steps in all, 200 per rank at np=2.
    assert _number(r"Trained to global step (\d+):", out) == 200, out[-8000:]
    losses = _losses(out)
    assert len(losses) >= 3 and losses[-1] < losses[0], out[-8000:]
    first = _number(r"first loss ([\d.]+)", out)
    last = _number(r"last loss ([\d.]+)", out)
    assert last < first, out[-8000:]
    assert _number(r"Max weight difference from rank 0: (\S+)", out) < 1e-5, out[-8000:]
    assert _number(r"Test accuracy: ([\d.]+)", out) > 0.7, out[-8000:]
    # Rank 0 wrote the final checkpoint.
    assert (checkpoints / "checkpoint").exists()
    assert list(checkpoints.glob("model.ckpt-200.*")), sorted(os.listdir(checkpoints))


@pytest.mark.parametrize("extra", [[], ["--sync-only"]], ids=["gradients", "sync_only"])
def test_resnet50_synthetic(tmp_path, extra):
    out = _run_example(tmp_path, "resnet50_synthetic.py", "--short", *extra)
    iters = [float(x) for x in re.findall(r"Iter #\d+: ([\d.]+) img/sec per rank", out)]
    assert len(iters) == 3 and all(x > 0 for x in iters), out[-8000:]
    assert _number(r"Img/sec per rank: ([\d.]+) \+-[\d.]+", out) > 0, out[-8000:]
    assert _number(r"Total img/sec on 2 rank\(s\): ([\d.]+) \+-[\d.]+", out) > 0, out[-8000:]


def test_keras_strategy(tmp_path):
    out = _run_example(tmp_path, "keras_strategy.py", "--short",
                       "--checkpoint", str(tmp_path / "strategy.weights.h5"))
    assert _number(r"Test accuracy: ([\d.]+)", out) > 0.6, out[-8000:]
    assert _number(r"Max weight difference from rank 0: (\S+)", out) == 0.0, out[-8000:]
    assert (tmp_path / "strategy.weights.h5").exists()     # written by rank 0 alone
