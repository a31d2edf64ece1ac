"""Keras callbacks of ``horovod.tensorflow.keras`` (API.md 2.6)."""

from typing import Any, Callable, Optional, Union

import keras
from keras import backend as K

from horovod_compat._keras import callbacks as _impl


class BroadcastGlobalVariablesCallback(_impl.BroadcastGlobalVariablesCallbackImpl,
                                       keras.callbacks.Callback):
    """Broadcasts model and optimizer variables from ``root_rank`` after the first batch."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__(K, root_rank, device, local_variables)


class MetricAverageCallback(_impl.MetricAverageCallbackImpl, keras.callbacks.Callback):
    """Averages the epoch-end metrics across ranks (list it before callbacks reading them)."""

    def __init__(self, device: str = "") -> None:
        super().__init__(K, device)


class LearningRateScheduleCallback(_impl.LearningRateScheduleCallbackImpl,
                                   keras.callbacks.Callback):
    def __init__(self, initial_lr: float, multiplier: Union[float, Callable],
                 start_epoch: int = 0, end_epoch: Optional[int] = None,
                 staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None) -> None:
        super().__init__(K, initial_lr, multiplier, start_epoch, end_epoch, staircase,
                         momentum_correction, steps_per_epoch)


class LearningRateWarmupCallback(_impl.LearningRateWarmupCallbackImpl, keras.callbacks.Callback):
    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0) -> None:
        super().__init__(K, initial_lr, warmup_epochs, momentum_correction, steps_per_epoch,
                         verbose)


class BestModelCheckpoint(_impl.BestModelCheckpointImpl):
    """Saves the model (or, with ``save_weights_only``, its weights) whenever ``monitor``
    improves, on rank 0 only. ``filepath`` (ending in ``.keras``/``.h5``, or ``.weights.h5``)
    may be passed or assigned to the ``filepath`` attribute before ``fit``."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto",
                 save_freq: Union[str, int] = "epoch", filepath: Any = None) -> None:
        super().__init__(monitor, verbose, save_weights_only, mode, save_freq, filepath)
