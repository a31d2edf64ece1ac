"""Keras callbacks that keep an elastic state object current during ``fit``;
shared by ``horovod.tensorflow.keras.elastic`` and ``horovod.keras.elastic``.

Together they keep ``state.epoch`` (epochs finished) and ``state.batch`` (batches finished in
the current epoch) equal to the training the committed weights contain, whatever order the
callbacks are listed in: a commit falls due at a batch's or epoch's end but is taken just
before the next batch or epoch starts (or when ``fit`` ends), after every callback has seen the
end. A resumed job then repeats no committed batch and skips none (docs/elastic.md).
"""

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
        self._commit_due = False

    def _commit_if_due(self) -> None:
        if self._commit_due:
            self._commit_due = False
            # state.commit(), not save(): a subclass's commit() sees every commit, and it
            # checks for host updates (collective in an elastic job, at the same point on
            # every rank).
            self.state.commit()

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        # Every rank starts counting at the same batch, so the commits line up.
        self.batches_remaining = self.batches_per_commit
        self._commit_due = False

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._commit_if_due()

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._commit_if_due()

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self._commit_due = True
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        # Replaces a batch commit still due: nothing trained since, and one snapshot of the
        # finished epoch is what a resumed job needs.
        self._commit_due = True

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._commit_if_due()


class UpdateBatchStateCallbackImpl:
    """Keeps ``state.batch`` at the number of batches finished in the current epoch (0 after
    the epoch), counting the ones finished before a reset: when an epoch starts with
    ``state.batch > 0`` (training resumed inside an epoch, with ``fit`` asked for the remaining
    ``steps_per_epoch - state.batch`` steps) its batches count on from there. When
    ``params['steps']`` is known, it is shown reduced by ``state.batch`` (Horovod's progress
    bar behaviour; ``fit`` itself runs the steps it was given)."""

    def __init__(self, backend: Any, state: Any) -> None:
        super().__init__()
        self.backend = backend
        self.state = state
        self.steps_per_epoch: Optional[int] = None
        self._offset = 0

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._offset = self.state.batch
        params = getattr(self, "params", None) or {}
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params["steps"]
            params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = self._offset + batch + 1

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = 0
        self._offset = 0


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
