"""``horovodrun --gloo``: runs the job over the TCP transport without mpirun.

The launcher starts the rendezvous service (rendezvous.py), spawns every rank itself (local
ranks as child processes, remote ranks through ssh or another remote shell) with Horovod's Gloo
variables, prefixes each output line with ``[rank]<stdout>:`` / ``[rank]<stderr>:``, and when
a rank exits non-zero terminates the others and exits with that rank's code (docs/tcp.md).
Local ranks start pinned to their share of this machine's cores when they do not outnumber them
(binding.py, docs/launch_defaults.md).

Every job gets a fresh random secret (``HOROVOD_SECRET_KEY``): the rendezvous service serves only
requests signed with it and the ranks' connections prove it to each other. Local ranks receive
it in their environment, remote ranks on the first line of their standard input (never on a
command line, where ``ps`` would show it); it is never printed.
"""

import argparse
import contextlib
import fcntl
import ipaddress
import os
import queue
import secrets
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Dict, Iterator, List, Optional, Sequence, Tuple

from horovod_compat.runner import binding
from horovod_compat.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments
from horovod_compat.runner.rendezvous import SECRET_ENV, RendezvousServer

# Seconds a rank gets to exit after SIGTERM before it is killed.
TERMINATE_GRACE_SECONDS = 5.0

_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
# An MPI launcher's identity must not reach ranks that identify themselves through Gloo.
_MPI_IDENTITY_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_MCA_", "PMIX_", "PMI_", "PRTE_")


def merge_hosts(hosts: Sequence[Tuple[str, int]]) -> List[Tuple[str, int]]:
    """Adds up the slots of a host listed more than once (first position kept)."""
    merged: Dict[str, int] = {}
    for name, slots in hosts:
        if slots < 1:
            raise ValueError(f"host {name} has {slots} slots; every host needs at least 1")
        merged[name] = merged.get(name, 0) + slots
    return list(merged.items())


def allocate(hosts: Sequence[Tuple[str, int]], np: int) -> List[SlotInfo]:
    """Fills the hosts in order, each up to its slots, with ranks 0..np-1 (a host listed more
    than once counts once, with its slots added); the layout is get_host_assignments'."""
    hosts = merge_hosts(hosts)
    total = sum(slots for _, slots in hosts)
    if np < 1:
        raise ValueError(f"-np must be at least 1, got {np}")
    if np > total:
        listed = ",".join(f"{h}:{s}" for h, s in hosts)
        raise ValueError(f"-np {np} is more than the {total} slots of the hosts ({listed})")
    return get_host_assignments([HostInfo(name, slots) for name, slots in hosts], np, np)


# -- addresses -------------------------------------------------------------------------------

def interface_address(name: str) -> Optional[str]:
    """IPv4 address of the local network interface ``name``, or None when it has none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(sock.fileno(), 0x8915,  # SIOCGIFADDR
                                 struct.pack("256s", name[:15].encode()))
    except OSError:
        return None
    return socket.inet_ntoa(packed[20:24])


def is_local_address(address: str) -> bool:
    """Whether ``address`` belongs to this machine (binding to it succeeds)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


def is_local_host(name: str) -> bool:
    if name in _LOCAL_NAMES or name in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except socket.gaierror:
        return False
    return any(ipaddress.ip_address(a.split("%")[0]).is_loopback or is_local_address(a)
               for a in addresses)


def route_source_address(host: str) -> str:
    """The local address this machine uses to reach ``host`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(host, 1, proto=socket.IPPROTO_UDP)
    except socket.gaierror as error:
        raise ValueError(f"cannot resolve host {host}: {error}") from error
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(sockaddr)
        except OSError as error:
            raise ValueError(f"no route to host {host} ({sockaddr[0]}): {error}") from error
        return sock.getsockname()[0]


def rendezvous_bind_address(slots: Sequence[SlotInfo], nics: Optional[str]) -> str:
    """Where the rendezvous service listens: the address of ``--network-interface`` when this
    machine has that interface; else, with remote hosts, the local address that routes to the
    first of them; else loopback."""
    remote = [s.hostname for s in slots if not is_local_host(s.hostname)]
    if nics:
        for name in nics.split(","):
            address = interface_address(name.strip())
            if address:
                return address
        if not remote:
            raise ValueError(f"--network-interface {nics}: no such interface with an IPv4 "
                             f"address on this machine")
    if remote:
        try:
            return route_source_address(remote[0])
        except ValueError as error:
            raise ValueError(f"{error}; cannot tell which address of this machine the ranks "
                             f"can reach: pass --network-interface") from error
    return "127.0.0.1"


# -- environment and commands ----------------------------------------------------------------

def gloo_timeout(args: argparse.Namespace) -> Optional[int]:
    for value in (getattr(args, "gloo_timeout_seconds", None), args.start_timeout):
        if value is not None:
            return int(value)
    return None


def rank_env(slot: SlotInfo, rendezvous: Tuple[str, int], args: argparse.Namespace) -> Dict[str, str]:
    """Horovod's Gloo variables for one rank."""
    env = {
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous[0],
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous[1]),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    timeout = gloo_timeout(args)
    if timeout is not None:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(timeout)
    if args.nics:
        # The transport listens on one interface; NCCL takes the whole list.
        env["HOROVOD_GLOO_IFACE"] = args.nics.split(",")[0].strip()
        env["NCCL_SOCKET_IFNAME"] = args.nics
    return env


