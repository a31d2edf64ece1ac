"""Launcher helper modules that Horovod-era code imports (``horovod.runner.common.util``,
``horovod.runner.util``) and ``_basics._get_process_set_ids_and_ranks``."""

import io
import os
import subprocess
import sys
import threading
import time

import pytest

import horovod_compat.tensorflow as hvd
from horovod_compat import alias
from horovod_compat.runner.common.util import (codec, env, hosts, safe_shell_exec, secret,
                                               timeout, tiny_shell_exec)
from horovod_compat.runner.util import threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_LAUNCHER_VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK",
                       "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                       "SLURM_STEP_NUM_TASKS")

HELPER_MODULES = ["runner.common.util.env", "runner.common.util.secret",
                  "runner.common.util.codec", "runner.common.util.timeout",
                  "runner.common.util.hosts", "runner.common.util.tiny_shell_exec",
                  "runner.common.util.safe_shell_exec", "runner.util.threads", "runner",
                  "common.exceptions", "common.util"]


def _subprocess_env():
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_"))}
    environ["PYTHONPATH"] = ROOT + os.pathsep + environ.get("PYTHONPATH", "")
    return environ


@pytest.mark.parametrize("prefix", ["horovod_compat", "horovod"])
def test_helpers_import_without_tensorflow(prefix):
    imports = "; ".join(f"import {prefix}.{m}" for m in HELPER_MODULES)
    code = ("import sys; from horovod_compat import alias; alias.install(); "
            f"{imports}; "
            "from horovod.runner.common.util.env import get_env_rank_and_size; "
            "from horovod.runner.util.threads import in_thread; "
            "import horovod_compat.runner.util.threads as t; "
            "assert sys.modules['horovod.runner.util.threads'] is t; "
            "print('TF', 'tensorflow' in sys.modules, 'KERAS', 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=_subprocess_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout
    assert out.stdout.strip().endswith("TF False KERAS False"), out.stdout


def _clear_launcher(monkeypatch):
    for name in _LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_env_rank_and_size_matches_the_runtime():
    # Under mpirun this reads Open MPI's variables; alone, no launcher means (0, 1).
    assert env.get_env_rank_and_size() == (hvd.rank(), hvd.size())


@pytest.mark.parametrize("rank_name,size_name", [
    ("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")])
def test_env_rank_and_size_per_launcher(monkeypatch, rank_name, size_name):
    _clear_launcher(monkeypatch)
    assert env.get_env_rank_and_size() == (0, 1)
    assert env.env_rank_and_size() is None
    rank, size = 3, 5
    monkeypatch.setenv(rank_name, str(rank))
    monkeypatch.setenv(size_name, str(size))
    assert env.get_env_rank_and_size() == (rank, size)
    assert env.env_rank_and_size() == (rank, size)
    monkeypatch.delenv(size_name)
    if rank_name == "SLURM_PROCID":  # an allocation outside an srun step is no launcher
        assert env.get_env_rank_and_size() == (0, 1)
    else:
        with pytest.raises(RuntimeError, match=size_name):
            env.get_env_rank_and_size()


def test_env_rank_and_size_precedence(monkeypatch):
    _clear_launcher(monkeypatch)
    pairs = [("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
             ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")]
    for i, (rank_name, size_name) in enumerate(pairs):
        monkeypatch.setenv(rank_name, str(i))
        monkeypatch.setenv(size_name, str(10 + i))
    for i, (rank_name, size_name) in enumerate(pairs):
        assert env.get_env_rank_and_size() == (i, 10 + i)
        monkeypatch.delenv(rank_name)
        monkeypatch.delenv(size_name)
    monkeypatch.setenv("PMI_RANK", "x")
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(RuntimeError, match="PMI_RANK"):
        env.get_env_rank_and_size()


def test_env_exportable_and_kubeflow(monkeypatch):
    assert env.is_exportable("PATH")
    assert not env.is_exportable(secret.HOROVOD_SECRET_KEY)
    assert not env.is_exportable("BASH_FUNC_module%%")
    assert env.LOG_LEVEL_STR[0] == "FATAL" and env.LOG_LEVEL_STR[-1] == "TRACE"
    monkeypatch.setenv("OMPI_MCA_plm_rsh_agent", env.KUBEFLOW_MPI_EXEC)
    assert env.is_kubeflow_mpi()
    monkeypatch.setenv("OMPI_MCA_plm_rsh_agent", "ssh")
    assert not env.is_kubeflow_mpi()


def test_in_thread_runs_target_and_returns_the_thread():
    seen = []
    done = threading.Event()

    def target(a, b):
        seen.append((a, b, threading.current_thread().name))
        done.set()

    thread = threads.in_thread(target, args=(1, 2), name="helper-thread")
    assert isinstance(thread, threading.Thread) and thread.daemon
    thread.join(timeout=30)
    assert done.is_set() and seen == [(1, 2, "helper-thread")]
    assert not threads.in_thread(lambda: None, daemon=False).daemon
    with pytest.raises(ValueError):
        threads.in_thread(target, args=1)


def test_in_thread_silent_swallows_errors(monkeypatch):
    reported = []
    monkeypatch.setattr(threading, "excepthook", lambda hook_args: reported.append(
        type(hook_args.exc_value)))

    def fail():
        raise KeyError("boom")

    threads.in_thread(fail, silent=True).join(timeout=30)
    assert reported == []
    threads.in_thread(fail).join(timeout=30)
    assert reported == [KeyError]


def test_on_event_calls_once_set_unless_stopped():
    event, stop = threading.Event(), threading.Event()
    calls = []
    thread = threads.on_event(event, calls.append, args=("fired",), stop=stop,
                              check_stop_interval_s=0.01)
    event.set()
    thread.join(timeout=30)
    assert calls == ["fired"]
    event2 = threading.Event()
    thread = threads.on_event(event2, calls.append, args=("never",), stop=stop,
                              check_stop_interval_s=0.01)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and calls == ["fired"]


def test_execute_function_multithreaded():
    args_list = [(i, i + 1) for i in range(7)]
    result = threads.execute_function_multithreaded(lambda a, b: a * b, args_list,
                                                    max_concurrent_executions=3)
    assert result == {i: a * b for i, (a, b) in enumerate(args_list)}

    def fail_on_three(i):
        if i == 3:
            raise ValueError(f"index {i}")
        return i

    with pytest.raises(ValueError, match="index 3"):
        threads.execute_function_multithreaded(fail_on_three, [(i,) for i in range(5)])
    assert threads.execute_function_multithreaded(lambda: 1, [], True) == {}


def test_secret_and_codec_round_trip():
    key = secret.make_secret_key()
    assert len(key) == secret.SECRET_LENGTH and key != secret.make_secret_key()
    digest = secret.compute_digest(key, b"message")
    assert len(digest) == secret.DIGEST_LENGTH
    assert secret.check_digest(key, b"message", digest)
    assert not secret.check_digest(key, b"messagE", digest)
    value = {"a": [1, 2.5, "x"], "f": (lambda x: x + 1)}
    text = codec.dumps_base64(value)
    assert isinstance(text, str) and text.isascii()
    back = codec.loads_base64(text)
    assert back["a"] == value["a"] and back["f"](41) == 42
    raw = codec.dumps_base64([1, 2], to_ascii=False)
    assert isinstance(raw, bytes) and codec.loads_base64(raw) == [1, 2]


def test_timeout():
    deadline = timeout.Timeout(3600, message="Timed out waiting for {activity}")
    assert not deadline.timed_out() and 0 < deadline.remaining() <= 3600
    deadline.check_time_out_for("nothing")
    past = timeout.Timeout(-1, message="Timed out waiting for {activity}")
    assert past.timed_out() and past.remaining() == 0
    with pytest.raises(timeout.TimeoutException, match="waiting for the workers. Timeout"):
        past.check_time_out_for("the workers")


def test_hosts_parsing_and_assignment(tmp_path):
    infos = hosts.parse_hosts("a:2,b.example:3,c-1:1")
    assert [(h.hostname, h.slots) for h in infos] == [("a", 2), ("b.example", 3), ("c-1", 1)]
    with pytest.raises(ValueError):
        hosts.parse_hosts("a:2,b")
    assert hosts.parse_hosts_and_slots("a:2,b:1") == (["a", "b"], {"a": 2, "b": 1})
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# cluster\na slots=2\n\nb slots=3\nc\n")
    assert hosts.parse_host_files(str(hostfile)) == "a:2,b:3,c:1"

    slots = hosts.get_host_assignments(infos, min_np=1)
    size = sum(h.slots for h in infos)
    assert [s.rank for s in slots] == list(range(size))
    assert all(s.size == size for s in slots)
    for s in slots:
        on_host = [t for t in slots if t.hostname == s.hostname]
        assert s.local_size == len(on_host)
        assert s.local_rank == on_host.index(s)
        same_local = [t for t in slots if t.local_rank == s.local_rank]
        assert s.cross_size == len(same_local) and s.cross_rank == same_local.index(s)
    assert slots[3].to_response_string() == ",".join(
        str(v) for v in (3, size, slots[3].local_rank, slots[3].local_size,
                         slots[3].cross_rank, slots[3].cross_size))
    capped = hosts.get_host_assignments(infos, min_np=1, max_np=3)
    assert [(s.hostname, s.rank) for s in capped] == [("a", 0), ("a", 1), ("b.example", 2)]
    with pytest.raises(ValueError, match="available slots"):
        hosts.get_host_assignments(infos, min_np=size + 1)
    assert hosts.INVALID_SLOT_INFO.rank == -1


def test_tiny_shell_exec():
    output, code = tiny_shell_exec.execute("echo out; echo err 1>&2; exit 3")
    assert code == 3 and "out" in output and "err" in output
    output, code = tiny_shell_exec.execute("echo $HVDC_X", env=dict(os.environ, HVDC_X="42"))
    assert (output.strip(), code) == ("42", 0)


def test_safe_shell_exec_prefixes_and_exit_code():
    out, err = io.StringIO(), io.StringIO()
    code = safe_shell_exec.execute("echo one; echo two 1>&2; exit 4", stdout=out, stderr=err,
                                   index=2)
    assert code == 4
    assert out.getvalue() == "[2]<stdout>:one\n"
    assert err.getvalue() == "[2]<stderr>:two\n"
    out = io.StringIO()
    assert safe_shell_exec.execute("echo plain", stdout=out) == 0
    assert out.getvalue() == "plain\n"
    out = io.StringIO()
    safe_shell_exec.execute("echo t", stdout=out, index=0, prefix_output_with_timestamp=True)
    assert out.getvalue().endswith("[0]<stdout>:t\n") and out.getvalue()[0].isalpha()


def test_safe_shell_exec_stops_the_group_on_event():
    event = threading.Event()
    threads.in_thread(lambda: (time.sleep(0.2), event.set()))
    out = io.StringIO()
    # The command would run for ten minutes; the event ends it and its child.
    code = safe_shell_exec.execute("sleep 600 & wait", stdout=out, events=[event])
    assert code != 0 and event.is_set()


def test_process_set_ids_and_ranks_through_the_alias():
    alias.install()
    try:
        from horovod.tensorflow.mpi_ops import _basics
        import horovod.tensorflow as hvd_alias
        assert hvd_alias is hvd
        before = _basics._get_process_set_ids_and_ranks()
        assert before[0] == list(range(hvd.size()))
        if hvd.size() == 1:
            return  # the only possible set is the global one
        odd_first = list(range(hvd.size() - 1, -1, -2))  # given unsorted on purpose
        ps = hvd.add_process_set(odd_first)
        try:
            after = _basics._get_process_set_ids_and_ranks()
            expected = dict(before)
            expected[ps.process_set_id] = sorted(odd_first)
            assert after == expected
        finally:
            hvd.remove_process_set(ps)
        assert _basics._get_process_set_ids_and_ranks() == before
    finally:
        alias.uninstall()
