"""The elastic retry loop (hvd.elastic.run / common.elastic.run_fn) with fakes: what happens on
a lost worker, on a host change, on an unrelated error; the host-update decision every rank
shares; the worker's rendezvous client against a fake launcher. No collective is issued here
except through hvd.elastic.run's wrapper in the single-process checks, so the file runs the
same on every rank of an mpirun job."""

import json
import threading
import time

import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd
import horovod_compat.tensorflow.keras as hvdk
from horovod_compat.common import elastic as common_elastic
from horovod_compat.common import elastic_rendezvous
from horovod_compat.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from elastic_fake_driver import FakeDriver

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def no_watch_left():
    """Rank 0's hosts_event watch (a thread asking the test's launcher) ends with each test."""
    yield
    elastic_rendezvous.stop_hosts_event_watch()


def _set_and_await(driver, timestamp, kind):
    """The launcher raises a host change; rank 0's watch hears of it within its poll period
    (bounded here at 10 s)."""
    driver.set_hosts_event(timestamp, int(kind))
    deadline = time.monotonic() + 10
    while elastic_rendezvous.watched_hosts_event()[0] != timestamp:
        assert time.monotonic() < deadline, "rank 0's watch never heard of the host change"
        time.sleep(0.01)


@pytest.fixture
def elastic_env(monkeypatch):
    """HOROVOD_ELASTIC=1 without a launcher's rendezvous: the loop retries, rank 0 asks no
    launcher."""
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    for name in ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"):
        monkeypatch.delenv(name, raising=False)


class RecordingState(common_elastic.ObjectState):
    """An ObjectState that logs save/restore/sync/reset in ``events`` (no collective)."""

    def __init__(self, events, **kwargs):
        self.events = events
        super().__init__(lambda obj: obj, lambda: 0, **kwargs)

    def save(self):
        self.events.append("save")
        super().save()

    def restore(self):
        self.events.append("restore")
        super().restore()

    def sync(self):
        self.events.append("sync")
        super().sync()

    def reset(self):
        self.events.append("state.reset")


def _loop(events, outcomes, agree=None):
    """run_fn around a function that pops one outcome per call: an exception to raise or a
    value to return; ``step`` counts up by one per call before the outcome."""

    def train(state):
        state.step += 1
        events.append(f"call step={state.step}")
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return common_elastic.run_fn(train, lambda: events.append("reinit"), agree)


def test_internal_error_restores_reinitialises_and_syncs(elastic_env):
    events = []
    state = RecordingState(events, step=10)
    state.register_reset_callbacks([lambda: events.append("callback")])
    result = _loop(events, [HorovodInternalError("lost rank 1"), "done"])(state)
    assert result == "done"
    # The failed attempt's step is rolled back: the retry starts from the committed 10.
    assert events == ["sync", "call step=11", "restore", "reinit", "state.reset", "callback",
                      "sync", "call step=11"]


@pytest.mark.parametrize("kind,skip_sync", [
    (common_elastic.HostUpdateResult.removed, True),
    (common_elastic.HostUpdateResult.added, False),
    (common_elastic.HostUpdateResult.mixed, False),
])
def test_hosts_updated_reinitialises_and_syncs_unless_only_removed(elastic_env, kind,
                                                                   skip_sync):
    events = []
    state = RecordingState(events, step=0)
    state.on_hosts_updated(1, kind)
    interrupt = None
    try:
        state.check_host_updates()
    except HostsUpdatedInterrupt as raised:
        interrupt = raised
    assert interrupt is not None and interrupt.skip_sync is skip_sync
    events.clear()
    _loop(events, [interrupt, "done"])(state)
    # No rollback on a host change. Without the sync the survivors keep their values (step 1);
    # the sync hands out rank 0's committed snapshot (here the constructor's step 0), which in
    # a real job is what commit() saved just before raising.
    expected = ["sync", "call step=1", "reinit", "state.reset"]
    expected += ["call step=2"] if skip_sync else ["sync", "call step=1"]
    assert events == expected


def test_skip_sync_is_overruled_when_any_rank_needs_the_sync(elastic_env):
    events, asked = [], []

    def any_rank_needs_sync(mine):
        asked.append(mine)
        return True  # a worker new in this round must receive the state

    state = RecordingState(events, step=0)
    _loop(events, [HostsUpdatedInterrupt(True), "done"], any_rank_needs_sync)(state)
    assert asked == [True, False]
    assert events == ["sync", "call step=1", "reinit", "state.reset", "sync", "call step=1"]


def test_outside_an_elastic_job_errors_propagate(monkeypatch):
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    events = []
    state = RecordingState(events, step=0)
    with pytest.raises(HorovodInternalError):
        _loop(events, [HorovodInternalError("lost")])(state)
    with pytest.raises(HostsUpdatedInterrupt):
        _loop(events, [HostsUpdatedInterrupt(False)])(state)
    assert "reinit" not in events


