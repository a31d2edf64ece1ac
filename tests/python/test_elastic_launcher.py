"""The elastic launcher (docs/elastic.md): rounds, blacklist, discovery and the protocol
endpoints, driven by real ``horovodrun`` jobs of fake workers (elastic_fake_worker.py) on hosts
that are aliases of this machine (localhost, 127.0.0.2, 127.0.0.3)."""

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from unittest import mock

import pytest

from horovod_compat.runner import launch, run_func
from horovod_compat.runner.elastic import constants, rounds
from horovod_compat.runner.elastic.blacklist import Blacklist
from horovod_compat.runner.elastic.discovery import HostDiscoveryScript, parse_host_lines
from horovod_compat.runner.elastic.settings import ElasticSettings
from horovod_compat.runner.rendezvous import SIGNATURE_HEADER, RendezvousServer, sign

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_fake_worker.py")

# Every test is bounded; the jobs below set their own, longer bounds.
pytestmark = pytest.mark.timeout(60)

needs_single_process = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="launcher jobs run from the test process started without mpirun")


# -- pieces ----------------------------------------------------------------------------------

def test_host_order_keeps_survivors_first():
    assert rounds.update_host_order(["a", "b", "c"], ["d", "c", "a"]) == ["a", "c", "d"]
    assert rounds.update_host_order([], ["x", "y"]) == ["x", "y"]


def test_plan_keeps_live_workers_and_fills_in_host_order():
    slots = {"a": 2, "b": 2, "c": 1}
    order = ["a", "b", "c"]
    assert rounds.plan_slots(order, slots, set(), None) == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0)]
    assert rounds.plan_slots(order, slots, set(), 3) == [("a", 0), ("a", 1), ("b", 0)]
    # A live worker keeps its slot even when the cap would have given it to an older host.
    assert rounds.plan_slots(order, slots, {("c", 0)}, 2) == [("a", 0), ("c", 0)]


def test_assignment_numbers_ranks_in_host_order():
    members = [("b", 0), ("b", 1), ("a", 1)]
    got = rounds.assign(members, 3)
    # Expected, derived by hand: b's two ranks first, then a's one (its slot 1 is local rank 0).
    assert got == {
        "b:0": {"round": 3, "rank": 0, "size": 3, "local_rank": 0, "local_size": 2,
                "cross_rank": 0, "cross_size": 2, "scope": "elastic-3"},
        "b:1": {"round": 3, "rank": 1, "size": 3, "local_rank": 1, "local_size": 2,
                "cross_rank": 0, "cross_size": 1, "scope": "elastic-3"},
        "a:1": {"round": 3, "rank": 2, "size": 3, "local_rank": 0, "local_size": 1,
                "cross_rank": 1, "cross_size": 2, "scope": "elastic-3"},
    }


def test_blacklist_cooldown_grows_and_ends():
    now = [100.0]
    blacklist = Blacklist((2, 10), clock=lambda: now[0], jitter=lambda: 0.5)
    assert not blacklist.blocked("a")
    assert blacklist.add("a") == 2 * 2 + 0.5 * 2        # low * 2**1 + jitter * low
    assert blacklist.blocked("a")
    now[0] += 5.1
    assert not blacklist.blocked("a")
    assert blacklist.add("a") == 2 * 4 + 0.5 * 2        # the second time: twice as long
    now[0] += 9.1
    assert blacklist.add("a") == 10                     # 2 * 8 + 1, capped at high
    forever = Blacklist(None, clock=lambda: now[0])
    assert forever.add("b") is None
    now[0] += 1e9
    assert forever.blocked("b")


def test_settings_are_checked():
    with pytest.raises(ValueError, match="--min-np 3"):
        ElasticSettings(discovery=None, num_proc=2, min_num_proc=3)
    with pytest.raises(ValueError, match="cooldown"):
        ElasticSettings(discovery=None, num_proc=2, min_num_proc=1, cooldown_range=(0, 5))
    with pytest.raises(ValueError, match="--max-np 1"):
        ElasticSettings(discovery=None, num_proc=2, min_num_proc=1, max_num_proc=1)


