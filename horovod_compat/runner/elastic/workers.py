"""The worker processes of an elastic job: started on this machine or through the remote shell
with the elastic environment, their output prefixed as ``horovodrun --gloo`` does, ended on
request (SIGTERM, then SIGKILL)."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, IO, List, Optional, Sequence

from horovod_compat.runner import gloo_launch
from horovod_compat.runner.rendezvous import SECRET_ENV


class Worker:
    """One process of the job, known by its identity ``host:slot`` for its whole life."""

    def __init__(self, host: str, slot: int, spawn_rank: int) -> None:
        self.host = host
        self.slot = slot
        self.identity = f"{host}:{slot}"
        self.spawn_rank = spawn_rank      # the rank it was started for: its output prefix
        self.started = time.monotonic()
        self.proc: Optional[subprocess.Popen] = None
        self.rank_handle: Optional[gloo_launch._Rank] = None
        self.readers: List[threading.Thread] = []
        self.returncode: Optional[int] = None
        # Set by the driver: the round it last asked to be newer than (-1: its first), whether it
        # asked since the last round formed, why it is out of the job.
        self.last_round = -1
        self.asked = False
        self.removed: Optional[str] = None
        self.kill_at: Optional[float] = None

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def signal(self, signum: int) -> None:
        if self.rank_handle is not None and self.alive:
            self.rank_handle.signal(signum)

    def __repr__(self) -> str:
        return f"Worker({self.identity}, returncode={self.returncode})"


class WorkerLauncher:
    """Starts workers; each exit arrives on ``exits`` as (worker, returncode)."""

    def __init__(self, command: Sequence[str], runtime: Dict[str, str], forwarded: Sequence[str],
                 never: Sequence[str], secret: str, args: object,
                 output_dir: Optional[str] = None, verbose: bool = False) -> None:
        self.command = list(command)
        self.runtime = dict(runtime)
        self.forwarded = list(forwarded)
        self.never = list(never)
        self.secret = secret
        self.args = args
        self.output_dir = output_dir
        self.verbose = verbose
        self.exits: "queue.Queue" = queue.Queue()
        self._output = gloo_launch._Output()
        self._local: Dict[str, bool] = {}

    def is_local(self, host: str) -> bool:
        if host not in self._local:
            self._local[host] = gloo_launch.is_local_host(host)
        return self._local[host]

    def start(self, worker: Worker, env_for_worker: Dict[str, str]) -> None:
        """Starts ``worker`` with ``env_for_worker`` (its Horovod variables) added; an OSError
        arrives as an exit with code 127."""
        local = self.is_local(worker.host)
        stdin_data = None
        if local:
            cmd = list(self.command)
            env = gloo_launch.local_env(dict(os.environ), self.runtime, self.never,
                                        env_for_worker)
            env[SECRET_ENV] = self.secret
        else:
            env_remote = gloo_launch.forwarded_env(dict(os.environ), self.runtime,
                                                   self.forwarded, self.never, env_for_worker)
            env_remote.pop(SECRET_ENV, None)  # sent on standard input instead
            cmd = gloo_launch.remote_command(worker.host, env_remote, self.command, os.getcwd(),
                                             gloo_launch.remote_shell(self.args),
                                             secret_on_stdin=True)
            env = None
            stdin_data = self.secret.encode() + b"\n"
        if self.verbose:
            shown = " ".join(f"{k}={v}" for k, v in sorted(env_for_worker.items()))
            print(f"horovodrun: starting worker {worker.identity}: {shown} {' '.join(cmd)}",
                  flush=True)
        try:
            proc = subprocess.Popen(cmd, env=env,
                                    stdin=subprocess.DEVNULL if local else subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as error:
            sys.stderr.write(f"horovodrun: cannot start worker {worker.identity}: {error}\n")
            worker.returncode = 127
            self.exits.put((worker, 127))
            return
        worker.proc = proc
        worker.rank_handle = gloo_launch._Rank(None, proc, not local)  # type: ignore[arg-type]
        if stdin_data is not None and proc.stdin is not None:
            try:
                proc.stdin.write(stdin_data)
                proc.stdin.flush()
            except OSError:
                pass  # the remote shell already failed: its exit code says why
        for name, source, target in (("stdout", proc.stdout, sys.stdout),
                                     ("stderr", proc.stderr, sys.stderr)):
            log = self._log(worker, name)
            thread = threading.Thread(target=self._copy,
                                      args=(worker.spawn_rank, name, source, target, log),
                                      name=f"hvdc-{worker.identity}-{name}", daemon=True)
            thread.start()
            worker.readers.append(thread)
        threading.Thread(target=self._wait, args=(worker,), name=f"hvdc-{worker.identity}-wait",
                         daemon=True).start()

    def _log(self, worker: Worker, name: str) -> Optional[IO[bytes]]:
        if not self.output_dir:
            return None
        directory = os.path.join(self.output_dir, f"rank.{worker.spawn_rank}")
        os.makedirs(directory, exist_ok=True)
        # A later worker started for the same rank appends to the file.
        return open(os.path.join(directory, name), "ab")

    def _copy(self, rank: int, name: str, source: IO[bytes], target: IO[str],
              log: Optional[IO[bytes]]) -> None:
        try:
            self._output.copy(rank, name, source, target, log)
        finally:
            if log is not None:
                log.close()

    def _wait(self, worker: Worker) -> None:
        assert worker.proc is not None
        code = worker.proc.wait()
        self.exits.put((worker, code))

    @staticmethod
    def close_input(worker: Worker) -> None:
        """Closes the remote shell's input (it ends the remote worker if still there)."""
        if worker.proc is not None and worker.proc.stdin is not None:
            try:
                worker.proc.stdin.close()
            except OSError:
                pass

    @staticmethod
    def finish(worker: Worker) -> None:
        """Joins the worker's output copiers (bounded: its own children may hold the pipes)
        and closes its input."""
        for reader in worker.readers:
            reader.join(timeout=5)
        WorkerLauncher.close_input(worker)


def terminate(worker: Worker, grace: float = gloo_launch.TERMINATE_GRACE_SECONDS) -> None:
    """SIGTERM now; the driver sends SIGKILL once ``grace`` seconds passed (Worker.kill_at)."""
    if worker.alive and worker.kill_at is None:
        worker.signal(signal.SIGTERM)
        worker.kill_at = time.monotonic() + grace
