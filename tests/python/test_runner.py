"""horovodrun: flag translation, and end-to-end jobs at np=2 (run only from a size-1 test
process, so the nested mpirun does not inherit an MPI job's environment)."""

import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

import horovod_compat.tensorflow as hvd
from horovod_compat.runner import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_single_process = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="end-to-end launcher tests run from the test process started without mpirun")


def _args(*argv):
    return launch.make_parser().parse_args(list(argv))


def test_flags_to_environment():
    args = _args("-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
                 "--cache-capacity", "512", "--timeline-filename", "/tmp/t.json",
                 "--timeline-mark-cycles", "--autotune", "--stall-check-warning-time-seconds",
                 "30", "--stall-check-shutdown-time-seconds", "90", "--log-level", "DEBUG",
                 "--start-timeout", "40", "python", "train.py", "--epochs", "3")
    env = launch.runtime_env(args)
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert float(env["HOROVOD_CYCLE_TIME"]) == 2.5
    assert env["HOROVOD_CACHE_CAPACITY"] == "512"
    assert env["HOROVOD_TIMELINE"] == "/tmp/t.json"
    assert env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
    assert env["HOROVOD_AUTOTUNE"] == "1"
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "30"
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "90"
    assert env["HOROVOD_LOG_LEVEL"] == "DEBUG"
    assert env["HOROVOD_START_TIMEOUT"] == "40"
    assert args.command == ["python", "train.py", "--epochs", "3"]
    assert launch.runtime_env(_args("--no-stall-check", "x"))["HOROVOD_STALL_CHECK_DISABLE"] == "1"


def test_mpirun_command_line(tmp_path):
    args = _args("-np", "6", "-H", "a:2,b:2", "--mpi-args=--mca btl tcp,self", "python", "t.py")
    cmd = launch.build_mpirun_command(args, {"HOROVOD_CYCLE_TIME": "1"}, args.command)
    assert cmd[1:3] == ["-np", "6"]
    assert cmd[cmd.index("-H") + 1] == "a:2,b:2"
    assert "--oversubscribe" in cmd          # 6 ranks > 4 slots
    assert cmd[cmd.index("HOROVOD_CYCLE_TIME") - 1] == "-x"
    assert cmd[-5:] == ["--mca", "btl", "tcp,self", "python", "t.py"]
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)

    hostfile = tmp_path / "hosts"
    hostfile.write_text("# comment\nnode1 slots=4\nnode2 slots=4\n")
    args = _args("-np", "8", "--hostfile", str(hostfile), "python", "t.py")
    cmd = launch.build_mpirun_command(args, {}, args.command)
    assert cmd[cmd.index("--hostfile") + 1] == str(hostfile)
    assert "--oversubscribe" not in cmd
    assert launch.parse_hostfile(str(hostfile)) == [("node1", 4), ("node2", 4)]


def _fake_cores(monkeypatch, n):
    monkeypatch.setattr(launch.binding, "local_cores", lambda: [[c] for c in range(n)])


YIELD = ["--mca", "mpi_yield_when_idle", "1"]


def _placement(cmd):
    """The flags between the host/oversubscribe part and the -x list."""
    i = 3  # mpirun -np N
    while cmd[i] in ("--allow-run-as-root", "--oversubscribe", "-H", "--hostfile"):
        i += 2 if cmd[i] in ("-H", "--hostfile") else 1
    end = cmd.index("-x") if "-x" in cmd else len(cmd)
    return cmd[i:end]


@pytest.mark.parametrize("np_,cores,expected", [
    # Unbound whatever the core count (measured best: binding.py's docstring); yield always.
    (2, 2, ["--bind-to", "none", "--map-by", "slot"] + YIELD),
    (2, 8, ["--bind-to", "none", "--map-by", "slot"] + YIELD),
    (3, 2, ["--bind-to", "none", "--map-by", "slot"] + YIELD),
    (1, 1, ["--bind-to", "none", "--map-by", "slot"] + YIELD),
])
def test_mpirun_leaves_local_ranks_unbound_and_yielding(monkeypatch, np_, cores, expected):
    _fake_cores(monkeypatch, cores)
    for name in list(os.environ):
        if name.startswith("OMPI_MCA_") or name.startswith("HOROVOD_"):
            monkeypatch.delenv(name)
    args = _args("-np", str(np_), "python", "t.py")
    cmd = launch.build_mpirun_command(args, {}, args.command)
    assert _placement(cmd) == expected
    assert "--oversubscribe" in cmd


