"""horovodrun --gloo: slot allocation, environment and command composition, and real jobs of
small Python scripts (no TensorFlow, no transport: each rank reports what it was given)."""

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from horovod_compat.runner import binding, gloo_launch, launch, run_func
from horovod_compat.runner.common.util.hosts import SlotInfo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_single_process = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="launcher jobs run from the test process started without mpirun")


def _args(*argv):
    return launch.make_parser().parse_args(list(argv))


# -- slots -----------------------------------------------------------------------------------

def _expected_slots(hosts, np):
    """Horovod's numbering, derived independently: ranks fill hosts in order."""
    owner = []
    for name, slots in hosts:
        owner += [name] * slots
    owner = owner[:np]
    names = list(dict.fromkeys(owner))
    result = []
    for rank, name in enumerate(owner):
        on_host = [r for r, h in enumerate(owner) if h == name]
        local_rank = on_host.index(rank)
        peers = [h for h in names if sum(1 for o in owner if o == h) > local_rank]
        result.append(SlotInfo(name, rank, local_rank, peers.index(name), np, len(on_host),
                               len(peers)))
    return result


@pytest.mark.parametrize("hosts,np", [
    ([("localhost", 4)], 1),
    ([("localhost", 4)], 3),
    ([("a", 2), ("b", 2), ("c", 2)], 6),
    ([("a", 2), ("b", 2), ("c", 2)], 5),
    ([("a", 3), ("b", 1), ("c", 2)], 6),
    ([("a", 1), ("b", 4)], 4),
])
def test_allocation_matches_horovods_numbering(hosts, np):
    slots = gloo_launch.allocate(hosts, np)
    assert slots == _expected_slots(hosts, np)
    assert [s.rank for s in slots] == list(range(np))


def test_allocation_merges_repeated_hosts_and_rejects_bad_counts():
    assert gloo_launch.allocate([("a", 1), ("b", 1), ("a", 1)], 3) == \
        _expected_slots([("a", 2), ("b", 1)], 3)
    with pytest.raises(ValueError,
                       match=r"-np 5 is more than the 4 slots of the hosts \(a:2,b:2\)"):
        gloo_launch.allocate([("a", 2), ("b", 2)], 5)
    with pytest.raises(ValueError, match="at least 1"):
        gloo_launch.allocate([("a", 2)], 0)
    with pytest.raises(ValueError, match="host b has 0 slots"):
        gloo_launch.allocate([("a", 2), ("b", 0)], 1)


# -- environment -----------------------------------------------------------------------------

