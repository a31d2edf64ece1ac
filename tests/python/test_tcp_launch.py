"""End to end over the TCP transport: TensorFlow jobs started by ``horovodrun --gloo``, by
``horovod_compat.run(use_gloo=True)`` and by hand with ``TF_CONFIG``.

Skipped when the core has no ``gloo_built()`` (built before the TCP transport); run from a
size-1 test process only, so the jobs do not inherit an MPI job's environment.
"""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from horovod_compat import _core
from horovod_compat.runner import gloo_launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")

pytestmark = [
    pytest.mark.skipif(not hasattr(_core, "gloo_built"),
                       reason="the core has no TCP transport (_core.gloo_built is missing)"),
    pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ,
                       reason="TCP jobs are started from the test process run without mpirun"),
]

# Each rank runs a few collectives and writes what it saw to <dir>/rank-<r>.json.
_JOB = """
    import json, os, sys
    import tensorflow as tf
    import horovod_compat.tensorflow as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    total = hvd.allreduce(tf.constant([float(r + 1)] * 3), op=hvd.Sum).numpy().tolist()
    gathered = hvd.allgather(tf.constant([r] * (r + 1), dtype=tf.int32)).numpy().tolist()
    root_value = hvd.broadcast(tf.constant(float(10 * r + 5)), root_rank=n - 1).numpy().item()
    report = {"rank": r, "size": n, "local_rank": hvd.local_rank(),
              "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
              "cross_size": hvd.cross_size(), "gloo_enabled": hvd.gloo_enabled(),
              "mpi_enabled": hvd.mpi_enabled(), "total": total, "gathered": gathered,
              "root_value": root_value}
    with open(os.path.join(sys.argv[1], f"rank-{r}.json"), "w") as f:
        json.dump(report, f)
    print("RESULT", json.dumps(report), flush=True)
    if len(sys.argv) > 2 and r == int(sys.argv[2]):
        sys.exit(3)   # this rank fails; the others wait in a collective it never joins
    hvd.allreduce(tf.constant(1.0), name="after")
"""


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_", "HOROVOD_", "HVDC_"))
           and k != "TF_CONFIG"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def _job_script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(_JOB))
    return str(path)


def _expected(size, slots=None):
    """What every rank must report: computed from the inputs of _JOB."""
    total = [float(sum(r + 1 for r in range(size)))] * 3
    gathered = [r for r in range(size) for _ in range(r + 1)]
    reports = {}
    for r in range(size):
        report = {"rank": r, "size": size, "gloo_enabled": True, "mpi_enabled": False,
                  "total": total, "gathered": gathered, "root_value": float(10 * (size - 1) + 5)}
        if slots is not None:
            s = slots[r]
            report.update(local_rank=s.local_rank, local_size=s.local_size,
                          cross_rank=s.cross_rank, cross_size=s.cross_size)
        reports[r] = report
    return reports


def _read_reports(tmp_path, size):
    reports = {}
    for r in range(size):
        with open(tmp_path / f"rank-{r}.json") as f:
            reports[r] = json.load(f)
    return reports


def _check(reports, expected):
    for r, want in expected.items():
        got = {k: reports[r][k] for k in want}
        assert got == want, (r, reports[r])


