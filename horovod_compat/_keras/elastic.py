"""Keras callbacks that keep an elastic state object current during ``fit``;
shared by ``horovod.tensorflow.keras.elastic`` and ``horovod.keras.elastic``."""

from typing import Any, Dict, Optional


class CommitStateCallbackImpl:
    """Commits ``state`` every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, backend: Any, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be at least 1, got {batches_per_commit}")
        self.backend = backend
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        # Every rank starts counting at the same batch, so the commits (collective in an
        # elastic job) line up.
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.commit()


class UpdateBatchStateCallbackImpl:
    """Keeps ``state.batch`` at the index of the last finished batch of the epoch (0 after the
    epoch). When an epoch starts with ``state.batch > 0`` (training resumed inside an epoch)
    and ``params['steps']`` is known, the epoch's step count is reduced by ``state.batch``."""

    def __init__(self, backend: Any, state: Any) -> None:
        super().__init__()
        self.backend = backend
        self.state = state
        self.steps_per_epoch: Optional[int] = None

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        params = getattr(self, "params", None) or {}
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params["steps"]
            params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallbackImpl:
    """Sets ``state.epoch`` to the number of epochs finished, counted across ``fit`` calls:
    the value ``state.epoch`` had when ``fit`` began plus the epochs this ``fit`` finished.
    (Horovod adds Keras' epoch index instead, which double-counts when ``fit`` is called with
    ``initial_epoch=state.epoch``; both agree when ``fit`` counts epochs from 0.)"""

    def __init__(self, backend: Any, state: Any) -> None:
        super().__init__()
        self.backend = backend
        self.state = state
        self.initial_epoch = state.epoch
        self._first_epoch: Optional[int] = None

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self.initial_epoch = self.state.epoch
        self._first_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._first_epoch is None:
            self._first_epoch = epoch

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        first = epoch if self._first_epoch is None else self._first_epoch
        self.state.epoch = self.initial_epoch + (epoch - first) + 1
