"""The ``horovod`` import alias: unmodified Horovod scripts on horovod_compat."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import horovod_compat.tensorflow as hvd_compat
from horovod_compat import alias

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

UNMODIFIED_SCRIPT = """
    import sys
    import tensorflow as tf
    import horovod
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvdk
    from horovod.tensorflow.util import _executing_eagerly
    import horovod_compat.tensorflow

    assert hvd is horovod_compat.tensorflow
    assert sys.modules["horovod.tensorflow.keras"] is sys.modules["horovod_compat.tensorflow.keras"]
    assert horovod.__version__ == "0.28.1"
    hvd.init()
    total = hvd.allreduce(tf.constant(float(hvd.rank())), op=hvd.Sum).numpy()
    print(f"ALIAS rank={hvd.rank()} size={hvd.size()} total={total} args={sys.argv[1:]}",
          flush=True)
"""


def test_alias_maps_onto_existing_modules():
    alias.install()
    try:
        import horovod
        import horovod.tensorflow as hvd
        import horovod.tensorflow.mpi_ops as mpi_ops
        import horovod.common.exceptions as exceptions
        assert horovod.__version__ == "0.28.1"
        assert hvd is hvd_compat
        assert mpi_ops is sys.modules["horovod_compat.tensorflow.mpi_ops"]
        assert exceptions is sys.modules["horovod_compat.common.exceptions"]
        assert hvd.DistributedOptimizer.__module__.startswith("horovod_compat.")
        with pytest.raises(ImportError):
            import horovod.no_such_module  # noqa: F401
    finally:
        alias.uninstall()
    assert "horovod" not in sys.modules
    with pytest.raises(ImportError):
        import horovod  # noqa: F401


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


@pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ,
                    reason="starts its own mpirun; run from the test process without mpirun")
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_unmodified_script_under_np2(tmp_path, launcher):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(UNMODIFIED_SCRIPT))
    if launcher == "mpirun":
        cmd = ["mpirun", "--timeout", "200", "-np", "2", "--oversubscribe", "--bind-to", "none",
               sys.executable, "-m", "horovod_compat.alias", str(script), "--flag", "1"]
    else:
        cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
               "--mpi-args=--timeout 200", sys.executable, str(script), "--flag", "1"]
    result = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stdout
    lines = sorted(x.strip() for x in re.findall(r"ALIAS [^\n]*?(?=ALIAS |$)", result.stdout, re.M))
    assert lines == [f"ALIAS rank={r} size=2 total=1.0 args=['--flag', '1']" for r in range(2)], \
        result.stdout


def test_dash_m_runs_a_horovod_module_as_main():
    """``python -m horovod.tensorflow.data.compute_worker`` (how Horovod's docs start the
    tf.data compute job) runs the horovod_compat module as __main__ through the alias."""
    cmd = [sys.executable, "-m", "horovod_compat.alias", "-m",
           "horovod.tensorflow.data.compute_worker", "--help"]
    result = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stdout
    assert re.search(r"usage: \S+ -m \S+compute_worker", result.stdout), result.stdout
    assert "--dispatcher-side" in result.stdout, result.stdout
