"""B7's raw-MPI references through mpi4py: one Allreduce per tensor, and the same bytes as one
contiguous buffer reduced in chunks (best chunk size kept). In place, on the benchmark's own
duplicate of COMM_WORLD, like the core benchmarks' raw reference."""

from typing import Callable, Dict, List, Tuple

import numpy as np

from b7_common import check, expected_sum, pattern, time_interleaved

CHUNK_BYTES = (256 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20)


def _chunk_name(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def per_tensor(comm: object, counts: List[int]) -> Callable[[], None]:
    """Checks one pass on the closed-form inputs, then returns a step over zeros."""
    from mpi4py import MPI
    rank, size = comm.Get_rank(), comm.Get_size()
    bufs = [pattern(rank, t, n) for t, n in enumerate(counts)]
    for b in bufs:
        comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
    check("mpi4py per tensor", bufs, [expected_sum(size, t, n) for t, n in enumerate(counts)],
          exact=True)
    for b in bufs:
        b[:] = 0

    def step() -> None:
        for b in bufs:
            comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
    return step


def _chunked_step(comm: object, buf: np.ndarray, chunk_elems: int) -> Callable[[], None]:
    from mpi4py import MPI
    bounds = [(a, min(a + chunk_elems, buf.size)) for a in range(0, buf.size, chunk_elems)]

    def step() -> None:
        for a, b in bounds:
            comm.Allreduce(MPI.IN_PLACE, buf[a:b], op=MPI.SUM)
    return step


def best_chunked(comm: object, counts: List[int], reps: int
                 ) -> Tuple[Callable[[], None], Dict[str, object]]:
    """Sweeps CHUNK_BYTES over the set's total bytes (``reps`` timed passes each, after one
    checked pass), returns the best chunk's step and the sweep's medians in ms."""
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.concatenate([pattern(rank, t, n) for t, n in enumerate(counts)])
    want = np.concatenate([expected_sum(size, t, n) for t, n in enumerate(counts)])
    _chunked_step(comm, buf, (4 << 20) // 4)()
    check("mpi4py chunked", [buf], [want], exact=True)
    buf[:] = 0
    steps = {_chunk_name(c): _chunked_step(comm, buf, c // 4) for c in CHUNK_BYTES}
    times = time_interleaved(steps, warmup=1, steps=reps, comm=comm)
    medians = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    best = min(medians, key=medians.get)
    return steps[best], {"chunk_sweep_ms": medians, "best_chunk": best}
