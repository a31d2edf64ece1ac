"""Which tf.distribute strategy the strategy tests run against (env HVDC_TEST_STRATEGY).

``horovod`` (default): ``HorovodStrategy``. ``mwms``: TensorFlow's own
``tf.distribute.MultiWorkerMirroredStrategy``, so the same tests show where ours is a drop-in
and where the two differ. MWMS needs ``TF_CONFIG``: under ``mpirun`` (or ``horovodrun``) each
rank builds it from its launcher rank and size, with one free localhost port per rank picked by
that rank and shared over mpi4py. MWMS also needs TensorFlow's collectives configured before
the eager context starts, so ``create_strategy()`` is called from conftest.py at import time
(before any TensorFlow op) and returns that one instance to every test.

    HVDC_TEST_STRATEGY=mwms mpirun -np 2 python -m pytest tests/python/test_strategy.py
"""

import json
import os
import socket
from typing import Any, List, Optional

import pytest

KIND = os.environ.get("HVDC_TEST_STRATEGY", "horovod").strip().lower() or "horovod"
if KIND not in ("horovod", "mwms"):
    raise ValueError(f"HVDC_TEST_STRATEGY must be 'horovod' or 'mwms', not {KIND!r}")
UNDER_MWMS = KIND == "mwms"

_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK")
_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE")
_instance: Optional[Any] = None


def _launcher_value(names: tuple, default: int) -> int:
    for name in names:
        if os.environ.get(name, "").strip().isdigit():
            return int(os.environ[name])
    return default


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _ports_of_all_ranks(size: int) -> List[int]:
    if size == 1:
        return [_free_port()]
    from mpi4py import MPI  # the job's ranks agree on every rank's port
    return MPI.COMM_WORLD.allgather(_free_port())


def set_tf_config() -> None:
    """TF_CONFIG for this rank of the launcher's job: worker i listens on localhost:port_i."""
    rank = _launcher_value(_RANK_VARIABLES, 0)
    size = _launcher_value(_SIZE_VARIABLES, 1)
    ports = _ports_of_all_ranks(size)
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{p}" for p in ports]},
        "task": {"type": "worker", "index": rank}})


def create_strategy() -> Any:
    """The strategy under test (one per process; MWMS cannot be made twice)."""
    global _instance
    if _instance is None:
        import tensorflow as tf
        if UNDER_MWMS:
            set_tf_config()
            _instance = tf.distribute.MultiWorkerMirroredStrategy()
        else:
            from horovod_compat.tensorflow.distribute import HorovodStrategy
            _instance = HorovodStrategy()
    return _instance


def horovod_only(what_mwms_does: str) -> Any:
    """Skips a test of something MWMS does not offer; the reason says what MWMS does."""
    return pytest.mark.skipif(UNDER_MWMS, reason=f"HorovodStrategy only: {what_mwms_does}")


def mwms_differs(how: str, raises: Any = None, run: bool = True) -> Any:
    """Marks a test where MWMS gives another answer than ours (the issue says ours is right) as
    an expected failure under MWMS, strictly (an unexpected pass fails); ``raises``: the error
    MWMS gives; run=False when under MWMS the test would hang."""
    return pytest.mark.xfail(UNDER_MWMS, reason=f"MWMS differs: {how}", raises=raises, run=run,
                             strict=True)


def keras3_compiled_model_fails_under_mwms() -> Any:
    """Keras 3's fit/evaluate/predict of a compiled model, which MWMS + Keras 3.15 cannot run."""
    return mwms_differs(
        "Keras 3.15 builds a compiled model by strategy.reduce()-ing the first distributed "
        "(x, y) batch eagerly; under MWMS that raises ValueError 'Attempt to convert a value "
        "(PerReplica:...) with an unsupported type to a Tensor' (bench/b5_keras.py works "
        "around it), so fit/evaluate/predict fail", raises=ValueError)
