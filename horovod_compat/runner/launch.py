"""``horovodrun``: builds an Open MPI ``mpirun`` command line and environment from Horovod's
launcher flags, runs it, forwards SIGINT/SIGTERM and exits with the job's exit code. With
``--gloo`` (or ``HOROVOD_CONTROLLER=gloo``, or when mpirun is not installed) the job runs over
the TCP transport instead, launched by gloo_launch.py. With ``--host-discovery-script`` or
``--min-np`` the job is elastic (docs/elastic.md), always over the TCP transport, run by
runner/elastic/ through gloo_run.py."""

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from horovod_compat.runner import binding

# Variables always forwarded to the ranks when set, besides every HOROVOD_* variable.
_FORWARDED = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TF_CPP_MIN_LOG_LEVEL",
              "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES",
              "OMP_NUM_THREADS", "NCCL_IB_DISABLE")
_NEVER_FORWARDED = ("_HOROVOD_SECRET_KEY",)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horovodrun",
                                description="Launch a horovod_compat job through mpirun, or "
                                            "over TCP with --gloo.")
    p.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="total number of processes")
    p.add_argument("-H", "--hosts", dest="hosts", help="host1:slots,host2:slots,...")
    p.add_argument("-hostfile", "--hostfile", dest="hostfile",
                   help="file with lines 'host slots=N'")
    p.add_argument("-p", "--ssh-port", dest="ssh_port", type=int)
    p.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file")
    p.add_argument("--start-timeout", type=int,
                   help="seconds to wait for all ranks to start (HOROVOD_START_TIMEOUT; with "
                        "--gloo also the rendezvous timeout unless --gloo-timeout-seconds)")
    p.add_argument("--gloo-timeout-seconds", type=int,
                   help="--gloo: seconds each rank waits for the others to register "
                        "(HOROVOD_GLOO_TIMEOUT_SECONDS, default 30)")
    p.add_argument("--remote-shell",
                   help="--gloo: command that runs a shell command on a remote host, called "
                        "as '<command> HOST CMD' (default: ssh with -p/-i)")
    p.add_argument("--network-interface", "--network-interfaces", dest="nics")
    p.add_argument("--output-filename", help="directory for per-rank output (mpirun)")
    p.add_argument("--fusion-threshold-mb", type=float)
    p.add_argument("--cycle-time-ms", type=float)
    p.add_argument("--cache-capacity", type=int)
    p.add_argument("--hierarchical-allreduce", action="store_true", default=None)
    p.add_argument("--hierarchical-allgather", action="store_true", default=None)
    p.add_argument("--autotune", action="store_true", default=None)
    p.add_argument("--autotune-log-file")
    p.add_argument("--timeline-filename")
    p.add_argument("--timeline-mark-cycles", action="store_true", default=None)
    p.add_argument("--no-stall-check", action="store_true", default=None)
    p.add_argument("--stall-check-warning-time-seconds", type=int)
    p.add_argument("--stall-check-shutdown-time-seconds", type=int)
    p.add_argument("--mpi-threads-disable", action="store_true", default=None)
    p.add_argument("--num-nccl-streams", type=int)
    p.add_argument("--thread-affinity", type=int)
    p.add_argument("--log-level", choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR",
                                           "FATAL"])
    p.add_argument("--log-with-timestamp", action="store_true", default=None)
    p.add_argument("--tcp", dest="tcp_flag", action="store_true", default=None)
    p.add_argument("--verbose", action="store_true", help="print the mpirun command")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="show which frameworks and controllers were built, then exit")
    p.add_argument("--mpi-args", default="", help="extra arguments for mpirun")
    p.add_argument("--binding-args",
                   help="mpirun's binding and mapping flags, replacing horovodrun's (default: "
                        "each rank bound to its share of this machine's cores when the ranks do "
                        "not outnumber them, else '--bind-to none --map-by slot'); with --gloo "
                        "only '--bind-to none' or '--bind-to core' (docs/launch_defaults.md)")
    p.add_argument("--mpi", dest="use_mpi", action="store_true", help="use MPI (the default)")
    p.add_argument("--gloo", dest="use_gloo", action="store_true",
                   help="run over the TCP transport: spawn the ranks here and over ssh, "
                        "without mpirun")
    e = p.add_argument_group("elastic arguments (docs/elastic.md)")
    e.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=int,
                   help="elastic: the fewest processes the job runs with (default: -np)")
    e.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=int,
                   help="elastic: the most processes (default: every discovered slot)")
    e.add_argument("--slots-per-host", dest="slots", type=int,
                   help="elastic: slots of a discovered host printed without ':slots' "
                        "(default 1)")
    e.add_argument("--host-discovery-script", dest="host_discovery_script",
                   help="elastic: executable printing the available hosts, one 'host[:slots]' "
                        "per line; run about once a second")
    e.add_argument("--elastic-timeout", dest="elastic_timeout", type=int,
                   help="elastic: seconds a round waits for its workers and for --min-np slots "
                        "(HOROVOD_ELASTIC_TIMEOUT, default 600)")
    e.add_argument("--reset-limit", dest="reset_limit", type=int,
                   help="elastic: stop the job after this many resets")
    e.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
                   metavar=("MIN", "MAX"),
                   help="elastic: seconds a failed host stays blacklisted (growing with each "
                        "failure, within MIN..MAX); default: for good")
    p.add_argument("--no-alias", dest="no_alias", action="store_true",
                   help="do not map 'import horovod...' onto horovod_compat in Python commands")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    return p