def _is_mpi_identity(name: str) -> bool:
    return name.startswith(_MPI_IDENTITY_PREFIXES)


def local_env(base: Dict[str, str], runtime: Dict[str, str], never: Sequence[str],
              per_rank: Dict[str, str]) -> Dict[str, str]:
    """A local rank inherits the launcher's whole environment (as under mpirun)."""
    env = {k: v for k, v in base.items() if k not in never and not _is_mpi_identity(k)}
    env.update(runtime)
    env.update(per_rank)
    return env


def forwarded_env(base: Dict[str, str], runtime: Dict[str, str], forwarded: Sequence[str],
                  never: Sequence[str], per_rank: Dict[str, str]) -> Dict[str, str]:
    """What a remote rank receives: the variables the mpirun path exports with -x."""
    env = {k: v for k, v in base.items()
           if (k.startswith("HOROVOD_") or k in forwarded) and k not in never}
    env.update(runtime)
    env.update(per_rank)
    return env


def remote_shell(args: argparse.Namespace) -> List[str]:
    """The command that runs a shell command on a host: ``<shell...> HOST 'CMD'``."""
    if getattr(args, "remote_shell", None):
        return shlex.split(args.remote_shell)
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"]
    if args.ssh_port:
        cmd += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        cmd += ["-i", args.ssh_identity_file]
    return cmd


def remote_command(host: str, env: Dict[str, str], command: Sequence[str], cwd: str,
                   shell: Sequence[str], secret_on_stdin: bool = False) -> List[str]:
    """The local command line that runs ``command`` on ``host`` with ``env`` in ``cwd``.

    The remote shell keeps the rank in the background and ends it when the launcher's end of
    its standard input closes (the launcher exited or gave up on the job): without a terminal,
    closing an ssh session does not stop the remote command. With ``secret_on_stdin``, the
    first line of that input is the job's secret, exported as HOROVOD_SECRET_KEY."""
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    program = " ".join(shlex.quote(c) for c in command)
    read_secret = (f"IFS= read -r {SECRET_ENV} || exit 1; export {SECRET_ENV}; "
                   if secret_on_stdin else "")
    script = (f"{read_secret}cd {shlex.quote(cwd)} >/dev/null 2>&1; exec 3<&0; "
              f"env {assignments} {program} </dev/null & p=$!; "
              f"(cat <&3 >/dev/null 2>&1; kill -TERM $p 2>/dev/null) & w=$!; "
              f"wait $p; s=$?; kill $w 2>/dev/null; exit $s")
    return list(shell) + [host, script]


def describe(slot: SlotInfo, per_rank: Dict[str, str], cmd: Sequence[str], local: bool,
             cpus: Optional[List[int]] = None) -> str:
    """The --verbose line for one rank."""
    if local:
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(per_rank.items()))
        pinned = f" (CPUs {','.join(map(str, cpus))})" if cpus else ""
        return (f"horovodrun: rank {slot.rank} on {slot.hostname}{pinned}: {assignments} "
                + " ".join(shlex.quote(c) for c in cmd))
    return f"horovodrun: rank {slot.rank} on {slot.hostname}: " + " ".join(
        shlex.quote(c) for c in cmd)


# -- running ---------------------------------------------------------------------------------

