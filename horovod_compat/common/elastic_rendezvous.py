"""The worker's side of the elastic launcher's rendezvous (docs/elastic.md).

An elastic worker (``HOROVOD_ELASTIC=1``, started by ``horovodrun`` in elastic mode) does not
trust the rank and size it was started with: at every ``init()`` it tells the launcher it is
ready for a round newer than the last one it belonged to, waits for its assignment in that round
and writes it into ``os.environ`` (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...,
``HVDC_TCP_RENDEZVOUS_SCOPE``) for the core's TCP transport to read. Rank 0 also asks the
launcher here whether hosts changed since the round formed (``hosts_event``).

The requests go to the launcher's HTTP rendezvous service (``runner/rendezvous.py``) and are
signed with the job's secret the same way the core signs its own:

    PUT /elastic/ready/<identity>        body "<last_round>"
    GET /elastic/assignment/<identity>   404 until a newer round includes this worker; then JSON
    GET /elastic/hosts_event             "<timestamp> <kind>"

where ``<identity>`` is ``HOROVOD_HOSTNAME:HOROVOD_LOCAL_RANK``, fixed for the process's life.
"""

import http.client
import json
import os
import threading
import time
import urllib.parse
from typing import Dict, Mapping, MutableMapping, NamedTuple, Optional, Tuple

from horovod_compat.runner.rendezvous import SECRET_ENV, SIGNATURE_HEADER, sign

#: How long ``init()`` waits for an assignment unless HOROVOD_ELASTIC_TIMEOUT says otherwise.
DEFAULT_TIMEOUT_SECONDS = 600.0
POLL_SECONDS = 0.05
# One request must not wait long on a launcher that stopped answering; polling retries.
REQUEST_TIMEOUT_SECONDS = 30.0
#: How often rank 0's watcher asks the launcher for host changes (the launcher itself runs the
#: discovery script about once a second).
HOSTS_EVENT_POLL_SECONDS = 0.25
STOP_WAIT_SECONDS = 1.0

#: The variables an assignment sets, from its JSON keys.
ASSIGNMENT_VARIABLES = (("rank", "HOROVOD_RANK"), ("size", "HOROVOD_SIZE"),
                        ("local_rank", "HOROVOD_LOCAL_RANK"),
                        ("local_size", "HOROVOD_LOCAL_SIZE"),
                        ("cross_rank", "HOROVOD_CROSS_RANK"),
                        ("cross_size", "HOROVOD_CROSS_SIZE"))
SCOPE_VARIABLE = "HVDC_TCP_RENDEZVOUS_SCOPE"
# The identity as the launcher started the worker: an assignment rewrites HOROVOD_LOCAL_RANK
# (slots are renumbered when a host's other workers leave), the identity stays.
IDENTITY_VARIABLE = "HVDC_ELASTIC_IDENTITY"


class WorkerRemovedError(RuntimeError):
    """The launcher no longer counts this worker in the job (its host was removed or
    blacklisted, or the job is over). Not a ``HorovodInternalError``: retrying cannot help."""


class Assignment(NamedTuple):
    """This worker's place in one round."""
    round: int
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    scope: str