def test_a_failed_reinit_is_retried(elastic_env):
    events = []
    attempts = []

    def reset():
        attempts.append(1)
        events.append("reinit")
        if len(attempts) == 1:
            raise HorovodInternalError("a peer left while the round connected")

    def train(state):
        events.append("call")
        if events.count("call") == 1:
            raise HorovodInternalError("lost")
        return "done"

    state = RecordingState(events, step=0)
    assert common_elastic.run_fn(train, reset)(state) == "done"
    assert events == ["sync", "call", "restore", "reinit", "restore", "reinit", "state.reset",
                      "sync", "call"]


def test_other_errors_propagate_without_reset(elastic_env):
    events = []
    state = RecordingState(events, step=0)
    with pytest.raises(ValueError):
        _loop(events, [ValueError("a bug")])(state)
    assert events == ["sync", "call step=1"]


def test_tensorflow_run_reraises_an_unrelated_unknown_error(elastic_env, monkeypatch):
    events = []
    state = RecordingState(events, step=0)
    # hvd.elastic.run's own collectives are replaced: this checks its error handling only.
    from horovod_compat.tensorflow import elastic as tf_elastic
    monkeypatch.setattr(tf_elastic, "_sync_needed_anywhere", lambda mine: mine)
    monkeypatch.setattr(tf_elastic, "_reset", lambda: events.append("reinit"))

    @hvd.elastic.run
    def train(state):
        """Docstring kept."""
        raise tf.errors.UnknownError(None, None, "some kernel failed")

    assert train.__name__ == "train" and train.__doc__ == "Docstring kept."
    with pytest.raises(tf.errors.UnknownError, match="some kernel failed"):
        train(state)
    assert "reinit" not in events


def test_tensorflow_run_retries_a_lost_peer(elastic_env, monkeypatch):
    from horovod_compat.tensorflow import elastic as tf_elastic
    from horovod_compat.tensorflow.peer_lost import PEER_LOST_PAYLOAD
    events = []
    monkeypatch.setattr(tf_elastic, "_sync_needed_anywhere", lambda mine: mine)
    monkeypatch.setattr(tf_elastic, "_reset", lambda: events.append("reinit"))
    state = RecordingState(events, step=0)

    calls = []

    @hvd.elastic.run
    def train(state):
        state.step += 1
        calls.append(state.step)
        if len(calls) == 1:
            # What a graph-mode session raises for a lost peer: a plain UnknownError with the
            # payload the kernels attach.
            raise tf.errors.UnknownError(None, None, "peer rank 1 lost",
                                         {PEER_LOST_PAYLOAD: b""})
        return state.step

    assert train(state) == 1  # rolled back to 0, then one successful step
    assert calls == [1, 1]
    assert events == ["sync", "restore", "reinit", "state.reset", "sync"]


def test_commit_state_callback_commits_through_a_subclass_commit():
    commits = []

    class MyState(common_elastic.ObjectState):
        def commit(self):
            commits.append(self.batch)
            super().commit()

    state = MyState(lambda obj: obj, lambda: 0, batch=0, epoch=0)
    callback = hvdk.elastic.CommitStateCallback(state, batches_per_commit=2)
    callback.on_train_begin()
    for batch in range(4):
        callback.on_train_batch_begin(batch)
        state.batch = batch + 1  # what UpdateBatchStateCallback would do
        callback.on_train_batch_end(batch)
    callback.on_epoch_end(0)
    callback.on_train_end()
    # Due after batches 2 and 4; the second is replaced by the epoch's commit at the end.
    assert commits == [2, 4]


# -- host updates: every rank decides on rank 0's view ------------------------------------------

def test_late_joiner_decides_like_rank_zero(elastic_env):
    """A worker new in this round has seen no update (timestamp 0) while rank 0 has seen the
    one at timestamp 5: rank 0's broadcast (previous 5, latest 5) makes it not raise either."""
    rank_zero_view = (5, 5, int(common_elastic.HostUpdateResult.no_update), None)
    joiner = common_elastic.ObjectState(lambda obj: rank_zero_view, lambda: 1, step=0)
    joiner.check_host_updates()  # no interrupt: rank 0 saw nothing new
    assert joiner._last_updated_timestamp == 5


def test_every_rank_follows_rank_zeros_decision(elastic_env):
    """Updates delivered to some ranks only (deliberately rank-dependent): every rank raises,
    or not, with rank 0, through the real broadcast (under mpirun -np N)."""
    state = common_elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    if hvd.rank() != 0:
        state.on_hosts_updated(7, common_elastic.HostUpdateResult.removed)
    state.check_host_updates()  # rank 0 saw nothing: nobody raises
    if hvd.rank() == 0:
        state.on_hosts_updated(9, common_elastic.HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt) as interrupt:
        state.check_host_updates()
    assert interrupt.value.skip_sync is False
    assert state._last_updated_timestamp == 9


