"""B7: the allreduce path through TensorFlow (eager ops, tf.function, DistributedGradientTape)
beside the same work without the collectives and raw MPI through mpi4py (bench/README.md, B7).

    python bench/b7_tf_path.py --json out.json                  # np=1: the eager case only
    mpirun --bind-to core -np 2 python bench/b7_tf_path.py --json out.json   # every case

Under a launcher mpi4py initialises MPI first (MPI_THREAD_MULTIPLE) and ``hvd.init()`` borrows it;
the timing barriers and the raw reference use a duplicate of COMM_WORLD. Without one, neither
mpi4py nor MPI is touched. Every collective's result is checked against its closed-form value
before it is timed; a wrong value exits non-zero.

What each case times (the TF functions and the tape are checked again after the timed steps, on
the runtime's cached path; HOROVOD_* and TF's thread pools at their defaults):

- eager 4 B (np=1 plain python, unpinned; np=2 pinned): ``hvd.allreduce(x)`` (default op,
  Average) on a 1-element fp32 tensor, p50/p99 in blocks of 100 calls per variant (a cheap op
  timed right after an allreduce pays for the runtime's leftover work: ``tf.identity`` read
  30-45 us interleaved call by call, 12-15 us in blocks); beside it ``tf.identity(x)``, the
  generated op ``MPI_LIB.horovod_allreduce`` alone (no horovod_compat Python) and at np=2 mpi4py.
  run_tf.sh adds the core's B4 (``hvdc_bench b4 --sizes 4 --wait block``, np=1 and 2).
- small_mixed (1000 tensors, 4 B..64 KiB) in one ``tf.function`` returning
  ``hvd.grouped_allreduce(ts, op=Sum)`` or ``[hvd.allreduce(t, op=Sum) ...]``: us per tensor =
  (median step - median step of the same function returning ``tf.identity``s) / 1000; beside it
  mpi4py per tensor; the core's B3 from run_tf.sh.
- the ResNet-50 set (214 tensors, 97.6 MiB) through the same two functions (op Sum; the inputs
  are the caller's tensors, so TF cannot forward them to the outputs), and a ``tf.function`` train
  step through ``DistributedGradientTape`` (default op Average) over 214 variables whose
  gradients are fresh buffers (``tf.custom_gradient``: ``dy * pattern``, times a variable scale
  so that grappler cannot fold them); ms per set beyond the same function without the runtime.
  Beside them, in the same rounds: the core through its C API (b7_references: in place, out of
  place, Average), mpi4py per tensor and best chunked; the core's B1 from run_tf.sh.

The core's own figures (hvdc_bench) run before and after this script; the report divides by
their mean. With --loop-seconds one path repeats in a steady state for ``perf record`` of rank 0
(run_tf.sh b7; ``b7_report.py profile`` splits it by thread and symbol).
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from b7_common import (SET_DIR, check, expected_sum, load_set, pattern, stats,  # noqa: E402
                       time_interleaved)

PARTS = ("eager", "small", "resnet")
EAGER_BLOCK = 100  # eager calls in a row per variant and round (b7_common.time_interleaved)


def _launched() -> bool:
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ


def _exact(op_is_average: bool, size: int) -> bool:
    """Average divides by the size: exact in fp32 only for powers of two."""
    return not op_is_average or size & (size - 1) == 0


def _numpy(tensors: Any) -> List[np.ndarray]:
    return [t.numpy() for t in tensors]


def eager_case(tf: Any, hvd: Any, comm: Optional[Any], iters: int) -> Dict[str, Any]:
    """One 4 B tensor: hvd.allreduce (default op, Average), the generated op wrapper alone (no
    horovod_compat Python), tf.identity, and at np > 1 mpi4py's Allreduce; latency in µs."""
    from horovod_compat.tensorflow import mpi_ops
    rank, size = hvd.rank(), hvd.size()
    x = tf.constant(pattern(rank, 0, 1))
    want = [expected_sum(size, 0, 1) / size]
    op = mpi_ops.MPI_LIB.horovod_allreduce
    variants: Dict[str, Callable[[], Any]] = {
        "hvd.allreduce": lambda: hvd.allreduce(x),
        "generated op": lambda: op(x, reduce_op=hvd.Average, prescale_factor=1.0,
                                   postscale_factor=1.0, process_set_id=0),
        "tf.identity": lambda: tf.identity(x),
    }
    for name in ("hvd.allreduce", "generated op"):
        check(f"eager {name}", [variants[name]().numpy()], want, _exact(True, size))
    if comm is not None and size > 1:
        from mpi4py import MPI
        a = pattern(rank, 0, 1)
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        check("eager mpi4py", [a], [expected_sum(size, 0, 1)], exact=True)
        a[:] = 0
        variants["mpi4py Allreduce"] = lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
    block = min(EAGER_BLOCK, iters)
    rounds = max(1, iters // block)
    times = time_interleaved(variants, warmup=1, steps=rounds, comm=comm, block=block)
    check("eager hvd.allreduce after timing", [variants["hvd.allreduce"]().numpy()], want,
          _exact(True, size))
    return {"bytes": 4, "iters": rounds * block, "calls_in_a_row": block,
            "op": "average (hvd default); mpi4py sum",
            "latency_us": {k: stats(v, 1e6) for k, v in times.items()}}


def _function_variants(tf: Any, hvd: Any) -> Dict[str, Any]:
    """The three tf.functions every tensor-set case compares: grouped, per tensor, none."""
    return {
        "tf.function grouped_allreduce": tf.function(
            lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum), autograph=False),
        "tf.function allreduce per tensor": tf.function(
            lambda ts: [hvd.allreduce(t, op=hvd.Sum) for t in ts], autograph=False),
        "tf.function identity (no collectives)": tf.function(
            lambda ts: [tf.identity(t) for t in ts], autograph=False),
    }


