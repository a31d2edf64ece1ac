"""What the launcher's environment says about this process."""

import os
import re
from typing import Optional, Tuple

from horovod_compat.runner.common.util import secret

LOG_LEVEL_STR = ["FATAL", "ERROR", "WARNING", "INFO", "DEBUG", "TRACE"]

# Variables never copied into a rank's environment (regular expressions, full match).
IGNORE_REGEXES = {"BASH_FUNC_.*", "OLDPWD", secret.HOROVOD_SECRET_KEY}

KUBEFLOW_MPI_EXEC = "/etc/mpi/kubexec.sh"

# (rank variable, size variable), in the order they are trusted: Horovod's own launcher
# (horovodrun --gloo, or ours on top of mpirun), Open MPI, MPICH/Intel MPI/Slurm's PMI, then a
# Slurm step (srun), whose task count is only set inside a step.
_RANK_SIZE_VARIABLES = (
    ("HOROVOD_RANK", "HOROVOD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
)


def is_exportable(name: str) -> bool:
    """Whether the launcher may copy the variable ``name`` into a rank's environment."""
    return not any(re.fullmatch(pattern, name) for pattern in IGNORE_REGEXES)


def _parse(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"Could not determine process rank and size: {name}={value!r} is "
                           f"not an integer") from None


def env_rank_and_size() -> Optional[Tuple[int, int]]:
    """``(rank, size)`` from the first launcher whose variables are set, or None when no
    launcher set any. Only one variable of a pair set -> ``RuntimeError``."""
    for rank_name, size_name in _RANK_SIZE_VARIABLES:
        rank = os.environ.get(rank_name)
        size = os.environ.get(size_name)
        if rank is not None and size is not None:
            return _parse(rank_name, rank), _parse(size_name, size)
        if rank is not None or size is not None:
            if rank_name == "SLURM_PROCID" and size is None:
                continue  # a Slurm allocation outside an srun step: not a launcher
            raise RuntimeError(f"Could not determine process rank and size: only one of "
                               f"{rank_name} and {size_name} found in environment")
    return None


def get_env_rank_and_size() -> Tuple[int, int]:
    """``(rank, size)`` of this process from the launcher's environment: HOROVOD_RANK/SIZE,
    OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, or SLURM_PROCID/SLURM_STEP_NUM_TASKS, first match
    wins. Outside any launcher this is ``(0, 1)``, as in Horovod (one process on its own);
    ``env_rank_and_size()`` returns None instead. Only one variable of a pair set ->
    ``RuntimeError``."""
    found = env_rank_and_size()
    return (0, 1) if found is None else found


def is_kubeflow_mpi() -> bool:
    """Whether mpirun runs under Kubeflow's MPI operator (its rsh agent)."""
    return os.environ.get("OMPI_MCA_plm_rsh_agent") == KUBEFLOW_MPI_EXEC
