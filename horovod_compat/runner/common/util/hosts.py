"""Host lists (``host:slots,...`` and hostfiles) and the rank layout over them."""

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

_HOST_SLOTS = re.compile(r"^[\w.-]+:[0-9]+$")


class HostInfo:
    """A host and how many processes (slots) it takes."""

    def __init__(self, hostname: str, slots: int) -> None:
        self.hostname = hostname
        self.slots = slots

    @staticmethod
    def from_string(host_string: str) -> "HostInfo":
        """Parses ``"host:slots"``."""
        text = host_string.strip()
        if not _HOST_SLOTS.match(text):
            raise ValueError(f"Invalid host {host_string!r}: expected hostname:slots, "
                             f"for example worker-0:2")
        hostname, slots = text.rsplit(":", 1)
        return HostInfo(hostname, int(slots))

    def __repr__(self) -> str:
        return f"HostInfo(hostname={self.hostname!r}, slots={self.slots})"


@dataclass
class SlotInfo:
    """Where one rank runs and its place in the world, local and cross communicators."""
    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int

    def to_response_string(self) -> str:
        """``rank,size,local_rank,local_size,cross_rank,cross_size``."""
        return ",".join(str(v) for v in (self.rank, self.size, self.local_rank, self.local_size,
                                         self.cross_rank, self.cross_size))


INVALID_SLOT_INFO = SlotInfo(hostname="", rank=-1, local_rank=-1, cross_rank=-1, size=-1,
                             local_size=-1, cross_size=-1)


def parse_host_files(filename: str) -> str:
    """Reads a hostfile (lines ``host slots=N``; blank lines and ``#`` comments skipped) and
    returns ``"host:N,..."``. A line without ``slots=`` counts one slot."""
    hosts = []
    with open(filename) as f:
        for number, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            fields = text.split()
            slots = 1
            for field in fields[1:]:
                if field.startswith("slots="):
                    value = field[len("slots="):]
                    if not value.isdigit():
                        raise ValueError(f"{filename}:{number}: slots must be a number, got "
                                         f"{value!r}")
                    slots = int(value)
            hosts.append(f"{fields[0]}:{slots}")
    return ",".join(hosts)


def parse_hosts_and_slots(hosts: str) -> Tuple[List[str], Dict[str, int]]:
    """``"a:2,b:1"`` -> (``["a", "b"]``, ``{"a": 2, "b": 1}``)."""
    infos = parse_hosts(hosts)
    return [h.hostname for h in infos], {h.hostname: h.slots for h in infos}


def parse_hosts(hosts_string: str) -> List[HostInfo]:
    """``"worker-0:2,worker-1:2"`` -> a HostInfo per host, in order."""
    return [HostInfo.from_string(h) for h in hosts_string.split(",")]


def get_host_assignments(hosts: List[HostInfo], min_np: int,
                         max_np: Optional[int] = None) -> List[SlotInfo]:
    """Fills the hosts in order, each up to its slots (at most ``max_np`` ranks in all), and
    returns a SlotInfo per rank. Ranks with the same local rank on different hosts form a cross
    communicator, numbered in host order. Fewer than ``min_np`` slots -> ``ValueError``."""
    per_host: List[Tuple[HostInfo, List[int]]] = []
    next_rank = 0
    for host in hosts:
        take = host.slots if max_np is None else max(0, min(host.slots, max_np - next_rank))
        per_host.append((host, list(range(next_rank, next_rank + take))))
        next_rank += take
    world_size = next_rank
    if world_size < min_np:
        raise ValueError(f"Requested more processes ({min_np}) than there are available slots "
                         f"({world_size})")
    # cross_hosts[local_rank]: the hosts that have a rank with that local rank, in host order.
    cross_hosts: Dict[int, List[str]] = {}
    for host, ranks in per_host:
        for local_rank in range(len(ranks)):
            cross_hosts.setdefault(local_rank, []).append(host.hostname)
    slots = []
    for host, ranks in per_host:
        for local_rank, rank in enumerate(ranks):
            peers = cross_hosts[local_rank]
            slots.append(SlotInfo(hostname=host.hostname, rank=rank, local_rank=local_rank,
                                  cross_rank=peers.index(host.hostname), size=world_size,
                                  local_size=len(ranks), cross_size=len(peers)))
    return slots
