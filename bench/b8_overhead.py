"""B8: what the runtime costs the model on each way of launching it (issue 30).

examples/resnet50_synthetic.py at np=2 launched every way a user can, against the same compute
without the runtime (two independent processes at once), in alternating rounds of one run; for
each path the total img/sec (median and range over the rounds), its ratio to the reference of the
same round, and where each rank's CPU went during the timed steps, thread by thread.

    python bench/b8_overhead.py run [--rounds 3] [--quick] [--paths a,b] [--json OUT]
    python bench/b8_overhead.py report OUT.json           (the table again, from the JSON)
    python bench/b8_overhead.py rank --out DIR -- ARGS    (inside each process: runs the example
                                                           with ARGS and samples its threads)

The paths (``--paths``, in this order every round):
    horovodrun           horovodrun -np 2 (its defaults: docs/launch_defaults.md)
    horovodrun-gloo      horovodrun --gloo -np 2 (local ranks pinned by default)
    horovodrun-gloo-unpinned   the same with --binding-args "--bind-to none"
    mpirun               mpirun -np 2, nothing added (Open MPI binds np <= 2 to cores itself)
    mpirun-bind-none     mpirun -np 2 --bind-to none
    mpirun-core-yield    mpirun -np 2 --bind-to core --mca mpi_yield_when_idle 1
    tf-config            two processes started with TF_CONFIG (README's recipe), nothing added
    none                 no runtime (--no-horovod): two processes at once, one core each
                         (taskset), the reference every ratio divides by
    none-unpinned        no runtime, the two processes unpinned

The CPU split: each process reads /proc/self/task/<tid>/stat (utime + stime) and .../comm at the
start of its first timed iteration and at the end of its last, and knows which threads existed
before hvd.init(), which init started and which came later. Groups, in % of one core over that
window (mean of the two ranks):
    compute      TensorFlow's kernel threads: its inter-op pool (tf_Compute) and the unnamed
                 threads it starts while running the model (Eigen's intra-op pool)
    main         the Python main thread (drives the steps)
    tf-other     TensorFlow's other named threads (tf_*)
    control      the runtime's control thread (hvdc-control)
    executor     the runtime's executors (hvdc-exec-*)
    mpi/io       threads hvd.init() started that are not the runtime's named ones: Open MPI's
                 progress and PMIx threads, the TCP transport's I/O thread
    other        everything else (threads from before init, other hvdc-* threads)
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "resnet50_synthetic.py")
PATHS = ["horovodrun", "horovodrun-gloo", "horovodrun-gloo-unpinned", "mpirun",
         "mpirun-bind-none", "mpirun-core-yield", "tf-config", "none", "none-unpinned"]
REFERENCE = "none"
GROUPS = ["compute", "main", "tf-other", "control", "executor", "mpi/io", "other"]
DESCRIPTIONS = {
    "horovodrun": "`horovodrun -np 2`",
    "horovodrun-gloo": "`horovodrun --gloo -np 2`",
    "horovodrun-gloo-unpinned": "`horovodrun --gloo -np 2 --binding-args \"--bind-to none\"`",
    "mpirun": "`mpirun -np 2`",
    "mpirun-bind-none": "`mpirun -np 2 --bind-to none`",
    "mpirun-core-yield": "`mpirun -np 2 --bind-to core --mca mpi_yield_when_idle 1`",
    "tf-config": "`TF_CONFIG` (two processes)",
    "none": "no runtime, one core each (reference)",
    "none-unpinned": "no runtime, unpinned",
}


# -- inside each process ---------------------------------------------------------------------

def read_threads(task_dir: str = "/proc/self/task") -> Dict[int, Tuple[str, int]]:
    """tid -> (comm, utime + stime in clock ticks) of every thread that can be read."""
    threads = {}
    for name in os.listdir(task_dir):
        try:
            with open(os.path.join(task_dir, name, "comm")) as f:
                comm = f.read().strip()
            with open(os.path.join(task_dir, name, "stat")) as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        # comm (field 2) may hold spaces and parentheses: fields after the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        threads[int(name)] = (comm, int(fields[11]) + int(fields[12]))
    return threads


class Sampler:
    """Replaces timeit.timeit for the example: call 0 is its warm-up, calls 1.. are its timed
    iterations; samples the threads before the first timed call and after each one."""

    def __init__(self, real_timeit: Any) -> None:
        self.real = real_timeit
        self.calls = 0
        self.iters: List[Tuple[int, float]] = []
        self.start: Optional[Dict[int, Tuple[str, int]]] = None
        self.end: Optional[Dict[int, Tuple[str, int]]] = None
        self.t0 = self.t1 = 0.0

    def __call__(self, stmt: Any, number: int = 1000000, **kwargs: Any) -> float:
        timed = self.calls > 0
        self.calls += 1
        if timed and self.start is None:
            self.start, self.t0 = read_threads(), time.monotonic()
        seconds = self.real(stmt, number=number, **kwargs)
        if timed:
            self.iters.append((number, seconds))
            self.end, self.t1 = read_threads(), time.monotonic()
        return seconds


def rank_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="b8_overhead.py rank")
    parser.add_argument("--out", required=True, help="directory for this process's JSON")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- the example's arguments")
    opts = parser.parse_args(argv)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    import runpy
    import timeit

    stages: Dict[str, List[int]] = {"start": sorted(read_threads())}
    rank: Dict[str, Any] = {}
    if "--no-horovod" not in args:
        import horovod_compat.tensorflow as hvd
        real_init = hvd.init

        def init(*a: Any, **k: Any) -> Any:
            stages["before_init"] = sorted(read_threads())
            result = real_init(*a, **k)
            stages["after_init"] = sorted(read_threads())
            rank.update(rank=hvd.rank(), size=hvd.size(), mpi=bool(hvd.mpi_enabled()))
            return result

        hvd.init = init
    sampler = Sampler(timeit.timeit)
    timeit.timeit = sampler
    sys.argv = [EXAMPLE] + list(args)
    try:
        runpy.run_path(EXAMPLE, run_name="__main__")
    finally:
        timeit.timeit = sampler.real
        result = {"pid": os.getpid(), "clk_tck": os.sysconf("SC_CLK_TCK"), "args": list(args),
                  "cpus": sorted(os.sched_getaffinity(0)), "iters": sampler.iters,
                  "window_s": sampler.t1 - sampler.t0, "stages": stages,
                  "start": sampler.start, "end": sampler.end, **rank}
        path = os.path.join(opts.out, f"proc-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
    return 0


# -- turning one process's samples into figures ------------------------------------------------

def group_of(tid: int, comm: str, pid: int, stages: Dict[str, List[int]]) -> str:
    if comm == "hvdc-control":
        return "control"
    if comm.startswith("hvdc-exec"):
        return "executor"
    if comm.startswith("hvdc-"):
        return "other"
    if tid == pid:
        return "main"
    if comm == "tf_Compute":
        return "compute"
    if comm.startswith("tf_"):
        return "tf-other"
    before, after = set(stages.get("before_init", [])), set(stages.get("after_init", []))
    if tid in after and tid not in before:
        return "mpi/io"
    existed = before if "before_init" in stages else set(stages.get("start", []))
    if tid in existed:
        return "other"
    return "compute"


def process_figures(proc: Dict[str, Any], batch: int) -> Dict[str, Any]:
    """img/sec of one process (the mean over its timed iterations, as the example reports it)
    and the % of one core each group of its threads used over the timed window."""
    rates = [batch * number / seconds for number, seconds in proc["iters"] if seconds > 0]
    split = {g: 0.0 for g in GROUPS}
    start = {int(t): v for t, v in (proc.get("start") or {}).items()}
    end = {int(t): v for t, v in (proc.get("end") or {}).items()}
    window = proc.get("window_s") or 0.0
    threads = []
    if window > 0:
        for tid, (comm, ticks) in end.items():
            # A thread started during the window counts from zero; one that ended is lost
            # (its CPU is no longer readable), which the total shows.
            used = (ticks - start.get(tid, (comm, 0))[1]) / proc["clk_tck"]
            group = group_of(tid, comm, proc["pid"], proc["stages"])
            split[group] += 100.0 * used / window
            threads.append({"tid": tid, "comm": comm, "group": group,
                            "pct": round(100.0 * used / window, 1)})
    return {"img_sec": statistics.mean(rates) if rates else 0.0, "cpu_pct": split,
            "cpu_pct_total": sum(split.values()), "window_s": window,
            "threads": sorted(threads, key=lambda t: -t["pct"])}


def summarize(runs: List[Dict[str, Any]], paths: Sequence[str]) -> Dict[str, Any]:
    """Per path: total img/sec per round, its ratio to the reference of the same round, and
    the CPU split (mean over the ranks, median over the rounds)."""
    by_round: Dict[int, Dict[str, float]] = {}
    for run in runs:
        if run.get("ok"):
            by_round.setdefault(run["round"], {})[run["path"]] = run["total_img_sec"]
    out: Dict[str, Any] = {}
    for path in paths:
        mine = [r for r in runs if r["path"] == path and r.get("ok")]
        totals = [r["total_img_sec"] for r in mine]
        ratios = [by_round[r["round"]][path] / by_round[r["round"]][REFERENCE]
                  for r in mine if by_round[r["round"]].get(REFERENCE)]
        split = {}
        for g in GROUPS + ["total"]:
            key = "cpu_pct_total" if g == "total" else None
            per_round = [statistics.mean(p["cpu_pct_total"] if key else p["cpu_pct"][g]
                                         for p in r["procs"]) for r in mine]
            split[g] = statistics.median(per_round) if per_round else None
        out[path] = {
            "rounds_ok": len(mine),
            "rounds_failed": len([r for r in runs if r["path"] == path and not r.get("ok")]),
            "img_sec": totals, "ratio": ratios,
            "img_sec_median": statistics.median(totals) if totals else None,
            "ratio_median": statistics.median(ratios) if ratios else None,
            "cpu_pct": split,
        }
    return out


def _span(values: List[float], fmt: str) -> str:
    if not values:
        return "n/a"
    median = format(statistics.median(values), fmt)
    if len(values) == 1:
        return median
    return f"{median} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def markdown(summary: Dict[str, Any], paths: Sequence[str]) -> str:
    head = ("| launch | img/sec total, median (range) | ours / no runtime | "
            + " | ".join(GROUPS) + " | total |")
    lines = [head, "|" + "---|" * (len(GROUPS) + 4)]
    for path in paths:
        s = summary[path]
        ratio = "–" if path == REFERENCE else _span(s["ratio"], ".2f")
        cells = [f"{s['cpu_pct'][g]:.0f}" if s["cpu_pct"][g] is not None else "n/a"
                 for g in GROUPS + ["total"]]
        failed = f" ({s['rounds_failed']} failed)" if s["rounds_failed"] else ""
        lines.append(f"| {DESCRIPTIONS[path]}{failed} | {_span(s['img_sec'], '.1f')} | {ratio} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- the driver --------------------------------------------------------------------------------

def _free_ports(n: int) -> List[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def commands(path: str, python: str,
             rank_cmd: List[str]) -> List[Tuple[List[str], Dict[str, str]]]:
    """The processes to start for one path: (command, extra environment) each."""
    launcher = [python, "-m", "horovod_compat.runner.launch"]
    if path == "horovodrun":
        return [(launcher + ["-np", "2", python] + rank_cmd, {})]
    if path == "horovodrun-gloo":
        return [(launcher + ["--gloo", "-np", "2", python] + rank_cmd, {})]
    if path == "horovodrun-gloo-unpinned":
        return [(launcher + ["--gloo", "-np", "2", "--binding-args=--bind-to none", python]
                 + rank_cmd, {})]
    mpirun = {"mpirun": [], "mpirun-bind-none": ["--bind-to", "none"],
              "mpirun-core-yield": ["--bind-to", "core", "--mca", "mpi_yield_when_idle", "1"]}
    if path in mpirun:
        return [(["mpirun", "-np", "2"] + mpirun[path] + [python] + rank_cmd, {})]
    if path == "tf-config":
        workers = [f"localhost:{p}" for p in _free_ports(2)]
        return [([python] + rank_cmd, {"TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})})
            for i in range(2)]
    no_runtime = rank_cmd + ["--no-horovod"]
    if path == "none":
        cpus = sorted(os.sched_getaffinity(0))
        return [(["taskset", "-c", str(cpus[i % len(cpus)]), python] + no_runtime, {})
                for i in range(2)]
    if path == "none-unpinned":
        return [([python] + no_runtime, {}) for _ in range(2)]
    raise ValueError(f"unknown path {path}")


def run_path(path: str, round_: int, python: str, example_args: List[str], batch: int,
             timeout: int, log_dir: str) -> Dict[str, Any]:
    out = tempfile.mkdtemp(prefix=f"b8-{path}-", dir=log_dir)
    rank_cmd = [os.path.abspath(__file__), "rank", "--out", out, "--"] + example_args
    env = dict(os.environ)
    # As root Open MPI refuses to start without these; they place nothing.
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    procs = []
    t0 = time.monotonic()
    for i, (cmd, extra) in enumerate(commands(path, python, rank_cmd)):
        log = open(os.path.join(out, f"launch-{i}.log"), "w")
        procs.append((subprocess.Popen(cmd, env=dict(env, **extra), stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True), log))
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(max(1.0, timeout - (time.monotonic() - t0))))
        except subprocess.TimeoutExpired:
            for p, _ in procs:  # the whole session of each: mpirun's ranks, launcher's children
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
            codes.append("timeout")
        log.close()
    files = sorted(f for f in os.listdir(out) if f.startswith("proc-") and f.endswith(".json"))
    results = []
    for name in files:
        with open(os.path.join(out, name)) as f:
            results.append(process_figures(json.load(f), batch))
    ok = codes == [0] * len(codes) and len(results) == 2
    run = {"path": path, "round": round_, "ok": ok, "exit_codes": codes, "log_dir": out,
           "seconds": round(time.monotonic() - t0, 1), "procs": results,
           "total_img_sec": sum(p["img_sec"] for p in results)}
    if not ok:
        tail = ""
        for name in sorted(os.listdir(out)):
            if name.startswith("launch-"):
                with open(os.path.join(out, name), errors="replace") as f:
                    tail += "".join(f.readlines()[-15:])
        run["log_tail"] = tail
    return run


def run_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="b8_overhead.py run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: one round, MobileNetV3Small 32x32, batch 4, 2x2 steps")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--model", default="ResNet50")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--per-iter", type=int, default=5)
    p.add_argument("--timeout", type=int, default=600, help="seconds per path and round")
    p.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "b8-np2.json"))
    p.add_argument("--keep-logs", action="store_true", help="keep each run's logs and samples")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.rounds, opts.model, opts.image_size, opts.batch_size = 1, "MobileNetV3Small", 32, 4
        opts.warmup, opts.iters, opts.per_iter = 1, 2, 2
    paths = [x for x in opts.paths.split(",") if x]
    unknown = [x for x in paths if x not in PATHS]
    if unknown:
        p.error(f"unknown paths {unknown}; known: {','.join(PATHS)}")
    if REFERENCE not in paths:
        paths.append(REFERENCE)
    example_args = ["--model", opts.model, "--image-size", str(opts.image_size),
                    "--batch-size", str(opts.batch_size),
                    "--num-warmup-batches", str(opts.warmup),
                    "--num-batches-per-iter", str(opts.per_iter), "--num-iters", str(opts.iters)]
    log_dir = tempfile.mkdtemp(prefix="b8-")
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load0 = open("/proc/loadavg").read().split()[:3]
    print(f"B8 overhead: {opts.model} {opts.image_size}x{opts.image_size}, batch "
          f"{opts.batch_size} per rank, np=2, {opts.rounds} round(s) over {len(paths)} paths; "
          f"{os.cpu_count()} CPUs, load {' '.join(load0)}; logs in {log_dir}", flush=True)
    runs = []
    for round_ in range(opts.rounds):
        for path in paths:
            run = run_path(path, round_, opts.python, example_args, opts.batch_size,
                           opts.timeout, log_dir)
            runs.append(run)
            state = (f"{run['total_img_sec']:.1f} img/sec" if run["ok"] else
                     f"FAILED (exit {run['exit_codes']}):\n{run.get('log_tail', '')}")
            print(f"  round {round_ + 1} {path}: {state} ({run['seconds']} s)", flush=True)
    summary = summarize(runs, paths)
    result = {"benchmark": "B8", "np": 2, "start_utc": start, "cpus": os.cpu_count(),
              "loadavg_start": load0, "loadavg_end": open("/proc/loadavg").read().split()[:3],
              "model": opts.model, "image_size": opts.image_size, "batch_size": opts.batch_size,
              "example_args": example_args, "rounds": opts.rounds, "paths": paths,
              "summary": summary, "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
    with open(opts.json, "w") as f:
        json.dump(result, f, indent=1)
    print()
    print(markdown(summary, paths))
    print(f"\nCPU columns: % of one core per rank over the timed steps (bench/b8_overhead.py "
          f"says which threads each holds); wrote {opts.json}")
    if not opts.keep_logs and all(r["ok"] for r in runs):
        subprocess.run(["rm", "-rf", log_dir], check=False)
    return 0 if all(r["ok"] for r in runs) else 1


def report_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="b8_overhead.py report")
    p.add_argument("json")
    opts = p.parse_args(argv)
    with open(opts.json) as f:
        result = json.load(f)
    print(markdown(result["summary"], result["paths"]))
    return 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "rank", "report"):
        print(__doc__)
        return 2
    what = {"run": run_main, "rank": rank_main, "report": report_main}[sys.argv[1]]
    return what(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
