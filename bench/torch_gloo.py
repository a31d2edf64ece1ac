#!/usr/bin/env python3
"""torch.distributed's gloo backend doing the work of hvdc_bench's B1, B3 and B4 (bench/README.md,
"torch.distributed gloo, same run"): a benchmark-only comparison, not part of the project.

    mpirun --timeout 300 -np 2 --bind-to core PYTHON bench/torch_gloo.py b1,b3,b4 --out-dir DIR

mpirun only starts the ranks (rank and size from OMPI_COMM_WORLD_RANK/SIZE): the process group
meets over a FileStore named after the mpirun job (--init-file to choose one) and gloo's data
plane runs over TCP on --iface (lo by default, GLOO_SOCKET_IFNAME). Nothing here uses MPI.

What is measured, as hvdc_bench measures it (bench/b1_b2_throughput.cc, b3_small.cc,
b4_latency.cc): fp32 Sum, values checked exactly first (rank + 1 + (j + 3 i) % 7 in element j of
tensor i), then timed steps on zeros; every step starts after a barrier and is timed on each rank
with a monotonic clock; a step's time is the max over ranks; variants are interleaved round by
round. Writes <b>-torchgloo-np<N>.json per benchmark into --out-dir.

  B1  resnet50_keras (214 tensors, 97.6 MiB): per-tensor (one blocking all_reduce per tensor);
      per-tensor async (all issued with async_op=True, then waited); best-chunked (the set already
      in one flat buffer, reduced as chunks of k bytes, k swept over 256 KiB..32 MiB and whole, as
      the raw MPI reference does); and fused + copies (pack into the flat buffer, best-chunked
      all_reduce, unpack: the copies a fusion buffer or a DDP bucket costs).
  B3  small_mixed (1000 tensors) and 2000 x 1 KiB: per-tensor, per-tensor async, and fused (pack,
      one all_reduce, unpack); microseconds per tensor.
  B4  one 4 B and one 1 KiB all_reduce, p50/p99 over --iters.

Needs torch (any build whose torch.distributed.is_gloo_available()); exits 3 with a message
when torch is missing, so that bench/run.sh can say it skipped.
"""
import argparse
import gc
import json
import math
import os
import platform
import socket
import sys
import tempfile
import time

KIB = 1024
MIB = 1024 * 1024
CHUNKS = [256 * KIB, 1 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB, 0]  # 0 = whole
HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # reported by bench/run.sh as "skipped (no torch)"
    print(f"torch_gloo.py: torch is not importable here ({e})", file=sys.stderr)
    sys.exit(3)


# ---------------------------------------------------------------- helpers

def fmt_bytes(b):
    if b < KIB:
        return f"{b:.0f} B"
    if b < MIB:
        return f"{b / KIB:.4g} KiB"
    return f"{b / MIB:.4g} MiB"


def chunk_label(c):
    return "whole" if c == 0 else fmt_bytes(c)


