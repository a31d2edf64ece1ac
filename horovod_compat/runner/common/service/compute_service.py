"""The compute service of a tf.data service job (``horovod.runner.common.service.compute_service``).

A compute job (``python -m horovod_compat.tensorflow.data.compute_worker``) runs it on its rank
0. Dispatchers (TensorFlow ``DispatchServer``s, on the compute or on the training side) register
their address under an id; the compute job's workers (TensorFlow ``WorkerServer``s) register
for their dispatcher and send heartbeats; training ranks wait until their dispatcher and all its
workers are there; the training side ends the compute job with ``shutdown()``.

Wire: HTTP/1.1 ``POST /<request>`` with a JSON body, signed as the rendezvous service's
requests are (``X-Hvdc-Signature: hex(HMAC-SHA256(key, "POST\\n/<request>\\n" + body))``), so a
client without the job's key is refused (403). Answers are JSON ``{"result": ...}`` or
``{"error": "..."}``. Waits are long polls bounded by the caller's timeout.
"""

import http.client
import http.server
import json
import socket
import socketserver
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from horovod_compat.runner.rendezvous import SIGNATURE_HEADER, sign

#: A registered worker silent for this long (no heartbeat) counts as lost.
WORKER_LOST_AFTER_SECONDS = 5.0
#: How often compute workers send heartbeats.
HEARTBEAT_SECONDS = 1.0
_MAX_BODY = 64 * 1024

Addresses = Mapping[str, Sequence[Tuple[str, int]]]


class ComputeServiceError(RuntimeError):
    """The compute service refused a request, could not be reached, or reports a failure."""


def _interface_addresses(port: int, nics: Optional[Sequence[str]]) -> Dict[str, List[Tuple[str,
                                                                                         int]]]:
    """{interface: [(IPv4 address, port)]} of this machine (loopback last), as clients try
    them; ``nics`` keeps only those interfaces."""
    found: Dict[str, List[Tuple[str, int]]] = {}
    try:
        import psutil
        for name, addresses in psutil.net_if_addrs().items():
            if nics and name not in nics:
                continue
            ips = [a.address for a in addresses if a.family == socket.AF_INET]
            if ips:
                found[name] = [(ip, port) for ip in ips]
    except ImportError:
        found["lo"] = [("127.0.0.1", port)]
    # Loopback last: a remote client tries the routable addresses first.
    return dict(sorted(found.items(), key=lambda item: item[1][0][0].startswith("127.")))


