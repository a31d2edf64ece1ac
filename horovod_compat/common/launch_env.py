"""Which launcher started this process, read from the environment (docs/tcp.md).

Precedence: HOROVOD_CONTROLLER if set; an MPI launcher's variables; Horovod's Gloo variables;
TF_CONFIG with more than one task; otherwise one rank without a launcher.
"""

from typing import Mapping

MPI = "mpi"
GLOO = "gloo"          # Horovod's Gloo variables, a rendezvous service (horovodrun --gloo)
TF_CONFIG = "tf_config"  # a TF_CONFIG cluster, translated into a static peer list
SINGLE = "single"

MPI_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK")


def _controller(env: Mapping[str, str]) -> str:
    return env.get("HOROVOD_CONTROLLER", "").strip().lower()


def launcher_rank(env: Mapping[str, str]) -> int:
    """This process's rank as its launcher numbered it (0 without a launcher); for messages
    written before or without the runtime."""
    names = ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK"]
    if _controller(env) == GLOO:
        names.insert(0, "HOROVOD_RANK")
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0
