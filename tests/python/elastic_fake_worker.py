"""A stand-in for an elastic training script, for test_elastic_launcher.py: it speaks the
launcher's elastic protocol (docs/elastic.md) over HTTP, without TensorFlow or a transport.

The ranks of a round "train" in lock-step through the rendezvous store: at step k rank 0 puts
its decision (go on, or reset because hosts_event moved) and every rank puts its arrival; a rank
that does not see all of them within PEER_TIMEOUT takes it as a lost peer (what the transport's
HorovodInternalError is to a real worker) and asks for a new round. After each round forms, rank
0 puts its step count and the others adopt it (the state sync). Every event is appended to
FAKE_LOG as a JSON line. FAKE_PLAN (JSON) says what to do:

    {"steps": 8, "step_seconds": 0.05,
     "fail": {"<host>:<slot>": {"at_step": 3, "mode": "kill" | "exit"}},   # once per identity
     "stuck": ["<host>:<slot>"],          # never asks for a round
     "marker_dir": "/tmp/x"}              # where "failed once" markers go
"""

import http.client
import json
import os
import signal
import sys
import time

from horovod_compat.runner.rendezvous import SIGNATURE_HEADER, sign

PEER_TIMEOUT = 5.0
ASSIGNMENT_TIMEOUT = 60.0


class Client:
    def __init__(self) -> None:
        self.addr = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
        self.port = int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
        self.secret = os.environ["HOROVOD_SECRET_KEY"].encode()

    def request(self, method: str, path: str, body: bytes = b""):
        conn = http.client.HTTPConnection(self.addr, self.port, timeout=10)
        try:
            headers = {SIGNATURE_HEADER: sign(self.secret, method, path, body),
                       "Content-Length": str(len(body))}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def put(self, path: str, value: str) -> None:
        status, _ = self.request("PUT", path, value.encode())
        assert status == 200, (path, status)

    def get(self, path: str):
        status, body = self.request("GET", path)
        return body.decode() if status == 200 else None


def log(event: dict) -> None:
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(event) + "\n")


def wait_for(client: Client, paths, deadline: float):
    values = {}
    while time.monotonic() < deadline:
        for path in paths:
            if path not in values:
                value = client.get(path)
                if value is not None:
                    values[path] = value
        if len(values) == len(paths):
            return values
        time.sleep(0.02)
    return None


def main() -> None:
    plan = json.loads(os.environ.get("FAKE_PLAN", "{}"))
    identity = f"{os.environ['HOROVOD_HOSTNAME']}:{os.environ['HOROVOD_LOCAL_RANK']}"
    client = Client()
    total = plan.get("steps", 8)
    failure = plan.get("fail", {}).get(identity)
    marker = os.path.join(plan.get("marker_dir", "/nonexistent"), identity)
    if failure and os.path.exists(marker):
        failure = None  # a worker started again on that slot behaves
    if identity in plan.get("stuck", []):
        log({"id": identity, "event": "stuck"})
        time.sleep(3600)
    last_round, steps, seen_event = -1, 0, 0
    while True:
        client.put(f"/elastic/ready/{identity}", str(last_round))
        deadline = time.monotonic() + ASSIGNMENT_TIMEOUT
        while True:
            body = client.get(f"/elastic/assignment/{identity}")
            if body is not None:
                answer = json.loads(body)
                if answer.get("removed") or answer["round"] > last_round:
                    break
            if time.monotonic() > deadline:
                sys.exit("timed out waiting for an assignment")
            time.sleep(0.05)
        if answer.get("removed"):
            log({"id": identity, "event": "removed", "reason": answer["reason"]})
            sys.exit(f"removed from the job: {answer['reason']}")
        last_round, rank, size = answer["round"], answer["rank"], answer["size"]
        scope = answer["scope"]
        log({"id": identity, "event": "round", "round": last_round, "rank": rank, "size": size})
        if rank == 0:
            client.put(f"/{scope}/state", str(steps))
        got = wait_for(client, [f"/{scope}/state"], time.monotonic() + PEER_TIMEOUT)
        if got is None:
            continue  # rank 0 is gone: ask for a new round
        steps = int(got[f"/{scope}/state"])
        while steps < total:
            if failure and steps == failure["at_step"]:
                open(marker, "w").close()
                log({"id": identity, "event": "fail", "mode": failure["mode"]})
                if failure["mode"] == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                sys.exit(5)
            time.sleep(plan.get("step_seconds", 0.05))
            if rank == 0:
                stamp, kind = client.get("/elastic/hosts_event").split()
                decision = "reset" if int(stamp) > seen_event else "go"
                client.put(f"/{scope}/decision_{steps}", f"{decision} {stamp} {kind}")
            client.put(f"/{scope}/arrive_{steps}_{rank}", "1")
            paths = [f"/{scope}/decision_{steps}"] + \
                [f"/{scope}/arrive_{steps}_{r}" for r in range(size)]
            got = wait_for(client, paths, time.monotonic() + PEER_TIMEOUT)
            if got is None:
                log({"id": identity, "event": "lost_peer", "round": last_round, "step": steps})
                break
            decision, stamp, kind = got[paths[0]].split()
            if decision == "reset":
                seen_event = int(stamp)
                log({"id": identity, "event": "hosts_updated", "kind": int(kind)})
                break
            steps += 1
        else:
            log({"id": identity, "event": "done", "steps": steps, "round": last_round,
                 "rank": rank, "size": size})
            return


if __name__ == "__main__":
    main()