def _horovodrun(tmp_path, np, *flags, args=(), timeout=280):
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "--gloo", "-np", str(np),
           "--gloo-timeout-seconds", "120", *flags, sys.executable, _job_script(tmp_path),
           str(tmp_path), *args]
    return subprocess.run(cmd, env=_env(), cwd=str(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("np,hosts", [(2, None), (3, "localhost:2,127.0.0.1:1")])
def test_horovodrun_gloo_collectives(tmp_path, np, hosts):
    flags = ["-H", hosts] if hosts else []
    result = _horovodrun(tmp_path, np, *flags)
    assert result.returncode == 0, result.stdout[-8000:]
    host_list = [(h, int(s)) for h, s in (x.split(":") for x in hosts.split(","))] \
        if hosts else [("localhost", np)]
    _check(_read_reports(tmp_path, np), _expected(np, gloo_launch.allocate(host_list, np)))
    for r in range(np):
        assert f"[{r}]<stdout>:RESULT " in result.stdout


@pytest.mark.timeout(300)
def test_horovodrun_gloo_failing_rank(tmp_path):
    result = _horovodrun(tmp_path, 2, args=("1",))
    assert result.returncode == 3, result.stdout[-8000:]
    assert "horovodrun: rank 1 on localhost exited with code 3" in result.stdout


@pytest.mark.timeout(300)
def test_run_function_with_use_gloo():
    import horovod_compat

    def allreduce_rank(scale):
        import tensorflow as tf
        import horovod_compat.tensorflow as hvd
        hvd.init()
        total = hvd.allreduce(tf.constant((hvd.rank() + 1) * scale), op=hvd.Sum)
        return hvd.rank(), hvd.gloo_enabled(), float(total.numpy())

    old = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.startswith(("OMPI_", "PMIX_", "HOROVOD_"))]:
            del os.environ[key]
        results = horovod_compat.run(allreduce_rank, args=(2.5,), np=2, use_gloo=True,
                                     start_timeout=120)
    finally:
        os.environ.clear()
        os.environ.update(old)
    total = sum((r + 1) * 2.5 for r in range(2))
    assert results == [(r, True, total) for r in range(2)]


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("with_chief", [False, True])
def test_tf_config_job_started_by_hand(tmp_path, with_chief):
    ports = _free_ports(2)
    addresses = [f"localhost:{p}" for p in ports]
    if with_chief:
        cluster = {"chief": addresses[:1], "worker": addresses[1:]}
        tasks = [("chief", 0), ("worker", 0)]
    else:
        cluster = {"worker": addresses}
        tasks = [("worker", 0), ("worker", 1)]
    script = _job_script(tmp_path)
    procs = []
    try:
        # Started in reverse rank order: the lower rank is not necessarily up first.
        for kind, index in reversed(tasks):
            env = _env()
            env["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                           "task": {"type": kind, "index": index}})
            env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = "120"
            procs.append(subprocess.Popen([sys.executable, script, str(tmp_path)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outputs = [p.communicate(timeout=240)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-4000:] for o in outputs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    expected = _expected(2)
    for r in range(2):   # both entries name one host
        expected[r].update(local_rank=r, local_size=2, cross_rank=0, cross_size=1)
    _check(_read_reports(tmp_path, 2), expected)


@pytest.mark.timeout(600)
def test_keras_strategy_from_tf_config_by_hand(tmp_path):
    """examples/keras_strategy.py (HorovodStrategy, model.fit) as two workers an orchestrator would
    start: nothing but TF_CONFIG, no launcher, no gRPC server; the TCP transport carries it."""
    addresses = [f"localhost:{p}" for p in _free_ports(2)]
    checkpoint = tmp_path / "strategy.weights.h5"
    procs = []
    try:
        for index in (1, 0):
            env = _env()
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses},
                                           "task": {"type": "worker", "index": index}})
            env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = "120"
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(EXAMPLES, "keras_strategy.py"), "--short",
                 "--checkpoint", str(checkpoint)],
                cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        outputs = [p.communicate(timeout=540)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    both = "\n".join(o[-6000:] for o in outputs)
    assert [p.returncode for p in procs] == [0, 0], both
    rank0 = outputs[1]   # started second: task index 0
    diff = re.findall(r"Max weight difference from rank 0: (\S+)", rank0)
    accuracy = re.findall(r"Test accuracy: ([\d.]+)", rank0)
    assert len(diff) == 1 and float(diff[0]) == 0.0, both
    assert len(accuracy) == 1 and float(accuracy[0]) > 0.6, both
    assert "Test accuracy" not in outputs[0], both   # only rank 0 reports
    assert checkpoint.exists()


@pytest.mark.timeout(600)
def test_example_under_horovodrun_gloo(tmp_path):
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "--gloo", "-np", "2",
           "--gloo-timeout-seconds", "120", sys.executable,
           os.path.join(EXAMPLES, "tf2_gradient_tape.py"), "--short"]
    result = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=540)
    out = result.stdout
    assert result.returncode == 0, out[-8000:]
    diff = re.findall(r"Max weight difference from rank 0: (\S+)", out)
    accuracy = re.findall(r"Test accuracy: ([\d.]+)", out)
    assert len(diff) == 1 and float(diff[0]) < 1e-5, out[-8000:]
    assert len(accuracy) == 1 and float(accuracy[0]) > 0.65, out[-8000:]


