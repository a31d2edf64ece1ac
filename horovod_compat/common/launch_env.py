"""Which launcher started this process, read from the environment (docs/tcp.md).

Precedence: HOROVOD_CONTROLLER if set; an MPI launcher's variables; Horovod's Gloo variables;
TF_CONFIG with more than one task; otherwise one rank without a launcher.
"""

from typing import Mapping, MutableMapping

from horovod_compat.common import tf_config

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


def launch_path(env: Mapping[str, str]) -> str:
    """How this process finds its peers, by the documented precedence (docs/tcp.md)."""
    controller = _controller(env)
    gloo_identity = "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env or "HVDC_TCP_PEERS" in env
    if controller == MPI:
        return MPI
    if controller == GLOO:
        # The Gloo controller was asked for; TF_CONFIG may still be what says who the peers are.
        return TF_CONFIG if not gloo_identity and env.get("TF_CONFIG", "").strip() else GLOO
    if controller:
        return controller  # not a valid choice: the core reports it
    if any(name in env for name in MPI_LAUNCHER_VARIABLES):
        return MPI
    if gloo_identity:
        return GLOO
    if env.get("TF_CONFIG", "").strip():
        return TF_CONFIG
    return SINGLE


def prepare(env: MutableMapping[str, str]) -> str:
    """Before the core starts: when TF_CONFIG is what identifies this process, writes the
    identity it implies into ``env`` (HOROVOD_RANK/SIZE, HVDC_TCP_PEERS, ...). A TF_CONFIG of
    one task leaves a single rank without a launcher. Returns the launch path. Raises
    TfConfigError (a ValueError) when TF_CONFIG cannot describe the job."""
    path = launch_path(env)
    if path != TF_CONFIG:
        return path
    size, identity = tf_config.translate(env["TF_CONFIG"])
    if size == 1 and _controller(env) != GLOO:
        return SINGLE
    env.update(identity)
    env.setdefault("HOROVOD_CPU_OPERATIONS", "gloo")
    return path
