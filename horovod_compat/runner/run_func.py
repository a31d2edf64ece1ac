"""``horovod.run``: runs a Python function on ``np`` ranks through ``horovodrun`` and returns
the per-rank results in rank order.

The function and its arguments are pickled (with cloudpickle, so lambdas and functions defined
in ``__main__`` or inside other functions travel by value) into a private directory;
``python -m horovod_compat.runner.run_task DIR`` runs on every rank, unpickles and calls the
function and writes its result (or its traceback) to ``DIR/rank-<N>.*``.
"""

import os
import pickle
import shutil
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence

FUNC_FILE = "func.pkl"


def result_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank}.result")


def error_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank}.error")


def _pickle_module() -> Any:
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:  # functions are then pickled by reference: define them in a module
        return pickle


def run(func: Callable[..., Any], args: Sequence[Any] = (),
        kwargs: Optional[Dict[str, Any]] = None, num_proc: Optional[int] = None,
        min_num_proc: Optional[int] = None, max_num_proc: Optional[int] = None,
        slots: Optional[int] = None, reset_limit: Optional[int] = None,
        cooldown_range: Optional[Sequence[int]] = None,
        hosts: Optional[str] = None, hostfile: Optional[str] = None,
        start_timeout: Optional[int] = None, ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None, disable_cache: Optional[bool] = None,
        output_filename: Optional[str] = None, verbose: Optional[bool] = None,
        use_gloo: Optional[bool] = None, use_mpi: Optional[bool] = None,
        mpi_args: Optional[str] = None, network_interface: Optional[str] = None,
        executable: Optional[str] = None, host_discovery_script: Optional[str] = None,
        elastic_timeout: Optional[int] = None, np: Optional[int] = None,
        min_np: Optional[int] = None, max_np: Optional[int] = None) -> List[Any]:
    """Runs ``func(*args, **kwargs)`` on ``num_proc`` ranks (``hosts``: ``"host1:2,host2:2"``)
    and returns the list of return values ordered by rank. A rank that raises makes this raise
    ``RuntimeError`` naming the rank, with its traceback. ``disable_cache`` is accepted and
    unused. ``use_gloo=True`` runs the job over the TCP transport (``horovodrun --gloo``),
    ``use_mpi=True`` through mpirun; by default as ``horovodrun`` chooses (docs/tcp.md).

    Elastic (docs/elastic.md) when ``min_num_proc`` or ``host_discovery_script`` is given:
    ``max_num_proc``, ``slots`` (per discovered host), ``reset_limit``, ``cooldown_range``
    (min, max seconds) and ``elastic_timeout`` as the ``horovodrun`` flags; ``func`` then calls
    ``hvd.elastic.run`` itself, and the values returned are those of the last round's ranks.
    ``np``, ``min_np``, ``max_np`` are Horovod's older names of ``num_proc``..."""
    num_proc = num_proc if num_proc is not None else np
    min_num_proc = min_num_proc if min_num_proc is not None else min_np
    max_num_proc = max_num_proc if max_num_proc is not None else max_np
    elastic = min_num_proc is not None or host_discovery_script is not None
    if num_proc is None:
        num_proc = min_num_proc if elastic and min_num_proc is not None else 1
    if not elastic and any(v is not None for v in (max_num_proc, reset_limit, cooldown_range,
                                                    elastic_timeout)):
        raise ValueError("max_num_proc, reset_limit, cooldown_range and elastic_timeout need "
                         "an elastic job: give min_num_proc or host_discovery_script")
    if use_gloo and use_mpi:
        raise ValueError("use_gloo and use_mpi exclude each other")
    if elastic and use_mpi:
        raise ValueError("an elastic job runs over TCP: use_mpi excludes it")
    from horovod_compat.runner import launch

    directory = tempfile.mkdtemp(prefix="hvdc-run-")
    try:
        with open(os.path.join(directory, FUNC_FILE), "wb") as f:
            _pickle_module().dump((func, tuple(args), dict(kwargs or {})), f)
        argv = ["-np", str(num_proc), "--no-alias"]
        for flag, value in (("-H", hosts), ("--hostfile", hostfile),
                            ("--start-timeout", start_timeout), ("--ssh-port", ssh_port),
                            ("--ssh-identity-file", ssh_identity_file),
                            ("--output-filename", output_filename),
                            ("--network-interface", network_interface),
                            ("--min-np", min_num_proc), ("--max-np", max_num_proc),
                            ("--slots-per-host", slots if elastic else None),
                            ("--host-discovery-script", host_discovery_script),
                            ("--reset-limit", reset_limit),
                            ("--elastic-timeout", elastic_timeout)):
            if value is not None:
                argv += [flag, str(value)]
        if cooldown_range is not None:
            low, high = cooldown_range
            argv += ["--blacklist-cooldown-range", str(low), str(high)]
        if verbose:
            argv.append("--verbose")
        if use_gloo and not elastic:
            argv.append("--gloo")
        elif use_mpi:
            argv.append("--mpi")
        if mpi_args and not use_gloo and not elastic:
            argv.append("--mpi-args=" + mpi_args)
        argv += [executable or sys.executable, "-m", "horovod_compat.runner.run_task", directory]
        exit_code = launch.run_commandline(argv)
        if elastic:
            return _collect_elastic(directory, exit_code)
        return _collect(directory, num_proc, exit_code)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _collect_elastic(directory: str, exit_code: int) -> List[Any]:
    """The values of the last round's ranks. Workers that left the job on the way (their host
    removed) may have left errors behind: they count only when the job failed."""
    if exit_code != 0:
        reports = []
        for name in sorted(os.listdir(directory)):
            if name.endswith(".error"):
                with open(os.path.join(directory, name)) as f:
                    reports.append(f"{name[:-len('.error')]} failed:\n{f.read().rstrip()}")
        raise RuntimeError(f"horovod_compat.run: the elastic job exited with code {exit_code}"
                           + ("".join("\n" + r for r in reports)))
    results = []
    while os.path.exists(result_file(directory, len(results))):
        with open(result_file(directory, len(results)), "rb") as f:
            results.append(pickle.load(f))
    return results


def _collect(directory: str, np: int, exit_code: int) -> List[Any]:
    failed = [r for r in range(np) if os.path.exists(error_file(directory, r))]
    if failed:
        reports = []
        for r in failed:
            with open(error_file(directory, r)) as f:
                reports.append(f"rank {r} failed:\n{f.read().rstrip()}")
        raise RuntimeError("horovod_compat.run: " + "\n".join(reports))
    missing = [r for r in range(np) if not os.path.exists(result_file(directory, r))]
    if exit_code != 0 or missing:
        raise RuntimeError(f"horovod_compat.run: the job exited with code {exit_code}; "
                           f"no result from rank(s) {missing}")
    results = []
    for r in range(np):
        with open(result_file(directory, r), "rb") as f:
            results.append(pickle.load(f))
    return results
