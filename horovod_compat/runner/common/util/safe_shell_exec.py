"""Run a shell command in its own process group, forward its output (optionally prefixed with a
rank index and a timestamp) and end the whole group when asked to, or when this process is
interrupted."""

import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, List, Mapping, Optional, Sequence

# Seconds between SIGTERM and SIGKILL when a command's process group is stopped.
GRACEFUL_TERMINATION_TIME_S = 5


def _prefix(index: Optional[int], stream_name: str, with_timestamp: bool) -> str:
    text = "" if index is None else f"[{index}]<{stream_name}>:"
    if with_timestamp:
        text = time.strftime("%a %b %d %H:%M:%S %Y") + (text or " ")
    return text


def _forward(source: IO[bytes], destination: Any, prefix: str) -> None:
    for line in iter(source.readline, b""):
        text = line.decode("utf-8", errors="replace")
        try:
            destination.write(prefix + text if prefix else text)
            destination.flush()
        except (OSError, ValueError):
            pass  # destination closed: keep draining so the child never blocks
    source.close()


def terminate_executor_shell_and_children(pid: int) -> None:
    """Stops the process group led by ``pid``: SIGTERM, then SIGKILL after
    GRACEFUL_TERMINATION_TIME_S seconds if it is still there."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + GRACEFUL_TERMINATION_TIME_S
    while time.time() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def execute(command: str, env: Optional[Mapping[str, str]] = None, stdout: Any = None,
            stderr: Any = None, index: Optional[int] = None,
            events: Optional[Sequence[threading.Event]] = None,
            prefix_output_with_timestamp: bool = False) -> int:
    """Runs ``command`` through the shell and returns its exit code (negative: killed by that
    signal). Output goes to ``stdout``/``stderr`` (default: this process's), each line prefixed
    with ``[index]<stdout>:`` when ``index`` is given. When any of ``events`` is set, or this
    call is interrupted, the command's whole process group is stopped."""
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    process = subprocess.Popen(command, shell=True, env=None if env is None else dict(env),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    forwarders: List[threading.Thread] = [
        threading.Thread(target=_forward, daemon=True,
                         args=(process.stdout, out,
                               _prefix(index, "stdout", prefix_output_with_timestamp))),
        threading.Thread(target=_forward, daemon=True,
                         args=(process.stderr, err,
                               _prefix(index, "stderr", prefix_output_with_timestamp))),
    ]
    for thread in forwarders:
        thread.start()
    finished = threading.Event()

    def watch() -> None:
        while not finished.is_set():
            if any(e.is_set() for e in events or ()):
                terminate_executor_shell_and_children(process.pid)
                return
            finished.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        exit_code = process.wait()
    except BaseException:
        terminate_executor_shell_and_children(process.pid)
        raise
    finally:
        finished.set()
        for thread in forwarders:
            thread.join(timeout=GRACEFUL_TERMINATION_TIME_S)
        watcher.join()
    return exit_code