def test_rank_environment():
    slot = gloo_launch.allocate([("a", 2), ("b", 1)], 3)[2]
    args = _args("--gloo", "-np", "3", "--start-timeout", "45", "--network-interface", "eth1",
                 "python", "t.py")
    env = gloo_launch.rank_env(slot, ("10.1.2.3", 4567), args)
    assert env == {
        "HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_HOSTNAME": "b", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.1.2.3",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4567", "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_TIMEOUT_SECONDS": "45",
        "HOROVOD_GLOO_IFACE": "eth1", "NCCL_SOCKET_IFNAME": "eth1"}
    args = _args("--gloo", "--start-timeout", "45", "--gloo-timeout-seconds", "9", "x")
    env = gloo_launch.rank_env(slot, ("h", 1), args)
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "9"
    assert "HOROVOD_GLOO_IFACE" not in env
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in gloo_launch.rank_env(slot, ("h", 1), _args("x"))
    assert launch.runtime_env(args)["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "9"
    env = gloo_launch.rank_env(slot, ("h", 1), _args("--network-interface", "eth1,eth2", "x"))
    assert env["HOROVOD_GLOO_IFACE"] == "eth1" and env["NCCL_SOCKET_IFNAME"] == "eth1,eth2"


def test_local_and_forwarded_environments():
    base = {"PATH": "/bin", "HOME": "/root", "HOROVOD_FUSION_THRESHOLD": "1",
            "_HOROVOD_SECRET_KEY": "s", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_RANK": "1",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "HOROVOD_RANK": "7"}
    runtime = {"HOROVOD_CYCLE_TIME": "2.0"}
    per_rank = {"HOROVOD_RANK": "0"}
    env = gloo_launch.local_env(base, runtime, launch._NEVER_FORWARDED, per_rank)
    assert env == {"PATH": "/bin", "HOME": "/root", "HOROVOD_FUSION_THRESHOLD": "1",
                   "OMPI_ALLOW_RUN_AS_ROOT": "1", "HOROVOD_CYCLE_TIME": "2.0",
                   "HOROVOD_RANK": "0"}
    env = gloo_launch.forwarded_env(base, runtime, launch._FORWARDED, launch._NEVER_FORWARDED,
                                    per_rank)
    assert env == {"PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "1", "HOROVOD_CYCLE_TIME": "2.0",
                   "HOROVOD_RANK": "0"}


def test_remote_shell_command():
    args = _args("--gloo", "-p", "2222", "-i", "/k/id", "x")
    assert gloo_launch.remote_shell(args) == ["ssh", "-o", "BatchMode=yes", "-o",
                                              "StrictHostKeyChecking=no", "-p", "2222",
                                              "-i", "/k/id"]
    args = _args("--gloo", "--remote-shell", "/opt/netns-cluster rsh", "x")
    assert gloo_launch.remote_shell(args) == ["/opt/netns-cluster", "rsh"]
    cmd = gloo_launch.remote_command("h1", {"A": "1"}, ["python", "t.py"], "/w", ["ssh"])
    assert cmd[:2] == ["ssh", "h1"] and len(cmd) == 3


def test_remote_command_carries_env_cwd_and_code(tmp_path):
    """The remote script, run by a local sh with an empty environment, sees exactly the
    variables and directory it was given, however they are quoted, and returns the code."""
    env = {"PLAIN": "1", "SPACES": "a b  c", "QUOTES": "it's \"x\"", "DOLLAR": "$HOME;`id`"}
    code = ("import json, os, sys; "
            "print(json.dumps({'cwd': os.getcwd(), 'env': {k: os.environ[k] for k in "
            "['PLAIN', 'SPACES', 'QUOTES', 'DOLLAR']}})); sys.exit(3)")
    cmd = gloo_launch.remote_command("h1", env, [sys.executable, "-c", code], str(tmp_path),
                                     ["rsh"])
    assert cmd[:2] == ["rsh", "h1"]
    # The launcher holds the remote shell's standard input open while the rank runs.
    proc = subprocess.Popen(["env", "-i", "sh", "-c", cmd[2]], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True)
    try:
        out = proc.stdout.read()
        assert proc.wait(timeout=60) == 3
    finally:
        proc.stdin.close()
    assert json.loads(out) == {"cwd": str(tmp_path), "env": env}


def test_remote_command_reads_the_secret_from_its_input(tmp_path):
    code = "import os; print(os.environ['HOROVOD_SECRET_KEY'], os.environ['A'])"
    cmd = gloo_launch.remote_command("h1", {"A": "1"}, [sys.executable, "-c", code],
                                     str(tmp_path), ["rsh"], secret_on_stdin=True)
    assert "s3cr3t" not in " ".join(cmd)
    proc = subprocess.Popen(["env", "-i", "sh", "-c", cmd[2]], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("s3cr3t\n")
        proc.stdin.flush()
        out = proc.stdout.readline()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.stdin.close()
    assert out == "s3cr3t 1\n"


def test_remote_rank_ends_when_its_input_closes(tmp_path):
    cmd = gloo_launch.remote_command("h1", {}, ["sleep", "60"], str(tmp_path), ["rsh"])
    result = subprocess.run(["sh", "-c", cmd[2]], stdin=subprocess.DEVNULL, timeout=30)
    assert result.returncode == 128 + signal.SIGTERM


def test_rendezvous_address_choice():
    local = gloo_launch.allocate([("localhost", 2)], 2)
    assert gloo_launch.rendezvous_bind_address(local, None) == "127.0.0.1"
    assert gloo_launch.rendezvous_bind_address(local, "lo") == "127.0.0.1"
    with pytest.raises(ValueError, match="--network-interface nosuchif0"):
        gloo_launch.rendezvous_bind_address(local, "nosuchif0")
    remote = gloo_launch.allocate([("no-such-host.invalid", 1)], 1)
    with pytest.raises(ValueError, match="pass --network-interface"):
        gloo_launch.rendezvous_bind_address(remote, None)
    assert gloo_launch.rendezvous_bind_address(remote, "lo") == "127.0.0.1"


def test_local_host_detection():
    import socket
    for name in ("localhost", "127.0.0.1", socket.gethostname()):
        assert gloo_launch.is_local_host(name), name
    assert not gloo_launch.is_local_host("no-such-host.invalid")
    assert not gloo_launch.is_local_host("192.0.2.250")  # TEST-NET-1, never this machine


def test_launcher_chooses_gloo(monkeypatch):
    monkeypatch.delenv("HOROVOD_CONTROLLER", raising=False)
    monkeypatch.setattr(launch.shutil, "which", lambda name: "/usr/bin/" + name)
    assert launch.use_gloo(_args("--gloo", "x"))
    assert not launch.use_gloo(_args("x"))
    monkeypatch.setenv("HOROVOD_CONTROLLER", "GLOO")
    assert launch.use_gloo(_args("x"))
    assert not launch.use_gloo(_args("--mpi", "x"))
    monkeypatch.setenv("HOROVOD_CONTROLLER", "mpi")
    assert not launch.use_gloo(_args("x"))
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    assert launch.use_gloo(_args("x"))   # no mpirun installed
    assert not launch.use_gloo(_args("--mpi", "x"))
    with pytest.raises(SystemExit):
        launch.run_commandline(["--gloo", "--mpi", "-np", "1", "true"])


def test_gloo_without_np_is_an_error(capsys):
    assert launch.run_commandline(["--gloo", "true"]) == 2
    assert "needs -np" in capsys.readouterr().err
    assert launch.run_commandline(["--gloo", "-np", "3", "-H", "localhost:2", "true"]) == 2
    assert "-np 3 is more than the 2 slots" in capsys.readouterr().err


def test_run_function_passes_gloo(monkeypatch):
    seen = []

    def fake_run_commandline(argv):
        seen.append(list(argv))
        return 1

    monkeypatch.setattr(launch, "run_commandline", fake_run_commandline)
    with pytest.raises(RuntimeError, match="exited with code 1"):
        run_func.run(len, np=2, use_gloo=True, mpi_args="--foo", start_timeout=20)
    argv = seen[-1]
    assert "--gloo" in argv and "--mpi-args=--foo" not in argv
    assert argv[argv.index("--start-timeout") + 1] == "20"
    with pytest.raises(RuntimeError):
        run_func.run(len, np=2, use_mpi=True)
    assert "--mpi" in seen[-1] and "--gloo" not in seen[-1]
    with pytest.raises(ValueError, match="exclude each other"):
        run_func.run(len, np=2, use_gloo=True, use_mpi=True)


# -- real jobs -------------------------------------------------------------------------------

_REPORTER = """
    import json, os, sys, time
    out = sys.argv[1]
    rank = os.environ["HOROVOD_RANK"]
    names = sorted(k for k in os.environ if k.startswith(("HOROVOD_", "NCCL_", "OMPI_", "PMIX_")))
    report = {"env": {k: os.environ[k] for k in names}, "cwd": os.getcwd(), "pid": os.getpid(),
              "secret": "_HOROVOD_SECRET_KEY" in os.environ,
              "cpus": sorted(os.sched_getaffinity(0))}
    with open(os.path.join(out, "rank-" + rank + ".json.tmp"), "w") as f:
        json.dump(report, f)
    os.replace(os.path.join(out, "rank-" + rank + ".json.tmp"),
               os.path.join(out, "rank-" + rank + ".json"))
    print("line from rank", rank, flush=True)
    print("error line from rank", rank, file=sys.stderr, flush=True)
    codes = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if rank in codes:
        if codes[rank] == "sleep":
            time.sleep(120)
        if isinstance(codes[rank], list):  # [code, "after all"]: fail once every rank reported
            size = int(os.environ["HOROVOD_SIZE"])
            while not all(os.path.exists(os.path.join(out, f"rank-{r}.json"))
                          for r in range(size)):
                time.sleep(0.05)
            sys.exit(codes[rank][0])
        sys.exit(codes[rank])
"""


def _launcher_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_", "HOROVOD_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["_HOROVOD_SECRET_KEY"] = "must-not-reach-ranks"
    env["HOROVOD_FUSION_THRESHOLD"] = "12345"
    return env


def _start(tmp_path, flags, codes=None, **popen):
    script = tmp_path / "reporter.py"
    script.write_text(textwrap.dedent(_REPORTER))
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "--gloo", *flags,
           sys.executable, str(script), str(tmp_path)]
    if codes:
        cmd.append(json.dumps(codes))
    return subprocess.Popen(cmd, env=_launcher_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            cwd=str(tmp_path), **popen)


def _reports(tmp_path, np):
    reports = {}
    for r in range(np):
        with open(tmp_path / f"rank-{r}.json") as f:
            reports[r] = json.load(f)
    return reports


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for_reports(tmp_path, np, launcher, seconds=60):
    deadline = time.monotonic() + seconds
    while not all((tmp_path / f"rank-{r}.json").exists() for r in range(np)):
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)
    return _reports(tmp_path, np)


def _check_identity(reports, hosts, np, fusion="12345", output=""):
    expected = gloo_launch.allocate(hosts, np)
    # One fresh secret per job, the same for every rank (local or remote), never printed.
    keys = {rep["env"].get("HOROVOD_SECRET_KEY") for rep in reports.values()}
    assert len(keys) == 1
    key = keys.pop()
    assert key is not None and len(key) == 64 and int(key, 16) >= 0
    assert key not in output
    ports = {rep["env"]["HOROVOD_GLOO_RENDEZVOUS_PORT"] for rep in reports.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for slot in expected:
        env = reports[slot.rank]["env"]
        assert env["HOROVOD_RANK"] == str(slot.rank)
        assert env["HOROVOD_SIZE"] == str(np)
        assert env["HOROVOD_LOCAL_RANK"] == str(slot.local_rank)
        assert env["HOROVOD_LOCAL_SIZE"] == str(slot.local_size)
        assert env["HOROVOD_CROSS_RANK"] == str(slot.cross_rank)
        assert env["HOROVOD_CROSS_SIZE"] == str(slot.cross_size)
        assert env["HOROVOD_HOSTNAME"] == slot.hostname
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
        assert env["HOROVOD_CONTROLLER"] == "gloo"
        assert env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert env["HOROVOD_FUSION_THRESHOLD"] == fusion          # forwarded
        assert not [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMIX_"))]
        assert not reports[slot.rank]["secret"]


@needs_single_process
@pytest.mark.timeout(120)
@pytest.mark.parametrize("np,hosts", [(2, None), (3, None), (3, "localhost:2,127.0.0.1:1")])
def test_job_ranks_get_their_identity(tmp_path, np, hosts):
    flags = ["-np", str(np), "--start-timeout", "17", "--cycle-time-ms", "4", "--verbose"]
    if hosts:
        flags += ["-H", hosts]
    launcher = _start(tmp_path, flags)
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 0, (out, err)
    host_list = launch.parse_hosts(hosts) if hosts else [("localhost", np)]
    reports = _reports(tmp_path, np)
    _check_identity(reports, host_list, np, output=out + err)
    for r in range(np):
        assert reports[r]["env"]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "17"
        assert reports[r]["env"]["HOROVOD_CYCLE_TIME"] == "4.0"
        assert reports[r]["cwd"] == str(tmp_path)
        assert f"[{r}]<stdout>:line from rank {r}\n" in out
        assert f"[{r}]<stderr>:error line from rank {r}\n" in err
        assert f"horovodrun: rank {r} on " in out     # --verbose
    assert "horovodrun: rendezvous service on 127.0.0.1:" in out
    # Not pinned by default (binding.py): every rank runs where the launcher may.
    for r in range(np):
        assert reports[r]["cpus"] == sorted(os.sched_getaffinity(0))


@needs_single_process
@pytest.mark.timeout(120)
def test_binding_args_none_leaves_gloo_ranks_unpinned(tmp_path):
    launcher = _start(tmp_path, ["-np", "2", "--binding-args=--bind-to none"])
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 0, (out, err)
    reports = _reports(tmp_path, 2)
    assert [reports[r]["cpus"] for r in range(2)] == [sorted(os.sched_getaffinity(0))] * 2


@needs_single_process
@pytest.mark.timeout(120)
def test_binding_args_core_pins_gloo_ranks_to_their_share(tmp_path):
    launcher = _start(tmp_path, ["-np", "2", "--binding-args=--bind-to core"])
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 0, (out, err)
    reports = _reports(tmp_path, 2)
    cores = binding.local_cores()
    share = len(cores) // 2
    for r in range(2):
        expected = (sorted(c for core in cores[r * share:(r + 1) * share] for c in core)
                    if share else sorted(os.sched_getaffinity(0)))
        assert reports[r]["cpus"] == expected


@needs_single_process
@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 3])
def test_failing_rank_ends_the_job_with_its_code(tmp_path, np):
    failing = np - 1
    codes = {str(r): "sleep" for r in range(np)}
    codes[str(failing)] = [7 + np, "after all"]
    launcher = _start(tmp_path, ["-np", str(np)], codes)
    reports = _wait_for_reports(tmp_path, np, launcher)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 7 + np, (out, err)
    assert (f"horovodrun: rank {failing} on localhost exited with code {7 + np}; "
            f"terminating the other ranks") in err
    deadline = time.monotonic() + 15
    pids = [reports[r]["pid"] for r in range(np)]
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]


