"""Elastic training shared by the frontends (``horovod.common.elastic``;
docs/elastic.md).

A ``State`` holds what a training loop must keep across a failure: ``commit()`` snapshots it
in host memory, ``restore()`` rolls back to the last snapshot, ``sync()`` gives every rank rank
0's snapshot. ``run_fn`` is the retry loop of ``hvd.elastic.run``: a lost worker
(``HorovodInternalError``) rolls back to the last commit, and a change of hosts
(``HostsUpdatedInterrupt``, raised by ``commit()``/``check_host_updates()``) keeps the current
values; both then re-initialise Horovod in the launcher's next round and synchronise.
Outside an elastic launch no host updates arrive and ``check_host_updates()`` costs nothing.
"""

import enum
import functools
import os
import queue
from typing import Any, Callable, Dict, List, Optional, Tuple

from horovod_compat.common import elastic_rendezvous
from horovod_compat.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt


class HostUpdateResult(enum.IntFlag):
    """What changed in a host update: hosts removed, added, or both."""
    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


def _in_elastic_job() -> bool:
    return os.environ.get("HOROVOD_ELASTIC", "0") == "1"


class State:
    """Training state kept across resets.

    ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank; ``get_rank()`` returns this
    worker's rank. Subclasses implement ``save``, ``restore`` and ``sync``.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: "queue.Queue[Tuple[float, int]]" = queue.Queue()
        self._last_updated_timestamp = 0.0
        self._reset_callbacks: List[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: List[Callable[[], Any]]) -> None:
        """Adds functions called (in order, without arguments) after every reset, for example
        to rescale the learning rate to the new number of workers."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called after the job was reset: forgets pending host updates, runs the callbacks."""
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: int) -> None:
        """Records a host update (sent by the elastic driver) for ``check_host_updates``."""
        self._host_messages.put((timestamp, int(update_res)))

    def commit(self) -> None:
        """Snapshots the state (``save()``) and then checks for host updates, which raises
        ``HostsUpdatedInterrupt`` when hosts changed. Commits copy every tracked value to host
        memory, so commit every few batches rather than every batch."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises ``HostsUpdatedInterrupt`` when hosts changed since the last check
        (``skip_sync`` True only when hosts were only removed: the survivors' state is
        already the same everywhere).

        In an elastic job every rank must take the same path, even a worker that joined in the
        last round and has seen no update yet: rank 0 asks the launcher for its latest host
        change, adds the updates delivered to it by ``on_hosts_updated``, and broadcasts its
        previous timestamp, the latest one and what changed; every rank decides on those.
        Outside an elastic job no update is sent, and this costs nothing (no collective)."""
        previous = self._last_updated_timestamp
        latest, changes = previous, HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, update_res = self._host_messages.get()
            if timestamp > latest:
                latest = timestamp
            if timestamp > previous:
                changes |= HostUpdateResult(update_res)
        if _in_elastic_job():
            failure = None
            if self._rank() == 0 and elastic_rendezvous.configured(os.environ):
                # Changes the current round formed with are not news (rank 0 may be a worker
                # new to the job, which has seen no update at all).
                previous = max(previous, elastic_rendezvous.round_hosts_event())
                latest = max(latest, previous)
                try:
                    timestamp, kind = elastic_rendezvous.watched_hosts_event(os.environ)
                    if timestamp > previous:
                        latest = max(latest, timestamp)
                        changes |= HostUpdateResult(kind)
                except (OSError, RuntimeError, ValueError) as error:
                    # Every rank raises it together rather than rank 0 alone leaving the others
                    # waiting in the broadcast.
                    failure = f"rank 0 could not ask the launcher for host updates: {error}"
            previous, latest, changes, failure = self._bcast_object(
                (previous, latest, int(changes), failure))
            changes = HostUpdateResult(changes)
            if failure:
                raise RuntimeError(failure)
        self._last_updated_timestamp = latest
        if latest > previous:
            raise HostsUpdatedInterrupt(changes == HostUpdateResult.removed)

    def save(self) -> None:
        """Snapshots the state in host memory."""
        raise NotImplementedError(f"{type(self).__name__} must implement save()")

    def restore(self) -> None:
        """Rolls back to the last snapshot, dropping uncommitted changes."""
        raise NotImplementedError(f"{type(self).__name__} must implement restore()")

    def sync(self) -> None:
        """Makes every rank's state rank 0's."""
        raise NotImplementedError(f"{type(self).__name__} must implement sync()")

    def reset(self) -> None:
        """Hook for subclasses: called on every reset, before the reset callbacks."""


class ObjectState(State):
    """State made of plain Python objects, given as keyword arguments; each becomes an
    attribute. ``save()`` snapshots the attributes, ``restore()`` sets them back from the
    snapshot and ``sync()`` replaces every rank's snapshot (and attributes) by rank 0's."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int],
                 **kwargs: Any) -> None:
        self._saved_state: Dict[str, Any] = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)


def run_fn(func: Callable[..., Any], reset: Callable[[], Any],
           sync_needed_anywhere: Optional[Callable[[bool], bool]] = None) -> Callable[..., Any]:
    """The elastic retry loop around ``func(state, ...)`` (what ``hvd.elastic.run`` returns).

    Each attempt synchronises the state from rank 0 and calls ``func``. On
    ``HorovodInternalError`` (a worker was lost) the state rolls back to its last commit; on
    ``HostsUpdatedInterrupt`` it keeps its values. Then ``reset()`` re-initialises Horovod in
    the launcher's next round, ``state.on_reset()`` runs the reset callbacks, and the next
    attempt synchronises -- unless hosts were only removed, when the survivors already agree.
    ``sync_needed_anywhere(mine)`` (a collective: True when any rank passes True) makes that
    skip safe: a worker that joined in the new round always needs the sync, and then every rank
    takes it. Outside an elastic job (``HOROVOD_ELASTIC`` not 1) there is no next round to
    join, so both exceptions propagate."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        needs_reset, skip_sync = False, False
        while True:
            try:
                if needs_reset:
                    reset()
                    state.on_reset()
                    needs_reset = False
                if _in_elastic_job() and sync_needed_anywhere is not None:
                    skip_sync = not sync_needed_anywhere(not skip_sync)
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                if not _in_elastic_job():
                    raise
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                if not _in_elastic_job():
                    raise
                skip_sync = interrupt.skip_sync
            needs_reset = True

    return wrapper


__all__ = ["State", "ObjectState", "HostUpdateResult", "run_fn", "HorovodInternalError",
           "HostsUpdatedInterrupt"]
