"""Elastic training (horovod.tensorflow.elastic): not implemented yet.

The module imports so that scripts referencing it load; using run() or the state classes raises
NotImplementedError.
"""

from typing import Any, Callable

_MESSAGE = ("Elastic training is not supported by horovod_compat yet; launch a fixed number "
            "of processes with mpirun or horovodrun instead.")


def run(func: Callable) -> Callable:
    """Elastic training decorator (not implemented)."""
    raise NotImplementedError(_MESSAGE)


class TensorFlowState:
    """Elastic state of TensorFlow variables (not implemented)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(_MESSAGE)


class TensorFlowKerasState:
    """Elastic state of a Keras model and optimizer (not implemented)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(_MESSAGE)


__all__ = ["run", "TensorFlowState", "TensorFlowKerasState"]
