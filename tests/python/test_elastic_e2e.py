"""Elastic jobs end to end: the real ``horovodrun`` (elastic mode, its driver and rendezvous
service) starts real TensorFlow workers (elastic_worker_job.py) that train under
``hvd.elastic.run``; workers die, raise, join and leave, and the job still ends with the
weights of exactly the committed steps on every rank (docs/elastic.md).

Hosts are aliases of this machine (localhost, 127.0.0.2, 127.0.0.3), as in
test_elastic_launcher.py; a failing worker's host is blacklisted, so the victims sit on their
own alias. Every job runs from this one process (skipped under mpirun)."""

import json
import os
import subprocess
import sys
import time

import pytest

from horovod_compat.runner.elastic import constants

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "elastic_worker_job.py")

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ,
                       reason="starts its own jobs; runs from a test process without mpirun"),
]


def _env(fail=None):
    env = dict(os.environ)
    for name in list(env):
        # Whatever launched pytest must not leak its identity into the job.
        if name.startswith(("HOROVOD_", "HVDC_", "OMPI_", "PMIX_", "PMI_")):
            del env[name]
    env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE, env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    # A short peer-loss exit timer: a static job's survivors would exit 1 s after a loss; an
    # elastic job must not arm it (core/runtime_shutdown.cc), or the survivors never re-form.
    env["HOROVOD_PEER_LOSS_EXIT_SECONDS"] = "1"
    if fail:
        env["HVDC_E2E_FAIL"] = json.dumps(fail)
    return env


def _horovodrun(tmp_path, flags, mode, total, commit_every, fail=None, on_tick=None,
                timeout=240):
    """Runs ``horovodrun <flags> python elastic_worker_job.py ...``; returns (exit code,
    output). ``on_tick(out_dir)`` is called every 0.1 s while the job runs."""
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    cmd = [sys.executable, "-c", "from horovod_compat.runner.launch import main; main()",
           *flags, sys.executable, JOB, mode, str(out_dir), str(total), str(commit_every)]
    env = _env(fail)
    if mode == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    log = open(tmp_path / "job.log", "w+")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=str(tmp_path), start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if on_tick is not None:
                on_tick(out_dir)
            time.sleep(0.1)
        if proc.poll() is None:
            proc.terminate()  # horovodrun passes it on; a second one kills the workers
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.seek(0)
        output = log.read()
        log.close()
    return proc.returncode, output


def _assert_ok(code, out):
    assert code == 0, out[-6000:]


def _result(tmp_path, identity):
    with open(tmp_path / "out" / (identity.replace(":", "_") + ".json")) as f:
        return json.load(f)


def _commits(tmp_path, identity):
    """The (position, sum of the weights) of every commit ``identity`` took."""
    path = tmp_path / "out" / (identity.replace(":", "_") + ".commits")
    if not path.exists():
        return []
    with open(path) as f:
        return [(int(p), float(s)) for p, s in (line.split() for line in f if line.strip())]


def _loop_sum(steps):
    """The loop's weights after ``steps`` steps: each adds step + 1 to each of 4 weights."""
    return 4 * steps * (steps + 1) / 2


def _starts(result):
    return [e["start_at"] for e in result["events"] if "start_at" in e]


