"""B7's references without TensorFlow, run in the TF benchmark's own process and rounds.

The core (``core_per_tensor``): the runtime's C API (``hvdc_enqueue``, core/c_api.h) called through
ctypes on numpy buffers, one request per tensor, all enqueued at once, in place -- what
``hvdc_bench b1`` does, but in the same process and the same interleaved rounds as the TensorFlow
variants, so that their ratio is not at the mercy of the minutes between two processes (the VM's
speed moves by 2x between them). It runs on the runtime ``hvd.init()`` started (ctypes opens the
same libhvdc_core.so, so it finds the same instance). Each tensor's ``done`` is a Python callback:
it takes the GIL on the runtime's executor thread while the caller waits with the GIL released: a
cost per tensor that ``hvdc_bench`` does not pay (not measured on its own).

Raw MPI through mpi4py (``mpi_per_tensor``, ``mpi_best_chunked``): one Allreduce per tensor, and
the same bytes as one contiguous buffer reduced in chunks (best chunk size kept). In place, on the
benchmark's own duplicate of COMM_WORLD, like the core benchmarks' raw reference.
"""

import ctypes
import os
import threading
from typing import Callable, Dict, List, Tuple

import numpy as np

from b7_common import check, expected_sum, pattern, time_interleaved

# ---- the core through its C API (core/c_api.h)

_MAX_DIMS = 32
_OP_ALLREDUCE = 0
_SUM = 1
_FLOAT32 = 7
_OK = 0


class _Tensor(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("dims", ctypes.c_int64 * _MAX_DIMS), ("device", ctypes.c_int32),
                ("data", ctypes.c_void_p)]


_ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                             ctypes.POINTER(ctypes.c_int64))
_DONE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class _Request(ctypes.Structure):
    _fields_ = [("op", ctypes.c_int32), ("name", ctypes.c_char_p),
                ("process_set_id", ctypes.c_int32), ("input", _Tensor), ("output", _Tensor),
                ("reduce_op", ctypes.c_int32), ("prescale_factor", ctypes.c_double),
                ("postscale_factor", ctypes.c_double), ("root_rank", ctypes.c_int32),
                ("splits", ctypes.POINTER(ctypes.c_int32)), ("num_splits", ctypes.c_int32),
                ("received_splits", ctypes.POINTER(ctypes.c_int32)), ("allocate", _ALLOC_FN),
                ("allocate_user", ctypes.c_void_p),
                ("join_last_rank", ctypes.POINTER(ctypes.c_int32)),
                ("ready_event", ctypes.c_void_p), ("done_stream", ctypes.c_void_p),
                ("flags", ctypes.c_uint32)]


def _library() -> ctypes.CDLL:
    import horovod_compat
    path = os.path.join(os.path.dirname(horovod_compat.__file__), "libhvdc_core.so")
    lib = ctypes.CDLL(path)
    lib.hvdc_enqueue.argtypes = [ctypes.POINTER(_Request), ctypes.c_int32, _DONE_FN,
                                 ctypes.c_void_p]
    lib.hvdc_enqueue.restype = ctypes.c_int
    lib.hvdc_last_error.restype = ctypes.c_char_p
    return lib


def core_per_tensor(rank: int, size: int, counts: List[int], average: bool = False,
                    out_of_place: bool = False, prefix: str = "b7.core"
                    ) -> Callable[[], None]:
    """Checks one pass on the closed-form inputs, then returns a step that enqueues every
    tensor as its own allreduce (Sum, or Average as Sum with the postscale 1/size, which is how
    the TF ops ask for it) and waits for the last ``done``. In place (over zeros after the
    check), or into separate outputs (the inputs kept: what a TF op does when it cannot reuse
    its input's buffer)."""
    lib = _library()
    bufs = [pattern(rank, t, n) for t, n in enumerate(counts)]
    outs = [np.empty_like(b) for b in bufs] if out_of_place else bufs
    names = [f"{prefix}.{t}".encode() for t in range(len(counts))]
    requests = (_Request * len(counts))()
    for r, buf, out, name in zip(requests, bufs, outs, names):
        r.op, r.name, r.process_set_id, r.reduce_op = _OP_ALLREDUCE, name, 0, _SUM
        r.postscale_factor = 1.0 / size if average else 1.0
        for view, array in ((r.input, buf), (r.output, out)):
            view.dtype, view.ndim, view.device = _FLOAT32, 1, -1
            view.dims[0] = array.size
            view.data = array.ctypes.data
    state = {"left": 0, "errors": []}
    lock = threading.Lock()
    finished = threading.Event()

    def on_done(_user: int, code: int, message: bytes) -> None:
        with lock:
            if code != _OK:
                state["errors"].append(f"code {code}: {message.decode(errors='replace')}")
            state["left"] -= 1
            if state["left"] == 0:
                finished.set()

    done = _DONE_FN(on_done)
    # The runtime holds raw pointers into these until each done: the step owns all of them.
    keep = (bufs, outs, names, requests, done)

    def step() -> None:
        assert keep
        finished.clear()
        state["left"] = len(counts)
        for i in range(len(counts)):
            if lib.hvdc_enqueue(ctypes.byref(requests[i]), 1, done, None) != _OK:
                raise RuntimeError(f"hvdc_enqueue: {lib.hvdc_last_error().decode()}")
        if not finished.wait(300):
            raise RuntimeError(f"core step: {state['left']} tensors never completed")
        if state["errors"]:
            raise RuntimeError(f"core step: {state['errors'][0]}")

    step()
    scale = 1.0 / size if average else 1.0
    check("core C API per tensor", outs,
          [expected_sum(size, t, n) * scale for t, n in enumerate(counts)],
          exact=not average or size & (size - 1) == 0)  # a power-of-two average is exact
    if not out_of_place:
        for b in bufs:
            b[:] = 0
    return step


# ---- raw MPI through mpi4py

CHUNK_BYTES = (256 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20)


def _chunk_name(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def mpi_per_tensor(comm: object, counts: List[int]) -> Callable[[], None]:
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


def mpi_best_chunked(comm: object, counts: List[int], reps: int
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
