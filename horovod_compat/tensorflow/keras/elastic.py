"""Elastic state and callbacks for Keras (``horovod.tensorflow.keras.elastic``)."""

from typing import Any

from keras import backend as K

from horovod_compat._keras import callbacks as _callbacks
from horovod_compat._keras import elastic as _impl
from horovod_compat.common.elastic import ObjectState  # noqa: F401
from horovod_compat.tensorflow.elastic import (TensorFlowKerasState,  # noqa: F401
                                               TensorFlowState, run)

_BASES = _callbacks.callback_bases()


class KerasState(TensorFlowKerasState):
    """Elastic state of a built Keras ``model`` and its ``optimizer`` (default
    ``model.optimizer``); extra keyword values become attributes (``epoch``, ``batch``...)."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=K, **kwargs)


class CommitStateCallback(_impl.CommitStateCallbackImpl, *_BASES):
    """Commits ``state`` every ``batches_per_commit`` batches and at every epoch end."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__(K, state, batches_per_commit)


class UpdateBatchStateCallback(_impl.UpdateBatchStateCallbackImpl, *_BASES):
    """Tracks the batch within the epoch in ``state.batch``."""

    def __init__(self, state: Any) -> None:
        super().__init__(K, state)


class UpdateEpochStateCallback(_impl.UpdateEpochStateCallbackImpl, *_BASES):
    """Tracks the number of finished epochs in ``state.epoch``."""

    def __init__(self, state: Any) -> None:
        super().__init__(K, state)