@pytest.mark.parametrize("mode", ["kill", "raise"])
def test_survivors_roll_back_to_the_last_commit_and_finish(tmp_path, mode):
    """(a) a worker SIGKILLed, (b) a worker raising, at step 12 of 40 (commits every 5): its
    host is blacklisted and the two survivors go on from step 10 as a job of two."""
    total, commit_every, victim = 40, 5, "127.0.0.2:0"
    code, out = _horovodrun(tmp_path, ["-np", "3", "--min-np", "2", "--max-np", "3",
                                       "-H", "localhost:2,127.0.0.2:1"],
                            "loop", total, commit_every,
                            fail={victim: {"at_step": 12, "mode": mode}})
    _assert_ok(code, out)
    assert "blacklisted host 127.0.0.2" in out
    results = [_result(tmp_path, i) for i in ("localhost:0", "localhost:1")]
    for result in results:
        assert result["weights"] == [_loop_sum(total) / 4] * 4, out[-6000:]
        assert result["step"] == total and result["size"] == 2
        # From 0, then from the last commit before the loss (the victim stopped at step 12).
        assert _starts(result) == [0, 10], out[-6000:]
        assert [e["reset_to_size"] for e in result["events"] if "reset_to_size" in e] == [2]
    assert sorted(r["rank"] for r in results) == [0, 1]
    # Every commit on every rank (the victim's too) holds exactly the steps before it.
    for identity in ("localhost:0", "localhost:1", victim):
        commits = _commits(tmp_path, identity)
        assert commits and all(s == _loop_sum(p) for p, s in commits), commits
    assert [p for p, _ in _commits(tmp_path, victim)] == [5, 10]


class _HostsSchedule:
    """Rewrites the hosts file: once localhost committed, adds 127.0.0.2; once 127.0.0.2's
    worker committed, removes its host again."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.hosts_file = tmp_path / "hosts.txt"
        self.hosts_file.write_text("localhost:1\n")
        self.stage = 0

    def __call__(self, _out_dir):
        if self.stage == 0 and _commits(self.tmp_path, "localhost:0"):
            self.hosts_file.write_text("localhost:1\n127.0.0.2:1\n")
            self.stage = 1
        elif self.stage == 1 and _commits(self.tmp_path, "127.0.0.2:0"):
            self.hosts_file.write_text("localhost:1\n")
            self.stage = 2


def test_discovered_worker_joins_with_the_state_then_leaves(tmp_path):
    """(c) discovery adds a slot on 127.0.0.2: its new worker joins a round of two and starts
    from the others' committed state; the slot goes away again and localhost finishes."""
    total, commit_every = 600, 10
    schedule = _HostsSchedule(tmp_path)
    script = tmp_path / "hosts.sh"
    script.write_text(f"#!/bin/sh\ncat {schedule.hosts_file}\n")
    script.chmod(0o755)
    code, out = _horovodrun(tmp_path, ["-np", "1", "--min-np", "1", "--max-np", "2",
                                       "--host-discovery-script", str(script)],
                            "loop", total, commit_every, on_tick=schedule)
    _assert_ok(code, out)
    assert schedule.stage == 2, "the job ended before the new worker committed"
    result = _result(tmp_path, "localhost:0")
    assert result["weights"] == [_loop_sum(total) / 4] * 4, out[-6000:]
    assert result["step"] == total and result["size"] == 1
    sizes = [e["reset_to_size"] for e in result["events"] if "reset_to_size" in e]
    assert sizes[:1] == [2] and sizes[-1] == 1, result["events"]
    joined = _commits(tmp_path, "127.0.0.2:0")
    # Its first commit is past the ones localhost took alone, with the committed weights: it
    # received the state when it joined (it never trained from zero on its own).
    first_alone = _commits(tmp_path, "localhost:0")[0][0]
    assert joined[0][0] > first_alone, joined
    assert all(s == _loop_sum(p) for p, s in joined), joined


def test_reset_limit_ends_the_job_with_horovods_message(tmp_path):
    """(d) --reset-limit 0: the first loss would need a reset, so the job stops."""
    code, out = _horovodrun(tmp_path, ["-np", "2", "--min-np", "1", "--reset-limit", "0",
                                       "-H", "localhost:1,127.0.0.2:1"],
                            "loop", 40, 5, fail={"127.0.0.2:0": {"at_step": 7, "mode": "kill"}})
    assert code != 0, out[-6000:]
    assert constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(0) in out, out[-6000:]
    assert not (tmp_path / "out" / "localhost_0.json").exists()


