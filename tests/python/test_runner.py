"""horovodrun: flag translation, and end-to-end jobs at np=2 (run only from a size-1 test
process, so the nested mpirun does not inherit an MPI job's environment)."""

import os
import re
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
    assert hvd.is_initialized()


def test_alias_is_added_to_python_commands():
    assert launch.with_alias(["python3", "train.py", "-x"]) == \
        ["python3", "-m", "horovod_compat.alias", "train.py", "-x"]
    assert launch.with_alias(["/v/bin/python", "-m", "pkg.train"]) == \
        ["/v/bin/python", "-m", "horovod_compat.alias", "-m", "pkg.train"]
    assert launch.with_alias(["python", "-c", "print(1)"]) == ["python", "-c", "print(1)"]
    assert launch.with_alias(["./train.sh", "a"]) == ["./train.sh", "a"]