def runtime_env(args: argparse.Namespace) -> Dict[str, str]:
    """HOROVOD_* settings derived from the flags."""
    env: Dict[str, str] = {}
    if args.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = repr(float(args.cycle_time_ms))
    if args.cache_capacity is not None:
        env["HOROVOD_CACHE_CAPACITY"] = str(args.cache_capacity)
    if args.hierarchical_allreduce:
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    if args.hierarchical_allgather:
        env["HOROVOD_HIERARCHICAL_ALLGATHER"] = "1"
    if args.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if args.autotune_log_file:
        env["HOROVOD_AUTOTUNE_LOG"] = args.autotune_log_file
    if args.timeline_filename:
        env["HOROVOD_TIMELINE"] = args.timeline_filename
    if args.timeline_mark_cycles:
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    if args.no_stall_check:
        env["HOROVOD_STALL_CHECK_DISABLE"] = "1"
    if args.stall_check_warning_time_seconds is not None:
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(args.stall_check_warning_time_seconds)
    if args.stall_check_shutdown_time_seconds is not None:
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(args.stall_check_shutdown_time_seconds)
    if args.mpi_threads_disable:
        env["HOROVOD_MPI_THREADS_DISABLE"] = "1"
    if args.num_nccl_streams is not None:
        env["HOROVOD_NUM_NCCL_STREAMS"] = str(args.num_nccl_streams)
    if args.thread_affinity is not None:
        env["HOROVOD_THREAD_AFFINITY"] = str(args.thread_affinity)
    if args.log_level:
        env["HOROVOD_LOG_LEVEL"] = args.log_level
    if args.log_with_timestamp is not None:
        env["HOROVOD_LOG_HIDE_TIME"] = "0" if args.log_with_timestamp else "1"
    if args.tcp_flag:
        env["NCCL_IB_DISABLE"] = "1"
    if args.start_timeout is not None:
        env["HOROVOD_START_TIMEOUT"] = str(args.start_timeout)
    if args.gloo_timeout_seconds is not None:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(args.gloo_timeout_seconds)
    return env


def parse_hosts(hosts: str) -> List[Tuple[str, int]]:
    result = []
    for item in hosts.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, slots = item.partition(":")
        result.append((name, int(slots) if slots else 1))
    return result


