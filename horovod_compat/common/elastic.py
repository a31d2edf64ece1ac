"""Elastic training state shared by the frontends (``horovod.common.elastic``).

A ``State`` holds what a training loop must keep across a failure: ``commit()`` snapshots it
in host memory, ``restore()`` rolls back to the last snapshot, ``sync()`` gives every rank rank
0's snapshot. These work in any job. Elastic training itself (re-rendezvous when hosts come or
go) is not implemented yet, so outside an elastic launch no host updates ever arrive and
``check_host_updates()`` does nothing.
"""

import enum
import os
import queue
from typing import Any, Callable, Dict, List, Tuple

from horovod_compat.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt


class HostUpdateResult(enum.IntFlag):
    """What changed in a host update: hosts removed, added, or both."""
    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


ELASTIC_MISSING = ("elastic training (re-rendezvous when hosts are added or removed: "
                   "horovodrun --min-np/--max-np/--host-discovery-script) is not supported by "
                   "horovod_compat yet")


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
        """Raises ``HostsUpdatedInterrupt`` when a host update newer than the last one seen
        arrived (``skip_sync`` True when hosts were only added). In an elastic job the decision
        is rank 0's, broadcast so that every rank raises together. Outside an elastic job no
        update is ever sent, and this costs nothing (no collective)."""
        previous = self._last_updated_timestamp
        latest, changes = previous, HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, update_res = self._host_messages.get()
            if timestamp > previous:
                latest = max(latest, timestamp)
                changes |= HostUpdateResult(update_res)
        if _in_elastic_job():
            latest, changes = self._bcast_object((latest, int(changes)))
            changes = HostUpdateResult(changes)
        self._last_updated_timestamp = latest
        if latest > previous:
            raise HostsUpdatedInterrupt(changes == HostUpdateResult.added)

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


def run_fn(func: Callable[..., Any], reset: Callable[[], Any]) -> Callable[..., Any]:
    """The elastic retry loop around ``func(state, ...)`` (not available yet: it needs the
    re-rendezvous of elastic training)."""
    raise NotImplementedError(ELASTIC_MISSING + "; hvd.elastic.run cannot retry "
                              f"{getattr(func, '__name__', func)!r}. The state objects "
                              "(commit/restore/sync) work without it.")


__all__ = ["State", "ObjectState", "HostUpdateResult", "run_fn", "HorovodInternalError",
           "HostsUpdatedInterrupt"]
