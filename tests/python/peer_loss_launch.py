"""Starts peer_loss_job.py as a 3-rank TCP job from TF_CONFIG by hand (no launcher) and times how
long each survivor takes to exit after rank 1 is hit. Used by test_peer_loss.py and
bench/peer_loss_times.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "peer_loss_job.py")
SIZE = 3
VICTIM = 1


def clean_env():
    """This environment without any launcher's variables, with this source tree first."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_", "HOROVOD_", "HVDC_"))
           and k != "TF_CONFIG"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def run_tf_config_job(mode, out_dir, kill_signal="SIGKILL", timeout=240, extra_env=None):
    """Runs the job; returns {"ports", "kill_time", "exits": {rank: (returncode, time)},
    "logs": {rank: text}, "victim_after_cont": returncode or None}. Every wait is bounded by
    `timeout`; processes left are killed."""
    ports = free_ports(SIZE)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs, logs = {}, {}
    result = {"ports": ports, "kill_time": None, "exits": {}, "logs": {},
              "victim_after_cont": None}
    try:
        for r in range(SIZE):
            env = clean_env()
            env["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                           "task": {"type": "worker", "index": r}})
            env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = "120"
            env.update(extra_env or {})
            logs[r] = open(os.path.join(out_dir, f"rank-{r}.log"), "w")
            procs[r] = subprocess.Popen([sys.executable, JOB, mode, out_dir, kill_signal],
                                        env=env, stdout=logs[r], stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        killed_path = os.path.join(out_dir, "killed")
        while time.time() < deadline and len(result["exits"]) < SIZE:
            for r, p in procs.items():
                if r not in result["exits"] and p.poll() is not None:
                    result["exits"][r] = (p.returncode, time.time())
            if result["kill_time"] is None and os.path.exists(killed_path):
                result["kill_time"] = float(_read(killed_path))
            survivors_done = all(r in result["exits"] for r in procs if r != VICTIM)
            if survivors_done and (VICTIM in result["exits"] or kill_signal == "SIGSTOP"):
                break
            time.sleep(0.02)
        if kill_signal == "SIGSTOP" and VICTIM not in result["exits"] \
                and all(r in result["exits"] for r in procs if r != VICTIM):
            # Resumed after the others gave up: it must fail too, not carry on alone.
            procs[VICTIM].send_signal(signal.SIGCONT)
            try:
                result["victim_after_cont"] = procs[VICTIM].wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()
    result["logs"] = {r: _read(os.path.join(out_dir, f"rank-{r}.log")) for r in procs}
    return result


def caught(out_dir, rank):
    """What rank `rank` wrote about the error it caught (None when it wrote nothing)."""
    text = _read(os.path.join(out_dir, f"caught-{rank}.json"))
    return json.loads(text) if text else None
