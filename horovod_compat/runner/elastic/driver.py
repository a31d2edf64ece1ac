"""The elastic driver: follows the hosts, starts workers for new slots, forms rounds of ranks and
decides when the job has ended (docs/elastic.md, "Rounds").

The workers talk to it through the rendezvous service (``ready``, ``assignment``,
``hosts_event``, on request threads); everything else happens on the thread that calls
``run()``, one step every ``STEP_SECONDS``. One lock guards the whole state.
"""

import collections
import json
import queue
import signal
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from horovod_compat.runner.common.util.hosts import SlotInfo
from horovod_compat.runner.elastic import constants, rounds
from horovod_compat.runner.elastic.blacklist import Blacklist
from horovod_compat.runner.elastic.settings import ElasticSettings, elastic_timeout
from horovod_compat.runner.elastic.workers import Worker, WorkerLauncher, terminate

# Read when used (not imported by value), so tests can patch them, as Horovod's tests do.
DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
ELASTIC_TIMEOUT_SECS = 600

# How often the driver looks at exits, discovery and readiness.
STEP_SECONDS = 0.05

# Horovod's HostUpdateResult values, as hosts_event reports them.
NO_UPDATE, REMOVED, ADDED, MIXED = 0, 1, 2, 3
_KIND_NAMES = {NO_UPDATE: "none", REMOVED: "removed", ADDED: "added", MIXED: "added and removed"}


class JobResult:
    """How the job ended: ``error`` is None on success; ``exit_code`` is what horovodrun exits
    with."""

    def __init__(self, exit_code: int, error: Optional[str] = None) -> None:
        self.exit_code = exit_code
        self.error = error


class _JobOver(Exception):
    def __init__(self, result: JobResult) -> None:
        super().__init__(result.error)
        self.result = result