def test_discovery_output_and_failures(tmp_path):
    assert parse_host_lines("a:2\n\nb\n c:0 \na:3\n", 4) == [("b", 4), ("a", 3)]
    with pytest.raises(ValueError, match="line 1"):
        parse_host_lines("a:x\n", 1)
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho h1:2\necho h2\n")
    script.chmod(0o755)
    assert HostDiscoveryScript(str(script), 3).find_available_hosts_and_slots() == [
        ("h1", 2), ("h2", 3)]
    with pytest.raises(RuntimeError, match="Failed to execute discovery script: exit 3. "
                                           "Exit code: 3"):
        HostDiscoveryScript("exit 3").find_available_hosts_and_slots()


class _Endpoints:
    def __init__(self):
        self.ready_calls = []

    def ready(self, identity, last_round):
        self.ready_calls.append((identity, last_round))

    def assignment(self, identity):
        return b'{"round": 1}' if identity == "h:0" else None

    def hosts_event(self):
        return b"7 2"


def _request(address, secret, method, path, body=b"", signed=True):
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        headers = {"Content-Length": str(len(body))}
        if signed:
            headers[SIGNATURE_HEADER] = sign(secret, method, path, body)
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_elastic_endpoints_are_signed_and_routed(capfd):
    endpoints = _Endpoints()
    with RendezvousServer(b"k", elastic=endpoints) as server:
        address = server.address
        assert _request(address, b"k", "PUT", "/elastic/ready/h:0", b"-1") == (200, b"")
        assert endpoints.ready_calls == [("h:0", -1)]
        assert _request(address, b"k", "GET", "/elastic/assignment/h:0") == (200, b'{"round": 1}')
        assert _request(address, b"k", "GET", "/elastic/assignment/h:1")[0] == 404
        assert _request(address, b"k", "GET", "/elastic/hosts_event") == (200, b"7 2")
        assert _request(address, b"k", "PUT", "/elastic/ready/h:0", b"x")[0] == 400
        assert _request(address, b"k", "GET", "/elastic/hosts_event", signed=False)[0] == 403
        assert _request(address, b"wrong", "PUT", "/elastic/ready/h:0", b"1")[0] == 403
        assert endpoints.ready_calls == [("h:0", -1)]
        # The key-value store is unchanged beside them.
        assert _request(address, b"k", "PUT", "/elastic-1/rank_0", b"a:1")[0] == 200
        assert server.store.get("elastic-1", "rank_0") == b"a:1"
    with RendezvousServer(b"k") as server:  # a static job's service has no driver
        assert _request(server.address, b"k", "GET", "/elastic/hosts_event")[0] == 404
    capfd.readouterr()


def test_horovod_names_exist_through_the_alias():
    from horovod_compat import alias
    alias.install()
    try:
        import horovod.runner.elastic.driver as driver
        import horovod.runner.gloo_run as gloo_run
        from horovod.runner.common.util import config_parser
        from horovod.runner.elastic import constants as horovod_constants
        from horovod.runner.launch import _run_elastic, parse_args
        assert driver.DISCOVER_HOSTS_FREQUENCY_SECS == 1.0
        assert driver.ELASTIC_TIMEOUT_SECS == 600
        assert gloo_run._get_min_start_hosts(None) == 1
        assert callable(_run_elastic)
        assert "{}" in horovod_constants.RESET_LIMIT_EXCEEDED_MESSAGE
        with mock.patch.object(sys, "argv", ["horovodrun", "-np", "2", "--min-num-proc", "1",
                                             "--max-num-proc", "4", "--fusion-threshold-mb", "1",
                                             "--blacklist-cooldown-range", "1", "2",
                                             "-H", "a:1,b:1", "python", "x.py"]):
            args = parse_args()
        assert (args.num_proc, args.min_num_proc, args.max_num_proc) == (2, 1, 4)
        assert args.cooldown_range == [1, 2] and args.run_func is None
        env = {}
        config_parser.set_env_from_args(env, args)
        assert env == {"HOROVOD_FUSION_THRESHOLD": str(1024 * 1024)}
        assert launch._is_elastic(args)
        assert not launch._is_elastic(launch.parse_args(["-np", "2", "x"]))
    finally:
        alias.uninstall()


