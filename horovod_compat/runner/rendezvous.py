"""The rendezvous service of ``horovodrun --gloo``: a small HTTP/1.1 key-value store.

Every rank of a TCP job registers the address it listens on and looks up the others'
(docs/tcp.md):

    PUT /<scope>/<key>   body = value          -> 200
    GET /<scope>/<key>                         -> 200 with the value, 404 while it is absent

Each request is answered on its own thread and the connection is closed after the answer.
"""

import http.server
import socket
import socketserver
import threading
from typing import Dict, Optional, Tuple

# Values are short ("host:port"); anything much larger is a stray client, not a rank.
MAX_VALUE_BYTES = 64 * 1024


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


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "horovod_compat-rendezvous"
    # A client that connects and sends nothing must not hold a thread forever.
    timeout = 30

    @property
    def store(self) -> KeyValueStore:
        return self.server.store  # type: ignore[attr-defined]

    def _scope_and_key(self) -> Optional[Tuple[str, str]]:
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 2 or not all(parts):
            self._reply(400, f"expected /<scope>/<key>, got {self.path}\n".encode())
            return None
        return parts[0], parts[1]

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        target = self._scope_and_key()
        if target is None:
            return
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._reply(411, b"Content-Length required\n")
            return
        try:
            length = int(length_text)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_VALUE_BYTES:
            self._reply(413, f"value must be 0..{MAX_VALUE_BYTES} bytes\n".encode())
            return
        value = self.rfile.read(length)
        if len(value) != length:
            self._reply(400, b"truncated body\n")
            return
        self.store.put(target[0], target[1], value)
        self._reply(200)

    def do_GET(self) -> None:  # noqa: N802
        target = self._scope_and_key()
        if target is None:
            return
        value = self.store.get(*target)
        if value is None:
            self._reply(404)
        else:
            self._reply(200, value)

    def _not_allowed(self) -> None:
        self._reply(405, b"only GET and PUT\n")

    do_POST = do_DELETE = do_HEAD = _not_allowed  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        # Ranks poll with GET until everyone registered: logging each request would flood the
        # launcher's output.
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Every rank of a large job may connect at once.
    request_queue_size = 1024

    def __init__(self, address: Tuple[str, int], store: KeyValueStore) -> None:
        self.store = store
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)


class RendezvousServer:
    """Runs the key-value store on ``host`` (an address of this machine) and an ephemeral port
    (or ``port``) in a background thread between ``start()`` and ``stop()``."""

    def __init__(self) -> None:
        self.store = KeyValueStore()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    def start(self, host: str = "127.0.0.1", port: int = 0) -> Tuple[str, int]:
        """Binds and starts serving; returns the bound (address, port)."""
        if self._server is not None:
            raise RuntimeError("the rendezvous service is already running")
        try:
            self._server = _Server((host, port), self.store)
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
    interrupted, for ranks started by another launcher with Horovod's Gloo variables."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m horovod_compat.runner.rendezvous",
                                     description="Run the rendezvous service of a TCP job.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: an ephemeral one)")
    args = parser.parse_args(argv)
    server = RendezvousServer()
    try:
        host, port = server.start(args.host, args.port)
    except RuntimeError as error:
        parser.exit(2, f"{error}\n")
    print(f"HOROVOD_GLOO_RENDEZVOUS_ADDR={host} HOROVOD_GLOO_RENDEZVOUS_PORT={port}", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
