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
        kwargs: Optional[Dict[str, Any]] = None, np: int = 1, min_np: Optional[int] = None,
        max_np: Optional[int] = None, slots: Optional[int] = None,
        reset_limit: Optional[int] = None, cooldown_range: Any = None,
        hosts: Optional[str] = None, hostfile: Optional[str] = None,
        start_timeout: Optional[int] = None, ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None, disable_cache: Optional[bool] = None,
        output_filename: Optional[str] = None, verbose: Optional[bool] = None,
        use_gloo: Optional[bool] = None, use_mpi: Optional[bool] = None,
        mpi_args: Optional[str] = None, network_interface: Optional[str] = None,
        executable: Optional[str] = None) -> List[Any]:
    """Runs ``func(*args, **kwargs)`` on ``np`` ranks (``hosts``: ``"host1:2,host2:2"``) and
    returns the list of return values ordered by rank. A rank that raises makes this raise
    ``RuntimeError`` naming the rank, with its traceback. ``slots`` and ``disable_cache`` are
    accepted and unused; elastic arguments (``min_np``, ``max_np``, ``reset_limit``,
    ``cooldown_range``) raise ``NotImplementedError``. ``use_gloo=True`` runs the job over the
    TCP transport (``horovodrun --gloo``), ``use_mpi=True`` through mpirun; by default as
    ``horovodrun`` chooses (docs/tcp.md)."""
    if any(v is not None for v in (min_np, max_np, reset_limit, cooldown_range)):
        raise NotImplementedError("elastic horovod_compat.run (min_np, max_np, reset_limit, "
                                  "cooldown_range) is not supported yet")
    if use_gloo and use_mpi:
        raise ValueError("use_gloo and use_mpi exclude each other")
    from horovod_compat.runner import launch

    directory = tempfile.mkdtemp(prefix="hvdc-run-")
    try:
        with open(os.path.join(directory, FUNC_FILE), "wb") as f:
            _pickle_module().dump((func, tuple(args), dict(kwargs or {})), f)
        argv = ["-np", str(np), "--no-alias"]
        for flag, value in (("-H", hosts), ("--hostfile", hostfile),
                            ("--start-timeout", start_timeout), ("--ssh-port", ssh_port),
                            ("--ssh-identity-file", ssh_identity_file),
                            ("--output-filename", output_filename),
                            ("--network-interface", network_interface)):
            if value is not None:
                argv += [flag, str(value)]
        if verbose:
            argv.append("--verbose")
        if use_gloo:
            argv.append("--gloo")
        elif use_mpi:
            argv.append("--mpi")
        if mpi_args and not use_gloo:
            argv.append("--mpi-args=" + mpi_args)
        argv += [executable or sys.executable, "-m", "horovod_compat.runner.run_task", directory]
        exit_code = launch.run_commandline(argv)
        return _collect(directory, np, exit_code)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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