def _log(text: str) -> None:
    try:
        sys.stderr.write(f"horovodrun: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _Discovery:
    """Runs the discovery on its own thread (a slow script never stalls the driver) and keeps
    the latest answer."""

    def __init__(self, source: object) -> None:
        self._source = source
        self._lock = threading.Lock()  # guards _hosts, _error, _version
        self._hosts: Optional[List[Tuple[str, int]]] = None
        self._error: Optional[str] = None
        self._version = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hvdc-discovery", daemon=True)

    def start(self) -> None:
        self._poll()  # the first answer before anything starts
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def latest(self) -> Tuple[int, Optional[List[Tuple[str, int]]], Optional[str]]:
        with self._lock:
            return self._version, self._hosts, self._error

    def _poll(self) -> None:
        try:
            hosts = self._source.find_available_hosts_and_slots()  # type: ignore[attr-defined]
            error = None
        except (RuntimeError, OSError) as e:
            hosts, error = None, str(e)
        with self._lock:
            if error is not None:
                self._error = error
            else:
                if hosts != self._hosts:
                    self._version += 1
                self._hosts, self._error = hosts, None

    def _loop(self) -> None:
        while not self._stop.wait(DISCOVER_HOSTS_FREQUENCY_SECS):
            self._poll()


class ElasticDriver:
    """Forms the rounds of one elastic job. ``worker_env(slot_info, hosts)`` gives the variables
    of a worker started for ``slot_info`` (its planned place) while ``hosts`` are the job's;
    ``drop_scope`` forgets an old round's rendezvous keys."""

    def __init__(self, settings: ElasticSettings, launcher: WorkerLauncher,
                 worker_env: Callable[[SlotInfo, List[str]], Dict[str, str]],
                 drop_scope: Callable[[str], None] = lambda scope: None) -> None:
        self.settings = settings
        self.launcher = launcher
        self.worker_env = worker_env
        self.drop_scope = drop_scope
        self.timeout = elastic_timeout(settings, ELASTIC_TIMEOUT_SECS)
        self._lock = threading.Lock()  # guards everything below
        self._blacklist = Blacklist(settings.cooldown_range)
        self._discovery = _Discovery(settings.discovery)
        self._seen_version = -1
        self._discovery_error: Optional[str] = None
        self._discovered: List[Tuple[str, int]] = []
        self._order: List[str] = []
        self._slots: Dict[str, int] = {}
        self._workers: Dict[str, Worker] = {}      # identity -> its latest worker
        self._all: List[Worker] = []               # every worker ever started
        self._round = 0
        self._assignments: Dict[str, dict] = {}    # identity -> its assignment in _round
        self._members: List[str] = []              # identities of _round, in rank order
        self._member_workers: Dict[str, Worker] = {}  # identity -> the process in _round
        self._started = False
        self._needed_since: Optional[float] = time.monotonic()  # when the next round was needed
        self._finishing = False
        self._failures: List[Tuple[str, int]] = []
        self._event = (0, NO_UPDATE)               # hosts_event: (timestamp, kind)
        self._notified: Set[str] = set()           # the plan rank 0 last heard of (or formed)
        self._signalled: Optional[int] = None
        # Signals received, handled by the next step: a handler runs on the main thread, which
        # may hold _lock at that moment.
        self._signals: "collections.deque[int]" = collections.deque()

    # -- the workers' requests (rendezvous threads) -----------------------------------------

    def ready(self, identity: str, last_round: int) -> None:
        with self._lock:
            worker = self._workers.get(identity)
            if worker is None or worker.removed or not worker.alive:
                return
            worker.last_round = last_round
            worker.asked = True
            if self._is_member(worker) and last_round >= self._round \
                    and self._needed_since is None and not self._finishing:
                self._needed_since = time.monotonic()

    def assignment(self, identity: str) -> Optional[bytes]:
        with self._lock:
            worker = self._workers.get(identity)
            if worker is None:
                return self._removed(f"{identity} is not a worker of this job")
            if worker.removed:
                return self._removed(worker.removed)
            if self._finishing and not self._is_member(worker):
                return self._removed("the job is over: its workers have finished")
            # A process started again on a slot does not inherit the round of the one before.
            mine = self._assignments.get(identity) if self._is_member(worker) else None
            if mine is None or mine["round"] <= worker.last_round:
                if self._finishing:
                    return self._removed("the job is over: its workers have finished")
                return None
            return json.dumps(mine).encode()

    def hosts_event(self) -> bytes:
        with self._lock:
            return f"{self._event[0]} {self._event[1]}".encode()

    def _is_member(self, worker: Worker) -> bool:
        return self._member_workers.get(worker.identity) is worker

    @staticmethod
    def _removed(reason: str) -> bytes:
        return json.dumps({"removed": True, "reason": reason}).encode()

    # -- running -------------------------------------------------------------------------------

    def forward(self, signum: int) -> None:
        """A signal the launcher received (from a signal handler): the next step passes it on to
        every worker (a second one kills them)."""
        self._signals.append(signum)

    def _forward_signals(self) -> None:
        while self._signals:
            signum = self._signals.popleft()
            if self._signalled is not None:
                signum = signal.SIGKILL
            else:
                self._signalled = signum
                _log(f"got signal {signum}: passing it on to the workers")
            for worker in self._all:
                if worker.alive:
                    worker.signal(signum)

    def run(self) -> JobResult:
        """Runs the job to its end; every worker has exited when this returns."""
        self._discovery.start()
        try:
            while True:
                try:
                    self._step()
                except _JobOver as over:
                    result = over.result
                    break
                time.sleep(STEP_SECONDS)
        finally:
            self._discovery.stop()
            self._end_all()
        if self._signalled is not None:
            return JobResult(128 + int(self._signalled),
                             f"interrupted by signal {int(self._signalled)}")
        return result

    def _step(self) -> None:
        exits = []
        while True:
            try:
                exits.append(self.launcher.exits.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            now = time.monotonic()
            self._forward_signals()
            if self._signalled is not None:
                if not any(w.alive for w in self._all) and not exits:
                    raise _JobOver(JobResult(128 + self._signalled))
                for worker, code in exits:
                    worker.returncode = code
                return
            for worker, code in exits:
                self._on_exit(worker, code, now)
            self._kill_overdue(now)
            self._follow_discovery(now)
            if self._finishing:
                self._check_finished()
                return
            self._check_survivors()
            self._start_workers(now)
            self._maybe_form_round(now)

    def _end_all(self) -> None:
        """Terminates whatever still runs, waits for it (bounded by the kill grace) and collects
        every worker's output."""
        with self._lock:
            alive = [w for w in self._all if w.alive]
            everyone = list(self._all)
        for worker in alive:
            terminate(worker)
        deadline = time.monotonic() + 10
        for worker in alive:
            if worker.proc is None:
                continue
            while worker.proc.poll() is None and time.monotonic() < deadline:
                if worker.kill_at is not None and time.monotonic() >= worker.kill_at:
                    worker.signal(signal.SIGKILL)
                time.sleep(STEP_SECONDS)
            if worker.proc.poll() is None:
                worker.signal(signal.SIGKILL)
                worker.proc.wait()
            worker.returncode = worker.proc.returncode
        for worker in everyone:
            self.launcher.finish(worker)

    # -- exits ---------------------------------------------------------------------------------

    def _on_exit(self, worker: Worker, code: int, now: float) -> None:
        worker.returncode = code
        self.launcher.close_input(worker)
        if worker.removed:
            return  # out of the job already: however it ends does not matter
        member = self._is_member(worker)
        if code == 0:
            if member:
                if not self._finishing:
                    _log(f"worker {worker.identity} finished: waiting for the others of round "
                         f"{self._round}")
                self._finishing = True
            return
        if self._finishing and not member:
            return  # started for a round that will not come
        self._failures.append((f"{worker.host}[{worker.slot}]", _exit_code(code)))
        if self._finishing:
            self._fail_with_worker_error()
        _log(f"worker {worker.identity} exited with code {_exit_code(code)}")
        self._blacklist_host(worker.host, f"a worker on {worker.host} failed")
        if member and self._needed_since is None:
            self._needed_since = now

    def _blacklist_host(self, host: str, why: str) -> None:
        cooldown = self._blacklist.add(host)
        _log(f"blacklisted host {host} ({why})"
             + ("" if cooldown is None else f" for {cooldown:.0f} s"))
        for other in self._all:
            if other.host == host and other.alive and not other.removed:
                other.removed = f"host {host} was blacklisted after a worker on it failed"
                terminate(other)

    def _kill_overdue(self, now: float) -> None:
        for worker in self._all:
            if worker.alive and worker.kill_at is not None and now >= worker.kill_at:
                worker.signal(signal.SIGKILL)

    def _check_survivors(self) -> None:
        """After a failure with no worker of the last round left, the state is lost; with no
        worker left at all (before the first round: every one failed), nothing would ever come
        back. Either way: end now, as Horovod does, rather than after the timeout."""
        if not self._failures:
            return
        if not any(w.alive and not w.removed for w in self._all):
            self._fail_with_worker_error()
        if self._members and \
                not any(w.alive and not w.removed for w in self._member_workers.values()):
            self._fail_with_worker_error()

    def _check_finished(self) -> None:
        staying = [w for w in self._member_workers.values() if not w.removed]
        if any(w.alive for w in staying):
            return
        if all(w.returncode == 0 for w in staying):
            raise _JobOver(JobResult(0))
        self._fail_with_worker_error()

    def _fail_with_worker_error(self, prefix: str = "") -> None:
        name, code = self._failures[0] if self._failures else ("?", 1)
        raise _JobOver(JobResult(1, prefix + constants.WORKER_FAILED_MESSAGE.format(
            name=name, code=code)))

    def _fail(self, message: str) -> None:
        if self._failures:
            self._fail_with_worker_error(message + "\n")
        raise _JobOver(JobResult(1, message))

    # -- hosts -----------------------------------------------------------------------------------

    def _follow_discovery(self, now: float) -> None:
        version, hosts, error = self._discovery.latest()
        if hosts is None:
            # The first run of the script failed: a misconfiguration, not a transient error.
            self._fail(error or "host discovery returned nothing")
        if error is not None and error != self._discovery_error:
            _log(f"host discovery failed, keeping the last hosts: {error}")
        self._discovery_error = error
        if version != self._seen_version:
            self._seen_version = version
            self._discovered = list(hosts)
        usable = [h for h, _ in self._discovered if not self._blacklist.blocked(h)]
        self._slots = {h: s for h, s in self._discovered if h in usable}
        self._order = rounds.update_host_order(self._order, usable)
        for worker in self._all:
            if worker.alive and not worker.removed \
                    and worker.slot >= self._slots.get(worker.host, 0):
                worker.removed = f"host {worker.host} slot {worker.slot} is no longer available"
                _log(f"worker {worker.identity} leaves the job: {worker.removed}")
                if not self._is_member(worker):
                    terminate(worker)
        self._notify_rank0()

    def _plan(self) -> List[rounds.Slot]:
        occupied = {(w.host, w.slot) for w in self._workers.values()
                    if w.alive and not w.removed}
        return rounds.plan_slots(self._order, self._slots, occupied, self.settings.max_num_proc)

    def _notify_rank0(self) -> None:
        """Bumps hosts_event when the slots the next round would use differ from the ones rank 0
        last knew of. Not while a round is needed: the workers are coming back anyway, and a
        failed worker's loss reaches every rank as an error."""
        if not self._members or self._needed_since is not None:
            return
        plan = {f"{h}:{s}" for h, s in self._plan()}
        added = plan - self._notified
        removed = (self._notified & set(self._members)) - plan
        self._notified = plan
        if not added and not removed:
            return  # only slots rank 0 never used went away
        kind = (ADDED if added else NO_UPDATE) | (REMOVED if removed else NO_UPDATE)
        # Strictly increasing, and Horovod-like (seconds since the epoch) when updates are rare.
        stamp = max(self._event[0] + 1, int(time.time()))
        # Updates since the round formed add up: rank 0 may read only the last one.
        self._event = (stamp, self._event[1] | kind)
        _log(f"hosts changed ({_KIND_NAMES[self._event[1]]}): rank 0 will be told at its next "
             f"check")

    def _start_workers(self, now: float) -> None:
        if not self._started:
            available = sum(self._slots.values())
            hosts = len(self._slots)
            from horovod_compat.runner import gloo_run  # imports this module: not at the top
            if available < self.settings.num_proc \
                    or hosts < gloo_run._get_min_start_hosts(self.settings):
                self._check_min_slots_timeout(now, self.settings.num_proc)
                return
            self._started = True
        plan = self._plan()
        planned_info = rounds.assign(plan, self._round + 1)
        for host, slot in plan:
            identity = f"{host}:{slot}"
            current = self._workers.get(identity)
            if current is not None and (current.alive or current.returncode == 0):
                continue  # a worker that finished is not replaced
            a = planned_info[identity]
            info = SlotInfo(hostname=host, rank=a["rank"], local_rank=slot,
                            cross_rank=a["cross_rank"], size=a["size"],
                            local_size=a["local_size"], cross_size=a["cross_size"])
            worker = Worker(host, slot, a["rank"])
            self._workers[identity] = worker
            self._all.append(worker)
            try:
                env = self.worker_env(info, list(self._order))
            except ValueError as error:  # e.g. a discovered host that does not resolve
                _log(f"cannot start worker {worker.identity}: {error}")
                self.launcher.exits.put((worker, 127))
                continue
            self.launcher.start(worker, env)

    # -- rounds ----------------------------------------------------------------------------------

    def _check_min_slots_timeout(self, now: float, needed: int) -> None:
        if self._needed_since is not None and now - self._needed_since > self.timeout:
            message = constants.MIN_SLOTS_TIMEOUT_MESSAGE.format(min_np=needed).format(
                activity=constants.MIN_SLOTS_ACTIVITY)
            self._fail(f"{message} Timeout after {self.timeout:g} seconds.")

    def _maybe_form_round(self, now: float) -> None:
        if self._needed_since is None or not self._started:
            return
        next_round = self._round + 1
        limit = self.settings.reset_limit
        if limit is not None and next_round - 1 > limit:
            self._fail(constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(limit))
        planned = [self._workers.get(f"{h}:{s}") for h, s in self._plan()]
        expected = [w for w in planned if w is not None and w.alive and not w.removed]
        min_np = self.settings.min_num_proc
        if len(expected) < min_np:
            # Waiting for workers would not help: wait for discovery to bring slots.
            self._check_min_slots_timeout(now, min_np)
            return
        waiting = [w for w in expected if not w.asked]
        for worker in waiting:
            if now - max(self._needed_since, worker.started) > self.timeout:
                _log(f"worker {worker.identity} was not ready for round {next_round} within "
                     f"{self.timeout:g} s: dropping it")
                terminate(worker)
                self._failures.append((f"{worker.host}[{worker.slot}]", 1))
                worker.removed = f"not ready for round {next_round} within {self.timeout:g} s"
                self._blacklist_host(worker.host, f"worker {worker.identity} was stuck")
                return  # the plan changed: look again at the next step
        if waiting:
            return
        members = [(w.host, w.slot) for w in expected]
        if self._members and not {h for h, _ in members} & \
                {w.host for w in self._member_workers.values()}:
            self._fail(constants.NO_PREVIOUS_HOSTS_MESSAGE)
        self._form(next_round, members)

    def _form(self, number: int, members: List[rounds.Slot]) -> None:
        self._round = number
        self._assignments = rounds.assign(members, number)
        for mine in self._assignments.values():
            # Beyond the protocol's fields: hosts_event's timestamp when the round formed, the
            # baseline against which rank 0 may judge later updates (Horovod drops the host
            # messages it received before a reset).
            mine["hosts_event"] = self._event[0]
        self._members = [f"{h}:{s}" for h, s in members]
        self._member_workers = {i: self._workers[i] for i in self._members}
        for worker in self._member_workers.values():
            worker.asked = False
        self._needed_since = None
        self._notified = set(self._members)
        if self._event[1] != NO_UPDATE:
            # Rank 0 compares timestamps; a kind left from before this round must not add up.
            self._event = (self._event[0], NO_UPDATE)
        for worker in self._all:
            if worker.alive and worker.removed:
                terminate(worker)
        if number > 2:
            self.drop_scope(rounds.scope(number - 2))
        hosts = ",".join(dict.fromkeys(h for h, _ in members))
        _log(f"round {number}: {len(members)} workers on {hosts}")


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
