"""B9: what elasticity costs (issue 27), measured on real ``horovodrun`` elastic jobs.

    python bench/b9_elastic.py run [--quick] [--parts kill,join,steady] [--json OUT]
    python bench/b9_elastic.py report OUT.json          (the table again, from the JSON)
    python bench/b9_elastic.py worker OUT_DIR STEPS COMMIT_EVERY ELEMS STEP_SECONDS
                                                        (one worker; started by the launcher)

Every job runs the same worker: a ``tf.function`` step (an averaging allreduce of ELEMS floats
into a variable) under ``hvd.elastic.run`` with a ``TensorFlowState`` committed every
COMMIT_EVERY steps; each worker logs, with wall-clock times, its start (before TensorFlow's
import), the end of its imports, each init, each completed step and each commit (as it starts) to
``OUT_DIR/<host>_<slot>.jsonl``. Hosts are aliases of this machine (localhost, 127.0.0.2), so
all of it runs on one machine.

The parts (``--parts``):
    kill     horovodrun -np 3 --min-np 2 -H localhost:2,127.0.0.2:1: once the job runs, the
             worker on 127.0.0.2 is SIGKILLed; the time from the kill to the survivors' first
             completed step in the new round (the slower survivor's).
    join     horovodrun -np 1 --max-np 2 --host-discovery-script (a file this script rewrites):
             once the job runs, 127.0.0.2:1 is added. From the rewrite to the new worker's first
             step; of it: discovery (rewrite -> its process starts), its own start-up (Python
             and TensorFlow imports), the others' next commit (where rank 0 sees the host
             change), and the join's own cost beyond the later of those two (reset,
             rendezvous of the new round, the state's broadcast); also the longest pause of
             the old rank 0's steps (it waits in init for the new worker).
    steady   the same job of 2 workers elastic (-np 2 --min-np 1 --max-np 2 -H localhost:2) and
             static (horovodrun --gloo -np 2), alternating, --steady-rounds times: rank 0's
             mean time per step after a warm-up, commits included in both (an elastic commit
             also asks the launcher for host updates and broadcasts the answer); each step
             sleeps --steady-step-seconds after its allreduce, standing for the compute.

The jobs run with the defaults (an elastic job arms no peer-loss exit timer). Timings on a
loaded machine mean little: run it on a quiet one.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

_T0 = time.time()  # the worker's start, before TensorFlow's import

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the worker ------------------------------------------------------------------------------

def worker(out_dir: str, steps: int, commit_every: int, elems: int, step_seconds: float) -> None:
    identity = f"{os.environ.get('HOROVOD_HOSTNAME', 'localhost')}_" \
               f"{os.environ.get('HOROVOD_LOCAL_RANK', os.environ.get('HOROVOD_RANK', '0'))}"
    log = open(os.path.join(out_dir, identity + ".jsonl"), "a", buffering=1)

    def note(**fields: Any) -> None:
        log.write(json.dumps(dict(fields, t=time.time(), pid=os.getpid())) + "\n")

    note(event="start", t0=_T0)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import horovod_compat.tensorflow as hvd
    note(event="imported")
    hvd.init()
    note(event="init", size=hvd.size(), rank=hvd.rank())
    weights = tf.Variable(tf.zeros([elems]))
    state = hvd.elastic.TensorFlowState([weights], step=0)

    @tf.function
    def step_fn() -> None:
        weights.assign_add(hvd.allreduce(tf.ones([elems]), op=hvd.Average, name="b9"))

    @hvd.elastic.run
    def train(state: Any) -> None:
        note(event="train", step=state.step, size=hvd.size(), rank=hvd.rank())
        while state.step < steps:
            step_fn()
            state.step += 1
            note(event="step", step=state.step, size=hvd.size(), rank=hvd.rank())
            if step_seconds:
                time.sleep(step_seconds)
            if state.step % commit_every == 0:
                # Logged before: the commit that hears of new hosts raises out of commit().
                note(event="commit", step=state.step, size=hvd.size(), rank=hvd.rank())
                state.commit()

    train(state)
    note(event="done")
    hvd.shutdown()


# -- running jobs ----------------------------------------------------------------------------

def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "HVDC_", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


class Job:
    def __init__(self, python: str, flags: List[str], out_dir: str, steps: int,
                 commit_every: int, elems: int, step_seconds: float) -> None:
        self.out_dir = out_dir
        cmd = [python, "-c", "from horovod_compat.runner.launch import main; main()", *flags,
               python, os.path.abspath(__file__), "worker", out_dir, str(steps),
               str(commit_every), str(elems), str(step_seconds)]
        self.log = open(os.path.join(out_dir, "job.log"), "w")
        self.proc = subprocess.Popen(cmd, env=_env(), stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=out_dir, start_new_session=True)

    def events(self, identity: str) -> List[Dict[str, Any]]:
        path = os.path.join(self.out_dir, identity.replace(":", "_") + ".jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def tail(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()[-4000:]

    def wait_for(self, condition: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job ended (code {self.proc.returncode}) before {what}; "
                                   f"its output ended with:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout:g} s; the job's output ended "
                                   f"with:\n{self.tail()}")
            time.sleep(0.05)

    def finish(self, timeout: float, stop: bool = False) -> int:
        if stop and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # horovodrun passes it on to the workers
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _steps(events: List[Dict[str, Any]], size: Optional[int] = None) -> List[Dict[str, Any]]:
    return [e for e in events if e["event"] == "step" and (size is None or e["size"] == size)]


def measure_kill(args: argparse.Namespace, out_dir: str) -> Dict[str, Any]:
    warm = 20
    job = Job(args.python, ["-np", "3", "--min-np", "2", "--max-np", "3",
                            "-H", "localhost:2,127.0.0.2:1"],
              out_dir, warm + args.after_steps, args.commit_every, args.elems, args.step_seconds)
    try:
        job.wait_for(lambda: len(_steps(job.events("127.0.0.2:0"))) >= warm,
                     "the victim's warm-up", args.timeout)
        victim = job.events("127.0.0.2:0")[0]["pid"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        survivors = ["localhost:0", "localhost:1"]
        job.wait_for(lambda: all(_steps([e for e in job.events(i) if e["t"] > killed_at], 2)
                                 for i in survivors), "the survivors' first step", args.timeout)
        firsts = [_steps([e for e in job.events(i) if e["t"] > killed_at], 2)[0]["t"]
                  for i in survivors]
    finally:
        code = job.finish(args.timeout)
    return {"kill_to_first_step_s": max(firsts) - killed_at, "exit_code": code}


def measure_join(args: argparse.Namespace, out_dir: str) -> Dict[str, Any]:
    warm = 20
    hosts = os.path.join(out_dir, "hosts.txt")
    with open(hosts, "w") as f:
        f.write("localhost:1\n")
    script = os.path.join(out_dir, "hosts.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts}\n")
    os.chmod(script, 0o755)
    # Steps enough for any start-up; the job is stopped once the new worker took part.
    job = Job(args.python, ["-np", "1", "--min-np", "1", "--max-np", "2",
                            "--host-discovery-script", script],
              out_dir, 10 ** 7, args.commit_every, args.elems, args.step_seconds)
    try:
        job.wait_for(lambda: len(_steps(job.events("localhost:0"))) >= warm,
                     "the first worker's warm-up", args.timeout)
        with open(hosts + ".tmp", "w") as f:
            f.write("localhost:1\n127.0.0.2:1\n")
        added_at = time.time()
        os.replace(hosts + ".tmp", hosts)
        job.wait_for(lambda: _steps(job.events("127.0.0.2:0"), 2), "the new worker's first step",
                     args.timeout)
    finally:
        job.finish(args.timeout, stop=True)
    new = job.events("127.0.0.2:0")
    started = new[0]["t0"]
    imported = next(e["t"] for e in new if e["event"] == "imported")
    first_step = _steps(new, 2)[0]["t"]
    old = job.events("localhost:0")
    # Rank 0 hears of the new slot at its first commit after the discovery.
    commits = [e["t"] for e in old if e["event"] == "commit" and e["t"] >= added_at]
    next_commit = commits[0] if commits else added_at
    old_steps = [e["t"] for e in _steps(old)]
    stall = max((b - a for a, b in zip(old_steps, old_steps[1:]) if b >= added_at), default=0.0)
    return {"total_s": first_step - added_at,
            "discovery_s": started - added_at,
            "startup_s": imported - started,
            "next_commit_s": next_commit - added_at,
            "join_cost_s": first_step - max(imported, next_commit),
            "others_stall_s": stall}


def measure_steady(args: argparse.Namespace, out_dir: str) -> Dict[str, Any]:
    """Alternating rounds of the same job elastic and static (``--gloo``; neither pins ranks):
    the mean time per step of rank 0 after a warm-up, commits included (a median would skip
    the commit steps, which are where the two differ)."""
    result: Dict[str, Any] = {"step_seconds": args.steady_step_seconds, "rounds": []}
    jobs = (("elastic", ["-np", "2", "--min-np", "1", "--max-np", "2", "-H", "localhost:2"]),
            ("static", ["--gloo", "-np", "2"]))
    for round_index in range(args.steady_rounds):
        means: Dict[str, float] = {}
        # Either job first in turn: nothing that drifts during a round favours one of them.
        for name, flags in (jobs if round_index % 2 == 0 else jobs[::-1]):
            job_dir = os.path.join(out_dir, f"{name}{round_index}")
            os.makedirs(job_dir)
            job = Job(args.python, flags, job_dir, args.steady_steps, args.commit_every,
                      args.elems, args.steady_step_seconds)
            code = job.finish(args.timeout)
            if code != 0:
                raise RuntimeError(f"the {name} job failed (code {code}); its output ended "
                                   f"with:\n{job.tail()}")
            rank0 = next(i for i in ("localhost:0", "localhost_0", "localhost:1")
                         if any(e.get("rank") == 0 for e in job.events(i)))
            times = [e["t"] for e in _steps(job.events(rank0))][args.steady_steps // 5:]
            means[f"{name}_step_ms"] = (times[-1] - times[0]) / (len(times) - 1) * 1e3
        means = {key: means[key] for key in ("elastic_step_ms", "static_step_ms")}
        means["elastic_over_static"] = means["elastic_step_ms"] / means["static_step_ms"]
        result["rounds"].append(means)
    ratios = [r["elastic_over_static"] for r in result["rounds"]]
    result["elastic_over_static_median"] = statistics.median(ratios)
    result["elastic_over_static_range"] = [min(ratios), max(ratios)]
    return result


PARTS = {"kill": measure_kill, "join": measure_join, "steady": measure_steady}


def report(results: Dict[str, Any]) -> None:
    print(f"B9 elastic (elems={results['config']['elems']}, commit every "
          f"{results['config']['commit_every']} steps)")
    for part, values in results["parts"].items():
        print(f"  {part}")
        for key, value in values.items():
            if key == "rounds":
                for i, one in enumerate(value):
                    print(f"    round {i}: " + ", ".join(f"{k} {v:.3f}" for k, v in one.items()))
                continue
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            print(f"    {key:<30} {shown}")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--parts", default="kill,join,steady")
    run.add_argument("--quick", action="store_true", help="a smoke run: few steps")
    run.add_argument("--python", default=sys.executable)
    run.add_argument("--elems", type=int, default=1 << 16)
    run.add_argument("--commit-every", type=int, default=10)
    run.add_argument("--step-seconds", type=float, default=0.01,
                     help="sleep after each step of the kill and join jobs")
    run.add_argument("--after-steps", type=int, default=400,
                     help="steps of the kill job after the warm-up")
    run.add_argument("--steady-steps", type=int, default=2000)
    run.add_argument("--steady-rounds", type=int, default=3,
                     help="alternating elastic/static rounds of the steady part")
    run.add_argument("--steady-step-seconds", type=float, default=0.01,
                     help="sleep after each step of the steady jobs: the compute of a "
                          "training step (0: the runtime alone, where noise dominates)")
    run.add_argument("--timeout", type=float, default=600)
    run.add_argument("--json")
    rep = sub.add_parser("report")
    rep.add_argument("json")
    work = sub.add_parser("worker")
    work.add_argument("out_dir")
    work.add_argument("steps", type=int)
    work.add_argument("commit_every", type=int)
    work.add_argument("elems", type=int)
    work.add_argument("step_seconds", type=float)
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker(args.out_dir, args.steps, args.commit_every, args.elems, args.step_seconds)
        return
    if args.command == "report":
        with open(args.json) as f:
            report(json.load(f))
        return
    if args.quick:
        args.after_steps, args.steady_steps, args.elems = 60, 100, 1024
        args.steady_rounds = 1
    results: Dict[str, Any] = {"config": {"elems": args.elems, "commit_every": args.commit_every,
                                          "quick": args.quick}, "parts": {}}
    with tempfile.TemporaryDirectory(prefix="b9-") as tmp:
        for part in args.parts.split(","):
            out_dir = os.path.join(tmp, part)
            os.makedirs(out_dir)
            results["parts"][part] = PARTS[part](args, out_dir)
    report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