class _Output:
    """Copies a rank's stream to the launcher's, one prefixed line at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # keeps lines of different ranks whole

    def copy(self, rank: int, name: str, source: IO[bytes], target: IO[str],
             log: Optional[IO[bytes]]) -> None:
        prefix = f"[{rank}]<{name}>:".encode()
        for line in iter(source.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with self._lock:
                _write_bytes(target, prefix + line)
            if log is not None:
                log.write(line)
                log.flush()
        source.close()


def _write_bytes(stream: IO[str], data: bytes) -> None:
    buffer = getattr(stream, "buffer", None)
    try:
        if buffer is not None:
            buffer.write(data)
            buffer.flush()
        else:
            stream.write(data.decode(errors="replace"))
            stream.flush()
    except (OSError, ValueError):
        pass


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Rank:
    def __init__(self, slot: SlotInfo, proc: subprocess.Popen, remote: bool) -> None:
        self.slot = slot
        self.proc = proc
        self.remote = remote
        self.readers: List[threading.Thread] = []

    def signal(self, signum: int) -> None:
        if self.proc.poll() is not None:
            return
        if self.remote and self.proc.stdin is not None:
            try:  # the remote side ends the rank when this closes
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


@contextlib.contextmanager
def _affinity_of_this_thread(cpus: Optional[List[int]]) -> Iterator[None]:
    """Runs the block with the calling thread restricted to ``cpus`` (None: unchanged).

    A child inherits the affinity of the thread that forks it, so the rank starts pinned, every
    thread it ever creates included; this avoids both a race (pinning the child after it has
    started threads) and a preexec_fn (unsafe in a launcher that runs threads). On Linux,
    sched_setaffinity(0) changes the calling thread only."""
    if cpus is None:
        yield
        return
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


class GlooJob:
    """Spawns the ranks and supervises them until every one has exited."""

    def __init__(self, slots: Sequence[SlotInfo], commands: Sequence[List[str]],
                 envs: Sequence[Optional[Dict[str, str]]], remote: Sequence[bool],
                 output_dir: Optional[str] = None,
                 first_input: Optional[Sequence[Optional[bytes]]] = None,
                 affinities: Optional[Sequence[Optional[List[int]]]] = None) -> None:
        self.slots = list(slots)
        self.commands = list(commands)
        self.envs = list(envs)
        self.remote = list(remote)
        # Written to a remote rank's standard input first (its secret line), if any.
        self.first_input = list(first_input) if first_input else [None] * len(self.slots)
        # The CPUs a local rank is pinned to (binding.gloo_affinities), None: not pinned.
        self.affinities = list(affinities) if affinities else [None] * len(self.slots)
        self.output_dir = output_dir
        self.ranks: List[_Rank] = []
        self._exits: "queue.Queue[Tuple[int, int]]" = queue.Queue()
        self._output = _Output()
        self._signalled: Optional[int] = None

    def _spawn(self, index: int) -> _Rank:
        slot = self.slots[index]
        remote = self.remote[index]
        with _affinity_of_this_thread(self.affinities[index]):
            proc = subprocess.Popen(self.commands[index], env=self.envs[index],
                                    stdin=subprocess.PIPE if remote else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        rank = _Rank(slot, proc, remote)
        data = self.first_input[index]
        if remote and data is not None and proc.stdin is not None:
            try:
                proc.stdin.write(data)
                proc.stdin.flush()
            except OSError:
                pass  # the remote shell already failed: its exit code says why
        for name, source, target in (("stdout", proc.stdout, sys.stdout),
                                     ("stderr", proc.stderr, sys.stderr)):
            log = None
            if self.output_dir:
                directory = os.path.join(self.output_dir, f"rank.{slot.rank}")
                os.makedirs(directory, exist_ok=True)
                log = open(os.path.join(directory, name), "wb")
            thread = threading.Thread(target=self._copy, args=(rank, name, source, target, log),
                                      name=f"hvdc-rank{slot.rank}-{name}", daemon=True)
            thread.start()
            rank.readers.append(thread)
        waiter = threading.Thread(target=lambda: self._exits.put((index, proc.wait())),
                                  name=f"hvdc-rank{slot.rank}-wait", daemon=True)
        waiter.start()
        return rank

    def _copy(self, rank: _Rank, name: str, source: IO[bytes], target: IO[str],
              log: Optional[IO[bytes]]) -> None:
        try:
            self._output.copy(rank.slot.rank, name, source, target, log)
        finally:
            if log is not None:
                log.close()

    def forward(self, signum: int) -> None:
        """Passes a signal the launcher received on to every rank."""
        if self._signalled is not None:
            signum = signal.SIGKILL  # a second signal: stop at once
        else:
            self._signalled = signum
        for rank in self.ranks:
            rank.signal(signum)

    def _terminate(self, alive: Sequence[_Rank]) -> None:
        for rank in alive:
            rank.signal(signal.SIGTERM)
        deadline = time.monotonic() + TERMINATE_GRACE_SECONDS
        for rank in alive:
            try:
                rank.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for rank in alive:
            rank.signal(signal.SIGKILL)

    def run(self) -> int:
        """Returns the job's exit code: 0, or the code of the first rank that failed."""
        first_failure: Optional[Tuple[int, int]] = None
        try:
            for index in range(len(self.slots)):
                self.ranks.append(self._spawn(index))
        except OSError as error:
            sys.stderr.write(f"horovodrun: cannot start rank {len(self.ranks)}: {error}\n")
            self._terminate(self.ranks)
            return 1
        running = len(self.ranks)
        while running:
            try:
                index, returncode = self._exits.get(timeout=0.2)
            except queue.Empty:
                continue
            running -= 1
            if returncode != 0 and first_failure is None:
                first_failure = (index, returncode)
                if self._signalled is None:
                    slot = self.slots[index]
                    sys.stderr.write(
                        f"horovodrun: rank {slot.rank} on {slot.hostname} exited with code "
                        f"{_exit_code(returncode)}; terminating the other ranks\n")
                    sys.stderr.flush()
                alive = [r for r in self.ranks if r.proc.poll() is None]
                threading.Thread(target=self._terminate, args=(alive,), daemon=True).start()
        for rank in self.ranks:
            for reader in rank.readers:
                # A rank's own children may keep its pipes open after it exited.
                reader.join(timeout=5)
            if rank.proc.stdin is not None:
                rank.proc.stdin.close()
        if self._signalled is not None:
            # However the ranks ended (Python ranks exit 1 on KeyboardInterrupt), the job was
            # interrupted: report it as a shell reports a process ended by that signal.
            return 128 + int(self._signalled)
        return 0 if first_failure is None else _exit_code(first_failure[1])