def stats(values, scale=1.0):
    """The fields Json::FromStats writes (bench/common.cc): median, nearest-rank p90/p99."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        return {"n": 0}
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else 0.0
    med = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

    def pct(q):
        i = max(int(math.ceil(q * n)) - 1, 0)
        return v[min(i, n - 1)]

    return {"n": n, "median": med * scale, "p90": pct(0.90) * scale, "p99": pct(0.99) * scale,
            "mean": mean * scale, "stddev": sd * scale, "ci95_halfwidth": 1.96 * sd * scale,
            "min": v[0] * scale, "max": v[-1] * scale}


def load_set(name):
    path = os.path.join(HERE, "tensor_sets", name + ".txt")
    with open(path) as f:
        counts = [int(line.split()[0]) for line in f
                  if line.strip() and not line.lstrip().startswith("#")]
    if not counts or min(counts) <= 0:
        raise SystemExit(f"torch_gloo.py: {path}: bad tensor set")
    return counts


def fill(t, rank, index):
    """rank + 1 + (j + 3 index) % 7 in element j, as FillPattern in bench/common.cc."""
    j = torch.arange(t.numel(), dtype=torch.int64)
    t.copy_(((j + 3 * index) % 7 + rank + 1).to(torch.float32))


def expected(n, size, index):
    j = torch.arange(n, dtype=torch.int64)
    return (size * (size + 1) // 2 + size * ((j + 3 * index) % 7)).to(torch.float32)


class World:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def log(self, msg):
        if self.rank == 0:
            print(msg, flush=True)

    def max_over_ranks(self, values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def all_ok(self, ok):
        t = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item()) == 1

    def time_interleaved(self, variants, warmup, steps):
        """TimeInterleaved (bench/common.cc): round robin over variants, each step after a
        barrier, local times kept, then the max over ranks per step."""
        local = [[] for _ in variants]
        nv = len(variants)
        clock = time.perf_counter
        # Python's cyclic GC would otherwise run inside timed steps (11 % of a rank's samples in
        # a perf profile of B4): collect once, then keep it off while timing, as timeit does.
        gc.collect()
        gc.disable()
        try:
            self._rounds(variants, warmup, steps, local, clock)
        finally:
            gc.enable()
        flat = self.max_over_ranks([x for per in local for x in per])
        return [flat[i * steps:(i + 1) * steps] for i in range(nv)]

    @staticmethod
    def _rounds(variants, warmup, steps, local, clock):
        nv = len(variants)
        for rnd in range(warmup + steps):
            for k in range(nv):
                idx = (k + rnd) % nv
                dist.barrier()
                t0 = clock()
                variants[idx]()
                t = clock() - t0
                if rnd >= warmup:
                    local[idx].append(t)


def verify(w, what, tensors):
    bad = None
    for i, t in enumerate(tensors):
        if not torch.equal(t, expected(t.numel(), w.size, i)):
            diff = (t != expected(t.numel(), w.size, i)).nonzero()[0].item()
            bad = f"{what}: tensor {i} element {diff}: got {t[diff].item()}"
            break
    if not w.all_ok(bad is None):
        raise SystemExit(f"torch_gloo.py: wrong answer: {bad or 'on another rank'}")


def allreduce_each(tensors):
    for t in tensors:
        dist.all_reduce(t)


def allreduce_each_async(tensors):
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for h in works:
        h.wait()


def allreduce_chunked(flat, chunk_bytes):
    n = flat.numel()
    step = n if chunk_bytes == 0 else max(1, chunk_bytes // 4)
    for off in range(0, n, step):
        dist.all_reduce(flat[off:off + step])


def pack(tensors, flat):
    torch.cat(tensors, out=flat)


def unpack(flat, tensors):
    off = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[off:off + n])
        off += n


def step_json(s, nbytes, size):
    algbw = nbytes / s["median"]
    return {"time_s": s, "algbw_GBps": algbw * 1e-9,
            "busbw_GBps": algbw * 2 * (size - 1) / size * 1e-9}


# ---------------------------------------------------------------- benchmarks

def run_b1(w, a):
    counts = load_set("resnet50_keras")
    total = sum(counts)
    nbytes = 4 * total
    w.log(f"B1 resnet50_keras: {len(counts)} tensors, {fmt_bytes(nbytes)} per rank, torch gloo,"
          f" {a.warmup} warm-up + {a.steps} measured steps")
    tensors = [torch.empty(c, dtype=torch.float32) for c in counts]
    flat = torch.empty(total, dtype=torch.float32)

    # Right answers first, for every way of reducing the set.
    for i, t in enumerate(tensors):
        fill(t, w.rank, i)
    allreduce_each(tensors)
    verify(w, "per-tensor", tensors)
    for i, t in enumerate(tensors):
        fill(t, w.rank, i)
    allreduce_each_async(tensors)
    verify(w, "per-tensor async", tensors)
    for i, t in enumerate(tensors):
        fill(t, w.rank, i)
    pack(tensors, flat)
    allreduce_chunked(flat, 4 * MIB)
    unpack(flat, tensors)
    verify(w, "fused 4 MiB chunks", tensors)
    w.log("  verified: every torch variant reduces to the closed-form values")
    for t in tensors:
        t.zero_()
    flat.zero_()

    used = [c for c in CHUNKS if c == 0 or c < nbytes]
    times = w.time_interleaved([lambda c=c: allreduce_chunked(flat, c) for c in used], 1,
                               a.chunk_reps)
    sweep = [(c, stats(t)) for c, t in zip(used, times)]
    best_chunk, best = min(sweep, key=lambda e: e[1]["median"])

    def fused():
        pack(tensors, flat)
        allreduce_chunked(flat, best_chunk)
        unpack(flat, tensors)

    names = ["torch per-tensor", "torch per-tensor async", "torch best-chunked",
             "torch fused + copies"]
    times = w.time_interleaved([lambda: allreduce_each(tensors),
                                lambda: allreduce_each_async(tensors),
                                lambda: allreduce_chunked(flat, best_chunk), fused],
                               a.warmup, a.steps)
    st = [stats(t) for t in times]
    w.log(f"  {'':36} {'median ms':>9} {'p90 ms':>9} {'algbw':>7}")
    for n_, s in zip(names, st):
        label = n_ + (f" ({chunk_label(best_chunk)})" if "chunk" in n_ or "fused" in n_ else "")
        w.log(f"  {label:36} {s['median'] * 1e3:9.2f} {s['p90'] * 1e3:9.2f}"
              f" {nbytes / s['median'] * 1e-9:7.2f}")
    w.log("  chunk sweep (median ms): " +
          " ".join(f"{chunk_label(c)} {s['median'] * 1e3:.1f}" for c, s in sweep))
    return {
        "tensor_set": "resnet50_keras", "tensors": len(counts), "bytes": nbytes,
        "reduce_op": "sum", "warmup": a.warmup, "steps": a.steps, "verified": True,
        "torch_per_tensor": step_json(st[0], nbytes, w.size),
        "torch_per_tensor_async": step_json(st[1], nbytes, w.size),
        "torch_best_chunked": dict(step_json(st[2], nbytes, w.size), chunk_bytes=best_chunk),
        "torch_fused_with_copies": dict(step_json(st[3], nbytes, w.size), chunk_bytes=best_chunk),
        "chunk_sweep": {
            "chunks": [dict(step_json(s, nbytes, w.size), chunk_bytes=c, chunk=chunk_label(c))
                       for c, s in sweep],
            "best_chunk_bytes": best_chunk, "best_chunk": chunk_label(best_chunk),
            "best_time_s": best},
    }


def run_b3_set(w, a, name, counts):
    total = sum(counts)
    n = len(counts)
    tensors = [torch.empty(c, dtype=torch.float32) for c in counts]
    flat = torch.empty(total, dtype=torch.float32)
    for i, t in enumerate(tensors):
        fill(t, w.rank, i)
    allreduce_each(tensors)
    verify(w, name + " per-tensor", tensors)
    for i, t in enumerate(tensors):
        fill(t, w.rank, i)
    allreduce_each_async(tensors)
    verify(w, name + " per-tensor async", tensors)
    for i, t in enumerate(tensors):
        fill(t, w.rank, i)
    pack(tensors, flat)
    dist.all_reduce(flat)
    unpack(flat, tensors)
    verify(w, name + " fused", tensors)
    for t in tensors:
        t.zero_()

    def fused():
        pack(tensors, flat)
        dist.all_reduce(flat)
        unpack(flat, tensors)

    names = ["per-tensor", "per-tensor async", "fused (pack, 1 all_reduce, unpack)"]
    times = w.time_interleaved([lambda: allreduce_each(tensors),
                                lambda: allreduce_each_async(tensors), fused],
                               a.warmup, a.steps)
    st = [stats(t) for t in times]
    w.log(f"B3 {name}: {n} tensors, {fmt_bytes(4 * total)} per rank, torch gloo")
    w.log(f"  {'':36} {'median ms':>10} {'p90 ms':>10} {'us/tensor':>10}")
    for n_, s in zip(names, st):
        w.log(f"  {'torch ' + n_:36} {s['median'] * 1e3:10.3f} {s['p90'] * 1e3:10.3f}"
              f" {s['median'] / n * 1e6:10.2f}")
    out = {"tensor_set": name, "tensors": n, "bytes": 4 * total, "verified": True}
    for key, s in zip(("torch_per_tensor", "torch_per_tensor_async", "torch_fused"), st):
        out[key + "_time_s"] = s
        out[key + "_us_per_tensor"] = s["median"] / n * 1e6
    return out


def run_b3(w, a):
    sets = [run_b3_set(w, a, "small_mixed", load_set("small_mixed")),
            run_b3_set(w, a, f"{a.count}x{a.bytes}B", [max(a.bytes // 4, 1)] * a.count)]
    return {"reduce_op": "sum", "warmup": a.warmup, "steps": a.steps, "sets": sets}


def run_b4(w, a):
    warmup = max(10, a.iters // 100)
    w.log(f"B4 latency, torch gloo, {a.iters} iterations each (+{warmup} warm-up),"
          " max over ranks per iteration")
    w.log(f"  {'size':8} {'variant':22} {'p50 us':>9} {'p99 us':>9} {'mean us':>9} {'max us':>9}")
    sizes = []
    for nbytes in (4, 1 * KIB):
        t = torch.empty(max(nbytes // 4, 1), dtype=torch.float32)
        fill(t, w.rank, 0)
        dist.all_reduce(t)
        verify(w, f"B4 {nbytes} B", [t])
        t.zero_()
        s = stats(w.time_interleaved([lambda: dist.all_reduce(t)], warmup, a.iters)[0], 1e6)
        w.log(f"  {fmt_bytes(nbytes):8} {'torch all_reduce':22} {s['median']:9.1f} {s['p99']:9.1f}"
              f" {s['mean']:9.1f} {s['max']:9.1f}")
        sizes.append({"bytes": nbytes, "latency_us": {"torch all_reduce": s}})
    return {"iters": a.iters, "warmup": warmup, "sizes": sizes}


# ---------------------------------------------------------------- main

def header(w, name, a):
    with open("/proc/loadavg") as f:
        load = f.read().strip()
    allowed = w.max_over_ranks([float(len(os.sched_getaffinity(0)))])[0]
    return {
        "benchmark": name, "np": w.size, "backend": "gloo",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(), "cores": os.cpu_count(),
        "max_cpus_allowed_per_rank": int(allowed), "pinned": allowed == 1,
        "loadavg_at_start": a.load_at_start, "loadavg_at_end": load,
        "torch_version": torch.__version__, "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME", ""),
        "timer": "time.perf_counter around the Python call, max over ranks",
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("benchmarks", nargs="?", default="b1,b3,b4", help="comma list of b1,b3,b4")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--iface", default="lo", help="GLOO_SOCKET_IFNAME (default lo)")
    p.add_argument("--init-file", help="FileStore path (default: one per mpirun job in $TMPDIR)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--chunk-reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=10000)
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--bytes", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--tag", default="", help="JSON as <b>-torchgloo<TAG>-np<N>.json")
    a = p.parse_args()
    with open("/proc/loadavg") as f:
        a.load_at_start = f.read().strip()

    try:
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    except KeyError:
        raise SystemExit("torch_gloo.py: run it under mpirun (OMPI_COMM_WORLD_RANK/SIZE unset)")
    if not dist.is_gloo_available():
        print("torch_gloo.py: this torch has no gloo backend", file=sys.stderr)
        sys.exit(3)
    job = os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMIX_NAMESPACE", "x")
    store = a.init_file or os.path.join(tempfile.gettempdir(), f"hvdc-torchgloo-{job}.store")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", a.iface)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=size)
    w = World(rank, size)
    w.log(f"torch {torch.__version__} gloo, np={size}, iface {os.environ['GLOO_SOCKET_IFNAME']},"
          f" load average {a.load_at_start}")
    runners = {"b1": run_b1, "b3": run_b3, "b4": run_b4}
    for name in a.benchmarks.split(","):
        if name not in runners:
            raise SystemExit(f"torch_gloo.py: unknown benchmark {name} (b1, b3, b4)")
        result = runners[name](w, a)
        out = dict(header(w, name, a), **result)
        if rank == 0:
            os.makedirs(a.out_dir, exist_ok=True)
            path = os.path.join(a.out_dir, f"{name}-torchgloo{a.tag}-np{size}.json")
            with open(path, "w") as f:
                json.dump(out, f, indent=1)
                f.write("\n")
            print(f"  -> {path}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