def _set_inputs(tf: Any, rank: int, size: int, counts: List[int]):
    inputs = [tf.constant(pattern(rank, t, n)) for t, n in enumerate(counts)]
    want = [expected_sum(size, t, n) for t, n in enumerate(counts)]
    return inputs, want


def _check_function(name: str, out: Any, inputs: List[Any], want: List[np.ndarray]) -> None:
    if "identity" in name:
        check(name, _numpy(out), [x.numpy().astype(np.float64) for x in inputs], exact=True)
    else:
        check(name, _numpy(out), want, exact=True)


def _checked_functions(tf: Any, hvd: Any, inputs: List[Any], want: List[np.ndarray],
                       first_call_s: Dict[str, float]) -> Dict[str, Callable[[], Any]]:
    """Calls each function once (traces it: seconds into ``first_call_s``) and checks its
    results; returns timed steps."""
    steps = {}
    for name, fn in _function_variants(tf, hvd).items():
        t0 = time.monotonic()
        out = fn(inputs)
        first_call_s[name] = time.monotonic() - t0
        _check_function(name, out, inputs, want)
        steps[name] = (lambda f: lambda: f(inputs))(fn)
    return steps


def _check_again(steps: Dict[str, Callable[[], Any]], inputs: List[Any],
                 want: List[np.ndarray]) -> None:
    """After timing (the runtime's cached, steady-state path): every function's result again."""
    for name, step in steps.items():
        if name.startswith("tf.function"):
            _check_function(name + " after timing", step(), inputs, want)