def _netns_cluster():
    """The pretend cluster's script when its hosts hvhost1 and hvhost2 are up, else None."""
    path = os.environ.get("HVDC_NETNS_CLUSTER") or os.path.join(
        os.path.dirname(ROOT), "shared", "tools", "netns-cluster")
    if not os.access(path, os.X_OK):
        return None
    try:
        hosts = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True,
                               timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return path if {"hvhost1", "hvhost2"} <= set(hosts) else None


@pytest.mark.timeout(300)
@pytest.mark.skipif(_netns_cluster() is None,
                    reason="the netns cluster is not up (netns-cluster up 2; set "
                           "HVDC_NETNS_CLUSTER to its script)")
def test_horovodrun_gloo_on_two_netns_hosts(tmp_path):
    """4 ranks on 2 hosts through the cluster's remote shell: real local and cross sizes."""
    hosts = [("hvhost1", 2), ("hvhost2", 2)]
    result = _horovodrun(tmp_path, 4, "-H", "hvhost1:2,hvhost2:2", "--remote-shell",
                         f"{_netns_cluster()} rsh")
    assert result.returncode == 0, result.stdout[-8000:]
    _check(_read_reports(tmp_path, 4), _expected(4, gloo_launch.allocate(hosts, 4)))


# -- only the job gets in ----------------------------------------------------------------------

_INIT_ONLY = """
    import sys
    from horovod_compat.common.basics import HorovodBasics
    try:
        HorovodBasics().init()
    except ValueError as error:
        print("INIT FAILED:", error, flush=True)
        sys.exit(4)
    print("INIT OK", flush=True)
"""


def _init_process(env_extra):
    env = _env()
    env.update(env_extra)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(_INIT_ONLY)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", [None, "not the job's secret"])
def test_rendezvous_refuses_a_rank_without_the_jobs_secret(capfd, key):
    """The core signs its rendezvous requests with HOROVOD_SECRET_KEY; the launcher's service
    (with the job's secret) refuses a rank without it, or with another, and init() says why."""
    from horovod_compat.runner.rendezvous import RendezvousServer
    service = RendezvousServer("the job's secret")
    host, port = service.start("127.0.0.1", 0)
    try:
        extra = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": host, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                 "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_CONTROLLER": "gloo",
                 "HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}
        if key is not None:
            extra["HOROVOD_SECRET_KEY"] = key
        proc = _init_process(extra)
        out, _ = proc.communicate(timeout=100)
        assert proc.returncode == 4, out
        assert "was refused (HTTP 403)" in out, out
        assert ("is not set" if key is None else "a different one") in out, out
        assert service.store.keys("global") == []
        assert "refused PUT /global/rank_0 from 127.0.0.1 (403)" in capfd.readouterr().err
    finally:
        service.stop()


@pytest.mark.timeout(120)
def test_signed_rank_registers_with_the_service():
    """The right secret: the C++ signature is what the Python service computes."""
    from horovod_compat.runner.rendezvous import RendezvousServer
    service = RendezvousServer("the job's secret")
    host, port = service.start("127.0.0.1", 0)
    try:
        proc = _init_process({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": host, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_GLOO_TIMEOUT_SECONDS": "2", "HOROVOD_SECRET_KEY": "the job's secret"})
        out, _ = proc.communicate(timeout=100)
        # Registered, then timed out waiting for rank 1 (never started).
        assert service.store.get("global", "rank_0").startswith(b"127.0.0.1:"), out
        assert proc.returncode == 4 and "for ranks [1] to register" in out, out
    finally:
        service.stop()


