"""Hosts on which a worker failed: left out of the next rounds, for good or for a cooldown."""

import random
import time
from typing import Callable, Dict, Optional, Tuple


class Blacklist:
    """Without ``cooldown_range`` a failed host never returns. With (low, high), its n-th
    blacklisting keeps it out for low * 2**n seconds plus up to ``low`` more at random, within
    [low, high] (as Horovod's backoff); after that the host is used again once discovery lists
    it."""

    def __init__(self, cooldown_range: Optional[Tuple[int, int]] = None,
                 clock: Callable[[], float] = time.monotonic,
                 jitter: Callable[[], float] = random.random) -> None:
        self._range = cooldown_range
        self._clock = clock
        self._jitter = jitter
        self._until: Dict[str, Optional[float]] = {}  # host -> end of its cooldown (None: never)
        self._count: Dict[str, int] = {}

    def add(self, host: str) -> Optional[float]:
        """Blacklists ``host``; returns its cooldown in seconds (None: for good). A host already
        in its cooldown keeps it."""
        now = self._clock()
        if host in self._until and (self._until[host] is None or self._until[host] > now):
            until = self._until[host]
            return None if until is None else until - now
        if self._range is None:
            self._until[host] = None
            return None
        low, high = self._range
        self._count[host] = self._count.get(host, 0) + 1
        delay = low * (1 << self._count[host]) + self._jitter() * low
        delay = max(low, min(high, delay))
        self._until[host] = now + delay
        return delay

    def blocked(self, host: str) -> bool:
        """Whether ``host`` may not run workers now."""
        if host not in self._until:
            return False
        until = self._until[host]
        return until is None or until > self._clock()

