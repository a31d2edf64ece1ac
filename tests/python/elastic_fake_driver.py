"""A stand-in for the elastic launcher's side of the rendezvous, for tests where the test
itself plays the driver (docs/elastic.md; the real driver lives in horovodrun).

It is the launcher's rendezvous service (runner/rendezvous.py's request handler, so the core's
``PUT/GET /<scope>/<key>`` and the HMAC signatures work exactly as in a job) plus the three
elastic endpoints of the protocol, served from memory:

    PUT /elastic/ready/<identity>       records the worker's last round
    GET /elastic/assignment/<identity>  404 until the test assigns, then the JSON it set
    GET /elastic/hosts_event            "<timestamp> <kind>" as the test set it

The test forms rounds itself with ``wait_ready`` and ``assign``.
"""

import http.server
import json
import socketserver
import threading
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from horovod_compat.runner import rendezvous


class _ElasticHandler(rendezvous._Handler):  # pylint: disable=protected-access

    def _elastic_target(self) -> Optional[Tuple[str, str]]:
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) >= 2 and parts[0] == "elastic":
            return parts[1], urllib.parse.unquote("/".join(parts[2:]))
        return None

    def do_PUT(self) -> None:  # noqa: N802
        target = self._elastic_target()
        if target is None:
            super().do_PUT()
            return
        body = self._read_body(required=True)
        if body is None or not self._signed(body):
            return
        kind, identity = target
        if kind != "ready" or not identity:
            self._refuse(400, f"unknown elastic PUT {self.path}")
            return
        self.server.driver._ready(identity, int(body.decode()))
        self._reply(200)

    def do_GET(self) -> None:  # noqa: N802
        target = self._elastic_target()
        if target is None:
            super().do_GET()
            return
        body = self._read_body(required=False)
        if body is None or not self._signed(body):
            return
        kind, identity = target
        driver = self.server.driver
        if kind == "hosts_event":
            self._reply(200, driver.hosts_event_text().encode())
        elif kind == "assignment" and identity:
            reply = driver.assignment(identity)
            if reply is None:
                self._reply(404)
            else:
                self._reply(200, json.dumps(reply).encode())
        else:
            self._refuse(400, f"unknown elastic GET {self.path}")


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class FakeDriver:
    """Serves on 127.0.0.1 while used as a context manager."""

    def __init__(self, secret: Optional[bytes] = None) -> None:
        self.secret = secret
        self._lock = threading.Condition()  # guards the three dicts and the event
        self._ready_rounds: Dict[str, List[int]] = {}
        self._assignments: Dict[str, Dict[str, Any]] = {}
        self._hosts_event = (0, 0)
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "FakeDriver":
        self._server = _Server(("127.0.0.1", 0), _ElasticHandler)
        self._server.store = rendezvous.KeyValueStore()  # type: ignore[attr-defined]
        self._server.secret = self.secret  # type: ignore[attr-defined]
        self._server.driver = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def worker_env(self, host: str, local_rank: int) -> Dict[str, str]:
        """What the elastic launcher gives a worker (protocol: worker identity and env)."""
        env = {"HOROVOD_ELASTIC": "1", "HOROVOD_HOSTNAME": host,
               "HOROVOD_LOCAL_RANK": str(local_rank),
               "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
               "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
               "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
        if self.secret is not None:
            env["HOROVOD_SECRET_KEY"] = self.secret.decode()
        return env

    # -- what the handler calls --------------------------------------------------------------

    def _ready(self, identity: str, last_round: int) -> None:
        with self._lock:
            self._ready_rounds.setdefault(identity, []).append(last_round)
            self._lock.notify_all()

    def assignment(self, identity: str) -> Optional[Dict[str, Any]]:
        with self._lock:
            return self._assignments.get(identity)

    def hosts_event_text(self) -> str:
        with self._lock:
            return f"{self._hosts_event[0]} {self._hosts_event[1]}"

    # -- what the test calls -----------------------------------------------------------------

    def ready_rounds(self, identity: str) -> List[int]:
        with self._lock:
            return list(self._ready_rounds.get(identity, []))

    def wait_ready(self, identity: str, last_round: int, timeout: float = 120.0) -> None:
        """Waits until ``identity`` said it is ready after ``last_round``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while last_round not in self._ready_rounds.get(identity, []):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{identity} never became ready after round "
                                       f"{last_round} (saw {self._ready_rounds})")
                self._lock.wait(left)

    def assign(self, identity: str, reply: Dict[str, Any]) -> None:
        with self._lock:
            self._assignments[identity] = dict(reply)

    def form_round(self, round_number: int, identities: List[str]) -> None:
        """Assigns ``identities`` (all on this machine, in rank order) to a round."""
        size = len(identities)
        for rank, identity in enumerate(identities):
            self.assign(identity, {"round": round_number, "rank": rank, "size": size,
                                   "local_rank": rank, "local_size": size, "cross_rank": 0,
                                   "cross_size": 1, "scope": f"elastic-{round_number}"})

    def set_hosts_event(self, timestamp: int, kind: int) -> None:
        with self._lock:
            self._hosts_event = (timestamp, kind)