def parse_hostfile(path: str) -> List[Tuple[str, int]]:
    result = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            slots = 1
            for field in fields[1:]:
                if field.startswith("slots="):
                    slots = int(field[len("slots="):])
            result.append((fields[0], slots))
    return result


def job_hosts(args: argparse.Namespace, local_slots: int) -> List[Tuple[str, int]]:
    """(host, slots) from -H or --hostfile; this machine with ``local_slots`` otherwise."""
    if args.hosts:
        return parse_hosts(args.hosts)
    if args.hostfile:
        return parse_hostfile(args.hostfile)
    return [("localhost", local_slots)]


def _local_ranks(args: argparse.Namespace, hosts: List[Tuple[str, int]],
                 np_: int) -> Optional[int]:
    """How many ranks run on this machine; None when some run on other hosts."""
    if not args.hosts and not args.hostfile:
        return np_
    from horovod_compat.runner.gloo_launch import is_local_host
    return np_ if all(is_local_host(h) for h, _ in hosts) else None


def build_mpirun_command(args: argparse.Namespace, env: Dict[str, str],
                         command: Sequence[str]) -> List[str]:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun not found: install Open MPI (Debian: openmpi-bin)")
    np_ = args.np
    hosts = job_hosts(args, os.cpu_count() or 1)
    slots = sum(s for _, s in hosts)
    if np_ is None:
        np_ = slots
    cmd = [mpirun, "-np", str(np_)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if args.hosts:
        cmd += ["-H", ",".join(f"{h}:{s}" for h, s in hosts)]
    elif args.hostfile:
        cmd += ["--hostfile", args.hostfile]
    if np_ > slots or (not args.hosts and not args.hostfile):
        # Local jobs (and any job asking for more ranks than slots) may exceed the core count.
        cmd.append("--oversubscribe")
    user_args = shlex.split(args.mpi_args) if args.mpi_args else []
    cmd += binding.mpirun_placement(_local_ranks(args, hosts, np_), len(binding.local_cores()),
                                    getattr(args, "binding_args", None), user_args, os.environ)
    if args.ssh_port:
        cmd += ["--mca", "plm_rsh_args", f"-p {args.ssh_port}"]
    if args.nics:
        cmd += ["--mca", "btl_tcp_if_include", args.nics]
    if args.output_filename:
        cmd += ["--output-filename", args.output_filename]
    if args.start_timeout is not None:
        # Bounds the ORTE daemons' start-up (remote hosts).
        cmd += ["--mca", "orte_startup_timeout", str(args.start_timeout)]
    names = sorted(set(env) | {k for k in os.environ if k.startswith("HOROVOD_")} |
                   {k for k in _FORWARDED if k in os.environ})
    for name in names:
        if name not in _NEVER_FORWARDED:
            cmd += ["-x", name]
    cmd += user_args
    cmd += list(command)
    return cmd


def check_build() -> str:
    import horovod_compat.common.basics  # noqa: F401  (fails loudly if the core is missing)
    lines = ["Horovod (horovod_compat) v%s:" % _version(), "", "Available Frameworks:"]
    try:
        import horovod_compat.tensorflow  # noqa: F401
        tf_ok = True
    except ImportError:
        tf_ok = False
    lines.append("    [%s] TensorFlow" % ("X" if tf_ok else " "))
    lines.append("    [ ] PyTorch")
    lines.append("    [ ] MXNet")
    from horovod_compat.common.util import gloo_built
    gloo = "X" if gloo_built() else " "
    lines += ["", "Available Controllers:", "    [X] MPI", f"    [{gloo}] Gloo", "",
              "Available Tensor Operations:"]
    nccl = False
    if tf_ok:
        from horovod_compat.tensorflow import nccl_built
        nccl = bool(nccl_built())
    lines += ["    [%s] NCCL" % ("X" if nccl else " "), "    [ ] DDL", "    [ ] CCL",
              "    [X] MPI", f"    [{gloo}] Gloo"]
    return "\n".join(lines)


def _version() -> str:
    from horovod_compat import __version__
    return __version__


def with_alias(command: List[str]) -> List[str]:
    """``python script.py ...`` / ``python -m mod ...`` -> run through horovod_compat.alias, with
    the sys.path the command would have had on its own (alias.BOOTSTRAP says why not ``-m``)."""
    if len(command) < 2 or not os.path.basename(command[0]).startswith("python"):
        return command
    if command[1] == "-m" and len(command) > 2 and command[2] == "horovod_compat.alias":
        return command
    if command[1] == "-m" or not command[1].startswith("-"):
        from horovod_compat import alias
        return alias.command_through_alias(command[0], command[1:])
    return command


def _own_process_group() -> Dict[str, object]:
    """Popen arguments that start mpirun in a process group of its own.

    A signal sent to the launcher's whole process group (``timeout``, ``kill -- -PGID``, batch
    schedulers) would otherwise reach mpirun twice: directly, and forwarded by us. Open MPI
    treats a second SIGTERM as "exit now" and leaves the ranks (which sit in process groups of
    their own) running. With mpirun in its own group, only our forwarded signal reaches it.
    When stdin is a terminal mpirun stays in the foreground group: it forwards stdin to rank 0
    only from there, and Ctrl-C (SIGINT) is handled by Open MPI correctly either way."""
    try:
        interactive = sys.stdin is not None and os.isatty(sys.stdin.fileno())
    except (OSError, ValueError):
        interactive = False
    if interactive:
        return {}
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"start_new_session": True}


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_commandline(argv: Optional[Sequence[str]] = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(_version())
        return 0
    if args.check_build:
        print(check_build())
        return 0
    if args.use_gloo and args.use_mpi:
        parser.error("--gloo and --mpi exclude each other")
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command to run")
    if not args.no_alias:
        command = with_alias(command)
    if _is_elastic(args):
        if args.use_mpi:
            parser.error("elastic mode (--min-np, --host-discovery-script) runs over TCP: "
                         "--mpi excludes it")
        try:
            result = _elastic_job(args, command)
        except (ValueError, RuntimeError) as error:
            print(f"horovodrun: {error}", file=sys.stderr, flush=True)
            return 2
        if result.error is not None:
            print(f"horovodrun: {result.error.rstrip()}", file=sys.stderr, flush=True)
        return result.exit_code
    if use_gloo(args):
        return _run_gloo(args, command)
    env = dict(os.environ)
    env.update(runtime_env(args))
    for name in _NEVER_FORWARDED:
        env.pop(name, None)
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cmd = build_mpirun_command(args, runtime_env(args), command)
    if args.verbose:
        print("horovodrun:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.Popen(cmd, env=env, **_own_process_group())

    def forward(signum: int, _frame: object) -> None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    # Signal handlers can only be installed from the main thread (horovod_compat.run may be
    # called from another one); there the job simply runs without forwarding.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = ({s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
                if in_main_thread else {})
    try:
        returncode = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return _exit_code(returncode)


def use_gloo(args: argparse.Namespace) -> bool:
    """--gloo; else, unless --mpi, HOROVOD_CONTROLLER=gloo or no mpirun installed."""
    if args.use_gloo:
        return True
    if args.use_mpi:
        return False
    if os.environ.get("HOROVOD_CONTROLLER", "").strip().lower() == "gloo":
        return True
    return shutil.which("mpirun") is None


def _run_gloo(args: argparse.Namespace, command: List[str]) -> int:
    from horovod_compat.runner import gloo_launch
    if args.mpi_args:
        print("horovodrun: --mpi-args is ignored: the job runs over TCP (--gloo)",
              file=sys.stderr, flush=True)
    try:
        hosts = job_hosts(args, args.np or 1)
        # The ranks' start-up errors name the launcher as what set the Gloo variables.
        runtime = dict(runtime_env(args), HVDC_TCP_ADDRESS_ORIGIN="horovodrun --gloo")
        return gloo_launch.run_gloo(args, command, runtime, hosts, _FORWARDED, _NEVER_FORWARDED)
    except (ValueError, RuntimeError) as error:
        print(f"horovodrun: {error}", file=sys.stderr, flush=True)
        return 2


def _is_elastic(args: argparse.Namespace) -> bool:
    """Elastic when hosts are discovered or a minimum number of processes is given."""
    return args.host_discovery_script is not None or args.min_num_proc is not None


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Horovod's ``horovod.runner.launch.parse_args``: the flags of ``sys.argv[1:]`` (or
    ``argv``), with Horovod's names for the process count (``num_proc``) and ``run_func``."""
    args = make_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    args.num_proc = args.np
    args.run_func = None
    args.executable = None
    return args


