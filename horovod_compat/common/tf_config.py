"""TF_CONFIG clusters: the identity of this process, as the TCP transport reads it.

An orchestrator (Kubernetes, Slurm, a shell loop) starts every task of a
``MultiWorkerMirroredStrategy`` job with

    TF_CONFIG='{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]},
                "task": {"type": "worker", "index": 0}}'

Ranks are numbered as that strategy orders the tasks: the chief first (if any), then the
workers by index. Each rank listens on the port of its own entry; the peer list goes to the core
as ``HVDC_TCP_PEERS`` (docs/tcp.md).
"""

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

RANKED_TYPES = ("chief", "worker")
# Task types of other TensorFlow strategies: a Horovod job has no place for them.
FOREIGN_TYPES = ("ps", "evaluator")


class TfConfigError(ValueError):
    """TF_CONFIG cannot describe a horovod_compat job."""


def split_address(address: str) -> Tuple[str, int]:
    """``host:port`` or ``[v6addr]:port`` -> (host, port)."""
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        ok = bool(sep and host and port_text)
    else:
        host, sep, port_text = address.rpartition(":")
        ok = bool(sep and host and ":" not in host)
    if not ok or not port_text or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise TfConfigError(f"TF_CONFIG: {address!r} is not a 'host:port' address with a port "
                            f"in 1..65535")
    return host, int(port_text)


def _load(text: str) -> Dict[str, Any]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        shown = text if len(text) <= 200 else text[:200] + "..."
        raise TfConfigError(f"TF_CONFIG is not valid JSON ({error}): {shown!r}") from None
    if not isinstance(config, dict):
        raise TfConfigError(f"TF_CONFIG must be a JSON object, got {type(config).__name__}")
    return config


def _cluster(config: Dict[str, Any]) -> Dict[str, List[str]]:
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise TfConfigError("TF_CONFIG has no 'cluster' object (e.g. {\"cluster\": {\"worker\": "
                            "[\"host0:2222\", \"host1:2222\"]}, \"task\": {\"type\": \"worker\", "
                            "\"index\": 0}})")
    for name, tasks in cluster.items():
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise TfConfigError(f"TF_CONFIG cluster[{name!r}] must be a list of 'host:port' "
                                f"strings, got {tasks!r}")
        if name not in RANKED_TYPES + FOREIGN_TYPES:
            raise TfConfigError(f"TF_CONFIG cluster has tasks of unknown type {name!r}: "
                                f"horovod_compat runs 'chief' and 'worker' tasks")
    if cluster.get("ps"):
        raise TfConfigError("TF_CONFIG describes a parameter-server cluster ('ps' tasks): "
                            "horovod_compat runs only 'chief' and 'worker' tasks; remove the "
                            "'ps' entries and start only the chief and workers")
    if len(cluster.get("chief", [])) > 1:
        raise TfConfigError(f"TF_CONFIG cluster has {len(cluster['chief'])} 'chief' tasks; "
                            f"at most one is allowed")
    return cluster


def ordered_addresses(cluster: Mapping[str, List[str]]) -> List[str]:
    """Every task's address in rank order: chief, then workers by index."""
    addresses = list(cluster.get("chief", [])) + list(cluster.get("worker", []))
    seen: Dict[str, int] = {}
    for rank, address in enumerate(addresses):
        split_address(address)
        if address in seen:
            raise TfConfigError(f"TF_CONFIG lists {address} twice (ranks {seen[address]} and "
                                f"{rank}); every task needs its own host:port")
        seen[address] = rank
    return addresses


def _task(config: Dict[str, Any], cluster: Mapping[str, List[str]]) -> Optional[int]:
    """This task's rank, or None when TF_CONFIG names no task of a one-task cluster."""
    task = config.get("task")
    ranked = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    if task is None:
        if ranked <= 1:
            return None
        raise TfConfigError("TF_CONFIG has no 'task' ({\"type\": \"worker\", \"index\": i}): "
                            "every process must say which task of the cluster it is")
    if not isinstance(task, dict):
        raise TfConfigError(f"TF_CONFIG 'task' must be an object, got {task!r}")
    kind = task.get("type")
    if kind in FOREIGN_TYPES:
        raise TfConfigError(f"TF_CONFIG task type {kind!r}: horovod_compat runs only 'chief' "
                            f"and 'worker' tasks (parameter servers and evaluators are not part "
                            f"of a Horovod job); do not start this task with horovod_compat")
    if kind not in RANKED_TYPES:
        raise TfConfigError(f"TF_CONFIG task type {kind!r} is not one of 'chief', 'worker'")
    index = task.get("index", 0)
    if isinstance(index, str) and index.strip().isdigit():
        index = int(index)
    if not isinstance(index, int) or isinstance(index, bool):
        raise TfConfigError(f"TF_CONFIG task index {index!r} is not an integer")
    count = len(cluster.get(kind, []))
    if not 0 <= index < count:
        raise TfConfigError(f"TF_CONFIG task index {index} is out of range: the cluster has "
                            f"{count} {kind!r} task(s)")
    return index if kind == "chief" else len(cluster.get("chief", [])) + index


def topology(hosts: List[str], rank: int) -> Dict[str, int]:
    """Local and cross rank/size of ``rank`` from the hosts of all ranks (equal strings = one
    host). Cross: among the hosts that have a rank with this local rank, in order of first
    appearance, this host's index and their number."""
    order = list(dict.fromkeys(hosts))
    per_host = {h: [r for r, x in enumerate(hosts) if x == h] for h in order}
    mine = hosts[rank]
    local_rank = per_host[mine].index(rank)
    peers = [h for h in order if len(per_host[h]) > local_rank]
    return {"local_rank": local_rank, "local_size": len(per_host[mine]),
            "cross_rank": peers.index(mine), "cross_size": len(peers)}


def translate(text: str) -> Tuple[int, Dict[str, str]]:
    """TF_CONFIG -> (number of ranks, the variables that give this process its identity)."""
    config = _load(text)
    cluster = _cluster(config)
    addresses = ordered_addresses(cluster)
    rank = _task(config, cluster)
    if not addresses:
        raise TfConfigError("TF_CONFIG cluster has no 'chief' or 'worker' task")
    if rank is None:
        rank = 0
    hosts = [split_address(a)[0] for a in addresses]
    where = topology(hosts, rank)
    env = {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(len(addresses)),
        "HOROVOD_LOCAL_RANK": str(where["local_rank"]),
        "HOROVOD_LOCAL_SIZE": str(where["local_size"]),
        "HOROVOD_CROSS_RANK": str(where["cross_rank"]),
        "HOROVOD_CROSS_SIZE": str(where["cross_size"]),
        "HOROVOD_HOSTNAME": hosts[rank],
        "HVDC_TCP_PEERS": ",".join(addresses),
        # Start-up errors then name TF_CONFIG's entries, not a variable the user never set.
        "HVDC_TCP_ADDRESS_ORIGIN": "TF_CONFIG",
        "HOROVOD_CONTROLLER": "gloo",
    }
    return len(addresses), env