def test_keras_fit_with_the_elastic_callbacks_survives_a_kill(tmp_path):
    """(e) Keras 3 ``fit`` with CommitStateCallback, UpdateBatchStateCallback and
    UpdateEpochStateCallback: a worker SIGKILLed in the second epoch; the survivors resume
    from a commit and end with identical weights that counted every batch once."""
    commit_every = 2
    steps_per_epoch, epochs = commit_every * 3, 3
    victim = "127.0.0.2:0"
    code, out = _horovodrun(tmp_path, ["-np", "3", "--min-np", "2",
                                       "-H", "localhost:2,127.0.0.2:1"],
                            "keras", steps_per_epoch * epochs, commit_every,
                            fail={victim: {"at_step": steps_per_epoch + 3, "mode": "kill"}})
    _assert_ok(code, out)
    first, second = [_result(tmp_path, i) for i in ("localhost:0", "localhost:1")]
    assert first["weights"] == second["weights"], out[-6000:]
    for result in (first, second):
        starts = _starts(result)
        assert len(starts) == 2 and starts[0] == [0, 0] and starts[1] >= [1, 0], out[-6000:]
    # The layer's batch counter is a model variable: rolled back with the weights.
    assert first["weights"][-1] == steps_per_epoch * epochs


def test_readme_recipe_with_the_keras_example(tmp_path):
    """README's recipe, with examples/keras_elastic.py as train.py and a discovery script
    (smaller: 2 workers, --short): the job trains and reports its accuracy."""
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    env = _env()
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", "from horovod_compat.runner.launch import main; main()",
         "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", "./hosts.sh",
         "python", os.path.join(ROOT, "examples", "keras_elastic.py"), "--short"],
        env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-6000:]
    assert "round 1: 2 workers on localhost" in result.stdout
    accuracy = [float(line.rsplit(":", 1)[1]) for line in result.stdout.splitlines()
                if "Test accuracy:" in line]
    assert len(accuracy) == 1 and accuracy[0] > 0.5, result.stdout[-6000:]


def _netns_cluster():
    """The pretend cluster's script when its hosts hvhost1..3 are up, else None (as
    test_tcp_launch.py finds it)."""
    path = os.environ.get("HVDC_NETNS_CLUSTER")
    if not path:  # next to the repository, or to the folder of its worktrees
        for parent in (os.path.dirname(ROOT), os.path.dirname(os.path.dirname(ROOT))):
            path = os.path.join(parent, "shared", "tools", "netns-cluster")
            if os.access(path, os.X_OK):
                break
    if not os.access(path, os.X_OK):
        return None
    try:
        hosts = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True,
                               timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return path if {"hvhost1", "hvhost2", "hvhost3"} <= set(hosts) else None


@pytest.mark.skipif(_netns_cluster() is None,
                    reason="the netns cluster is not up (netns-cluster up 3; set "
                           "HVDC_NETNS_CLUSTER to its script)")
def test_netns_cluster_survives_a_host_cut_off(tmp_path):
    """3 hosts of the netns cluster, one worker each; hvhost3 is cut off the network mid-job:
    the survivors notice (heartbeats), its worker is dropped after the elastic timeout, and
    hvhost1 and hvhost2 finish with the committed weights."""
    cluster = _netns_cluster()
    total, commit_every = 400, 10
    cut = {"done": False}

    def cut_when_running(_out_dir):
        if not cut["done"] and len(_commits(tmp_path, "hvhost3:0")) >= 2:
            subprocess.run([cluster, "cut", "3"], check=True, timeout=30)
            cut["done"] = True

    try:
        code, out = _horovodrun(tmp_path, ["-np", "3", "--min-np", "2", "--elastic-timeout", "20",
                                           "-H", "hvhost1:1,hvhost2:1,hvhost3:1",
                                           "--remote-shell", f"{cluster} rsh"],
                                "loop", total, commit_every, on_tick=cut_when_running)
    finally:
        if cut["done"]:
            subprocess.run([cluster, "heal", "3"], timeout=30)
    assert cut["done"], out[-6000:]
    _assert_ok(code, out)
    results = [_result(tmp_path, i) for i in ("hvhost1:0", "hvhost2:0")]
    for result in results:
        assert result["weights"] == [_loop_sum(total) / 4] * 4, out[-6000:]
        assert result["step"] == total and result["size"] == 2
        assert _starts(result)[0] == 0 and _starts(result)[-1] % commit_every == 0