def test_run_func_passes_horovods_elastic_keywords(tmp_path):
    seen = {}

    def fake_run_commandline(argv):
        seen["argv"] = argv
        return 0

    with mock.patch.object(launch, "run_commandline", fake_run_commandline):
        assert run_func.run(len, num_proc=2, min_num_proc=1, max_num_proc=3, slots=2,
                            reset_limit=4, cooldown_range=(1, 9), elastic_timeout=7,
                            host_discovery_script="./h.sh") == []
    argv = seen["argv"]
    joined = " ".join(argv)
    for part in ("-np 2", "--min-np 1", "--max-np 3", "--slots-per-host 2", "--reset-limit 4",
                 "--blacklist-cooldown-range 1 9", "--elastic-timeout 7",
                 "--host-discovery-script ./h.sh"):
        assert part in joined
    assert "--gloo" not in argv and "--mpi" not in argv
    with pytest.raises(ValueError, match="elastic"):
        run_func.run(len, num_proc=2, reset_limit=1)


# -- jobs ------------------------------------------------------------------------------------

def _job(tmp_path, flags, plan, timeout=90, on_log=None):
    """Runs ``horovodrun <flags> python elastic_fake_worker.py``; returns (exit code, stderr,
    the workers' events). ``on_log(events, proc)`` is called while the job runs."""
    log = tmp_path / "events.jsonl"
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    plan = dict(plan, marker_dir=str(markers))
    env = dict(os.environ, PYTHONPATH=ROOT, FAKE_LOG=str(log), FAKE_PLAN=json.dumps(plan),
               PYTHONUNBUFFERED="1")
    env.pop("HOROVOD_ELASTIC_TIMEOUT", None)
    cmd = [sys.executable, "-c", "from horovod_compat.runner.launch import main; main()",
           *flags, sys.executable, WORKER]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(tmp_path))
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and on_log is not None and time.monotonic() < deadline:
            on_log(_events(log), proc)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err, _events(log)