def run_gloo(args: argparse.Namespace, command: List[str], runtime: Dict[str, str],
             hosts: List[Tuple[str, int]], forwarded: Sequence[str],
             never: Sequence[str]) -> int:
    """Runs ``command`` on every rank; returns the job's exit code."""
    if args.np is None:
        if not args.hosts and not args.hostfile:
            raise ValueError("horovodrun --gloo needs -np (or -H/--hostfile to count slots)")
        args.np = sum(s for _, s in hosts)
    slots = allocate(hosts, args.np)
    locality = {h: is_local_host(h) for h in {s.hostname for s in slots}}
    bind = rendezvous_bind_address(slots, args.nics)
    # The job's secret: the rendezvous service and every connection between ranks check it.
    secret = secrets.token_hex(32)
    server = RendezvousServer(secret)
    rendezvous = server.start(bind, 0)
    try:
        shell = remote_shell(args)
        cwd = os.getcwd()
        commands, envs, remote, first_input = [], [], [], []
        n_local = sum(1 for slot in slots if locality[slot.hostname])
        local_cpus = iter(binding.gloo_affinities(n_local, getattr(args, "binding_args", None)))
        affinities: List[Optional[List[int]]] = []
        for slot in slots:
            per_rank = rank_env(slot, rendezvous, args)
            if locality[slot.hostname]:
                commands.append(list(command))
                env = local_env(dict(os.environ), runtime, never, per_rank)
                env[SECRET_ENV] = secret  # after describe's view: never printed
                envs.append(env)
                remote.append(False)
                first_input.append(None)
                affinities.append(next(local_cpus))
                line = describe(slot, per_rank, command, True, affinities[-1])
            else:
                env = forwarded_env(dict(os.environ), runtime, forwarded, never, per_rank)
                env.pop(SECRET_ENV, None)  # sent on standard input instead
                commands.append(remote_command(slot.hostname, env, command, cwd, shell,
                                               secret_on_stdin=True))
                envs.append(None)
                remote.append(True)
                first_input.append(secret.encode() + b"\n")
                affinities.append(None)
                line = describe(slot, per_rank, commands[-1], False)
            if args.verbose:
                print(line, flush=True)
        if args.verbose:
            print(f"horovodrun: rendezvous service on {rendezvous[0]}:{rendezvous[1]}",
                  flush=True)
        job = GlooJob(slots, commands, envs, remote, args.output_filename, first_input,
                      affinities)

        def forward(signum: int, _frame: object) -> None:
            job.forward(signum)

        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = ({s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
                    if in_main_thread else {})
        try:
            return job.run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        server.stop()