@needs_single_process
@pytest.mark.timeout(120)
def test_first_failure_code_wins(tmp_path):
    # Rank 0 fails first; rank 1 is then terminated (SIGTERM, code 143): 5 is reported.
    launcher = _start(tmp_path, ["-np", "2"], {"0": 5, "1": "sleep"})
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 5, (out, err)


@needs_single_process
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_reach_every_rank(tmp_path, signum):
    launcher = _start(tmp_path, ["-np", "2"], {"0": "sleep", "1": "sleep"})
    try:
        reports = _wait_for_reports(tmp_path, 2, launcher)
        launcher.send_signal(signum)
        out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 128 + signum, (out, err)
        deadline = time.monotonic() + 15
        pids = [reports[r]["pid"] for r in range(2)]
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()


def _fake_remote_shell(tmp_path):
    """A stand-in for ssh: '<shell> HOST CMD' runs CMD here, in a session of its own and with
    an empty environment (what a fresh remote login sees), and logs HOST."""
    path = tmp_path / "fake-rsh"
    log = tmp_path / "rsh.log"
    path.write_text("#!/bin/sh\n"
                    f"echo \"$1\" >> {shlex.quote(str(log))}\n"
                    "exec setsid -w env -i sh -c \"$2\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path), log


@needs_single_process
@pytest.mark.timeout(120)
def test_remote_ranks_through_a_remote_shell(tmp_path):
    shell, log = _fake_remote_shell(tmp_path)
    hosts = [("remote-a.invalid", 2), ("remote-b.invalid", 1)]
    launcher = _start(tmp_path, ["-np", "3", "-H", "remote-a.invalid:2,remote-b.invalid:1",
                                 "--remote-shell", shell, "--network-interface", "lo"])
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 0, (out, err)
    reports = _reports(tmp_path, 3)
    _check_identity(reports, hosts, 3, output=out + err)
    # Remote ranks get the secret on their standard input, never on the remote command line.
    assert reports[0]["env"]["HOROVOD_SECRET_KEY"] not in log.read_text()
    for r in range(3):
        env = reports[r]["env"]
        assert env["HOROVOD_GLOO_IFACE"] == "lo"
        assert reports[r]["cwd"] == str(tmp_path)
        assert f"[{r}]<stdout>:line from rank {r}\n" in out
    assert sorted(log.read_text().split()) == sorted(
        ["remote-a.invalid", "remote-a.invalid", "remote-b.invalid"])


@needs_single_process
@pytest.mark.timeout(120)
def test_remote_rank_is_ended_when_the_job_fails(tmp_path):
    """The remote rank runs in a session of its own (signals to the remote shell's process
    group do not reach it): closing its standard input must end it."""
    shell, _ = _fake_remote_shell(tmp_path)
    launcher = _start(tmp_path, ["-np", "2", "-H", "localhost:1,remote.invalid:1",
                                 "--remote-shell", shell, "--network-interface", "lo"],
                      {"0": [9, "after all"], "1": "sleep"})
    reports = _wait_for_reports(tmp_path, 2, launcher)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 9, (out, err)
    deadline = time.monotonic() + 15
    pid = reports[1]["pid"]
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


@needs_single_process
@pytest.mark.timeout(120)
def test_output_filename_keeps_each_ranks_output(tmp_path):
    logs = tmp_path / "logs"
    launcher = _start(tmp_path, ["-np", "2", "--output-filename", str(logs)])
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 0, (out, err)
    for r in range(2):
        assert (logs / f"rank.{r}" / "stdout").read_text() == f"line from rank {r}\n"
        assert (logs / f"rank.{r}" / "stderr").read_text() == f"error line from rank {r}\n"