def _events(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def _done(events):
    return sorted((e for e in events if e["event"] == "done"), key=lambda e: e["rank"])


@needs_single_process
@pytest.mark.timeout(120)
def test_fixed_hosts_survive_a_worker_that_exits_non_zero(tmp_path):
    """-H without discovery: 127.0.0.2:0 fails; its host is blacklisted, its other worker
    removed, and localhost's two go on as ranks 0 and 1 of a second round."""
    plan = {"steps": 12, "fail": {"127.0.0.2:0": {"at_step": 4, "mode": "exit"}}}
    code, err, events = _job(tmp_path, ["-np", "4", "--min-np", "2", "-H",
                                        "localhost:2,127.0.0.2:2"], plan)
    assert code == 0, err
    first = [e for e in events if e["event"] == "round" and e["round"] == 1]
    assert sorted((e["id"], e["rank"], e["size"]) for e in first) == [
        ("127.0.0.2:0", 2, 4), ("127.0.0.2:1", 3, 4), ("localhost:0", 0, 4),
        ("localhost:1", 1, 4)]
    done = _done(events)
    assert [(e["id"], e["rank"], e["size"], e["steps"]) for e in done] == [
        ("localhost:0", 0, 2, 12), ("localhost:1", 1, 2, 12)]
    assert "blacklisted host 127.0.0.2 (a worker on 127.0.0.2 failed)" in err


@needs_single_process
@pytest.mark.timeout(120)
def test_all_workers_failing_ends_the_job_with_horovods_message(tmp_path):
    plan = {"steps": 12, "fail": {"localhost:0": {"at_step": 2, "mode": "kill"},
                                  "127.0.0.2:0": {"at_step": 2, "mode": "kill"}}}
    code, err, events = _job(tmp_path, ["-np", "2", "--min-np", "1", "-H",
                                        "localhost:1,127.0.0.2:1"], plan)
    assert code == 1
    assert ("Horovod detected that one or more processes exited with non-zero status, thus "
            "causing the job to be terminated. The first process to do so was:") in err
    assert "Exit code: 137" in err  # SIGKILL, as a shell reports it
    assert not _done(events)


class _Schedule:
    """Rewrites the hosts file as the job goes: once a round runs, add 127.0.0.2; once its
    worker is in a round, remove localhost."""

    def __init__(self, hosts_file):
        self.hosts_file = hosts_file
        self.stage = 0

    def __call__(self, events, _proc):
        joined = [e["id"] for e in events if e["event"] == "round"]
        if self.stage == 0 and joined:
            self.hosts_file.write_text("localhost:1\n127.0.0.2:1\n")
            self.stage = 1
        elif self.stage == 1 and "127.0.0.2:0" in joined:
            self.hosts_file.write_text("127.0.0.2:1\n")
            self.stage = 2


def _memberships(events):
    """The rounds' members as (identity, rank, size), in round order; a round that repeats the
    one before it (a slow fake worker taken for a lost peer) counts once."""
    by_round = {}
    for e in events:
        if e["event"] == "round":
            by_round.setdefault(e["round"], []).append((e["id"], e["rank"], e["size"]))
    result = []
    for number in sorted(by_round):
        members = sorted(by_round[number])
        if not result or result[-1] != members:
            result.append(members)
    return result


def _discovery_job(tmp_path, extra_flags):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text("localhost:1\n")
    script = tmp_path / "hosts.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(0o755)
    plan = {"steps": 80, "step_seconds": 0.05}
    return _job(tmp_path, ["-np", "1", "--min-np", "1", "--max-np", "2",
                           "--host-discovery-script", str(script), *extra_flags], plan,
                on_log=_Schedule(hosts_file))


@needs_single_process
@pytest.mark.timeout(150)
def test_discovery_adds_then_removes_a_host(tmp_path):
    code, err, events = _discovery_job(tmp_path, [])
    assert code == 0, err
    assert _memberships(events) == [
        [("localhost:0", 0, 1)],
        [("127.0.0.2:0", 1, 2), ("localhost:0", 0, 2)],
        # localhost gone: the worker that joined last is rank 0, and keeps the steps done.
        [("127.0.0.2:0", 0, 1)]]
    assert [(e["id"], e["size"], e["steps"]) for e in _done(events)] == [("127.0.0.2:0", 1, 80)]
    kinds = [e["kind"] for e in events if e["event"] == "hosts_updated"]
    assert kinds[:1] == [2] and 1 in kinds  # added, then removed (Horovod's values)
    assert "worker localhost:0 leaves the job: host localhost slot 0 is no longer available" in err


@needs_single_process
@pytest.mark.timeout(150)
def test_reset_limit_stops_the_job(tmp_path):
    code, err, events = _discovery_job(tmp_path, ["--reset-limit", "1"])
    assert code == 1
    assert constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(1) in err
    assert max(e["round"] for e in events if e["event"] == "round") == 2


@needs_single_process
@pytest.mark.timeout(150)
def test_blacklisted_host_returns_after_its_cooldown(tmp_path):
    plan = {"steps": 100, "step_seconds": 0.05,
            "fail": {"127.0.0.2:0": {"at_step": 3, "mode": "kill"}}}
    code, err, events = _job(tmp_path, ["-np", "2", "--min-np", "1", "-H",
                                        "localhost:1,127.0.0.2:1",
                                        "--blacklist-cooldown-range", "1", "2"], plan)
    assert code == 0, err
    assert "blacklisted host 127.0.0.2 (a worker on 127.0.0.2 failed) for 2 s" in err
    failed_at = events.index({"id": "127.0.0.2:0", "event": "fail", "mode": "kill"})
    # A new worker on the host, in a later round than the one its predecessor died in.
    back = [e for e in events[failed_at:] if e["event"] == "round" and e["id"] == "127.0.0.2:0"]
    assert back and back[0]["round"] >= 2 and (back[0]["rank"], back[0]["size"]) == (1, 2)
    assert [(e["id"], e["size"], e["steps"]) for e in _done(events)] == [
        ("localhost:0", 2, 100), ("127.0.0.2:0", 2, 100)]


@needs_single_process
@pytest.mark.timeout(120)
def test_too_few_slots_past_the_timeout_fails_with_horovods_message(tmp_path):
    plan = {"steps": 40, "fail": {"127.0.0.2:0": {"at_step": 2, "mode": "exit"}}}
    code, err, events = _job(tmp_path, ["-np", "2", "--min-np", "2", "--elastic-timeout", "2",
                                        "-H", "localhost:1,127.0.0.2:1"], plan)
    assert code == 1
    assert ("Timed out waiting for minimum number of slots to become available. Please check "
            "that you have enough resources to run at least 2 Horovod processes. Timeout after "
            "2 seconds.") in err
    assert "Process name: 127.0.0.2[0]\nExit code: 5" in err.replace("horovodrun: ", "")


@needs_single_process
@pytest.mark.timeout(120)
def test_a_stuck_worker_is_dropped_after_the_timeout(tmp_path):
    plan = {"steps": 10, "stuck": ["127.0.0.2:0"]}
    code, err, events = _job(tmp_path, ["-np", "2", "--min-np", "1", "--elastic-timeout", "2",
                                        "-H", "localhost:1,127.0.0.2:1"], plan)
    assert code == 0, err
    assert "worker 127.0.0.2:0 was not ready for round 1 within 2 s: dropping it" in err
    assert [(e["id"], e["size"], e["steps"]) for e in _done(events)] == [("localhost:0", 1, 10)]


@needs_single_process
@pytest.mark.timeout(120)
def test_sigterm_is_forwarded_and_ends_the_job(tmp_path):
    sent = []

    def stop_once_running(events, proc):
        if not sent and any(e["event"] == "round" for e in events):
            proc.send_signal(signal.SIGTERM)
            sent.append(True)

    code, err, events = _job(tmp_path, ["-np", "2", "--min-np", "1", "-H", "localhost:2"],
                             {"steps": 100000}, on_log=stop_once_running)
    assert sent and code == 128 + signal.SIGTERM, err
    assert f"interrupted by signal {int(signal.SIGTERM)}" in err
    assert not _done(events)


@needs_single_process
@pytest.mark.timeout(120)
def test_run_elastic_in_process_raises_horovods_error(tmp_path, monkeypatch, capfd):
    """As Horovod's own elastic tests drive it: parse_args() on sys.argv, then _run_elastic."""
    (tmp_path / "markers").mkdir()
    monkeypatch.setenv("PYTHONPATH", ROOT)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "events.jsonl"))
    monkeypatch.setenv("FAKE_PLAN", json.dumps({
        "steps": 10, "marker_dir": str(tmp_path / "markers"),
        "fail": {"localhost:0": {"at_step": 1, "mode": "exit"},
                 "localhost:1": {"at_step": 1, "mode": "exit"}}}))
    monkeypatch.delenv("HOROVOD_ELASTIC_TIMEOUT", raising=False)
    monkeypatch.setattr(sys, "argv", ["horovodrun", "-np", "2", "--min-num-proc", "1", "-H",
                                      "localhost:2", "--no-alias", sys.executable, WORKER])
    args = launch.parse_args()
    with pytest.raises(RuntimeError, match="Horovod detected that one or more processes exited "
                                           "with non-zero status"):
        launch._run_elastic(args)
    capfd.readouterr()