def _elastic_command(args: argparse.Namespace) -> List[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("no command to run")
    return command if args.no_alias else with_alias(command)


def _run_elastic(args: argparse.Namespace) -> None:
    """Horovod's ``_run_elastic``: runs the elastic job of ``parse_args()``'s ``args``; raises
    ``RuntimeError`` with Horovod's message when it fails."""
    result = _elastic_job(args, _elastic_command(args))
    if result.error is not None:
        raise RuntimeError(result.error)


def _elastic_job(args: argparse.Namespace, command: List[str]) -> "object":
    """Builds the elastic settings from the flags and runs the job (runner/elastic/)."""
    from horovod_compat.runner import gloo_run
    from horovod_compat.runner.elastic import discovery
    from horovod_compat.runner.elastic.settings import ElasticSettings
    from horovod_compat.runner.gloo_launch import merge_hosts

    num_proc = args.np if args.np is not None else getattr(args, "num_proc", None)
    if args.host_discovery_script:
        if args.hosts or args.hostfile:
            raise ValueError("--host-discovery-script excludes -H and --hostfile")
        source = discovery.HostDiscoveryScript(args.host_discovery_script, args.slots or 1)
        first_hosts: List[str] = []
    else:
        hosts = merge_hosts(job_hosts(args, num_proc or args.min_num_proc or 1))
        source = discovery.FixedHosts(hosts)
        first_hosts = [h for h, _ in hosts]
        total = sum(s for _, s in hosts)
        if num_proc is None:
            num_proc = total
        if num_proc > total:
            # Fixed hosts never grow: waiting for the slots would only end in the timeout.
            listed = ",".join(f"{h}:{s}" for h, s in hosts)
            raise ValueError(f"-np {num_proc} is more than the {total} slots of the hosts "
                             f"({listed}), which do not change without a discovery script")
    if num_proc is None:
        num_proc = args.min_num_proc
    if num_proc is None:
        raise ValueError("elastic mode needs -np or --min-np")
    if args.mpi_args:
        print("horovodrun: --mpi-args is ignored: the job runs over TCP (elastic)",
              file=sys.stderr, flush=True)
    runtime = dict(runtime_env(args), HVDC_TCP_ADDRESS_ORIGIN="horovodrun (elastic)")
    settings = ElasticSettings(
        discovery=source, num_proc=num_proc,
        min_num_proc=args.min_num_proc if args.min_num_proc is not None else num_proc,
        max_num_proc=args.max_num_proc, elastic_timeout=args.elastic_timeout,
        reset_limit=args.reset_limit,
        cooldown_range=tuple(args.cooldown_range) if args.cooldown_range else None,
        nics=args.nics, verbose=bool(args.verbose), output_filename=args.output_filename,
        args=args, runtime_env=runtime)
    return gloo_run.gloo_run_elastic(settings, command, _FORWARDED, _NEVER_FORWARDED,
                                     bool(args.host_discovery_script), first_hosts)


def main() -> None:
    sys.exit(run_commandline())


if __name__ == "__main__":
    main()