def test_rank_zero_reads_the_launchers_hosts_event(monkeypatch):
    with FakeDriver(secret=b"s3cret") as driver:
        monkeypatch.setenv("HOROVOD_ELASTIC", "1")
        for name, value in driver.worker_env("hostA", 0).items():
            monkeypatch.setenv(name, value)
        sent = []

        def bcast(obj):
            sent.append(obj)
            return obj

        state = common_elastic.ObjectState(bcast, lambda: 0, step=0)
        state.check_host_updates()
        _set_and_await(driver, 3, common_elastic.HostUpdateResult.removed)
        with pytest.raises(HostsUpdatedInterrupt) as interrupt:
            state.commit()
        assert interrupt.value.skip_sync is True
        state.check_host_updates()  # seen
        _set_and_await(driver, 4, common_elastic.HostUpdateResult.added)
        with pytest.raises(HostsUpdatedInterrupt) as interrupt:
            state.check_host_updates()
        assert interrupt.value.skip_sync is False
        assert [s[:3] for s in sent] == [(0, 0, 0), (0, 3, 1), (3, 3, 0), (3, 4, 2)]


def test_a_new_rank_zero_takes_the_rounds_host_changes_as_seen(monkeypatch):
    """Rank 0 new to the job (it has seen no update) in a round that formed at hosts_event 5:
    the change at 5 is in the round already; the one at 6 is news."""
    with FakeDriver() as driver:
        monkeypatch.setenv("HOROVOD_ELASTIC", "1")
        for name, value in driver.worker_env("hostD", 0).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(elastic_rendezvous, "_round_hosts_event", 5)
        state = common_elastic.ObjectState(lambda obj: obj, lambda: 0, step=0)
        driver.set_hosts_event(5, int(common_elastic.HostUpdateResult.added))
        state.check_host_updates()
        assert state._last_updated_timestamp == 5
        _set_and_await(driver, 6, common_elastic.HostUpdateResult.mixed)
        with pytest.raises(HostsUpdatedInterrupt) as interrupt:
            state.check_host_updates()
        assert interrupt.value.skip_sync is False


def test_rendezvous_client_assignment_and_removal(monkeypatch):
    with FakeDriver(secret=b"k") as driver:
        env = dict(driver.worker_env("hostB", 1), HOROVOD_ELASTIC="1",
                   HOROVOD_ELASTIC_TIMEOUT="30")
        monkeypatch.setattr(elastic_rendezvous, "_last_round", -1)
        monkeypatch.setattr(elastic_rendezvous, "_round_hosts_event", 0)

        def assign_later():
            driver.wait_ready("hostB:1", -1)
            driver.assign("hostB:1", {"round": 0, "rank": 1, "size": 2, "local_rank": 1,
                                      "local_size": 2, "cross_rank": 0, "cross_size": 1,
                                      "scope": "elastic-0", "hosts_event": 7})

        thread = threading.Thread(target=assign_later)
        thread.start()
        assignment = elastic_rendezvous.join_round(env)
        thread.join()
        assert assignment.round == 0 and elastic_rendezvous.last_round() == 0
        assert elastic_rendezvous.round_hosts_event() == 7
        assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"],
                env["HOROVOD_LOCAL_SIZE"], env["HOROVOD_CROSS_RANK"],
                env["HOROVOD_CROSS_SIZE"]) == ("1", "2", "1", "2", "0", "1")
        assert env["HVDC_TCP_RENDEZVOUS_SCOPE"] == "elastic-0"
        driver.assign("hostB:1", {"removed": True, "reason": "host hostB was blacklisted"})
        with pytest.raises(elastic_rendezvous.WorkerRemovedError, match="blacklisted"):
            elastic_rendezvous.join_round(env)
        assert driver.ready_rounds("hostB:1") == [-1, 0]
        # A wrong secret is refused by the service, and the client says so.
        env["HOROVOD_SECRET_KEY"] = "wrong"
        with pytest.raises(RuntimeError, match="403"):
            elastic_rendezvous.join_round(env)


def test_rendezvous_client_times_out(monkeypatch):
    with FakeDriver() as driver:
        env = dict(driver.worker_env("hostC", 0), HOROVOD_ELASTIC_TIMEOUT="0.3")
        monkeypatch.setattr(elastic_rendezvous, "_last_round", 4)
        monkeypatch.setattr(elastic_rendezvous, "_round_hosts_event", 0)
        with pytest.raises(TimeoutError, match="after round 4"):
            elastic_rendezvous.join_round(env)
        assert json.loads(json.dumps(driver.ready_rounds("hostC:0"))) == [4]