def test_mpirun_leaves_ranks_on_other_hosts_unbound(monkeypatch):
    _fake_cores(monkeypatch, 64)
    # Under mpirun --bind-to none (the np=3 run) Open MPI's own placement variables are in the
    # environment, and those win over ours: this test is about horovodrun's default.
    for name in list(os.environ):
        if name.startswith("OMPI_MCA_") or name.startswith("HOROVOD_"):
            monkeypatch.delenv(name)
    args = _args("-np", "4", "-H", "node-a.invalid:2,node-b.invalid:2", "python", "t.py")
    cmd = launch.build_mpirun_command(args, {}, args.command)
    assert _placement(cmd) == ["--bind-to", "none", "--map-by", "slot"] + YIELD


@pytest.mark.parametrize("flags,env,expected", [
    # --binding-args replaces ours as given; the yield stays.
    (["--binding-args=-bind-to socket -map-by socket"], {},
     ["-bind-to", "socket", "-map-by", "socket"] + YIELD),
    # Placement in --mpi-args: ours is left out (theirs comes after, with the other mpi args).
    (["--mpi-args=--bind-to none"], {}, YIELD),
    (["--mpi-args=--map-by=node"], {}, YIELD),
    (["--mpi-args=--mca hwloc_base_binding_policy none"], {}, YIELD),
    (["--mpi-args=--mca mpi_yield_when_idle 0"], {}, ["--bind-to", "none", "--map-by", "slot"]),
    # Open MPI's variables in the environment would lose to our flags: we add none.
    ([], {"OMPI_MCA_mpi_yield_when_idle": "0"}, ["--bind-to", "none", "--map-by", "slot"]),
    ([], {"OMPI_MCA_hwloc_base_binding_policy": "none"}, YIELD),
])
def test_what_the_user_passes_wins(monkeypatch, flags, env, expected):
    _fake_cores(monkeypatch, 2)
    for name in list(os.environ):
        if name.startswith("OMPI_MCA_") or name.startswith("HOROVOD_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = _args("-np", "2", *flags, "python", "t.py")
    cmd = launch.build_mpirun_command(args, {}, args.command)
    user = shlex.split(args.mpi_args)
    assert cmd[-2 - len(user):] == user + ["python", "t.py"]
    assert _placement(cmd[:len(cmd) - 2 - len(user)]) == expected


def test_local_cores_groups_hardware_threads(tmp_path):
    # Two packages, two cores each, two hardware threads per core (siblings 4 apart).
    for cpu in range(8):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{cpu // 2 % 2}\n")
        (topology / "core_id").write_text(f"{cpu % 2}\n")
    cores = launch.binding.local_cores(range(8), str(tmp_path))
    assert cores == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert launch.binding.local_cores([1, 2, 5], str(tmp_path)) == [[1, 5], [2]]
    # Without topology every CPU counts as a core.
    assert launch.binding.local_cores([3, 1], str(tmp_path / "none")) == [[1], [3]]


def test_gloo_affinities():
    aff = launch.binding.gloo_affinities
    cores = [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert aff(2, None, cores) == [None, None]  # the default: not pinned
    assert aff(3, "--bind-to core", cores) == [[0, 4], [1, 5], [2, 6]]
    assert aff(5, "--bind-to core", cores) == [None] * 5  # more ranks than cores
    assert aff(2, "--bind-to core", cores) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert aff(2, "--bind-to none --map-by slot", cores) == [None, None]
    with pytest.raises(ValueError, match="only '--bind-to none' or '--bind-to core'"):
        aff(2, "--bind-to socket", cores)


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_", "HOROVOD_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def _horovodrun(tmp_path, script, *flags, timeout=240):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
           "--mpi-args=--timeout 200", *flags, sys.executable, str(path)]
    return subprocess.run(cmd, env=_clean_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


@needs_single_process
def test_horovodrun_np2_end_to_end(tmp_path):
    result = _horovodrun(tmp_path, """
        import os
        import horovod_compat.tensorflow as hvd
        import tensorflow as tf
        hvd.init()
        total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum).numpy()
        print(f"RESULT rank={hvd.rank()} size={hvd.size()} total={total} "
              f"fusion={os.environ['HOROVOD_FUSION_THRESHOLD']} "
              f"cycle={os.environ['HOROVOD_CYCLE_TIME']}", flush=True)
        """, "--fusion-threshold-mb", "1", "--cycle-time-ms", "3", "--verbose")
    assert result.returncode == 0, result.stdout
    lines = sorted(x.strip() for x in re.findall(r"RESULT [^\n]*?(?=RESULT |$)", result.stdout, re.M))
    assert lines == [f"RESULT rank={r} size=2 total=3.0 fusion=1048576 cycle=3.0"
                     for r in range(2)], result.stdout
    assert "horovodrun: " in result.stdout and "mpirun" in result.stdout


@needs_single_process
def test_horovodrun_failing_rank_fails_the_job(tmp_path):
    result = _horovodrun(tmp_path, """
        import sys, time
        import horovod_compat.tensorflow as hvd
        import tensorflow as tf
        hvd.init()
        if hvd.rank() == 1:
            sys.exit(7)
        # Rank 1's exit shuts the runtime down, so this allreduce fails on rank 0; rank 0 then
        # hangs on purpose: the launcher must take the job down and report rank 1's exit code.
        try:
            hvd.allreduce(tf.constant(1.0))
        except Exception as error:  # noqa: BLE001 - any failure is fine here
            print("rank 0 saw:", type(error).__name__, flush=True)
        time.sleep(300)
        """)
    assert result.returncode != 0, result.stdout
    assert result.returncode == 7, result.stdout
    assert "rank 1 failed with exit code 7" in result.stdout, result.stdout


def test_check_build_lists_frameworks(capsys):
    assert launch.run_commandline(["--check-build"]) == 0
    out = capsys.readouterr().out
    assert "[X] TensorFlow" in out and "[X] MPI" in out
    assert out.count("[X] Gloo") == (2 if hvd.gloo_built() else 0), out
    assert hvd.is_initialized()


def test_alias_is_added_to_python_commands():
    from horovod_compat import alias
    assert launch.with_alias(["python3", "train.py", "-x"]) == \
        ["python3", "-c", alias.BOOTSTRAP, "train.py", "-x"]
    assert launch.with_alias(["/v/bin/python", "-m", "pkg.train"]) == \
        ["/v/bin/python", "-c", alias.BOOTSTRAP, "-m", "pkg.train"]
    aliased = ["python3", "-c", alias.BOOTSTRAP, "train.py"]
    assert launch.with_alias(aliased) == aliased
    assert launch.with_alias(["python", "-c", "print(1)"]) == ["python", "-c", "print(1)"]
    assert launch.with_alias(["./train.sh", "a"]) == ["./train.sh", "a"]


# -- horovod_compat.run (horovod.run) -------------------------------------------------------

def test_run_is_reachable_as_horovod_run():
    import horovod_compat
    from horovod_compat import alias
    from horovod_compat.runner import run
    assert horovod_compat.run is run
    alias.install()
    try:
        import horovod
        assert horovod.run is run
    finally:
        alias.uninstall()


@needs_single_process
@pytest.mark.timeout(240)
def test_run_function_on_two_ranks():
    import horovod_compat

    def allreduce_rank(scale):
        import tensorflow as tf
        import horovod_compat.tensorflow as hvd
        hvd.init()
        total = hvd.allreduce(tf.constant((hvd.rank() + 1) * scale), op=hvd.Sum)
        return hvd.rank(), float(total.numpy())

    results = horovod_compat.run(allreduce_rank, args=(2.5,), np=2, mpi_args="--timeout 200")
    # sum over ranks r of (r + 1) * 2.5 = 2.5 * 3
    assert results == [(0, 7.5), (1, 7.5)]


@needs_single_process
@pytest.mark.timeout(180)
def test_run_function_failure_names_the_rank():
    import horovod_compat

    def fails_on_rank_one(limit):
        import os
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        if rank == 1:
            raise ValueError(f"rank {rank} is above {limit}")
        return rank

    with pytest.raises(RuntimeError) as info:
        horovod_compat.run(fails_on_rank_one, kwargs={"limit": 0}, np=2,
                           mpi_args="--timeout 150")
    message = str(info.value)
    assert "rank 1 failed" in message and "rank 0 failed" not in message, message
    assert "ValueError: rank 1 is above 0" in message and "Traceback" in message, message


# -- signals and uncaught exceptions under horovodrun ---------------------------------------

def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its parent's wait() has finished running.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@needs_single_process
@pytest.mark.timeout(180)
@pytest.mark.parametrize("target", ["launcher", "process_group"])
def test_horovodrun_forwards_sigterm(tmp_path, target):
    """SIGTERM to the launcher alone, or to its whole process group (``timeout``, batch
    schedulers): either way the job ends promptly and no rank survives."""
    import signal
    import time
    script = tmp_path / "sleeper.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        rank = os.environ["OMPI_COMM_WORLD_RANK"]
        with open(os.path.join({str(tmp_path)!r}, "pid-" + rank), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(150)
        """))
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
           "--mpi-args=--timeout 160", sys.executable, str(script)]
    launcher = subprocess.Popen(cmd, env=_clean_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        pid_files = [tmp_path / f"pid-{r}" for r in range(2)]
        while not all(p.exists() and p.read_text() for p in pid_files):
            assert launcher.poll() is None, launcher.communicate()[0]
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in pid_files]
        started = time.monotonic()
        if target == "launcher":
            launcher.send_signal(signal.SIGTERM)
        else:
            os.killpg(launcher.pid, signal.SIGTERM)
        output = launcher.communicate(timeout=30)[0]
        assert time.monotonic() - started < 30
        assert launcher.returncode != 0, output
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in pids if _alive(pid)], output
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@needs_single_process
@pytest.mark.timeout(180)
def test_uncaught_exception_under_alias_fails_the_job(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(textwrap.dedent("""
        import os, time
        import horovod  # through the alias
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            raise RuntimeError("uncaught on rank 1 of horovod " + horovod.__version__)
        time.sleep(150)   # rank 0 waits: the launcher must take it down
        """))
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
           "--mpi-args=--timeout 160", sys.executable, "-m", "horovod_compat.alias",
           str(script)]
    result = subprocess.run(cmd, env=_clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=170)
    assert result.returncode == 1, result.stdout
    assert "Traceback (most recent call last)" in result.stdout, result.stdout
    assert "RuntimeError: uncaught on rank 1 of horovod 0.28.1" in result.stdout, result.stdout
    assert "rank 1 failed with exit code 1" in result.stdout, result.stdout


# Prints sys.path before anything else, then where horovod_compat came from.
# Each line in one write: with PYTHONUNBUFFERED set, print() writes the text and its newline
# separately, and mpirun then once forwarded two ranks' lines run together ("...]SYSPATH [...").
SYS_PATH_SCRIPT = """
    import json, sys
    sys.stdout.write("SYSPATH " + json.dumps(sys.path) + "\\n")
    sys.stdout.flush()
    import horovod_compat
    import horovod
    sys.stdout.write("PACKAGE " + horovod_compat.__file__ + "\\n")
    sys.stdout.flush()
"""


@needs_single_process
@pytest.mark.timeout(200)
@pytest.mark.parametrize("transport", ["mpi", "gloo"])
def test_command_runs_with_the_sys_path_python_would_give_it(tmp_path, transport):
    """horovodrun python train.py from a folder holding horovod_compat/ and horovod/ packages (a
    source checkout, say): the ranks get the sys.path `python train.py` gets, so neither shadows
    the installed package."""
    if transport == "gloo" and not hvd.gloo_built():
        pytest.skip("the core is built without the TCP transport")
    cwd = tmp_path / "checkout"
    for name in ("horovod_compat", "horovod"):
        (cwd / name).mkdir(parents=True)
        (cwd / name / "__init__.py").write_text("raise ImportError('the shadowing copy')\n")
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(SYS_PATH_SCRIPT))
    env = _clean_env()
    alone = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    expected = re.findall(r"^SYSPATH (.*)$", alone.stdout, re.M)
    assert len(expected) == 1, alone.stdout
    # The console script, as a user runs it (python -m would itself import the shadowing copy).
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(horovodrun):
        pytest.skip(f"no {horovodrun} console script in this environment")
    cmd = [horovodrun, f"--{transport}", "-np", "2", "--mpi-args=--timeout 150",
           sys.executable, str(script)]
    result = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=180)
    assert result.returncode == 0, result.stdout
    assert re.findall(r"SYSPATH (.*)$", result.stdout, re.M) == expected * 2, \
        (expected, result.stdout)
    packages = re.findall(r"PACKAGE (.*)$", result.stdout, re.M)
    assert packages == [horovod_compat_file()] * 2, result.stdout


def horovod_compat_file() -> str:
    import horovod_compat
    return horovod_compat.__file__