class _HostLostThenBack:
    """Once hvhost3's worker committed twice, the host is lost: its processes SIGKILLed, its
    link cut and discovery no longer lists it. Once hvhost1 committed twice more without it,
    the link comes back and discovery lists hvhost3 again."""

    def __init__(self, tmp_path, cluster):
        self.tmp_path, self.cluster = tmp_path, cluster
        self.hosts_file = tmp_path / "hosts.txt"
        self.hosts_file.write_text("hvhost1:1\nhvhost2:1\nhvhost3:1\n")
        self.stage, self.commits_at_loss, self.victim_commits = 0, 0, []

    def __call__(self, _out_dir):
        if self.stage == 0 and len(_commits(self.tmp_path, "hvhost3:0")) >= 2:
            pids = subprocess.run(["ip", "netns", "pids", "hvhost3"], stdout=subprocess.PIPE,
                                  text=True, timeout=30).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
            subprocess.run([self.cluster, "cut", "3"], check=True, timeout=30)
            self.hosts_file.write_text("hvhost1:1\nhvhost2:1\n")
            self.commits_at_loss = len(_commits(self.tmp_path, "hvhost1:0"))
            self.victim_commits = _commits(self.tmp_path, "hvhost3:0")
            self.stage = 1
        elif self.stage == 1 and \
                len(_commits(self.tmp_path, "hvhost1:0")) >= self.commits_at_loss + 2:
            subprocess.run([self.cluster, "heal", "3"], check=True, timeout=30)
            self.hosts_file.write_text("hvhost1:1\nhvhost2:1\nhvhost3:1\n")
            self.stage = 2


@pytest.mark.skipif(_netns_cluster() is None,
                    reason="the netns cluster is not up (netns-cluster up 3; set "
                           "HVDC_NETNS_CLUSTER to its script)")
def test_netns_cluster_host_lost_then_listed_again_rejoins(tmp_path):
    """3 hosts of the netns cluster found by a discovery script; hvhost3 dies (its processes
    killed, its link cut, gone from discovery): the two others go on from the last commit;
    it comes back and is listed again: after its blacklist cooldown a new worker there joins
    with the committed state, and the job ends as a job of three."""
    cluster = _netns_cluster()
    total, commit_every = 1200, 10
    schedule = _HostLostThenBack(tmp_path, cluster)
    script = tmp_path / "hosts.sh"
    script.write_text(f"#!/bin/sh\ncat {schedule.hosts_file}\n")
    script.chmod(0o755)
    try:
        code, out = _horovodrun(tmp_path, ["-np", "3", "--min-np", "2", "--max-np", "3",
                                           "--host-discovery-script", str(script),
                                           "--blacklist-cooldown-range", "1", "2",
                                           "--elastic-timeout", "60",
                                           "--remote-shell", f"{cluster} rsh"],
                                "loop", total, commit_every, on_tick=schedule, timeout=280)
    finally:
        if schedule.stage == 1:
            subprocess.run([cluster, "heal", "3"], timeout=30)
    assert schedule.stage == 2, out[-6000:]
    _assert_ok(code, out)
    assert "blacklisted host hvhost3" in out
    results = [_result(tmp_path, i) for i in ("hvhost1:0", "hvhost2:0", "hvhost3:0")]
    for result in results:
        assert result["weights"] == [_loop_sum(total) / 4] * 4, out[-6000:]
        assert result["step"] == total and result["size"] == 3
    sizes = [e["reset_to_size"] for e in results[0]["events"] if "reset_to_size" in e]
    assert sizes[0] == 2 and sizes[-1] == 3, results[0]["events"]
    # The new worker on hvhost3 started from the others' committed state, past its
    # predecessor's last commit (the commits file holds both workers' commits, in order).
    rejoined = _commits(tmp_path, "hvhost3:0")
    assert all(s == _loop_sum(p) for p, s in rejoined), rejoined
    assert _starts(results[2])[0] > schedule.victim_commits[-1][0], results[2]["events"]
