"""B7 helpers: tensor sets, closed-form input patterns, statistics and interleaved timing.

Nothing here imports TensorFlow or horovod_compat, so the raw-MPI reference and the report can
use it alone.
"""

import functools
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

SET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tensor_sets")


def load_set(name: str, tensor_dir: str = SET_DIR) -> List[int]:
    """Element counts (float32) of ``<tensor_dir>/<name>.txt``: one count a line, '#' comments."""
    counts = []
    with open(os.path.join(tensor_dir, name + ".txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                counts.append(int(line))
    return counts


@functools.lru_cache(maxsize=None)
def _pattern(rank: int, tensor: int, count: int) -> np.ndarray:
    i = np.arange(count, dtype=np.int32)
    a = (((i * 3 + (tensor * 7 + rank * 5) % 17) % 17) - 8).astype(np.float32)
    a.flags.writeable = False
    return a


def pattern(rank: int, tensor: int, count: int) -> np.ndarray:
    """Rank ``rank``'s input for tensor ``tensor``: small integers in [-8, 8], exact in fp32.
    A fresh, writable copy (the values are computed once per process)."""
    return _pattern(rank, tensor, count).copy()


@functools.lru_cache(maxsize=None)
def expected_sum(size: int, tensor: int, count: int) -> np.ndarray:
    """Sum over ranks 0..size-1 of ``pattern`` in float64 (exact: |sum| <= 8 * size); shared,
    read-only."""
    total = np.zeros(count, dtype=np.float64)
    for r in range(size):
        total += _pattern(r, tensor, count)
    total.flags.writeable = False
    return total


def check(what: str, got: Sequence[np.ndarray], want: Sequence[np.ndarray], exact: bool) -> None:
    """Raises AssertionError naming the first wrong tensor and element."""
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} results for {len(want)} tensors")
    for t, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g, dtype=np.float64).reshape(-1)
        if g.shape != w.shape:
            raise AssertionError(f"{what}: tensor {t} has {g.size} elements, want {w.size}")
        bad = g != w if exact else ~np.isclose(g, w, rtol=1e-6, atol=1e-6)
        if bad.any():
            i = int(np.argmax(bad))
            raise AssertionError(f"{what}: tensor {t} element {i} = {g[i]!r}, want {w[i]!r}")


def stats(samples: Sequence[float], scale: float = 1.0) -> Dict[str, float]:
    """median, p90, p99, mean, min, max and n of ``samples`` times ``scale``."""
    a = np.asarray(samples, dtype=np.float64) * scale
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "min": float(a.min()),
            "max": float(a.max())}


def time_interleaved(variants: Dict[str, Callable[[], object]], warmup: int, steps: int,
                     comm: Optional[object] = None, block: int = 1) -> Dict[str, np.ndarray]:
    """Seconds per call of each variant, run in rounds whose order rotates every round; in each
    round a variant makes ``block`` calls in a row (so that a cheap variant is not timed in the
    wake of an expensive one: leftover work of the runtime's threads, cold caches).
    ``warmup`` and ``steps`` count rounds.

    With an mpi4py ``comm``: a barrier before every call and, at the end, the per-call maximum
    over ranks (as the core benchmarks do with MPI_Barrier / MPI_Wtime / MPI_Allreduce MAX).
    """
    names = list(variants)
    local: Dict[str, List[float]] = {n: [] for n in names}
    clock = time.perf_counter
    for rnd in range(warmup + steps):
        for k in range(len(names)):
            name = names[(k + rnd) % len(names)]
            fn = variants[name]
            for _ in range(block):
                if comm is not None:
                    comm.Barrier()
                t0 = clock()
                fn()
                t = clock() - t0
                if rnd >= warmup:
                    local[name].append(t)
    out = {}
    for name in names:
        a = np.asarray(local[name], dtype=np.float64)
        if comm is not None:
            from mpi4py import MPI
            b = np.empty_like(a)
            comm.Allreduce(a, b, op=MPI.MAX)
            a = b
        out[name] = a
    return out
