"""Launcher: ``horovodrun`` translated into an ``mpirun`` command line (DESIGN.md "Launching")."""

from typing import Optional, Sequence


def run_commandline(argv: Optional[Sequence[str]] = None) -> int:
    from horovod_compat.runner.launch import run_commandline as _run
    return _run(argv)