@pytest.mark.timeout(120)
def test_peers_with_different_secrets_never_connect():
    peers = ",".join(f"127.0.0.1:{p}" for p in _free_ports(2))
    procs = [_init_process({"HVDC_TCP_PEERS": peers, "HOROVOD_RANK": str(r),
                            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_GLOO_TIMEOUT_SECONDS": "3",
                            "HOROVOD_SECRET_KEY": f"secret {r}"}) for r in range(2)]
    outs = [p.communicate(timeout=100)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 4, out
        assert "could not connect to every rank" in out, out
        assert f"secret {r}" not in out and f"secret {1 - r}" not in out
    # The connecting rank says why; the refusing one logged it.
    assert "it does not know the job's secret" in outs[0], outs[0]
    assert "instead of proving the job's secret" in outs[1], outs[1]


# -- start-up errors name what the user set ----------------------------------------------------

def _tf_config(cluster, index):
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


@pytest.mark.timeout(120)
def test_tf_config_busy_port_names_the_tf_config_entry():
    """The port of this task's TF_CONFIG entry is taken: the error names that entry, not the
    HVDC_TCP_PEERS variable the translation wrote."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        cluster = {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{_free_ports(1)[0]}"]}
        proc = _init_process({"TF_CONFIG": _tf_config(cluster, 0),
                              "HOROVOD_GLOO_TIMEOUT_SECONDS": "5"})
        out, _ = proc.communicate(timeout=100)
    finally:
        busy.close()
    assert proc.returncode == 4, out
    assert (f"cannot listen on 127.0.0.1:{port} (its TF_CONFIG entry '127.0.0.1:{port}')"
            in out), out
    assert "HVDC_TCP_PEERS" not in out, out


@pytest.mark.timeout(120)
def test_tf_config_missing_peer_names_tf_config():
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    proc = _init_process({"TF_CONFIG": _tf_config(cluster, 1),
                          "HOROVOD_GLOO_TIMEOUT_SECONDS": "2"})
    out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 4, out
    assert "could not connect to every rank within 2000 ms (addresses from TF_CONFIG)" in out, out
    assert "HVDC_TCP_PEERS" not in out, out


@pytest.mark.timeout(120)
def test_gloo_variables_set_by_hand_are_named_as_such():
    port = _free_ports(1)[0]
    proc = _init_process({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                          "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_RANK": "0",
                          "HOROVOD_SIZE": "2", "HOROVOD_CONTROLLER": "gloo",
                          "HOROVOD_GLOO_TIMEOUT_SECONDS": "1"})
    out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 4, out
    assert f"cannot reach the rendezvous service at 127.0.0.1:{port} (HOROVOD_GLOO_RENDEZVOUS_ADDR" \
        in out, out
    assert "set by" not in out, out


@pytest.mark.timeout(200)
def test_gloo_variables_from_horovodrun_name_the_launcher(tmp_path):
    """A rank of horovodrun --gloo whose rendezvous service is gone (its port points nowhere):
    the error says the launcher set the variables."""
    script = tmp_path / "lost_service.py"
    script.write_text(textwrap.dedent(f"""
        import os
        os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"] = "{_free_ports(1)[0]}"
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = "1"
        from horovod_compat.common.basics import HorovodBasics
        try:
            HorovodBasics().init()
        except ValueError as error:
            print("INIT FAILED:", error, flush=True)
    """))
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "--gloo", "-np", "1",
           sys.executable, str(script)]
    result = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=180)
    assert "INIT FAILED: Horovod initialization failed: cannot reach the rendezvous service" \
        in result.stdout, result.stdout
    assert "(set by horovodrun --gloo)" in result.stdout, result.stdout