def small_case(tf: Any, hvd: Any, comm: Any, set_name: str, warmup: int, steps: int
               ) -> Dict[str, Any]:
    """The small-tensor set inside one tf.function; µs per tensor beyond the identity function."""
    import b7_references
    counts = load_set(set_name)
    inputs, want = _set_inputs(tf, hvd.rank(), hvd.size(), counts)
    first: Dict[str, float] = {}
    variants = _checked_functions(tf, hvd, inputs, want, first)
    variants["mpi4py Allreduce per tensor"] = b7_references.mpi_per_tensor(comm, counts)
    times = time_interleaved(variants, warmup=warmup, steps=steps, comm=comm)
    _check_again(variants, inputs, want)
    base = float(np.median(times["tf.function identity (no collectives)"]))
    per_tensor_us = {}
    for k, v in times.items():
        extra = float(np.median(v)) - (0.0 if k.startswith("mpi4py") else base)
        per_tensor_us[k] = extra / len(counts) * 1e6
    return {"tensor_set": set_name, "tensors": len(counts), "bytes": 4 * sum(counts),
            "op": "sum", "step_ms": {k: stats(v, 1e3) for k, v in times.items()},
            "us_per_tensor_beyond_identity": per_tensor_us, "first_call_s": first}


def _tape_steps(tf: Any, hvd: Any, rank: int, counts: List[int]) -> Dict[str, Callable[[], Any]]:
    """tf.function train steps over variables shaped like the set: the loss is a sum of cheap
    terms whose gradient is ``pattern(rank, t) * dy`` (one multiply: a fresh buffer, as a real
    gradient is); with hvd.DistributedGradientTape (default op Average) and without. The loss
    is scaled by a variable (1.0) so that dy is known only at run time: otherwise grappler
    folds every gradient into a constant."""
    variables = [tf.Variable(tf.zeros([n]), name=f"v{t}") for t, n in enumerate(counts)]
    grads_of = [tf.constant(pattern(rank, t, n)) for t, n in enumerate(counts)]
    scale = tf.Variable(1.0, name="loss_scale")

    def term(c: Any) -> Callable[[Any], Any]:
        @tf.custom_gradient
        def f(x: Any) -> Any:
            return tf.reduce_sum(x[:1]), lambda dy: dy * c
        return f

    terms = [term(c) for c in grads_of]

    def make(distributed: bool) -> Any:
        @tf.function(autograph=False)
        def step() -> List[Any]:
            with tf.GradientTape() as tape:
                loss = tf.add_n([f(v.value()) for f, v in zip(terms, variables)]) * scale
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            return tape.gradient(loss, variables)
        return step

    return {"DistributedGradientTape step": make(True),
            "tf.GradientTape step (no runtime)": make(False)}


# The core driven through its C API in this process, in the same rounds as the TF variants.
CORE_IN_PROCESS = "core C API per tensor (in process)"
CORE_IN_PROCESS_AVG = "core C API per tensor, average (in process)"  # the tape's reference
# Into separate outputs, as the tf.functions' ops must (their inputs are the caller's tensors).
CORE_IN_PROCESS_OOP = "core C API per tensor, out of place (in process)"


