"""Keras callbacks of ``horovod.keras`` (docs/keras.md): with Keras 3 both Horovod namespaces share
one Keras, so these are the classes of ``horovod_compat.tensorflow.keras.callbacks``, except
``BestModelCheckpoint`` whose ``horovod.keras`` signature has no ``save_weights_only``."""

from typing import Any, Union

from horovod_compat._keras import callbacks as _impl
from horovod_compat.tensorflow.keras.callbacks import (  # noqa: F401
    _CHECKPOINT_BASE,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)


class BestModelCheckpoint(_CHECKPOINT_BASE):  # type: ignore[misc, valid-type]
    """Saves the whole model whenever ``monitor`` improves, on rank 0 only. ``filepath``
    (ending in ``.keras`` or ``.h5``) may be passed or assigned to the ``filepath`` attribute
    before ``fit``."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, mode: str = "auto",
                 save_freq: Union[str, int] = "epoch", filepath: Any = None) -> None:
        super().__init__(monitor, verbose, False, mode, save_freq, filepath)
