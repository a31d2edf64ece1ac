"""Which slots the next round uses and the ranks it gives them.

Hosts keep the order in which they joined the job (the oldest first), so the new rank 0 is on the
oldest surviving host, the one that holds the state to broadcast; new hosts come last. Within a
host, slots go by their index."""

from typing import Dict, List, Optional, Sequence, Set, Tuple

from horovod_compat.runner.common.util.hosts import HostInfo, get_host_assignments

Slot = Tuple[str, int]  # (host, slot index on it): a worker's identity


def update_host_order(order: Sequence[str], usable: Sequence[str]) -> List[str]:
    """``order`` without the hosts no longer usable, then the newly usable ones in the order
    discovery listed them."""
    usable_set = set(usable)
    kept = [h for h in order if h in usable_set]
    known = set(kept)
    return kept + [h for h in usable if h not in known]


def plan_slots(order: Sequence[str], slots: Dict[str, int], occupied: Set[Slot],
               max_np: Optional[int]) -> List[Slot]:
    """The slots of the next round, in rank order: every usable slot that already has a live
    worker, then free ones in host order while fewer than ``max_np``."""
    candidates = [(h, s) for h in order for s in range(slots.get(h, 0))]
    chosen = {c for c in candidates if c in occupied}
    for candidate in candidates:
        if max_np is not None and len(chosen) >= max_np:
            break
        chosen.add(candidate)
    if max_np is not None and len(chosen) > max_np:
        # More live workers than max_np (it cannot grow past it): keep the first ones.
        chosen = set([c for c in candidates if c in chosen][:max_np])
    return [c for c in candidates if c in chosen]


def assign(members: Sequence[Slot], round_number: int) -> Dict[str, dict]:
    """identity -> the assignment the worker receives for round ``round_number``."""
    per_host: Dict[str, int] = {}
    for host, _ in members:
        per_host[host] = per_host.get(host, 0) + 1
    infos = get_host_assignments([HostInfo(h, n) for h, n in per_host.items()], 1)
    by_host: Dict[str, List] = {}
    for info in infos:
        by_host.setdefault(info.hostname, []).append(info)
    result: Dict[str, dict] = {}
    for host in per_host:
        ordered = sorted(s for h, s in members if h == host)
        for info, slot in zip(by_host[host], ordered):
            result[f"{host}:{slot}"] = {
                "round": round_number, "rank": info.rank, "size": info.size,
                "local_rank": info.local_rank, "local_size": info.local_size,
                "cross_rank": info.cross_rank, "cross_size": info.cross_size,
                "scope": scope(round_number)}
    return result


def scope(round_number: int) -> str:
    """The rendezvous scope in which round ``round_number``'s ranks exchange addresses."""
    return f"elastic-{round_number}"