@needs_single_process
def test_misconfigured_jobs_fail_at_once(capfd):
    assert launch.run_commandline(["-np", "4", "--min-np", "2", "-H", "a:1,b:1", "true"]) == 2
    assert ("-np 4 is more than the 2 slots of the hosts (a:1,b:1), which do not change without "
            "a discovery script") in capfd.readouterr().err
    # A discovery script that fails on its first run: no waiting for the timeout.
    assert launch.run_commandline(["--min-np", "1", "--host-discovery-script", "exit 7",
                                   "true"]) == 1
    assert "Failed to execute discovery script: exit 7. Exit code: 7" in capfd.readouterr().err


# -- the driver, step by step, with workers that are only records -------------------------

class _Hosts:
    def __init__(self, hosts):
        self.hosts = hosts

    def find_available_hosts_and_slots(self):
        return list(self.hosts)


class _NoProcesses:
    """A WorkerLauncher that starts nothing: the test plays the workers."""

    def __init__(self):
        import queue
        self.exits = queue.Queue()
        self.started = []

    def start(self, worker, env):
        self.started.append((worker.identity, env["HOROVOD_RANK"], env["HOROVOD_SIZE"]))

    def close_input(self, worker):
        pass

    def finish(self, worker):
        pass


def _answer(driver, identity):
    body = driver.assignment(identity)
    return None if body is None else json.loads(body)


