"""Elastic training for TensorFlow (``horovod.tensorflow.elastic``; docs/elastic.md).

``TensorFlowState`` and ``TensorFlowKerasState`` keep variables (and any extra keyword values)
across failures: ``commit()`` copies them to host memory, ``restore()`` assigns the copy back,
``sync()`` broadcasts rank 0's values to every rank. ``run`` wraps a training function in the
elastic retry loop (``horovod_compat.common.elastic.run_fn``).
"""

import functools
from typing import Any, Callable, List, Optional

import numpy as np
import tensorflow as tf

from horovod_compat.common.elastic import ObjectState, State, run_fn  # noqa: F401
from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.functions import (broadcast_object, broadcast_object_fn,
                                                 broadcast_variables)
from horovod_compat.tensorflow.mpi_ops import rank
from horovod_compat.tensorflow.peer_lost import to_internal_error
from horovod_compat.tensorflow.util import _executing_eagerly


def run(func: Callable) -> Callable:
    """Elastic training decorator: ``func(state, ...)`` is retried after a reset.

    A lost worker (``HorovodInternalError``; in TensorFlow a lost peer's ``UnknownError`` is
    one) rolls ``state`` back to its last commit; a host change (``HostsUpdatedInterrupt``
    from ``state.commit()``) keeps it. Either way Horovod is shut down and initialised again in
    the launcher's next round (new rank and size), the reset callbacks run and rank 0's state
    is broadcast. Any other error, a ``tf.errors.UnknownError`` that is not a lost peer
    included, propagates unchanged."""

    @functools.wraps(func)
    def lost_peer_as_internal_error(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as error:
            # Graph-mode sessions raise a lost peer as a plain UnknownError with the payload.
            converted = to_internal_error(error)
            if converted is error:
                raise
            raise converted from None

    return run_fn(lost_peer_as_internal_error, _reset, _sync_needed_anywhere)


def _reset() -> None:
    mpi_ops.shutdown()
    mpi_ops.init()


def _sync_needed_anywhere(mine: bool) -> bool:
    """True on every rank when any rank passes True (a Max allreduce of one integer)."""
    name = "elastic.sync_needed"
    if _executing_eagerly():
        flag = tf.constant([1 if mine else 0], dtype=tf.int32)
        return bool(mpi_ops._allreduce(flag, name=name, op=mpi_ops.Max).numpy()[0])
    with tf.Graph().as_default():  # TF1 style (eager disabled): a graph of its own
        flag = tf.constant([1 if mine else 0], dtype=tf.int32)
        total = mpi_ops._allreduce(flag, name=name, op=mpi_ops.Max)
        with tf.compat.v1.Session() as session:
            return bool(session.run(total)[0])


def _copy_to_host(var: Any) -> np.ndarray:
    return np.array(var.numpy(), copy=True)


def _optimizer_variables(optimizer: Any) -> List[Any]:
    """Keras 3 and tf_keras' new optimizers have a ``variables`` property, tf_keras' legacy
    optimizers a ``variables()`` method."""
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


class TensorFlowState(ObjectState):
    """Elastic state of TensorFlow variables (default: the global variables) plus the extra
    keyword values (each an attribute). In graph mode pass the ``session`` the variables live
    in (default: the default session)."""

    def __init__(self, variables: Optional[List[Any]] = None, session: Any = None,
                 **kwargs: Any) -> None:
        self.variables = list(variables or tf.compat.v1.global_variables())
        self._eager = _executing_eagerly()
        if self._eager:
            self.session = session
            bcast_object = broadcast_object
        else:
            self.session = session or tf.compat.v1.get_default_session()
            if self.session is None:
                raise ValueError("TensorFlowState in graph mode needs a session: pass "
                                 "session= or create it inside a default session.")
            self._bcast_op = broadcast_variables(self.variables, root_rank=0)
            bcast_object = broadcast_object_fn(session=self.session)
        self._values = self._read()
        super().__init__(bcast_object=bcast_object, get_rank=rank, **kwargs)

    def _read(self) -> List[np.ndarray]:
        if self._eager:
            return [_copy_to_host(v) for v in self.variables]
        return [np.array(v, copy=True) for v in self.session.run(self.variables)]

    def save(self) -> None:
        self._values = self._read()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self.variables, self._values):
            if self._eager:
                var.assign(value)
            else:
                var.load(value, self.session)
        super().restore()

    def sync(self) -> None:
        if self.variables:
            if self._eager:
                broadcast_variables(self.variables, root_rank=0)
            else:
                self.session.run(self._bcast_op)
        self._values = self._read()
        super().sync()


class TensorFlowKerasState(ObjectState):
    """Elastic state of a built Keras ``model`` and its ``optimizer`` (default:
    ``model.optimizer``) plus the extra keyword values (each an attribute), in eager mode.
    ``backend`` is accepted for Horovod's signature and unused."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        if not getattr(model, "built", False):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        if not _executing_eagerly():
            raise RuntimeError("TensorFlowKerasState needs eager execution (TensorFlow 2's "
                               "default); in graph mode use TensorFlowState with a session.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer",
                                                                         None)
        self.backend = backend
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _save_model(self) -> None:
        self._saved_model_state = [_copy_to_host(v) for v in self.model.variables]
        self._saved_optimizer_state = [_copy_to_host(v)
                                       for v in _optimizer_variables(self.optimizer)]

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self.model.variables, self._saved_model_state):
            var.assign(value)
        optimizer_variables = _optimizer_variables(self.optimizer)
        if len(optimizer_variables) == len(self._saved_optimizer_state):
            for var, value in zip(optimizer_variables, self._saved_optimizer_state):
                var.assign(value)
        super().restore()

    def sync(self) -> None:
        model_variables = list(self.model.variables)
        if model_variables:
            broadcast_variables(model_variables, root_rank=0)
        optimizer_variables = _optimizer_variables(self.optimizer)
        if optimizer_variables:
            broadcast_variables(optimizer_variables, root_rank=0)
        self._save_model()
        super().sync()


__all__ = ["run", "TensorFlowState", "TensorFlowKerasState"]
