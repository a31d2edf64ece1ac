"""Keras callbacks (docs/keras.md), ported to Keras 3: no ``ref()``, ``optimizer.variables`` as a
list, learning rate read and written through ``optimizer.learning_rate``."""

import os
import sys
import warnings
from typing import Any, Callable, Optional, Union

import numpy as np
import tensorflow as tf
import keras

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.functions import broadcast_variables
from horovod_compat.tensorflow.reductions import allreduce
from horovod_compat.tensorflow.util import _VariableRef
from horovod_compat._keras import keras2


def _as_list(value: Any) -> list:
    return list(value() if callable(value) else value)


def _to_float(value: Any) -> float:
    if hasattr(value, "numpy"):
        value = value.numpy()
    elif not isinstance(value, (int, float, np.generic, np.ndarray)):
        value = keras.ops.convert_to_numpy(value)
    return float(np.asarray(value))


def _get_lr(optimizer: Any) -> float:
    lr = optimizer.learning_rate if hasattr(optimizer, "learning_rate") else optimizer.lr
    return _to_float(lr)


def _has_momentum_hyper(optimizer: Any) -> bool:
    """tf_keras legacy (OptimizerV2) optimizers keep ``momentum`` as a hyperparameter that the
    update reads at run time, so it can be changed between batches."""
    hyper = getattr(optimizer, "_hyper", None)
    return isinstance(hyper, dict) and "momentum" in hyper


def callback_bases() -> tuple:
    """Keras 3's ``Callback``, plus tf_keras's when ``tf.keras`` is tf_keras in this process (or
    tf_keras was imported before horovod_compat's Keras modules), so
    that one callback object serves a model of either Keras (tf_keras's ``fit`` needs the
    ``_implements_*_hooks`` methods of its own base class)."""
    if keras2.tf_keras_active() or "tf_keras" in sys.modules:
        return (keras.callbacks.Callback, keras2._tf_keras().callbacks.Callback)
    return (keras.callbacks.Callback,)


def _set_lr(optimizer: Any, value: float) -> None:
    if hasattr(optimizer, "learning_rate"):
        optimizer.learning_rate = value
    else:
        optimizer.lr = value


class BroadcastGlobalVariablesCallbackImpl:
    # Read by tf_keras's CallbackList when the callback also derives from tf_keras's base.
    _supports_tf_logs = False
    _chief_worker_only = None

    def __init__(self, backend: Any, root_rank: int, device: str = "",
                 local_variables: Any = None, *args: Any) -> None:
        super().__init__(*args)
        self.backend = backend
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple)):
            local_variables = [local_variables]
        for var in local_variables:
            if not isinstance(var, (tf.Variable, keras.Variable)):
                raise ValueError("local_variables must be a variable or a list of variables")
        self.local_variables = {_VariableRef(v) for v in local_variables}

    def register_local_var(self, var: Any) -> None:
        self.local_variables.add(_VariableRef(var))

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.broadcast_done:
            return
        with tf.device(self.device):
            model_vars = [v for v in self.model.variables
                          if _VariableRef(v) not in self.local_variables]
            broadcast_variables(model_vars, root_rank=self.root_rank)
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None:
                opt_vars = [v for v in _as_list(optimizer.variables)
                            if _VariableRef(v) not in self.local_variables]
                if opt_vars:
                    broadcast_variables(opt_vars, root_rank=self.root_rank)
        self.broadcast_done = True


class MetricAverageCallbackImpl:
    # Read by tf_keras's CallbackList when the callback also derives from tf_keras's base.
    _supports_tf_logs = False
    _chief_worker_only = None

    def __init__(self, backend: Any, device: str = "", *args: Any) -> None:
        super().__init__(*args)
        self.backend = backend
        self.device = device

    def _average_metrics_in_place(self, logs: Any) -> None:
        if not logs:
            return
        with tf.device(self.device):
            for metric in sorted(logs):
                value = logs[metric]
                try:
                    tensor = tf.constant(np.asarray(value, dtype=np.float32))
                except (TypeError, ValueError):
                    continue
                reduced = allreduce(tensor, name=f"metric_average.{metric}", op=mpi_ops.Average)
                logs[metric] = float(reduced.numpy())

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._average_metrics_in_place(logs)