def configured(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a worker of an elastic launch: HOROVOD_ELASTIC=1 and the
    launcher's rendezvous service named. (HOROVOD_ELASTIC=1 alone, under mpirun for example,
    keeps the static init.)"""
    return (env.get("HOROVOD_ELASTIC", "0") == "1"
            and bool(env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"))
            and bool(env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")))


def _timeout(env: Mapping[str, str]) -> float:
    text = env.get("HOROVOD_ELASTIC_TIMEOUT", "")
    if not text.strip():
        return DEFAULT_TIMEOUT_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"HOROVOD_ELASTIC_TIMEOUT={text!r}: expected a number of seconds")
    if value <= 0:
        raise ValueError(f"HOROVOD_ELASTIC_TIMEOUT={text!r}: must be positive")
    return value


class RendezvousClient:
    """Signed requests to the launcher's rendezvous service for the worker ``identity``."""

    def __init__(self, host: str, port: int, identity: str, secret: Optional[bytes],
                 timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.host = host
        self.port = port
        self.identity = identity
        self.secret = secret
        self.timeout = timeout

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "RendezvousClient":
        identity = env.get(IDENTITY_VARIABLE)
        if not identity:
            missing = [name for name in ("HOROVOD_HOSTNAME", "HOROVOD_LOCAL_RANK")
                       if not env.get(name)]
            if missing:
                raise RuntimeError(f"elastic worker: {' and '.join(missing)} not set; an "
                                   "elastic worker is started by horovodrun in elastic mode, "
                                   "which sets it")
            identity = f"{env['HOROVOD_HOSTNAME']}:{env['HOROVOD_LOCAL_RANK']}"
        secret_text = env.get(SECRET_ENV)
        secret = os.fsencode(secret_text) if secret_text else None
        return cls(env["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                   int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]), identity, secret, _timeout(env))

    def _path(self, *parts: str) -> str:
        return "/" + "/".join(urllib.parse.quote(p, safe=":@") for p in parts)

    def request(self, method: str, path: str, body: bytes = b"") -> Tuple[int, bytes]:
        """(status, body) of one request; raises OSError when the service cannot be reached."""
        headers: Dict[str, str] = {"Content-Length": str(len(body)), "Connection": "close"}
        if self.secret is not None:
            headers[SIGNATURE_HEADER] = sign(self.secret, method, path, body)
        connection = http.client.HTTPConnection(self.host, self.port,
                                                timeout=REQUEST_TIMEOUT_SECONDS)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def _where(self) -> str:
        return f"the elastic rendezvous at {self.host}:{self.port}"

    def ready(self, last_round: int) -> None:
        """Tells the launcher this worker is alive and waits for a round after ``last_round``."""
        status, body = self.request("PUT", self._path("elastic", "ready", self.identity),
                                    str(last_round).encode())
        if status != 200:
            raise RuntimeError(f"{self._where()} refused worker {self.identity}'s ready "
                               f"(HTTP {status}): {body.decode(errors='replace').strip()}")

    def wait_assignment(self, last_round: int) -> Tuple[Assignment, int]:
        """Polls until the launcher places this worker in a round newer than ``last_round``
        (at most the elastic timeout); returns the assignment and the hosts_event timestamp
        the round formed at (0 when the launcher does not say). Raises ``WorkerRemovedError``
        when it removed the worker instead, ``TimeoutError`` past the timeout."""
        path = self._path("elastic", "assignment", self.identity)
        deadline = time.monotonic() + self.timeout
        unreachable: Optional[OSError] = None
        while True:
            try:
                status, body = self.request("GET", path)
                unreachable = None
            except OSError as error:  # the launcher may be busy; it is bounded by the deadline
                status, body, unreachable = 0, b"", error
            if status == 200:
                reply = json.loads(body.decode())
                if reply.get("removed"):
                    raise WorkerRemovedError(
                        f"elastic worker {self.identity} was removed from the job by the "
                        f"launcher: {reply.get('reason') or 'no reason given'}")
                assignment = _parse_assignment(reply)
                if assignment.round > last_round:
                    return assignment, int(reply.get("hosts_event", 0) or 0)
            elif status not in (0, 404):
                raise RuntimeError(f"{self._where()} answered HTTP {status} to worker "
                                   f"{self.identity}: {body.decode(errors='replace').strip()}")
            if time.monotonic() >= deadline:
                why = f" (last error: {unreachable})" if unreachable else ""
                raise TimeoutError(
                    f"elastic worker {self.identity}: no assignment to a round after round "
                    f"{last_round} from {self._where()} within {self.timeout:g} s "
                    f"(HOROVOD_ELASTIC_TIMEOUT){why}")
            time.sleep(POLL_SECONDS)

    def hosts_event(self) -> Tuple[int, int]:
        """(timestamp, kind) of the launcher's latest host change (0, 0 when none)."""
        status, body = self.request("GET", self._path("elastic", "hosts_event"))
        if status != 200:
            raise RuntimeError(f"{self._where()} answered HTTP {status} to the host-update "
                               f"check: {body.decode(errors='replace').strip()}")
        timestamp, kind = body.decode().split()
        return int(timestamp), int(kind)


def _parse_assignment(reply: Mapping[str, object]) -> Assignment:
    try:
        return Assignment(round=int(reply["round"]),  # type: ignore[arg-type]
                          scope=str(reply["scope"]),
                          **{key: int(reply[key])  # type: ignore[arg-type]
                             for key, _ in ASSIGNMENT_VARIABLES})
    except (KeyError, TypeError, ValueError) as error:
        raise RuntimeError(f"malformed elastic assignment {dict(reply)!r}: {error}") from None


# The round this process last belonged to (-1 before its first init()); kept across
# shutdown()/init() so every init asks for a newer round.
_last_round = -1
# hosts_event's timestamp when that round formed, when the launcher says (an assignment's
# optional "hosts_event"): host changes up to it are in the round already.
_round_hosts_event = 0


def last_round() -> int:
    return _last_round


def round_hosts_event() -> int:
    """The hosts_event timestamp the current round already accounts for (0 when unknown)."""
    return _round_hosts_event


def join_round(env: MutableMapping[str, str] = os.environ,
               client: Optional[RendezvousClient] = None) -> Assignment:
    """Ready, then the assignment to the next round, written into ``env`` for the core."""
    global _last_round, _round_hosts_event
    stop_hosts_event_watch()  # this process may not be rank 0 of the next round
    client = client or RendezvousClient.from_env(env)
    env.setdefault(IDENTITY_VARIABLE, client.identity)
    client.ready(_last_round)
    assignment, formed_at = client.wait_assignment(_last_round)
    for key, name in ASSIGNMENT_VARIABLES:
        env[name] = str(getattr(assignment, key))
    env[SCOPE_VARIABLE] = assignment.scope
    _last_round = assignment.round
    _round_hosts_event = formed_at
    return assignment


class HostsEventWatch:
    """The launcher's latest host change as rank 0 last heard it: asked once at the start, then
    every ``period`` seconds by a daemon thread, so that a commit reads it without a request of
    its own (a request per commit held every rank in the commit's broadcast for rank 0's round
    trip). An update reaches rank 0 at most ``period`` seconds after the launcher raised it."""

    def __init__(self, client: RendezvousClient,
                 period: float = HOSTS_EVENT_POLL_SECONDS) -> None:
        self._client, self._period = client, period
        self._lock = threading.Lock()
        self._value = client.hosts_event()  # the first answer, or the error, before any commit
        self._error: Optional[Exception] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hvdc-hosts-event", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                value = self._client.hosts_event()
            except (OSError, RuntimeError, ValueError) as error:
                with self._lock:
                    self._error = error
                continue
            with self._lock:
                self._value, self._error = value, None

    def latest(self) -> Tuple[int, int]:
        """(timestamp, kind); raises the last request's error while the launcher fails to
        answer."""
        with self._lock:
            if self._error is not None:
                raise self._error
            return self._value

    def stop(self) -> None:
        """Ends the thread. Waits a second at most: a request under way when the process exits
        (this runs from ``shutdown()``, also at exit) must not hold the exit for the request's
        timeout -- once seen, 30 s at a job's end. A thread still in a request ends with it, or
        with the process (it is a daemon)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=STOP_WAIT_SECONDS)


_watch: Optional[HostsEventWatch] = None
_watch_lock = threading.Lock()


def watched_hosts_event(env: Mapping[str, str] = os.environ) -> Tuple[int, int]:
    """``hosts_event`` for rank 0's commits, through a ``HostsEventWatch`` started at the first
    call and stopped at the next ``join_round`` (or ``stop_hosts_event_watch``)."""
    global _watch
    with _watch_lock:
        if _watch is None:
            _watch = HostsEventWatch(RendezvousClient.from_env(env))
        watch = _watch
    return watch.latest()


def stop_hosts_event_watch() -> None:
    global _watch
    with _watch_lock:
        watch, _watch = _watch, None
    if watch is not None:
        watch.stop()
