"""Shared fixtures for the horovod_compat TensorFlow tests.

Every rank of an ``mpirun`` job runs the same tests in the same order, so collectives match up
across ranks. Tests never skip or branch on anything that differs between ranks except where
they deliberately test such a difference.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Process sets are added and removed at run time by the process-set tests.
os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")

from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.tensorflow as hvd  # noqa: E402
import strategy_under_test  # noqa: E402

if strategy_under_test.UNDER_MWMS:
    # MWMS configures TensorFlow's collectives, which must happen before any TensorFlow op.
    strategy_under_test.create_strategy()

MODES = ["eager", "function", "graph"]


@pytest.fixture(scope="session", autouse=True)
def _horovod() -> Any:
    hvd.init()
    yield hvd


def run_in_mode(mode: str, fn: Callable[[], Any]) -> Any:
    """Builds and runs ``fn`` eagerly, inside tf.function or in a tf.compat.v1 graph + Session;
    returns numpy values (same nesting as fn's result)."""
    if mode == "eager":
        out = fn()
    elif mode == "function":
        out = tf.function(fn)()
    elif mode == "graph":
        with tf.Graph().as_default():
            graph_out = fn()
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                return session.run(graph_out)
    else:
        raise ValueError(mode)
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)


@pytest.fixture(params=MODES)
def mode(request: Any) -> str:
    return request.param


def rank_tensor(shape: Any, dtype: Any, rank: int, offset: int = 0) -> np.ndarray:
    """Deterministic test data: small integers depending on rank and position."""
    n = int(np.prod(shape)) if len(shape) else 1
    values = (np.arange(n) * 3 + rank * 7 + offset) % 11
    np_dtype = tf.as_dtype(dtype).as_numpy_dtype
    if np_dtype == bool:
        return (values % 2 == 0).reshape(shape)
    return values.astype(np_dtype).reshape(shape)
