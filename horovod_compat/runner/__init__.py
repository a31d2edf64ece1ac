"""Launcher: ``horovodrun`` translated into an ``mpirun`` command line (docs/keras.md, "horovodrun"),
or run over TCP (``--gloo``, docs/tcp.md; elastic, docs/elastic.md), and ``run(func, ...)``,
Horovod's programmatic launcher."""

from typing import Optional, Sequence

from horovod_compat.runner.run_func import run  # noqa: F401


def run_commandline(argv: Optional[Sequence[str]] = None) -> int:
    from horovod_compat.runner.launch import run_commandline as _run
    return _run(argv)
