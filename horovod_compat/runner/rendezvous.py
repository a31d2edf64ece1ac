"""The rendezvous service of ``horovodrun --gloo``: a small HTTP/1.1 key-value store.

Every rank of a TCP job registers the address it listens on and looks up the others'
(docs/tcp.md):

    PUT /<scope>/<key>   body = value          -> 200
    GET /<scope>/<key>                         -> 200 with the value, 404 while it is absent

Each request is answered on its own thread and the connection is closed after the answer.

In an elastic job (docs/elastic.md) the launcher's driver also answers, under ``/elastic/``:

    PUT /elastic/ready/<host>:<slot>      body = last round   -> 200
    GET /elastic/assignment/<host>:<slot>                     -> 200 with JSON, 404 while none
    GET /elastic/hosts_event                                  -> 200 "<timestamp> <kind>"

With a secret (``horovodrun --gloo`` makes one per job and gives it to the ranks as
``HOROVOD_SECRET_KEY``), every request must carry the header

    X-Hvdc-Signature: hex(HMAC-SHA256(secret, method + "\n" + path + "\n" + body))

and a request without it, or with a wrong one, is answered 403 and logged. Malformed, oversized
and truncated requests are answered 4xx and logged; none of them stops the service.
"""

import hashlib
import hmac
import http.server
import os
import socket
import socketserver
import sys
import threading
import urllib.parse
from typing import Dict, Optional, Protocol, Tuple, Union

#: The variable that carries a job's secret to its ranks (never printed).
SECRET_ENV = "HOROVOD_SECRET_KEY"
#: The request header that carries the signature.
SIGNATURE_HEADER = "X-Hvdc-Signature"

# Values are short ("host:port"); anything much larger is a stray client, not a rank.
MAX_VALUE_BYTES = 64 * 1024

#: The path prefix of the elastic driver's endpoints (the scope "elastic" is theirs).
ELASTIC_PREFIX = "/elastic/"


class ElasticEndpoints(Protocol):
    """What the elastic driver answers (runner/elastic/driver.py); called on request threads."""

    def ready(self, identity: str, last_round: int) -> None: ...

    def assignment(self, identity: str) -> Optional[bytes]: ...

    def hosts_event(self) -> bytes: ...