class LearningRateScheduleCallbackImpl:
    # Read by tf_keras's CallbackList when the callback also derives from tf_keras's base.
    _supports_tf_logs = False
    _chief_worker_only = None

    def __init__(self, backend: Any, initial_lr: float, multiplier: Union[float, Callable],
                 start_epoch: int = 0, end_epoch: Optional[int] = None,
                 staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, *args: Any) -> None:
        super().__init__(*args)
        self.backend = backend
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self._warned_momentum = False
        self.restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            factor = multiplier
            self.multiplier = lambda epoch: factor ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self) -> int:
        steps = (self.params or {}).get("steps")
        if steps:
            return int(steps)
        samples = (self.params or {}).get("samples")
        batch_size = (self.params or {}).get("batch_size")
        if samples and batch_size:
            return int(samples) // int(batch_size)
        raise ValueError("Could not autodetect the number of steps per epoch; pass "
                         "steps_per_epoch to the callback.")

    def _active(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        new_lr = self.initial_lr * self.multiplier(epoch)
        if self.momentum_correction and _has_momentum_hyper(optimizer):
            # tf_keras legacy optimizers: scale momentum by new_lr / old_lr for this batch
            # (restored at batch end), as Horovod does on Keras 2.
            old_lr = _get_lr(optimizer)
            _set_lr(optimizer, new_lr)
            momentum = _to_float(optimizer._get_hyper("momentum"))
            if momentum and old_lr:
                self.restore_momentum = momentum
                optimizer._set_hyper("momentum", momentum * new_lr / old_lr)
            return
        _set_lr(optimizer, new_lr)
        if (self.momentum_correction and not self._warned_momentum
                and getattr(optimizer, "momentum", 0)):
            # Keras 3 captures `momentum` as a Python float when the train step is traced, so
            # scaling it for one batch has no effect.
            warnings.warn("Momentum correction is not supported with Keras 3 optimizers or "
                          "tf_keras.optimizers.Optimizer (momentum is a constant of the traced "
                          "update); it is ignored.")
            self._warned_momentum = True

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum is not None:
            self.model.optimizer._set_hyper("momentum", self.restore_momentum)
            self.restore_momentum = None

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self._restore_momentum_if_needed()

    def on_train_end(self, logs: Any = None) -> None:
        self._restore_momentum_if_needed()

    def on_train_begin(self, logs: Any = None) -> None:
        if self.steps_per_epoch is None and not self.staircase:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch

    def on_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.current_epoch is None or not self._active(self.current_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallbackImpl(LearningRateScheduleCallbackImpl):
    def __init__(self, backend: Any, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0, *args: Any) -> None:
        def multiplier(epoch: float) -> float:
            # Shift by one step so that the last step of the warm-up reaches initial_lr exactly.
            epoch += 1.0 / self.steps_per_epoch
            size = mpi_ops.size()
            return (epoch * (size - 1) / warmup_epochs + 1) / size

        super().__init__(backend, initial_lr, multiplier, start_epoch=0,
                         end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, *args)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and mpi_ops.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_lr(self.model.optimizer):g}.")



class BestModelCheckpointImpl(keras.callbacks.ModelCheckpoint):
    """``ModelCheckpoint(save_best_only=True)`` that writes on rank 0 only.

    Horovod passes ``filepath=None`` and lets the caller assign ``filepath`` later; Keras 3
    validates the path in the constructor, so the check (``.keras``/``.h5``, or
    ``.weights.h5`` with ``save_weights_only``) moves to ``on_train_begin``. Every rank tracks
    the best value (so ``best`` agrees when the monitored metric is averaged); only rank 0
    saves."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto",
                 save_freq: Union[str, int] = "epoch", filepath: Any = None) -> None:
        # A valid placeholder satisfies Keras 3's constructor; the real path is checked later.
        placeholder = "unset.weights.h5" if save_weights_only else "unset.keras"
        super().__init__(filepath=placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
        self.filepath = None if filepath is None else os.fspath(filepath)

    def _check_filepath(self) -> None:
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint: assign `filepath` (or pass filepath=...) "
                             "before training.")
        self.filepath = os.fspath(self.filepath)
        if self.save_weights_only:
            if not self.filepath.endswith(".weights.h5"):
                raise ValueError("BestModelCheckpoint(save_weights_only=True): filepath must "
                                 f"end in '.weights.h5', got {self.filepath!r}")
        elif not self.filepath.endswith((".keras", ".h5")):
            raise ValueError("BestModelCheckpoint: filepath must end in '.keras' or '.h5', "
                             f"got {self.filepath!r}")

    def on_train_begin(self, logs: Any = None) -> None:
        self._check_filepath()
        super().on_train_begin(logs)

    def _save_model(self, epoch: int, batch: Any, logs: Any) -> None:
        if mpi_ops.rank() == 0:
            super()._save_model(epoch, batch, logs)
            return
        verbose, self.verbose = self.verbose, 0
        try:
            self._should_save_model(epoch, batch, logs,
                                    self._get_file_path(epoch, batch, logs))
        finally:
            self.verbose = verbose


def tf_keras_best_model_checkpoint_base() -> type:
    """``BestModelCheckpoint`` for tf_keras models: tf_keras's ``ModelCheckpoint`` accepts
    ``filepath=None`` (assigned later, as in Horovod); only rank 0 writes."""
    tfk_callbacks = keras2._tf_keras().callbacks

    class BestModelCheckpointTFKerasImpl(tfk_callbacks.ModelCheckpoint):
        def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                     save_weights_only: bool = False, mode: str = "auto",
                     save_freq: Union[str, int] = "epoch", filepath: Any = None) -> None:
            super().__init__(filepath=None, monitor=monitor, verbose=verbose,
                             save_best_only=True, save_weights_only=save_weights_only,
                             mode=mode, save_freq=save_freq)
            self.filepath = None if filepath is None else os.fspath(filepath)

        def on_train_begin(self, logs: Any = None) -> None:
            if self.filepath is None:
                raise ValueError("BestModelCheckpoint: assign `filepath` (or pass "
                                 "filepath=...) before training.")
            self.filepath = os.fspath(self.filepath)
            super().on_train_begin(logs)

        def _save_handler(self, filepath: str) -> None:
            if mpi_ops.rank() == 0:
                super()._save_handler(filepath)

        def _save_model(self, epoch: int, batch: Any, logs: Any) -> None:
            if mpi_ops.rank() == 0:
                super()._save_model(epoch, batch, logs)
                return
            verbose, self.verbose = self.verbose, 0
            try:
                super()._save_model(epoch, batch, logs)
            finally:
                self.verbose = verbose

    return BestModelCheckpointTFKerasImpl