def resnet_case(tf: Any, hvd: Any, comm: Any, set_name: str, warmup: int, steps: int,
                chunk_reps: int) -> Dict[str, Any]:
    """The ResNet-50 gradient set: tf.functions and tape steps, ms per set beyond the same
    function without the runtime; mpi4py per tensor and best chunked; the core itself through
    its C API (b7_references), interleaved with them."""
    import b7_references
    rank, size = hvd.rank(), hvd.size()
    counts = load_set(set_name)
    inputs, want = _set_inputs(tf, rank, size, counts)
    first: Dict[str, float] = {}
    variants = _checked_functions(tf, hvd, inputs, want, first)
    for name, fn in _tape_steps(tf, hvd, rank, counts).items():
        t0 = time.monotonic()
        got = _numpy(fn())
        first[name] = time.monotonic() - t0
        if "Distributed" in name:
            check(name, got, [w / size for w in want], _exact(True, size))
        else:
            check(name, got, [pattern(rank, t, n).astype(np.float64)
                              for t, n in enumerate(counts)], exact=True)
        variants[name] = fn
    variants["mpi4py Allreduce per tensor"] = b7_references.mpi_per_tensor(comm, counts)
    variants[CORE_IN_PROCESS] = b7_references.core_per_tensor(rank, size, counts)
    variants[CORE_IN_PROCESS_AVG] = b7_references.core_per_tensor(
        rank, size, counts, average=True, prefix="b7.core_avg")
    variants[CORE_IN_PROCESS_OOP] = b7_references.core_per_tensor(
        rank, size, counts, out_of_place=True, prefix="b7.core_oop")
    chunked, sweep = b7_references.mpi_best_chunked(comm, counts, chunk_reps)
    variants["mpi4py chunked (best)"] = chunked
    times = time_interleaved(variants, warmup=warmup, steps=steps, comm=comm)
    _check_again(variants, inputs, want)
    tape = variants["DistributedGradientTape step"]
    check("DistributedGradientTape after timing", _numpy(tape()), [w / size for w in want],
          _exact(True, size))
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    fn_base = med["tf.function identity (no collectives)"]
    tape_base = med["tf.GradientTape step (no runtime)"]
    beyond = {
        "tf.function grouped_allreduce": med["tf.function grouped_allreduce"] - fn_base,
        "tf.function allreduce per tensor": med["tf.function allreduce per tensor"] - fn_base,
        "DistributedGradientTape": med["DistributedGradientTape step"] - tape_base,
        "mpi4py Allreduce per tensor": med["mpi4py Allreduce per tensor"],
        "mpi4py chunked (best)": med["mpi4py chunked (best)"],
        CORE_IN_PROCESS: med[CORE_IN_PROCESS],
        CORE_IN_PROCESS_AVG: med[CORE_IN_PROCESS_AVG],
        CORE_IN_PROCESS_OOP: med[CORE_IN_PROCESS_OOP],
    }
    return {"tensor_set": set_name, "tensors": len(counts), "bytes": 4 * sum(counts),
            "op": "sum in the tf.functions and mpi4py; average (its default) in the tape",
            "step_ms": {k: stats(v, 1e3) for k, v in times.items()},
            "ms_per_set_beyond_baseline": beyond, "first_call_s": first, **sweep}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="", help="comma list of eager,small,resnet "
                   "(default: eager at np=1, all three under a launcher)")
    p.add_argument("--eager-iters", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--resnet-warmup", type=int, default=3)
    p.add_argument("--resnet-steps", type=int, default=15)
    p.add_argument("--chunk-reps", type=int, default=3)
    p.add_argument("--small-set", default="small_mixed")
    p.add_argument("--resnet-set", default="resnet50_keras")
    p.add_argument("--loop-seconds", type=float, default=0.0,
                   help="profiling: instead of measuring, repeat the first part's hvd variant "
                   "for this long (eager: hvd.allreduce; small: per-tensor tf.function)")
    p.add_argument("--loop-variant", choices=("hvd", "identity"), default="hvd",
                   help="with --loop-seconds: identity loops over the same work without the "
                   "runtime (tf.identity / the identity tf.function)")
    p.add_argument("--perf-out", default="",
                   help="with --loop-seconds: perf record -g rank 0's loop into this file")
    p.add_argument("--perf-freq", type=int, default=2000)
    p.add_argument("--json", default="")
    return p.parse_args(argv)


def profile_loop(tf: Any, hvd: Any, part: str, variant: str, seconds: float,
                 comm: Optional[Any], perf_out: str, perf_freq: int) -> Tuple[int, float]:
    """Repeats one path for ``seconds`` after a warm-up, with ``perf record -g`` attached to this
    process (rank 0 only, when ``perf_out`` is given) for exactly that loop; returns (calls,
    seconds looped). ``variant`` hvd: eager hvd.allreduce / the per-tensor tf.function;
    identity: tf.identity / the identity tf.function (the same loop without the runtime)."""
    if part == "eager":
        x = tf.constant(pattern(hvd.rank(), 0, 1))
        call = (lambda: hvd.allreduce(x)) if variant == "hvd" else (lambda: tf.identity(x))
        batch = 100
    else:
        counts = load_set("small_mixed")
        inputs, want = _set_inputs(tf, hvd.rank(), hvd.size(), counts)
        name = ("tf.function allreduce per tensor" if variant == "hvd" else
                "tf.function identity (no collectives)")
        fn = _function_variants(tf, hvd)[name]
        _check_function(name, fn(inputs), inputs, want)
        call, batch = (lambda: fn(inputs)), 2
    for _ in range(batch * 5):
        call()
    perf = None
    if perf_out and hvd.rank() == 0:
        # Pinned to one CPU: sample that CPU (per-CPU events cost far less at every context
        # switch than per-thread ones; the split keeps this process's samples only).
        cpus = sorted(os.sched_getaffinity(0))
        target = ["-C", str(cpus[0])] if len(cpus) == 1 else ["-p", str(os.getpid())]
        perf = subprocess.Popen(["perf", "record", "-q", "-g", "-F", str(perf_freq), "-o",
                                 perf_out] + target)
        time.sleep(0.5)  # let it attach
    if comm is not None:
        comm.Barrier()
    # The ranks must make the same number of calls: rank 0 decides when to stop.
    n, stop, t0 = 0, np.zeros(1, dtype=np.int32), time.monotonic()
    while True:
        for _ in range(batch):
            call()
        n += batch
        stop[0] = int(time.monotonic() - t0 >= seconds)
        if comm is not None:
            comm.Bcast(stop, root=0)
        if stop[0]:
            break
    looped = time.monotonic() - t0
    if perf is not None:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)
    return n, looped


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    comm = None
    if _launched():
        from mpi4py import MPI  # initialises MPI (THREAD_MULTIPLE) before the runtime does
        comm = MPI.COMM_WORLD.Dup()
    import tensorflow as tf
    import horovod_compat.tensorflow as hvd
    hvd.init()
    size = hvd.size()
    parts = [p for p in args.parts.split(",") if p] or (list(PARTS) if size > 1 else ["eager"])
    if size > 1 and comm is None:
        raise SystemExit("b7: np > 1 needs mpirun (mpi4py carries the barriers and reference)")
    if args.loop_seconds > 0:
        n, looped = profile_loop(tf, hvd, parts[0], args.loop_variant, args.loop_seconds, comm,
                                 args.perf_out, args.perf_freq)
        if hvd.rank() == 0:
            print(f"b7 profile loop: {parts[0]} x {n} in {looped:.3f} s, pid {os.getpid()}")
        hvd.shutdown()
        return 0
    result: Dict[str, Any] = {
        "benchmark": "B7", "np": size, "launcher": "mpirun" if comm is not None else "none",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_before": open("/proc/loadavg").read().split()[:3],
        "python": platform.python_version(), "tensorflow": tf.__version__,
        "horovod_compat": os.path.dirname(os.path.abspath(hvd.__file__)),
        "cpus_allowed": len(os.sched_getaffinity(0)), "tensor_dir": SET_DIR,
        "tf_threads": {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                       "inter_op": tf.config.threading.get_inter_op_parallelism_threads()},
        "verified": False}
    cases = {
        "eager": lambda: eager_case(tf, hvd, comm, args.eager_iters),
        "small": lambda: small_case(tf, hvd, comm, args.small_set, args.warmup, args.steps),
        "resnet": lambda: resnet_case(tf, hvd, comm, args.resnet_set, args.resnet_warmup,
                                      args.resnet_steps, args.chunk_reps),
    }
    t0 = time.monotonic()
    for part in parts:
        t = time.monotonic()
        result[part] = cases[part]()
        result[part]["seconds"] = time.monotonic() - t
        if hvd.rank() == 0:
            print(f"b7 np={size}: {part} verified and measured in {result[part]['seconds']:.1f} s",
                  flush=True)
    result["verified"] = True
    result["seconds"] = time.monotonic() - t0
    result["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    if hvd.rank() == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        print(f"b7 np={size}: parts {','.join(parts)} verified, {result['seconds']:.1f} s")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