def sign(secret: bytes, method: str, path: str, body: bytes = b"") -> str:
    """The signature of one request (hex HMAC-SHA256 of method, path and body)."""
    message = method.encode() + b"\n" + path.encode("latin-1") + b"\n" + body
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _log(text: str) -> None:
    try:
        sys.stderr.write(f"horovodrun: rendezvous service: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _shown(text: str, limit: int = 80) -> str:
    """``text`` safe to log: printable, and short."""
    text = text.encode("ascii", "backslashreplace").decode()
    return text if len(text) <= limit else text[:limit] + "..."


class KeyValueStore:
    """A thread-safe map from (scope, key) to bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _values
        self._values: Dict[Tuple[str, str], bytes] = {}

    def put(self, scope: str, key: str, value: bytes) -> None:
        with self._lock:
            self._values[(scope, key)] = value

    def get(self, scope: str, key: str) -> Optional[bytes]:
        with self._lock:
            return self._values.get((scope, key))

    def keys(self, scope: str) -> list:
        with self._lock:
            return sorted(k for s, k in self._values if s == scope)

    def drop_scope(self, scope: str) -> None:
        """Forgets every key of ``scope`` (an elastic round's, once no worker reads it)."""
        with self._lock:
            for key in [k for k in self._values if k[0] == scope]:
                del self._values[key]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "horovod_compat-rendezvous"
    # A client that connects and sends nothing must not hold a thread forever.
    timeout = 30
    # Every answer, even to a garbage request line, starts with an HTTP/1.1 status line (the
    # default would answer an unparsable line HTTP/0.9-style, with a bare body).
    default_request_version = "HTTP/1.1"
    error_content_type = "text/plain"
    error_message_format = "%(code)d %(message)s: %(explain)s\n"

    @property
    def store(self) -> KeyValueStore:
        return self.server.store  # type: ignore[attr-defined]

    def _refuse(self, code: int, why: str) -> None:
        """Answers ``code`` and logs why (who asked, for what)."""
        client = self.client_address[0] if self.client_address else "?"
        _log(f"refused {_shown(self.command or '?')} {_shown(self.path or '?')} from {client} "
             f"({code}): {why}")
        self._reply(code, (why + "\n").encode())

    def _scope_and_key(self) -> Optional[Tuple[str, str]]:
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 2 or not all(parts):
            self._refuse(400, f"expected /<scope>/<key>, got {_shown(self.path)}")
            return None
        return parts[0], parts[1]

    def _signed(self, body: bytes) -> bool:
        """Whether the request proves the job's secret (always, when the service has none);
        answers 403 when not."""
        secret = self.server.secret  # type: ignore[attr-defined]
        if secret is None:
            return True
        given = self.headers.get(SIGNATURE_HEADER)
        if given is None:
            self._refuse(403, f"unsigned request (no {SIGNATURE_HEADER} header): this job's "
                              f"service wants requests signed with its {SECRET_ENV}")
            return False
        want = sign(secret, self.command, self.path, body)
        if not hmac.compare_digest(want.encode(), given.strip().encode("latin-1")):
            self._refuse(403, f"wrong signature: the request was not signed with this job's "
                              f"{SECRET_ENV}")
            return False
        return True

    def _read_body(self, required: bool) -> Optional[bytes]:
        """The request's body (bounded); None after answering an error."""
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            if required:
                self._refuse(411, "Content-Length required")
                return None
            return b""
        try:
            length = int(length_text)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_VALUE_BYTES:
            self._refuse(413, f"Content-Length {_shown(length_text)}: a value must be "
                              f"0..{MAX_VALUE_BYTES} bytes")
            return None
        value = self.rfile.read(length)
        if len(value) != length:
            self._refuse(400, f"truncated body ({len(value)} of {length} bytes)")
            return None
        return value

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True

    def _elastic(self, body: bytes) -> None:
        """Answers a signed request under /elastic/ from the driver, or 404 without one."""
        endpoints: Optional[ElasticEndpoints] = self.server.elastic  # type: ignore[attr-defined]
        parts = self.path.split("?", 1)[0][len(ELASTIC_PREFIX):].split("/")
        if endpoints is None:
            self._reply(404)
            return
        if self.command == "PUT" and len(parts) == 2 and parts[0] == "ready" and parts[1]:
            try:
                last_round = int(body.decode().strip())
            except (UnicodeDecodeError, ValueError):
                self._refuse(400, f"the ready body must be a round number, got "
                                  f"{_shown(repr(body))}")
                return
            endpoints.ready(urllib.parse.unquote(parts[1]), last_round)
            self._reply(200)
        elif self.command == "GET" and len(parts) == 2 and parts[0] == "assignment" and parts[1]:
            answer = endpoints.assignment(urllib.parse.unquote(parts[1]))
            if answer is None:
                self._reply(404)
            else:
                self._reply(200, answer)
        elif self.command == "GET" and parts == ["hosts_event"]:
            self._reply(200, endpoints.hosts_event())
        else:
            self._refuse(400, f"no elastic endpoint {self.command} {_shown(self.path)}")

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.startswith(ELASTIC_PREFIX):
            body = self._read_body(required=True)
            if body is not None and self._signed(body):
                self._elastic(body)
            return
        target = self._scope_and_key()
        if target is None:
            return
        value = self._read_body(required=True)
        if value is None or not self._signed(value):
            return
        self.store.put(target[0], target[1], value)
        self._reply(200)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith(ELASTIC_PREFIX):
            body = self._read_body(required=False)
            if body is not None and self._signed(body):
                self._elastic(body)
            return
        target = self._scope_and_key()
        if target is None:
            return
        body = self._read_body(required=False)
        if body is None or not self._signed(body):
            return
        value = self.store.get(*target)
        if value is None:
            self._reply(404)
        else:
            self._reply(200, value)

    def _not_allowed(self) -> None:
        self._refuse(405, "only GET and PUT")

    do_POST = do_DELETE = do_HEAD = _not_allowed  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        # Ranks poll with GET until everyone registered: logging each request would flood the
        # launcher's output (refusals are logged by _refuse and log_error).
        pass

    def log_error(self, format: str, *args: object) -> None:  # noqa: A002
        # http.server's own refusals: a malformed request line or headers, a client too slow.
        client = self.client_address[0] if self.client_address else "?"
        _log(f"refused a request from {client}: {_shown(format % args, 200)}")


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Every rank of a large job may connect at once.
    request_queue_size = 1024

    def __init__(self, address: Tuple[str, int], store: KeyValueStore,
                 secret: Optional[bytes], elastic: Optional[ElasticEndpoints] = None) -> None:
        self.store = store
        self.secret = secret
        self.elastic = elastic
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that misbehaves (resets the connection mid-request...): one line, no
        # traceback, and the service goes on.
        error = sys.exc_info()[1]
        _log(f"dropped a connection from {client_address}: {_shown(repr(error), 200)}")


class RendezvousServer:
    """Runs the key-value store on ``host`` (an address of this machine) and an ephemeral port
    (or ``port``) in a background thread between ``start()`` and ``stop()``. With ``secret``,
    only requests signed with it are served (403 otherwise). With ``elastic``, the requests under
    ``/elastic/`` go to it (an elastic job's driver); without, they are answered 404."""

    def __init__(self, secret: Union[bytes, str, None] = None,
                 elastic: Optional[ElasticEndpoints] = None) -> None:
        if isinstance(secret, str):
            secret = os.fsencode(secret)
        if secret is not None and not secret:
            raise ValueError("the rendezvous secret must not be empty")
        self.secret: Optional[bytes] = secret
        self.store = KeyValueStore()
        self.elastic = elastic
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    def start(self, host: str = "127.0.0.1", port: int = 0) -> Tuple[str, int]:
        """Binds and starts serving; returns the bound (address, port)."""
        if self._server is not None:
            raise RuntimeError("the rendezvous service is already running")
        try:
            self._server = _Server((host, port), self.store, self.secret, self.elastic)
        except OSError as error:
            raise RuntimeError(f"cannot start the rendezvous service on {host}:{port}: "
                               f"{error.strerror or error}") from error
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name="hvdc-rendezvous", daemon=True)
        self._thread.start()
        return self.address

    @property
    def address(self) -> Tuple[str, int]:
        if self._server is None:
            raise RuntimeError("the rendezvous service is not running")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        """Stops serving and closes the listening socket (harmless when not running)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
        self._thread = None

    def __enter__(self) -> "RendezvousServer":
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Optional[list] = None) -> None:
    """``python -m horovod_compat.runner.rendezvous [--host H] [--port P]``: serves until
    interrupted, for ranks started by another launcher with Horovod's Gloo variables. When
    ``HOROVOD_SECRET_KEY`` is set in its environment, only requests signed with it are served
    (give the ranks the same variable); without it, any request is (a warning says so)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m horovod_compat.runner.rendezvous",
                                     description="Run the rendezvous service of a TCP job.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: an ephemeral one)")
    args = parser.parse_args(argv)
    secret = os.environb.get(SECRET_ENV.encode()) or None
    if secret is None:
        _log(f"{SECRET_ENV} is not set: requests are not authenticated (any process that can "
             f"reach {args.host} may register)")
    server = RendezvousServer(secret)
    # The handlers first: a caller may signal as soon as the address is printed.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        host, port = server.start(args.host, args.port)
    except RuntimeError as error:
        parser.exit(2, f"{error}\n")
    print(f"HOROVOD_GLOO_RENDEZVOUS_ADDR={host} HOROVOD_GLOO_RENDEZVOUS_PORT={port}", flush=True)
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
