"""The rendezvous service of horovodrun --gloo, exercised with a real HTTP client."""

import hashlib
import hmac
import http.client
import re
import socket
import threading
import time

import pytest

from horovod_compat.runner.rendezvous import (MAX_VALUE_BYTES, SIGNATURE_HEADER, RendezvousServer,
                                              sign)


@pytest.fixture
def server():
    service = RendezvousServer()
    service.start("127.0.0.1", 0)
    yield service
    service.stop()


def _request(address, method, path, body=None):
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read(), response
    finally:
        conn.close()


def _raw(address, data):
    """Sends raw bytes, returns the whole answer (the server closes the connection)."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def test_binds_the_requested_address_and_an_ephemeral_port(server):
    host, port = server.address
    assert host == "127.0.0.1" and port > 0


def test_put_then_get(server):
    status, body, response = _request(server.address, "PUT", "/global/rank_0", b"10.0.0.1:4242")
    assert status == 200 and body == b""
    assert response.getheader("Content-Length") == "0"
    assert response.getheader("Connection") == "close"
    status, body, response = _request(server.address, "GET", "/global/rank_0")
    assert status == 200 and body == b"10.0.0.1:4242"
    assert response.getheader("Content-Length") == str(len(b"10.0.0.1:4242"))
    assert response.getheader("Connection") == "close"
    assert server.store.get("global", "rank_0") == b"10.0.0.1:4242"


def test_absent_key_is_404_until_it_is_put(server):
    status, body, response = _request(server.address, "GET", "/global/rank_1")
    assert status == 404 and body == b""
    assert response.getheader("Content-Length") == "0"
    _request(server.address, "PUT", "/global/rank_1", b"h:1")
    assert _request(server.address, "GET", "/global/rank_1")[:2] == (200, b"h:1")


def test_overwrite_scopes_and_empty_values(server):
    _request(server.address, "PUT", "/global/k", b"first")
    _request(server.address, "PUT", "/global/k", b"second")
    _request(server.address, "PUT", "/other/k", b"")
    assert _request(server.address, "GET", "/global/k")[:2] == (200, b"second")
    assert _request(server.address, "GET", "/other/k")[:2] == (200, b"")
    assert _request(server.address, "GET", "/third/k")[0] == 404
    assert server.store.keys("global") == ["k"]


@pytest.mark.parametrize("path", ["/global", "/", "/a/b/c", "//k"])
def test_malformed_paths_are_400(server, path):
    for method, body in (("GET", None), ("PUT", b"v")):
        status, body, _ = _request(server.address, method, path, body)
        assert status == 400 and b"/<scope>/<key>" in body


def test_put_without_length_or_too_large(server):
    answer = _raw(server.address, b"PUT /global/k HTTP/1.1\r\nHost: x\r\n\r\nvalue")
    assert answer.startswith(b"HTTP/1.1 411"), answer
    status, _, _ = _request(server.address, "PUT", "/global/k", b"x" * (MAX_VALUE_BYTES + 1))
    assert status == 413
    assert _request(server.address, "GET", "/global/k")[0] == 404


def test_truncated_body_is_refused(server):
    # The client sends 3 of the 10 bytes it announced, then closes its side.
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"PUT /global/k HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
        sock.shutdown(socket.SHUT_WR)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert _request(server.address, "GET", "/global/k")[0] == 404


def test_other_methods_are_405(server):
    assert _request(server.address, "DELETE", "/global/k")[0] == 405
    assert _request(server.address, "POST", "/global/k", b"v")[0] == 405


def test_an_idle_client_does_not_block_others(server):
    with socket.create_connection(server.address, timeout=10):
        # This connection sends nothing; the next requests are answered on other threads.
        _request(server.address, "PUT", "/global/a", b"1")
        assert _request(server.address, "GET", "/global/a")[:2] == (200, b"1")


def test_concurrent_ranks_see_every_registration(server):
    size = 16
    seen = {}
    errors = []

    def rank(r):
        try:
            value = f"h{r}:{r}".encode()
            assert _request(server.address, "PUT", f"/global/rank_{r}", value)[0] == 200
            values = {}
            for q in range(size):
                while True:
                    status, body, _ = _request(server.address, "GET", f"/global/rank_{q}")
                    if status == 200:
                        values[q] = body.decode()
                        break
                    assert status == 404
                    time.sleep(0.01)  # ranks back off between polls
            seen[r] = values
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    expected = {q: f"h{q}:{q}" for q in range(size)}
    assert seen == {r: expected for r in range(size)}


def test_stop_closes_the_port_and_start_twice_fails():
    service = RendezvousServer()
    address = service.start()
    with pytest.raises(RuntimeError, match="already running"):
        service.start()
    service.stop()
    service.stop()  # harmless
    with pytest.raises(OSError):
        socket.create_connection(address, timeout=5).close()


def test_port_in_use_is_a_clear_error(server):
    other = RendezvousServer()
    with pytest.raises(RuntimeError, match=r"cannot start the rendezvous service on 127\.0\.0\.1:"):
        other.start("127.0.0.1", server.address[1])


@pytest.mark.timeout(60)
def test_command_line_service_prints_its_address_and_stops_on_sigterm():
    import os
    import signal
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "horovod_compat.runner.rendezvous"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().split()
        values = dict(item.split("=", 1) for item in line)
        address = (values["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                   int(values["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
        assert address[0] == "127.0.0.1" and address[1] > 0
        assert _request(address, "PUT", "/global/rank_0", b"h:1")[0] == 200
        assert _request(address, "GET", "/global/rank_0")[:2] == (200, b"h:1")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- a job's secret: signed requests only ------------------------------------------------------

SECRET = "0123abcd" * 8


@pytest.fixture
def signed_server():
    service = RendezvousServer(SECRET)
    service.start("127.0.0.1", 0)
    yield service
    service.stop()


def _signed(address, method, path, body=b"", secret=SECRET, sign_as=None):
    """A request signed with ``secret`` (over ``sign_as`` = (method, path, body) if given)."""
    what = sign_as or (method, path, body)
    headers = {SIGNATURE_HEADER: sign(secret.encode(), *what)}
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request(method, path, body=body if method == "PUT" else None, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_signature_is_hmac_sha256_of_method_path_and_body():
    want = hmac.new(b"k", b"PUT\n/global/rank_0\n10.0.0.1:5", hashlib.sha256).hexdigest()
    assert sign(b"k", "PUT", "/global/rank_0", b"10.0.0.1:5") == want


def test_signed_requests_are_served(signed_server):
    address = signed_server.address
    assert _signed(address, "PUT", "/global/rank_0", b"h:1")[0] == 200
    assert _signed(address, "GET", "/global/rank_0") == (200, b"h:1")
    assert _signed(address, "GET", "/global/rank_1")[0] == 404


def test_unsigned_and_wrongly_signed_requests_are_403_and_logged(signed_server, capfd):
    address = signed_server.address
    status, body, _ = _request(address, "PUT", "/global/rank_0", b"evil:1")
    assert status == 403 and b"unsigned" in body
    assert _request(address, "GET", "/global/rank_0")[0] == 403
    # A wrong secret; a right signature of another request (replayed onto another key or body).
    assert _signed(address, "PUT", "/global/rank_0", b"evil:1", secret="wrong")[0] == 403
    assert _signed(address, "PUT", "/global/rank_0", b"evil:1",
                   sign_as=("PUT", "/global/rank_1", b"evil:1"))[0] == 403
    assert _signed(address, "PUT", "/global/rank_0", b"evil:1",
                   sign_as=("PUT", "/global/rank_0", b"good:1"))[0] == 403
    assert _signed(address, "GET", "/global/rank_0", sign_as=("PUT", "/global/rank_0", b""))[0] \
        == 403
    assert signed_server.store.keys("global") == []
    err = capfd.readouterr().err
    assert err.count("refused PUT /global/rank_0 from 127.0.0.1 (403)") == 4, err
    assert "unsigned request" in err and "wrong signature" in err
    assert SECRET not in err


def test_garbage_never_stops_the_service(signed_server, capfd):
    """Random bytes, truncated and oversized requests (fixed seed; each connection bounded by a
    socket timeout): each is answered 4xx or dropped, and the service keeps serving."""
    import random
    address = signed_server.address
    rng = random.Random(1234)
    head = b"PUT /global/k HTTP/1.1\r\n"
    cases = [
        b"", b"\r\n\r\n", b"\x00" * 64, b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
        head + b"Content-Length: -5\r\n\r\n", head + b"Content-Length: x\r\n\r\n",
        head + b"Content-Length: 99999999999\r\n\r\n",
        head + b"Content-Length: 10\r\n\r\nabc",                 # truncated
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",           # over the line limit
        head + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",  # too many headers
        head + SIGNATURE_HEADER.encode() + b": " + b"\xff" * 64
        + b"\r\nContent-Length: 1\r\n\r\nv",
    ]
    for _ in range(300):
        n = rng.randrange(0, 600)
        data = bytes(rng.randrange(256) for _ in range(n))
        if rng.random() < 0.5:  # a plausible start, then garbage
            data = rng.choice([b"GET /global/", b"PUT /global/k HTTP/1.1\r\n", b"HTTP/1.1 "]) + data
        cases.append(data)
    for data in cases:
        with socket.create_connection(address, timeout=10) as sock:
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                answer = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                answer = b""
        refused = re.match(rb"HTTP/1\.[01] (4\d\d|505) ", answer)
        assert answer == b"" or refused, (data[:80], answer[:80])
    # Nothing was stored, and a real rank is still served.
    assert signed_server.store.keys("global") == []
    assert _signed(address, "PUT", "/global/rank_0", b"h:1")[0] == 200
    assert _signed(address, "GET", "/global/rank_0") == (200, b"h:1")
    assert "Traceback" not in capfd.readouterr().err


def test_empty_secret_is_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        RendezvousServer("")


@pytest.mark.timeout(60)
def test_command_line_service_takes_the_secret_from_the_environment():
    import os
    import signal
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HOROVOD_SECRET_KEY=SECRET)
    proc = subprocess.Popen([sys.executable, "-m", "horovod_compat.runner.rendezvous"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert SECRET not in line
        values = dict(item.split("=", 1) for item in line.split())
        address = (values["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                   int(values["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
        assert _request(address, "PUT", "/global/rank_0", b"h:1")[0] == 403
        assert _signed(address, "PUT", "/global/rank_0", b"h:1")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert SECRET not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