def test_driver_rounds_hosts_event_and_removal(capfd):
    from horovod_compat.runner.elastic.driver import ElasticDriver
    hosts = _Hosts([("a", 1), ("b", 1)])
    launcher = _NoProcesses()
    settings = ElasticSettings(discovery=hosts, num_proc=2, min_num_proc=1)
    driver = ElasticDriver(settings, launcher,
                           lambda info, job_hosts: {"HOROVOD_RANK": str(info.rank),
                                                    "HOROVOD_SIZE": str(info.size)})

    def step():
        driver._discovery._poll()
        driver._step()

    step()
    assert launcher.started == [("a:0", "0", "2"), ("b:0", "1", "2")]
    assert _answer(driver, "a:0") is None and _answer(driver, "zz:0")["removed"]
    driver.ready("a:0", -1)
    step()
    assert _answer(driver, "a:0") is None  # b:0 has not asked yet
    driver.ready("b:0", -1)
    step()
    assert _answer(driver, "b:0") == {"round": 1, "rank": 1, "size": 2, "local_rank": 0,
                                      "local_size": 1, "cross_rank": 1, "cross_size": 2,
                                      "scope": "elastic-1", "hosts_event": 0}
    assert driver.hosts_event() == b"0 0"
    # A host added: a worker for it, and rank 0 is told (kind 2, added).
    hosts.hosts = [("a", 1), ("b", 1), ("c", 1)]
    step()
    assert launcher.started[-1] == ("c:0", "2", "3")
    stamp, kind = driver.hosts_event().split()
    assert int(stamp) > 0 and kind == b"2"
    driver.ready("c:0", -1)
    step()
    assert _answer(driver, "c:0") is None  # waits for the others to come back
    # A host removed before rank 0 acted: the kinds add up (3) and the timestamp grows.
    hosts.hosts = [("a", 1), ("c", 1)]
    step()
    stamp2, kind2 = driver.hosts_event().split()
    assert int(stamp2) > int(stamp) and kind2 == b"3"
    assert _answer(driver, "b:0")["removed"]
    # Rank 0 resets everyone (b is out, c asked already): round 2 keeps a first, then c.
    driver.ready("a:0", 1)
    step()
    assert (_answer(driver, "a:0")["round"], _answer(driver, "a:0")["rank"]) == (2, 0)
    assert (_answer(driver, "c:0")["rank"], _answer(driver, "c:0")["size"]) == (1, 2)
    assert _answer(driver, "c:0")["hosts_event"] == int(stamp2)
    assert driver.hosts_event() == stamp2 + b" 0"  # nothing new since round 2 formed
    # a finishes: the job is over for anyone asking for another round.
    worker_a = driver._workers["a:0"]
    launcher.exits.put((worker_a, 0))
    step()
    driver.ready("c:0", 2)
    assert _answer(driver, "c:0")["reason"] == "the job is over: its workers have finished"
    capfd.readouterr()


def test_driver_gives_a_restarted_slot_no_old_round(capfd):
    from horovod_compat.runner.elastic.driver import ElasticDriver
    launcher = _NoProcesses()
    settings = ElasticSettings(discovery=_Hosts([("a", 1), ("b", 1)]), num_proc=2,
                               min_num_proc=1, cooldown_range=(1, 1))
    driver = ElasticDriver(settings, launcher,
                           lambda info, job_hosts: {"HOROVOD_RANK": str(info.rank),
                                                    "HOROVOD_SIZE": str(info.size)})

    def step():
        driver._discovery._poll()
        driver._step()

    step()
    driver.ready("a:0", -1)
    driver.ready("b:0", -1)
    step()
    assert _answer(driver, "b:0")["round"] == 1
    launcher.exits.put((driver._workers["b:0"], 9))   # b's worker fails: b out for 1 s
    step()
    assert len(launcher.started) == 2
    time.sleep(1.2)
    step()
    assert launcher.started[-1] == ("b:0", "1", "2")   # back after the cooldown, a new process
    driver.ready("b:0", -1)
    assert _answer(driver, "b:0") is None             # not round 1: that was its predecessor's
    driver.ready("a:0", 1)
    step()
    assert (_answer(driver, "b:0")["round"], _answer(driver, "b:0")["rank"]) == (2, 1)
    capfd.readouterr()
