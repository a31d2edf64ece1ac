"""How ``horovodrun`` places the ranks of a job on this machine's cores (docs/launch_defaults.md).

By default ranks are not bound (mpirun: ``--bind-to none --map-by slot``; ``--gloo``: not
pinned) and, over mpirun, idle ranks yield the core (``mpi_yield_when_idle``). Chosen from B8
(bench/b8_overhead.py) on the 2-core machine, 2026-11-28, with the runtime's waits no longer
spinning: ResNet-50 at np=2 ran at 0.97 of the same compute without the runtime unbound against
0.93-0.95 bound to a core each (over mpirun and --gloo alike): TensorFlow's pools use the other
core while a rank's own waits sleep. ``--binding-args "--bind-to core"`` asks for binding: each
local rank then gets ``cores // ranks`` cores of its own when the ranks do not outnumber the
cores (for --gloo the launcher pins them; for mpirun the flags go to mpirun as given). Whatever
the user passes wins: ``--binding-args``, binding or mapping flags in ``--mpi-args``, Open MPI's
own variables in the environment.

Only this machine's cores are known here: ranks on other hosts are never bound by default.
"""

import os
import shlex
from typing import Dict, List, Mapping, Optional, Sequence

# mpirun flags that choose where ranks run: any of them in --mpi-args replaces our binding.
_PLACEMENT_FLAGS = ("--bind-to", "-bind-to", "--map-by", "-map-by", "--cpu-set", "-cpu-set",
                    "--cpus-per-proc", "-cpus-per-proc", "--cpus-per-rank", "-cpus-per-rank",
                    "--rankfile", "-rankfile", "-rf")
# Open MPI variables (OMPI_MCA_<name> in the environment, --mca <name> on the command line) that
# say the same thing.
_PLACEMENT_MCA = ("hwloc_base_binding_policy", "rmaps_base_mapping_policy",
                  "rmaps_base_cpus_per_rank", "orte_rankfile", "rmaps_rank_file_path")
_YIELD_MCA = "mpi_yield_when_idle"

_SYSFS_CPU = "/sys/devices/system/cpu"


def local_cores(allowed: Optional[Sequence[int]] = None,
                sysfs: str = _SYSFS_CPU) -> List[List[int]]:
    """The physical cores this process may run on, each as the sorted list of its CPUs (its
    hardware threads), in the order of their first CPU. ``allowed`` defaults to this process's
    affinity, so a launcher started under ``taskset`` keeps its ranks inside that set."""
    if allowed is None:
        allowed = sorted(os.sched_getaffinity(0))
    cores: Dict[object, List[int]] = {}
    for cpu in sorted(allowed):
        key: object = cpu
        try:
            topology = os.path.join(sysfs, f"cpu{cpu}", "topology")
            with open(os.path.join(topology, "physical_package_id")) as f:
                package = f.read().strip()
            with open(os.path.join(topology, "core_id")) as f:
                key = (package, f.read().strip())
        except OSError:
            pass  # no topology (some containers): every CPU counts as a core
        cores.setdefault(key, []).append(cpu)
    return sorted(cores.values())


def cores_per_rank(ranks: int, cores: int) -> int:
    """Cores each of ``ranks`` local ranks gets: 0 (do not bind) when they outnumber ``cores``."""
    if ranks < 1 or ranks > cores:
        return 0
    return cores // ranks


def _mca_names(args: Sequence[str]) -> List[str]:
    names = []
    for i, arg in enumerate(args[:-1]):
        if arg in ("--mca", "-mca", "--gmca", "-gmca"):
            names.append(args[i + 1])
    return names


def user_places_ranks(mpi_args: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether the user already said where ranks run (flags in --mpi-args, or Open MPI variables
    in the environment, which our command-line flags would override)."""
    if any(a.split("=", 1)[0] in _PLACEMENT_FLAGS for a in mpi_args):
        return True
    names = set(_mca_names(mpi_args)) | {k[len("OMPI_MCA_"):] for k in env
                                         if k.startswith("OMPI_MCA_")}
    return any(name in names for name in _PLACEMENT_MCA)


def user_sets_yield(mpi_args: Sequence[str], env: Mapping[str, str]) -> bool:
    return _YIELD_MCA in _mca_names(mpi_args) or ("OMPI_MCA_" + _YIELD_MCA) in env


def mpirun_placement(local_ranks: Optional[int], cores: int, binding_args: Optional[str],
                     mpi_args: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """The binding, mapping and yield flags horovodrun gives mpirun.

    ``local_ranks``: how many ranks run on this machine, None when the job has ranks on other
    hosts (whose cores the launcher cannot see). ``cores``: this machine's usable cores."""
    flags: List[str] = []
    if binding_args is not None:
        flags += shlex.split(binding_args)
    elif not user_places_ranks(mpi_args, env):
        # Unbound measured best (the module's docstring); `local_ranks` and `cores` stay in the
        # signature for the binding a user asks for through --binding-args.
        del local_ranks, cores
        flags += ["--bind-to", "none", "--map-by", "slot"]
    if not user_sets_yield(mpi_args, env):
        # A rank waiting in MPI gives its core back at once instead of spinning: measured at
        # np=2 on 2 cores, the model's throughput went up by a fifth (docs/launch_defaults.md).
        flags += ["--mca", _YIELD_MCA, "1"]
    return flags


def gloo_affinities(local_ranks: int, binding_args: Optional[str],
                    cores: Optional[List[List[int]]] = None) -> List[Optional[List[int]]]:
    """The CPUs each of the ``local_ranks`` local ranks of a ``--gloo`` job is pinned to, in the
    order they are spawned (None: not pinned). ``--binding-args`` with ``--bind-to none`` turns
    pinning off, as does nothing (the default, measured best); ``--bind-to core`` is the rule
    above."""
    if binding_args is None:
        return [None] * local_ranks
    if binding_args is not None:
        words = shlex.split(binding_args)
        value = None
        for i, word in enumerate(words):
            if word in ("--bind-to", "-bind-to") and i + 1 < len(words):
                value = words[i + 1]
            elif word.startswith(("--bind-to=", "-bind-to=")):
                value = word.split("=", 1)[1]
        if value is None or value.split(":")[0] not in ("none", "core"):
            raise ValueError(f"--binding-args {binding_args!r} with --gloo: only "
                             f"'--bind-to none' or '--bind-to core' can be honoured")
        if value.split(":")[0] == "none":
            return [None] * local_ranks
    if cores is None:
        cores = local_cores()
    per_rank = cores_per_rank(local_ranks, len(cores))
    if per_rank == 0:
        return [None] * local_ranks
    return [sorted(cpu for core in cores[i * per_rank:(i + 1) * per_rank] for cpu in core)
            for i in range(local_ranks)]
