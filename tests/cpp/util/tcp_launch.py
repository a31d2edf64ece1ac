#!/usr/bin/env python3
"""Runs NP copies of a test binary as the ranks of one job over the TCP transport.

    tcp_launch.py --np 3 [--timeout 240] [--rendezvous] [--env NAME=VALUE ...] BINARY [ARGS...]

Every rank gets HVDC_TCP_PEERS (free loopback ports), HOROVOD_RANK, HOROVOD_SIZE and a random
HOROVOD_SECRET_KEY (the service gets it too); with
--rendezvous, the launcher's rendezvous service (horovod_compat.runner.rendezvous, from this source
tree) is started instead and the ranks get HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT. Output lines
are prefixed with the rank. When any rank fails (or the timeout passes) the others are ended and
the launcher exits non-zero. A test utility for ctest, not the user-facing launcher.
"""
import argparse
import os
import secrets
import socket
import subprocess
import sys
import threading
import time


def free_ports(n):
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        held.append(s)
    ports = [s.getsockname()[1] for s in held]
    for s in held:
        s.close()
    return ports


def pump(rank, stream, out):
    for line in iter(stream.readline, b""):
        out.write(f"[{rank}] {line.decode(errors='replace')}")
        out.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--np", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--rendezvous", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if not args.command:
        parser.error("no command")
    service = None
    # A job secret, as horovodrun --gloo makes one: the service and the mesh check it.
    secret = secrets.token_hex(16)
    if args.rendezvous:
        # The repository root (this file is tests/cpp/util/tcp_launch.py), for horovod_compat.
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
        env = dict(os.environ, PYTHONPATH=root, HOROVOD_SECRET_KEY=secret)
        service = subprocess.Popen(
            [sys.executable, "-m", "horovod_compat.runner.rendezvous", "--host", "127.0.0.1"],
            env=env, stdout=subprocess.PIPE)
        line = service.stdout.readline().decode()  # "ADDR=... PORT=..." once it listens
        identity = dict(item.split("=", 1) for item in line.split())
        if "HOROVOD_GLOO_RENDEZVOUS_PORT" not in identity:
            service.kill()
            print(f"tcp_launch: the rendezvous service printed {line!r}", file=sys.stderr)
            return 1
    else:
        identity = {"HVDC_TCP_PEERS": ",".join(f"127.0.0.1:{p}" for p in free_ports(args.np))}
    procs, pumps = [], []
    for rank in range(args.np):
        env = dict(os.environ)
        for item in args.env:
            name, _, value = item.partition("=")
            env[name] = value
        env.update(identity, HOROVOD_RANK=str(rank), HOROVOD_SIZE=str(args.np),
                   HOROVOD_SECRET_KEY=secret)
        p = subprocess.Popen(args.command, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        procs.append(p)
        t = threading.Thread(target=pump, args=(rank, p.stdout, sys.stdout), daemon=True)
        t.start()
        pumps.append(t)
    deadline = time.monotonic() + args.timeout
    failed = None
    while any(p.poll() is None for p in procs):
        for rank, p in enumerate(procs):
            if p.poll() not in (None, 0) and failed is None:
                failed = (rank, p.returncode)
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if failed is None and time.monotonic() > deadline:
        failed = ("timeout", None)
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
    for t in pumps:
        t.join(timeout=5)
    if service is not None:
        service.terminate()
        service.wait(timeout=10)
    if failed is None:
        for rank, p in enumerate(procs):
            if p.returncode != 0:
                failed = (rank, p.returncode)
                break
    if failed:
        what = ("timed out after %.0f s" % args.timeout if failed[0] == "timeout"
                else "rank %s exited with %s" % failed)
        print(f"tcp_launch: {what}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
