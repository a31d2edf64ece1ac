"""Keras callbacks of ``horovod.tensorflow.keras`` (docs/keras.md, "Callbacks")."""

from typing import Any, Callable, Optional, Union

from keras import backend as K

from horovod_compat._keras import callbacks as _impl
from horovod_compat._keras import keras2 as _keras2

# With TF_USE_LEGACY_KERAS=1 (tf.keras is tf_keras) the callbacks also derive from
# tf_keras.callbacks.Callback, so they work in the fit() of either Keras.
_BASES = _impl.callback_bases()
_CHECKPOINT_BASE = (_impl.tf_keras_best_model_checkpoint_base() if _keras2.tf_keras_active()
                    else _impl.BestModelCheckpointImpl)


class BroadcastGlobalVariablesCallback(_impl.BroadcastGlobalVariablesCallbackImpl, *_BASES):
    """Broadcasts model and optimizer variables from ``root_rank`` after the first batch."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__(K, root_rank, device, local_variables)


class MetricAverageCallback(_impl.MetricAverageCallbackImpl, *_BASES):
    """Averages the epoch-end metrics across ranks (list it before callbacks reading them)."""

    def __init__(self, device: str = "") -> None:
        super().__init__(K, device)


class LearningRateScheduleCallback(_impl.LearningRateScheduleCallbackImpl, *_BASES):
    def __init__(self, initial_lr: float, multiplier: Union[float, Callable],
                 start_epoch: int = 0, end_epoch: Optional[int] = None,
                 staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None) -> None:
        super().__init__(K, initial_lr, multiplier, start_epoch, end_epoch, staircase,
                         momentum_correction, steps_per_epoch)


class LearningRateWarmupCallback(_impl.LearningRateWarmupCallbackImpl, *_BASES):
    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0) -> None:
        super().__init__(K, initial_lr, warmup_epochs, momentum_correction, steps_per_epoch,
                         verbose)


class BestModelCheckpoint(_CHECKPOINT_BASE):  # type: ignore[misc, valid-type]
    """Saves the model (or, with ``save_weights_only``, its weights) whenever ``monitor``
    improves, on rank 0 only. ``filepath`` (ending in ``.keras``/``.h5``, or ``.weights.h5``)
    may be passed or assigned to the ``filepath`` attribute before ``fit``."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto",
                 save_freq: Union[str, int] = "epoch", filepath: Any = None) -> None:
        super().__init__(monitor, verbose, save_weights_only, mode, save_freq, filepath)