class _State:
    """What the service knows; every field guarded by ``cond``."""

    def __init__(self, dispatchers: int, workers_per_dispatcher: int) -> None:
        self.cond = threading.Condition()
        self.dispatchers: List[Optional[str]] = [None] * dispatchers
        self.workers: List[Set[int]] = [set() for _ in range(dispatchers)]
        self.workers_per_dispatcher = workers_per_dispatcher
        self.last_seen: Dict[int, float] = {}         # worker id -> monotonic time
        self.worker_dispatcher: Dict[int, int] = {}   # worker id -> its dispatcher
        self.gone: Dict[int, str] = {}                # worker id -> why it is lost
        self.shutdown = False

    def check_dispatcher_id(self, dispatcher_id: Any) -> int:
        if not isinstance(dispatcher_id, int) or not 0 <= dispatcher_id < len(self.dispatchers):
            raise IndexError(f"dispatcher id must be within [0..{len(self.dispatchers) - 1}]: "
                             f"{dispatcher_id!r}")
        return dispatcher_id

    def lost(self) -> Dict[int, str]:
        """Workers lost so far (a silent one is marked here, at the first look after it)."""
        now = time.monotonic()
        for worker, seen in self.last_seen.items():
            if worker not in self.gone and now - seen > WORKER_LOST_AFTER_SECONDS:
                self.gone[worker] = (
                    f"compute worker {worker} (of dispatcher {self.worker_dispatcher[worker]}) "
                    f"sent no heartbeat for {now - seen:.0f} s: it died or hangs, and the tf.data "
                    f"service cannot deliver what it was to produce")
        return self.gone

    def wait(self, ready: Any, timeout: float, what: str) -> None:
        """Waits (cond held) until ready() holds; raises on timeout, shutdown or a lost worker."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.shutdown:
                raise ComputeServiceError(f"the compute service shut down while waiting for "
                                          f"{what}")
            lost = self.lost()
            if lost:
                raise ComputeServiceError(next(iter(lost.values())))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what} (raise "
                                   f"TfDataServiceConfig.timeout / compute_worker --timeout "
                                   f"if they need longer to start)")
            self.cond.wait(min(left, 0.5))

    # -- requests (cond held) -----------------------------------------------------------------

    def register_dispatcher(self, dispatcher_id: int, address: str) -> None:
        dispatcher_id = self.check_dispatcher_id(dispatcher_id)
        known = self.dispatchers[dispatcher_id]
        if known is not None and known != address:
            raise ValueError(f"dispatcher {dispatcher_id} is already registered at {known}, "
                             f"not {address}")
        self.dispatchers[dispatcher_id] = address
        self.cond.notify_all()

    def wait_dispatcher(self, dispatcher_id: int, timeout: float) -> str:
        dispatcher_id = self.check_dispatcher_id(dispatcher_id)
        self.wait(lambda: self.dispatchers[dispatcher_id] is not None, timeout,
                  f"dispatcher {dispatcher_id} to register")
        return self.dispatchers[dispatcher_id]

    def register_worker(self, dispatcher_id: int, worker_id: int) -> None:
        dispatcher_id = self.check_dispatcher_id(dispatcher_id)
        self.workers[dispatcher_id].add(int(worker_id))
        self.worker_dispatcher[int(worker_id)] = dispatcher_id
        self.last_seen[int(worker_id)] = time.monotonic()
        self.cond.notify_all()

    def wait_workers(self, dispatcher_id: int, timeout: float) -> None:
        dispatcher_id = self.check_dispatcher_id(dispatcher_id)
        # One dispatcher serves every training rank: they all wait for its workers.
        if len(self.dispatchers) == 1:
            dispatcher_id = 0
        count = self.workers_per_dispatcher
        self.wait(lambda: len(self.workers[dispatcher_id]) >= count, timeout,
                  f"the {count} worker(s) of dispatcher {dispatcher_id} to register "
                  f"({len(self.workers[dispatcher_id])} so far)")

    def heartbeat(self, worker_id: int) -> bool:
        if int(worker_id) in self.last_seen and int(worker_id) not in self.gone:
            self.last_seen[int(worker_id)] = time.monotonic()
        return self.shutdown

    def wait_shutdown(self, timeout: float) -> bool:
        self.cond.wait_for(lambda: self.shutdown, timeout)
        return self.shutdown

    def status(self) -> Dict[str, Any]:
        return {"shutdown": self.shutdown, "lost": sorted(self.lost().values())}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "horovod_compat-compute-service"
    timeout = 30  # a client that connects and sends nothing

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _answer(self, code: int, payload: Dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        try:
            length = int(self.headers.get("Content-Length", "-1"))
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            return self._answer(400, {"error": "bad Content-Length"})
        body = self.rfile.read(length)
        given = self.headers.get(SIGNATURE_HEADER, "")
        want = sign(self.server.key, "POST", self.path, body)  # type: ignore[attr-defined]
        if not given or given.strip() != want:
            client = self.client_address[0] if self.client_address else "?"
            sys.stderr.write(f"compute service: refused {self.path} from {client}: not signed "
                             f"with this compute job's key\n")
            return self._answer(403, {"error": "not signed with this compute job's key"})
        try:
            args = json.loads(body or b"{}")
            result = self.server.dispatch(self.path.strip("/"), args)  # type: ignore
        except (ValueError, IndexError, TypeError, TimeoutError, ComputeServiceError) as error:
            return self._answer(200, {"error": f"{type(error).__name__}: {error}"})
        self._answer(200, {"result": result})

    do_GET = do_PUT = lambda self: self._answer(405, {"error": "POST only"})  # noqa: E731


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, state: _State, key: bytes, port: int) -> None:
        self.state = state
        self.key = key
        super().__init__(("0.0.0.0", port), _Handler)

    def dispatch(self, request: str, args: Dict[str, Any]) -> Any:
        state = self.state
        handlers = {
            "register_dispatcher": lambda: state.register_dispatcher(
                args["dispatcher_id"], str(args["address"])),
            "wait_dispatcher": lambda: state.wait_dispatcher(args["dispatcher_id"],
                                                             float(args["timeout"])),
            "register_worker": lambda: state.register_worker(args["dispatcher_id"],
                                                             args["worker_id"]),
            "wait_workers": lambda: state.wait_workers(args["dispatcher_id"],
                                                       float(args["timeout"])),
            "heartbeat": lambda: state.heartbeat(args["worker_id"]),
            "wait_shutdown": lambda: state.wait_shutdown(float(args.get("timeout", 10))),
            "shutdown": self._shutdown_requested,
            "status": state.status,
        }
        if request not in handlers:
            raise ValueError(f"unknown request {request!r}")
        try:
            with state.cond:
                return handlers[request]()
        except KeyError as missing:
            raise ValueError(f"request {request!r} lacks {missing}") from None

    def _shutdown_requested(self) -> None:
        self.state.shutdown = True
        self.state.cond.notify_all()

    def handle_error(self, request: object, client_address: object) -> None:
        sys.stderr.write(f"compute service: dropped a connection from {client_address}: "
                         f"{sys.exc_info()[1]!r}\n")


class ComputeService:
    """Serves dispatcher and worker registration for ``dispatchers`` dispatchers with
    ``workers_per_dispatcher`` workers each, to clients that hold ``key``. Listens on every
    interface (``nics``: the interfaces whose addresses ``addresses()`` lists) until
    ``shutdown()``."""

    NAME = "compute service"

    def __init__(self, dispatchers: int, workers_per_dispatcher: int, key: bytes,
                 nics: Optional[Sequence[str]] = None) -> None:
        if dispatchers <= 0:
            raise ValueError(f"the number of dispatchers must be larger than 0: {dispatchers}")
        if workers_per_dispatcher <= 0:
            raise ValueError(f"the number of workers per dispatcher must be larger than 0: "
                             f"{workers_per_dispatcher}")
        if not key:
            raise ValueError("the compute service needs a non-empty key")
        self._state = _State(dispatchers, workers_per_dispatcher)
        self._server = _Server(self._state, bytes(key), 0)
        self._nics = list(nics) if nics else None
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name="hvdc-compute-service", daemon=True)
        self._thread.start()
        self._stopped = False

    def addresses(self) -> Dict[str, List[Tuple[str, int]]]:
        """{interface: [(address, port)]} the service can be reached at."""
        return _interface_addresses(self._server.server_address[1], self._nics)

    def shutdown(self) -> None:
        """Tells every waiting client the job is over, then stops serving (idempotent)."""
        with self._state.cond:
            self._state.shutdown = True
            self._state.cond.notify_all()
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class ComputeClient:
    """Talks to a ComputeService at any of ``compute_addresses`` ({interface: [(host, port)]})
    with the job's ``key``. Every method raises ComputeServiceError (or TimeoutError, IndexError,
    ValueError as the service reports them) instead of returning a failure."""

    def __init__(self, compute_addresses: Addresses, key: bytes, verbose: int = 1) -> None:
        self._candidates = [(str(h), int(p)) for addrs in compute_addresses.values()
                            for h, p in addrs]
        if not self._candidates:
            raise ValueError("ComputeClient needs at least one address of the compute service")
        self._key = bytes(key)
        self._verbose = verbose
        self._reachable: Optional[Tuple[str, int]] = None

    def _connect(self, timeout: float) -> Tuple[http.client.HTTPConnection, Tuple[str, int]]:
        order = ([self._reachable] if self._reachable else []) + [
            a for a in self._candidates if a != self._reachable]
        failures = []
        for host, port in order:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                conn.connect()
                self._reachable = (host, port)
                return conn, (host, port)
            except OSError as error:
                conn.close()
                failures.append(f"{host}:{port}: {error.strerror or error}")
        raise ComputeServiceError(f"cannot reach the compute service ({'; '.join(failures)}): "
                                  f"has the compute job ended, or not started yet?")

    def _send(self, request: str, wait: float = 0.0, **args: Any) -> Any:
        body = json.dumps(args).encode()
        path = "/" + request
        conn, (host, port) = self._connect(wait + 30)
        try:
            conn.request("POST", path, body, {SIGNATURE_HEADER: sign(self._key, "POST", path,
                                                                     body),
                                              "Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
        except OSError as error:
            raise ComputeServiceError(f"the compute service at {host}:{port} did not answer "
                                      f"{request}: {error}") from error
        finally:
            conn.close()
        if response.status == 403:
            raise ComputeServiceError(f"the compute service at {host}:{port} refused {request}: "
                                      f"the key differs from the compute job's (use the "
                                      f"TfDataServiceConfig its compute job wrote)")
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = {"error": f"HTTP {response.status}: {payload[:200]!r}"}
        if "error" in answer:
            kind, _, text = answer["error"].partition(": ")
            error_type = {"TimeoutError": TimeoutError, "IndexError": IndexError,
                          "ValueError": ValueError, "TypeError": ValueError}.get(
                              kind, ComputeServiceError)
            raise error_type(text or answer["error"])
        return answer.get("result")

    def local_address(self) -> str:
        """The address of this machine from which it reaches the service (for peers to use)."""
        conn, _ = self._connect(30)
        try:
            return conn.sock.getsockname()[0]
        finally:
            conn.close()

    def register_dispatcher(self, dispatcher_id: int, dispatcher_address: str) -> None:
        self._send("register_dispatcher", dispatcher_id=dispatcher_id,
                   address=dispatcher_address)

    def wait_for_dispatcher_registration(self, dispatcher_id: int, timeout: float) -> str:
        return self._send("wait_dispatcher", wait=timeout, dispatcher_id=dispatcher_id,
                          timeout=timeout)

    def register_worker_for_dispatcher(self, dispatcher_id: int, worker_id: int) -> None:
        self._send("register_worker", dispatcher_id=dispatcher_id, worker_id=worker_id)

    def wait_for_dispatcher_worker_registration(self, dispatcher_id: int,
                                                timeout: float) -> None:
        self._send("wait_workers", wait=timeout, dispatcher_id=dispatcher_id, timeout=timeout)

    def heartbeat(self, worker_id: int) -> bool:
        """Tells the service worker ``worker_id`` is alive; returns whether it shut down."""
        return bool(self._send("heartbeat", worker_id=worker_id))

    def status(self) -> Dict[str, Any]:
        """{"shutdown": bool, "lost": [why each lost worker is lost]}."""
        return self._send("status")

    def shutdown(self) -> None:
        """Ends the compute job: its workers stop once they hear of it."""
        self._send("shutdown")

    def wait_for_shutdown(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the service shuts down (or ``timeout`` seconds pass); returns whether
        it did. A service that went away counts as shut down."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 10.0 if deadline is None else max(0.0, min(10.0, deadline - time.monotonic()))
            try:
                if self._send("wait_shutdown", wait=step, timeout=step):
                    return True
            except ComputeServiceError:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
